/* The decision pipeline end to end on the pure core: errors, queueing, events, invariants. */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/hash.h"
#include "kvr/rng.h"
#include "kvr/router.h"

#define B  16
#define NS 1000000000ull

static struct kvr_router_config cfg;
static struct kvr_router *r;

struct seen {
    int placed, rejected, failed, expired, left;
    uint64_t last_id, last_worker;
    kvr_status last_status;
};
static struct seen ev;

static void on_event(void *ctx, const struct kvr_event *e)
{
    struct seen *s = ctx;
    s->last_id = e->request_id;
    s->last_worker = e->worker_id;
    s->last_status = e->status;
    switch (e->kind) {
    case KVR_EV_PLACED:
        s->placed++;
        cr_assert(e->decision != NULL);
        cr_assert(e->decision->booked, "a placed request is in flight");
        cr_assert(not(e->decision->queued), "and waits no longer");
        break;
    case KVR_EV_REJECTED:
        s->rejected++;
        break;
    case KVR_EV_FAILED:
        s->failed++;
        break;
    case KVR_EV_EXPIRED:
        s->expired++;
        break;
    case KVR_EV_WORKER_LEFT:
        s->left++;
        break;
    }
}

static void make(void)
{
    memset(&ev, 0, sizeof ev);
    cfg.on_event = on_event;
    cfg.event_ctx = &ev;
    kvr_status st;
    r = kvr_router_create(&cfg, &st);
    cr_assert(r != NULL);
    cr_assert(eq(int, st, KVR_OK));
}

static void setup(void)
{
    kvr_router_config_default(&cfg);
    cfg.block_size = B;
    cfg.cost_model = KVR_COST_BLOCKS; /* the ROUTING.md formula, whose costs the tests spell out */
}

static void teardown(void)
{
    kvr_router_destroy(r);
    r = NULL;
}

TestSuite(router, .init = setup, .fini = teardown);

static void join(uint64_t id, uint64_t capacity)
{
    struct kvr_worker_info info = {
        .id = id, .block_size = B, .capacity_blocks = capacity, .waiting = 0, .kv_usage = 0.0};
    cr_assert(eq(int, kvr_router_worker_seen(r, &info, 0), KVR_OK));
}

/* Prompt: `shared` tokens from family f, then `unique` tokens unique to id. */
static uint32_t *prompt(uint32_t f, uint32_t shared, uint64_t id, uint32_t unique)
{
    uint32_t *t = malloc((shared + unique) * sizeof *t);
    for (uint32_t i = 0; i < shared; i++)
        t[i] = f * 100000 + i;
    for (uint32_t i = 0; i < unique; i++)
        t[shared + i] = (uint32_t)(id * 1000 + i + 50000000);
    return t;
}

static kvr_status route(uint64_t id, uint32_t *t, uint32_t n, struct kvr_decision *d)
{
    struct kvr_request q = {.id = id, .tokens = t, .ntokens = n, .explain = true};
    return kvr_router_route(r, &q, 0, d);
}

Test(router, refuses_bad_requests_with_clear_errors)
{
    make();
    struct kvr_decision d;
    uint32_t t[4] = {1, 2, 3, 4};
    cr_assert(eq(int, route(1, t, 4, &d), KVR_ERR_NO_WORKERS));
    join(1, 0);
    cr_assert(eq(int, route(1, t, 0, &d), KVR_ERR_EMPTY_PROMPT));
    cr_assert(eq(int, route(0, t, 4, &d), KVR_ERR_INVALID));
    struct kvr_request q = {.id = 2, .tokens = t, .ntokens = 4};
    q.ov.flags = KVR_OV_POLICY;
    q.ov.policy = (enum kvr_policy)77;
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_ERR_UNKNOWN_POLICY));
    q.ov.flags = KVR_OV_TEMPERATURE;
    q.ov.temperature = -1;
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_ERR_INVALID));
    q.ov.temperature = INFINITY;
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_ERR_INVALID));
    q.ov.flags = KVR_OV_OVERLAP_WEIGHT;
    q.ov.overlap_weight = INFINITY; /* times a cache weight of 0: every price NaN */
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_ERR_INVALID));
    q.ov.overlap_weight = NAN;
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_ERR_INVALID));
    cr_assert(eq(int, route(3, t, 4, &d), KVR_OK));
    cr_assert(eq(int, route(3, t, 4, &d), KVR_ERR_DUPLICATE));
    struct kvr_router_stats s;
    kvr_router_stats(r, &s);
    cr_assert(eq(u64, s.decisions, 1));
    cr_assert(eq(u64, s.rejected, 9));
    cr_assert(eq(u64, s.duplicate_request, 1));
}

Test(router, refuses_a_configuration_it_cannot_price_with)
{
    enum { NBAD = 8 };
    struct kvr_router_config bad[NBAD];
    for (int i = 0; i < NBAD; i++)
        bad[i] = cfg;
    bad[0].engine_speedup = 0;
    bad[1].engine_speedup = NAN;
    bad[2].engine_speedup = INFINITY;
    bad[3].prefill_window_ns = KVR_PREFILL_WINDOW_MAX_NS + 1;
    bad[4].decode_weight = INFINITY;
    bad[5].engine_speedup = 1e-310; /* subnormal: its window would read as infinitely short */
    bad[6].engine_speedup = KVR_ENGINE_SPEEDUP_MAX * 2;
    bad[7].prefill_window_ns = 1; /* the shares' epoch would move at every booking */
    for (int i = 0; i < NBAD; i++) {
        kvr_status st = KVR_OK;
        cr_assert(kvr_router_create(&bad[i], &st) == NULL, "configuration %d", i);
        cr_assert(eq(int, st, KVR_ERR_INVALID));
    }
    cfg.prefill_window_ns = KVR_PREFILL_WINDOW_MAX_NS;
    cfg.engine_speedup = KVR_ENGINE_SPEEDUP_MIN;
    make();
    kvr_router_destroy(r);
    cfg.prefill_window_ns = KVR_PREFILL_WINDOW_MIN_NS;
    cfg.engine_speedup = KVR_ENGINE_SPEEDUP_MAX;
    make();
}

Test(router, refuses_prompts_over_the_limit)
{
    cfg.max_prompt_tokens = 8;
    make();
    join(1, 0);
    uint32_t t[9] = {0};
    struct kvr_decision d;
    cr_assert(eq(int, route(1, t, 9, &d), KVR_ERR_PROMPT_TOO_LONG));
    cr_assert(eq(int, route(1, t, 8, &d), KVR_OK));
}

Test(router, refuses_worker_with_other_block_size)
{
    make();
    struct kvr_worker_info info = {
        .id = 5, .block_size = B * 2, .capacity_blocks = 100, .waiting = 0, .kv_usage = 0};
    cr_assert(eq(int, kvr_router_worker_seen(r, &info, 0), KVR_ERR_BLOCK_SIZE));
    struct kvr_router_stats s;
    kvr_router_stats(r, &s);
    cr_assert(eq(u32, s.workers, 0));
    cr_assert(eq(u64, s.bad_block_size, 1));
}

/* A router of workers 1..n, and a prompt of 10 blocks whose first 8 worker w caches (stored
 * events); its sequence hashes in seq. */
static uint32_t *cached_on(uint64_t n, uint64_t w, uint64_t seq[10])
{
    make();
    for (uint64_t i = 1; i <= n; i++)
        join(i, 0);
    uint32_t *t = prompt(1, 8 * B, 1, 2 * B);
    uint64_t local[10];
    kvr_hash_prompt(t, 10 * B, B, local, seq);
    struct kvr_kv_block blocks[8];
    for (int i = 0; i < 8; i++)
        blocks[i] = (struct kvr_kv_block){(uint64_t)i + 1, local[i]};
    cr_assert(eq(int, kvr_router_kv_stored(r, w, NULL, blocks, 8), KVR_OK));
    return t;
}

/* A caller that hashed the prompt itself (kvrouter, before taking its lock) gets the decision the
 * router would have made hashing it, and the router prices the hashes it was given. */
Test(router, a_prompt_hashed_by_the_caller_is_decided_alike)
{
    uint64_t seq[10];
    uint32_t *t = cached_on(4, 3, seq);
    struct kvr_request q = {.id = 1, .tokens = t, .ntokens = 10 * B, .explain = true};
    struct kvr_decision own, given;
    cr_assert(eq(int, kvr_router_select(r, &q, 0, &own), KVR_OK));
    uint64_t own_hashes[10];
    memcpy(own_hashes, own.block_hashes, sizeof own_hashes);
    q.seq_hashes = seq;
    cr_assert(eq(int, kvr_router_select(r, &q, 0, &given), KVR_OK));
    cr_assert(eq(u64, given.worker_id, own.worker_id));
    cr_assert(eq(u32, given.overlap_blocks, 8));
    cr_assert(eq(dbl, given.cost, own.cost));
    cr_assert(eq(int, memcmp(given.block_hashes, own_hashes, sizeof own_hashes), 0));
    /* hashes of another prompt: the decision follows them (nothing of it is cached) */
    uint64_t other[10];
    uint32_t *u = prompt(2, 10 * B, 2, 0);
    kvr_hash_prompt(u, 10 * B, B, NULL, other);
    q.seq_hashes = other;
    cr_assert(eq(int, kvr_router_select(r, &q, 0, &given), KVR_OK));
    cr_assert(eq(u32, given.overlap_blocks, 0), "the given hashes are the ones priced");
    cr_assert(eq(u64, given.block_hashes[0], other[0]));
    free(u);
    free(t);
}

Test(router, event_mode_follows_the_cached_prefix)
{
    uint64_t seq[10];
    uint32_t *t = cached_on(4, 3, seq);
    struct kvr_decision d;
    cr_assert(eq(int, route(1, t, 10 * B, &d), KVR_OK));
    cr_assert(eq(u64, d.worker_id, 3));
    cr_assert(eq(u32, d.overlap_blocks, 8));
    cr_assert(eq(u32, d.prompt_blocks, 10));
    cr_assert(eq(u32, d.ncandidates, 4));
    for (uint32_t i = 0; i < 4; i++) {
        const struct kvr_candidate *c = &d.candidates[i];
        uint64_t expect_prefill = c->worker_id == 3 ? 2 * B : 10 * B;
        cr_assert(eq(u64, c->prefill_tokens, expect_prefill));
        cr_assert(eq(u64, c->decode_blocks, 10));
        cr_assert(eq(dbl, c->cost, (double)expect_prefill / B + 10));
    }
    for (int i = 0; i < 10; i++)
        cr_assert(eq(u64, d.block_hashes[i], seq[i]));
    free(t);
}

/* A request whose prefix an in-flight request on its worker computes first is booked for the
 * rest of its prompt only (what the time model priced), and its record says so to the peers. */
