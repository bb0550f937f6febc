/*
 * kvsim run: simulate a workload through the routing core and N engines for each policy and load
 * (and, with --replicas, each count of router replicas with and without gossip), and write
 * report.json, report.md and plots into a directory. See `kvsim run --help`.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../sim/report.h"
#include "../sim/sim.h"
#include "../sim/workload.h"
#include "kvr/policy.h"

int kvsim_run(int argc, char **argv);

#define MAX_LOADS 32

enum { GOSSIP_ON = 1, GOSSIP_OFF = 2 }; /* --gossip: which settings to run */

struct run_opts {
    const char *workload, *out, *trace, *policies;
    uint32_t workers, requests, concurrency;
    double rate_scale;
    double loads[MAX_LOADS];
    size_t nloads;
    uint64_t seed;
    double event_delay_ms, heartbeat_ms, gossip_delay_ms;
    double spread_ms;           /* --arrival-spread-ms */
    double replicas[MAX_LOADS]; /* --replicas: router counts to compare */
    size_t nreplicas;           /* 0: one router, no replica table */
    unsigned gossip;            /* GOSSIP_* */
    bool quiet;
    struct kvr_engine_config engine;
    struct kvr_router_config router;
};

static void run_usage(FILE *f)
{
    fprintf(f,
            "usage: kvsim run --workload NAME [options]\n"
            "  --workload NAME        seed, seed-isl, seed-osl, burst, conversation, synthetic\n"
            "  --workers N            engines (default 8)\n"
            "  --policies a,b,...     policies to compare (default kv,random,round_robin);\n"
            "                         'all' runs every policy\n"
            "  --concurrency C        closed-loop clients (seed workloads; default 20)\n"
            "  --rate-scale X         arrival-rate factor (traces, burst; default 1)\n"
            "  --sweep v1,v2,...      run each load value (concurrency or rate scale)\n"
            "  --requests N           requests (generated: how many; traces: the first N)\n"
            "  --seed S               seeds workloads and routers (default 1)\n"
            "  --out DIR              where report.json, report.md and plots go (default "
            "kvsim-out)\n"
            "  --trace PATH           the trace file (default traces/<workload>_trace.jsonl)\n"
            "engine:\n"
            "  --num-blocks N (16384)  --block-size B (64)  --max-batched-tokens N (8192)\n"
            "  --max-seqs N (256)  --watermark F (0.01)  --speedup F (1)\n"
            "router:\n"
            "  --kv-cost time|blocks   kv prices a worker by predicted TTFT (default) or by\n"
            "                          ROUTING.md's blocks formula\n"
            "  --overlap-weight F (1)  --cache-weight F (4)  --share-weight F (16)\n"
            "  --temperature F (0)\n"
            "  --busy-threshold F (0.95; 0 off)\n"
            "  --approximate           no KV events: the index learns from decisions (TTL)\n"
            "simulation:\n"
            "  --event-delay-ms F      engine -> router delay (default 1)\n"
            "  --heartbeat-ms F        load reports and prediction samples (default 100)\n"
            "  --arrival-spread-ms F   open loop: each arrival moves later by a uniform draw in\n"
            "                          [0, F) ms of trace time (coarse timestamps; default 0)\n"
            "  --quiet                 no progress lines\n"
            "router replicas:\n"
            "  --replicas N1,N2,...    share the requests among N routers (a queue group), for\n"
            "                          each N; report.md gets a table against one router\n"
            "  --gossip on|off|both    replicas import each other's decisions (default on);\n"
            "                          both runs each N > 1 twice\n"
            "  --gossip-delay-ms F     booking -> import by the other replicas (default 1)\n");
}

static int bad(const char *opt, const char *why)
{
    fprintf(stderr, "kvsim run: %s %s\n", opt, why);
    return 2;
}

static bool to_u32(const char *s, uint32_t min, uint32_t max, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = s ? strtoull(s, &end, 10) : 0;
    if (!s || !*s || *s == '-' || errno || *end || v < min || v > max)
        return false;
    *out = (uint32_t)v;
    return true;
}

static bool to_double(const char *s, double min, double max, double *out)
{
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || errno || *end || !(v >= min && v <= max))
        return false;
    *out = v;
    return true;
}

