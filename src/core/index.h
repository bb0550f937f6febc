/*
 * kvr_index: the prefix index, which workers already cache which prefix (ROUTING.md section 2).
 *
 * Entries are (worker, block) pairs hung on the shared block table's idx sets. Two sources feed it:
 * - KV events from engines (event mode): Stored with parent, Removed, Cleared. Each worker has a
 *   jump table from the engine's own block id to its entry, so Removed costs O(1) per block and a
 *   Stored event finds its parent without a search. An unknown parent rejects the whole event.
 * - routing decisions (approximate mode, for engines without events): the chosen worker is
 *   assumed to cache the prompt's blocks for ttl_ns, refreshed whenever they are routed again.
 * Both kinds of entry live in one structure; TTL entries expire, event entries stay until the
 * engine removes them. The index is bounded: past max_entries it prunes the soonest-to-expire
 * entries (TTL entries first, then the oldest event entries) down to prune_pct percent; pruned
 * event entries (blocks the engines still hold: lost hits) are counted apart. The bound may be
 * changed at any time (the router sizes it from the fleet); a lower one prunes, counted.
 * Overlaps are read with kvr_blocktab_walk over the idx sets. Single-threaded.
 */
#ifndef KVR_INDEX_H
#define KVR_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "blocktab.h"
#include "kvr/router.h"

struct kvr_index_config {
    uint64_t ttl_ns;      /* lifetime of a TTL entry since it was last routed to */
    uint32_t max_entries; /* bound on worker-block entries */
    uint32_t prune_pct;   /* prune down to this percentage of max_entries */
};

struct kvr_index_entry {
    uint32_t node;       /* block table node */
    uint32_t slot;       /* worker slot */
    uint64_t engine_id;  /* the engine's block id; event entries only */
    uint64_t expires;    /* ns; UINT64_MAX for event entries */
    struct kvr_link lru; /* in its LRU list (TTL or event) */
    struct kvr_link wl;  /* in its worker's list */
};

struct kvr_index_worker {
    struct kvr_map engines;  /* engine block id -> entry; allocated on the first event */
    struct kvr_list entries; /* this worker's entries */
    uint64_t key;            /* the digest's name for the worker (kvr_index_set_key) */
};

struct kvr_index {
    struct kvr_index_config cfg;
    struct kvr_blocktab *tab;      /* borrowed; must outlive the index */
    struct kvr_pool entries;       /* struct kvr_index_entry */
    struct kvr_list lru[2];        /* [0]: TTL entries by expiry, [1]: event entries by age */
    struct kvr_index_worker *w;    /* per worker slot, nslots of them, owned */
    uint32_t *counts;              /* per worker slot: its entries (a compact array, read by the
                                      tie-break of every decision), owned */
    uint32_t nslots;               /* slots with state */
    struct kvr_index_counters cnt; /* what happened, for stats */
    uint64_t warned_live;          /* cnt.pruned_live when it was last reported */
    uint64_t warned_at;            /* ns of that report (warned: there was one) */
    bool warned;                   /* */
    uint64_t digest; /* XOR of kvr_mix64(seq ^ key of its slot) over the entries, kept as they
                        come and go (kvr_router_digest reads it: no walk) */
};

kvr_status kvr_index_init(struct kvr_index *ix, struct kvr_blocktab *tab,
                          const struct kvr_index_config *cfg);
void kvr_index_free(struct kvr_index *ix);

/* Make room for worker slots below nslots. */
kvr_status kvr_index_reserve(struct kvr_index *ix, uint32_t nslots);

/* Name the worker that takes slot (it holds no entry yet) in the digest: the same worker has the
 * same key on every router. */
void kvr_index_set_key(struct kvr_index *ix, uint32_t slot, uint64_t key);

/*
 * A Stored event: blocks[0..n) were filled on worker slot, each the child of the one before,
 * the first the child of the block the engine calls *parent (NULL: a root block). Rejected whole,
 * and counted, when the parent is unknown.
 */
kvr_status kvr_index_stored(struct kvr_index *ix, uint32_t slot, const uint64_t *parent,
                            const struct kvr_kv_block *blocks, size_t n);