Test(router, a_prefix_computed_in_flight_is_not_booked_as_prefill_again)
{
    make();
    join(1, 0);
    uint32_t *t = prompt(1, 10 * B, 1, 5); /* 10 full blocks and 5 tokens */
    struct kvr_decision d;
    cr_assert(eq(int, route(1, t, 10 * B + 5, &d), KVR_OK));
    cr_assert(eq(u32, d.reuse_blocks, 0));
    cr_assert(eq(int, route(2, t, 10 * B + 5, &d), KVR_OK));
    cr_assert(eq(u32, d.overlap_blocks, 0), "nothing is cached yet");
    cr_assert(eq(u32, d.reuse_blocks, 10), "request 1 computes the ten blocks first");
    struct kvr_request_record rec;
    cr_assert(eq(int, kvr_router_export(r, 2, &rec), KVR_OK));
    cr_assert(eq(u32, rec.overlap_blocks, 10), "a peer books it alike");
    struct kvr_request q = {.id = 3, .tokens = t, .ntokens = 10 * B + 5, .explain = true};
    cr_assert(eq(int, kvr_router_select(r, &q, 0, &d), KVR_OK));
    cr_assert(eq(u64, d.candidates[0].prefill_tokens, (10 * B + 5) + 5 + 5),
              "request 2 added 5 tokens, and request 3 would add 5");
    /* a peer importing request 2's record books the same prefill */
    struct kvr_router *origin = r;
    make();
    join(1, 0);
    struct kvr_request_record one;
    cr_assert(eq(int, kvr_router_export(origin, 1, &one), KVR_OK));
    cr_assert(eq(int, kvr_router_import(r, &one, 0), KVR_OK));
    cr_assert(eq(int, kvr_router_export(origin, 2, &rec), KVR_OK));
    cr_assert(eq(int, kvr_router_import(r, &rec, 0), KVR_OK));
    cr_assert(eq(int, kvr_router_select(r, &q, 0, &d), KVR_OK));
    cr_assert(eq(u64, d.candidates[0].prefill_tokens, (10 * B + 5) + 5 + 5));
    kvr_router_destroy(origin);
    free(t);
}

/* A decision's record carries its max_tokens, so a peer that imports it learns from its
 * completion as its origin would; the origin, which never hears it end, learns nothing. */
Test(router, a_peer_learns_from_the_completions_of_decisions_it_imported)
{
    make();
    join(1, 0);
    struct kvr_router *origin = r;
    make();
    join(1, 0);
    struct kvr_router *peer = r;
    uint32_t *t = prompt(1, 2 * B, 1, 5);
    for (uint64_t id = 1; id <= 16; id++) {
        struct kvr_request q = {.id = id, .tokens = t, .ntokens = 2 * B + 5, .max_tokens = 1000};
        struct kvr_decision d;
        cr_assert(eq(int, kvr_router_route(origin, &q, 0, &d), KVR_OK));
        struct kvr_request_record rec;
        cr_assert(eq(int, kvr_router_export(origin, id, &rec), KVR_OK));
        cr_assert(eq(u32, rec.max_tokens, 1000));
        if (id == 16) { /* one more hop: the peer's own record of it says the same */
            cr_assert(eq(int, kvr_router_import(peer, &rec, 0), KVR_OK));
            cr_assert(eq(int, kvr_router_export(peer, id, &rec), KVR_OK));
            cr_assert(eq(u32, rec.max_tokens, 1000));
        } else {
            rec.max_tokens = id == 15 ? 0 : rec.max_tokens; /* an older peer's: not counted */
            cr_assert(eq(int, kvr_router_import(peer, &rec, 0), KVR_OK));
        }
        cr_assert(eq(int, kvr_router_finished(peer, id, 0, 100), KVR_OK));
    }
    cr_assert(eq(u32, kvr_router_expected_output(peer, 1000), 1000), "15 taught it: too few");
    struct kvr_request_record rec = {17, 1, NULL, 0, 5, 0, false, 0, 1000};
    cr_assert(eq(int, kvr_router_import(peer, &rec, 0), KVR_OK));
    cr_assert(eq(int, kvr_router_finished(peer, 17, 0, 100), KVR_OK));
    cr_assert(eq(u32, kvr_router_expected_output(peer, 1000), 100));
    cr_assert(eq(u32, kvr_router_expected_output(origin, 1000), 1000));
    kvr_router_destroy(origin);
    free(t);
}

Test(router, imports_keep_the_in_flight_bound)
{
    make();
    join(1, 0);
    uint32_t *t = prompt(1, 4 * B, 1, 0);
    struct kvr_decision d;
    cr_assert(eq(int, route(1, t, 4 * B, &d), KVR_OK));
    cr_assert(eq(int, route(2, t, 4 * B, &d), KVR_OK));
    cr_assert(eq(int, route(3, t, 4 * B, &d), KVR_OK));
    struct kvr_request_record one, two, three;
    cr_assert(eq(int, kvr_router_export(r, 1, &one), KVR_OK));
    cr_assert(eq(int, kvr_router_export(r, 2, &two), KVR_OK));
    cr_assert(eq(int, kvr_router_export(r, 3, &three), KVR_OK));
    struct kvr_router *origin = r;
    cfg.max_inflight = 1;
    make();
    join(1, 0);
    cr_assert(eq(int, kvr_router_import(r, &one, 0), KVR_OK));
    cr_assert(eq(int, kvr_router_import(r, &two, 0), KVR_ERR_FULL), "one in flight is the bound");
    /* a decision whose done came first is no request in flight: refused as late, not for room */
    cr_assert(eq(int, kvr_router_done(r, 2), KVR_ERR_UNKNOWN_REQUEST), "noted as early");
    cr_assert(eq(int, kvr_router_import(r, &two, 0), KVR_ERR_DUPLICATE), "a tombstone");
    struct kvr_router_stats s;
    kvr_router_stats(r, &s);
    cr_assert(eq(u32, s.inflight, 1));
    cr_assert(eq(int, kvr_router_done(r, 1), KVR_OK));
    cr_assert(eq(int, kvr_router_import(r, &three, 0), KVR_OK), "room again");
    kvr_router_destroy(origin);
    free(t);
}

Test(router, a_request_placed_again_avoids_the_worker_it_never_reached)
{
    uint64_t seq[10];
    uint32_t *t = cached_on(2, 2, seq);
    struct kvr_decision d;
    struct kvr_request q = {.id = 1, .tokens = t, .ntokens = 10 * B};
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
    cr_assert(eq(u64, d.worker_id, 2), "the cached prefix wins");
    cr_assert(eq(int, kvr_router_cancel(r, 1), KVR_OK));
    q.avoid_worker = 2; /* its forward to 2 never arrived */
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
    cr_assert(eq(u64, d.worker_id, 1), "another worker takes it");
    cr_assert(eq(int, kvr_router_cancel(r, 1), KVR_OK));
    cr_assert(eq(int, kvr_router_worker_remove(r, 1), KVR_OK));
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
    cr_assert(eq(u64, d.worker_id, 2), "the only worker left still takes it");
    free(t);
}

Test(router, costs_always_candidates_on_request)
{
    make();
    join(1, 0);
    join(2, 0);
    uint32_t *t = prompt(0, 0, 1, 3 * B);
    struct kvr_request q = {.id = 1, .tokens = t, .ntokens = 3 * B};
    struct kvr_decision d;
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
    cr_assert(d.candidates == NULL, "the kv hot path builds no full view unless asked");
    cr_assert(eq(u32, d.ncandidates, 2));
    cr_assert(eq(u64, d.worker_ids[0], 1));
    cr_assert(eq(u64, d.worker_ids[1], 2));
    cr_assert(eq(dbl, d.costs[0], 3.0 + 3.0), "3 blocks to prefill, 3 to decode");
    q.ov.flags = KVR_OV_POLICY;
    q.ov.policy = KVR_POLICY_ROUND_ROBIN;
    q.id = 2;
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
    cr_assert(d.candidates != NULL, "baselines read the full view");
    cr_assert(eq(int, d.policy, KVR_POLICY_ROUND_ROBIN));
    free(t);
}

Test(router, load_spreads_requests_without_cached_prefix)
{
    make();
    for (uint64_t w = 1; w <= 4; w++)
        join(w, 0);
    int per[5] = {0};
    for (uint64_t id = 1; id <= 8; id++) {
        uint32_t *t = prompt(0, 0, id, 4 * B);
        struct kvr_decision d;
        cr_assert(eq(int, route(id, t, 4 * B, &d), KVR_OK));
        per[d.worker_id]++;
        free(t);
    }
    for (int w = 1; w <= 4; w++)
        cr_assert(eq(int, per[w], 2), "the predicted load spreads new prompts evenly");
}

Test(router, shared_prefix_counts_once_in_decode_load)
{
    make();
    join(1, 0);
    join(2, 0);
    uint32_t *a = prompt(7, 6 * B, 1, 2 * B), *b = prompt(7, 6 * B, 2, 2 * B);
    struct kvr_decision d;
    cr_assert(eq(int, route(1, a, 8 * B, &d), KVR_OK));
    uint64_t first = d.worker_id;
    cr_assert(eq(int, kvr_router_prefill_done(r, 1, 1), KVR_OK));
    struct kvr_request q = {.id = 2, .tokens = b, .ntokens = 8 * B, .explain = true};
    d.queued = true; /* select sets it: a select never waits */
    cr_assert(eq(int, kvr_router_select(r, &q, 1, &d), KVR_OK));
    cr_assert(not(d.queued));
    for (uint32_t i = 0; i < 2; i++) {
        const struct kvr_candidate *c = &d.candidates[i];
        if (c->worker_id == first) {
            cr_assert(eq(u32, c->active_hits, 6));
            cr_assert(eq(u64, c->decode_blocks, 8 + 2), "6 shared blocks are not counted twice");
        } else {
            cr_assert(eq(u64, c->decode_blocks, 8));
        }
    }
    cr_assert(not(d.booked));
    free(a);
    free(b);
}

Test(router, approximate_mode_learns_from_its_own_decisions)
{
    cfg.approximate = true;
    cfg.index_ttl_ns = 10 * NS;
    make();
    for (uint64_t w = 1; w <= 4; w++)
        join(w, 0);
    uint32_t *a = prompt(3, 16 * B, 1, B), *b = prompt(3, 16 * B, 2, B);
    struct kvr_decision d;
    cr_assert(eq(int, route(1, a, 17 * B, &d), KVR_OK));
    uint64_t first = d.worker_id;
    cr_assert(eq(int, kvr_router_done(r, 1), KVR_OK));
    cr_assert(eq(int, route(2, b, 17 * B, &d), KVR_OK));
    cr_assert(eq(u64, d.worker_id, first));
    cr_assert(eq(u32, d.overlap_blocks, 16));
    cr_assert(eq(int, kvr_router_done(r, 2), KVR_OK));
    kvr_router_tick(r, 20 * NS);
    struct kvr_router_stats s;
    kvr_router_stats(r, &s);
    cr_assert(eq(u32, s.index_entries, 0), "entries expire after the TTL");
    cr_assert(eq(u32, s.nodes, 0));
    free(a);
    free(b);
}

Test(router, a_worker_without_kv_events_is_learnt_from_decisions_alone)
{
    cfg.index_ttl_ns = 10 * NS;
    make();
    struct kvr_worker_info info = {.id = 1, .block_size = B, .approximate = true};
    cr_assert(eq(int, kvr_router_worker_seen(r, &info, 0), KVR_OK));
    cr_assert(kvr_router_worker_approximate(r, 1));
    uint32_t *a = prompt(3, 16 * B, 1, B);
    struct kvr_decision d;
    cr_assert(eq(int, route(1, a, 17 * B, &d), KVR_OK));
    struct kvr_router_stats s;
    kvr_router_stats(r, &s);
    cr_assert(eq(u32, s.index_entries, 17), "its decision fed the index");
    info.approximate = false; /* its events flow now: decisions no longer feed the index */
    cr_assert(eq(int, kvr_router_worker_seen(r, &info, 0), KVR_OK));
    cr_assert(not(kvr_router_worker_approximate(r, 1)));
    uint32_t *b = prompt(4, 16 * B, 2, B);
    cr_assert(eq(int, route(2, b, 17 * B, &d), KVR_OK));
    kvr_router_stats(r, &s);
    cr_assert(eq(u32, s.index_entries, 17));
    free(a);
    free(b);
}