static bool to_list(const char *s, double *out, size_t *n)
{
    *n = 0;
    while (s && *s) {
        char buf[64];
        size_t len = strcspn(s, ",");
        if (!len || len >= sizeof buf || *n == MAX_LOADS)
            return false;
        memcpy(buf, s, len);
        buf[len] = 0;
        if (!to_double(buf, 1e-6, 1e6, &out[(*n)++]))
            return false;
        s += len + (s[len] == ',');
    }
    return *n > 0;
}

/* --replicas: whole numbers of routers, 1 to KVR_SIM_MAX_REPLICAS. */
static bool to_replicas(const char *s, double *out, size_t *n)
{
    if (!to_list(s, out, n))
        return false;
    for (size_t i = 0; i < *n; i++)
        if (out[i] != (double)(uint32_t)out[i] || out[i] > KVR_SIM_MAX_REPLICAS)
            return false;
    return true;
}

static bool to_gossip(const char *s, unsigned *out)
{
    static const char *names[] = {"on", "off", "both"};
    static const unsigned modes[] = {GOSSIP_ON, GOSSIP_OFF, GOSSIP_ON | GOSSIP_OFF};
    for (size_t i = 0; s && i < 3; i++) {
        if (!strcmp(s, names[i])) {
            *out = modes[i];
            return true;
        }
    }
    return false;
}

static int parse(int argc, char **argv, struct run_opts *o)
{
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, takes = true;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            run_usage(stdout);
            return 1;
        } else if (!strcmp(a, "--quiet")) {
            o->quiet = true, takes = false;
        } else if (!strcmp(a, "--approximate")) {
            o->router.approximate = true, takes = false;
        } else if (!strcmp(a, "--workload")) {
            o->workload = v, ok = v != NULL;
        } else if (!strcmp(a, "--out")) {
            o->out = v, ok = v && *v && !strchr(v, '\'');
        } else if (!strcmp(a, "--trace")) {
            o->trace = v, ok = v != NULL;
        } else if (!strcmp(a, "--policies") || !strcmp(a, "--policy")) {
            o->policies = v, ok = v != NULL;
        } else if (!strcmp(a, "--workers")) {
            ok = to_u32(v, 1, 4096, &o->workers);
        } else if (!strcmp(a, "--requests")) {
            ok = to_u32(v, 1, 10000000, &o->requests);
        } else if (!strcmp(a, "--concurrency")) {
            ok = to_u32(v, 1, 1000000, &o->concurrency);
        } else if (!strcmp(a, "--rate-scale")) {
            ok = to_double(v, 1e-6, 1e6, &o->rate_scale);
        } else if (!strcmp(a, "--sweep")) {
            ok = to_list(v, o->loads, &o->nloads);
        } else if (!strcmp(a, "--seed")) {
            ok = v && *v != '-' && (o->seed = strtoull(v, NULL, 10), 1);
        } else if (!strcmp(a, "--num-blocks")) {
            ok = to_u32(v, 16, 1u << 30, &o->engine.num_blocks);
        } else if (!strcmp(a, "--block-size")) {
            ok = to_u32(v, 1, 4096, &o->engine.block_size);
            o->router.block_size = o->engine.block_size;
        } else if (!strcmp(a, "--max-batched-tokens")) {
            ok = to_u32(v, 1, 1u << 24, &o->engine.max_batched_tokens);
        } else if (!strcmp(a, "--max-seqs")) {
            ok = to_u32(v, 1, 1u << 20, &o->engine.max_seqs);
        } else if (!strcmp(a, "--watermark")) {
            ok = to_double(v, 0, 0.99, &o->engine.watermark);
        } else if (!strcmp(a, "--speedup")) {
            ok = to_double(v, 1e-3, 1e6, &o->engine.speedup);
        } else if (!strcmp(a, "--overlap-weight")) {
            ok = to_double(v, 0, 1e6, &o->router.overlap_weight);
        } else if (!strcmp(a, "--temperature")) {
            ok = to_double(v, 0, 1e6, &o->router.temperature);
        } else if (!strcmp(a, "--kv-cost")) {
            ok = v && (!strcmp(v, "blocks") || !strcmp(v, "time"));
            if (ok)
                o->router.cost_model = !strcmp(v, "time") ? KVR_COST_TIME : KVR_COST_BLOCKS;
        } else if (!strcmp(a, "--share-weight")) {
            ok = to_double(v, 0, 1e6, &o->router.share_weight);
        } else if (!strcmp(a, "--cache-weight")) {
            ok = to_double(v, 0, 1e6, &o->router.cache_weight);
        } else if (!strcmp(a, "--busy-threshold")) {
            ok = to_double(v, 0, 1e6, &o->router.busy_threshold);
        } else if (!strcmp(a, "--event-delay-ms")) {
            ok = to_double(v, 0, 1e6, &o->event_delay_ms);
        } else if (!strcmp(a, "--heartbeat-ms")) {
            ok = to_double(v, 0.01, 1e6, &o->heartbeat_ms);
        } else if (!strcmp(a, "--arrival-spread-ms")) {
            ok = to_double(v, 0, 1e9, &o->spread_ms);
        } else if (!strcmp(a, "--replicas")) {
            ok = to_replicas(v, o->replicas, &o->nreplicas);
        } else if (!strcmp(a, "--gossip")) {
            ok = to_gossip(v, &o->gossip);
        } else if (!strcmp(a, "--gossip-delay-ms")) {
            ok = to_double(v, 0, 1e6, &o->gossip_delay_ms);
        } else {
            return bad(a, "is not an option (see kvsim run --help)");
        }
        if (!ok)
            return bad(a, v ? "has a bad value" : "needs a value");
        i += takes;
    }
    if (!o->workload)
        return bad("--workload", "is required");
    if (!kvr_workload_known(o->workload, NULL))
        return bad(o->workload, "is not a workload");
    return 0;
}

