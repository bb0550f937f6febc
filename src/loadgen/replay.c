/*
 * kvbench --mode load. Each run draws fresh prompts (the seed moves on by run), so no run finds a
 * cache an earlier one warmed. The encoder's state (the run, its policy, the seed, the prompt
 * scratch) changes only between kvr_client_end and kvr_client_begin, when nothing can encode.
 *
 * In open loop the owner's thread keeps the arrival times, and a ticker thread of the run does
 * meanwhile, every TICK_NS, what a client does for its stalled streams (kvr_client_wait_all's
 * resends and expiries): a request stalled early is resent when it stalls, not after the last
 * arrival, when its worker may no longer have its stream (kept 10 s) and its time to first token
 * would count the whole wait. The ticker is joined before the owner waits for the rest itself.
 */
#include "replay.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../sim/report.h"
#include "../sim/workload.h"
#include "codec.h"
#include "fleet.h"
#include "routers.h"
#include "stats.h"

#define TICK_NS (100 * KVR_NS_PER_MS) /* open loop: resends and expiries at least this often */

/* Open loop: the resends and expiries while the owner's thread sends. */
struct ticker {
    struct kvr_client *client; /* borrowed */
    uint64_t resend_ns;        /* --resend-ms */
    atomic_bool stop;          /* set by the owner */
    uint32_t resent;           /* read by the owner after the join */
    pthread_t thread;          /* */
};

struct replay {
    const struct kvr_bench_config *cfg;
    struct kvr_client *client;
    struct kvr_workload wl;                   /* its seed is the run's */
    bool closed;                              /* closed loop: each completion sends the next */
    uint64_t outs;                            /* output tokens of a run: about the gaps to expect */
    uint32_t *tok;                            /* prompt scratch of the encoder */
    uint64_t run;                             /* distinguishes request ids across runs */
    enum kvr_policy policy;                   /* this run's override */
    uint32_t workers, num_blocks, block_size; /* the hit-rate reference's fleet */
    double ceiling;          /* hit rate of one unbounded cache: no routing does better */
    double ceiling_capacity; /* ... of one cache as large as the fleet's (0: fleet unknown) */
    struct kvr_contract contract[KVR_POLICY_COUNT];   /* what each run broke of the contract */
    struct kvr_routers_run routers[KVR_POLICY_COUNT]; /* the routers' own figures of each run */
    struct kvr_routers_poll *polls; /* [2]: their answers before and after a run */
    FILE *requests;                 /* --per-request: requests.csv, open through the runs */
};

/* The client's encoder: request i of this run, with the policy override. */
static bool encode(void *ctx, uint32_t i, struct kvr_buf *out, uint32_t *max_tokens)
{
    struct replay *rp = ctx;
    const struct kvr_wl_request *w = &rp->wl.reqs[i];
    char id[64];
    snprintf(id, sizeof id, "b%" PRIu64 "-%u", rp->run, i);
    kvr_workload_tokens(&rp->wl, i, rp->tok);
    struct kvr_overrides ov = {KVR_OV_POLICY, rp->policy, 0, 0};
    *max_tokens = rp->cfg->max_tokens ? rp->cfg->max_tokens : w->osl;
    return kvr_wire_encode_generate(out, id, rp->tok, w->isl, *max_tokens, &ov) == KVR_OK;
}

/* The workload and the prompt scratch; 0, 1 (memory) or 2 (the workload). */
static int load_workload(struct replay *rp)
{
    const struct kvr_bench_config *cfg = rp->cfg;
    bool is_trace = false;
    kvr_workload_known(cfg->workload, &is_trace);
    uint64_t bad = 0;
    kvr_status st = is_trace
                        ? kvr_workload_load_trace(&rp->wl, cfg->workload, cfg->trace, cfg->requests,
                                                  cfg->seed, &bad)
                        : kvr_workload_generate(&rp->wl, cfg->workload, cfg->requests, cfg->seed);
    if (st != KVR_OK) {
        fprintf(stderr, "kvbench: workload %s: %s\n", cfg->workload, kvr_status_str(st));
        return 2;
    }
    rp->closed = rp->wl.reqs[0].arrival_ns == KVR_CLOSED_LOOP;
    uint32_t maxisl = 1;
    for (uint32_t i = 0; i < rp->wl.nreqs; i++) {
        maxisl = rp->wl.reqs[i].isl > maxisl ? rp->wl.reqs[i].isl : maxisl;
        rp->outs += cfg->max_tokens ? cfg->max_tokens : rp->wl.reqs[i].osl;
    }
    rp->tok = malloc((size_t)maxisl * sizeof *rp->tok);
    return rp->tok ? 0 : 1;
}