Test(router, busy_workers_queue_then_place_or_reject)
{
    cfg.busy_threshold = 0.5;
    cfg.queue_timeout_ns = 5 * NS;
    make();
    join(1, 8); /* busy above 4 blocks */
    uint32_t *t1 = prompt(0, 0, 1, 5 * B), *t2 = prompt(0, 0, 2, B), *t3 = prompt(0, 0, 3, B);
    struct kvr_decision d;
    cr_assert(eq(int, route(1, t1, 5 * B, &d), KVR_OK));
    cr_assert(not(d.queued));
    cr_assert(eq(int, route(2, t2, B, &d), KVR_OK), "waiting is an outcome, not an error");
    cr_assert(d.queued);
    cr_assert(not(d.booked));
    cr_assert(eq(int, route(2, t2, B, &d), KVR_ERR_DUPLICATE), "a queued id is in use");
    kvr_router_tick(r, NS);
    cr_assert(eq(int, ev.placed, 0));
    cr_assert(eq(int, kvr_router_done(r, 1), KVR_OK));
    kvr_router_tick(r, 2 * NS);
    cr_assert(eq(int, ev.placed, 1));
    cr_assert(eq(u64, ev.last_id, 2));
    cr_assert(eq(u64, ev.last_worker, 1));
    cr_assert(eq(int, route(3, t1, 5 * B, &d), KVR_OK)); /* busy again */
    struct kvr_request q = {.id = 4, .tokens = t3, .ntokens = B};
    cr_assert(eq(int, kvr_router_route(r, &q, 3 * NS, &d), KVR_OK));
    cr_assert(d.queued);
    kvr_router_tick(r, 9 * NS);
    cr_assert(eq(int, ev.rejected, 1));
    cr_assert(eq(u64, ev.last_id, 4));
    cr_assert(eq(int, ev.last_status, KVR_ERR_OVERLOADED));
    struct kvr_router_stats s;
    kvr_router_stats(r, &s);
    cr_assert(eq(u32, s.queue_len, 0));
    cr_assert(eq(u64, s.overloaded, 1));
    free(t1);
    free(t2);
    free(t3);
}

Test(router, a_waiting_request_past_its_own_deadline_leaves_from_behind_the_head)
{
    cfg.busy_threshold = 0.5;
    cfg.queue_timeout_ns = 5 * NS;
    make();
    join(1, 8); /* busy above 4 blocks */
    uint32_t *t1 = prompt(0, 0, 1, 5 * B), *t2 = prompt(0, 0, 2, B);
    struct kvr_decision d;
    cr_assert(eq(int, route(1, t1, 5 * B, &d), KVR_OK));
    cr_assert(eq(int, route(2, t2, B, &d), KVR_OK));
    cr_assert(d.queued, "the head waits for the queue timeout (5 s)");
    for (uint64_t id = 3; id <= 5; id++) { /* behind it: own deadlines of 1 s, 3 s and none */
        struct kvr_request q = {
            .id = id, .tokens = t2, .ntokens = B, .deadline = id == 5 ? 0 : (id == 3 ? 1 : 3) * NS};
        cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
        cr_assert(d.queued);
    }
    kvr_router_tick(r, 2 * NS);
    cr_assert(eq(int, ev.rejected, 1), "rejected at its deadline, not when the head leaves");
    cr_assert(eq(u64, ev.last_id, 3));
    cr_assert(eq(int, ev.last_status, KVR_ERR_DEADLINE));
    kvr_router_tick(r, 4 * NS);
    cr_assert(eq(int, ev.rejected, 2));
    cr_assert(eq(u64, ev.last_id, 4));
    struct kvr_router_stats s;
    kvr_router_stats(r, &s);
    cr_assert(eq(u32, s.queue_len, 2), "the head and the one without a deadline still wait");
    cr_assert(eq(int, route(3, t2, B, &d), KVR_OK), "its id is free again");
    cr_assert(d.queued);
    cr_assert(eq(int, route(5, t2, B, &d), KVR_ERR_DUPLICATE), "a waiting id is in use");
    cr_assert(eq(int, kvr_router_done(r, 1), KVR_OK));
    kvr_router_tick(r, 4 * NS + 1);
    cr_assert(eq(int, ev.placed, 3), "the rest placed in their order");
    cr_assert(eq(u64, ev.last_id, 3));
    free(t1);
    free(t2);
}

/* A worker refuses a request whose prompt and output it cannot hold at once (ERR_FULL): on a fleet
 * of unequal workers such a request went to the small one as readily as to the big one (under the
 * blocks formula, which ties the two, to the first in join order: the small one). */
static void only_the_workers_that_hold_it(bool small_chosen)
{
    make();
    join(1, 8);
    join(2, 64);
    uint32_t *t = prompt(1, 4 * B, 0, 2 * B);
    uint64_t local[6], seq[6]; /* the small one caches the first 4 of its 6 blocks */
    kvr_hash_prompt(t, 6 * B, B, local, seq);
    struct kvr_kv_block blocks[4];
    for (int i = 0; i < 4; i++)
        blocks[i] = (struct kvr_kv_block){(uint64_t)i + 1, local[i]};
    cr_assert(eq(int, kvr_router_kv_stored(r, 1, NULL, blocks, 4), KVR_OK));
    struct kvr_decision d;
    struct kvr_request q = {.tokens = t, .ntokens = 6 * B, .max_tokens = 4 * B}; /* 10 blocks */
    for (q.id = 1; q.id <= 20; q.id++) {
        cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
        cr_assert(eq(u64, d.worker_id, 2), "request %" PRIu64 ": only worker 2 holds 10 blocks",
                  q.id);
        cr_assert(eq(int, kvr_router_done(r, q.id), KVR_OK));
    }
    q.max_tokens = 2 * B; /* 8 blocks: both hold it */
    bool small = false;
    for (q.id = 21; q.id <= 40; q.id++) {
        cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
        small |= d.worker_id == 1;
        cr_assert(eq(int, kvr_router_done(r, q.id), KVR_OK));
    }
    /* the blocks formula ties the two; the time model prices the small one's fuller pool */
    cr_assert(eq(int, small, small_chosen), "the small worker takes what it holds, if cheaper");
    /* 65 blocks: no worker says it holds it; chosen as if it fitted, its worker refuses it */
    q.max_tokens = 59 * B;
    bool small_too = false;
    for (q.id = 41; q.id <= 60; q.id++) {
        cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
        small_too |= d.worker_id == 1;
        cr_assert(eq(int, kvr_router_done(r, q.id), KVR_OK));
    }
    cr_assert(eq(int, small_too, small_chosen), "chosen by the policy alone");
    join(3, 0); /* a worker that did not say: taken to hold anything, so the only one for it */
    for (q.id = 61; q.id <= 80; q.id++) {
        cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
        cr_assert(eq(u64, d.worker_id, 3));
        cr_assert(eq(int, kvr_router_done(r, q.id), KVR_OK));
    }
    free(t);
}

Test(router, a_request_goes_only_to_workers_that_can_hold_it)
{
    only_the_workers_that_hold_it(true);
}

Test(router, a_request_goes_only_to_workers_that_can_hold_it_time_model)
{
    cfg.cost_model = KVR_COST_TIME; /* its price of the small one's full pool avoided it already */
    only_the_workers_that_hold_it(false);
}

Test(router, a_request_goes_only_to_workers_that_can_hold_it_round_robin)
{
    cfg.policy = KVR_POLICY_ROUND_ROBIN; /* no price at all: half went to the small one */
    only_the_workers_that_hold_it(true);
}

/* The full view of a decision (a select's candidates, kvsim explain) marks the workers it skipped:
 * one too small for the request was skipped but shown as eligible, so the cheapest candidate not
 * busy was not the one chosen, and nothing said why. */
Test(router, the_full_view_marks_a_worker_too_small_as_skipped)
{
    make();
    join(1, 8);
    join(2, 64);
    uint32_t *t = prompt(0, 0, 1, 6 * B);
    struct kvr_request q = {
        .id = 1, .tokens = t, .ntokens = 6 * B, .max_tokens = 4 * B, .explain = true};
    struct kvr_decision d;
    cr_assert(eq(int, kvr_router_select(r, &q, 0, &d), KVR_OK));
    cr_assert(eq(u64, d.worker_id, 2), "10 blocks: only worker 2 holds them");
    cr_assert(d.candidates != NULL);
    cr_assert(eq(u32, d.ncandidates, 2));
    for (uint32_t i = 0; i < 2; i++) {
        cr_assert(eq(int, d.candidates[i].busy, d.candidates[i].worker_id == 1),
                  "worker %" PRIu64 " skipped: %d", d.candidates[i].worker_id,
                  d.candidates[i].busy);
        cr_assert(eq(int, d.candidates[i].too_small, d.candidates[i].worker_id == 1),
                  "worker %" PRIu64 " too small: %d", d.candidates[i].worker_id,
                  d.candidates[i].too_small);
    }
    free(t);
}

/* A draining worker takes nothing new: while the only worker that holds a request drains, the
 * request is chosen as when no worker holds it (its worker answers ERR_FULL at once). It waited
 * instead, for the queue timeout (ERR_OVERLOADED) or the drain's end, and every request behind it
 * with it, though the other worker was free for them. Once the drain ends, the big worker is
 * again the only one for it. */
Test(router, a_draining_worker_holds_no_request_up)
{
    make();
    join(1, 8);
    join(2, 64);
    struct kvr_worker_info info = {.id = 2, .block_size = B, .capacity_blocks = 64};
    info.draining = true;
    cr_assert(eq(int, kvr_router_worker_seen(r, &info, 0), KVR_OK));
    uint32_t *t = prompt(0, 0, 1, 6 * B);
    struct kvr_request q = {.id = 1, .tokens = t, .ntokens = 6 * B, .max_tokens = 4 * B};
    struct kvr_decision d;
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
    cr_assert(not(d.queued), "10 blocks, worker 2 drains: chosen as if it fitted, not waiting");
    cr_assert(eq(u64, d.worker_id, 1));
    q.id = 2;
    q.max_tokens = B; /* 7 blocks: worker 1 holds it */
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
    cr_assert(not(d.queued), "a request worker 1 holds does not wait behind one");
    cr_assert(eq(u64, d.worker_id, 1));
    cr_assert(eq(int, kvr_router_done(r, 1), KVR_OK));
    cr_assert(eq(int, kvr_router_done(r, 2), KVR_OK));
    info.draining = false; /* back: again the only one for 10 blocks */
    cr_assert(eq(int, kvr_router_worker_seen(r, &info, 0), KVR_OK));
    q.max_tokens = 4 * B;
    for (q.id = 3; q.id <= 12; q.id++) {
        cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
        cr_assert(eq(u64, d.worker_id, 2), "request %" PRIu64 ": only worker 2 holds it", q.id);
        cr_assert(eq(int, kvr_router_done(r, q.id), KVR_OK));
    }
    free(t);
}

/* A request only a busy large worker holds waits for it, but holds up no request behind it that a
 * free smaller worker takes: with the first waiting, by the FIFO rule every later one waited
 * too, the small worker idle. */
