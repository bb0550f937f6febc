/*
 * kvr_active implementation. Invariants: a request holds exactly one reference in the act set of
 * each of its nodes under its slot; a worker's blocks equal the number of act sets holding its
 * slot plus its requests' extra blocks; its prefill equals the sum of its requests' prefill;
 * nworking counts the workers whose nreqs is not 0. The TTL list is in last_ns order because time
 * never decreases and every event moves its request to the tail. by_load is sorted by nreqs and
 * load_pos is each listed slot's position in it: a slot's nreqs moves by one at a time, so one
 * swap with the edge of its group keeps both (load_up, load_down).
 */
#include "active.h"

#include <assert.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "kvr/rng.h"

#define UNREF_PREFETCH 8u
#define LOADS_FIRST    16u /* load_first entries to start with */

static struct kvr_active_req *req(const struct kvr_active *a, uint32_t h)
{
    return (struct kvr_active_req *)kvr_pool_get(&a->reqs, h);
}

kvr_status kvr_active_init(struct kvr_active *a, struct kvr_blocktab *tab, uint32_t block_size,
                           uint32_t hint)
{
    memset(a, 0, sizeof *a);
    a->tab = tab;
    a->block_size = block_size ? block_size : 1;
    kvr_list_init(&a->ttl);
    kvr_pool_init(&a->reqs, sizeof(struct kvr_active_req));
    a->load_first = calloc(LOADS_FIRST, sizeof *a->load_first);
    if (!a->load_first)
        return KVR_ERR_NOMEM;
    a->nloads = LOADS_FIRST;
    kvr_status st = kvr_map_init(&a->ids, hint);
    if (st != KVR_OK) {
        free(a->load_first);
        a->load_first = NULL;
    }
    return st;
}

void kvr_active_free(struct kvr_active *a)
{
    for (uint32_t s = 0; s < a->nslots; s++)
        kvr_active_drop_worker(a, s, NULL, NULL);
    free(a->w);
    free(a->by_load);
    free(a->load_first);
    kvr_map_free(&a->ids);
    kvr_pool_free(&a->reqs);
    memset(a, 0, sizeof *a);
}

kvr_status kvr_active_reserve(struct kvr_active *a, uint32_t nslots)
{
    uint32_t cap = a->nslots, room = a->nslots;
    if (!KVR_GROW(a->w, cap, nslots, nslots) || !KVR_GROW(a->by_load, room, cap, cap))
        return KVR_ERR_NOMEM; /* a grown w alone is harmless: nslots still says what is set */
    for (uint32_t s = a->nslots; s < cap; s++) {
        memset(&a->w[s], 0, sizeof a->w[s]);
        kvr_list_init(&a->w[s].reqs);
        a->w[s].load_pos = KVR_NIL;
    }
    a->nslots = cap;
    return KVR_OK;
}

/* --- the workers in order of load ------------------------------------------------------------ */

/* Room in load_first for a slot with need - 2 requests (the last entry stays empty of slots). */
static bool loads_room(struct kvr_active *a, uint32_t need)
{
    uint32_t old = a->nloads;
    if (need <= old)
        return true;
    if (!KVR_GROW(a->load_first, a->nloads, need, LOADS_FIRST))
        return false;
    for (uint32_t c = old; c < a->nloads; c++)
        a->load_first[c] = a->nlisted; /* no slot is that loaded */
    return true;
}

static void load_swap(struct kvr_active *a, uint32_t i, uint32_t j)
{
    uint32_t si = a->by_load[i], sj = a->by_load[j];
    a->by_load[i] = sj;
    a->by_load[j] = si;
    a->w[sj].load_pos = i;
    a->w[si].load_pos = j;
}

/* Move slot from the group of load c to that of c + 1 (c + 1 < nloads): it swaps with the last
 * of its group, which then ends one earlier. */
static void load_up(struct kvr_active *a, uint32_t slot, uint32_t c)
{
    assert(c + 1 < a->nloads && a->load_first[c + 1] > 0);
    load_swap(a, a->w[slot].load_pos, --a->load_first[c + 1]);
}

/* Move slot from the group of load c (>= 1) to that of c - 1: it swaps with the first of its
 * group, which then starts one later. */
