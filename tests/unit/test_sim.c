/* The simulator end to end: a small trace fixture, every policy, determinism, bad traces. */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/sim/sim.h"
#include "../../src/sim/workload.h"

#define FIXTURE KVR_SOURCE_ROOT "/tests/fixtures/conversation_head.jsonl"

/* The simulator's defaults on 4 small engines; the router keeps every request, as kvsim run
 * does. */
static void config(struct kvr_sim_config *c, enum kvr_policy p)
{
    kvr_sim_config_default(c);
    c->workers = 4;
    c->engine.num_blocks = 2048;
    c->router.policy = p;
    c->router.queue_max = 1u << 20;
    c->router.queue_timeout_ns = 3600ull * 1000000000ull;
}

Test(sim, trace_fixture_replays_for_every_policy)
{
    struct kvr_workload w;
    uint64_t bad = 0;
    cr_assert(eq(int, kvr_workload_load_trace(&w, "conversation", FIXTURE, 0, 1, &bad), KVR_OK));
    cr_assert(eq(u32, w.nreqs, 200));
    double ceiling;
    cr_assert(eq(int, kvr_sim_hit_ceiling(&w, 64, 0, &ceiling), KVR_OK));
    cr_assert(gt(dbl, ceiling, 0.05), "the fixture shares prefixes");
    for (int p = 0; p < KVR_POLICY_COUNT; p++) {
        struct kvr_sim_config c;
        config(&c, (enum kvr_policy)p);
        struct kvr_sim_result r;
        cr_assert(eq(int, kvr_sim_run(&w, &c, &r), KVR_OK), "policy %d", p);
        cr_assert(eq(u32, r.finished, 200), "every request finishes (policy %d)", p);
        cr_assert(eq(u32, r.rejected, 0));
        cr_assert(eq(u64, r.router_unknown, 0), "the router knew every event (policy %d)", p);
        cr_assert(gt(dbl, r.ttft_ms.p50, 16.0), "a prefill takes at least 16.5 ms");
        cr_assert(le(dbl, r.ttft_ms.p50, r.ttft_ms.p90));
        cr_assert(le(dbl, r.hit_rate, ceiling + 1e-9), "no router beats one unbounded cache");
        cr_assert(lt(dbl, r.pred_err_rel, 0.5), "predicted load tracks the engines");
        kvr_sim_result_free(&r);
    }
    kvr_workload_free(&w);
}

Test(sim, equal_seeds_equal_results)
{
    struct kvr_workload w;
    cr_assert(eq(int, kvr_workload_generate(&w, "seed", 200, 3), KVR_OK));
    struct kvr_sim_config c;
    config(&c, KVR_POLICY_KV);
    c.concurrency = 8;
    struct kvr_sim_result a, b;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &a), KVR_OK));
    cr_assert(eq(int, kvr_sim_run(&w, &c, &b), KVR_OK));
    cr_assert(eq(u32, a.finished, 200));
    cr_assert(eq(dbl, a.ttft_ms.mean, b.ttft_ms.mean));
    cr_assert(eq(dbl, a.itl_ms.p99, b.itl_ms.p99));
    cr_assert(eq(int, memcmp(a.ttft_sorted, b.ttft_sorted, 200 * sizeof(double)), 0));
    kvr_sim_result_free(&a);
    kvr_sim_result_free(&b);
    kvr_workload_free(&w);
}

