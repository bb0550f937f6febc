/*
 * kvr_index implementation. Invariants: an entry is in exactly one LRU list (TTL entries in
 * lru[0] in expiry order, event entries in lru[1] in age order), in its worker's list, in its
 * node's idx set under its slot, and, when it is an event entry, in its worker's jump table under
 * its engine id. A node holds a worker at most once, so (node, slot) names an entry.
 */
#include "index.h"

#include <assert.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "kvr/hash.h"
#include "kvr/rng.h"

#define EVENT_ENTRY UINT64_MAX /* expires value of an event entry */

static struct kvr_index_entry *ent(const struct kvr_index *ix, uint32_t h)
{
    return (struct kvr_index_entry *)kvr_pool_get(&ix->entries, h);
}

static int lru_of(const struct kvr_index_entry *e)
{
    return e->expires == EVENT_ENTRY;
}

#define LRU offsetof(struct kvr_index_entry, lru)
#define WL  offsetof(struct kvr_index_entry, wl)

static void lru_unlink(struct kvr_index *ix, uint32_t h)
{
    kvr_list_unlink(&ix->lru[lru_of(ent(ix, h))], &ix->entries, LRU, h);
}

static void lru_append(struct kvr_index *ix, uint32_t h)
{
    kvr_list_append(&ix->lru[lru_of(ent(ix, h))], &ix->entries, LRU, h);
}

kvr_status kvr_index_init(struct kvr_index *ix, struct kvr_blocktab *tab,
                          const struct kvr_index_config *cfg)
{
    memset(ix, 0, sizeof *ix);
    ix->cfg = *cfg;
    if (ix->cfg.prune_pct == 0 || ix->cfg.prune_pct > 100)
        ix->cfg.prune_pct = 80;
    ix->tab = tab;
    kvr_pool_init(&ix->entries, sizeof(struct kvr_index_entry));
    for (int i = 0; i < 2; i++)
        kvr_list_init(&ix->lru[i]);
    return KVR_OK;
}

void kvr_index_free(struct kvr_index *ix)
{
    for (uint32_t s = 0; s < ix->nslots; s++)
        kvr_index_clear_worker(ix, s);
    free(ix->w);
    free(ix->counts);
    kvr_pool_free(&ix->entries);
    memset(ix, 0, sizeof *ix);
}

kvr_status kvr_index_reserve(struct kvr_index *ix, uint32_t nslots)
{
    /* counts and w share one room, nslots: each grows from it the same way */
    uint32_t cap_counts = ix->nslots, cap_w = ix->nslots;
    if (!KVR_GROW(ix->counts, cap_counts, nslots, nslots) ||
        !KVR_GROW(ix->w, cap_w, nslots, nslots))
        return KVR_ERR_NOMEM;
    assert(cap_counts == cap_w);
    for (uint32_t s = ix->nslots; s < cap_w; s++) {
        memset(&ix->w[s], 0, sizeof ix->w[s]);
        kvr_list_init(&ix->w[s].entries);
        ix->counts[s] = 0;
    }
    ix->nslots = cap_w;
    return KVR_OK;
}

void kvr_index_set_key(struct kvr_index *ix, uint32_t slot, uint64_t key)
{
    assert(slot < ix->nslots && ix->counts[slot] == 0); /* its entries were named by the last */
    ix->w[slot].key = key;
}

/* Drop one entry everywhere; frees its node when nothing else holds it. */
static void entry_remove(struct kvr_index *ix, uint32_t h)
{
    struct kvr_index_entry *e = ent(ix, h);
    struct kvr_index_worker *w = &ix->w[e->slot];
    lru_unlink(ix, h);
    kvr_list_unlink(&w->entries, &ix->entries, WL, h);
    if (e->expires == EVENT_ENTRY && w->engines.groups &&
        kvr_map_get(&w->engines, e->engine_id) == h)
        kvr_map_del(&w->engines, e->engine_id);
    assert(ix->counts[e->slot] > 0);
    ix->counts[e->slot]--;
    struct kvr_node *node = kvr_blocktab_node(ix->tab, e->node);
    ix->digest ^= kvr_mix64(node->seq ^ w->key);
    bool held = kvr_hset_del(&node->idx, e->slot, &ix->tab->set_bytes);
    assert(held); /* an entry is in its node's idx set under its slot */
    (void)held;
    kvr_blocktab_release(ix->tab, e->node);
    kvr_pool_put(&ix->entries, h);
}

