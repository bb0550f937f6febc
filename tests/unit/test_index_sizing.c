/*
 * The prefix index sized from the fleet, through the router: the bound follows the capacities the
 * workers announce (clamped, as a heartbeat is untrusted), an explicit bound overrides it, pruning
 * of entries the engines still hold is counted apart and reported at most once per interval, and
 * an approximate router drops KV events.
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <math.h>
#include <string.h>

#include "index.h"
#include "kvr/rng.h"
#include "kvr/router.h"

#define B  16
#define NS 1000000000ull

static struct kvr_router_config cfg;
static struct kvr_router *r;

struct warned {
    int calls;
    uint64_t pruned;
    uint32_t max_entries;
    bool from_fleet;
};
static struct warned wn;

static void on_warn(void *ctx, uint64_t pruned, uint32_t max_entries, bool from_fleet)
{
    struct warned *w = ctx;
    w->calls++;
    w->pruned = pruned;
    w->max_entries = max_entries;
    w->from_fleet = from_fleet;
}

static void init(void)
{
    kvr_router_config_default(&cfg);
    cfg.block_size = B;
    memset(&wn, 0, sizeof wn);
    cfg.index_warn = on_warn;
    cfg.index_warn_ctx = &wn;
    r = NULL;
}

static void fini(void)
{
    kvr_router_destroy(r);
}

static void make(void)
{
    kvr_status st;
    r = kvr_router_create(&cfg, &st);
    cr_assert(r != NULL);
    cr_assert(eq(int, st, KVR_OK));
}

static void announce(uint64_t id, uint64_t capacity)
{
    struct kvr_worker_info info = {.id = id, .block_size = B, .capacity_blocks = capacity};
    cr_assert(eq(int, kvr_router_worker_seen(r, &info, 0), KVR_OK));
}

static struct kvr_router_stats stats(void)
{
    struct kvr_router_stats s;
    kvr_router_stats(r, &s);
    return s;
}

/* Worker id stores n blocks of one chain starting at local hash base (engine ids base + i). */
static void store(uint64_t id, uint64_t base, uint32_t n)
{
    struct kvr_kv_block b[64];
    cr_assert(le(u32, n, 64));
    for (uint32_t i = 0; i < n; i++)
        b[i] = (struct kvr_kv_block){base + i, kvr_mix64(base + i)};
    cr_assert(eq(int, kvr_router_kv_stored(r, id, NULL, b, n), KVR_OK));
}

TestSuite(index_sizing, .init = init, .fini = fini);

Test(index_sizing, defaults_derive_the_bound_from_the_fleet)
{
    cr_assert(eq(u32, cfg.index_max_entries, 0), "0: from the fleet");
    make();
    cr_assert(eq(u32, stats().index_max, 1u << 20), "nothing announced: the floor");
    announce(1, 100000); /* 1.25 x 100,000 is below the floor */
    cr_assert(eq(u32, stats().index_max, 1u << 20));
}

Test(index_sizing, the_bound_follows_announced_capacities_up_and_down)
{
    make();
    for (uint64_t w = 1; w <= 32; w++)
        announce(w, 65536);
    cr_assert(eq(u32, stats().index_max, 32u * 65536 * 5 / 4), "32 x 65,536 x 1.25");
    announce(1, 65536 * 2); /* a larger engine */
    cr_assert(eq(u32, stats().index_max, 33u * 65536 * 5 / 4));
    announce(1, 0); /* capacity unknown: counts nothing */
    cr_assert(eq(u32, stats().index_max, 31u * 65536 * 5 / 4));
    for (uint64_t w = 2; w <= 16; w++)
        cr_assert(eq(int, kvr_router_worker_remove(r, w), KVR_OK));
    cr_assert(eq(u32, stats().index_max, 16u * 65536 * 5 / 4), "removal shrinks it");
    for (uint64_t w = 17; w <= 28; w++)
        cr_assert(eq(int, kvr_router_worker_remove(r, w), KVR_OK));
    cr_assert(eq(u32, stats().index_max, 1u << 20), "never below the floor");
}

