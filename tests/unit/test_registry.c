/*
 * kvr_registry against a reference: slots, the join order, and the compact arrays the pricing
 * loop reads (order_ids, the hot entries) through random joins, leaves and announcements.
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kvr/rng.h"
#include "registry.h"

/* The busy rule of the worker records, as the decision tested it before the hot entries. */
static bool busy_by_record(const struct kvr_worker *w, double threshold, uint64_t blocks)
{
    if (w->draining)
        return true;
    return threshold > 0 && w->capacity_blocks &&
           (double)blocks > threshold * (double)w->capacity_blocks;
}

static void check(const struct kvr_registry *g, double threshold, struct kvr_rng *rng)
{
    for (uint32_t i = 0; i < g->nlive; i++) {
        uint32_t slot = g->order[i];
        const struct kvr_worker *w = &g->by_slot[slot];
        cr_assert(ne(u64, w->id, 0));
        cr_assert(eq(u64, g->order_ids[i], w->id));
        cr_assert(eq(dbl, g->hot[slot].inv_capacity, w->inv_capacity));
        uint64_t probes[] = {0,
                             1,
                             w->capacity_blocks,
                             w->capacity_blocks + 1,
                             (uint64_t)(threshold * (double)w->capacity_blocks),
                             (uint64_t)(threshold * (double)w->capacity_blocks) + 1,
                             kvr_rng_below(rng, 2 * w->capacity_blocks + 2),
                             UINT64_MAX};
        for (size_t k = 0; k < sizeof probes / sizeof *probes; k++)
            cr_assert(eq(int, kvr_registry_busy_blocks(g, slot, probes[k]),
                         busy_by_record(w, threshold, probes[k])),
                      "slot %u blocks %llu", slot, (unsigned long long)probes[k]);
    }
    static const struct kvr_worker_hot zero;
    for (uint32_t s = 0; s < g->nslots; s++)
        if (g->by_slot[s].id == 0)
            cr_assert(not(memcmp(&g->hot[s], &zero, sizeof zero)), "free slot %u", s);
}

Test(registry, new_worker_is_never_busy_by_blocks)
{
    struct kvr_registry g;
    cr_assert(eq(int, kvr_registry_init(&g, 4), KVR_OK));
    uint32_t slot;
    cr_assert(eq(int, kvr_registry_add(&g, 7, &slot), KVR_OK));
    cr_assert(not(kvr_registry_busy_blocks(&g, slot, UINT64_MAX)), "no capacity announced yet");
    cr_assert(eq(u64, g.order_ids[0], 7));
    g.by_slot[slot].draining = true;
    kvr_registry_sync_hot(&g, slot, 0.95);
    cr_assert(kvr_registry_busy_blocks(&g, slot, 0), "draining: busy at any load");
    g.by_slot[slot].draining = false;
    g.by_slot[slot].capacity_blocks = 100;
    g.by_slot[slot].inv_capacity = 0.01;
    kvr_registry_sync_hot(&g, slot, 0.95);
    cr_assert(not(kvr_registry_busy_blocks(&g, slot, 95)));
    cr_assert(kvr_registry_busy_blocks(&g, slot, 96));
    cr_assert(eq(dbl, g.hot[slot].inv_capacity, 0.01));
    kvr_registry_sync_hot(&g, slot, 0);
    cr_assert(not(kvr_registry_busy_blocks(&g, slot, UINT64_MAX)), "threshold 0: never busy");
    kvr_registry_free(&g);
}

Test(registry, random_joins_and_leaves_keep_the_compact_arrays)
{
    enum { IDS = 300, OPS = 20000 };
    static const double thresholds[] = {0.95, 0.0, 0.5};
    for (size_t ti = 0; ti < sizeof thresholds / sizeof *thresholds; ti++) {
        double thr = thresholds[ti];
        struct kvr_registry g;
        struct kvr_rng rng;
        kvr_rng_seed(&rng, 42 + ti);
        cr_assert(eq(int, kvr_registry_init(&g, 200), KVR_OK));
        uint64_t joined[IDS + 1] = {0}; /* the reference join order */
        uint32_t njoined = 0;
        for (uint32_t op = 0; op < OPS; op++) {
            uint64_t id = 1 + kvr_rng_below(&rng, IDS);
            struct kvr_worker *w = kvr_registry_find(&g, id);
            uint32_t what = (uint32_t)kvr_rng_below(&rng, 4);
            if (!w && what < 3) {
                uint32_t slot;
                kvr_status st = kvr_registry_add(&g, id, &slot);
                if (njoined == 200) {
                    cr_assert(eq(int, st, KVR_ERR_FULL));
                    continue;
                }
                cr_assert(eq(int, st, KVR_OK));
                joined[njoined++] = id;
            } else if (w && what == 3) {
                kvr_registry_remove(&g, kvr_registry_slot(&g, w));
                uint32_t i = 0;
                while (joined[i] != id)
                    i++;
                memmove(joined + i, joined + i + 1, (njoined - i - 1) * sizeof *joined);
                njoined--;
            } else if (w) { /* an announcement */
                uint64_t cap = kvr_rng_below(&rng, 3) ? kvr_rng_below(&rng, 1000) : 0;
                w->capacity_blocks = cap;
                w->inv_capacity = cap ? 1.0 / (double)cap : 0.0;
                w->draining = kvr_rng_below(&rng, 5) == 0;
                kvr_registry_sync_hot(&g, kvr_registry_slot(&g, w), thr);
            }
            cr_assert(eq(u32, g.nlive, njoined));
            for (uint32_t i = 0; i < njoined; i++)
                cr_assert(eq(u64, g.order_ids[i], joined[i]));
            if (op % 64 == 0)
                check(&g, thr, &rng);
        }
        check(&g, thr, &rng);
        kvr_registry_free(&g);
    }
}
