/*
 * The reply subjects of the last KVR_KEPT_MAX requests that ended here, by key, with the worker
 * that served each and when it ended: what a rebind after a worker's cut needs of a request that
 * ended just before it, and a repeat for a client's resend after the end (rebind.h). A fixed
 * ring, the oldest reused first, within KVR_KEPT_BYTES of reply subjects (the oldest released
 * first when over), and a kvr_map from key to slot (salted: keys a client chose cannot be aimed
 * at one probe run).
 * Pure; not thread-safe (the router's state mutex covers it).
 */
#ifndef KVR_RD_KEPT_H
#define KVR_RD_KEPT_H

#include <stdint.h>

#include "kvr/status.h"
#include "map.h"

#define KVR_KEPT_MAX   65536u             /* ended requests whose reply subject is kept */
#define KVR_KEPT_BYTES (8u * 1024 * 1024) /* their reply subjects' bytes, at most */

struct kvr_kept_item {
    uint64_t key;       /* 0: the slot is free */
    uint64_t worker_id; /* where it ran */
    uint64_t at;        /* when it ended (monotonic ns) */
    char *reply;        /* the client's reply subject (owned) */
    uint32_t bytes;     /* its size, counted in bytes */
};

struct kvr_kept {
    struct kvr_kept_item *slots; /* KVR_KEPT_MAX, reused oldest first */
    uint32_t next;               /* the slot the next one takes */
    uint32_t oldest;             /* the oldest slot of [oldest, next) (the ring's way), */
    uint32_t span;               /* that many slots: every used one is in it */
    uint64_t bytes;              /* the reply subjects' bytes, at most KVR_KEPT_BYTES */
    struct kvr_map at;           /* key -> slot, over the used slots */
};

kvr_status kvr_kept_init(struct kvr_kept *k);
void kvr_kept_free(struct kvr_kept *k);

/* key ended on worker_id at now: keep reply (owned from now on; freed when its slot is reused). */
void kvr_kept_put(struct kvr_kept *k, uint64_t key, uint64_t worker_id, char *reply, uint64_t now);

/* The entry of key, or NULL. */
const struct kvr_kept_item *kvr_kept_find(const struct kvr_kept *k, uint64_t key);

#endif
