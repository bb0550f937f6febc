/* The predictive active-block map: booking, lifecycle, loads, TTL, worker loss, invariants. */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include "../criterion_end.h"
#include <string.h>

#include "active.h"
#include "kvr/rng.h"

#define B 16

static struct kvr_blocktab tab;
static struct kvr_active act;
static bool ended; /* end ran: everything is freed */

static void setup(void)
{
    ended = false;
    cr_assert(eq(int, kvr_blocktab_init(&tab, 16), KVR_OK));
    cr_assert(eq(int, kvr_active_init(&act, &tab, B, 16), KVR_OK));
    cr_assert(eq(int, kvr_active_reserve(&act, 4), KVR_OK));
}

/* Every test's last step (criterion_end.h): the map freed, no node or set left behind. */
static void end(void)
{
    kvr_active_free(&act);
    cr_assert(eq(u32, kvr_blocktab_count(&tab), 0), "every node freed with its last request");
    cr_assert(eq(sz, tab.set_bytes, 0));
    kvr_blocktab_free(&tab);
    ended = true;
}

static void teardown(void)
{
    if (!ended) { /* a failed test */
        kvr_active_free(&act);
        kvr_blocktab_free(&tab);
    }
}

TestSuite(active, .init = setup, .fini = teardown);

/* Nodes for seq hashes base..base+n-1. */
static void nodes_for(uint64_t base, uint32_t n, uint32_t *nodes)
{
    for (uint32_t i = 0; i < n; i++)
        cr_assert(eq(int, kvr_blocktab_get(&tab, kvr_mix64(base + i), &nodes[i]), KVR_OK));
}

KVR_TEST_END(active, add_counts_distinct_blocks_and_prefill, end)
{
    uint32_t a[4], b[6];
    nodes_for(100, 4, a);
    nodes_for(100, 6, b); /* shares the first four blocks */
    cr_assert(eq(int, kvr_active_add(&act, 1, 0, a, 4, 4 * B + 3, 1, 0), KVR_OK));
    /* 4 table blocks + 1 partial; prefill = 67 - 16 */
    cr_assert(eq(u64, act.w[0].blocks, 5));
    cr_assert(eq(u64, act.w[0].prefill, 4 * B + 3 - B));
    cr_assert(eq(int, kvr_active_add(&act, 2, 0, b, 6, 6 * B, 4, 0), KVR_OK));
    cr_assert(eq(u64, act.w[0].blocks, 5 + 2), "shared blocks count once");
    cr_assert(eq(u64, act.w[0].prefill, 51 + 2 * B));
    cr_assert(eq(u32, act.w[0].nreqs, 2));
    cr_assert(eq(int, kvr_active_add(&act, 3, 1, a, 4, 4 * B, 9, 0), KVR_OK));
    cr_assert(eq(u64, act.w[1].prefill, 0), "overlap beyond the prompt clamps at zero");
    cr_assert(eq(int, kvr_active_remove(&act, 1), KVR_OK));
    cr_assert(eq(u64, act.w[0].blocks, 6));
    cr_assert(eq(int, kvr_active_remove(&act, 2), KVR_OK));
    cr_assert(eq(int, kvr_active_remove(&act, 3), KVR_OK));
    for (int w = 0; w < 4; w++) {
        cr_assert(eq(u64, act.w[w].blocks, 0));
        cr_assert(eq(u64, act.w[w].prefill, 0));
    }
}

KVR_TEST_END(active, lifecycle_moves_prefill_and_output_blocks, end)
{
    uint32_t a[2];
    nodes_for(7, 2, a);
    cr_assert(eq(int, kvr_active_add(&act, 9, 2, a, 2, 2 * B, 0, 0), KVR_OK));
    cr_assert(eq(u64, act.w[2].prefill, 2 * B));
    cr_assert(eq(int, kvr_active_prefill_done(&act, 9, 1), KVR_OK));
    cr_assert(eq(u64, act.w[2].prefill, 0));
    cr_assert(eq(int, kvr_active_prefill_done(&act, 9, 2), KVR_OK), "a repeat is harmless");
    cr_assert(eq(u64, act.w[2].prefill, 0));
    cr_assert(eq(int, kvr_active_output_block(&act, 9, 3), KVR_OK));
    cr_assert(eq(int, kvr_active_output_block(&act, 9, 4), KVR_OK));
    cr_assert(eq(u64, act.w[2].blocks, 4));
    cr_assert(eq(int, kvr_active_remove(&act, 9), KVR_OK));
    cr_assert(eq(u64, act.w[2].blocks, 0));
}