/* Each record's TTFT, times, tokens and worker agree with the run's summary figures. */
static void check_records(const struct kvr_workload *w, const struct kvr_sim_result *r,
                          uint32_t workers)
{
    double ttft = 0, e2e = 0, itl_max = 0;
    uint64_t cached = 0, isl = 0;
    uint32_t per_worker[16] = {0}, most = 0;
    cr_assert(le(u32, workers, 16));
    bool *seen = calloc(w->nreqs, sizeof *seen);
    cr_assert(not(eq(ptr, seen, NULL)));
    for (uint32_t i = 0; i < r->finished; i++) {
        const struct kvr_sim_request *q = &r->per_request[i];
        cr_assert(lt(u32, q->index, w->nreqs));
        cr_assert(not(seen[q->index]), "request %u recorded twice", q->index);
        seen[q->index] = true;
        cr_assert(lt(u32, q->worker, workers));
        per_worker[q->worker]++;
        most = per_worker[q->worker] > most ? per_worker[q->worker] : most;
        cr_assert(eq(u32, q->isl, w->reqs[q->index].isl));
        cr_assert(eq(u32, q->osl, w->reqs[q->index].osl));
        cr_assert(le(dbl, q->queue_ms, q->ttft_ms));
        cr_assert(le(dbl, q->ttft_ms, q->e2e_ms));
        cr_assert(le(dbl, q->itl_mean_ms, q->itl_max_ms * (1 + 1e-12))); /* equal gaps round */
        cr_assert(le(u32, q->cached_tokens, q->isl));
        ttft += q->ttft_ms;
        e2e += q->e2e_ms;
        itl_max = q->itl_max_ms > itl_max ? q->itl_max_ms : itl_max;
        cached += q->cached_tokens;
        isl += q->isl;
    }
    free(seen);
    cr_assert(ieee_ulp_eq(dbl, ttft / r->finished, r->ttft_ms.mean, 64));
    cr_assert(ieee_ulp_eq(dbl, e2e / r->finished, r->e2e_ms.mean, 64));
    cr_assert(eq(dbl, itl_max, r->itl_ms.max), "the largest gap is some request's");
    cr_assert(eq(dbl, (double)cached / (double)isl, r->hit_rate));
    cr_assert(eq(dbl, most / ((double)r->finished / workers), r->imbalance), "workers as counted");
}

Test(sim, per_request_records_add_up_to_the_summary)
{
    struct kvr_workload w;
    uint64_t bad = 0;
    cr_assert(eq(int, kvr_workload_load_trace(&w, "conversation", FIXTURE, 0, 1, &bad), KVR_OK));
    struct kvr_sim_config c;
    config(&c, KVR_POLICY_KV);
    struct kvr_sim_result off, on;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &off), KVR_OK));
    cr_assert(eq(ptr, off.per_request, NULL), "no records unless asked");
    c.per_request = true;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &on), KVR_OK));
    cr_assert(not(eq(ptr, on.per_request, NULL)));
    cr_assert(eq(u32, on.finished, 200));
    cr_assert(eq(dbl, on.ttft_ms.p90, off.ttft_ms.p90), "recording changes nothing");
    check_records(&w, &on, c.workers);
    for (uint32_t i = 0; i < on.finished; i++) { /* a trace's group: its first hash id */
        const struct kvr_sim_request *q = &on.per_request[i];
        const struct kvr_wl_request *wr = &w.reqs[q->index];
        cr_assert(eq(u64, q->group, wr->nids ? w.ids[wr->family] : KVR_SIM_NO_GROUP));
    }
    kvr_sim_result_free(&off);
    kvr_sim_result_free(&on);
    kvr_workload_free(&w);
}

/* Closed loop, one worker kept busy, a short queue timeout: the router rejects requests from its
 * queue inside later calls into it. The next client's request then arrives as an event (a
 * callback must not call back into the router, which reused the scratch of the call in progress);
 * every request is resolved, and two runs agree. */
Test(sim, requests_rejected_inside_a_router_call_are_resolved)
{
    struct kvr_workload w;
    cr_assert(eq(int, kvr_workload_generate(&w, "seed", 120, 3), KVR_OK));
    struct kvr_sim_config c;
    config(&c, KVR_POLICY_KV);
    c.workers = 1;
    c.concurrency = 16;
    c.router.busy_threshold = 0.01; /* busy with its first request */
    c.router.queue_max = 4;
    c.router.queue_timeout_ns = 1000000; /* 1 ms */
    c.per_request = true;
    struct kvr_sim_result a, b;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &a), KVR_OK));
    cr_assert(eq(int, kvr_sim_run(&w, &c, &b), KVR_OK));
    cr_assert(gt(u32, a.rejected, 0), "some were rejected");
    cr_assert(gt(u32, a.finished, 0));
    cr_assert(eq(u32, a.finished + a.rejected, 120), "every request resolved");
    cr_assert(eq(u32, b.rejected, a.rejected));
    cr_assert(eq(dbl, b.ttft_ms.mean, a.ttft_ms.mean));
    for (uint32_t i = 0; i < a.finished; i++) /* each prompt was its own */
        cr_assert(eq(u32, a.per_request[i].isl, w.reqs[a.per_request[i].index].isl));
    kvr_sim_result_free(&a);
    kvr_sim_result_free(&b);
    kvr_workload_free(&w);
}