static int parse_policies(const char *s, enum kvr_policy *out, size_t *n)
{
    *n = 0;
    if (!strcmp(s, "all")) {
        for (int p = 0; p < KVR_POLICY_COUNT; p++)
            out[(*n)++] = (enum kvr_policy)p;
        return 0;
    }
    while (*s) {
        size_t len = strcspn(s, ",");
        enum kvr_policy p;
        if (kvr_policy_parse(s, len, &p) != KVR_OK || *n == KVR_POLICY_COUNT) {
            fprintf(stderr, "kvsim run: unknown policy '%.*s'\n", (int)len, s);
            return 2;
        }
        out[(*n)++] = p;
        s += len + (s[len] == ',');
    }
    return *n ? 0 : 2;
}

struct progress {
    const char *workload;
    const char *label; /* the policy, and the replicas when compared */
    double load;
    struct timespec last;
};

static double since(const struct timespec *t)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t->tv_sec) + (now.tv_nsec - t->tv_nsec) / 1e9;
}

static void on_progress(void *ctx, uint32_t resolved, uint32_t total, uint64_t now_ns)
{
    struct progress *p = ctx;
    if (since(&p->last) < 2.0)
        return;
    clock_gettime(CLOCK_MONOTONIC, &p->last);
    fprintf(stderr, "[kvsim] %s policy=%s load=%g: %u/%u requests, virtual time %.0f s\n",
            p->workload, p->label, p->load, resolved, total, now_ns / 1e9);
}

static const char *default_trace(const char *workload, char *buf, size_t len)
{
    const char *env = getenv("KVR_TRACES");
    const char *dirs[] = {env, "traces", "../shared/traces"};
    for (size_t i = 0; i < 3; i++) {
        if (!dirs[i])
            continue;
        snprintf(buf, len, "%s/%s_trace.jsonl", dirs[i], workload);
        struct stat st;
        if (stat(buf, &st) == 0)
            return buf;
    }
    snprintf(buf, len, "traces/%s_trace.jsonl", workload);
    return buf;
}

static int load_workload(const struct run_opts *o, struct kvr_workload *w, bool *is_trace,
                         double *doc_ceiling)
{
    kvr_workload_known(o->workload, is_trace);
    *doc_ceiling = 0;
    if (!*is_trace) {
        kvr_status st = kvr_workload_generate(w, o->workload, o->requests, o->seed);
        if (st != KVR_OK)
            fprintf(stderr, "kvsim run: %s\n", kvr_status_str(st));
        return st == KVR_OK ? 0 : 1;
    }
    char buf[4096];
    const char *path = o->trace ? o->trace : default_trace(o->workload, buf, sizeof buf);
    uint64_t line = 0;
    kvr_status st = kvr_workload_load_trace(w, o->workload, path, o->requests, o->seed, &line);
    if (st == KVR_ERR_MALFORMED)
        fprintf(stderr, "kvsim run: %s: line %llu is not a trace record\n", path,
                (unsigned long long)line);
    else if (st != KVR_OK)
        fprintf(stderr, "kvsim run: cannot read %s: %s\n", path, kvr_status_str(st));
    /* SOURCES.md: single-infinite-cache ceilings over 512-token blocks, whole traces */
    if (!o->requests)
        *doc_ceiling = !strcmp(o->workload, "conversation") ? 0.366 : 0.640;
    return st == KVR_OK ? 0 : 1;
}