Test(index_sizing, a_forged_huge_capacity_is_clamped)
{
    make();
    announce(1, UINT64_MAX); /* one heartbeat claims an endless pool */
    cr_assert(eq(u32, stats().index_max, (uint32_t)(cfg.index_worker_max * 5 / 4)),
              "counted at the per-worker maximum");
    for (uint64_t w = 2; w <= 64; w++)
        announce(w, 1ull << 40);
    cr_assert(eq(u32, stats().index_max, cfg.index_ceiling), "the total stops at the ceiling");
    cr_assert(eq(u32, cfg.index_ceiling, 1u << 24));
    for (uint64_t w = 1; w <= 64; w++)
        cr_assert(eq(int, kvr_router_worker_remove(r, w), KVR_OK));
    cr_assert(eq(u32, stats().index_max, 1u << 20), "and none of it outlives the workers");
}

Test(index_sizing, an_explicit_bound_overrides_the_fleet)
{
    cfg.index_max_entries = 5000;
    make();
    cr_assert(eq(u32, stats().index_max, 5000));
    for (uint64_t w = 1; w <= 8; w++)
        announce(w, 1u << 20);
    cr_assert(eq(u32, stats().index_max, 5000), "capacities do not move it");
    cfg.index_max_entries = 1u << 30; /* an operator may go above the ceiling */
    kvr_router_destroy(r);
    make();
    cr_assert(eq(u32, stats().index_max, 1u << 30));
}

Test(index_sizing, bad_settings_are_refused)
{
    struct kvr_router_config good = cfg;
    double bad_headroom[] = {0.99, 65, NAN};
    for (size_t i = 0; i < sizeof bad_headroom / sizeof bad_headroom[0]; i++) {
        cfg = good;
        cfg.index_headroom = bad_headroom[i];
        kvr_status st;
        cr_assert(kvr_router_create(&cfg, &st) == NULL, "headroom %g", bad_headroom[i]);
        cr_assert(eq(int, st, KVR_ERR_INVALID));
    }
    struct kvr_router_config bad[4] = {good, good, good, good};
    bad[0].index_ceiling = 0;
    bad[1].index_ceiling = KVR_INDEX_MAX_ENTRIES + 1;
    bad[2].index_min_entries = 0;
    bad[3].index_max_entries = KVR_INDEX_MAX_ENTRIES + 1;
    for (int i = 0; i < 4; i++) {
        kvr_status st;
        cr_assert(kvr_router_create(&bad[i], &st) == NULL, "setting %d", i);
        cr_assert(eq(int, st, KVR_ERR_INVALID));
    }
}

Test(index_sizing, the_ceiling_wins_over_the_floor)
{
    struct kvr_router_config c = cfg;
    c.index_ceiling = 1000;
    cr_assert(eq(u32, kvr_index_bound(&c, 0), 1000));
    cr_assert(eq(u32, kvr_index_bound(&c, 1u << 30), 1000));
    c.index_ceiling = KVR_INDEX_MAX_ENTRIES;
    c.index_min_entries = 10;
    cr_assert(eq(u32, kvr_index_bound(&c, 8), 10));
    cr_assert(eq(u32, kvr_index_bound(&c, 80), 100));
    cr_assert(eq(u32, kvr_index_bound(&c, UINT64_MAX), KVR_INDEX_MAX_ENTRIES));
    cr_assert(eq(u64, kvr_index_counted_blocks(&c, UINT64_MAX), c.index_worker_max));
    cr_assert(eq(u64, kvr_index_counted_blocks(&c, 77), 77));
}