Test(sim, itl_quantiles_are_order_statistics_of_the_gaps)
{
    struct kvr_workload w;
    cr_assert(eq(int, kvr_workload_generate(&w, "seed", 1, 3), KVR_OK));
    w.reqs[0].osl = 50; /* 49 gaps: the 0.99 quantile, v[floor(0.99 * 48)], is the largest */
    struct kvr_sim_config c;
    config(&c, KVR_POLICY_KV);
    struct kvr_sim_result r;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &r), KVR_OK));
    cr_assert(eq(u32, r.finished, 1));
    cr_assert(gt(dbl, r.itl_ms.p50, 0.0));
    cr_assert(le(dbl, r.itl_ms.p50, r.itl_ms.p99));
    cr_assert(eq(dbl, r.itl_ms.p99, r.itl_ms.max), "a sample value, not a histogram bucket's");
    kvr_sim_result_free(&r);
    kvr_workload_free(&w);
}

Test(sim, kv_reuses_more_cache_than_random_on_the_fixture)
{
    struct kvr_workload w;
    cr_assert(eq(int, kvr_workload_load_trace(&w, "conversation", FIXTURE, 0, 1, NULL), KVR_OK));
    struct kvr_sim_config c;
    struct kvr_sim_result kv, rnd;
    /* the engines' default pool (16,384 blocks): with config()'s 2,048 a conversation's earlier
     * turns are evicted before its next turn comes, and every policy hits the same 3.6 % */
    config(&c, KVR_POLICY_KV);
    c.engine.num_blocks = 16384;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &kv), KVR_OK));
    config(&c, KVR_POLICY_RANDOM);
    c.engine.num_blocks = 16384;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &rnd), KVR_OK));
    cr_assert(gt(dbl, kv.hit_rate, rnd.hit_rate), "kv %f random %f", kv.hit_rate, rnd.hit_rate);
    kvr_sim_result_free(&kv);
    kvr_sim_result_free(&rnd);
    kvr_workload_free(&w);
}

/* A new trace file from the template path ("/tmp/kvr_trace_XXXXXX"), open for writing. */
static FILE *open_trace(char *path)
{
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    cr_assert(not(eq(ptr, f, NULL)));
    return f;
}

/* A new trace file from the template path holding text. */
static void new_trace(char *path, const char *text)
{
    FILE *f = open_trace(path);
    fputs(text, f);
    fclose(f);
}

Test(sim, malformed_traces_are_refused_with_the_line)
{
    char path[] = "/tmp/kvr_trace_XXXXXX";
    FILE *f = open_trace(path);
    fprintf(f, "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": "
               "[1, 2]}\n");
    fprintf(f, "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": "
               "[1]}\n"); /* 600 tokens need 2 ids */
    fclose(f);
    struct kvr_workload w;
    uint64_t bad = 0;
    cr_assert(eq(int, kvr_workload_load_trace(&w, "t", path, 0, 1, &bad), KVR_ERR_MALFORMED));
    cr_assert(eq(u64, bad, 2));
    f = fopen(path, "w");
    fprintf(f, "not json\n");
    fclose(f);
    cr_assert(eq(int, kvr_workload_load_trace(&w, "t", path, 0, 1, &bad), KVR_ERR_MALFORMED));
    cr_assert(eq(u64, bad, 1));
    f = fopen(path, "w"); /* a timestamp whose nanoseconds wrap */
    fprintf(f, "{\"timestamp\": 18446744073709551, \"input_length\": 600, \"output_length\": 5, "
               "\"hash_ids\": [1, 2]}\n");
    fclose(f);
    cr_assert(eq(int, kvr_workload_load_trace(&w, "t", path, 0, 1, &bad), KVR_ERR_MALFORMED));
    cr_assert(eq(u64, bad, 1));
    remove(path);
    cr_assert(eq(int, kvr_workload_load_trace(&w, "t", "/nonexistent/x", 0, 1, &bad), KVR_ERR_IO));
}

/* A timestamp's fraction of a millisecond is kept (it was cut: 900.9 ms arrived at 900), and a
 * length with a fraction is no length. */
Test(sim, trace_timestamps_keep_their_fraction)
{
    char path[] = "/tmp/kvr_trace_XXXXXX";
    new_trace(path, "{\"timestamp\": 0.4, \"input_length\": 600, \"output_length\": 5, "
                    "\"hash_ids\": [1, 2]}\n{\"timestamp\": 900.9, \"input_length\": 600, "
                    "\"output_length\": 5, \"hash_ids\": [1, 3]}\n");
    struct kvr_workload w;
    uint64_t bad = 0;
    cr_assert(eq(int, kvr_workload_load_trace(&w, "t", path, 0, 1, &bad), KVR_OK));
    cr_assert(eq(u64, w.reqs[1].arrival_ns - w.reqs[0].arrival_ns, 900500000));
    kvr_workload_free(&w);
    FILE *f = fopen(path, "w");
    fputs(
        "{\"timestamp\": 0, \"input_length\": 600.5, \"output_length\": 5, \"hash_ids\": [1, 2]}\n",
        f);
    fclose(f);
    cr_assert(eq(int, kvr_workload_load_trace(&w, "t", path, 0, 1, &bad), KVR_ERR_MALFORMED));
    remove(path);
}