static void load_down(struct kvr_active *a, uint32_t slot, uint32_t c)
{
    assert(c >= 1 && c < a->nloads);
    load_swap(a, a->w[slot].load_pos, a->load_first[c]++);
}

kvr_status kvr_active_list(struct kvr_active *a, uint32_t slot)
{
    if (slot >= a->nslots || a->w[slot].load_pos != KVR_NIL)
        return KVR_ERR_INVALID;
    uint32_t n = a->w[slot].nreqs;
    if (!loads_room(a, n + 2))
        return KVR_ERR_NOMEM;
    /* appended, it sits in the last group (every load_first is at most the old end) */
    a->by_load[a->nlisted] = slot;
    a->w[slot].load_pos = a->nlisted++;
    for (uint32_t c = a->nloads - 1; c >= 1; c--)
        load_down(a, slot, c);
    for (uint32_t c = 0; c < n; c++)
        load_up(a, slot, c);
    return KVR_OK;
}

void kvr_active_unlist(struct kvr_active *a, uint32_t slot)
{
    if (slot >= a->nslots || a->w[slot].load_pos == KVR_NIL)
        return;
    for (uint32_t c = a->w[slot].nreqs; c >= 1; c--)
        load_down(a, slot, c);
    for (uint32_t c = 0; c + 1 < a->nloads; c++)
        load_up(a, slot, c); /* to the last group, which held no slot: the end of by_load */
    assert(a->w[slot].load_pos == a->nlisted - 1);
    a->nlisted--;
    a->w[slot].load_pos = KVR_NIL;
}

#define TTL offsetof(struct kvr_active_req, ttl)
#define WL  offsetof(struct kvr_active_req, wl)

/*
 * Three-stage prefetch of the act sets of nodes[i + ...]: the node 3 * UNREF_PREFETCH ahead (its
 * address needs no load), the set's first line 2 * UNREF_PREFETCH ahead (the node now in cache),
 * then (its header now in cache) the lines slot will touch UNREF_PREFETCH ahead.
 */
static inline __attribute__((always_inline)) void prefetch_act(const struct kvr_active *a,
                                                               const uint32_t *nodes, uint32_t n,
                                                               uint32_t i, uint32_t slot)
{
    if (i + 3 * UNREF_PREFETCH < n)
        __builtin_prefetch(kvr_blocktab_node(a->tab, nodes[i + 3 * UNREF_PREFETCH]));
    if (i + 2 * UNREF_PREFETCH < n)
        kvr_hset_prefetch(&kvr_blocktab_node(a->tab, nodes[i + 2 * UNREF_PREFETCH])->act);
    if (i + UNREF_PREFETCH < n)
        kvr_hset_prefetch_slot(&kvr_blocktab_node(a->tab, nodes[i + UNREF_PREFETCH])->act, slot);
}

/*
 * Sharing along a path. A request holds a prefix of its prompt's path, so a block's requests are
 * among its parent's, and its act set counts, member by member, at most what its parent's does.
 * Two consecutive blocks of a path whose sets have the same members and the same sum of counts
 * therefore hold the very same pairs. A record imported from a peer may list any blocks, so that
 * is not taken on trust: the shape also fingerprints the values (kvr_hset_shape's wsum), and sets
 * of one shape hold the same pairs whoever listed their blocks; after the same change (a reference
 * of one worker added or dropped) they still do, so the child takes a reference to the set its
 * parent's change made (kvr_hset_share) instead of changing its own. Booking or freeing a request
 * over a shared prefix's dense sets then costs one copy and a reference per block, not a change of
 * each block's table, and the blocks of the prefix end up sharing one table.
 */
struct path_run {
    bool live;                    /* the previous block's change may be taken over */
    struct kvr_hset_shape before; /* the shape of its set before the change */
    const struct kvr_hset *after; /* its set after the change (dense) */
    bool flipped;                 /* whether the change added (removed) the worker */
};

/*
 * Add (ref) or drop a reference of worker slot on block set s, the next of a path after the block
 * that run describes: takes over that block's change when s held the same pairs, else makes the
 * change and notes it in run. *flipped: whether slot joined (left) the set. Only a dense set can be
 * taken over, so the other forms go straight to the change.
 */