Test(router, a_request_waiting_for_a_large_worker_holds_up_no_smaller_one)
{
    cfg.busy_threshold = 0.5;
    make();
    join(1, 8);  /* busy above 4 blocks */
    join(2, 64); /* busy above 32 */
    uint32_t *big = prompt(0, 0, 1, 40 * B), *t = prompt(0, 0, 2, 6 * B);
    struct kvr_decision d;
    struct kvr_request q = {.id = 1, .tokens = big, .ntokens = 40 * B, .max_tokens = B};
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
    cr_assert(eq(u64, d.worker_id, 2), "41 blocks: only worker 2 holds them");
    q = (struct kvr_request){.id = 2, .tokens = t, .ntokens = 6 * B, .max_tokens = 4 * B};
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
    cr_assert(d.queued, "10 blocks: worker 2 holds them but is busy");
    q = (struct kvr_request){.id = 3, .tokens = t, .ntokens = 5 * B, .max_tokens = B};
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
    cr_assert(not(d.queued), "6 blocks behind it: worker 1 is free for them");
    cr_assert(eq(u64, d.worker_id, 1));
    kvr_router_tick(r, NS);
    cr_assert(eq(int, ev.placed, 0), "the large one still waits");
    q = (struct kvr_request){.id = 4, .tokens = t, .ntokens = 2 * B, .max_tokens = B};
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
    cr_assert(d.queued, "both workers busy: it waits, behind the large one");
    cr_assert(eq(int, kvr_router_done(r, 1), KVR_OK));
    kvr_router_tick(r, 2 * NS);
    cr_assert(eq(int, ev.placed, 2), "worker 2 free: both go, in their order");
    cr_assert(eq(u64, ev.last_id, 4));
    cr_assert(eq(u64, ev.last_worker, 2));
    free(big);
    free(t);
}

Test(router, full_queue_answers_overloaded_at_once)
{
    cfg.busy_threshold = 0.5;
    cfg.queue_max = 1;
    make();
    join(1, 6); /* busy above 3 blocks; holds the 4 of each request */
    uint32_t *t = prompt(0, 0, 1, 4 * B);
    struct kvr_decision d;
    cr_assert(eq(int, route(1, t, 4 * B, &d), KVR_OK));
    cr_assert(eq(int, route(2, t, 4 * B, &d), KVR_OK));
    cr_assert(d.queued);
    cr_assert(eq(int, route(3, t, 4 * B, &d), KVR_ERR_OVERLOADED));
    free(t);
}

Test(router, slots_grow_with_the_fleet_and_are_reused_clean)
{
    make();
    for (uint64_t w = 1; w <= 40; w++) /* the per-slot arrays grow 8 -> 16 -> 32 -> 64 */
        join(w, 0);
    struct kvr_decision d;
    for (uint64_t id = 1; id <= 80; id++) {
        uint32_t *t = prompt((uint32_t)(id % 5), 4 * B, id, 2 * B);
        cr_assert(eq(int, route(id, t, 6 * B, &d), KVR_OK));
        cr_assert(not(d.queued));
        cr_assert(eq(u32, d.ncandidates, 40));
        free(t);
    }
    for (uint64_t w = 1; w <= 20; w++)
        cr_assert(eq(int, kvr_router_worker_remove(r, w), KVR_OK));
    cr_assert(eq(int, ev.left, 20));
    for (uint64_t w = 41; w <= 60; w++) { /* into the freed slots */
        join(w, 0);
        uint64_t blocks = 1, prefill = 1;
        uint32_t inflight = 1;
        cr_assert(eq(int, kvr_router_worker_load(r, w, &blocks, &prefill, &inflight), KVR_OK));
        cr_assert(eq(u64, blocks + prefill + inflight, 0), "a reused slot starts clean");
    }
    struct kvr_router_stats s;
    kvr_router_stats(r, &s);
    cr_assert(eq(u32, s.workers, 40));
    cr_assert(eq(u32, s.inflight, 80 - (uint32_t)ev.failed));
    for (uint64_t id = 81; id <= 100; id++) {
        uint32_t *t = prompt(0, 4 * B, id, 2 * B);
        cr_assert(eq(int, route(id, t, 6 * B, &d), KVR_OK));
        free(t);
    }
    kvr_router_stats(r, &s);
    cr_assert(eq(u32, s.inflight, 100 - (uint32_t)ev.failed));
}

Test(router, worker_loss_fails_its_requests)
{
    make();
    join(1, 0);
    join(2, 0);
    uint32_t *t = prompt(0, 0, 1, 2 * B);
    struct kvr_decision d;
    int on1 = 0;
    for (uint64_t id = 1; id <= 6; id++) {
        cr_assert(eq(int, route(id, t, 2 * B, &d), KVR_OK));
        on1 += d.worker_id == 1;
    }
    cr_assert(eq(int, kvr_router_worker_remove(r, 1), KVR_OK));
    cr_assert(eq(int, ev.failed, on1));
    cr_assert(eq(int, ev.left, 1));
    cr_assert(eq(int, kvr_router_worker_remove(r, 1), KVR_ERR_UNKNOWN_WORKER));
    cr_assert(eq(int, kvr_router_kv_cleared(r, 1), KVR_ERR_UNKNOWN_WORKER));
    struct kvr_router_stats s;
    kvr_router_stats(r, &s);
    cr_assert(eq(u32, s.inflight, 6 - on1));
    cr_assert(eq(u64, s.unknown_worker, 2));
    free(t);
}

Test(router, silent_workers_and_stale_requests_time_out)
{
    cfg.worker_timeout_ns = 3 * NS;
    cfg.request_ttl_ns = 10 * NS;
    make();
    join(1, 0);
    struct kvr_worker_info w2 = {
        .id = 2, .block_size = B, .capacity_blocks = 0, .waiting = 0, .kv_usage = 0};
    cr_assert(eq(int, kvr_router_worker_seen(r, &w2, 0), KVR_OK));
    uint32_t *t = prompt(0, 0, 1, B);
    struct kvr_decision d;
    cr_assert(eq(int, route(1, t, B, &d), KVR_OK));
    uint64_t w = d.worker_id, other = w == 1 ? 2 : 1;
    for (uint64_t now = NS; now <= 12 * NS; now += NS) {
        struct kvr_worker_info i1 = {
            .id = w, .block_size = B, .capacity_blocks = 0, .waiting = 0, .kv_usage = 0};
        cr_assert(eq(int, kvr_router_worker_seen(r, &i1, now), KVR_OK));
        kvr_router_tick(r, now);
    }
    cr_assert(eq(int, ev.left, 1), "the silent worker %lu left", (unsigned long)other);
    cr_assert(eq(int, ev.expired, 1), "the request nobody finished expired");
    free(t);
}

Test(router, a_worker_is_judged_by_what_was_applied_not_by_the_clock)
{
    cfg.worker_timeout_ns = 3 * NS;
    make();
    join(1, 0);
    /* 10 s on the clock, but events were applied only up to 2 s: its heartbeats may be queued */
    kvr_router_tick_heard(r, 10 * NS, 2 * NS);
    cr_assert(eq(int, ev.left, 0), "a worker silent only past what was applied stays");
    kvr_router_tick_heard(r, 10 * NS, 12 * NS); /* heard is taken at most at now */
    cr_assert(eq(int, ev.left, 1), "silent for 10 s of applied events: removed");
}

Test(router, unknown_ids_are_counted_not_fatal)
{
    make();
    join(1, 0);
    cr_assert(eq(int, kvr_router_done(r, 42), KVR_ERR_UNKNOWN_REQUEST));
    cr_assert(eq(int, kvr_router_prefill_done(r, 42, 0), KVR_ERR_UNKNOWN_REQUEST));
    cr_assert(eq(int, kvr_router_output_block(r, 42, 0), KVR_ERR_UNKNOWN_REQUEST));
    uint64_t ids[2] = {1, 2};
    cr_assert(eq(int, kvr_router_kv_removed(r, 1, ids, 2), KVR_OK));
    cr_assert(eq(int, kvr_router_kv_removed(r, 9, ids, 2), KVR_ERR_UNKNOWN_WORKER));
    struct kvr_router_stats s;
    kvr_router_stats(r, &s);
    cr_assert(eq(u64, s.unknown_request, 3));
    cr_assert(eq(u64, s.index.unknown_block, 2));
}

Test(router, book_applies_a_decision_made_elsewhere)
{
    make();
    join(1, 0);
    join(2, 0);
    uint64_t seq[3] = {11, 22, 33};
    cr_assert(eq(int, kvr_router_book(r, 7, 2, seq, 3, 3 * B + 1, 0, 0), KVR_OK));
    cr_assert(eq(int, kvr_router_book(r, 7, 2, seq, 3, 3 * B, 0, 0), KVR_ERR_DUPLICATE));
    cr_assert(eq(int, kvr_router_book(r, 8, 9, seq, 3, 3 * B, 0, 0), KVR_ERR_UNKNOWN_WORKER));
    cr_assert(eq(int, kvr_router_book(r, 8, 1, seq, 3, 3 * B, 4, 0), KVR_ERR_INVALID));
    uint64_t blocks, prefill;
    uint32_t inflight;
    cr_assert(eq(int, kvr_router_worker_load(r, 2, &blocks, &prefill, &inflight), KVR_OK));
    cr_assert(eq(u64, blocks, 4));
    cr_assert(eq(u64, prefill, 3 * B + 1));
    cr_assert(eq(u32, inflight, 1));
    cr_assert(eq(int, kvr_router_done(r, 7), KVR_OK));
}

/* Random traffic with every event kind; once all requests end, every map is empty. */
static void random_run(uint64_t seed, enum kvr_policy policy, double temperature, uint64_t *log,
                       int nlog)
{
    cfg.seed = seed;
    cfg.policy = policy;
    cfg.temperature = temperature;
    cfg.approximate = false;
    make();
    for (uint64_t w = 1; w <= 6; w++)
        join(w, 1000);
    for (int i = 0; i < nlog; i++) {
        uint64_t id = (uint64_t)i + 1;
        uint32_t *t = prompt((uint32_t)(i % 5), 4 * B, id, (uint32_t)(i % 7) * B + 3);
        uint32_t n = 4 * B + (uint32_t)(i % 7) * B + 3;
        struct kvr_decision d;
        cr_assert(eq(int, route(id, t, n, &d), KVR_OK));
        log[i] = d.worker_id;
        uint64_t local[16];
        uint32_t nb = (uint32_t)kvr_hash_prompt(t, n, B, local, NULL);
        struct kvr_kv_block blocks[16];
        for (uint32_t b = 0; b < nb; b++)
            blocks[b] = (struct kvr_kv_block){id * 100 + b, local[b]};
        kvr_router_kv_stored(r, d.worker_id, NULL, blocks, nb);
        kvr_router_prefill_done(r, id, 0);
        kvr_router_output_block(r, id, 0);
        if (i >= 8)
            cr_assert(eq(int, kvr_router_done(r, id - 8), KVR_OK));
        free(t);
    }
    for (int i = nlog - 8; i < nlog; i++)
        cr_assert(eq(int, kvr_router_done(r, (uint64_t)i + 1), KVR_OK));
    for (uint64_t w = 1; w <= 6; w++)
        cr_assert(eq(int, kvr_router_kv_cleared(r, w), KVR_OK));
    struct kvr_router_stats s;
    kvr_router_stats(r, &s);
    cr_assert(eq(u32, s.inflight, 0));
    cr_assert(eq(u64, s.active_blocks, 0));
    cr_assert(eq(u32, s.index_entries, 0));
    cr_assert(eq(u32, s.nodes, 0), "once every request is freed, every map is empty");
    kvr_router_destroy(r);
    r = NULL;
}

