/*
 * kvr_registry implementation: uthash by id (the registry owns the items), an array by slot and
 * the join-order list of live slots.
 */
#include "registry.h"

#include <stdlib.h>
#include <string.h>

void kvr_registry_init(struct kvr_registry *g, uint32_t max_workers)
{
    memset(g, 0, sizeof *g);
    g->max_workers = max_workers ? max_workers : 1;
}

void kvr_registry_free(struct kvr_registry *g)
{
    struct kvr_worker *w, *tmp;
    HASH_ITER(hh, g->by_id, w, tmp)
    {
        HASH_DEL(g->by_id, w);
        free(w);
    }
    free(g->by_slot);
    free(g->order);
    memset(g, 0, sizeof *g);
}

struct kvr_worker *kvr_registry_find(const struct kvr_registry *g, uint64_t id)
{
    struct kvr_worker *w = NULL;
    HASH_FIND(hh, g->by_id, &id, sizeof id, w);
    return w;
}

static kvr_status grow(struct kvr_registry *g)
{
    uint32_t n = g->nslots ? g->nslots * 2 : 8;
    struct kvr_worker **by_slot = realloc(g->by_slot, (size_t)n * sizeof *by_slot);
    if (!by_slot)
        return KVR_ERR_NOMEM;
    g->by_slot = by_slot;
    uint32_t *order = realloc(g->order, (size_t)n * sizeof *order);
    if (!order)
        return KVR_ERR_NOMEM;
    g->order = order;
    for (uint32_t s = g->nslots; s < n; s++)
        by_slot[s] = NULL;
    g->nslots = n;
    return KVR_OK;
}

kvr_status kvr_registry_add(struct kvr_registry *g, uint64_t id, struct kvr_worker **out)
{
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
    while (g->by_slot[slot])
        slot++;
    struct kvr_worker *w = calloc(1, sizeof *w);
    if (!w)
        return KVR_ERR_NOMEM;
    w->id = id;
    w->slot = slot;
    HASH_ADD(hh, g->by_id, id, sizeof w->id, w);
    g->by_slot[slot] = w;
    g->order[g->nlive++] = slot;
    *out = w;
    return KVR_OK;
}

void kvr_registry_remove(struct kvr_registry *g, struct kvr_worker *w)
{
    for (uint32_t i = 0; i < g->nlive; i++) {
        if (g->order[i] == w->slot) {
            memmove(g->order + i, g->order + i + 1, (size_t)(g->nlive - i - 1) * sizeof *g->order);
            g->nlive--;
            break;
        }
    }
    g->by_slot[w->slot] = NULL;
    HASH_DEL(g->by_id, w);
    free(w);
}
