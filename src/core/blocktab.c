/*
 * kvr_blocktab implementation. Invariant: a handle is in the map iff its node is live, and a live
 * node that is not being built by its caller has at least one member in idx or act.
 */
#include "blocktab.h"

#include <assert.h>
#include <string.h>

kvr_status kvr_blocktab_init(struct kvr_blocktab *t, uint32_t hint)
{
    memset(t, 0, sizeof *t);
    kvr_pool_init(&t->nodes, sizeof(struct kvr_node));
    return kvr_map_init(&t->map, hint);
}

void kvr_blocktab_free(struct kvr_blocktab *t)
{
    for (uint32_t i = 0; i < kvr_map_slots(&t->map); i++) {
        uint64_t seq;
        uint32_t h;
        if (!kvr_map_at(&t->map, i, &seq, &h))
            continue;
        struct kvr_node *n = kvr_blocktab_node(t, h);
        kvr_hset_release(&n->idx, &t->set_bytes);
        kvr_hset_release(&n->act, &t->set_bytes);
    }
    kvr_map_free(&t->map);
    kvr_pool_free(&t->nodes);
}

kvr_status kvr_blocktab_get(struct kvr_blocktab *t, uint64_t seq, uint32_t *h)
{
    bool created;
    uint32_t *val = kvr_map_upsert(&t->map, seq, &created);
    if (!val)
        return KVR_ERR_NOMEM;
    if (!created) {
        *h = *val;
        return KVR_OK;
    }
    uint32_t nh = kvr_pool_alloc(&t->nodes);
    if (nh == KVR_NIL) {
        kvr_map_del(&t->map, seq);
        return KVR_ERR_NOMEM;
    }
    *val = nh;
    struct kvr_node *n = kvr_blocktab_node(t, nh);
    memset(n, 0, sizeof *n);
    n->seq = seq;
    *h = nh;
    return KVR_OK;
}

bool kvr_blocktab_release(struct kvr_blocktab *t, uint32_t h)
{
    struct kvr_node *n = kvr_blocktab_node(t, h);
    assert(kvr_map_get(&t->map, n->seq) == h); /* h is live: the map names it */
    if (n->idx.n || n->act.n)
        return false;
    kvr_hset_release(&n->idx, &t->set_bytes);
    kvr_hset_release(&n->act, &t->set_bytes);
    kvr_map_del(&t->map, n->seq);
    kvr_pool_put(&t->nodes, h);
    return true;
}

size_t kvr_blocktab_bytes(const struct kvr_blocktab *t)
{
    return kvr_map_bytes(&t->map) + kvr_pool_bytes(&t->nodes) + t->set_bytes;
}

/*
 * The walk is a chain of dependent loads per block (table slot, node, its sets), each a likely
 * cache miss on a large table. It is software-pipelined: the table slot of block d + 16 is
 * prefetched, block d + 8 is looked up and its node prefetched, and the sets of block d + 4 are
 * prefetched, so the misses of different blocks overlap.
 */
#define PF_SLOT 48u
#define PF_NODE 30u
#define PF_SET  15u

static void prefetch_sets(const struct kvr_blocktab *t, uint32_t h)
{
    const struct kvr_node *node = kvr_blocktab_node(t, h);
    kvr_hset_prefetch(&node->idx);
    kvr_hset_prefetch(&node->act);
}

/* Take block d's set into walk w (if any); returns whether w still has workers alive. */
static bool advance(struct kvr_walk *w, const struct kvr_hset *s, uint32_t d, uint32_t *out)
{
    if (!w)
        return false;
    if (d == 0)
        kvr_walk_start(w, s);
    else if (kvr_walk_alive(w))
        kvr_walk_step(w, s, d, out);
    return kvr_walk_alive(w);
}

uint32_t kvr_blocktab_walk(const struct kvr_blocktab *t, const uint64_t *seq, uint32_t n,
                           struct kvr_walk *idx_walk, uint32_t *idx_out, struct kvr_walk *act_walk,
                           uint32_t *act_out, uint32_t *nodes_out)
{
    for (uint32_t k = 0; k < n && k < PF_SLOT; k++)
        kvr_map_prefetch(&t->map, seq[k]);
    for (uint32_t k = 0; k < n && k < PF_NODE; k++) {
        nodes_out[k] = kvr_map_get(&t->map, seq[k]);
        if (nodes_out[k] != KVR_NIL)
            __builtin_prefetch(kvr_blocktab_node(t, nodes_out[k]));
    }
    for (uint32_t k = 0; k < n && k < PF_SET; k++)
        if (nodes_out[k] != KVR_NIL)
            prefetch_sets(t, nodes_out[k]);
    uint32_t d = 0;
    for (; d < n; d++) {
        if (d + PF_SLOT < n)
            kvr_map_prefetch(&t->map, seq[d + PF_SLOT]);
        if (d + PF_NODE < n) {
            uint32_t ahead = kvr_map_get(&t->map, seq[d + PF_NODE]);
            nodes_out[d + PF_NODE] = ahead;
            if (ahead != KVR_NIL)
                __builtin_prefetch(kvr_blocktab_node(t, ahead));
        }
        if (d + PF_SET < n && nodes_out[d + PF_SET] != KVR_NIL)
            prefetch_sets(t, nodes_out[d + PF_SET]);
        uint32_t h = nodes_out[d];
        if (h == KVR_NIL)
            break;
        const struct kvr_node *node = kvr_blocktab_node(t, h);
        assert(node->seq == seq[d] && (node->idx.n || node->act.n)); /* no empty node is left */
        bool live = advance(idx_walk, &node->idx, d, idx_out);
        live |= advance(act_walk, &node->act, d, act_out);
        if (!live) {
            d++;
            break;
        }
    }
    if (idx_walk)
        kvr_walk_finish(idx_walk, d, idx_out);
    if (act_walk)
        kvr_walk_finish(act_walk, d, act_out);
    return d;
}