/* A Removed event. Unknown ids are counted and skipped; returns KVR_ERR_UNKNOWN_PARENT never. */
kvr_status kvr_index_removed(struct kvr_index *ix, uint32_t slot, const uint64_t *engine_ids,
                             size_t n);

/* Drop every entry of a worker (a Cleared event, or the worker's removal). */
void kvr_index_clear_worker(struct kvr_index *ix, uint32_t slot);

/* Approximate mode: worker slot now caches nodes[0..n), for ttl_ns from now. */
kvr_status kvr_index_touch(struct kvr_index *ix, uint32_t slot, const uint32_t *nodes, size_t n,
                           uint64_t now);

/*
 * Call fn for every entry, TTL entries by expiry then event entries by age (so importing them in
 * this order keeps both orders): worker slot, node sequence hash, engine id (event entries),
 * expiry. The index must not change meanwhile.
 */
void kvr_index_each(const struct kvr_index *ix,
                    void (*fn)(void *ctx, uint32_t slot, uint64_t seq, bool has_engine,
                               uint64_t engine_id, uint64_t expires),
                    void *ctx);

/*
 * The same in steps between which the index may change (a snapshot served in slices): begin, then
 * each kvr_index_walk calls fn for at most max more entries and returns how many; fewer than max,
 * the walk is over. An entry in the index from begin to end is visited (once, or twice when it
 * moved to its list's tail after its turn: refreshed, or a guess made an engine's entry); one
 * added meanwhile is visited, one removed before its turn is not (kvr_list's cursor). One walk at
 * a time; fn must not change the index.
 */
void kvr_index_walk_begin(struct kvr_index *ix);
uint32_t kvr_index_walk(struct kvr_index *ix,
                        void (*fn)(void *ctx, uint32_t slot, uint64_t seq, bool has_engine,
                                   uint64_t engine_id, uint64_t expires),
                        void *ctx, uint32_t max);

/*
 * Insert one entry as another replica has it: worker slot caches the block of sequence hash seq,
 * as an event entry named engine_id (has_engine) or a TTL entry expiring at expires.
 */
kvr_status kvr_index_import(struct kvr_index *ix, uint32_t slot, uint64_t seq, bool has_engine,
                            uint64_t engine_id, uint64_t expires);

/* KVR_INDEX_MAX_ENTRIES: no bound goes above it (entry handles are 32-bit; KVR_NIL is taken). */
#define KVR_INDEX_MAX_ENTRIES (1u << 31)

/*
 * The bound c gives the index (kvr_router_config's index_* fields): index_max_entries when set,
 * else fleet_blocks (the sum of the workers' announced capacities, each already clamped by
 * kvr_index_counted_blocks) times index_headroom, kept within [index_min_entries,
 * index_ceiling] (the ceiling wins) and within [1, KVR_INDEX_MAX_ENTRIES].
 */
uint32_t kvr_index_bound(const struct kvr_router_config *c, uint64_t fleet_blocks);

/* How many of a worker's announced blocks the fleet's bound counts: at most
 * c->index_worker_max (a heartbeat is untrusted). */
static inline uint64_t kvr_index_counted_blocks(const struct kvr_router_config *c,
                                                uint64_t announced)
{
    return announced < c->index_worker_max ? announced : c->index_worker_max;
}

/* Bound the index at max_entries (> 0) from now on; over it, it prunes at once (counted). */
void kvr_index_set_bound(struct kvr_index *ix, uint32_t max_entries);

/*
 * Whether event entries were pruned since the last report and the last report is at least
 * interval_ns old at now; if so, *pruned is how many and now is the last report.
 */
bool kvr_index_prune_report(struct kvr_index *ix, uint64_t now, uint64_t interval_ns,
                            uint64_t *pruned);

/* Drop TTL entries that expired at or before now. */
void kvr_index_expire(struct kvr_index *ix, uint64_t now);

static inline uint32_t kvr_index_entries(const struct kvr_index *ix)
{
    return ix->entries.live;
}

static inline uint32_t kvr_index_worker_blocks(const struct kvr_index *ix, uint32_t slot)
{
    return slot < ix->nslots ? ix->counts[slot] : 0;
}

/* Bytes held by the index itself (entries and jump tables; nodes are the block table's). */
size_t kvr_index_bytes(const struct kvr_index *ix);

#endif