KVR_TEST_END(active, unknown_and_duplicate_ids_are_refused, end)
{
    uint32_t a[1];
    nodes_for(1, 1, a);
    cr_assert(eq(int, kvr_active_prefill_done(&act, 5, 0), KVR_ERR_UNKNOWN_REQUEST));
    cr_assert(eq(int, kvr_active_output_block(&act, 5, 0), KVR_ERR_UNKNOWN_REQUEST));
    cr_assert(eq(int, kvr_active_remove(&act, 5), KVR_ERR_UNKNOWN_REQUEST));
    cr_assert(eq(int, kvr_active_add(&act, 5, 0, a, 1, B, 0, 0), KVR_OK));
    cr_assert(eq(int, kvr_active_add(&act, 5, 1, a, 1, B, 0, 0), KVR_ERR_DUPLICATE));
    cr_assert(eq(u32, act.w[1].nreqs, 0));
    cr_assert(eq(int, kvr_active_add(&act, 6, 99, a, 1, B, 0, 0), KVR_ERR_INVALID));
    cr_assert(eq(int, kvr_active_remove(&act, 5), KVR_OK));
    cr_assert(eq(int, kvr_active_remove(&act, 5), KVR_ERR_UNKNOWN_REQUEST), "a double free too");
}

static uint32_t dropped;
static void count_drop(void *ctx, uint64_t id, uint32_t slot)
{
    (void)ctx;
    (void)id;
    (void)slot;
    dropped++;
}

KVR_TEST_END(active, stale_requests_expire_after_their_last_event, end)
{
    uint32_t a[3];
    nodes_for(1, 3, a);
    dropped = 0;
    cr_assert(eq(int, kvr_active_add(&act, 1, 0, a, 3, 3 * B, 0, 10), KVR_OK));
    cr_assert(eq(int, kvr_active_add(&act, 2, 1, a, 3, 3 * B, 0, 20), KVR_OK));
    cr_assert(eq(int, kvr_active_output_block(&act, 1, 30), KVR_OK)); /* 1 is alive at 30 */
    cr_assert(eq(u32, kvr_active_expire(&act, 25, count_drop, NULL), 1));
    cr_assert(eq(u32, dropped, 1));
    cr_assert(kvr_active_find(&act, 2) == NULL);
    cr_assert(kvr_active_find(&act, 1) != NULL);
    cr_assert(eq(u32, kvr_active_expire(&act, 30, count_drop, NULL), 1));
    cr_assert(eq(u32, kvr_active_count(&act), 0));
}

KVR_TEST_END(active, dropping_a_worker_frees_only_its_requests, end)
{
    uint32_t a[3];
    nodes_for(1, 3, a);
    dropped = 0;
    for (uint64_t id = 1; id <= 10; id++)
        cr_assert(eq(int, kvr_active_add(&act, id, (uint32_t)(id % 2), a, 3, 3 * B, 0, 0), KVR_OK));
    cr_assert(eq(u32, kvr_active_drop_worker(&act, 1, count_drop, NULL), 5));
    cr_assert(eq(u32, dropped, 5));
    cr_assert(eq(u32, act.w[1].nreqs, 0));
    cr_assert(eq(u64, act.w[1].blocks, 0));
    cr_assert(eq(u32, act.w[0].nreqs, 5));
    cr_assert(eq(u64, act.w[0].blocks, 3));
}

/* Random add/event/remove traffic; loads always match a recount, and all goes to zero. */
KVR_TEST_END(active, random_traffic_keeps_invariants, end)
{
    enum { N = 400 };
    struct kvr_rng rng;
    kvr_rng_seed(&rng, 3);
    static uint32_t nodes[N][24];
    static uint32_t nn[N];
    static bool live[N];
    memset(live, 0, sizeof live);
    for (int op = 0; op < 20000; op++) {
        uint32_t i = (uint32_t)kvr_rng_below(&rng, N);
        uint64_t id = i + 1;
        if (!live[i]) {
            nn[i] = 1 + (uint32_t)kvr_rng_below(&rng, 24);
            nodes_for(kvr_rng_below(&rng, 4) * 1000, nn[i], nodes[i]); /* 4 shared families */
            uint32_t slot = (uint32_t)kvr_rng_below(&rng, 4);
            cr_assert(
                eq(int,
                   kvr_active_add(&act, id, slot, nodes[i], nn[i], nn[i] * B + 5, 0, (uint64_t)op),
                   KVR_OK));
            live[i] = true;
        } else {
            switch (kvr_rng_below(&rng, 3)) {
            case 0:
                cr_assert(eq(int, kvr_active_prefill_done(&act, id, (uint64_t)op), KVR_OK));
                break;
            case 1:
                cr_assert(eq(int, kvr_active_output_block(&act, id, (uint64_t)op), KVR_OK));
                break;
            default:
                cr_assert(eq(int, kvr_active_remove(&act, id), KVR_OK));
                live[i] = false;
            }
        }
        cr_assert(lt(u64, act.w[0].blocks + act.w[1].blocks + act.w[2].blocks + act.w[3].blocks,
                     (uint64_t)1 << 40),
                  "no counter wrapped below zero");
        uint32_t working = 0;
        for (int w = 0; w < 4; w++)
            working += act.w[w].nreqs > 0;
        cr_assert(eq(u32, act.nworking, working), "nworking counts the workers with requests");
    }
    for (uint32_t i = 0; i < N; i++)
        if (live[i])
            cr_assert(eq(int, kvr_active_remove(&act, i + 1), KVR_OK));
    for (int w = 0; w < 4; w++) {
        cr_assert(eq(u64, act.w[w].blocks, 0));
        cr_assert(eq(u64, act.w[w].prefill, 0));
        cr_assert(eq(u32, act.w[w].nreqs, 0));
    }
    cr_assert(eq(u32, act.nworking, 0));
}