Test(router, equal_seeds_give_equal_decisions)
{
    enum { N = 300 };
    static uint64_t a[N], b[N], c[N];
    random_run(5, KVR_POLICY_KV, 0.7, a, N);
    random_run(5, KVR_POLICY_KV, 0.7, b, N);
    random_run(6, KVR_POLICY_KV, 0.7, c, N);
    cr_assert(eq(int, memcmp(a, b, sizeof a), 0));
    cr_assert(ne(int, memcmp(a, c, sizeof a), 0), "another seed samples otherwise");
}

Test(router, every_policy_runs_and_leaves_nothing_behind)
{
    static uint64_t log[120];
    for (int p = 0; p < KVR_POLICY_COUNT; p++)
        random_run(1, (enum kvr_policy)p, 0, log, 120);
}

/* The time model (the default): predicted TTFT plus the cache a recomputation costs. */
Test(router, time_model_prefers_the_cache_then_avoids_queued_prefill)
{
    cfg.cost_model = KVR_COST_TIME;
    make();
    join(1, 1000);
    join(2, 1000);
    uint32_t *t = prompt(9, 32 * B, 1, 8 * B);
    uint64_t local[40];
    uint32_t nb = (uint32_t)kvr_hash_prompt(t, 40 * B, B, local, NULL);
    struct kvr_kv_block blocks[40];
    for (uint32_t i = 0; i < 32; i++)
        blocks[i] = (struct kvr_kv_block){i + 1, local[i]};
    cr_assert(eq(int, kvr_router_kv_stored(r, 2, NULL, blocks, 32), KVR_OK));
    struct kvr_decision d;
    cr_assert(eq(int, route(1, t, nb * B, &d), KVR_OK));
    cr_assert(eq(u64, d.worker_id, 2), "the worker caching 32 of 40 blocks is faster");
    /* the predicted TTFT there is prefill(8 blocks) on an idle worker, plus the charge for the
     * 8 recomputed blocks on a cache 32/1000 full */
    double p8 = cfg.prefill_ms[1] * 8 * B + cfg.prefill_ms[2] * 64 * B * B;
    double want = cfg.prefill_ms[0] + p8 + cfg.cache_weight * (32.0 / 1000) * p8;
    cr_assert(epsilon_eq(dbl, d.cost, want, 1e-9));
    /* a second request without any cached prefix: worker 2 is busy prefilling, 1 is idle */
    uint32_t *u = prompt(5, 0, 2, 40 * B);
    cr_assert(eq(int, route(2, u, 40 * B, &d), KVR_OK));
    cr_assert(eq(u64, d.worker_id, 1), "queued prefill on worker 2 makes worker 1 faster");
    free(t);
    free(u);
}

Test(router, time_model_charges_recomputation_on_a_full_cache)
{
    cfg.cost_model = KVR_COST_TIME;
    cfg.cache_weight = 4.0;
    make();
    join(1, 64); /* 64-block caches */
    join(2, 64);
    uint32_t *t = prompt(3, 16 * B, 1, 16 * B);
    uint64_t local[32];
    kvr_hash_prompt(t, 32 * B, B, local, NULL);
    struct kvr_kv_block blocks[64];
    for (uint32_t i = 0; i < 16; i++)
        blocks[i] = (struct kvr_kv_block){i + 1, local[i]};
    cr_assert(eq(int, kvr_router_kv_stored(r, 1, NULL, blocks, 16), KVR_OK));
    struct kvr_request q = {.id = 1, .tokens = t, .ntokens = 32 * B, .explain = true};
    struct kvr_decision d;
    cr_assert(eq(int, kvr_router_select(r, &q, 0, &d), KVR_OK));
    double empty_cache = d.costs[1]; /* worker 2 caches nothing: no charge */
    /* fill worker 2's cache with other blocks: now recomputing there evicts them */
    for (uint32_t i = 0; i < 64; i++)
        blocks[i] = (struct kvr_kv_block){1000 + i, 7777 + i};
    cr_assert(eq(int, kvr_router_kv_stored(r, 2, NULL, blocks, 64), KVR_OK));
    cr_assert(eq(int, kvr_router_select(r, &q, 0, &d), KVR_OK));
    double p32 = cfg.prefill_ms[1] * 32 * B + cfg.prefill_ms[2] * 32.0 * B * 32 * B;
    cr_assert(epsilon_eq(dbl, d.costs[1] - empty_cache, 4.0 * p32, 1e-6));
    free(t);
}

/*
 * Three in-flight requests on worker 1 compute a prefix no cache holds; a fourth comes (time
 * model). With `busy`, workers 2-4 each have a request of their own in flight too.
 */
static uint64_t fourth_sharer(double share_weight, bool busy)
{
    cfg.cost_model = KVR_COST_TIME;
    cfg.share_weight = share_weight;
    make();
    for (uint64_t w = 1; w <= 4; w++)
        join(w, 10000);
    uint64_t seq[65];
    uint32_t *t = prompt(11, 64 * B, 99, B);
    kvr_hash_prompt(t, 65 * B, B, NULL, seq);
    for (uint64_t id = 1; id <= 3; id++) /* booked on worker 1 by a peer, say */
        cr_assert(eq(int, kvr_router_book(r, id, 1, seq, 64, 64 * B + 1, 0, 0), KVR_OK));
    uint64_t other[2];
    for (uint64_t w = 2; busy && w <= 4; w++) { /* one short unrelated request each */
        uint32_t *o = prompt(20 + (uint32_t)w, 0, 100 + w, 2 * B);
        kvr_hash_prompt(o, 2 * B, B, NULL, other);
        cr_assert(eq(int, kvr_router_book(r, 100 + w, w, other, 2, 2 * B, 0, 0), KVR_OK));
        free(o);
    }
    struct kvr_decision d;
    cr_assert(eq(int, route(4, t, 65 * B, &d), KVR_OK));
    free(t);
    uint64_t w = d.worker_id;
    kvr_router_destroy(r);
    r = NULL;
    return w;
}

Test(router, time_model_joins_a_burst_sharing_an_uncached_prefix)
{
    cr_assert(eq(u64, fourth_sharer(16.0, true), 1),
              "on a busy fleet, recomputing 64 blocks elsewhere costs more");
    cr_assert(ne(u64, fourth_sharer(0.0, true), 1), "without the charge another worker is faster");
    cr_assert(ne(u64, fourth_sharer(16.0, false), 1),
              "on an idle fleet the recomputation takes idle time: it spreads");
}

/* Decoders wait for every prefill step of their worker: the stall term prices that. */
static uint64_t beside_decoders(double stall_weight)
{
    cfg.cost_model = KVR_COST_TIME;
    cfg.stall_weight = stall_weight;
    make();
    join(1, 10000);
    join(2, 10000);
    uint64_t seq[8];
    for (uint64_t id = 1; id <= 6; id++) { /* six short requests decoding on worker 1 */
        uint32_t *o = prompt(30 + (uint32_t)id, 0, id, 2 * B);
        kvr_hash_prompt(o, 2 * B, B, NULL, seq);
        cr_assert(eq(int, kvr_router_book(r, id, 1, seq, 2, 2 * B, 0, 0), KVR_OK));
        cr_assert(eq(int, kvr_router_prefill_done(r, id, 0), KVR_OK));
        free(o);
    }
    for (uint64_t id = 7; id <= 8; id++) { /* two long ones still prefilling on worker 2 */
        uint32_t *o = prompt(40 + (uint32_t)id, 0, id, 8 * B);
        kvr_hash_prompt(o, 8 * B, B, NULL, seq);
        cr_assert(eq(int, kvr_router_book(r, id, 2, seq, 8, 8 * B, 0, 0), KVR_OK));
        free(o);
    }
    uint32_t *t = prompt(50, 0, 9, 64 * B);
    struct kvr_decision d;
    cr_assert(eq(int, route(9, t, 64 * B, &d), KVR_OK));
    free(t);
    uint64_t w = d.worker_id;
    kvr_router_destroy(r);
    r = NULL;
    return w;
}

Test(router, time_model_prices_the_stall_of_decoders)
{
    cr_assert(eq(u64, beside_decoders(0.0), 1), "for its own TTFT alone, no queued prefill wins");
    cr_assert(eq(u64, beside_decoders(1.0), 2),
              "six decoders would each wait for its 64 blocks: behind 16 queued ones is cheaper");
}

/*
 * Worker 1 caches a 512-block prefix and decodes one long request holding 1,200 of its 2,000
 * blocks; worker 2 is empty. A request of that prefix and 4 blocks more, generating max_tokens,
 * priced with decode_weight: where does it go? Before it, `taught` requests of the same
 * max_tokens end having generated `generated` tokens each (they teach learn_output).
 */
static uint64_t long_or_short_taught(double decode_weight, uint32_t max_tokens, uint32_t taught,
                                     uint32_t generated)
{
    cfg.cost_model = KVR_COST_TIME;
    cfg.decode_weight = decode_weight;
    make();
    join(1, 2000);
    join(2, 2000);
    uint64_t *local = malloc(516 * sizeof *local), *held = malloc(1200 * sizeof *held);
    uint32_t *t = prompt(70, 512 * B, 9, 4 * B);
    kvr_hash_prompt(t, 516 * B, B, local, NULL);
    struct kvr_kv_block *blocks = malloc(512 * sizeof *blocks);
    for (uint32_t i = 0; i < 512; i++)
        blocks[i] = (struct kvr_kv_block){i + 1, local[i]};
    cr_assert(eq(int, kvr_router_kv_stored(r, 1, NULL, blocks, 512), KVR_OK));
    uint32_t *o = prompt(71, 0, 1, 1200 * B);
    kvr_hash_prompt(o, 1200 * B, B, NULL, held);
    cr_assert(eq(int, kvr_router_book(r, 1, 1, held, 1200, 1200 * B, 0, 0), KVR_OK));
    cr_assert(eq(int, kvr_router_prefill_done(r, 1, 0), KVR_OK));
    for (uint32_t i = 0; i < taught; i++) {
        uint32_t one[B] = {i + 1};
        struct kvr_request k = {
            .id = 100 + i, .tokens = one, .ntokens = B, .max_tokens = max_tokens};
        struct kvr_decision kd;
        cr_assert(eq(int, kvr_router_route(r, &k, 0, &kd), KVR_OK));
        cr_assert(eq(int, kvr_router_finished(r, k.id, 0, generated), KVR_OK));
    }
    struct kvr_request q = {.id = 9, .tokens = t, .ntokens = 516 * B, .max_tokens = max_tokens};
    struct kvr_decision d;
    cr_assert(eq(int, kvr_router_route(r, &q, 0, &d), KVR_OK));
    free(o);
    free(t);
    free(held);
    free(local);
    free(blocks);
    kvr_router_destroy(r);
    r = NULL;
    return d.worker_id;
}

static uint64_t long_or_short(double decode_weight, uint32_t max_tokens)
{
    return long_or_short_taught(decode_weight, max_tokens, 0, 0);
}

Test(router, time_model_prices_the_own_decode_when_asked)
{
    cr_assert(eq(u64, long_or_short(0.0, 1000), 1), "unpriced: the cached prefix wins");
    cr_assert(eq(u64, long_or_short(1.0, 1000), 2),
              "1,000 steps at 86 % KV use cost more than recomputing 512 blocks");
    cr_assert(eq(u64, long_or_short(1.0, 2), 1), "a short one stays with its prefix");
    cr_assert(eq(u64, long_or_short(1.0, 0), 1), "no max_tokens: nothing to price");
    cfg.max_output_tokens = 2;
    cr_assert(eq(u64, long_or_short(1.0, UINT32_MAX), 1), "taken at most max_output_tokens");
}