Test(sim, trace_tokens_follow_hash_ids)
{
    struct kvr_workload w;
    cr_assert(eq(int, kvr_workload_load_trace(&w, "conversation", FIXTURE, 2, 1, NULL), KVR_OK));
    /* the fixture's first two requests both start with hash id 0 */
    cr_assert(ge(u32, w.reqs[0].isl, 1024));
    cr_assert(ge(u32, w.reqs[1].isl, 1024));
    uint32_t *a = malloc(w.reqs[0].isl * sizeof *a), *b = malloc(w.reqs[1].isl * sizeof *b);
    kvr_workload_tokens(&w, 0, a);
    kvr_workload_tokens(&w, 1, b);
    cr_assert(eq(int, memcmp(a, b, 512 * sizeof *a), 0), "equal ids, equal tokens");
    cr_assert(ne(int, memcmp(a + 512, b + 512, 512 * sizeof *a), 0), "other ids differ");
    free(a);
    free(b);
    kvr_workload_free(&w);
}

/* --- router replicas ---------------------------------------------------------------------- */

/*
 * The fixture with its arrivals spread over the trace's 3 s timestamp step (ten requests share
 * each timestamp otherwise), 8 workers, kv, and n replicas.
 */
static void replica_setup(struct kvr_workload *w, struct kvr_sim_config *c, uint32_t n, bool gossip)
{
    cr_assert(eq(int, kvr_workload_load_trace(w, "conversation", FIXTURE, 0, 1, NULL), KVR_OK));
    kvr_workload_spread(w, 3000ull * 1000000);
    kvr_sim_config_default(c);
    c->router.queue_max = 1u << 20;
    c->router.queue_timeout_ns = 3600ull * 1000000000ull;
    c->replicas = n;
    c->gossip = gossip;
}

static struct kvr_sim_result replica_run(uint32_t n, bool gossip, uint64_t delay_ns)
{
    struct kvr_workload w;
    struct kvr_sim_config c;
    replica_setup(&w, &c, n, gossip);
    c.gossip_delay_ns = delay_ns;
    struct kvr_sim_result r;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &r), KVR_OK), "%u replicas", n);
    cr_assert(eq(u32, r.finished, 200), "every request finishes (%u replicas)", n);
    cr_assert(eq(u32, r.replicas, n ? n : 1));
    cr_assert(eq(u64, r.decisions, 200), "each request is booked once");
    cr_assert(eq(u64, r.router_unknown, 0), "no replica saw an event it could not place");
    kvr_workload_free(&w);
    return r;
}

Test(sim, one_replica_is_the_single_router)
{
    struct kvr_sim_result zero = replica_run(0, false, 1000000);
    struct kvr_sim_result one = replica_run(1, true, 1000000);
    cr_assert(eq(int, memcmp(zero.ttft_sorted, one.ttft_sorted, 200 * sizeof(double)), 0));
    cr_assert(eq(dbl, zero.pred_err_rel, one.pred_err_rel));
    cr_assert(not(one.gossip), "one router has nobody to gossip with");
    cr_assert(eq(u64, one.gossip_msgs + one.gossip_bytes + one.early_events, 0));
    kvr_sim_result_free(&zero);
    kvr_sim_result_free(&one);
}

