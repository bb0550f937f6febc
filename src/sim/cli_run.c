/*
 * kvsim run: load the workload, plan every simulation (loads outermost, then policies, replica
 * counts, gossip on before off), run them one after the other, print a line for each, then write
 * the report. The settings are kvr_run_config's (run_config.h).
 */
#include "cli_run.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "clock.h"
#include "report.h"
#include "run_config.h"
#include "workload.h"

struct progress {
    const char *workload;
    const char *label; /* the policy, and the replicas when compared */
    double load;
    uint64_t last_ns; /* the last line (or the start), monotonic */
};

/* Every 2 s of real time at most: how far the simulation is. */
static void on_progress(void *ctx, uint32_t resolved, uint32_t total, uint64_t now_ns)
{
    struct progress *p = ctx;
    uint64_t now = kvr_now_ns();
    if (now - p->last_ns < 2 * KVR_NS_PER_S)
        return;
    p->last_ns = now;
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

/* Every output length of w set to c's --max-tokens (0: left as it is), then cut to what the
 * clients allow (--client-max-tokens; 0: no cut). */
static void cut_outputs(struct kvr_workload *w, const struct kvr_run_config *c)
{
    uint32_t cap = c->sim.client_max_tokens;
    for (uint32_t i = 0; i < w->nreqs; i++) {
        if (c->max_tokens)
            w->reqs[i].osl = c->max_tokens;
        if (cap && w->reqs[i].osl > cap)
            w->reqs[i].osl = cap;
    }
}

/* The workload into *w; *doc_ceiling: the trace's documented hit ceiling (0: none). 0 or 1. */
static int load_workload(const struct kvr_run_config *c, struct kvr_workload *w,
                         double *doc_ceiling)
{
    bool is_trace;
    kvr_workload_known(c->workload, &is_trace);
    uint64_t seed = c->sim.router.seed;
    *doc_ceiling = 0;
    if (!is_trace) {
        kvr_status st = kvr_workload_generate(w, c->workload, c->requests, seed);
        if (st != KVR_OK)
            fprintf(stderr, "kvsim run: %s\n", kvr_status_str(st));
        else
            cut_outputs(w, c);
        return st == KVR_OK ? 0 : 1;
    }
    char buf[4096];
    const char *path = c->trace[0] ? c->trace : default_trace(c->workload, buf, sizeof buf);
    uint64_t line = 0;
    kvr_status st = kvr_workload_load_trace(w, c->workload, path, c->requests, seed, &line);
    if (st == KVR_ERR_MALFORMED)
        fprintf(stderr, "kvsim run: %s: line %llu is not a trace record\n", path,
                (unsigned long long)line);
    else if (st == KVR_ERR_MAX_TOKENS_TOO_LARGE)
        fprintf(stderr,
                "kvsim run: %s: line %llu: output_length over %u (the bound of --max-tokens)\n",
                path, (unsigned long long)line, KVR_WL_MAX_OUTPUT);
    else if (st != KVR_OK)
        fprintf(stderr, "kvsim run: cannot read %s: %s\n", path, kvr_status_str(st));
    /* SOURCES.md: single-infinite-cache ceilings over 512-token blocks, the whole traces (the
     * default ones: a --trace file of one's own has its own) */
    if (!c->requests && !c->trace[0])
        *doc_ceiling = !strcmp(c->workload, "conversation") ? 0.366 : 0.640;
    if (st == KVR_OK)
        cut_outputs(w, c);
    return st == KVR_OK ? 0 : 1;
}

/* A closed loop's --sweep values are numbers of clients: whole, at least 1. 0, or 1 (reported). */
static int check_clients(const struct kvr_run_config *c)
{
    for (size_t i = 0; i < c->nloads; i++) {
        double v = c->loads[i];
        if (v < 1 || v != (double)(uint32_t)v) {
            fprintf(stderr,
                    "kvsim run: --sweep %g: %s is closed-loop: each value is a number of clients, "
                    "a whole number from 1 to 1000000\n",
                    v, c->workload);
            return 1;
        }
    }
    return 0;
}

/*
 * Spread the arrivals, say which load options the workload ignores (those set away from their
 * defaults), and make the one load the list when --sweep is not given. 0, or 1 when a --sweep
 * value is no load of the workload (reported).
 */
static int prepare_loads(struct kvr_run_config *c, struct kvr_workload *w, bool closed)
{
    if (closed && check_clients(c))
        return 1;
    struct kvr_sim_config d;
    kvr_sim_config_default(&d);
    kvr_workload_spread(w, c->spread_ns);
    if (closed && c->sim.rate_scale != d.rate_scale)
        fprintf(stderr, "kvsim run: %s is closed-loop: --rate-scale ignored\n", c->workload);
    if (!closed && c->sim.concurrency != d.concurrency)
        fprintf(stderr, "kvsim run: %s is open-loop: --concurrency ignored\n", c->workload);
    if (closed && c->spread_ns > 0)
        fprintf(stderr, "kvsim run: %s is closed-loop: --arrival-spread-ms ignored\n", c->workload);
    if (!c->nloads) {
        c->loads[0] = closed ? c->sim.concurrency : c->sim.rate_scale;
        c->nloads = 1;
    }
    return 0;
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
static size_t plan(const struct kvr_run_config *c, struct run **out)
{
    size_t nrep = c->nreplicas ? c->nreplicas : 1, n = 0;
    *out = malloc(c->nloads * c->npolicies * nrep * 2 * sizeof **out);
    for (size_t l = 0; *out && l < c->nloads; l++) {
        for (size_t p = 0; p < c->npolicies; p++) {
            for (size_t k = 0; k < nrep; k++) {
                uint32_t nr = c->nreplicas ? c->replicas[k] : 1;
                for (unsigned g = KVR_RUN_GOSSIP_ON; g <= KVR_RUN_GOSSIP_OFF; g <<= 1) {
                    if (!(c->gossip_runs & g))
                        continue;
                    (*out)[n++] =
                        (struct run){c->loads[l], c->policy[p], nr, g == KVR_RUN_GOSSIP_ON};
                    if (nr == 1)
                        break;
                }
            }
        }
    }
    return n;
}

/* Why run label at load could not be simulated (st; out: how far it got on KVR_ERR_TIMEOUT). */
static void run_failed(const char *label, double load, const struct kvr_sim_result *out,
                       kvr_status st)
{
    if (st == KVR_ERR_TIMEOUT)
        fprintf(stderr,
                "kvsim run: %s at load %g: requests unresolved: %u of %u never finished (%u "
                "finished, %u rejected, %u failed), and nothing is left to happen: an engine "
                "holds a request it can never run\n",
                label, load, out->requests - out->finished - out->rejected - out->failed,
                out->requests, out->finished, out->rejected, out->failed);
    else if (st == KVR_ERR_FULL)
        fprintf(stderr,
                "kvsim run: %s at load %g: %s: the run's inter-token gaps are past 2^32 - 1\n",
                label, load, kvr_status_str(st));
    else
        fprintf(stderr, "kvsim run: %s at load %g: %s\n", label, load, kvr_status_str(st));
}

/* Simulate run u into *out and print its line; 0, or 1 on failure. */
static int run_one(struct kvr_run_config *c, const struct kvr_workload *w, const struct run *u,
                   bool closed, const struct kvr_report_meta *meta, uint64_t t0,
                   struct kvr_sim_result *out)
{
    char label[128];
    struct kvr_sim_result id = {.policy = u->policy, .replicas = u->replicas, .gossip = u->gossip};
    kvr_report_label(meta, &id, false, label, sizeof label);
    struct progress prog = {c->workload, label, u->load, t0};
    struct kvr_sim_config *cfg = &c->sim;
    cfg->router.policy = u->policy;
    cfg->rate_scale = closed ? 1.0 : u->load;
    cfg->concurrency = closed ? (uint32_t)u->load : 0;
    cfg->replicas = u->replicas;
    cfg->gossip = u->gossip;
    cfg->progress = c->quiet ? NULL : on_progress;
    cfg->progress_ctx = &prog;
    kvr_status st = kvr_sim_run(w, cfg, out);
    if (st != KVR_OK) {
        run_failed(label, u->load, out, st);
        return 1;
    }
    const struct kvr_sim_result *r = out;
    if (r->failed)
        fprintf(stderr,
                "kvsim run: %s at load %g: %u request%s failed: prompt and output need more KV "
                "blocks than one engine holds (up to %llu blocks, of a pool of %u less its "
                "watermark, as kvworker counts them): refused before the engine\n",
                label, u->load, r->failed, r->failed > 1 ? "s" : "",
                (unsigned long long)r->failed_blocks, c->sim.engine.num_blocks);
    printf("%-18s load=%-6g ttft_ms mean=%.1f p90=%.1f p99=%.1f  itl_ms mean=%.1f  "
           "hit=%.3f (%.0f%% of ceiling)  tok/s=%.0f  finished=%u rejected=%u  "
           "index_max=%u pruned=%llu live=%llu\n",
           label, r->load, r->ttft_ms.mean, r->ttft_ms.p90, r->ttft_ms.p99, r->itl_ms.mean,
           r->hit_rate, meta->hit_ceiling > 0 ? 100 * r->hit_rate / meta->hit_ceiling : 0.0,
           r->throughput_tok_s, r->finished, r->rejected, r->index_bound,
           (unsigned long long)r->index_pruned, (unsigned long long)r->index_pruned_live);
    fflush(stdout);
    return 0;
}

/* The report and plots of results res[0..n) into --out; 0, or 1 when it could not be written. */
static int report(const struct kvr_run_config *c, const struct kvr_report_meta *meta,
                  const struct kvr_sim_result *res, size_t n, uint64_t t0)
{
    const char *out = c->out;
    if (kvr_report_write(out, meta, res, n) != KVR_OK) {
        fprintf(stderr, "kvsim run: cannot write the report into %s\n", out);
        return 1;
    }
    if (kvr_report_plots(out, meta, res, n) != KVR_OK)
        fprintf(stderr,
                "kvsim run: plots not drawn (is gnuplot installed? see %s/gnuplot.log); "
                "their data and %s/plots.gp are there\n",
                out, out);
    printf("hit ceiling: unbounded cache %.4f, one cache of %u x %u blocks %.4f\n",
           meta->hit_ceiling, c->sim.workers, c->sim.engine.num_blocks, meta->hit_ceiling_capacity);
    printf("wrote %s/report.json, %s/report.md and plots in %.1f s\n", out, out,
           (double)(kvr_now_ns() - t0) / 1e9);
    return 0;
}

/* --per-request: requests.csv in --out, its header written; NULL (reported) when it cannot be. */
static FILE *requests_open(const struct kvr_run_config *c)
{
    FILE *f = kvr_report_requests_open(c->out);
    if (!f)
        fprintf(stderr, "kvsim run: cannot write %s/requests.csv: %s\n", c->out, strerror(errno));
    return f;
}

/* Every planned run (with --per-request, each one's lines as it ends), then the report; 0 or 1. */
static int run_all(struct kvr_run_config *c, const struct kvr_workload *w, bool closed,
                   const struct kvr_report_meta *meta)
{
    struct run *runs = NULL;
    size_t nruns = plan(c, &runs);
    struct kvr_sim_result *res = calloc(nruns ? nruns : 1, sizeof *res);
    size_t nres = 0;
    uint64_t t0 = kvr_now_ns();
    int rc = res && runs ? 0 : 1;
    if (rc)
        fprintf(stderr, "kvsim run: out of memory\n");
    FILE *reqs = rc == 0 && c->sim.per_request ? requests_open(c) : NULL;
    if (c->sim.per_request && !reqs)
        rc = 1;
    for (size_t i = 0; i < nruns && rc == 0; i++) {
        rc = run_one(c, w, &runs[i], closed, meta, t0, &res[nres]);
        nres += rc == 0; /* its result is freed below, whatever comes next */
        if (rc == 0 && reqs && kvr_report_requests_write(reqs, meta, &res[nres - 1]) != KVR_OK) {
            fprintf(stderr, "kvsim run: cannot write %s/requests.csv\n", c->out);
            rc = 1;
        }
    }
    if (reqs && fclose(reqs) && rc == 0) {
        fprintf(stderr, "kvsim run: cannot write %s/requests.csv\n", c->out);
        rc = 1;
    }
    if (rc == 0)
        rc = report(c, meta, res, nres, t0);
    for (size_t i = 0; i < nres; i++)
        kvr_sim_result_free(&res[i]);
    free(res);
    free(runs);
    return rc;
}

/* The hit-rate references of the report's header; 0, or 1 when memory is short. */
static int ceilings(const struct kvr_run_config *c, const struct kvr_workload *w,
                    struct kvr_report_meta *meta)
{
    const struct kvr_engine_config *e = &c->sim.engine;
    uint64_t capacity = (uint64_t)c->sim.workers * e->num_blocks;
    kvr_status st = kvr_sim_hit_ceiling(w, e->block_size, 0, &meta->hit_ceiling);
    if (st == KVR_OK)
        st = kvr_sim_hit_ceiling(w, e->block_size, capacity, &meta->hit_ceiling_capacity);
    if (st != KVR_OK) {
        fprintf(stderr, "kvsim run: the hit-rate ceiling: %s\n", kvr_status_str(st));
        return 1;
    }
    return 0;
}

int kvr_cli_run_main(int argc, char **argv)
{
    struct kvr_run_config c;
    kvr_run_config_default(&c);
    enum kvr_opts_result r = kvr_run_config_parse(&c, argc, argv);
    if (r != KVR_OPTS_GO)
        return r == KVR_OPTS_EXIT ? 0 : 2;
    struct kvr_workload w;
    double doc_ceiling;
    if (load_workload(&c, &w, &doc_ceiling))
        return 1;
    bool closed = w.reqs[0].arrival_ns == KVR_CLOSED_LOOP;
    if (prepare_loads(&c, &w, closed)) {
        kvr_workload_free(&w);
        return 2;
    }
    int rc = 0;
    if (kvr_mkdir_p(c.out)) {
        fprintf(stderr, "kvsim run: cannot create %s: %s\n", c.out, strerror(errno));
        rc = 1;
    }
    struct kvr_report_meta meta = {.source = "kvsim",
                                   .workload = c.workload,
                                   .workers = c.sim.workers,
                                   .seed = c.sim.router.seed,
                                   .load_kind = closed ? "concurrency" : "rate_scale",
                                   .cfg = &c.sim,
                                   .hit_ceiling_trace = doc_ceiling,
                                   .replicas = c.nreplicas > 0,
                                   .arrival_spread_ms = closed ? 0 : c.spread_ns / 1e6};
    if (rc == 0)
        rc = ceilings(&c, &w, &meta);
    if (rc == 0)
        rc = run_all(&c, &w, closed, &meta);
    kvr_workload_free(&w);
    return rc;
}
