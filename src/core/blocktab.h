/*
 * kvr_blocktab: the table of blocks the router knows, keyed by sequence hash (a block in the
 * context of its whole prefix). The prefix index and the active-block map share its nodes: a node
 * records which workers cache the block (idx) and which workers have in-flight requests using it
 * (act), so one lookup per prompt block serves the overlap walk, the load walk and the booking.
 * Keying by sequence hash makes the radix tree implicit: the path of a prompt is its list of
 * sequence hashes, and a node lives exactly as long as one of its two sets is non-empty, so
 * memory follows the live entries and no empty node is ever left behind.
 * Single-threaded, owned by the router's state thread.
 */
#ifndef KVR_BLOCKTAB_H
#define KVR_BLOCKTAB_H

#include <stddef.h>
#include <stdint.h>

#include "hset.h"
#include "map.h"
#include "pool.h"

struct kvr_node {
    uint64_t seq;        /* sequence hash: the block and its whole prefix */
    struct kvr_hset idx; /* workers caching it; value: index entry handle */
    struct kvr_hset act; /* workers with in-flight requests on it; value: reference count */
};

struct kvr_blocktab {
    struct kvr_map map;    /* seq -> node handle */
    struct kvr_pool nodes; /* struct kvr_node */
    size_t set_bytes;      /* heap bytes held by the nodes' sets */
};

kvr_status kvr_blocktab_init(struct kvr_blocktab *t, uint32_t hint);
void kvr_blocktab_free(struct kvr_blocktab *t);

static inline uint32_t kvr_blocktab_find(const struct kvr_blocktab *t, uint64_t seq)
{
    return kvr_map_get(&t->map, seq);
}

static inline struct kvr_node *kvr_blocktab_node(const struct kvr_blocktab *t, uint32_t h)
{
    return (struct kvr_node *)kvr_pool_get(&t->nodes, h);
}

/* The node of seq, created empty when absent. *h receives its handle. */
kvr_status kvr_blocktab_get(struct kvr_blocktab *t, uint64_t seq, uint32_t *h);

/* Whether handle h names a live node (one a failure path may have freed already, when a path
 * named it twice, is not). */
static inline bool kvr_blocktab_live(const struct kvr_blocktab *t, uint32_t h)
{
    return kvr_map_get(&t->map, kvr_blocktab_node(t, h)->seq) == h;
}

/* Free node h if both of its sets are empty; returns whether it was freed. */
bool kvr_blocktab_release(struct kvr_blocktab *t, uint32_t h);

static inline uint32_t kvr_blocktab_count(const struct kvr_blocktab *t)
{
    return t->map.count;
}

size_t kvr_blocktab_bytes(const struct kvr_blocktab *t);

/*
 * Walk a prompt's path seq[0..n). Resolves nodes_out[d] for each d below the returned count: the
 * path stops at the first unknown block, or once every given walk has no worker left. Each given
 * walk (idx over the cache sets, act over the in-flight sets; either may be NULL) writes, for
 * every worker slot holding blocks 0..k-1 consecutively, out[slot] = k; the caller zeroes out
 * for every slot beforehand, and slots it does not touch hold none of the first block. Afterwards
 * each walk's deepest is the largest value it wrote (the longest prefix any worker has).
 */
uint32_t kvr_blocktab_walk(const struct kvr_blocktab *t, const uint64_t *seq, uint32_t n,
                           struct kvr_walk *idx_walk, uint32_t *idx_out, struct kvr_walk *act_walk,
                           uint32_t *act_out, uint32_t *nodes_out);

#endif
