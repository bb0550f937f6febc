/*
 * kvsim run's option table and list parsing.
 */
#include "run_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "workload.h"

_Static_assert(sizeof(enum kvr_cost_model) == sizeof(int), "KVR_OPT_ENUM writes an int");

static const char *const cost_names[] = {
    [KVR_COST_BLOCKS] = "blocks", [KVR_COST_TIME] = "time", [KVR_COST_TIME + 1] = NULL};
static const char *const gossip_names[] = {"on", "off", "both", NULL};

void kvr_run_config_default(struct kvr_run_config *c)
{
    memset(c, 0, sizeof *c);
    kvr_sim_config_default(&c->sim);
    c->sim.router.queue_max = 1u << 20;                           /* the simulator loses no */
    c->sim.router.queue_timeout_ns = 24ull * 3600 * KVR_NS_PER_S; /* request: waits count in TTFT */
    snprintf(c->out, sizeof c->out, "kvsim-out");
    snprintf(c->policies, sizeof c->policies, "kv,random,round_robin");
}

#define OPT(opt, kind, where, lo, hi, text)                                                        \
    {                                                                                              \
        .name = opt, .type = kind, .ptr = where, .help = text, .min = lo, .max = hi                \
    }
#define TEXT(opt, where, text) OPT(opt, KVR_OPT_STR, where, 0, 0, text)
#define FLAG(opt, where, text) OPT(opt, KVR_OPT_BOOL, where, 0, 0, text)

/* Append the k options of src to t[n..); the new count. */
static size_t append(struct kvr_opt *t, size_t n, const struct kvr_opt *src, size_t k)
{
    memcpy(t + n, src, k * sizeof *src);
    return n + k;
}

static size_t run_options(struct kvr_run_config *c, struct kvr_opt *t, size_t n)
{
    struct kvr_sim_config *s = &c->sim;
    const struct kvr_opt o[] = {
        TEXT("workload", c->workload,
             "seed, seed-isl, seed-osl, burst, conversation, synthetic (required)"),
        OPT("workers", KVR_OPT_U32, &s->workers, 1, 4096, "engines (1 to 4096)"),
        TEXT("policies", c->policies, "policies to compare, comma-separated; 'all': every one"),
        TEXT("policy", c->policies, "the same as --policies"),
        OPT("concurrency", KVR_OPT_U32, &s->concurrency, 1, 1e6,
            "closed-loop clients (the seed workloads)"),
        OPT("rate-scale", KVR_OPT_DOUBLE, &s->rate_scale, 1e-6, 1e6,
            "arrival-rate factor (traces, burst)"),
        TEXT("sweep", c->sweep, "run each load value (concurrency or rate scale), comma-separated"),
        OPT("requests", KVR_OPT_U32, &c->requests, 0, 1e7,
            "requests (generated: how many; traces: the first N); 0: the workload's default, or "
            "all"),
        OPT("max-tokens", KVR_OPT_U32, &c->max_tokens, 0, KVR_WL_MAX_OUTPUT,
            "override every output length, as kvbench's (0: the workload's)"),
        OPT("client-max-tokens", KVR_OPT_U32, &s->client_max_tokens, 0, 1e6,
            "the max_tokens every client sends the router, outputs cut to it (0: each request's "
            "own output length, exactly)"),
        OPT("seed", KVR_OPT_U64, &s->router.seed, 0, 0, "seeds the workload and the routers"),
        TEXT("out", c->out, "where report.json, report.md and plots go"),
        TEXT("trace", c->trace, "the trace file; none: traces/<workload>_trace.jsonl"),
    };
    return append(t, n, o, sizeof o / sizeof o[0]);
}

#define INDEX_MAX 2147483648.0 /* the core's KVR_INDEX_MAX_ENTRIES (src/core/index.h) */