/* Without --workers: the fleet from its heartbeats, for the hit-rate reference. */
static void discover(struct replay *rp)
{
    if (rp->workers)
        return;
    struct kvr_fleet f;
    kvr_fleet_init(&f);
    if (kvr_fleet_discover(&f, rp->client->nc_sub, rp->cfg->net.prefix, rp->cfg->net.ns,
                           2500 * KVR_NS_PER_MS) &&
        f.block_size) {
        rp->workers = f.n;
        rp->num_blocks = (uint32_t)f.capacity;
        rp->block_size = f.block_size;
    }
    kvr_fleet_free(&f);
}

/* Max over mean of requests per worker, over the n workers ids[] of served requests (sorted). */
static double imbalance(uint64_t *ids, size_t n)
{
    if (!n)
        return 0;
    kvr_sort_u64(ids, n);
    size_t distinct = 0, run = 0, most = 0;
    for (size_t i = 0; i < n; i++) {
        run = i && ids[i] == ids[i - 1] ? run + 1 : 1;
        distinct += run == 1;
        most = run > most ? run : most;
    }
    return (double)most / ((double)n / (double)distinct);
}

/* Request i's line of requests.csv (--per-request): what a client sees of it. A client sees no
 * queueing nor preemption, and its gaps are between chunks (the mean per token is kept). */
static void record(const struct replay *rp, uint32_t i, uint64_t t0, double ttft, double e2e,
                   struct kvr_sim_request *out)
{
    const struct kvr_client_req *q = &rp->client->reqs[i];
    double span = (double)(q->t_last - q->t_first) / 1e6;
    *out = (struct kvr_sim_request){.index = i,
                                    .worker = q->worker,
                                    .group = kvr_workload_group(&rp->wl, i),
                                    .isl = rp->wl.reqs[i].isl,
                                    .osl = q->ntok,
                                    .cached_tokens = q->cached,
                                    .preemptions = KVR_SIM_UNKNOWN,
                                    .arrival_ms = (double)(q->t_send - t0) / 1e6,
                                    .queue_ms = NAN,
                                    .ttft_ms = ttft,
                                    .e2e_ms = e2e,
                                    .itl_mean_ms = q->ntok > 1 ? span / (q->ntok - 1) : 0,
                                    .itl_max_ms = NAN};
}

/* Whether q was answered in full: the requests every figure is of (the others fail). */
static bool answered(const struct kvr_client_req *q)
{
    return q->done && !q->error && q->t_first;
}

/* Under the client's mu: the gaps of the requests answered, moved to the front of the client's
 * (whose order is lost); how many. */
static uint32_t answered_gaps(struct kvr_client *c)
{
    uint32_t n = 0;
    for (uint32_t k = 0; k < c->ngaps; k++)
        if (c->gap_req[k] < c->n && answered(&c->reqs[c->gap_req[k]]))
            c->gaps[n++] = c->gaps[k];
    return n;
}

/* Under the client's mu: the run's records into res (ttft, e2e, itl, ids: room for every
 * request). A request's ITL is its mean gap, (last token - first token) / (tokens - 1), as
 * kvsim's per-request ITL (requests of two tokens or more). */
