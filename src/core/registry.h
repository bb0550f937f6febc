/*
 * kvr_registry: the live workers. Each worker gets a dense slot number (the lowest free one), which
 * indexes every per-worker array of the core; slots are reused after a worker leaves, once all of
 * its state is gone. The join order of live workers is kept, so every scan over workers (and so
 * every decision) is deterministic. Single-threaded.
 */
#ifndef KVR_REGISTRY_H
#define KVR_REGISTRY_H

#include <stdint.h>

#include <uthash.h>

#include "kvr/status.h"

struct kvr_worker {
    uint64_t id;              /* the worker's own id */
    uint32_t slot;            /* dense index */
    uint32_t block_size;      /* tokens per block it announced */
    uint64_t capacity_blocks; /* KV pool size it announced; 0: unknown */
    uint64_t last_seen;       /* ns of its last heartbeat */
    uint32_t waiting;         /* its queue length, from its last load report */
    double kv_usage;          /* its KV utilisation in [0, 1], from its last load report */
    UT_hash_handle hh;        /* by id; the registry owns the item */
};

struct kvr_registry {
    struct kvr_worker *by_id;    /* uthash head */
    struct kvr_worker **by_slot; /* nslots entries, NULL where free, owned */
    uint32_t nslots;             /* slots allocated */
    uint32_t *order;             /* live slots in join order, nslots room, owned */
    uint32_t nlive;              /* live workers */
    uint32_t max_workers;        /* bound on live workers */
};

void kvr_registry_init(struct kvr_registry *g, uint32_t max_workers);
void kvr_registry_free(struct kvr_registry *g);

/* Register id in a free slot (*out). KVR_ERR_DUPLICATE, KVR_ERR_FULL or KVR_ERR_NOMEM otherwise. */
kvr_status kvr_registry_add(struct kvr_registry *g, uint64_t id, struct kvr_worker **out);

struct kvr_worker *kvr_registry_find(const struct kvr_registry *g, uint64_t id);

/* Unregister w (freed; its slot becomes free). */
void kvr_registry_remove(struct kvr_registry *g, struct kvr_worker *w);

#endif