static size_t model_options(struct kvr_run_config *c, struct kvr_opt *t, size_t n)
{
    struct kvr_engine_config *e = &c->sim.engine;
    struct kvr_router_config *r = &c->sim.router;
    const struct kvr_opt o[] = {
        OPT("num-blocks", KVR_OPT_U32, &e->num_blocks, 16, 1u << 30, "engine: KV pool, blocks"),
        OPT("block-size", KVR_OPT_U32, &e->block_size, 1, 4096,
            "engine and router: tokens per KV block"),
        OPT("max-batched-tokens", KVR_OPT_U32, &e->max_batched_tokens, 1, 1u << 24,
            "engine: token budget of a step"),
        OPT("max-seqs", KVR_OPT_U32, &e->max_seqs, 1, 1u << 20, "engine: sequences in a step"),
        OPT("watermark", KVR_OPT_DOUBLE, &e->watermark, 0, 0.99,
            "engine: fraction of the pool admission keeps free"),
        OPT("speedup", KVR_OPT_DOUBLE, &e->speedup, 1e-3, 1e6,
            "engine: step times are divided by this"),
        {.name = "kv-cost",
         .type = KVR_OPT_ENUM,
         .ptr = &r->cost_model,
         .help = "router: kv prices a worker by predicted TTFT (time) or by ROUTING.md's blocks "
                 "formula",
         .choices = cost_names},
        OPT("overlap-weight", KVR_OPT_DOUBLE, &r->overlap_weight, 0, 1e6,
            "router: blocks: prefill against decode; time: scales --cache-weight"),
        OPT("cache-weight", KVR_OPT_DOUBLE, &r->cache_weight, 0, 1e6,
            "router, time: recomputed prefill is charged this many more times, by how full the "
            "cache is"),
        OPT("share-weight", KVR_OPT_DOUBLE, &r->share_weight, 0, 1e6,
            "router, time: weight of recomputing a prefix other in-flight requests compute now"),
        OPT("stall-weight", KVR_OPT_DOUBLE, &r->stall_weight, 0, 1e6,
            "router, time: the delay a prefill adds to each request decoding there, charged this "
            "many times"),
        OPT("decode-weight", KVR_OPT_DOUBLE, &r->decode_weight, 0, 1e6,
            "router, time: the request's own decode (the output expected of its max_tokens, a "
            "step each at the worker's decode step), charged this many times; 0: not priced"),
        FLAG("learn-output", &r->learn_output,
             "router, time: --decode-weight prices max_tokens times the share of it that requests "
             "of a like max_tokens generated (false: max_tokens as sent)"),
        OPT("prefill-window-s", KVR_OPT_SEC, &r->prefill_window_ns, 0, 3600,
            "router, time: --decode-weight's step is slowed by the share of the worker's time its "
            "prefills took over about this long (0: not priced; else at least 0.01)"),
        OPT("temperature", KVR_OPT_DOUBLE, &r->temperature, 0, 1e6,
            "router: 0 picks the cheapest, more samples softly"),
        OPT("tie-margin", KVR_OPT_DOUBLE, &r->tie_margin, 0, 1,
            "router: kv draws among prices within about this fraction of the cheapest, as "
            "kvrouter does (0: exact)"),
        OPT("busy-threshold", KVR_OPT_DOUBLE, &r->busy_threshold, 0, 1e6,
            "router: busy above this fraction of capacity (0: off)"),
        FLAG("approximate", &r->approximate,
             "router: the engines' KV events are withheld; the index learns from decisions (TTL)"),
        OPT("index-max-entries", KVR_OPT_U32, &r->index_max_entries, 0, INDEX_MAX,
            "router: bound on index entries; 0: from the fleet (capacities x 1.25)"),
        OPT("index-ceiling", KVR_OPT_U32, &r->index_ceiling, 1, INDEX_MAX,
            "router: the bound from the fleet stays at most this"),
        OPT("index-worker-max", KVR_OPT_U64, &r->index_worker_max, 0, 0,
            "router: a worker's announced capacity counts at most this many blocks"),
    };
    return append(t, n, o, sizeof o / sizeof o[0]);
}

static size_t sim_options(struct kvr_run_config *c, struct kvr_opt *t, size_t n)
{
    struct kvr_sim_config *s = &c->sim;
    const struct kvr_opt o[] = {
        OPT("event-delay-ms", KVR_OPT_MS, &s->event_delay_ns, 0, 1e6, "engine -> router delay"),
        OPT("heartbeat-ms", KVR_OPT_MS, &s->heartbeat_ns, 0.01, 1e6,
            "load reports and prediction samples"),
        OPT("arrival-spread-ms", KVR_OPT_MS, &c->spread_ns, 0, 1e9,
            "open loop: each arrival moves later by a uniform draw in [0, this) of trace time"),
        FLAG("quiet", &c->quiet, "no progress lines"),
        FLAG("per-request", &s->per_request,
             "also write requests.csv into --out: a line per finished request of every run"),
        TEXT("replicas", c->replica_list,
             "share the requests among N routers (a queue group), for each N of the list; "
             "report.md compares them with one"),
        {.name = "gossip",
         .type = KVR_OPT_ENUM,
         .ptr = &c->gossip,
         .help = "replicas import each other's decisions; both: each N > 1 runs twice",
         .choices = gossip_names},
        OPT("gossip-delay-ms", KVR_OPT_MS, &s->gossip_delay_ns, 0, 1e6,
            "a booking -> its import by the other replicas"),
    };
    return append(t, n, o, sizeof o / sizeof o[0]);
}

