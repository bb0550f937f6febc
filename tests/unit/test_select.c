/* Every policy's rule on hand-made candidates. */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <string.h>

#include "kvr/policy.h"
#include "map.h"
#include "select.h"

static struct kvr_router_config cfg;
static struct kvr_select_state st;
static struct kvr_candidate c[8];
static uint32_t all[8] = {0, 1, 2, 3, 4, 5, 6, 7};
static uint32_t slots[8] = {0, 1, 2, 3, 4, 5, 6, 7};

static void setup(void)
{
    kvr_router_config_default(&cfg);
    kvr_select_init(&st, 11);
    memset(c, 0, sizeof c);
    for (int i = 0; i < 8; i++) {
        c[i].worker_id = (uint64_t)i + 1;
        c[i].cost = 100;
    }
}

static void teardown(void)
{
    kvr_select_free(&st);
}

TestSuite(select, .init = setup, .fini = teardown);

static uint32_t pick(enum kvr_policy p, uint32_t n)
{
    if (p == KVR_POLICY_KV) { /* the kv policy reads plain arrays */
        double costs[8];
        uint32_t cached[8];
        for (uint32_t i = 0; i < n; i++) {
            costs[i] = c[i].cost;
            cached[i] = c[i].cached_blocks;
        }
        return kvr_select_kv(&st, 0.0, 0.0, 0, NULL, costs, slots, cached, all, n);
    }
    struct kvr_select_input in = {p, 10, 12345, NULL, slots};
    return kvr_select(&st, &cfg, &in, c, all, n);
}

Test(select, policy_names_round_trip)
{
    for (int p = 0; p < KVR_POLICY_COUNT; p++) {
        enum kvr_policy out;
        const char *name = kvr_policy_name((enum kvr_policy)p);
        cr_assert(eq(int, kvr_policy_parse(name, strlen(name), &out), KVR_OK));
        cr_assert(eq(int, out, p));
    }
    enum kvr_policy out;
    cr_assert(eq(int, kvr_policy_parse("kvx", 3, &out), KVR_ERR_UNKNOWN_POLICY));
    cr_assert(eq(int, kvr_policy_parse("k", 1, &out), KVR_ERR_UNKNOWN_POLICY));
    cr_assert(eq(int, kvr_policy_parse(NULL, 0, &out), KVR_ERR_UNKNOWN_POLICY));
    cr_assert(eq(str, (char *)kvr_policy_name((enum kvr_policy)99), "unknown"));
}

Test(select, kv_takes_lowest_cost)
{
    c[5].cost = 40;
    c[2].cost = 41;
    cr_assert(eq(u32, pick(KVR_POLICY_KV, 8), 5));
}

Test(select, kv_ties_go_to_fewest_cached_blocks_then_random)
{
    for (int i = 0; i < 8; i++)
        c[i].cached_blocks = 50;
    c[3].cached_blocks = 10;
    cr_assert(eq(u32, pick(KVR_POLICY_KV, 8), 3));
    c[3].cached_blocks = 50;
    uint32_t seen[8] = {0};
    for (int k = 0; k < 4000; k++)
        seen[pick(KVR_POLICY_KV, 8)]++;
    for (int i = 0; i < 8; i++)
        cr_assert(gt(u32, seen[i], 350), "tie-break is uniform: worker %d got %u", i, seen[i]);
}

Test(select, kv_temperature_prefers_cheap_but_samples)
{
    for (int i = 0; i < 8; i++)
        c[i].cost = 100 + 10 * i;
    double costs[8];
    uint32_t cached[8] = {0};
    for (int i = 0; i < 8; i++)
        costs[i] = c[i].cost;
    uint32_t seen[8] = {0};
    for (int k = 0; k < 8000; k++)
        seen[kvr_select_kv(&st, 0.5, 0.0, 0, NULL, costs, slots, cached, all, 8)]++;
    cr_assert(gt(u32, seen[0], seen[7] * 3), "cheapest %u vs dearest %u", seen[0], seen[7]);
    cr_assert(gt(u32, seen[7], 50), "the dearest is still sampled");
    for (int i = 1; i < 8; i++)
        cr_assert(ge(u32, seen[i - 1] + 150, seen[i]), "monotone in cost");
}

Test(select, random_is_uniform_and_round_robin_cycles)
{
    uint32_t seen[8] = {0};
    for (int k = 0; k < 8000; k++)
        seen[pick(KVR_POLICY_RANDOM, 8)]++;
    for (int i = 0; i < 8; i++)
        cr_assert(epsilon_eq(dbl, (double)(seen[i]), 1000.0, 200.0));
    for (uint32_t k = 0; k < 24; k++)
        cr_assert(eq(u32, pick(KVR_POLICY_ROUND_ROBIN, 8), k % 8));
}