/* One simulation to run: a load, a policy, and how many routers share the requests. */
struct run {
    double load;
    enum kvr_policy policy;
    uint32_t replicas;
    bool gossip;
};

/*
 * Every run, loads outermost, then policies, replica counts, gossip on before off; one router
 * runs once whatever the gossip setting. *out is allocated (NULL when memory is short).
 */
static size_t plan(const struct run_opts *o, const enum kvr_policy *policies, size_t npol,
                   struct run **out)
{
    size_t nrep = o->nreplicas ? o->nreplicas : 1, n = 0;
    *out = malloc(o->nloads * npol * nrep * 2 * sizeof **out);
    for (size_t l = 0; *out && l < o->nloads; l++) {
        for (size_t p = 0; p < npol; p++) {
            for (size_t k = 0; k < nrep; k++) {
                uint32_t nr = o->nreplicas ? (uint32_t)o->replicas[k] : 1;
                for (unsigned g = GOSSIP_ON; g <= GOSSIP_OFF; g <<= 1) {
                    if (!(o->gossip & g))
                        continue;
                    (*out)[n++] = (struct run){o->loads[l], policies[p], nr, g == GOSSIP_ON};
                    if (nr == 1)
                        break;
                }
            }
        }
    }
    return n;
}

/* Simulate run u into *out and print its line; 0, or 1 on failure. */
static int run_one(const struct run_opts *o, const struct kvr_workload *w, const struct run *u,
                   bool closed, const struct kvr_report_meta *meta, struct kvr_sim_config *cfg,
                   const struct timespec *t0, struct kvr_sim_result *out)
{
    char label[128];
    struct kvr_sim_result id = {.policy = u->policy, .replicas = u->replicas, .gossip = u->gossip};
    kvr_report_label(meta, &id, false, label, sizeof label);
    struct progress prog = {o->workload, label, u->load, *t0};
    cfg->router.policy = u->policy;
    cfg->rate_scale = closed ? 1.0 : u->load;
    cfg->concurrency = closed ? (uint32_t)u->load : 0;
    cfg->replicas = u->replicas;
    cfg->gossip = u->gossip;
    cfg->progress = o->quiet ? NULL : on_progress;
    cfg->progress_ctx = &prog;
    kvr_status st = kvr_sim_run(w, cfg, out);
    if (st != KVR_OK) {
        fprintf(stderr, "kvsim run: %s at load %g: %s\n", label, u->load, kvr_status_str(st));
        return 1;
    }
    const struct kvr_sim_result *r = out;
    printf("%-18s load=%-6g ttft_ms mean=%.1f p90=%.1f p99=%.1f  itl_ms mean=%.1f  "
           "hit=%.3f (%.0f%% of ceiling)  tok/s=%.0f  finished=%u rejected=%u\n",
           label, r->load, r->ttft_ms.mean, r->ttft_ms.p90, r->ttft_ms.p99, r->itl_ms.mean,
           r->hit_rate, meta->hit_ceiling > 0 ? 100 * r->hit_rate / meta->hit_ceiling : 0.0,
           r->throughput_tok_s, r->finished, r->rejected);
    fflush(stdout);
    return 0;
}