static void tally(struct replay *rp, uint64_t t0, double *ttft, double *e2e, double *itl,
                  uint64_t *ids, struct kvr_sim_result *res)
{
    struct kvr_client *c = rp->client;
    size_t nf = 0, nids = 0, nitl = 0;
    uint64_t cached = 0, isl = 0, toks = 0, last = t0;
    for (uint32_t i = 0; i < c->n; i++) {
        const struct kvr_client_req *q = &c->reqs[i];
        if (!answered(q)) {
            res->rejected++;
            continue;
        }
        ttft[nf] = (double)(q->t_first - q->t_send) / 1e6;
        e2e[nf] = (double)(q->t_last - q->t_send) / 1e6;
        if (res->per_request)
            record(rp, i, t0, ttft[nf], e2e[nf], &res->per_request[nf]);
        nf++;
        if (q->ntok > 1)
            itl[nitl++] = (double)(q->t_last - q->t_first) / 1e6 / (q->ntok - 1);
        cached += q->cached;
        isl += rp->wl.reqs[i].isl;
        toks += q->ntok;
        last = q->t_last > last ? q->t_last : last;
        if (q->worker)
            ids[nids++] = q->worker;
    }
    res->requests = c->n;
    res->finished = (uint32_t)nf;
    res->ttft_ms = kvr_stat_of(ttft, nf);
    res->e2e_ms = kvr_stat_of(e2e, nf);
    res->itl_ms = kvr_stat_of(c->gaps, answered_gaps(c));
    res->itl_request_ms = kvr_stat_of(itl, nitl);
    res->hit_rate = isl ? (double)cached / (double)isl : 0;
    res->makespan_s = (double)(last - t0) / 1e9;
    res->throughput_tok_s = res->makespan_s > 0 ? (double)toks / res->makespan_s : 0;
    res->imbalance = imbalance(ids, nids);
    if (c->gaps_dropped)
        kvr_log(KVR_LOG_WARN, "gaps_dropped", "gaps=%" PRIu64 " (out of memory)", c->gaps_dropped);
}

/* What the run measured, into res; 0, or 1 when memory is short. */
static int collect(struct replay *rp, enum kvr_policy policy, double load, uint64_t t0,
                   struct kvr_sim_result *res)
{
    size_t n = (size_t)rp->wl.nreqs + 1;
    double *ttft = calloc(n, sizeof *ttft), *e2e = calloc(n, sizeof *e2e);
    double *itl = calloc(n, sizeof *itl);
    uint64_t *ids = calloc(n, sizeof *ids);
    memset(res, 0, sizeof *res);
    res->policy = policy;
    res->load = load;
    if (rp->requests && !(res->per_request = calloc(n, sizeof *res->per_request))) {
        free(ids);
        ids = NULL; /* out of memory: no result */
    }
    if (ttft && e2e && itl && ids) {
        pthread_mutex_lock(&rp->client->mu);
        tally(rp, t0, ttft, e2e, itl, ids, res);
        pthread_mutex_unlock(&rp->client->mu);
        res->ttft_sorted = ttft; /* owned by res now */
    }
    free(e2e);
    free(itl);
    free(ids);
    if (!res->ttft_sorted) {
        free(ttft);
        kvr_sim_result_free(res);
        return 1;
    }
    return 0;
}

/* The ticker thread: a round of resends and expiries every TICK_NS until told to stop. */
static void *tick(void *arg)
{
    struct ticker *t = arg;
    while (!atomic_load(&t->stop)) {
        uint64_t t0 = kvr_now_ns();
        /* a round of its resends and expiries, then one wait (100 ms at most, less when a
         * request is decided meanwhile; another round if that was within the millisecond) */
        t->resent += kvr_client_wait_all(t->client, t0 + KVR_NS_PER_MS, t->resend_ns);
        uint64_t dt = kvr_now_ns() - t0;
        if (dt < TICK_NS && !atomic_load(&t->stop))
            kvr_sleep_ns(TICK_NS - dt);
    }
    return NULL;
}

/* Open loop: send every request at its arrival time (the ticker resending meanwhile); the
 * requests resent. */
static uint32_t send_open(struct replay *rp, double load, uint64_t t0)
{
    struct kvr_client *c = rp->client;
    struct ticker t = {.client = c, .resend_ns = rp->cfg->resend_ns};
    atomic_init(&t.stop, false);
    bool ticking = !pthread_create(&t.thread, NULL, tick, &t);
    if (!ticking)
        kvr_log(KVR_LOG_WARN, "no_ticker",
                "resends and expiries wait for the last arrival (no thread for them)");
    for (uint32_t i = 0; i < rp->wl.nreqs; i++) {
        uint64_t at = t0 + (uint64_t)((double)rp->wl.reqs[i].arrival_ns / load);
        uint64_t now = kvr_now_ns();
        if (at > now)
            kvr_sleep_ns(at - now);
        kvr_client_send(c, i);
    }
    if (!ticking)
        return 0;
    atomic_store(&t.stop, true);
    pthread_join(t.thread, NULL);
    return t.resent;
}