/* by_load: the listed slots, ascending by nreqs, with load_pos and load_first agreeing. */
static void check_by_load(const bool *listed, uint32_t nslots)
{
    uint32_t n = 0;
    for (uint32_t s = 0; s < nslots; s++) {
        if (!listed[s]) {
            cr_assert(eq(u32, act.w[s].load_pos, KVR_NIL), "slot %u is not listed", s);
            continue;
        }
        n++;
        cr_assert(lt(u32, act.w[s].load_pos, act.nlisted));
        cr_assert(eq(u32, act.by_load[act.w[s].load_pos], s));
    }
    cr_assert(eq(u32, act.nlisted, n));
    for (uint32_t i = 1; i < act.nlisted; i++)
        cr_assert(le(u32, act.w[act.by_load[i - 1]].nreqs, act.w[act.by_load[i]].nreqs));
    for (uint32_t c = 0; c < act.nloads; c++) {
        uint32_t first = 0;
        while (first < act.nlisted && act.w[act.by_load[first]].nreqs < c)
            first++;
        cr_assert(eq(u32, act.load_first[c], first), "the first of load %u", c);
    }
    cr_assert(eq(u32, act.load_first[act.nloads - 1], act.nlisted), "the last load is empty");
}

KVR_TEST_END(active, workers_stay_in_order_of_load, end)
{
    enum { N = 300, SLOTS = 12 };
    cr_assert(eq(int, kvr_active_reserve(&act, SLOTS), KVR_OK));
    bool listed[SLOTS] = {false};
    struct kvr_rng rng;
    kvr_rng_seed(&rng, 5);
    static bool live[N];
    memset(live, 0, sizeof live);
    uint32_t nodes[4];
    for (int op = 0; op < 6000; op++) {
        uint32_t i = (uint32_t)kvr_rng_below(&rng, N);
        uint32_t s = (uint32_t)kvr_rng_below(&rng, SLOTS);
        switch (kvr_rng_below(&rng, 8)) {
        case 0: /* a worker joins or leaves, requests in flight or not */
            if (listed[s])
                kvr_active_unlist(&act, s);
            else
                cr_assert(eq(int, kvr_active_list(&act, s), KVR_OK));
            listed[s] = !listed[s];
            break;
        default:
            if (!live[i]) { /* slots take up to ~50 requests: load_first grows past 16 */
                nodes_for(kvr_rng_below(&rng, 3) * 100, 4, nodes);
                cr_assert(
                    eq(int, kvr_active_add(&act, i + 1, i % SLOTS, nodes, 4, 4 * B, 0, 0), KVR_OK));
            } else {
                cr_assert(eq(int, kvr_active_remove(&act, i + 1), KVR_OK));
            }
            live[i] = !live[i];
        }
        check_by_load(listed, SLOTS);
    }
    cr_assert(gt(u32, act.nloads, 16), "loads past the first room were seen");
    cr_assert(eq(int, kvr_active_list(&act, 0), listed[0] ? KVR_ERR_INVALID : KVR_OK),
              "a slot is listed once");
    cr_assert(eq(int, kvr_active_list(&act, SLOTS + 100), KVR_ERR_INVALID));
}

/*
 * Requests on many workers over a few shared prefixes: the prefixes' act sets turn dense, and
 * consecutive blocks of a path share one table (active.c, "Sharing along a path"). Every block's
 * set must still hold exactly the reference counts a plain count of the requests gives, each
 * worker's active blocks must match, and freeing every request must free every table (teardown
 * checks no set bytes are left).
 */