Test(select, least_loaded_and_power_of_two)
{
    for (int i = 0; i < 8; i++)
        c[i].inflight = 10 + (uint32_t)i;
    c[6].inflight = 2;
    cr_assert(eq(u32, pick(KVR_POLICY_LEAST_LOADED, 8), 6));
    uint32_t seen[8] = {0};
    for (int k = 0; k < 4000; k++)
        seen[pick(KVR_POLICY_POWER_OF_TWO, 8)]++;
    cr_assert(eq(u32, seen[7], 0), "the most loaded never wins a pair");
    cr_assert(gt(u32, seen[6], seen[5]), "the least loaded wins most often");
    cr_assert(eq(u32, pick(KVR_POLICY_POWER_OF_TWO, 1), 0));
}

Test(select, prefix_only_ignores_load)
{
    c[4].overlap_blocks = 9;
    c[4].inflight = 1000;
    c[1].overlap_blocks = 3;
    cr_assert(eq(u32, pick(KVR_POLICY_PREFIX_ONLY, 8), 4));
}

Test(select, sglang_balances_when_imbalanced_else_follows_prefix)
{
    for (int i = 0; i < 8; i++)
        c[i].inflight = 100;
    c[2].overlap_blocks = 5; /* 50 % of 10 blocks: above the 0.3 threshold */
    c[2].inflight = 101;
    c[7].inflight = 90;
    cr_assert(eq(u32, pick(KVR_POLICY_SGLANG, 8), 2), "balanced: the best match wins");
    c[2].overlap_blocks = 2; /* 20 %: below the threshold */
    cr_assert(eq(u32, pick(KVR_POLICY_SGLANG, 8), 7), "weak match: least loaded");
    c[2].overlap_blocks = 5;
    c[7].inflight = 20; /* 101 - 20 > 64 and 101 > 1.5 * 20 */
    cr_assert(eq(u32, pick(KVR_POLICY_SGLANG, 8), 7), "imbalanced: least loaded");
    cfg.sglang_balance_abs = 100; /* the thresholds are settable */
    cr_assert(eq(u32, pick(KVR_POLICY_SGLANG, 8), 2));
}

Test(select, llmd_weighs_queue_kv_free_and_prefix)
{
    for (int i = 0; i < 8; i++) {
        c[i].waiting = 10;
        c[i].kv_usage = 0.5;
    }
    c[0].waiting = 0;         /* queue score 1 vs 0: +2 */
    c[1].overlap_blocks = 10; /* prefix score 1: +3 */
    cr_assert(eq(u32, pick(KVR_POLICY_LLMD, 8), 1));
    c[0].kv_usage = 0.0; /* 2 + 2 * 1.0 = 4 ties with 3 + 2 * 0.5 = 4; nudge it above: */
    c[0].kv_usage = -0.01;
    cr_assert(eq(u32, pick(KVR_POLICY_LLMD, 8), 0));
}

Test(select, chwbl_is_consistent_and_bounded)
{
    uint64_t ids[8];
    uint32_t slot_cand[8];
    for (int i = 0; i < 8; i++) {
        ids[i] = (uint64_t)i + 1;
        slot_cand[i] = (uint32_t)i;
    }
    cr_assert(eq(int, kvr_select_ring(&st, ids, slots, 8, cfg.chwbl_vnodes), KVR_OK));
    cr_assert(eq(u32, st.nring, 8 * 256));
    struct kvr_select_input in = {KVR_POLICY_CHWBL, 10, 777, slot_cand, slots};
    uint32_t first = kvr_select(&st, &cfg, &in, c, all, 8);
    for (int k = 0; k < 10; k++)
        cr_assert(eq(u32, kvr_select(&st, &cfg, &in, c, all, 8), first), "same key, same worker");
    uint32_t spread[8] = {0};
    for (uint64_t key = 0; key < 8000; key++) {
        in.first_hash = kvr_mix64(key);
        spread[kvr_select(&st, &cfg, &in, c, all, 8)]++;
    }
    for (int i = 0; i < 8; i++)
        cr_assert(epsilon_eq(dbl, (double)(spread[i]), 1000.0, 350.0), "keys spread: %u",
                  spread[i]);
    in.first_hash = 777;
    for (int i = 0; i < 8; i++)
        c[i].inflight = 4;
    c[first].inflight = 40; /* over 1.25 x mean: walk on */
    cr_assert(ne(u32, kvr_select(&st, &cfg, &in, c, all, 8), first));
}

/* A temperature so small that the spread of the costs times it underflows to 0 (a per-request
 * override takes any finite value >= 0) prices every candidate 0 / 0: NaN weights, and the draw
 * fell through to the last candidate, the dearest here. It is the cheapest, as at temperature 0. */
Test(select, kv_a_temperature_whose_scale_underflows_takes_the_cheapest)
{
    double costs[8];
    uint32_t cached[8] = {0};
    for (int i = 0; i < 8; i++)
        costs[i] = 100 + 0.05 * i; /* a spread of 0.35 */
    for (int k = 0; k < 100; k++)
        cr_assert(
            eq(u32, kvr_select_kv(&st, 5e-324, 0.0, 0, NULL, costs, slots, cached, all, 8), 0));
}