Test(sim, four_replicas_with_gossip_match_one_router)
{
    struct kvr_sim_result one = replica_run(1, true, 1000000);
    struct kvr_sim_result four = replica_run(4, true, 1000000);
    cr_assert(four.gossip);
    cr_assert(ge(dbl, four.hit_rate, 0.95 * one.hit_rate), "hit %f against %f", four.hit_rate,
              one.hit_rate);
    cr_assert(le(dbl, four.ttft_ms.p90, 1.1 * one.ttft_ms.p90), "TTFT p90 %f against %f",
              four.ttft_ms.p90, one.ttft_ms.p90);
    cr_assert(le(dbl, four.pred_err_rel_worst, one.pred_err_rel + 0.02),
              "every replica predicts as well as one router: %f against %f",
              four.pred_err_rel_worst, one.pred_err_rel);
    cr_assert(eq(u64, four.gossip_msgs, 200), "one message per decision");
    cr_assert(eq(u64, four.gossip_imports, 3 * 200), "every peer imports each");
    cr_assert(eq(u64, four.late_decisions, 0));
    /* about 9.5 bytes per block hash and ~140 bytes of the rest (sim_gossip.c) */
    uint64_t blocks = 0;
    struct kvr_workload w;
    cr_assert(eq(int, kvr_workload_load_trace(&w, "conversation", FIXTURE, 0, 1, NULL), KVR_OK));
    for (uint32_t i = 0; i < w.nreqs; i++)
        blocks += w.reqs[i].isl / 64;
    kvr_workload_free(&w);
    cr_assert(ge(u64, four.gossip_bytes, 9 * blocks + 125 * 200), "bytes %llu for %llu blocks",
              (unsigned long long)four.gossip_bytes, (unsigned long long)blocks);
    cr_assert(le(u64, four.gossip_bytes, 10 * blocks + 155 * 200));
    kvr_sim_result_free(&one);
    kvr_sim_result_free(&four);
}

Test(sim, replicas_without_gossip_mispredict_load)
{
    struct kvr_sim_result on = replica_run(4, true, 1000000);
    struct kvr_sim_result off = replica_run(4, false, 1000000);
    cr_assert(not(off.gossip));
    cr_assert(eq(u64, off.gossip_msgs + off.gossip_bytes + off.gossip_imports, 0));
    cr_assert(gt(dbl, off.pred_err_rel, 0.3), "each replica sees a quarter of the load: %f",
              off.pred_err_rel);
    cr_assert(gt(dbl, off.pred_err_rel, 4 * on.pred_err_rel), "%f against %f with gossip",
              off.pred_err_rel, on.pred_err_rel);
    cr_assert(gt(u64, off.early_events, 0), "events for the other replicas' requests");
    cr_assert(gt(dbl, off.ttft_ms.p90, on.ttft_ms.p90), "the loss shows in TTFT");
    kvr_sim_result_free(&on);
    kvr_sim_result_free(&off);
}

Test(sim, replica_runs_are_deterministic)
{
    struct kvr_sim_result a = replica_run(4, true, 1000000);
    struct kvr_sim_result b = replica_run(4, true, 1000000);
    cr_assert(eq(int, memcmp(a.ttft_sorted, b.ttft_sorted, 200 * sizeof(double)), 0));
    cr_assert(eq(u64, a.gossip_bytes, b.gossip_bytes));
    cr_assert(eq(dbl, a.pred_err_rel, b.pred_err_rel));
    cr_assert(eq(dbl, a.pred_err_rel_worst, b.pred_err_rel_worst));
    kvr_sim_result_free(&a);
    kvr_sim_result_free(&b);
}

Test(sim, gossip_slower_than_requests_is_refused_not_kept)
{
    /* 30 s of gossip delay: most requests are done before their peers hear of them */
    struct kvr_sim_result slow = replica_run(2, true, 30000000000ull);
    struct kvr_sim_result off = replica_run(2, false, 1000000);
    cr_assert(gt(u64, slow.late_decisions, 100), "the done's tombstone refuses the decision");
    cr_assert(le(u64, slow.gossip_imports + slow.late_decisions, slow.gossip_msgs),
              "a decision is imported or refused (or still on its way when the run ends)");
    cr_assert(lt(dbl, slow.pred_err_rel, off.pred_err_rel + 0.25),
              "no finished request lingers in a replica: %f against %f without gossip",
              slow.pred_err_rel, off.pred_err_rel);
    kvr_sim_result_free(&slow);
    kvr_sim_result_free(&off);
}

Test(sim, bad_replica_counts_are_refused)
{
    struct kvr_workload w;
    struct kvr_sim_config c;
    replica_setup(&w, &c, KVR_SIM_MAX_REPLICAS + 1, true);
    struct kvr_sim_result r;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &r), KVR_ERR_INVALID));
    kvr_workload_free(&w);
}