KVR_TEST_END(active, dense_sets_shared_along_a_path_match_a_reference, end)
{
    enum { W = 200, F = 3, D = 24, N = 1500 };
    static uint32_t want[F][D][W]; /* requests of worker w on block d of family f */
    static uint32_t fam[N], len[N], slot_of[N];
    static bool live[N];
    cr_assert(eq(int, kvr_active_reserve(&act, W), KVR_OK));
    struct kvr_rng rng;
    kvr_rng_seed(&rng, 17);
    uint32_t nodes[D], shared_seen = 0;
    for (int op = 0; op < 12000; op++) {
        uint32_t i = (uint32_t)kvr_rng_below(&rng, N);
        if (!live[i]) {
            fam[i] = (uint32_t)kvr_rng_below(&rng, F);
            len[i] = D / 2 + (uint32_t)kvr_rng_below(&rng, D / 2 + 1);
            slot_of[i] = (uint32_t)kvr_rng_below(&rng, W);
            nodes_for((fam[i] + 1) * 1000, len[i], nodes);
            cr_assert(eq(int,
                         kvr_active_add(&act, i + 1, slot_of[i], nodes, len[i], len[i] * B, 0, 0),
                         KVR_OK));
            for (uint32_t d = 0; d < len[i]; d++)
                want[fam[i]][d][slot_of[i]]++;
            live[i] = true;
        } else {
            cr_assert(eq(int, kvr_active_remove(&act, i + 1), KVR_OK));
            for (uint32_t d = 0; d < len[i]; d++)
                want[fam[i]][d][slot_of[i]]--;
            live[i] = false;
        }
        if (op % 500 != 499)
            continue;
        uint64_t blocks[W] = {0};
        for (uint32_t f = 0; f < F; f++) {
            for (uint32_t d = 0; d < D; d++) {
                uint32_t h = kvr_blocktab_find(&tab, kvr_mix64((f + 1) * 1000 + d)), members = 0;
                for (uint32_t w = 0; w < W; w++) {
                    members += want[f][d][w] > 0;
                    blocks[w] += want[f][d][w] > 0;
                }
                if (h == KVR_NIL) {
                    cr_assert(eq(u32, members, 0));
                    continue;
                }
                const struct kvr_hset *s = &kvr_blocktab_node(&tab, h)->act;
                cr_assert(eq(u32, s->n, members), "family %u block %u", f, d);
                struct kvr_hset_iter it;
                uint32_t w, v;
                kvr_hset_iter_init(&it, s);
                while (kvr_hset_next(&it, &w, &v))
                    cr_assert(eq(u32, v, want[f][d][w]), "family %u block %u worker %u", f, d, w);
                shared_seen += s->cap == KVR_HSET_DENSE && s->u.dense->refs > 1;
            }
        }
        for (uint32_t w = 0; w < W; w++)
            cr_assert(eq(u64, act.w[w].blocks, blocks[w]), "worker %u", w);
    }
    cr_assert(gt(u32, shared_seen, 0), "consecutive blocks came to share their dense sets");
    for (uint32_t i = 0; i < N; i++)
        if (live[i])
            cr_assert(eq(int, kvr_active_remove(&act, i + 1), KVR_OK));
}

/*
 * Sharing along a path assumes a request holding a block holds its parent, as every prompt's path
 * does; a record imported from a peer may list any blocks. Two consecutive blocks can then hold
 * the same members with the same sum but other pairs (A: worker 1 twice, B: worker 2 twice), and
 * a booking over [A, B] gave B A's set: a reference left on a worker no request holds, its blocks
 * counted for good. Each set must keep exactly the counts of its own requests.
 */
