/*
 * kvevents internals shared with the tests and the fuzz target: the structural pre-scan and the
 * allocation-failure hook. Not for the adapter or the stand-in.
 */
#ifndef KVR_KVEVENTS_INTERNAL_H
#define KVR_KVEVENTS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* KVR_OK when p[0..len) is exactly one complete msgpack object, nested at most 16 deep, whose
 * declared lengths all fit in the bytes that follow them, KVR_ERR_MALFORMED when not; and
 * KVR_ERR_TOO_LARGE when it holds more than max_objects objects, containers and what they hold
 * counted alike (kvevents.c). p is borrowed. */
kvr_status kvr_kvev_prescan(const uint8_t *p, size_t len, uint64_t max_objects);

/* The objects a batch within limits l (defaults taken) may hold: kvr_kvev_decode's bound. */
uint64_t kvr_kvev_max_objects(const struct kvr_kvev_limits *l);

/*
 * Testing: make the decoder's n-th allocation of its own (the batch's arrays; not msgpack-c's
 * zone) from now on, on this thread, fail once (0: the next one); -1 disarms. Returns the
 * countdown it replaces: -1 if the armed failure happened (or none was armed).
 */
long kvr_kvev_fail_alloc(long n);

#endif