Test(index_sizing, shrinking_the_bound_prunes_counted)
{
    cfg.index_min_entries = 16;
    cfg.index_headroom = 1.0;
    make();
    announce(1, 100);
    announce(2, 100);
    cr_assert(eq(u32, stats().index_max, 200));
    store(1, 1000, 60);
    store(2, 2000, 60);
    cr_assert(eq(u32, stats().index_entries, 120));
    cr_assert(eq(u64, stats().index.pruned, 0));
    announce(2, 0); /* the bound drops to 100, below what the engines hold */
    struct kvr_router_stats s = stats();
    cr_assert(eq(u32, s.index_max, 100));
    cr_assert(eq(u32, s.index_entries, 80), "pruned to 80 %% of the new bound");
    cr_assert(eq(u64, s.index.pruned_live, 40), "every pruned entry counted as a live one");
    cr_assert(eq(u64, s.index.pruned, 40));
}

Test(index_sizing, live_pruning_is_reported_once_per_interval)
{
    cfg.index_max_entries = 50;
    make();
    announce(1, 1000);
    kvr_router_tick(r, 1 * NS);
    cr_assert(eq(int, wn.calls, 0), "nothing pruned: nothing said");
    store(1, 1000, 60); /* over the bound: pruned to 40 */
    cr_assert(eq(u64, stats().index.pruned_live, 20));
    kvr_router_tick(r, 2 * NS);
    cr_assert(eq(int, wn.calls, 1));
    cr_assert(eq(u64, wn.pruned, 20));
    cr_assert(eq(u32, wn.max_entries, 50));
    cr_assert(not(wn.from_fleet));
    store(1, 5000, 60);
    kvr_router_tick(r, 30 * NS);
    cr_assert(eq(int, wn.calls, 1), "not again within 60 s");
    kvr_router_tick(r, 62 * NS);
    cr_assert(eq(int, wn.calls, 2));
    cr_assert(eq(u64, wn.pruned, stats().index.pruned_live - 20), "what was pruned since");
    kvr_router_tick(r, 200 * NS);
    cr_assert(eq(int, wn.calls, 2), "no new pruning: nothing said");
}

Test(index_sizing, pruned_guesses_are_not_live_entries)
{
    cfg.approximate = true;
    cfg.index_max_entries = 50;
    make();
    announce(1, 1000);
    uint32_t tokens[64 * B];
    for (uint32_t i = 0; i < 64 * B; i++)
        tokens[i] = i;
    struct kvr_request q = {.id = 1, .tokens = tokens, .ntokens = 64 * B, .max_tokens = 1};
    struct kvr_decision d;
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
    struct kvr_router_stats s = stats();
    cr_assert(eq(u64, s.index.pruned, 24), "64 guesses pruned to 40");
    cr_assert(eq(u64, s.index.pruned_live, 0), "none of them an engine's word");
    kvr_router_tick(r, NS);
    cr_assert(eq(int, wn.calls, 0), "guesses pruned are not reported");
}

Test(index_sizing, an_approximate_router_drops_kv_events)
{
    cfg.approximate = true;
    make();
    announce(1, 1000);
    store(1, 1000, 8);
    uint64_t ids[2] = {1000, 1001};
    cr_assert(eq(int, kvr_router_kv_removed(r, 1, ids, 2), KVR_OK));
    struct kvr_router_stats s = stats();
    cr_assert(eq(u64, s.kv_ignored, 2));
    cr_assert(eq(u32, s.index_entries, 0), "no event entry beside the guesses");
    cr_assert(eq(u64, s.index.stored_blocks, 0));
    cr_assert(eq(u64, s.index.unknown_block, 0), "removals are not even looked up");
    cr_assert(eq(int, kvr_router_kv_stored(r, 9, NULL, NULL, 0), KVR_ERR_UNKNOWN_WORKER),
              "an unknown worker is still an error");
    cr_assert(eq(int, kvr_router_kv_cleared(r, 1), KVR_OK), "Cleared only forgets: applied");
    cr_assert(eq(u64, stats().kv_ignored, 2));
}

Test(index_sizing, an_event_mode_router_applies_kv_events)
{
    make();
    announce(1, 1000);
    store(1, 1000, 8);
    struct kvr_router_stats s = stats();
    cr_assert(eq(u64, s.kv_ignored, 0));
    cr_assert(eq(u32, s.index_entries, 8));
    cr_assert(eq(u64, s.index.stored_blocks, 8));
}