/* A new entry of worker slot on node nh, linked everywhere but the jump table. */
static kvr_status entry_add(struct kvr_index *ix, uint32_t slot, uint32_t nh, uint64_t expires,
                            uint32_t *out)
{
    uint32_t h = kvr_pool_alloc(&ix->entries);
    if (h == KVR_NIL)
        return KVR_ERR_NOMEM;
    struct kvr_node *node = kvr_blocktab_node(ix->tab, nh);
    /* (node, slot) names at most one entry: the callers looked for one first */
    assert(slot < ix->nslots && !kvr_hset_find(&node->idx, slot));
    kvr_status st = kvr_hset_add(&node->idx, slot, h, &ix->tab->set_bytes);
    if (st != KVR_OK) {
        kvr_pool_put(&ix->entries, h);
        return st;
    }
    struct kvr_index_entry *e = ent(ix, h);
    struct kvr_index_worker *w = &ix->w[slot];
    e->node = nh;
    e->slot = slot;
    e->engine_id = 0;
    e->expires = expires;
    kvr_list_append(&w->entries, &ix->entries, WL, h);
    ix->counts[slot]++;
    ix->digest ^= kvr_mix64(node->seq ^ w->key);
    lru_append(ix, h);
    *out = h;
    return KVR_OK;
}

static void prune(struct kvr_index *ix)
{
    if (ix->entries.live <= ix->cfg.max_entries)
        return;
    uint32_t target = (uint32_t)((uint64_t)ix->cfg.max_entries * ix->cfg.prune_pct / 100);
    for (int l = 0; l < 2; l++) {
        while (ix->entries.live > target && ix->lru[l].head != KVR_NIL) {
            entry_remove(ix, ix->lru[l].head);
            ix->cnt.pruned++;
            ix->cnt.pruned_live += l; /* lru[1]: event entries, which the engines still hold */
        }
    }
}

uint32_t kvr_index_bound(const struct kvr_router_config *c, uint64_t fleet_blocks)
{
    double want = c->index_max_entries ? (double)c->index_max_entries
                                       : (double)fleet_blocks * c->index_headroom;
    if (!c->index_max_entries) {
        want = want > (double)c->index_min_entries ? want : (double)c->index_min_entries;
        want = want < (double)c->index_ceiling ? want : (double)c->index_ceiling;
    }
    if (!(want >= 1)) /* also NaN */
        return 1;
    return want < (double)KVR_INDEX_MAX_ENTRIES ? (uint32_t)want : KVR_INDEX_MAX_ENTRIES;
}

void kvr_index_set_bound(struct kvr_index *ix, uint32_t max_entries)
{
    assert(max_entries > 0);
    ix->cfg.max_entries = max_entries;
    prune(ix);
}

bool kvr_index_prune_report(struct kvr_index *ix, uint64_t now, uint64_t interval_ns,
                            uint64_t *pruned)
{
    if (ix->cnt.pruned_live == ix->warned_live || (ix->warned && now - ix->warned_at < interval_ns))
        return false;
    *pruned = ix->cnt.pruned_live - ix->warned_live;
    ix->warned_live = ix->cnt.pruned_live;
    ix->warned_at = now;
    ix->warned = true;
    return true;
}

#define ST_AHEAD 8u  /* stored blocks looked ahead */
#define ST_RING  16u /* > ST_AHEAD, a power of 2 */

/* Bind engine_id to a new or existing entry of slot on node nh, as an event entry. On failure,
 * nh is released (freed when nothing else holds it): the caller does not release it again. */