Test(router, a_max_tokens_is_priced_at_what_requests_with_it_generated)
{
    cr_assert(eq(u64, long_or_short_taught(1.0, 1000, 16, 1000), 2), "they used it all");
    cr_assert(eq(u64, long_or_short_taught(1.0, 1000, 16, 2), 1),
              "they generated 2 tokens of 1,000: it stays with its prefix");
    cr_assert(eq(u64, long_or_short_taught(1.0, 1000, 15, 2), 2), "15 are too few to go by");
    cfg.learn_output = false;
    cr_assert(eq(u64, long_or_short_taught(1.0, 1000, 16, 2), 2), "not learned: as sent");
}

/*
 * Workers 1 and 2 are alike and idle, but worker 1 caches the probe's first 4 blocks and took
 * eight 64-block prefills at time 0 (requests since ended), booked as its peers' decisions
 * (BY_PEERS) or routed by this router (BY_ROUTING). Where does a probe of max_tokens, decided at
 * `at`, go, with the prefill window `window_ns`? BY_A_WORKER_THAT_LEFT: worker 2 takes the
 * prefills and leaves, and worker 3, which takes its slot, caches the probe's blocks.
 * BY_A_SNAPSHOT: worker 1's eight requests come from a peer's snapshot, their prefills done.
 * BY_PEERS_LATE: each peer's decision comes after its request's done event.
 */
enum prefills_by { BY_PEERS, BY_ROUTING, BY_A_WORKER_THAT_LEFT, BY_A_SNAPSHOT, BY_PEERS_LATE };

static uint64_t after_prefills_by(enum prefills_by by, uint64_t window_ns, uint32_t max_tokens,
                                  uint64_t at)
{
    cfg.cost_model = KVR_COST_TIME;
    cfg.prefill_window_ns = window_ns;
    make();
    join(1, 100000);
    if (by != BY_ROUTING) /* routed, the prefills can go to worker 1 only */
        join(2, 100000);
    uint64_t local[8], seq[64];
    uint32_t *t = prompt(80, 4 * B, 1, 4 * B);
    kvr_hash_prompt(t, 8 * B, B, local, NULL);
    struct kvr_kv_block blocks[4];
    for (uint32_t i = 0; i < 4; i++)
        blocks[i] = (struct kvr_kv_block){i + 1, local[i]};
    if (by != BY_A_WORKER_THAT_LEFT)
        cr_assert(eq(int, kvr_router_kv_stored(r, 1, NULL, blocks, 4), KVR_OK));
    for (uint64_t id = 10; id < 18; id++) {
        uint32_t *q = prompt(90 + (uint32_t)id, 0, id, 64 * B);
        kvr_hash_prompt(q, 64 * B, B, NULL, seq);
        uint64_t on = by == BY_A_WORKER_THAT_LEFT ? 2 : 1;
        if (by == BY_ROUTING) {
            struct kvr_decision d;
            cr_assert(eq(int, route(id, q, 64 * B, &d), KVR_OK));
            cr_assert(eq(u64, d.worker_id, 1));
        } else if (by == BY_PEERS_LATE) { /* each one's done came before the decision */
            cr_assert(eq(int, kvr_router_done_at(r, id, 0), KVR_ERR_UNKNOWN_REQUEST));
            cr_assert(eq(int, kvr_router_book(r, id, 1, seq, 64, 64 * B, 0, 0), KVR_ERR_DUPLICATE));
            free(q);
            continue;
        } else if (by == BY_A_SNAPSHOT) { /* records of requests whose prefill ran already */
            struct kvr_request_record rec = {id, 1, seq, 64, 64 * B, 0, true, 0, 0};
            cr_assert(eq(int, kvr_router_import(r, &rec, 0), KVR_OK));
        } else {
            cr_assert(eq(int, kvr_router_book(r, id, on, seq, 64, 64 * B, 0, 0), KVR_OK));
        }
        cr_assert(eq(int, kvr_router_done(r, id), KVR_OK));
        free(q);
    }
    if (by == BY_ROUTING) {
        join(2, 100000);
    } else if (by == BY_A_WORKER_THAT_LEFT) { /* worker 3 takes worker 2's slot, and the cache */
        cr_assert(eq(int, kvr_router_worker_remove(r, 2), KVR_OK));
        join(3, 100000);
        cr_assert(eq(int, kvr_router_kv_stored(r, 3, NULL, blocks, 4), KVR_OK));
    }
    struct kvr_request q = {.id = 1, .tokens = t, .ntokens = 8 * B, .max_tokens = max_tokens};
    struct kvr_decision d;
    cr_assert(eq(int, kvr_router_select(r, &q, at, &d), KVR_OK));
    free(t);
    uint64_t w = d.worker_id;
    kvr_router_destroy(r);
    r = NULL;
    return w;
}

static uint64_t after_prefills(uint64_t window_ns, uint32_t max_tokens, uint64_t at)
{
    return after_prefills_by(BY_PEERS, window_ns, max_tokens, at);
}

Test(router, a_long_generation_avoids_a_worker_busy_with_prefills)
{
    cr_assert(eq(u64, after_prefills(10 * NS, 1000, 1), 2),
              "its 1,000 steps there would each wait for a share of 260 ms of prefill in 10 s");
    cr_assert(eq(u64, after_prefills(10 * NS, 2, 1), 1), "a short one stays with its prefix");
    cr_assert(eq(u64, after_prefills(10 * NS, 1000, 60 * NS), 1),
              "a minute later those prefills are six windows old");
    cr_assert(eq(u64, after_prefills(0, 1000, 1), 1), "no window: not priced");
    cfg.decode_weight = 0;
    cr_assert(eq(u64, after_prefills(10 * NS, 1000, 1), 1), "no own decode: nothing to stretch");
}

Test(router, the_prefills_it_routes_count_and_a_workers_go_with_it)
{
    cr_assert(eq(u64, after_prefills_by(BY_ROUTING, 10 * NS, 1000, 1), 2),
              "the prefills this router decided count as its peers' do");
    cr_assert(eq(u64, after_prefills_by(BY_A_WORKER_THAT_LEFT, 10 * NS, 1000, 1), 3),
              "worker 2 took them and left: worker 3 in its slot starts with none");
    cr_assert(eq(u64, after_prefills_by(BY_A_SNAPSHOT, 10 * NS, 1000, 1), 1),
              "prefills a snapshot says ran, at some time before, are not counted now");
    cr_assert(eq(u64, after_prefills_by(BY_PEERS_LATE, 10 * NS, 1000, 1), 2),
              "a decision its done overtook counts as its origin counted it: replicas agree");
}

/*
 * A resend reached two routers before either heard of the other's decision: this one booked the
 * request on one worker, the peer's earlier decision on the other stands. Withdrawn, this one's
 * prefill leaves the share of the worker it chose, which the peer never counted: the two routers'
 * shares are alike again. A cancel (a client's, a placing again, which every replica sees) keeps
 * it.
 */
static void shares_after_a_decision_that_never_stood(bool withdrawn, double share[2])
{
    cfg.cost_model = KVR_COST_TIME;
    cfg.prefill_window_ns = 10 * NS;
    make();
    join(1, 100000);
    join(2, 100000);
    uint64_t seq[64];
    uint32_t *t = prompt(95, 0, 1, 64 * B);
    kvr_hash_prompt(t, 64 * B, B, NULL, seq);
    struct kvr_decision d;
    cr_assert(eq(int, route(7, t, 64 * B, &d), KVR_OK));
    free(t);
    uint64_t other = d.worker_id == 1 ? 2 : 1;
    cr_assert(eq(int, (withdrawn ? kvr_router_withdraw : kvr_router_cancel)(r, 7), KVR_OK));
    struct kvr_request_record peer = {7, other, seq, 64, 64 * B, 0, false, 0, 0};
    cr_assert(eq(int, kvr_router_import(r, &peer, 1), KVR_OK));
    kvr_router_tick(r, 2);
    struct kvr_worker_view v[2];
    cr_assert(eq(u32, kvr_router_workers(r, v, 2), 2));
    share[0] = v[d.worker_id - 1].prefill_share; /* the one this router chose */
    share[1] = v[other - 1].prefill_share;       /* the one that stands */
    kvr_router_destroy(r);
    r = NULL;
}

Test(router, a_decision_that_never_stood_leaves_no_share_behind)
{
    double s[2];
    shares_after_a_decision_that_never_stood(true, s);
    cr_assert(gt(dbl, s[1], 0.0));
    cr_assert(lt(dbl, s[0], s[1] * 1e-9), "withdrawn: %g left of %g", s[0], s[1]);
    shares_after_a_decision_that_never_stood(false, s);
    cr_assert(gt(dbl, s[0], s[1] * 0.999), "cancelled: it still counts (%g and %g)", s[0], s[1]);
}

Test(router, the_window_is_the_engines_time)
{
    /* engines 10 times faster than the model: 6 s of the router's clock are 6 windows */
    cfg.engine_speedup = 10;
    cr_assert(eq(u64, after_prefills(10 * NS, 1000, 1), 2));
    cr_assert(eq(u64, after_prefills(10 * NS, 1000, 6 * NS), 1));
    cfg.engine_speedup = 1;
    cr_assert(eq(u64, after_prefills(10 * NS, 1000, 6 * NS), 2),
              "at the model's speed: 0.6 of one");
}

/*
 * Worker 1 caches a 128-block prefix and has three requests queued for prefill; workers 2 and 3
 * have full caches of other blocks. With `hot`, the queued requests use that prefix too.
 */
static uint64_t behind_a_queue(bool hot)
{
    cfg.cost_model = KVR_COST_TIME;
    make();
    for (uint64_t w = 1; w <= 3; w++)
        join(w, 1000);
    uint64_t local[132], seq[192];
    uint32_t *t = prompt(60, 128 * B, 9, 4 * B);
    kvr_hash_prompt(t, 132 * B, B, local, NULL);
    struct kvr_kv_block blocks[1000];
    for (uint32_t i = 0; i < 128; i++)
        blocks[i] = (struct kvr_kv_block){i + 1, local[i]};
    cr_assert(eq(int, kvr_router_kv_stored(r, 1, NULL, blocks, 128), KVR_OK));
    for (uint64_t w = 2; w <= 3; w++) {
        for (uint32_t i = 0; i < 1000; i++)
            blocks[i] = (struct kvr_kv_block){5000 + i, w * 100000 + i};
        cr_assert(eq(int, kvr_router_kv_stored(r, w, NULL, blocks, 1000), KVR_OK));
    }
    for (uint64_t id = 1; id <= 3; id++) { /* 64 unique blocks each still to prefill */
        uint32_t *q =
            hot ? prompt(60, 128 * B, id, 64 * B) : prompt(70 + (uint32_t)id, 0, id, 192 * B);
        kvr_hash_prompt(q, 192 * B, B, NULL, seq);
        cr_assert(eq(int, kvr_router_book(r, id, 1, seq, 192, 192 * B, 128, 0), KVR_OK));
        free(q);
    }
    struct kvr_decision d;
    cr_assert(eq(int, route(9, t, 132 * B, &d), KVR_OK));
    free(t);
    uint64_t w = d.worker_id;
    kvr_router_destroy(r);
    r = NULL;
    return w;
}