/* One run of the workload with one policy at load; fills res. 0 or 1. */
static int run_policy(struct replay *rp, enum kvr_policy policy, double load,
                      struct kvr_sim_result *res)
{
    const struct kvr_bench_config *cfg = rp->cfg;
    struct kvr_client *c = rp->client;
    rp->policy = policy;
    rp->run++;
    rp->wl.seed = cfg->seed + 7919 * (rp->run - 1);
    kvr_routers_poll(c, cfg->net.prefix, cfg->net.ns, &rp->polls[0]);
    if (kvr_client_begin(c, rp->wl.nreqs, rp->closed, encode, rp, rp->outs + 16) != KVR_OK)
        return 1;
    uint64_t t0 = kvr_now_ns();
    uint32_t resent = 0;
    if (rp->closed)
        kvr_client_start_closed(c, (uint32_t)load);
    else
        resent = send_open(rp, load, t0);
    resent += kvr_client_wait_all(c, kvr_now_ns() + cfg->timeout_ns, cfg->resend_ns);
    if (resent)
        kvr_log(KVR_LOG_WARN, "resent", "requests=%u (their streams stalled for %" PRIu64 " ms)",
                resent, (uint64_t)(cfg->resend_ns / KVR_NS_PER_MS));
    kvr_sleep_ns(cfg->linger_ns); /* a second final or stream may still be on its way */
    kvr_client_contract(c, 0, rp->wl.nreqs, &rp->contract[rp->run - 1]);
    kvr_routers_poll(c, cfg->net.prefix, cfg->net.ns, &rp->polls[1]);
    kvr_routers_diff(&rp->polls[0], &rp->polls[1], &rp->routers[rp->run - 1]);
    int rc = collect(rp, policy, load, t0, res);
    kvr_client_end(c);
    return rc;
}

static void print_row(const struct replay *rp, const struct kvr_sim_result *r,
                      const struct kvr_contract *k, const struct kvr_routers_run *rr)
{
    char line[512];
    printf("%-18s load=%-6g ttft_ms mean=%.1f p50=%.1f p90=%.1f p99=%.1f  itl_ms mean=%.2f "
           "p99=%.2f  e2e_ms mean=%.0f  hit=%.3f (%.0f%% of ceiling %.3f)  tok/s=%.0f  "
           "finished=%u failed=%u\n",
           kvr_policy_name(r->policy), r->load, r->ttft_ms.mean, r->ttft_ms.p50, r->ttft_ms.p90,
           r->ttft_ms.p99, r->itl_ms.mean, r->itl_ms.p99, r->e2e_ms.mean, r->hit_rate,
           rp->ceiling > 0 ? 100 * r->hit_rate / rp->ceiling : 0, rp->ceiling, r->throughput_tok_s,
           r->finished, r->rejected);
    printf("%-18s contract: %s\n", kvr_policy_name(r->policy),
           kvr_contract_format(k, line, sizeof line));
    if (r->rejected)
        printf("%-18s errors: %s\n", kvr_policy_name(r->policy),
               kvr_contract_codes(k->errors, line, sizeof line));
    if (k->double_finals)
        printf("%-18s finals after the answer: %s\n", kvr_policy_name(r->policy),
               kvr_contract_codes(k->late, line, sizeof line));
    printf("%-18s routers: %s\n", kvr_policy_name(r->policy),
           kvr_routers_format(rr, line, sizeof line));
    fflush(stdout);
}

static void print_ratio(const struct kvr_sim_result *res)
{
    printf("ratio %s/%s: ttft mean %.3f p90 %.3f, hit %.3f vs %.3f\n",
           kvr_policy_name(res[0].policy), kvr_policy_name(res[1].policy),
           res[1].ttft_ms.mean > 0 ? res[0].ttft_ms.mean / res[1].ttft_ms.mean : 0,
           res[1].ttft_ms.p90 > 0 ? res[0].ttft_ms.p90 / res[1].ttft_ms.p90 : 0, res[0].hit_rate,
           res[1].hit_rate);
}