static kvr_status store_one(struct kvr_index *ix, uint32_t slot, uint32_t nh, uint64_t engine_id)
{
    struct kvr_index_worker *w = &ix->w[slot];
    uint32_t old = kvr_map_get(&w->engines, engine_id);
    if (old != KVR_NIL) {
        if (ent(ix, old)->node == nh) { /* a repeated event: refresh its age */
            lru_unlink(ix, old);
            lru_append(ix, old);
            return KVR_OK;
        }
        entry_remove(ix, old); /* the engine reused the id for another block */
        ix->cnt.reassigned++;
    }
    struct kvr_node *node = kvr_blocktab_node(ix->tab, nh);
    uint32_t *held = kvr_hset_find(&node->idx, slot);
    uint32_t h;
    if (held) { /* already cached under a TTL entry or under another engine id */
        h = *held;
        struct kvr_index_entry *e = ent(ix, h);
        assert(e->node == nh && e->slot == slot);
        lru_unlink(ix, h);
        if (e->expires == EVENT_ENTRY) {
            kvr_map_del(&w->engines, e->engine_id);
            ix->cnt.reassigned++;
        }
        e->expires = EVENT_ENTRY;
        lru_append(ix, h);
    } else {
        kvr_status st = entry_add(ix, slot, nh, EVENT_ENTRY, &h);
        if (st != KVR_OK) {
            kvr_blocktab_release(ix->tab, nh); /* freed if made for it alone */
            return st;
        }
    }
    ent(ix, h)->engine_id = engine_id;
    kvr_status st = kvr_map_put(&w->engines, engine_id, h);
    if (st != KVR_OK)
        entry_remove(ix, h); /* and its node, when nothing else holds it */
    return st;
}

kvr_status kvr_index_stored(struct kvr_index *ix, uint32_t slot, const uint64_t *parent,
                            const struct kvr_kv_block *blocks, size_t n)
{
    if (slot >= ix->nslots || (n && !blocks))
        return KVR_ERR_INVALID;
    struct kvr_index_worker *w = &ix->w[slot];
    if (!w->engines.groups) {
        kvr_status st = kvr_map_init(&w->engines, 64);
        if (st != KVR_OK)
            return st;
    }
    uint64_t prev = 0;
    if (parent) {
        uint32_t p = kvr_map_get(&w->engines, *parent);
        if (p == KVR_NIL) {
            ix->cnt.unknown_parent++;
            return KVR_ERR_UNKNOWN_PARENT;
        }
        prev = kvr_blocktab_node(ix->tab, ent(ix, p)->node)->seq;
    }
    /* the chain of sequence hashes runs ST_AHEAD blocks ahead of the stores, in a ring, so the
     * table slots of later blocks are prefetched while earlier ones are stored */
    uint64_t ring[ST_RING], chain = prev;
    size_t ahead = 0;
    for (size_t i = 0; i < n; i++) {
        for (; ahead < n && ahead <= i + ST_AHEAD; ahead++) {
            chain = (ahead == 0 && !parent) ? blocks[0].local_hash
                                            : kvr_hash_seq(chain, blocks[ahead].local_hash);
            ring[ahead % ST_RING] = chain;
            kvr_map_prefetch(&ix->tab->map, chain);
            kvr_map_prefetch(&w->engines, blocks[ahead].engine_id);
        }
        if (i + ST_AHEAD / 2 < n) { /* its table slot is cached: the node and its set */
            uint32_t h = kvr_blocktab_find(ix->tab, ring[(i + ST_AHEAD / 2) % ST_RING]);
            if (h != KVR_NIL) {
                const struct kvr_node *node = kvr_blocktab_node(ix->tab, h);
                __builtin_prefetch(node);
                kvr_hset_prefetch_slot(&node->idx, slot);
            }
        }
        uint64_t seq = ring[i % ST_RING];
        uint32_t nh;
        kvr_status st = kvr_blocktab_get(ix->tab, seq, &nh);
        if (st == KVR_OK)
            st = store_one(ix, slot, nh, blocks[i].engine_id); /* on failure, releases nh */
        if (st != KVR_OK) {
            prune(ix);
            return st;
        }
        ix->cnt.stored_blocks++;
    }
    prune(ix);
    return KVR_OK;
}

/*
 * Removing a block is a chain of dependent loads, each a likely miss on a large index: the jump
 * table's slot, the entry, its list neighbours, its node, the node's idx set and the block
 * table's slot. They are prefetched in stages, so the misses of different blocks overlap: the
 * slot RM_AHEAD * 2 ids ahead, the entry RM_AHEAD ahead (its slot now cached), its neighbours
 * and node RM_AHEAD / 2 ahead (the entry now cached), the node's set and table slot 2 ahead.
 * Hints only: a handle gone stale (an id listed twice) costs a useless line, never a wrong read.
 */
#define RM_AHEAD 8u

static const struct kvr_index_entry *entry_ahead(const struct kvr_index *ix,
                                                 const struct kvr_index_worker *w, uint64_t id)
{
    uint32_t h = kvr_map_get(&w->engines, id);
    return h != KVR_NIL && h < ix->entries.next ? ent(ix, h) : NULL;
}