Test(router, time_model_spreads_a_hot_prefix_and_keeps_a_cold_one)
{
    cr_assert(eq(u64, behind_a_queue(false), 1),
              "a prefix no one else uses stays: copying it would evict a full cache");
    cr_assert(ne(u64, behind_a_queue(true), 1),
              "a prefix three queued requests use is worth copying to an idle worker");
}

/* --- replication ---------------------------------------------------------------------------- */

static struct kvr_router *make_plain(void)
{
    struct kvr_router_config c;
    kvr_router_config_default(&c);
    c.block_size = B;
    kvr_status st;
    struct kvr_router *x = kvr_router_create(&c, &st);
    cr_assert(x != NULL);
    for (uint64_t w = 1; w <= 3; w++) {
        struct kvr_worker_info info = {.id = w, .block_size = B, .capacity_blocks = 1000};
        cr_assert(eq(int, kvr_router_worker_seen(x, &info, 0), KVR_OK));
    }
    return x;
}

static void copy_request(void *ctx, const struct kvr_request_record *rec)
{
    cr_assert(eq(int, kvr_router_import(ctx, rec, 5), KVR_OK));
}

static void copy_entry(void *ctx, const struct kvr_index_record *rec)
{
    cr_assert(eq(int, kvr_router_import_index(ctx, rec, 5), KVR_OK));
}

/* Route request id (a prompt of family id % 3) on a and store its 8 full blocks on the worker
 * chosen, engine ids id * 10 on; returns that worker. */
static uint64_t route_and_store(struct kvr_router *a, uint64_t id)
{
    uint32_t *t = prompt((uint32_t)(id % 3), 6 * B, id, 2 * B + 5);
    struct kvr_request q = {.id = id, .tokens = t, .ntokens = 8 * B + 5};
    struct kvr_decision d;
    cr_assert(eq(int, kvr_router_route(a, &q, 1, &d), KVR_OK));
    uint64_t local[8];
    kvr_hash_prompt(t, 8 * B + 5, B, local, NULL);
    struct kvr_kv_block blocks[8];
    for (int i = 0; i < 8; i++)
        blocks[i] = (struct kvr_kv_block){id * 10 + (uint64_t)i, local[i]};
    cr_assert(eq(int, kvr_router_kv_stored(a, d.worker_id, NULL, blocks, 8), KVR_OK));
    free(t);
    return d.worker_id;
}

Test(replication, a_snapshot_makes_an_equal_replica)
{
    struct kvr_router *a = make_plain(), *b = make_plain();
    for (uint64_t id = 1; id <= 20; id++) {
        route_and_store(a, id);
        if (id % 2)
            kvr_router_prefill_done(a, id, 2);
        if (id % 4 == 1)
            kvr_router_output_block(a, id, 2);
    }
    struct kvr_digest da, db;
    kvr_router_digest(a, &da);
    kvr_router_digest(b, &db);
    cr_assert(ne(u64, da.combined, db.combined));
    kvr_router_export_requests(a, copy_request, b);
    kvr_router_export_index(a, copy_entry, b, 3);
    kvr_router_digest(b, &db);
    cr_assert(eq(u64, da.requests, db.requests));
    cr_assert(eq(u64, da.index, db.index));
    cr_assert(eq(u64, da.combined, db.combined), "an equal state has an equal digest");
    cr_assert(eq(u32, db.nrequests, 20));
    for (uint64_t w = 1; w <= 3; w++) { /* the predicted loads came across too */
        uint64_t ba, pa, bb, pb;
        kvr_router_worker_load(a, w, &ba, &pa, NULL);
        kvr_router_worker_load(b, w, &bb, &pb, NULL);
        cr_assert(eq(u64, ba, bb));
        cr_assert(eq(u64, pa, pb));
    }
    kvr_router_destroy(a);
    kvr_router_destroy(b);
}

/* The digest recomputed from the state itself, by the formula of docs/architecture.md: XOR of
 * mix(request ^ mix(worker)) over the requests, of mix(seq ^ mix(worker + 1)) over the entries. */
struct redigest {
    uint64_t requests, index;
    uint32_t nrequests, nentries;
};

static void redigest_request(void *ctx, const struct kvr_request_record *rec)
{
    struct redigest *x = ctx;
    x->requests ^= kvr_mix64(rec->request_id ^ kvr_mix64(rec->worker_id));
    x->nrequests++;
}

static void redigest_entry(void *ctx, const struct kvr_index_record *rec)
{
    struct redigest *x = ctx;
    x->index ^= kvr_mix64(rec->seq ^ kvr_mix64(rec->worker_id + 1));
    x->nentries++;
}

/* The digest is kept as the state changes, not walked: after bookings, events, ends, a worker's
 * leaving and another's taking its slot (its requests and entries named by the new one), it is
 * what a walk of the state gives. */
Test(replication, the_digest_kept_as_the_state_changes_is_the_states)
{
    struct kvr_router *a = make_plain();
    for (uint64_t id = 1; id <= 30; id++) {
        if (id == 16) { /* worker 2 leaves; worker 9 takes a slot, maybe its */
            cr_assert(eq(int, kvr_router_worker_remove(a, 2), KVR_OK));
            struct kvr_worker_info info = {.id = 9, .block_size = B, .capacity_blocks = 1000};
            cr_assert(eq(int, kvr_router_worker_seen(a, &info, 1), KVR_OK));
        }
        uint64_t worker = route_and_store(a, id);
        if (id % 3 == 0) {
            uint64_t gone = id * 10 + 7;
            kvr_router_kv_removed(a, worker, &gone, 1);
            kvr_router_done(a, id);
        }
    }
    struct kvr_digest d;
    struct redigest x = {0};
    kvr_router_digest(a, &d);
    kvr_router_export_requests(a, redigest_request, &x);
    kvr_router_export_index(a, redigest_entry, &x, 5);
    cr_assert(gt(u32, x.nrequests, 10));
    cr_assert(gt(u32, x.nentries, 50));
    cr_assert(eq(u32, d.nrequests, x.nrequests));
    cr_assert(eq(u32, d.nentries, x.nentries));
    cr_assert(eq(u64, d.requests, x.requests));
    cr_assert(eq(u64, d.index, x.index));
    kvr_router_destroy(a);
}

Test(replication, a_done_that_overtakes_its_decision_wins)
{
    struct kvr_router *b = make_plain();
    uint64_t seq[2] = {1, 2};
    struct kvr_request_record rec = {77, 2, seq, 2, 2 * B, 0, false, 0, 0};
    cr_assert(eq(int, kvr_router_done_at(b, 77, 1), KVR_ERR_UNKNOWN_REQUEST));
    cr_assert(eq(int, kvr_router_import(b, &rec, 2), KVR_ERR_DUPLICATE), "tombstoned");
    cr_assert(eq(int, kvr_router_import(b, &rec, 3), KVR_ERR_DUPLICATE), "still, a second time");
    struct kvr_router_stats s;
    kvr_router_stats(b, &s);
    cr_assert(eq(u64, s.late_decisions, 2));
    cr_assert(eq(u32, s.inflight, 0));
    /* events that come early are applied when the decision arrives */
    rec.request_id = 78;
    kvr_router_prefill_done(b, 78, 3);
    kvr_router_output_block(b, 78, 3);
    cr_assert(eq(int, kvr_router_import(b, &rec, 4), KVR_OK));
    uint64_t blocks, prefill;
    kvr_router_worker_load(b, 2, &blocks, &prefill, NULL);
    cr_assert(eq(u64, prefill, 0), "the early prefill-done was applied");
    cr_assert(eq(u64, blocks, 3), "2 prompt blocks and the early output block");
    /* a snapshot record that already counts the blocks this replica saw early: not counted twice */
    rec.request_id = 79;
    rec.output_blocks = 2;
    kvr_router_output_block(b, 79, 5);
    cr_assert(eq(int, kvr_router_import(b, &rec, 6), KVR_OK));
    kvr_router_worker_load(b, 2, &blocks, NULL, NULL);
    cr_assert(eq(u64, blocks, 3 + 2), "79 shares 78's prompt blocks; its 2 output blocks, not 3");
    kvr_router_destroy(b);
}

static int expired_seen;
static void count_expired(void *ctx, const struct kvr_event *e)
{
    (void)ctx;
    expired_seen += e->kind == KVR_EV_EXPIRED && e->status == KVR_ERR_NOT_DELIVERED;
}

Test(router, heartbeats_reconcile_what_no_worker_holds)
{
    cfg.on_event = count_expired;
    expired_seen = 0;
    kvr_status st;
    r = kvr_router_create(&cfg, &st);
    for (uint64_t w = 1; w <= 2; w++) {
        struct kvr_worker_info info = {.id = w, .block_size = B};
        kvr_router_worker_seen(r, &info, 0);
    }
    uint64_t seq[1] = {9};
    for (uint64_t id = 1; id <= 3; id++)
        cr_assert(eq(int, kvr_router_book(r, id, 1, seq, 1, B, 0, 10), KVR_OK));
    cr_assert(eq(int, kvr_router_book(r, 4, 1, seq, 1, B, 0, 100), KVR_OK)); /* too young */
    uint64_t held[2] = {2, 555}, unknown[4];
    uint32_t nunknown = 0;
    cr_assert(eq(u32, kvr_router_reconcile(r, 1, held, 2, 50, 30, unknown, &nunknown, 4), 0),
              "a first miss only marks");
    cr_assert(eq(u32, kvr_router_reconcile(r, 1, held, 2, 55, 30, unknown, &nunknown, 4), 0),
              "a stale heartbeat right after it changes nothing");
    cr_assert(eq(u32, kvr_router_reconcile(r, 1, held, 2, 70, 30, unknown, &nunknown, 4), 2));
    cr_assert(eq(int, expired_seen, 2));
    cr_assert(eq(u32, nunknown, 1));
    cr_assert(eq(u64, unknown[0], 555), "the worker holds one this router never heard of");
    cr_assert(eq(u32, kvr_router_reconcile(r, 2, NULL, 0, 70, 30, unknown, &nunknown, 4), 0),
              "an empty heartbeat of a worker without requests");
    struct kvr_router_stats s;
    kvr_router_stats(r, &s);
    cr_assert(eq(u32, s.inflight, 2), "2 held or too young to judge remain");
    cr_assert(eq(u64, s.reconciled, 2));
    /* keys in any order (kvrouter sorts them first; others need not) */
    for (uint64_t id = 5; id <= 7; id++)
        cr_assert(eq(int, kvr_router_book(r, id, 2, seq, 1, B, 0, 10), KVR_OK));
    uint64_t unsorted[3] = {7, 556, 5};
    cr_assert(eq(u32, kvr_router_reconcile(r, 2, unsorted, 3, 50, 30, unknown, &nunknown, 4), 0));
    cr_assert(eq(u32, kvr_router_reconcile(r, 2, unsorted, 3, 70, 30, unknown, &nunknown, 4), 1),
              "only 6, which it does not hold");
    cr_assert(eq(u32, nunknown, 1));
    cr_assert(eq(u64, unknown[0], 556));
    cr_assert(eq(u64, unsorted[0], 7), "the caller's keys left as they were");
}

/* A grace of now or more judges nothing and clears a first strike (how kvrouter waits while a
 * worker says forwards are still in its queue). */
