/*
 * kvr_registry implementation: an array of workers by slot, a kvr_map from id to slot, and the
 * join-order list of live slots. Invariants: order[0..nlive) are distinct slots with a non-zero
 * id, the map holds exactly their ids, every other slot below nslots has id 0 (and a zero hot
 * entry), order_ids[i] is the id of order[i], and index_blocks is the sum of the live workers'
 * index_blocks.
 */
#include "registry.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"

kvr_status kvr_registry_init(struct kvr_registry *g, uint32_t max_workers)
{
    memset(g, 0, sizeof *g);
    g->max_workers = max_workers ? max_workers : 1;
    return kvr_map_init(&g->ids, 16);
}

void kvr_registry_free(struct kvr_registry *g)
{
    kvr_map_free(&g->ids);
    free(g->by_slot);
    free(g->hot);
    free(g->order);
    free(g->order_ids);
    memset(g, 0, sizeof *g);
}

struct kvr_worker *kvr_registry_find(const struct kvr_registry *g, uint64_t id)
{
    uint32_t slot = id ? kvr_map_get(&g->ids, id) : KVR_NIL;
    return slot == KVR_NIL ? NULL : &g->by_slot[slot];
}

/* Room for one more slot in by_slot, hot, order and order_ids, which share the room nslots. */
static kvr_status grow(struct kvr_registry *g)
{
    uint32_t cap_slots = g->nslots, cap_hot = g->nslots, cap_order = g->nslots;
    uint32_t cap_ids = g->nslots;
    if (!KVR_GROW(g->by_slot, cap_slots, g->nslots + 1, 8))
        return KVR_ERR_NOMEM;
    memset(g->by_slot + g->nslots, 0, (size_t)(cap_slots - g->nslots) * sizeof *g->by_slot);
    if (!KVR_GROW(g->hot, cap_hot, g->nslots + 1, 8))
        return KVR_ERR_NOMEM;
    memset(g->hot + g->nslots, 0, (size_t)(cap_hot - g->nslots) * sizeof *g->hot);
    if (!KVR_GROW(g->order, cap_order, g->nslots + 1, 8) ||
        !KVR_GROW(g->order_ids, cap_ids, g->nslots + 1, 8))
        return KVR_ERR_NOMEM;
    assert(cap_slots == cap_hot && cap_slots == cap_order && cap_slots == cap_ids);
    g->nslots = cap_slots;
    return KVR_OK;
}

kvr_status kvr_registry_add(struct kvr_registry *g, uint64_t id, uint32_t *out)
{
    if (id == 0)
        return KVR_ERR_INVALID;
    if (kvr_registry_find(g, id))
        return KVR_ERR_DUPLICATE;
    if (g->nlive >= g->max_workers)
        return KVR_ERR_FULL;
    if (g->nlive == g->nslots) {
        kvr_status st = grow(g);
        if (st != KVR_OK)
            return st;
    }
    uint32_t slot = 0;
    while (g->by_slot[slot].id)
        slot++;
    assert(slot < g->nslots); /* fewer live workers than slots: a free one exists */
    kvr_status st = kvr_map_put(&g->ids, id, slot);
    if (st != KVR_OK)
        return st;
    memset(&g->by_slot[slot], 0, sizeof g->by_slot[slot]);
    g->by_slot[slot].id = id;
    g->hot[slot] = (struct kvr_worker_hot){0.0, INFINITY}; /* no capacity announced yet */
    g->order_ids[g->nlive] = id;
    g->order[g->nlive++] = slot;
    g->largest_stale = true;
    assert(g->ids.count == g->nlive);
    *out = slot;
    return KVR_OK;
}

void kvr_registry_set_index_blocks(struct kvr_registry *g, uint32_t slot, uint64_t blocks)
{
    struct kvr_worker *w = &g->by_slot[slot];
    assert(slot < g->nslots && w->id != 0 && g->index_blocks >= w->index_blocks);
    g->index_blocks = g->index_blocks - w->index_blocks + blocks;
    w->index_blocks = blocks;
}

void kvr_registry_remove(struct kvr_registry *g, uint32_t slot)
{
    assert(slot < g->nslots && g->by_slot[slot].id != 0);
    kvr_registry_set_index_blocks(g, slot, 0);
    for (uint32_t i = 0; i < g->nlive; i++) {
        if (g->order[i] == slot) {
            memmove(g->order + i, g->order + i + 1, (size_t)(g->nlive - i - 1) * sizeof *g->order);
            memmove(g->order_ids + i, g->order_ids + i + 1,
                    (size_t)(g->nlive - i - 1) * sizeof *g->order_ids);
            g->nlive--;
            break;
        }
    }
    kvr_map_del(&g->ids, g->by_slot[slot].id);
    memset(&g->by_slot[slot], 0, sizeof g->by_slot[slot]);
    memset(&g->hot[slot], 0, sizeof g->hot[slot]);
    g->largest_stale = true;
    assert(g->ids.count == g->nlive);
}

void kvr_registry_sync_hot(struct kvr_registry *g, uint32_t slot, double busy_threshold)
{
    const struct kvr_worker *w = &g->by_slot[slot];
    assert(slot < g->nslots && w->id != 0);
    struct kvr_worker_hot *h = &g->hot[slot];
    /* a capacity, or a drain begun or ended (hot's -1: draining until now), moves the largest */
    g->largest_stale |= h->inv_capacity != w->inv_capacity || (h->busy_blocks < 0) != w->draining;
    h->inv_capacity = w->inv_capacity;
    if (w->draining)
        h->busy_blocks = -1.0; /* every count of blocks is above it */
    else if (busy_threshold > 0 && w->capacity_blocks)
        h->busy_blocks = busy_threshold * (double)w->capacity_blocks;
    else
        h->busy_blocks = INFINITY;
}

double kvr_registry_largest(struct kvr_registry *g)
{
    if (!g->largest_stale)
        return g->largest;
    double most = 0;
    for (uint32_t i = 0; i < g->nlive && most < INFINITY; i++) {
        const struct kvr_worker *w = &g->by_slot[g->order[i]];
        if (w->draining)
            continue; /* takes nothing new: a request it alone holds would wait for its end */
        double c = w->capacity_blocks ? (double)w->capacity_blocks : INFINITY;
        most = c > most ? c : most;
    }
    g->largest = most;
    g->largest_stale = false;
    return most;
}