#undef FLAG
#undef TEXT
#undef OPT

static int bad(const char *opt, const char *why)
{
    fprintf(stderr, "kvsim run: %s %s\n", opt, why);
    return -1;
}

/* Comma-separated numbers in [1e-6, 1e6], at most KVR_RUN_MAX_LOADS of them. */
static bool to_list(const char *s, double *out, size_t *n)
{
    *n = 0;
    while (*s) {
        char buf[64], *end;
        size_t len = strcspn(s, ",");
        if (!len || len >= sizeof buf || *n == KVR_RUN_MAX_LOADS)
            return false;
        memcpy(buf, s, len);
        buf[len] = 0;
        errno = 0;
        double v = strtod(buf, &end);
        if (errno || *end || !(v >= 1e-6 && v <= 1e6))
            return false;
        out[(*n)++] = v;
        s += len + (s[len] == ',');
    }
    return *n > 0;
}

/* --replicas: whole numbers of routers, 1 to KVR_SIM_MAX_REPLICAS. */
static bool to_replicas(const char *s, uint32_t *out, size_t *n)
{
    double v[KVR_RUN_MAX_LOADS];
    if (!to_list(s, v, n))
        return false;
    for (size_t i = 0; i < *n; i++) {
        if (v[i] != (double)(uint32_t)v[i] || v[i] > KVR_SIM_MAX_REPLICAS)
            return false;
        out[i] = (uint32_t)v[i];
    }
    return true;
}

static int parse_policies(struct kvr_run_config *c)
{
    c->npolicies = 0;
    if (!strcmp(c->policies, "all")) {
        for (int p = 0; p < KVR_POLICY_COUNT; p++)
            c->policy[c->npolicies++] = (enum kvr_policy)p;
        return 0;
    }
    for (const char *s = c->policies; *s;) {
        size_t len = strcspn(s, ",");
        enum kvr_policy p;
        if (kvr_policy_parse(s, len, &p) != KVR_OK || c->npolicies == KVR_POLICY_COUNT) {
            fprintf(stderr, "kvsim run: unknown policy '%.*s'\n", (int)len, s);
            return -1;
        }
        c->policy[c->npolicies++] = p;
        s += len + (s[len] == ',');
    }
    return c->npolicies ? 0 : bad("--policies", "needs a policy");
}

/* What the table cannot check: a required option, names, lists; 0 or -1 (reported). */
static int check(struct kvr_run_config *c)
{
    if (!c->workload[0])
        return bad("--workload", "is required");
    if (!kvr_workload_known(c->workload, NULL))
        return bad(c->workload, "is not a workload");
    if (!c->out[0] || strchr(c->out, '\''))
        return bad("--out", "has a bad value");
    if (c->sweep[0] && !to_list(c->sweep, c->loads, &c->nloads))
        return bad("--sweep", "has a bad value");
    if (c->replica_list[0] && !to_replicas(c->replica_list, c->replicas, &c->nreplicas))
        return bad("--replicas", "has a bad value");
    c->gossip_runs = (unsigned)c->gossip + 1;
    c->sim.router.block_size = c->sim.engine.block_size;
    c->sim.router.engine_speedup = c->sim.engine.speedup; /* the router's clock is the engines' */
    return parse_policies(c);
}

enum kvr_opts_result kvr_run_config_parse(struct kvr_run_config *c, int argc, char **argv)
{
    struct kvr_opt t[48];
    size_t n = run_options(c, t, 0);
    n = model_options(c, t, n);
    n = sim_options(c, t, n);
    enum kvr_opts_result r = kvr_opts_parse(
        t, n, argc, argv, "kvsim run",
        "Simulate a workload through the routing core and N engines in virtual time, once per "
        "policy\nand load (and per count of router replicas with --replicas), and write "
        "report.json,\nreport.md and plots into --out.");
    if (r == KVR_OPTS_GO && check(c))
        r = KVR_OPTS_BAD;
    return r;
}