/* a over b as "0.36x (64% lower)" or "1.20x (20% higher)". */
static const char *versus(char *out, size_t size, double a, double b)
{
    double r = b > 0 ? a / b : 0;
    snprintf(out, size, "%.2fx (%.0f%% %s)", r, 100 * (r < 1 ? 1 - r : r - 1),
             r < 1 ? "lower" : "higher");
    return out;
}

/*
 * The closing lines, for someone who has not read the docs: what was compared, by how much the
 * first policy won or lost on time to first token against the second (and the best of the rest),
 * why (the hit rates against what any routing could reach), and where the report is.
 */
static void print_summary(const struct replay *rp, const struct kvr_sim_result *res, size_t n,
                          double seconds)
{
    const struct kvr_sim_result *a = &res[0], *b = &res[1], *best = NULL;
    for (size_t i = 2; i < n; i++)
        if (!best || res[i].ttft_ms.p90 < best->ttft_ms.p90)
            best = &res[i];
    const char *an = kvr_policy_name(a->policy), *bn = kvr_policy_name(b->policy);
    char p90[64];
    printf(
        "\nIn short: on %u workers, %u requests of %s (%zu runs, %.0f s), %s's p90 time to first "
        "token was %.0f ms against %s's %.0f ms, %s; mean %.2fx",
        rp->workers, rp->wl.nreqs, rp->cfg->workload, n, seconds, an, a->ttft_ms.p90, bn,
        b->ttft_ms.p90, versus(p90, sizeof p90, a->ttft_ms.p90, b->ttft_ms.p90),
        b->ttft_ms.mean > 0 ? a->ttft_ms.mean / b->ttft_ms.mean : 0);
    if (best)
        printf("; against %s, the best of the others, p90 %.2fx", kvr_policy_name(best->policy),
               best->ttft_ms.p90 > 0 ? a->ttft_ms.p90 / best->ttft_ms.p90 : 0);
    printf(".\nWhy: the workers' caches served %.0f%% of prompt tokens with %s, %.0f%% with %s; no "
           "routing could pass %.0f%% here.\n",
           100 * a->hit_rate, an, 100 * b->hit_rate, bn, 100 * rp->ceiling);
    if (rp->cfg->out[0])
        printf("Report and plots: %s/report.md, %s/*.png\n", rp->cfg->out, rp->cfg->out);
}

/* The contract's counts as JSON object members. */
static void contract_json(FILE *f, const struct kvr_contract *k)
{
    fprintf(f,
            "\"requests\": %u, \"finished\": %u, \"unanswered\": %u, \"double_finals\": %u, "
            "\"extra_finals\": %u, \"second_streams\": %u, \"second_stream_tokens\": %llu, "
            "\"two_workers\": %u, \"spurious_finals\": %u, \"missing_tokens\": %u, "
            "\"extra_tokens\": %u, \"no_responders\": %u, \"repeat_finals\": %u, "
            "\"gaps_filled\": %u, \"malformed\": %llu, \"dropped\": %llu",
            k->requests, k->finished, k->unanswered, k->double_finals, k->extra_finals,
            k->second_streams, (unsigned long long)k->second_tokens, k->two_workers,
            k->spurious_finals, k->missing_tokens, k->extra_tokens, k->no_responders,
            k->repeat_finals, k->gaps_filled, (unsigned long long)k->malformed,
            (unsigned long long)k->dropped);
    const uint32_t *maps[2] = {k->errors, k->late};
    const char *names[2] = {"errors", "finals_after_answer"};
    for (int m = 0; m < 2; m++) {
        fprintf(f, ", \"%s\": {", names[m]);
        for (uint32_t e = 0, any = 0; e < 64; e++)
            if (maps[m][e])
                fprintf(f, "%s\"%u\": %u", any++ ? ", " : "", e, maps[m][e]);
        fprintf(f, "}");
    }
}

