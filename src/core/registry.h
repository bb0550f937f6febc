/*
 * kvr_registry: the live workers. Each worker gets a dense slot number (the lowest free one), which
 * indexes every per-worker array of the core; slots are reused after a worker leaves, once all of
 * its state is gone. Workers live in one array indexed by slot, so the per-decision scan over all
 * workers reads memory in order. The join order of live workers is kept, so every scan (and so
 * every decision) is deterministic. It also keeps the sum of the capacities the workers announced,
 * as the prefix index's bound counts them. What the per-decision pricing loop reads is also kept
 * in compact arrays (the ids in join order, a 16-byte hot entry per slot), so the loop over every
 * worker does not touch the 72-byte worker records. Single-threaded.
 */
#ifndef KVR_REGISTRY_H
#define KVR_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>

#include "kvr/status.h"
#include "map.h"

struct kvr_worker {
    uint64_t id;              /* the worker's own id; 0 marks a free slot */
    uint64_t capacity_blocks; /* KV pool size it announced; 0: unknown */
    double inv_capacity;      /* 1 / capacity_blocks, or 0 when unknown */
    uint64_t last_seen;       /* ns of its last heartbeat */
    uint32_t block_size;      /* tokens per block it announced */
    uint32_t waiting;         /* its queue length, from its last load report */
    double kv_usage;          /* its KV utilisation in [0, 1], from its last load report */
    uint64_t timeout_ns;      /* its own silence timeout; 0: the router's */
    bool draining;            /* announced it is shutting down */
    bool approximate;         /* announced that its engine publishes no KV events */
    uint64_t index_blocks;    /* its capacity as the index bound counts it (clamped), blocks */
};

/* The part of a worker the pricing loop reads, per slot (kvr_registry_sync_hot keeps it). */
struct kvr_worker_hot {
    double inv_capacity; /* its inv_capacity */
    double busy_blocks;  /* busy above this many predicted active blocks: busy_threshold x
                            capacity_blocks, INFINITY when either is 0, -1 while draining */
};

struct kvr_registry {
    struct kvr_worker *by_slot; /* nslots entries (id 0 where free), owned */
    struct kvr_worker_hot *hot; /* nslots entries, owned (zero where free) */
    struct kvr_map ids;         /* worker id -> slot */
    uint32_t nslots;            /* slots allocated */
    uint32_t *order;            /* live slots in join order, nslots room, owned */
    uint64_t *order_ids;        /* order_ids[i] = by_slot[order[i]].id, nslots room, owned */
    uint32_t nlive;             /* live workers */
    uint32_t max_workers;       /* bound on live workers */
    uint64_t index_blocks;      /* sum of the live workers' index_blocks, blocks */
    double largest;             /* the largest capacity of a live worker not draining, blocks
                                   (INFINITY when one announced none), when largest_stale is false */
    bool largest_stale;         /* a join, a leave, a capacity or a drain changed since */
};

kvr_status kvr_registry_init(struct kvr_registry *g, uint32_t max_workers);
void kvr_registry_free(struct kvr_registry *g);

/*
 * Register id (non-zero) in a free slot; *slot receives it. KVR_ERR_DUPLICATE, KVR_ERR_FULL or
 * KVR_ERR_NOMEM otherwise. The by_slot array may move: re-read pointers into it afterwards.
 */
kvr_status kvr_registry_add(struct kvr_registry *g, uint64_t id, uint32_t *slot);

/* The live worker id, or NULL. Valid until the next add. */
struct kvr_worker *kvr_registry_find(const struct kvr_registry *g, uint64_t id);

static inline uint32_t kvr_registry_slot(const struct kvr_registry *g, const struct kvr_worker *w)
{
    return (uint32_t)(w - g->by_slot);
}

/* Count blocks (already clamped by the caller) as the worker in slot's share of the index. */
void kvr_registry_set_index_blocks(struct kvr_registry *g, uint32_t slot, uint64_t blocks);

/*
 * Recompute the hot entry of the live worker in slot from its record, with busy_threshold (the
 * router's): after every change of its capacity_blocks, inv_capacity or draining.
 */
void kvr_registry_sync_hot(struct kvr_registry *g, uint32_t slot, double busy_threshold);

/* The largest KV pool of a live worker that is not draining (one that drains takes nothing new),
 * blocks: INFINITY when one has not announced its own, 0 with none. Recomputed (O(workers)) only
 * after a join, a leave, a change of capacity or a drain begun or ended. */
double kvr_registry_largest(struct kvr_registry *g);

/* Whether the worker in slot is busy by its blocks: what worker_busy tests of the record. */
static inline bool kvr_registry_busy_blocks(const struct kvr_registry *g, uint32_t slot,
                                            uint64_t blocks)
{
    return (double)blocks > g->hot[slot].busy_blocks;
}

/* Unregister the worker in slot (its index_blocks leave the sum); the slot becomes free. */
void kvr_registry_remove(struct kvr_registry *g, uint32_t slot);

#endif