static inline __attribute__((always_inline)) kvr_status path_change(struct path_run *run,
                                                                    struct kvr_hset *s,
                                                                    uint32_t slot, bool ref,
                                                                    bool *flipped, size_t *bytes)
{
    struct kvr_hset_shape shape;
    if (!kvr_hset_shape(s, &shape)) {
        run->live = false;
        if (!ref) {
            *flipped = kvr_hset_unref(s, slot, bytes);
            return KVR_OK;
        }
        return kvr_hset_ref(s, slot, flipped, bytes);
    }
    if (run->live && kvr_hset_shape_eq(&shape, &run->before)) {
        kvr_hset_share(s, run->after, bytes);
        *flipped = run->flipped;
        return KVR_OK;
    }
    kvr_status st = KVR_OK;
    if (ref)
        st = kvr_hset_ref(s, slot, flipped, bytes);
    else
        *flipped = kvr_hset_unref(s, slot, bytes);
    run->live = st == KVR_OK && s->cap == KVR_HSET_DENSE;
    run->before = shape;
    run->after = s;
    run->flipped = *flipped;
    return st;
}

/*
 * Drop the references of worker slot on nodes[0..n), a prompt's path from its first block. Two
 * passes: the first drops references and prefetches the table slots of the nodes that emptied,
 * compacting them to the front of nodes (which the caller owns and is about to free); the second
 * frees those nodes, by then in cache.
 */
static void unref_nodes(struct kvr_active *a, uint32_t slot, uint32_t *nodes, uint32_t n)
{
    struct kvr_active_worker *w = &a->w[slot];
    struct path_run run = {0};
    uint32_t nfree = 0;
    for (uint32_t i = 0; i < n; i++) {
        prefetch_act(a, nodes, n, i, slot);
        struct kvr_node *node = kvr_blocktab_node(a->tab, nodes[i]);
        bool removed; /* each of a request's nodes holds its reference */
        path_change(&run, &node->act, slot, false, &removed, &a->tab->set_bytes);
        if (!removed)
            continue;
        assert(w->blocks > 0);
        w->blocks--;
        if (node->idx.n == 0 && node->act.n == 0) {
            kvr_map_prefetch(&a->tab->map, node->seq);
            nodes[nfree++] = nodes[i];
        }
    }
    for (uint32_t i = 0; i < nfree; i++)
        kvr_blocktab_release(a->tab, nodes[i]);
}

kvr_status kvr_active_add(struct kvr_active *a, uint64_t id, uint32_t slot, const uint32_t *nodes,
                          uint32_t n, uint32_t prompt_tokens, uint32_t overlap_blocks, uint64_t now)
{
    if (slot >= a->nslots || (n && !nodes))
        return KVR_ERR_INVALID;
    if (kvr_map_get(&a->ids, id) != KVR_NIL)
        return KVR_ERR_DUPLICATE;
    if (a->w[slot].load_pos != KVR_NIL && !loads_room(a, a->w[slot].nreqs + 3))
        return KVR_ERR_NOMEM;
    uint32_t *copy = NULL;
    if (n) {
        copy = malloc((size_t)n * sizeof *copy);
        if (!copy)
            return KVR_ERR_NOMEM;
        memcpy(copy, nodes, (size_t)n * sizeof *copy);
    }
    uint32_t h = kvr_pool_alloc(&a->reqs);
    if (h == KVR_NIL || kvr_map_put(&a->ids, id, h) != KVR_OK) {
        if (h != KVR_NIL)
            kvr_pool_put(&a->reqs, h);
        free(copy);
        return KVR_ERR_NOMEM;
    }
    struct kvr_active_worker *w = &a->w[slot];
    struct path_run run = {0};
    for (uint32_t i = 0; i < n; i++) {
        prefetch_act(a, copy, n, i, slot);
        struct kvr_node *node = kvr_blocktab_node(a->tab, copy[i]);
        bool added = false; /* read on failure too (not used then) */
        kvr_status st = path_change(&run, &node->act, slot, true, &added, &a->tab->set_bytes);
        if (st != KVR_OK) {
            unref_nodes(a, slot, copy, i);
            kvr_map_del(&a->ids, id);
            kvr_pool_put(&a->reqs, h);
            free(copy);
            return st;
        }
        w->blocks += added;
    }
    struct kvr_active_req *r = req(a, h);
    uint64_t cached = (uint64_t)overlap_blocks * a->block_size;
    r->id = id;
    r->slot = slot;
    r->nodes = copy;
    r->nnodes = n;
    r->extra = prompt_tokens % a->block_size ? 1 : 0;
    r->prompt_tokens = prompt_tokens;
    r->overlap = overlap_blocks;
    r->prefill = cached < prompt_tokens ? prompt_tokens - cached : 0;
    r->last_ns = now;
    r->booked_ns = now;
    r->missed_ns = 0;
    r->max_tokens = 0;
    r->noted = false;
    kvr_list_append(&w->reqs, &a->reqs, WL, h);
    a->digest ^= kvr_mix64(id ^ w->key);
    w->blocks += r->extra;
    w->prefill += r->prefill;
    if (w->load_pos != KVR_NIL)
        load_up(a, slot, w->nreqs);
    a->nworking += w->nreqs++ == 0;
    kvr_list_append(&a->ttl, &a->reqs, TTL, h);
    a->node_bytes += (size_t)n * sizeof *copy;
    return KVR_OK;
}

