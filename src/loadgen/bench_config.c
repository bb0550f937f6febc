/*
 * kvbench's defaults and option table.
 */
#include "bench_config.h"

#include <stdio.h>
#include <string.h>

#include "../engine/engine.h"
#include "../sim/workload.h"
#include "clock.h"
#include "log.h"

static const char *const mode_names[] = {[KVR_BENCH_LOAD] = "load",
                                         [KVR_BENCH_HOP] = "hop",
                                         [KVR_BENCH_DIGEST] = "digest",
                                         [KVR_BENCH_RESEND] = "resend",
                                         [KVR_BENCH_CANCEL] = "cancel",
                                         [KVR_BENCH_DIRECT] = "direct",
                                         NULL};

void kvr_bench_config_default(struct kvr_bench_config *c)
{
    memset(c, 0, sizeof *c);
    kvr_nats_config_default(&c->net, KVR_LOG_WARN);
    c->mode = KVR_BENCH_LOAD;
    snprintf(c->workload, sizeof c->workload, "seed");
    snprintf(c->policies, sizeof c->policies, "kv,round_robin");
    c->concurrency = 20;
    c->rate_scale = 1.0;
    c->seed = 1;
    struct kvr_engine_config ec; /* the reference fleet: workers of the engine's defaults */
    kvr_engine_config_default(&ec);
    c->num_blocks = ec.num_blocks;
    c->block_size = ec.block_size;
    c->timeout_ns = 600 * KVR_NS_PER_S;
    c->resend_ns = 2 * KVR_NS_PER_S;
    c->hop_window = 256;
    c->hop_ns = 3 * KVR_NS_PER_S;
    c->digest_wait_ns = 300 * KVR_NS_PER_MS;
    c->trials = 200;
    c->cancel_after = 10;
    c->linger_ns = 300 * KVR_NS_PER_MS;
    c->prompt_tokens = 1024;
    c->warmup = 10;
}

#define OPT(opt, kind, where, lo, hi, text)                                                        \
    {                                                                                              \
        .name = opt, .type = kind, .ptr = where, .help = text, .min = lo, .max = hi                \
    }
#define TEXT(opt, where, text) OPT(opt, KVR_OPT_STR, where, 0, 0, text)

/* Append the k options of src to t[n..); the new count. */
static size_t append(struct kvr_opt *t, size_t n, const struct kvr_opt *src, size_t k)
{
    memcpy(t + n, src, k * sizeof *src);
    return n + k;
}

/* Where to connect, what to do, how to log. */
static size_t common_options(struct kvr_bench_config *c, struct kvr_opt *t, size_t n)
{
    n += kvr_nats_config_options(&c->net, t + n);
    const struct kvr_opt o[] = {
        {.name = "mode",
         .type = KVR_OPT_ENUM,
         .ptr = &c->mode,
         .help = "load (replay a workload), hop (NATS-hop cost), digest (do the routers agree?), "
                 "resend (resends answered once?), cancel (how fast a cancel frees the worker) or "
                 "direct (time to first token through the fleet against straight to "
                 "--engine-url)",
         .choices = mode_names},
    };
    return append(t, n, o, sizeof o / sizeof o[0]);
}

/* --mode load: the workload and its report. */
static size_t load_options(struct kvr_bench_config *c, struct kvr_opt *t, size_t n)
{
    const struct kvr_opt o[] = {
        TEXT("workload", c->workload, "seed, seed-isl, seed-osl, burst, conversation, synthetic"),
        TEXT("trace", c->trace, "trace file; none: traces/<workload>_trace.jsonl"),
        OPT("requests", KVR_OPT_U32, &c->requests, 0, 0,
            "requests (0: the workload's default; hop: 2000; direct: 200 rounds)"),
        TEXT("policies", c->policies, "one run per policy, comma-separated"),
        OPT("concurrency", KVR_OPT_U32, &c->concurrency, 1, 1e6,
            "closed-loop clients (resend: trials in flight)"),
        OPT("rate-scale", KVR_OPT_DOUBLE, &c->rate_scale, 1e-6, 1e6,
            "open loop: arrival-rate factor"),
        OPT("max-tokens", KVR_OPT_U32, &c->max_tokens, 0, 0,
            "override every output length (0: the workload's; cancel: 16384; direct: 16)"),
        OPT("seed", KVR_OPT_U64, &c->seed, 0, 0, "workload seed"),
        TEXT("out", c->out, "write report.json, report.md and plots here (direct: report.json)"),
        {.name = "per-request",
         .type = KVR_OPT_BOOL,
         .ptr = &c->per_request,
         .help = "load: also write requests.csv into --out, a line per request answered in each "
                 "run (as kvsim run --per-request)"},
        OPT("workers", KVR_OPT_U32, &c->workers, 0, 0,
            "fleet size, for the hit-rate reference (0: from the workers' heartbeats)"),
        OPT("num-blocks", KVR_OPT_U32, &c->num_blocks, 0, 0, "blocks per worker, likewise"),
        OPT("block-size", KVR_OPT_U32, &c->block_size, 1, UINT32_MAX, "block size, likewise"),
        OPT("timeout-ms", KVR_OPT_MS, &c->timeout_ns, 0, 0, "give up on a run after this long"),
        OPT("resend-ms", KVR_OPT_MS, &c->resend_ns, 0, 0,
            "send a request again when its stream stalls this long: nothing came, nothing new "
            "before its final, or positions missing for half as long (0: never)"),
    };
    return append(t, n, o, sizeof o / sizeof o[0]);
}