KVR_TEST_END(active, sets_of_one_shape_but_other_pairs_are_not_shared, end)
{
    enum { W = 10, L = 4 };
    cr_assert(eq(int, kvr_active_reserve(&act, W), KVR_OK));
    uint32_t path[1 + L];
    nodes_for(5000, 1 + L, path); /* A, then B1..BL */
    for (uint32_t w = 0; w < W; w++)
        cr_assert(eq(int, kvr_active_add(&act, 1 + w, w, path, 1 + L, (1 + L) * B, 0, 0), KVR_OK));
    cr_assert(eq(int, kvr_active_add(&act, 100, 1, path, 1, B, 0, 0), KVR_OK));         /* [A] */
    cr_assert(eq(int, kvr_active_add(&act, 101, 2, path + 1, L, L * B, 0, 0), KVR_OK)); /* [B] */
    cr_assert(eq(int, kvr_active_add(&act, 102, 3, path, 1 + L, (1 + L) * B, 0, 0), KVR_OK));
    for (uint32_t d = 1; d <= L; d++) {
        const struct kvr_hset *s = &kvr_blocktab_node(&tab, path[d])->act;
        cr_assert(eq(u32, s->cap, KVR_HSET_DENSE), "the case needs dense sets");
        struct kvr_hset_iter it;
        uint32_t w, v;
        kvr_hset_iter_init(&it, s);
        while (kvr_hset_next(&it, &w, &v))
            cr_assert(eq(u32, v, w == 2 || w == 3 ? 2u : 1u), "block %u worker %u", d, w);
    }
    for (uint64_t id = 1; id <= W; id++)
        cr_assert(eq(int, kvr_active_remove(&act, id), KVR_OK));
    for (uint64_t id = 100; id <= 102; id++)
        cr_assert(eq(int, kvr_active_remove(&act, id), KVR_OK));
    for (uint32_t w = 0; w < W; w++)
        cr_assert(eq(u64, act.w[w].blocks, 0), "worker %u", w);
}

/* What a walk in steps visited: each request id, how many times. */
static uint32_t seen[32];

static void count_request(void *ctx, const struct kvr_active_req *req)
{
    (void)ctx;
    cr_assert(req->id < 32);
    seen[req->id]++;
}

/* A snapshot walks the requests in slices while they change: the walk's next request ended
 * between two steps neither ends nor derails it, one ended before its turn is not visited, one
 * active again (moved to the tail) is visited in its new place (twice if it was visited already),
 * one booked meanwhile is visited. */
/* Requests 1..n, one block each, on slot 0; the walk begun, nothing seen yet. */
static void walk_over(uint64_t n)
{
    uint32_t node;
    for (uint64_t id = 1; id <= n; id++) {
        nodes_for(1000 + id, 1, &node);
        cr_assert(eq(int, kvr_active_add(&act, id, 0, &node, 1, B, 0, id), KVR_OK));
    }
    memset(seen, 0, sizeof seen);
    kvr_active_walk_begin(&act);
}

KVR_TEST_END(active, a_walk_in_steps_survives_requests_changing_between_them, end)
{
    uint32_t node;
    walk_over(20);
    cr_assert(eq(u32, kvr_active_walk(&act, count_request, NULL, 5), 5)); /* 1..5 */
    cr_assert(eq(int, kvr_active_remove(&act, 6), KVR_OK));               /* the walk's next one */
    cr_assert(eq(int, kvr_active_remove(&act, 2), KVR_OK));               /* visited */
    cr_assert(eq(int, kvr_active_remove(&act, 15), KVR_OK));
    cr_assert(eq(int, kvr_active_prefill_done(&act, 10, 100), KVR_OK)); /* to the tail */
    cr_assert(eq(int, kvr_active_prefill_done(&act, 3, 100), KVR_OK));  /* visited, to the tail */
    nodes_for(2000, 1, &node);
    cr_assert(eq(int, kvr_active_add(&act, 21, 1, &node, 1, B, 0, 100), KVR_OK));
    uint32_t n;
    while ((n = kvr_active_walk(&act, count_request, NULL, 4)) == 4)
        ;
    for (uint64_t id = 1; id <= 21; id++)
        cr_assert(eq(u32, seen[id],
                     id == 6 || id == 15 ? 0
                     : id == 3           ? 2
                                         : 1),
                  "request %llu", (unsigned long long)id);
    cr_assert(eq(u32, kvr_active_walk(&act, count_request, NULL, 4), 0), "the walk is over");
    for (uint64_t id = 1; id <= 21; id++)
        kvr_active_remove(&act, id);
}

/* The walk's next request, the last one, active again between two steps (moved to the tail where
 * it was): in flight throughout, it is visited, once. */
KVR_TEST_END(active, a_walk_visits_its_last_request_made_active_again, end)
{
    walk_over(3);
    cr_assert(eq(u32, kvr_active_walk(&act, count_request, NULL, 2), 2)); /* 1, 2 */
    cr_assert(eq(int, kvr_active_output_block(&act, 3, 100), KVR_OK));
    while (kvr_active_walk(&act, count_request, NULL, 2) == 2)
        ;
    for (uint64_t id = 1; id <= 3; id++)
        cr_assert(eq(u32, seen[id], 1), "request %llu", (unsigned long long)id);
    for (uint64_t id = 1; id <= 3; id++)
        kvr_active_remove(&act, id);
}