/* The "contract" and "routers" arrays (one object per run) as JSON object members. */
static void runs_json(FILE *f, const struct replay *rp, const struct kvr_sim_result *res, size_t n)
{
    fprintf(f, "  \"contract\": [\n");
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "    {\"policy\": \"%s\", ", kvr_policy_name(res[i].policy));
        contract_json(f, &rp->contract[i]);
        fprintf(f, "}%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "  ],\n  \"routers\": [\n");
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "    {\"policy\": \"%s\", ", kvr_policy_name(res[i].policy));
        kvr_routers_json(f, &rp->routers[i]);
        fprintf(f, "}%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "  ]\n");
}

/* report.md's tables of the same. */
static void runs_md(FILE *f, const struct replay *rp, const struct kvr_sim_result *res, size_t n)
{
    fprintf(f,
            "\n## Client contract (docs/protocol.md)\n\nRequests whose streams broke it, "
            "counted by the client after each request's answer; repeated finals and filled "
            "gaps are allowed (a worker's cut connection).\n\n| policy | requests | finished | "
            "double finals | second streams (tokens) | two workers | spurious finals | "
            "missing tokens | extra tokens | no responders | unanswered | repeated finals | "
            "gaps filled |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < n; i++) {
        const struct kvr_contract *k = &rp->contract[i];
        fprintf(f, "| %s | %u | %u | %u | %u (%llu) | %u | %u | %u | %u | %u | %u | %u | %u |\n",
                kvr_policy_name(res[i].policy), k->requests, k->finished, k->double_finals,
                k->second_streams, (unsigned long long)k->second_tokens, k->two_workers,
                k->spurious_finals, k->missing_tokens, k->extra_tokens, k->no_responders,
                k->unanswered, k->repeat_finals, k->gaps_filled);
    }
    fprintf(f, "\n## The routers' own figures ($SRV.STATS.kvrouter)\n\nEach router's difference "
               "between just before and just after the run, summed over the routers that "
               "answered (one new or restarted meanwhile counted from its start).\n\n| policy | "
               "routers | decisions | errors | CPU s | gossip sent |\n"
               "|---|---:|---:|---|---:|---:|\n");
    for (size_t i = 0; i < n; i++) {
        const struct kvr_routers_run *r = &rp->routers[i];
        char errs[512], bytes[32];
        fprintf(f, "| %s | %u | %llu | %s | %.2f | %s |\n", kvr_policy_name(res[i].policy),
                r->answered, (unsigned long long)r->decisions,
                kvr_routers_errors(r, errs, sizeof errs), r->cpu_seconds,
                kvr_routers_bytes(r->gossip_bytes, bytes, sizeof bytes));
    }
}

/*
 * report.json gets a "contract" and a "routers" array (one object per run) before its closing
 * brace, report.md their tables: what each run's streams broke of docs/protocol.md, and the
 * routers' own figures of each run. 0, or -1 when a file would not do.
 */
static int append_runs(const struct replay *rp, const struct kvr_sim_result *res, size_t n)
{
    char path[4096], *text = NULL;
    snprintf(path, sizeof path, "%s/report.json", rp->cfg->out);
    FILE *f = fopen(path, "r");
    long len = f && !fseek(f, 0, SEEK_END) ? ftell(f) : -1;
    if (len > 0 && !fseek(f, 0, SEEK_SET) && (text = malloc((size_t)len + 1)) &&
        fread(text, 1, (size_t)len, f) != (size_t)len)
        len = -1;
    if (f)
        fclose(f);
    char *brace = len > 0 && text ? text + len : NULL;
    while (brace && brace > text && *--brace != '}')
        ;
    if (!brace || *brace != '}' || !(f = fopen(path, "w"))) {
        free(text);
        return -1;
    }
    while (brace > text && (brace[-1] == '\n' || brace[-1] == ' '))
        brace--;
    fprintf(f, "%.*s,\n", (int)(brace - text), text);
    runs_json(f, rp, res, n);
    fprintf(f, "}\n");
    free(text);
    int rc = fclose(f) ? -1 : 0;
    snprintf(path, sizeof path, "%s/report.md", rp->cfg->out);
    if (rc || !(f = fopen(path, "a")))
        return -1;
    runs_md(f, rp, res, n);
    return fclose(f) ? -1 : 0;
}