Test(sim, spread_keeps_arrivals_sorted_and_within_the_step)
{
    struct kvr_workload w, orig;
    cr_assert(eq(int, kvr_workload_load_trace(&w, "conversation", FIXTURE, 0, 1, NULL), KVR_OK));
    cr_assert(eq(int, kvr_workload_load_trace(&orig, "conversation", FIXTURE, 0, 1, NULL), KVR_OK));
    uint64_t step = 3000ull * 1000000;
    kvr_workload_spread(&w, step);
    uint32_t moved = 0;
    for (uint32_t i = 0; i < w.nreqs; i++) {
        if (i)
            cr_assert(le(u64, w.reqs[i - 1].arrival_ns, w.reqs[i].arrival_ns));
        moved += w.reqs[i].arrival_ns % step != 0;
    }
    cr_assert(gt(u32, moved, 150), "arrivals leave their timestamps");
    cr_assert(ge(u64, w.reqs[0].arrival_ns, orig.reqs[0].arrival_ns));
    cr_assert(lt(u64, w.reqs[w.nreqs - 1].arrival_ns, orig.reqs[w.nreqs - 1].arrival_ns + step));
    kvr_workload_free(&w);
    kvr_workload_free(&orig);
}

/* Approximate mode withholds the engines' KV events: the router applies none (and drops none: none
 * reach it), learns from its decisions alone, and every request still finishes. */
Test(sim, approximate_runs_deliver_no_kv_events)
{
    struct kvr_workload w;
    uint64_t bad = 0;
    cr_assert(eq(int, kvr_workload_load_trace(&w, "conversation", FIXTURE, 0, 1, &bad), KVR_OK));
    struct kvr_sim_config c;
    config(&c, KVR_POLICY_KV);
    struct kvr_sim_result ev, ap;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &ev), KVR_OK));
    cr_assert(gt(u64, ev.kv_applied, 0), "event mode: the engines' blocks reach the index");
    cr_assert(eq(u64, ev.kv_ignored, 0));
    c.router.approximate = true;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &ap), KVR_OK));
    cr_assert(eq(u64, ap.kv_applied, 0), "approximate: no KV event applied");
    cr_assert(eq(u64, ap.kv_ignored, 0), "... none even delivered");
    cr_assert(eq(u32, ap.finished, 200), "lifecycle events still flow");
    cr_assert(eq(u64, ap.router_unknown, 0));
    cr_assert(gt(dbl, ap.hit_rate, 0.0), "the router still finds cache from its own decisions");
    cr_assert(gt(u64, ap.index_entries_max, 0));
    kvr_sim_result_free(&ev);
    kvr_sim_result_free(&ap);
    kvr_workload_free(&w);
}

/* The index's bound and its pruning reach the result: a bound below what the engines hold prunes
 * live entries, the fleet's bound (4 x 2,048 blocks, under the floor) prunes none. */
Test(sim, pruning_of_live_entries_is_reported)
{
    struct kvr_workload w;
    uint64_t bad = 0;
    cr_assert(eq(int, kvr_workload_load_trace(&w, "conversation", FIXTURE, 0, 1, &bad), KVR_OK));
    struct kvr_sim_config c;
    config(&c, KVR_POLICY_KV);
    struct kvr_sim_result r;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &r), KVR_OK));
    cr_assert(eq(u32, r.index_bound, 1u << 20), "from the fleet: the floor");
    cr_assert(eq(u64, r.index_pruned, 0));
    kvr_sim_result_free(&r);
    c.router.index_max_entries = 1000;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &r), KVR_OK));
    cr_assert(eq(u32, r.index_bound, 1000));
    cr_assert(gt(u64, r.index_pruned_live, 0), "the engines held more than 1,000 blocks");
    cr_assert(eq(u64, r.index_pruned, r.index_pruned_live), "event mode: every entry is live");
    cr_assert(le(u64, r.index_entries_max, 1000));
    kvr_sim_result_free(&r);
    kvr_workload_free(&w);
}

/* --- requests that can never finish, and runs that can go no further ----------------------- */

/* seed's requests on engines of 64 blocks of 64 tokens: every other one's prompt cut to 1,000
 * tokens (18 blocks with its output), the others keep 7,000 (111 blocks: more than the pool). */
static void unfit_setup(struct kvr_workload *w, struct kvr_sim_config *c, uint32_t n)
{
    cr_assert(eq(int, kvr_workload_generate(w, "seed", n, 3), KVR_OK));
    for (uint32_t i = 0; i < n; i += 2)
        w->reqs[i].isl = 1000;
    config(c, KVR_POLICY_KV);
    c->engine.num_blocks = 64;
    c->concurrency = 4;
}

/* The worker refuses them before its engine sees them (kvworker's ERR_FULL): counted as failed,
 * with the largest need, and the run ends; without the check the engine preempted them for ever. */