static void prefetch_removal(const struct kvr_index *ix, const struct kvr_index_worker *w,
                             const uint64_t *ids, size_t n, size_t i)
{
    if (i + 2 * RM_AHEAD < n)
        kvr_map_prefetch(&w->engines, ids[i + 2 * RM_AHEAD]);
    if (i + RM_AHEAD < n) {
        uint32_t h = kvr_map_get(&w->engines, ids[i + RM_AHEAD]);
        if (h != KVR_NIL)
            kvr_pool_prefetch(&ix->entries, h);
    }
    const struct kvr_index_entry *e;
    if (i + RM_AHEAD / 2 < n && (e = entry_ahead(ix, w, ids[i + RM_AHEAD / 2]))) {
        kvr_pool_prefetch(&ix->tab->nodes, e->node);
        kvr_pool_prefetch(&ix->entries, e->lru.prev);
        kvr_pool_prefetch(&ix->entries, e->lru.next);
        kvr_pool_prefetch(&ix->entries, e->wl.prev);
        kvr_pool_prefetch(&ix->entries, e->wl.next);
    }
    if (i + 2 < n && (e = entry_ahead(ix, w, ids[i + 2])) && e->node < ix->tab->nodes.next) {
        const struct kvr_node *node = kvr_blocktab_node(ix->tab, e->node);
        kvr_hset_prefetch(&node->idx);
        kvr_map_prefetch(&ix->tab->map, node->seq);
    }
}

kvr_status kvr_index_removed(struct kvr_index *ix, uint32_t slot, const uint64_t *engine_ids,
                             size_t n)
{
    if (slot >= ix->nslots || (n && !engine_ids))
        return KVR_ERR_INVALID;
    struct kvr_index_worker *w = &ix->w[slot];
    for (size_t i = 0; i < n && w->engines.groups && i < 2 * RM_AHEAD; i++)
        kvr_map_prefetch(&w->engines, engine_ids[i]);
    for (size_t i = 0; i < n; i++) {
        if (w->engines.groups)
            prefetch_removal(ix, w, engine_ids, n, i);
        uint32_t h = w->engines.groups ? kvr_map_get(&w->engines, engine_ids[i]) : KVR_NIL;
        if (h == KVR_NIL) {
            ix->cnt.unknown_block++;
            continue;
        }
        entry_remove(ix, h);
        ix->cnt.removed_blocks++;
    }
    return KVR_OK;
}

void kvr_index_clear_worker(struct kvr_index *ix, uint32_t slot)
{
    if (slot >= ix->nslots)
        return;
    struct kvr_index_worker *w = &ix->w[slot];
    while (w->entries.head != KVR_NIL) {
        entry_remove(ix, w->entries.head);
        ix->cnt.cleared++;
    }
    assert(ix->counts[slot] == 0); /* the count is the length of the worker's list */
    kvr_map_free(&w->engines);
}

kvr_status kvr_index_touch(struct kvr_index *ix, uint32_t slot, const uint32_t *nodes, size_t n,
                           uint64_t now)
{
    if (slot >= ix->nslots)
        return KVR_ERR_INVALID;
    uint64_t expires = now + ix->cfg.ttl_ns;
    if (expires == EVENT_ENTRY)
        expires--;
    kvr_status st = KVR_OK;
    for (size_t i = 0; i < n && st == KVR_OK; i++) {
        struct kvr_node *node = kvr_blocktab_node(ix->tab, nodes[i]);
        uint32_t *held = kvr_hset_find(&node->idx, slot);
        if (!held) {
            uint32_t h;
            st = entry_add(ix, slot, nodes[i], expires, &h);
            continue;
        }
        struct kvr_index_entry *e = ent(ix, *held);
        if (e->expires == EVENT_ENTRY)
            continue; /* the engine's own word outranks a guess */
        lru_unlink(ix, *held);
        e->expires = expires;
        lru_append(ix, *held);
    }
    prune(ix);
    return st;
}

typedef void (*entry_fn)(void *ctx, uint32_t slot, uint64_t seq, bool has_engine,
                         uint64_t engine_id, uint64_t expires);