/* report.json, report.md and plots into --out, when given. */
static void write_report(const struct replay *rp, const struct kvr_sim_result *res, size_t n)
{
    const struct kvr_bench_config *cfg = rp->cfg;
    if (!cfg->out[0])
        return;
    struct kvr_report_meta meta = {.source = "kvbench",
                                   .workload = cfg->workload,
                                   .workers = rp->workers,
                                   .seed = cfg->seed,
                                   .load_kind = rp->closed ? "concurrency" : "rate_scale"};
    meta.hit_ceiling = rp->ceiling;
    meta.hit_ceiling_capacity = rp->ceiling_capacity;
    kvr_mkdir_p(cfg->out);
    if (kvr_report_write(cfg->out, &meta, res, n) != KVR_OK || append_runs(rp, res, n))
        fprintf(stderr, "kvbench: cannot write %s/report.json\n", cfg->out);
    else if (kvr_report_plots(cfg->out, &meta, res, n) != KVR_OK)
        fprintf(stderr, "kvbench: plots not drawn (is gnuplot installed?)\n");
    else
        printf("wrote %s/report.json, %s/report.md and plots\n", cfg->out, cfg->out);
}

/* One run per policy, their lines and the report; 1 if a run failed or finished nothing. */
static int run_policies(struct replay *rp)
{
    const struct kvr_bench_config *cfg = rp->cfg;
    size_t np = cfg->npolicies;
    double load = rp->closed ? cfg->concurrency : cfg->rate_scale;
    struct kvr_sim_result *res = calloc(np ? np : 1, sizeof *res);
    int rc = res ? 0 : 1;
    uint64_t t0 = kvr_now_ns();
    if (rc == 0 && cfg->per_request &&
        (kvr_mkdir_p(cfg->out) || !(rp->requests = kvr_report_requests_open(cfg->out)))) {
        fprintf(stderr, "kvbench: cannot write %s/requests.csv: %s\n", cfg->out, strerror(errno));
        rc = 1;
    }
    struct kvr_report_meta meta = {.source = "kvbench"}; /* the runs' names in requests.csv */
    for (size_t p = 0; p < np && rc == 0; p++) {
        rc = run_policy(rp, cfg->policy[p], load, &res[p]);
        if (rc == 0 && rp->requests &&
            kvr_report_requests_write(rp->requests, &meta, &res[p]) != KVR_OK) {
            fprintf(stderr, "kvbench: cannot write %s/requests.csv\n", cfg->out);
            rc = 1;
        }
        if (rc == 0)
            print_row(rp, &res[p], &rp->contract[p], &rp->routers[p]);
    }
    if (rp->requests && fclose(rp->requests) && rc == 0) {
        fprintf(stderr, "kvbench: cannot write %s/requests.csv\n", cfg->out);
        rc = 1;
    }
    rp->requests = NULL;
    if (rc == 0) {
        if (np >= 2)
            print_ratio(res);
        write_report(rp, res, np);
        if (np >= 2)
            print_summary(rp, res, np, (double)(kvr_now_ns() - t0) / 1e9);
    }
    for (size_t p = 0; res && p < np; p++) {
        rc |= res[p].finished == 0;
        kvr_sim_result_free(&res[p]);
    }
    free(res);
    return rc;
}

int kvr_replay_run(const struct kvr_bench_config *cfg, struct kvr_client *client)
{
    struct replay rp = {.cfg = cfg,
                        .client = client,
                        .workers = cfg->workers,
                        .num_blocks = cfg->num_blocks,
                        .block_size = cfg->block_size,
                        .polls = calloc(2, sizeof(struct kvr_routers_poll))};
    int rc = rp.polls ? load_workload(&rp) : 1;
    if (rc == 0) {
        discover(&rp);
        kvr_sim_hit_ceiling(&rp.wl, rp.block_size, 0, &rp.ceiling);
        if (rp.workers)
            kvr_sim_hit_ceiling(&rp.wl, rp.block_size, (uint64_t)rp.workers * rp.num_blocks,
                                &rp.ceiling_capacity);
        rc = run_policies(&rp);
    }
    kvr_workload_free(&rp.wl);
    free(rp.tok);
    free(rp.polls);
    return rc;
}