Test(sim, requests_too_large_for_an_engine_fail_and_the_run_ends, .timeout = 60)
{
    struct kvr_workload w;
    struct kvr_sim_config c;
    unfit_setup(&w, &c, 20);
    struct kvr_sim_result r;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &r), KVR_OK));
    cr_assert(eq(u32, r.finished, 10));
    cr_assert(eq(u32, r.failed, 10));
    cr_assert(eq(u32, r.rejected, 0));
    cr_assert(eq(u64, r.failed_blocks, (7000 + 100 + 63) / 64), "prompt and output, in blocks");
    cr_assert(eq(u64, r.router_unknown, 0), "the router heard of each refusal as a done");
    kvr_sim_result_free(&r);
    /* the same requests queued by the router first: refused as it places them, inside its call */
    c.workers = 1;
    c.router.busy_threshold = 0.01;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &r), KVR_OK));
    cr_assert(eq(u32, r.finished + r.failed, 20));
    cr_assert(eq(u32, r.failed, 10));
    kvr_sim_result_free(&r);
    kvr_workload_free(&w);
}

/* An open-loop trace record over the pool (1,048,000 prompt tokens and 1,000 output at the
 * default engine), with a small request after it: the small one finishes, the large one fails. */
Test(sim, a_trace_record_over_the_default_pool_fails, .timeout = 60)
{
    char path[] = "/tmp/kvr_trace_XXXXXX";
    FILE *f = open_trace(path);
    fprintf(f, "{\"timestamp\": 0, \"input_length\": 1048000, \"output_length\": 1000, "
               "\"hash_ids\": [");
    for (int i = 0; i < 2047; i++)
        fprintf(f, "%s%d", i ? ", " : "", i);
    fprintf(f, "]}\n{\"timestamp\": 1000, \"input_length\": 600, \"output_length\": 10, "
               "\"hash_ids\": [5000, 5001]}\n");
    fclose(f);
    struct kvr_workload w;
    cr_assert(eq(int, kvr_workload_load_trace(&w, "t", path, 0, 1, NULL), KVR_OK));
    remove(path);
    struct kvr_sim_config c;
    config(&c, KVR_POLICY_KV);
    c.engine.num_blocks = 16384;
    struct kvr_sim_result r;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &r), KVR_OK));
    cr_assert(eq(u32, r.finished, 1));
    cr_assert(eq(u32, r.failed, 1));
    cr_assert(eq(u64, r.failed_blocks, (1048000 + 1000 + 63) / 64));
    kvr_sim_result_free(&r);
    kvr_workload_free(&w);
}

/*
 * A request whose first chunk fits but the engine would never admit: the first one leaves 98
 * blocks of its prompt cached in a pool of 100; the second shares them and needs two more blocks,
 * but admission keeps the watermark (1 block) free beyond the cached hits it takes. The
 * worker's check (and kvsim's) once counted the watermark with the first chunk only, let it
 * through, and the run never ended (then, with the heartbeats stopped, ended unresolved); it now
 * counts it beside the whole request: refused, the run ends.
 */
Test(sim, a_request_its_engine_could_not_admit_again_is_refused, .timeout = 60)
{
    struct kvr_workload w;
    cr_assert(eq(int, kvr_workload_generate(&w, "seed", 2, 3), KVR_OK));
    for (uint32_t i = 0; i < 2; i++) {
        w.reqs[i].family = 0;
        w.reqs[i].prefix = 1600;
    }
    w.reqs[0].isl = 1583; /* 98 full blocks of 16 cached after it, 99 blocks with its output */
    w.reqs[0].osl = 1;
    w.reqs[1].isl = 1585;
    w.reqs[1].osl = 1;
    struct kvr_sim_config c;
    config(&c, KVR_POLICY_KV);
    c.workers = 1;
    c.concurrency = 1;
    c.engine.block_size = c.router.block_size = 16;
    c.engine.num_blocks = 100;
    c.engine.max_batched_tokens = 512;
    struct kvr_sim_result r;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &r), KVR_OK));
    cr_assert(eq(u32, r.requests, 2));
    cr_assert(eq(u32, r.finished, 1), "the first finished");
    cr_assert(eq(u32, r.failed, 1), "the second refused");
    cr_assert(eq(u64, r.failed_blocks, 100), "of a pool of 100 less its watermark");
    kvr_sim_result_free(&r);
    kvr_workload_free(&w);
}

/* --- the per-request ITL -------------------------------------------------------------------- */

