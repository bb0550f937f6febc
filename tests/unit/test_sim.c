/* The simulator end to end: a small trace fixture, every policy, determinism, bad traces. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/sim/sim.h"
#include "../../src/sim/workload.h"

#define FIXTURE KVR_SOURCE_ROOT "/tests/fixtures/conversation_head.jsonl"

static void config(struct kvr_sim_config *c, enum kvr_policy p)
{
    memset(c, 0, sizeof *c);
    c->workers = 4;
    kvr_engine_config_default(&c->engine);
    c->engine.num_blocks = 2048;
    kvr_router_config_default(&c->router);
    c->router.policy = p;
    c->router.queue_max = 1u << 20;
    c->router.queue_timeout_ns = 3600ull * 1000000000ull;
    c->event_delay_ns = 1000000;
    c->heartbeat_ns = 100000000;
    c->rate_scale = 1.0;
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

Test(sim, kv_reuses_more_cache_than_random_on_the_fixture)
{
    struct kvr_workload w;
    cr_assert(eq(int, kvr_workload_load_trace(&w, "conversation", FIXTURE, 0, 1, NULL), KVR_OK));
    struct kvr_sim_config c;
    struct kvr_sim_result kv, rnd;
    config(&c, KVR_POLICY_KV);
    cr_assert(eq(int, kvr_sim_run(&w, &c, &kv), KVR_OK));
    config(&c, KVR_POLICY_RANDOM);
    cr_assert(eq(int, kvr_sim_run(&w, &c, &rnd), KVR_OK));
    cr_assert(gt(dbl, kv.hit_rate, rnd.hit_rate), "kv %f random %f", kv.hit_rate, rnd.hit_rate);
    kvr_sim_result_free(&kv);
    kvr_sim_result_free(&rnd);
    kvr_workload_free(&w);
}

Test(sim, malformed_traces_are_refused_with_the_line)
{
    char path[] = "/tmp/kvr_trace_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
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
    remove(path);
    cr_assert(eq(int, kvr_workload_load_trace(&w, "t", "/nonexistent/x", 0, 1, &bad), KVR_ERR_IO));
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