int kvsim_run(int argc, char **argv)
{
    struct run_opts o;
    memset(&o, 0, sizeof o);
    o.workers = 8;
    o.seed = 1;
    o.out = "kvsim-out";
    o.policies = "kv,random,round_robin";
    o.event_delay_ms = 1.0;
    o.heartbeat_ms = 100;
    o.gossip_delay_ms = 1.0;
    o.gossip = GOSSIP_ON;
    kvr_engine_config_default(&o.engine);
    kvr_router_config_default(&o.router);
    o.router.block_size = o.engine.block_size;
    o.router.queue_max = 1u << 20;                         /* the simulator loses no request: */
    o.router.queue_timeout_ns = 24ull * 3600 * 1000000000; /* waits count in TTFT instead */
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    enum kvr_policy policies[KVR_POLICY_COUNT];
    size_t npol;
    if (parse_policies(o.policies, policies, &npol))
        return 2;
    struct kvr_workload w;
    bool is_trace;
    double doc_ceiling;
    if (load_workload(&o, &w, &is_trace, &doc_ceiling))
        return 1;
    bool closed = w.reqs[0].arrival_ns == KVR_CLOSED_LOOP;
    kvr_workload_spread(&w, (uint64_t)(o.spread_ms * 1e6));
    if (closed && o.rate_scale)
        fprintf(stderr, "kvsim run: %s is closed-loop: --rate-scale ignored\n", o.workload);
    if (!closed && o.concurrency)
        fprintf(stderr, "kvsim run: %s is open-loop: --concurrency ignored\n", o.workload);
    if (closed && o.spread_ms > 0)
        fprintf(stderr, "kvsim run: %s is closed-loop: --arrival-spread-ms ignored\n", o.workload);
    if (!o.nloads) {
        o.loads[0] =
            closed ? (o.concurrency ? o.concurrency : 20) : (o.rate_scale ? o.rate_scale : 1.0);
        o.nloads = 1;
    }
    if (kvr_mkdir_p(o.out)) {
        fprintf(stderr, "kvsim run: cannot create %s: %s\n", o.out, strerror(errno));
        kvr_workload_free(&w);
        return 1;
    }
    struct kvr_sim_config cfg;
    kvr_sim_config_default(&cfg);
    cfg.workers = o.workers;
    cfg.engine = o.engine;
    cfg.router = o.router;
    cfg.event_delay_ns = (uint64_t)(o.event_delay_ms * 1e6);
    cfg.heartbeat_ns = (uint64_t)(o.heartbeat_ms * 1e6);
    cfg.gossip_delay_ns = (uint64_t)(o.gossip_delay_ms * 1e6);
    cfg.router.seed = o.seed;
    struct kvr_report_meta meta = {.source = "kvsim",
                                   .workload = o.workload,
                                   .workers = o.workers,
                                   .seed = o.seed,
                                   .load_kind = closed ? "concurrency" : "rate_scale",
                                   .cfg = &cfg,
                                   .hit_ceiling_trace = doc_ceiling,
                                   .replicas = o.nreplicas > 0,
                                   .arrival_spread_ms = closed ? 0 : o.spread_ms};
    if (kvr_sim_hit_ceiling(&w, o.engine.block_size, 0, &meta.hit_ceiling) != KVR_OK ||
        kvr_sim_hit_ceiling(&w, o.engine.block_size, (uint64_t)o.workers * o.engine.num_blocks,
                            &meta.hit_ceiling_capacity) != KVR_OK) {
        fprintf(stderr, "kvsim run: out of memory\n");
        kvr_workload_free(&w);
        return 1;
    }
    struct run *runs = NULL;
    size_t nruns = plan(&o, policies, npol, &runs);
    struct kvr_sim_result *res = calloc(nruns ? nruns : 1, sizeof *res);
    size_t nres = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = res && runs ? 0 : 1;
    for (size_t i = 0; i < nruns && rc == 0; i++) {
        rc = run_one(&o, &w, &runs[i], closed, &meta, &cfg, &t0, &res[nres]);
        nres += rc == 0;
    }
    if (rc == 0) {
        if (kvr_report_write(o.out, &meta, res, nres) != KVR_OK) {
            fprintf(stderr, "kvsim run: cannot write the report into %s\n", o.out);
            rc = 1;
        } else if (kvr_report_plots(o.out, &meta, res, nres) != KVR_OK) {
            fprintf(stderr,
                    "kvsim run: plots not drawn (is gnuplot installed? see %s/gnuplot.log); "
                    "their data and %s/plots.gp are there\n",
                    o.out, o.out);
        }
        printf("hit ceiling: unbounded cache %.4f, one cache of %u x %u blocks %.4f\n",
               meta.hit_ceiling, o.workers, o.engine.num_blocks, meta.hit_ceiling_capacity);
        printf("wrote %s/report.json, %s/report.md and plots in %.1f s\n", o.out, o.out,
               since(&t0));
    }
    for (size_t i = 0; i < nres; i++)
        kvr_sim_result_free(&res[i]);
    free(res);
    free(runs);
    kvr_workload_free(&w);
    return rc;
}