/* Each request's mean gap, averaged over requests (those of two tokens or more): the figure the
 * engine reports per request, beside the pooled mean of every gap (where long outputs weigh
 * more). */
Test(sim, itl_per_request_is_the_mean_of_each_requests_mean_gap)
{
    struct kvr_workload w;
    cr_assert(eq(int, kvr_workload_load_trace(&w, "conversation", FIXTURE, 0, 1, NULL), KVR_OK));
    struct kvr_sim_config c;
    config(&c, KVR_POLICY_KV);
    c.per_request = true;
    struct kvr_sim_result r;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &r), KVR_OK));
    double sum = 0, gaps = 0, weighted = 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < r.finished; i++) {
        const struct kvr_sim_request *q = &r.per_request[i];
        if (q->osl < 2)
            continue;
        sum += q->itl_mean_ms;
        weighted += q->itl_mean_ms * (q->osl - 1);
        gaps += q->osl - 1;
        n++;
    }
    cr_assert(gt(u32, n, 100));
    cr_assert(ieee_ulp_eq(dbl, r.itl_request_ms.mean, sum / n, 64), "%f against %f",
              r.itl_request_ms.mean, sum / n);
    cr_assert(ieee_ulp_eq(dbl, r.itl_ms.mean, weighted / gaps, 4096), "the pooled mean: %f, %f",
              r.itl_ms.mean, weighted / gaps);
    cr_assert(gt(dbl, fabs(r.itl_request_ms.mean - r.itl_ms.mean), 0.01), "two definitions");
    cr_assert(le(dbl, r.itl_request_ms.p50, r.itl_request_ms.p99));
    kvr_sim_result_free(&r);
    kvr_workload_free(&w);
}

/* --- trace bounds ------------------------------------------------------------------------- */

/* Unix-time timestamps (ms): the first request arrives at 0, the rest as far after it as in the
 * trace (and not 55 years of empty time later); the same for a trace not in order. */
Test(sim, trace_arrivals_start_at_the_first_request)
{
    char path[] = "/tmp/kvr_trace_XXXXXX";
    new_trace(path, "{\"timestamp\": 1733570002000, \"input_length\": 600, \"output_length\": 5, "
                    "\"hash_ids\": [1, 2]}\n"
                    "{\"timestamp\": 1733570000000, \"input_length\": 600, \"output_length\": 5, "
                    "\"hash_ids\": [3, 4]}\n"
                    "{\"timestamp\": 1733570000500, \"input_length\": 600, \"output_length\": 5, "
                    "\"hash_ids\": [1, 5]}\n");
    struct kvr_workload w;
    cr_assert(eq(int, kvr_workload_load_trace(&w, "t", path, 0, 1, NULL), KVR_OK));
    remove(path);
    cr_assert(eq(u64, w.reqs[0].arrival_ns, 2000000000ull));
    cr_assert(eq(u64, w.reqs[1].arrival_ns, 0));
    cr_assert(eq(u64, w.reqs[2].arrival_ns, 500000000ull));
    struct kvr_sim_config c;
    config(&c, KVR_POLICY_KV);
    struct kvr_sim_result r;
    cr_assert(eq(int, kvr_sim_run(&w, &c, &r), KVR_OK));
    cr_assert(eq(u32, r.finished, 3));
    cr_assert(lt(dbl, r.makespan_s, 3.0), "seconds, not decades: %f s", r.makespan_s);
    kvr_sim_result_free(&r);
    kvr_workload_free(&w);
}

/* An output_length over --max-tokens' bound (1e6) is refused, naming its line; the bound itself
 * is taken. */
Test(sim, trace_output_lengths_over_the_bound_are_refused)
{
    char path[] = "/tmp/kvr_trace_XXXXXX";
    new_trace(path, "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 1000000, "
                    "\"hash_ids\": [1, 2]}\n"
                    "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 4294967295, "
                    "\"hash_ids\": [1, 2]}\n");
    struct kvr_workload w;
    uint64_t bad = 0;
    cr_assert(
        eq(int, kvr_workload_load_trace(&w, "t", path, 0, 1, &bad), KVR_ERR_MAX_TOKENS_TOO_LARGE));
    cr_assert(eq(u64, bad, 2));
    cr_assert(eq(int, kvr_workload_load_trace(&w, "t", path, 1, 1, &bad), KVR_OK), "1e6 is taken");
    cr_assert(eq(u32, w.reqs[0].osl, KVR_WL_MAX_OUTPUT));
    kvr_workload_free(&w);
    remove(path);
}
