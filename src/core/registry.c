/*
 * kvr_registry implementation: an array of workers by slot, a kvr_map from id to slot, and the
 * join-order list of live slots.
 */
#include "registry.h"

#include <stdlib.h>
#include <string.h>

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
    free(g->order);
    memset(g, 0, sizeof *g);
}

struct kvr_worker *kvr_registry_find(const struct kvr_registry *g, uint64_t id)
{
    uint32_t slot = id ? kvr_map_get(&g->ids, id) : KVR_NIL;
    return slot == KVR_NIL ? NULL : &g->by_slot[slot];
}

static kvr_status grow(struct kvr_registry *g)
{
    uint32_t n = g->nslots ? g->nslots * 2 : 8;
    struct kvr_worker *by_slot = realloc(g->by_slot, (size_t)n * sizeof *by_slot);
    if (!by_slot)
        return KVR_ERR_NOMEM;
    memset(by_slot + g->nslots, 0, (size_t)(n - g->nslots) * sizeof *by_slot);
    g->by_slot = by_slot;
    uint32_t *order = realloc(g->order, (size_t)n * sizeof *order);
    if (!order)
        return KVR_ERR_NOMEM;
    g->order = order;
    g->nslots = n;
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
    kvr_status st = kvr_map_put(&g->ids, id, slot);
    if (st != KVR_OK)
        return st;
    memset(&g->by_slot[slot], 0, sizeof g->by_slot[slot]);
    g->by_slot[slot].id = id;
    g->order[g->nlive++] = slot;
    *out = slot;
    return KVR_OK;
}

void kvr_registry_remove(struct kvr_registry *g, uint32_t slot)
{
    for (uint32_t i = 0; i < g->nlive; i++) {
        if (g->order[i] == slot) {
            memmove(g->order + i, g->order + i + 1, (size_t)(g->nlive - i - 1) * sizeof *g->order);
            g->nlive--;
            break;
        }
    }
    kvr_map_del(&g->ids, g->by_slot[slot].id);
    memset(&g->by_slot[slot], 0, sizeof g->by_slot[slot]);
}