/* The live request id, moved to the TTL tail as of now; KVR_NIL when unknown. */
static uint32_t touch(struct kvr_active *a, uint64_t id, uint64_t now)
{
    uint32_t h = kvr_map_get(&a->ids, id);
    if (h == KVR_NIL)
        return KVR_NIL;
    struct kvr_active_req *r = req(a, h);
    assert(r->id == id);
    if (now > r->last_ns)
        r->last_ns = now;
    kvr_list_unlink(&a->ttl, &a->reqs, TTL, h);
    kvr_list_append(&a->ttl, &a->reqs, TTL, h);
    return h;
}

kvr_status kvr_active_prefill_done(struct kvr_active *a, uint64_t id, uint64_t now)
{
    uint32_t h = touch(a, id, now);
    if (h == KVR_NIL)
        return KVR_ERR_UNKNOWN_REQUEST;
    struct kvr_active_req *r = req(a, h);
    assert(a->w[r->slot].prefill >= r->prefill); /* the worker's prefill sums its requests' */
    a->w[r->slot].prefill -= r->prefill;
    r->prefill = 0;
    return KVR_OK;
}

kvr_status kvr_active_output_blocks(struct kvr_active *a, uint64_t id, uint32_t n, uint64_t now)
{
    uint32_t h = touch(a, id, now);
    if (h == KVR_NIL)
        return KVR_ERR_UNKNOWN_REQUEST;
    struct kvr_active_req *r = req(a, h);
    n = n < UINT32_MAX - r->extra ? n : UINT32_MAX - r->extra;
    r->extra += n;
    a->w[r->slot].blocks += n;
    return KVR_OK;
}

kvr_status kvr_active_output_block(struct kvr_active *a, uint64_t id, uint64_t now)
{
    return kvr_active_output_blocks(a, id, 1, now);
}

static void remove_handle(struct kvr_active *a, uint32_t h)
{
    struct kvr_active_req *r = req(a, h);
    struct kvr_active_worker *w = &a->w[r->slot];
    unref_nodes(a, r->slot, r->nodes, r->nnodes);
    assert(w->blocks >= r->extra && w->prefill >= r->prefill && w->nreqs > 0);
    w->blocks -= r->extra;
    w->prefill -= r->prefill;
    if (w->load_pos != KVR_NIL)
        load_down(a, r->slot, w->nreqs);
    a->nworking -= --w->nreqs == 0;
    a->digest ^= kvr_mix64(r->id ^ w->key);
    kvr_list_unlink(&w->reqs, &a->reqs, WL, h);
    kvr_list_unlink(&a->ttl, &a->reqs, TTL, h);
    kvr_map_del(&a->ids, r->id);
    a->node_bytes -= (size_t)r->nnodes * sizeof *r->nodes;
    free(r->nodes);
    kvr_pool_put(&a->reqs, h);
}