/* --mode hop and --mode digest, then the log level. */
static size_t other_options(struct kvr_bench_config *c, struct kvr_opt *t, size_t n)
{
    const struct kvr_opt o[] = {
        OPT("worker-id", KVR_OPT_U64, &c->worker_id, 0, 0,
            "hop: the worker to call directly (0: the first heartbeat's)"),
        OPT("hop-window", KVR_OPT_U32, &c->hop_window, 1, 1e6,
            "hop: requests in flight for max rate"),
        OPT("hop-seconds", KVR_OPT_SEC, &c->hop_ns, 0, 120,
            "hop: how long the max-rate phase (a record of ~200 bytes for each of up to 100,000 "
            "requests a second is held)"),
        OPT("digest-wait-ms", KVR_OPT_MS, &c->digest_wait_ns, 0, 0,
            "digest: how long to collect the routers' answers"),
        OPT("trials", KVR_OPT_U32, &c->trials, 1, 1e6,
            "resend: trials per timing; cancel: requests cancelled"),
        OPT("cancel-after", KVR_OPT_U32, &c->cancel_after, 1, 1e6,
            "cancel: tokens received before the cancel"),
        OPT("linger-ms", KVR_OPT_MS, &c->linger_ns, 0, 0,
            "after the last answer, listen this long for more (double finals, second streams)"),
    };
    return append(t, n, o, sizeof o / sizeof o[0]);
}

/* --mode direct. */
static size_t direct_options(struct kvr_bench_config *c, struct kvr_opt *t, size_t n)
{
    const struct kvr_opt o[] = {
        {.name = "engine-url",
         .type = KVR_OPT_STR,
         .ptr = c->engine,
         .help = "direct: the engine's OpenAI-compatible API, http://host:port (the one "
                 "behind the fleet's kvworker --engine openai)",
         .urls = true},
        OPT("prompt-tokens", KVR_OPT_U32, &c->prompt_tokens, 1, 1e6,
            "direct: prompt length (fresh random tokens for every request)"),
        OPT("warmup", KVR_OPT_U32, &c->warmup, 0, 1e6, "direct: rounds sent first and not counted"),
    };
    return append(t, n, o, sizeof o / sizeof o[0]);
}

#undef TEXT
#undef OPT

/* --policies: names, comma-separated, each one run; 0 or -1 (reported). */
static int parse_policies(struct kvr_bench_config *c)
{
    c->npolicies = 0;
    for (const char *s = c->policies; *s;) {
        size_t len = strcspn(s, ",");
        enum kvr_policy p;
        if (kvr_policy_parse(s, len, &p) != KVR_OK) {
            fprintf(stderr, "kvbench: unknown policy '%.*s'\n", (int)len, s);
            return -1;
        }
        if (c->npolicies == KVR_POLICY_COUNT) {
            fprintf(stderr, "kvbench: --policies lists more than %d runs\n", KVR_POLICY_COUNT);
            return -1;
        }
        c->policy[c->npolicies++] = p;
        s += len + (s[len] == ',');
    }
    if (!c->npolicies)
        fprintf(stderr, "kvbench: --policies names no policy\n");
    return c->npolicies ? 0 : -1;
}

enum kvr_opts_result kvr_bench_config_parse(struct kvr_bench_config *c, int argc, char **argv)
{
    struct kvr_opt t[48];
    size_t n = common_options(c, t, 0);
    n = load_options(c, t, n);
    n = other_options(c, t, n);
    n = direct_options(c, t, n);
    enum kvr_opts_result r = kvr_opts_parse(
        t, n, argc, argv, "kvbench", "Load generator and client-side measurements for kvrouter.");
    if (r != KVR_OPTS_GO)
        return r;
    bool is_trace = false;
    if (!kvr_workload_known(c->workload, &is_trace)) {
        fprintf(stderr, "kvbench: --workload %s is not a workload\n", c->workload);
        return KVR_OPTS_BAD;
    }
    if (parse_policies(c))
        return KVR_OPTS_BAD;
    if (c->per_request && !c->out[0]) {
        fprintf(stderr, "kvbench: --per-request needs --out\n");
        return KVR_OPTS_BAD;
    }
    if (c->mode == KVR_BENCH_DIRECT && !c->engine[0]) {
        fprintf(stderr, "kvbench: --mode direct needs --engine-url http://host:port\n");
        return KVR_OPTS_BAD;
    }
    if (is_trace && !c->trace[0])
        snprintf(c->trace, sizeof c->trace, "traces/%.64s_trace.jsonl", c->workload);
    return KVR_OPTS_GO;
}