/* fn for at most max entries of an LRU list from *at on, *at moved past them; how many. */
static uint32_t visit(const struct kvr_index *ix, uint32_t *at, entry_fn fn, void *ctx,
                      uint32_t max)
{
    uint32_t n = 0;
    for (; *at != KVR_NIL && n < max; n++) {
        const struct kvr_index_entry *e = ent(ix, *at);
        *at = e->lru.next;
        fn(ctx, e->slot, kvr_blocktab_node(ix->tab, e->node)->seq, e->expires == EVENT_ENTRY,
           e->engine_id, e->expires);
    }
    return n;
}

void kvr_index_each(const struct kvr_index *ix, entry_fn fn, void *ctx)
{
    for (int l = 0; l < 2; l++) { /* in LRU order, so an import keeps it */
        uint32_t at = ix->lru[l].head;
        visit(ix, &at, fn, ctx, UINT32_MAX);
    }
}

void kvr_index_walk_begin(struct kvr_index *ix)
{
    for (int l = 0; l < 2; l++)
        ix->lru[l].cursor = ix->lru[l].head;
}

uint32_t kvr_index_walk(struct kvr_index *ix, entry_fn fn, void *ctx, uint32_t max)
{
    uint32_t n = 0;
    for (int l = 0; l < 2; l++) /* in LRU order, as kvr_index_each */
        n += visit(ix, &ix->lru[l].cursor, fn, ctx, max - n);
    return n;
}

#define TTL_SCAN 64u /* entries an imported guess is moved back past, at most */

/*
 * TTL entry h, just appended, goes back past the entries that expire after it: a guess imported
 * from a peer may expire sooner than this router's own made meanwhile (a snapshot's pages come
 * between decisions), and lru[0] must stay in expiry order or kvr_index_expire stops at them. Past
 * TTL_SCAN such entries (a cost bound) it takes the expiry of the one it stops behind.
 */
static void ttl_place(struct kvr_index *ix, uint32_t h)
{
    struct kvr_index_entry *e = ent(ix, h);
    uint32_t at = e->lru.prev, before = KVR_NIL;
    for (uint32_t k = 0; at != KVR_NIL && ent(ix, at)->expires > e->expires; k++) {
        if (k == TTL_SCAN) {
            e->expires = ent(ix, at)->expires;
            break;
        }
        before = at;
        at = ent(ix, at)->lru.prev;
    }
    if (before == KVR_NIL)
        return;
    kvr_list_unlink(&ix->lru[0], &ix->entries, LRU, h);
    kvr_list_insert_before(&ix->lru[0], &ix->entries, LRU, before, h);
}

kvr_status kvr_index_import(struct kvr_index *ix, uint32_t slot, uint64_t seq, bool has_engine,
                            uint64_t engine_id, uint64_t expires)
{
    if (slot >= ix->nslots)
        return KVR_ERR_INVALID;
    uint32_t nh;
    kvr_status st = kvr_blocktab_get(ix->tab, seq, &nh);
    if (st != KVR_OK)
        return st;
    if (has_engine) {
        struct kvr_index_worker *w = &ix->w[slot];
        if (!w->engines.groups && (st = kvr_map_init(&w->engines, 64)) != KVR_OK) {
            kvr_blocktab_release(ix->tab, nh);
            return st;
        }
        st = store_one(ix, slot, nh, engine_id); /* on failure, releases nh */
    } else if (!kvr_hset_find(&kvr_blocktab_node(ix->tab, nh)->idx, slot)) {
        uint32_t h;
        st = entry_add(ix, slot, nh, expires == EVENT_ENTRY ? expires - 1 : expires, &h);
        if (st != KVR_OK)
            kvr_blocktab_release(ix->tab, nh);
        else
            ttl_place(ix, h);
    }
    prune(ix);
    return st;
}

void kvr_index_expire(struct kvr_index *ix, uint64_t now)
{
    struct kvr_list *l = &ix->lru[0];
    while (l->head != KVR_NIL && ent(ix, l->head)->expires <= now) {
        entry_remove(ix, l->head);
        ix->cnt.expired++;
    }
}

size_t kvr_index_bytes(const struct kvr_index *ix)
{
    size_t b =
        kvr_pool_bytes(&ix->entries) + (size_t)ix->nslots * (sizeof *ix->w + sizeof *ix->counts);
    for (uint32_t s = 0; s < ix->nslots; s++)
        b += kvr_map_bytes(&ix->w[s].engines);
    return b;
}
