/*
 * kvr_sim_hit_ceiling: the prefix-cache hit rate of a workload's prompts replayed in order
 * through one LRU cache of block hashes, unbounded (no router can beat it) or with a given
 * capacity (one engine holding every worker's blocks). A prompt hits its leading blocks that are
 * cached, then every one of its full blocks becomes the most recently used. Invariant: the map
 * and the LRU list hold the same blocks, at most capacity of them. Pure; single-threaded.
 */
#include <assert.h>
#include <stdlib.h>

#include "grow.h"
#include "kvr/hash.h"
#include "map.h"
#include "sim.h"

/* The cache: block sequence hash -> slot, slots in a list from least to most recently used. */
struct lru {
    struct kvr_map map; /* seq -> slot */
    struct lru_slot {
        uint64_t seq;
        uint32_t prev, next;
    } * slots;           /* nslots used, cap room, owned */
    uint32_t nslots;     /* */
    uint32_t cap;        /* */
    uint32_t head, tail; /* least and most recently used, KVR_NIL when empty */
    uint64_t capacity;   /* bound on slots; 0: none */
};

static void lru_unlink(struct lru *c, uint32_t k)
{
    struct lru_slot *s = &c->slots[k];
    if (s->prev != KVR_NIL)
        c->slots[s->prev].next = s->next;
    else
        c->head = s->next;
    if (s->next != KVR_NIL)
        c->slots[s->next].prev = s->prev;
    else
        c->tail = s->prev;
}

static void lru_append(struct lru *c, uint32_t k)
{
    c->slots[k].next = KVR_NIL;
    c->slots[k].prev = c->tail;
    if (c->tail != KVR_NIL)
        c->slots[c->tail].next = k;
    else
        c->head = k;
    c->tail = k;
}

/* A slot for a new block: a fresh one, or the least recently used one's when full. */
static kvr_status lru_slot_for(struct lru *c, uint32_t *k)
{
    if (c->capacity && c->nslots >= c->capacity) { /* evict the LRU block */
        *k = c->head;
        lru_unlink(c, *k);
        kvr_map_del(&c->map, c->slots[*k].seq);
        return KVR_OK;
    }
    if (c->nslots >= KVR_NIL - 1) /* slot numbers stay below KVR_NIL, and + 1 cannot wrap */
        return KVR_ERR_FULL;
    if (!KVR_GROW(c->slots, c->cap, c->nslots + 1, 1024))
        return KVR_ERR_NOMEM;
    *k = c->nslots++;
    return KVR_OK;
}

/* Make seq the most recently used block, inserting it when absent. */
static kvr_status lru_touch(struct lru *c, uint64_t seq)
{
    uint32_t k = kvr_map_get(&c->map, seq);
    if (k != KVR_NIL) {
        lru_unlink(c, k);
    } else {
        kvr_status st = lru_slot_for(c, &k);
        if (st != KVR_OK)
            return st;
        c->slots[k].seq = seq;
        st = kvr_map_put(&c->map, seq, k);
        if (st != KVR_OK)
            return st;
    }
    lru_append(c, k);
    assert(c->map.count <= c->nslots);
    return KVR_OK;
}

kvr_status kvr_sim_hit_ceiling(const struct kvr_workload *w, uint32_t block_size,
                               uint64_t capacity_blocks, double *out)
{
    struct lru c = {.head = KVR_NIL, .tail = KVR_NIL, .capacity = capacity_blocks};
    uint32_t *tok = NULL, cap_tok = 0;
    uint64_t *seq = NULL;
    uint32_t cap_seq = 0;
    uint64_t hits = 0, total = 0;
    kvr_status st = kvr_map_init(&c.map, 1 << 16);
    for (uint32_t i = 0; st == KVR_OK && i < w->nreqs; i++) {
        uint32_t isl = w->reqs[i].isl, nb = isl / block_size;
        if (nb == UINT32_MAX) { /* block size 1 and 2^32 - 1 tokens: nb + 1 would wrap */
            st = KVR_ERR_PROMPT_TOO_LONG;
            break;
        }
        if (!KVR_GROW(tok, cap_tok, isl, 1024) || !KVR_GROW(seq, cap_seq, nb + 1, 1024)) {
            st = KVR_ERR_NOMEM;
            break;
        }
        kvr_workload_tokens(w, i, tok);
        kvr_hash_prompt(tok, isl, block_size, NULL, seq);
        uint32_t h = 0;
        while (h < nb && kvr_map_get(&c.map, seq[h]) != KVR_NIL)
            h++;
        hits += (uint64_t)h * block_size;
        total += isl;
        for (uint32_t b = 0; b < nb && st == KVR_OK; b++) /* touch or insert, as most recent */
            st = lru_touch(&c, seq[b]);
    }
    *out = total ? (double)hits / total : 0;
    kvr_map_free(&c.map);
    free(c.slots);
    free(tok);
    free(seq);
    return st;
}