Test(router, a_grace_of_now_suspends_judgement_and_clears_strikes)
{
    kvr_status st;
    r = kvr_router_create(&cfg, &st);
    struct kvr_worker_info info = {.id = 1, .block_size = B};
    kvr_router_worker_seen(r, &info, 0);
    uint64_t seq[1] = {9}, unknown[4];
    uint32_t nunknown = 0;
    cr_assert(eq(int, kvr_router_book(r, 1, 1, seq, 1, B, 0, 10), KVR_OK));
    cr_assert(eq(u32, kvr_router_reconcile(r, 1, NULL, 0, 50, 30, unknown, &nunknown, 4), 0),
              "a first strike");
    cr_assert(eq(u32, kvr_router_reconcile(r, 1, NULL, 0, 70, 70, unknown, &nunknown, 4), 0),
              "judgement suspended");
    cr_assert(eq(u32, kvr_router_reconcile(r, 1, NULL, 0, 90, 30, unknown, &nunknown, 4), 0),
              "the strike before was cleared: a first one again");
    cr_assert(eq(u32, kvr_router_reconcile(r, 1, NULL, 0, 110, 30, unknown, &nunknown, 4), 1));
}

/*
 * A routed kv decision under the time model prices only the workers that could win; a select
 * prices them all. On a random fleet (capacities known and not, cached family prefixes, requests
 * in flight at every stage, draining and removed workers, avoided workers), every routed pick has
 * the lowest price a select of the same state finds, and among the workers of that price the
 * fewest cached blocks.
 */
/* Routes on a moving fleet, each decision checked against a select of the same state: with margin
 * 0 the least price and, among equal ones, the fewest cached blocks; with a margin m, a price at
 * most (1 + m) times the least. With decode_weight, two requests in three set max_tokens. */
/* routed_against_select's clock: round id is at id * tick ns */
static uint64_t tick = 1;

static uint64_t routed_against_select(double margin, double decode_weight, uint32_t rounds)
{
    uint64_t picks = 0;
    enum { W = 160, FAMILIES = 6 };
    cfg.cost_model = KVR_COST_TIME;
    cfg.tie_margin = margin;
    cfg.decode_weight = decode_weight;
    cfg.max_prompt_tokens = 64 * B;
    make();
    struct kvr_rng rng;
    kvr_rng_seed(&rng, 11);
    for (uint64_t w = 1; w <= W; w++)
        join(w, w % 5 == 0 ? 0 : 200 + kvr_rng_below(&rng, 4000));
    for (uint64_t w = 1; w <= W; w++) { /* a cached prefix of one or two families */
        for (uint32_t k = 0; k < 1 + (w % 2); k++) {
            uint32_t f = (uint32_t)kvr_rng_below(&rng, FAMILIES), nb = 1 + (uint32_t)(w % 40);
            uint32_t *t = prompt(f, nb * B, 0, 0);
            uint64_t local[48];
            struct kvr_kv_block blocks[48];
            kvr_hash_prompt(t, nb * B, B, local, NULL);
            for (uint32_t i = 0; i < nb; i++)
                blocks[i] = (struct kvr_kv_block){w * 1000 + k * 100 + i, local[i]};
            cr_assert(eq(int, kvr_router_kv_stored(r, w, NULL, blocks, nb), KVR_OK));
            free(t);
        }
    }
    uint32_t routed = 0, ties = 0, above = 0;
    for (uint64_t id = 1; id <= rounds; id++) {
        uint32_t f = (uint32_t)kvr_rng_below(&rng, FAMILIES);
        uint32_t shared = (uint32_t)kvr_rng_below(&rng, 40) * B;
        uint32_t unique = 1 + (uint32_t)kvr_rng_below(&rng, 20 * B);
        uint32_t *t = prompt(f, shared, id, unique);
        struct kvr_request q = {.id = id, .tokens = t, .ntokens = shared + unique, .explain = true};
        if (decode_weight > 0 && id % 3) /* two values, so learn_output's groups fill up */
            q.max_tokens = 700 * (1 + (uint32_t)kvr_rng_below(&rng, 2));
        if (id % 9 == 0)
            q.avoid_worker = 1 + kvr_rng_below(&rng, W);
        struct kvr_decision all, d;
        kvr_status st = kvr_router_select(r, &q, id * tick, &all);
        cr_assert(eq(int, st, KVR_OK));
        double least = INFINITY;
        uint32_t fewest = UINT32_MAX, cheapest = 0;
        for (int pass = 0; pass < 2; pass++) /* the least price, then the fewest cached at it */
            for (uint32_t i = 0; i < all.ncandidates; i++) {
                const struct kvr_candidate *c = &all.candidates[i];
                if (c->busy || (c->worker_id == q.avoid_worker && all.ncandidates > 1))
                    continue;
                if (pass == 0 && c->cost < least)
                    least = c->cost;
                if (pass == 1 && c->cost == least && c->cached_blocks <= fewest) {
                    cheapest += c->cached_blocks == fewest;
                    if (c->cached_blocks < fewest)
                        cheapest = 1;
                    fewest = c->cached_blocks;
                }
            }
        q.explain = false;
        cr_assert(eq(int, kvr_router_route(r, &q, id * tick, &d), KVR_OK));
        picks = picks * 1000003 + d.worker_id;
        cr_assert(not(d.queued));
        cr_assert(d.costs == NULL, "the routed decision priced only some workers");
        const struct kvr_candidate *got = NULL;
        for (uint32_t i = 0; i < all.ncandidates; i++)
            if (all.candidates[i].worker_id == d.worker_id)
                got = &all.candidates[i];
        cr_assert(got != NULL);
        cr_assert(eq(dbl, d.cost, got->cost), "the price a select gives that worker");
        if (margin == 0) {
            cr_assert(eq(dbl, d.cost, least), "request %lu: %g, the least is %g", (unsigned long)id,
                      d.cost, least);
            cr_assert(eq(u32, got->cached_blocks, fewest));
        } else {
            cr_assert(le(dbl, d.cost, least * (1 + margin) * (1 + 1e-9)),
                      "request %lu: %g, within the margin of the least, %g", (unsigned long)id,
                      d.cost, least);
            above += d.cost > least;
        }
        cr_assert(not(got->busy));
        routed++;
        ties += cheapest > 1;
        free(t);
        /* the fleet moves: prefills end, outputs grow, requests end, workers drain and leave */
        uint64_t old = 1 + kvr_rng_below(&rng, id);
        switch (kvr_rng_below(&rng, 4)) {
        case 0:
            kvr_router_prefill_done(r, old, id * tick);
            break;
        case 1:
            for (int k = 0; k < 8; k++)
                kvr_router_output_block(r, old, id * tick);
            break;
        case 2:
            kvr_router_done(r, old);
            break;
        default: /* completed, saying its output: what later ones of its max_tokens are priced at */
            kvr_router_finished(r, old, id * tick, 1 + (uint32_t)(id % 40));
            break;
        }
        if (id % 50 == 0) { /* one drains, one leaves and comes back empty */
            uint64_t w = 1 + kvr_rng_below(&rng, W);
            struct kvr_worker_info info = {
                .id = w, .block_size = B, .capacity_blocks = 1000, .draining = true};
            cr_assert(eq(int, kvr_router_worker_seen(r, &info, id * tick), KVR_OK));
            uint64_t gone = 1 + kvr_rng_below(&rng, W);
            if (gone != w) {
                cr_assert(eq(int, kvr_router_worker_remove(r, gone), KVR_OK));
                join(gone, 800);
            }
        }
    }
    cr_assert(eq(u32, routed, rounds));
    cr_assert(gt(u32, ties, 0), "some picks were among equal prices");
    if (margin > 0)
        cr_assert(gt(u32, above, 0), "some picks were not the least price");
    kvr_router_destroy(r);
    r = NULL;
    return picks;
}

Test(router, a_routed_pick_is_the_cheapest_without_pricing_every_worker)
{
    routed_against_select(0, 0, 700);
}

Test(router, a_routed_pick_pricing_the_own_decode_is_the_cheapest_too)
{
    /* a round every 0.1 s, a window of 2 s: the shares rise and fade, the epoch moves */
    cfg.prefill_window_ns = 2 * NS;
    tick = NS / 10;
    uint64_t stretched = routed_against_select(0, 0.5, 300);
    cfg.prefill_window_ns = 0;
    cr_assert(ne(u64, routed_against_select(0, 0.5, 300), stretched),
              "the prefill share moved some picks");
}

Test(router, a_routed_pick_pricing_the_own_decode_holds_for_a_step_least_inside)
{
    /* a decode step least at half the cache (5 ms) and 10 ms empty: the floor is its vertex */
    cfg.decode_ms[0] = 10;
    cfg.decode_ms[1] = -20;
    cfg.decode_ms[2] = 20;
    cfg.prefill_window_ns = 2 * NS;
    tick = NS / 10;
    routed_against_select(0, 0.5, 300);
}

Test(router, a_routed_pick_with_a_tie_margin_stays_within_it)
{
    routed_against_select(0.1, 0, 700);
}

/* Two routers with the same state and their own seeds, on workers whose prices differ by a hair:
 * how often they pick the same worker for different requests of a burst (*apart: request id
 * against request id + 1000), and for the same request (*same: a resend that reached both). */
static void two_routers(double margin, uint32_t *apart, uint32_t *same)
{
    struct kvr_router *two[2];
    for (int k = 0; k < 2; k++) {
        cfg.cost_model = KVR_COST_TIME;
        cfg.tie_margin = margin;
        cfg.seed = 100 + (uint64_t)k;
        make();
        for (uint64_t w = 1; w <= 8; w++)
            join(w, 16384);
        for (uint64_t w = 1; w <= 8; w++) { /* w caches w blocks: prices a hair apart */
            struct kvr_kv_block blocks[8];
            for (uint64_t i = 0; i < w; i++)
                blocks[i] = (struct kvr_kv_block){w * 100 + i, kvr_mix64(w * 100 + i)};
            cr_assert(eq(int, kvr_router_kv_stored(r, w, NULL, blocks, (uint32_t)w), KVR_OK));
        }
        two[k] = r;
    }
    *apart = *same = 0;
    for (uint64_t id = 1; id <= 40; id++) {
        uint32_t *t = prompt(1000 + (uint32_t)id, 64 * B, id, B);
        struct kvr_request q[2] = {{.id = 5000 + id, .tokens = t, .ntokens = 65 * B},
                                   {.id = 6000 + id, .tokens = t, .ntokens = 65 * B}};
        struct kvr_decision d[3];
        cr_assert(eq(int, kvr_router_select(two[0], &q[0], 0, &d[0]), KVR_OK));
        cr_assert(eq(int, kvr_router_select(two[1], &q[1], 0, &d[1]), KVR_OK));
        cr_assert(eq(int, kvr_router_select(two[1], &q[0], 0, &d[2]), KVR_OK));
        *apart += d[0].worker_id == d[1].worker_id;
        *same += d[0].worker_id == d[2].worker_id;
        free(t);
    }
    kvr_router_destroy(two[0]);
    r = two[1]; /* the teardown's */
}

Test(router, routers_with_a_tie_margin_do_not_all_pick_the_same_worker)
{
    uint32_t apart, same;
    two_routers(0, &apart, &same);
    cr_assert(eq(u32, apart, 40), "the exact minimum: every request to the same worker");
    kvr_router_destroy(r);
    r = NULL;
    two_routers(0.1, &apart, &same);
    cr_assert(lt(u32, apart, 30), "with the margin: the burst spreads (%u of 40 the same)", apart);
    cr_assert(eq(u32, same, 40), "and one request still goes where the other router sends it");
}