kvr_status kvr_active_remove(struct kvr_active *a, uint64_t id)
{
    uint32_t h = kvr_map_get(&a->ids, id);
    if (h == KVR_NIL)
        return KVR_ERR_UNKNOWN_REQUEST;
    remove_handle(a, h);
    return KVR_OK;
}

void kvr_active_set_max_tokens(struct kvr_active *a, uint64_t id, uint32_t max_tokens)
{
    uint32_t h = kvr_map_get(&a->ids, id);
    if (h != KVR_NIL)
        req(a, h)->max_tokens = max_tokens;
}

void kvr_active_set_booked(struct kvr_active *a, uint64_t id, uint32_t max_tokens, bool noted)
{
    uint32_t h = kvr_map_get(&a->ids, id);
    if (h != KVR_NIL) {
        struct kvr_active_req *r = req(a, h);
        r->max_tokens = max_tokens;
        r->noted = noted;
    }
}

/* fn for at most max requests of the TTL list from *at on, *at moved past them; how many. */
static uint32_t visit(const struct kvr_active *a, uint32_t *at,
                      void (*fn)(void *ctx, const struct kvr_active_req *req), void *ctx,
                      uint32_t max)
{
    uint32_t n = 0;
    for (; *at != KVR_NIL && n < max; n++) {
        const struct kvr_active_req *r = req(a, *at);
        *at = r->ttl.next;
        fn(ctx, r);
    }
    return n;
}

void kvr_active_each(const struct kvr_active *a,
                     void (*fn)(void *ctx, const struct kvr_active_req *req), void *ctx)
{
    uint32_t at = a->ttl.head;
    visit(a, &at, fn, ctx, UINT32_MAX);
}

void kvr_active_walk_begin(struct kvr_active *a)
{
    a->ttl.cursor = a->ttl.head;
}

uint32_t kvr_active_walk(struct kvr_active *a,
                         void (*fn)(void *ctx, const struct kvr_active_req *req), void *ctx,
                         uint32_t max)
{
    return visit(a, &a->ttl.cursor, fn, ctx, max);
}

kvr_status kvr_active_drop(struct kvr_active *a, uint64_t id, kvr_active_drop_fn fn, void *ctx)
{
    uint32_t h = kvr_map_get(&a->ids, id);
    if (h == KVR_NIL)
        return KVR_ERR_UNKNOWN_REQUEST;
    uint32_t slot = req(a, h)->slot;
    remove_handle(a, h);
    if (fn)
        fn(ctx, id, slot);
    return KVR_OK;
}

uint32_t kvr_active_expire(struct kvr_active *a, uint64_t cutoff, kvr_active_drop_fn fn, void *ctx)
{
    uint32_t n = 0;
    while (a->ttl.head != KVR_NIL && req(a, a->ttl.head)->last_ns <= cutoff) {
        struct kvr_active_req *r = req(a, a->ttl.head);
        uint64_t id = r->id;
        uint32_t slot = r->slot;
        remove_handle(a, a->ttl.head);
        if (fn)
            fn(ctx, id, slot);
        n++;
    }
    return n;
}

uint32_t kvr_active_drop_worker(struct kvr_active *a, uint32_t slot, kvr_active_drop_fn fn,
                                void *ctx)
{
    if (slot >= a->nslots)
        return 0;
    uint32_t n = 0;
    while (a->w[slot].reqs.head != KVR_NIL) {
        uint64_t id = req(a, a->w[slot].reqs.head)->id;
        remove_handle(a, a->w[slot].reqs.head);
        if (fn)
            fn(ctx, id, slot);
        n++;
    }
    /* the worker's figures were the sums over its requests: nothing is left of them */
    assert(a->w[slot].nreqs == 0 && a->w[slot].blocks == 0 && a->w[slot].prefill == 0);
    return n;
}

size_t kvr_active_bytes(const struct kvr_active *a)
{
    return kvr_pool_bytes(&a->reqs) + kvr_map_bytes(&a->ids) + a->node_bytes +
           (size_t)a->nslots * (sizeof *a->w + sizeof *a->by_load) +
           (size_t)a->nloads * sizeof *a->load_first;
}
