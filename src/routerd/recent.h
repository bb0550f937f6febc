/*
 * The router daemon's memory of requests that ended, and of cancels that came first: by
 * fleet-wide key, for a fixed time (KVR_RECENT_TTL_NS), so that a resend of a request whose client
 * has its final chunk is ignored instead of generated again, and a request whose cancel overtook
 * it is answered "cancelled" the moment it arrives.
 *
 * Invariants: at most `max` keys (the oldest is forgotten first when full); each key once; the
 * FIFO ring holds keys in the order they were put, and an entry is forgotten when it leaves the
 * ring or its time is up, whichever comes first. Pure data, no I/O; the state mutex covers it.
 */
#ifndef KVR_RD_RECENT_H
#define KVR_RD_RECENT_H

#include <stdbool.h>
#include <stdint.h>

#include <uthash.h>

#include "kvr/status.h"

#define KVR_RECENT_TTL_NS (60ull * 1000000000ull) /* how long an ended request is remembered */
#define KVR_RECENT_MAX    65536u                  /* keys remembered at most */

enum kvr_recent_kind {
    KVR_RECENT_ENDED = 1,     /* its client has its final chunk: resends are ignored */
    KVR_RECENT_CANCELLED = 2, /* a cancel came before the request: answer it with `status` */
};

struct kvr_recent_item {
    uint64_t key;              /* */
    uint64_t expires;          /* ns */
    enum kvr_recent_kind kind; /* */
    kvr_status status;         /* CANCELLED: the final chunk's code */
    UT_hash_handle hh;         /* by key */
};

struct kvr_recent {
    struct kvr_recent_item *head; /* uthash head */
    uint64_t *ring;               /* keys in the order put, capacity max */
    uint32_t first, n, max;       /* */
    uint64_t ttl_ns;              /* */
    uint64_t evicted;             /* forgotten early because the table was full */
};

kvr_status kvr_recent_init(struct kvr_recent *t, uint32_t max, uint64_t ttl_ns);
void kvr_recent_free(struct kvr_recent *t);

/* Remember key as kind at now (an entry already there is updated, its time restarted). */
kvr_status kvr_recent_put(struct kvr_recent *t, uint64_t key, enum kvr_recent_kind kind,
                          kvr_status status, uint64_t now);

/* The entry for key if it is remembered at now, else NULL. */
struct kvr_recent_item *kvr_recent_find(struct kvr_recent *t, uint64_t key, uint64_t now);

/* Forget what is past its time at now. */
void kvr_recent_expire(struct kvr_recent *t, uint64_t now);

#endif
