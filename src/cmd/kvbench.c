/*
 * kvbench: load generator and client-side measurements for kvrouter on NATS.
 *
 *   kvbench --workload seed --policies kv,round_robin [--concurrency C | --rate-scale X] --out DIR
 *       replays a workload of BENCHMARKS.md through the routers (kv.<ns>.generate), one run per
 *       policy (a per-request policy override, so every run uses the same routers and workers),
 *       and measures what a client feels: time to first token, inter-token latency, end-to-end,
 *       throughput, prefix-cache hit (from the workers' reports), errors. Writes the same
 *       report.json / report.md / plots as kvsim.
 *   kvbench --mode hop [--requests N]
 *       against --null workers: the same 1k-token request routed and sent straight to a worker,
 *       alternating, then the highest routed rate; ends with one key=value line.
 *
 * Threads: the main thread publishes (open loop) and waits; nats.c's delivery thread records
 * response chunks and, in closed loop, publishes the next request.
 */
#define _DEFAULT_SOURCE
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../sim/report.h"
#include "../sim/workload.h"
#include "codec.h"
#include "kvr/policy.h"
#include "opts.h"
#include "util.h"

struct opts {
    char nats[KVR_OPT_STR_MAX], ns[KVR_OPT_STR_MAX], prefix[KVR_OPT_STR_MAX];
    char workload[KVR_OPT_STR_MAX], policies[KVR_OPT_STR_MAX], out[KVR_OPT_STR_MAX];
    char trace[KVR_OPT_STR_MAX], mode[KVR_OPT_STR_MAX], log_level[KVR_OPT_STR_MAX];
    uint32_t requests, concurrency, block_size, workers, num_blocks, max_tokens, hop_window;
    uint64_t seed, timeout_ms, worker_id, hop_seconds, digest_wait_ms, resend_ms;
    double rate_scale;
};

struct breq {
    uint64_t t_send, t_first, t_last; /* ns */
    uint32_t ntok;                    /* tokens received */
    uint32_t cached;                  /* prompt tokens the worker had cached */
    uint64_t worker;                  /* who served it */
    uint32_t error;                   /* kvr_status of a failure */
    uint64_t t_resent;                /* last resend, ns */
    uint32_t resends;                 /* */
    bool sent, heard, done;           /* heard: some chunk came */
};

struct bench {
    struct opts o;
    natsConnection *nc_pub, *nc_sub;
    natsSubscription *sub;
    char inbox[128];
    char subj_gen[256];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct kvr_workload wl;
    struct breq *reqs;       /* one per workload request, under mu */
    uint32_t n, next, ndone; /* under mu */
    bool closed;             /* closed loop: each completion sends the next */
    enum kvr_policy policy;  /* this run's override */
    double *gaps;            /* every inter-token gap, ms, under mu */
    size_t ngaps, capgaps;
    uint64_t run;       /* distinguishes request ids across runs */
    uint32_t *tok;      /* prompt scratch (publishing thread) */
    struct kvr_buf buf; /* (publishing thread) */
};

/* Request i's bytes into buf (tok: prompt scratch) and its reply subject into reply. */
static bool encode_request(struct bench *b, uint32_t i, uint32_t *tok, struct kvr_buf *buf,
                           char *reply, size_t len)
{
    const struct kvr_wl_request *w = &b->wl.reqs[i];
    char id[64];
    snprintf(id, sizeof id, "b%" PRIu64 "-%u", b->run, i);
    snprintf(reply, len, "%s.%u", b->inbox, i);
    kvr_workload_tokens(&b->wl, i, tok);
    struct kvr_overrides ov = {KVR_OV_POLICY, b->policy, 0, 0};
    uint32_t osl = b->o.max_tokens ? b->o.max_tokens : w->osl;
    return kvr_wire_encode_generate(buf, id, tok, w->isl, osl, &ov) == KVR_OK;
}

static void send_request(struct bench *b, uint32_t i)
{
    char reply[192];
    if (!encode_request(b, i, b->tok, &b->buf, reply, sizeof reply))
        return;
    pthread_mutex_lock(&b->mu);
    b->reqs[i].t_send = kvr_now_ns();
    b->reqs[i].sent = true;
    pthread_mutex_unlock(&b->mu);
    natsConnection_PublishRequest(b->nc_pub, b->subj_gen, reply, b->buf.data, (int)b->buf.len);
}

/*
 * Under mu, from the waiting thread: what a client of a router fleet does when nothing came back
 * for --resend-ms (its router may have died with the request): send it again, same reply subject
 * and id; a router that has it in flight absorbs the resend. At most 3 times.
 */
static void resend_silent(struct bench *b, uint32_t *tok, struct kvr_buf *buf)
{
    uint64_t now = kvr_now_ns(), after = b->o.resend_ms * 1000000ull;
    for (uint32_t i = 0; after && i < b->n; i++) {
        struct breq *q = &b->reqs[i];
        uint64_t last = q->t_resent ? q->t_resent : q->t_send;
        if (!q->sent || q->heard || q->done || q->resends >= 3 || now - last < after)
            continue;
        char reply[192];
        q->t_resent = now;
        q->resends++;
        pthread_mutex_unlock(&b->mu);
        if (encode_request(b, i, tok, buf, reply, sizeof reply))
            natsConnection_PublishRequest(b->nc_pub, b->subj_gen, reply, buf->data, (int)buf->len);
        pthread_mutex_lock(&b->mu);
    }
}

/* Responses for "<inbox>.<i>". */
static void on_chunk(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc;
    (void)sub;
    struct bench *b = ctx;
    uint64_t now = kvr_now_ns();
    const char *dot = strrchr(natsMsg_GetSubject(msg), '.');
    uint32_t i = dot ? (uint32_t)strtoul(dot + 1, NULL, 10) : UINT32_MAX;
    struct kvr_wire_response r;
    kvr_status st =
        kvr_wire_decode_response(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), &r);
    natsMsg_Destroy(msg);
    int issue = -1;
    pthread_mutex_lock(&b->mu);
    if (st == KVR_OK && i < b->n && b->reqs[i].sent && !b->reqs[i].done) {
        struct breq *q = &b->reqs[i];
        q->heard = true;
        if (r.ntokens) {
            if (!q->t_first) {
                q->t_first = now;
            } else if (b->ngaps < b->capgaps) {
                b->gaps[b->ngaps++] = (double)(now - q->t_last) / 1e6;
            }
            q->t_last = now;
            q->ntok += r.ntokens;
        }
        if (r.worker_id)
            q->worker = r.worker_id;
        if (r.final) {
            q->done = true;
            q->error = r.error_code;
            q->cached = r.cached_tokens;
            if (!q->t_last)
                q->t_last = now;
            b->ndone++;
            if (b->closed && b->next < b->n)
                issue = (int)b->next++;
            pthread_cond_broadcast(&b->cv);
        }
    }
    pthread_mutex_unlock(&b->mu);
    if (st == KVR_OK)
        kvr_wire_response_free(&r);
    if (issue >= 0)
        send_request(b, (uint32_t)issue);
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, c = *(const double *)y;
    return (a > c) - (a < c);
}

static struct kvr_stat stat_of(double *v, size_t n)
{
    struct kvr_stat s = {0, 0, 0, 0, 0};
    if (!n)
        return s;
    qsort(v, n, sizeof *v, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    s.mean = sum / (double)n;
    s.p50 = v[(size_t)(0.50 * (double)(n - 1))];
    s.p90 = v[(size_t)(0.90 * (double)(n - 1))];
    s.p99 = v[(size_t)(0.99 * (double)(n - 1))];
    s.max = v[n - 1];
    return s;
}

/* One run of the workload with one policy; fills res. */
static int run_policy(struct bench *b, enum kvr_policy policy, double load,
                      struct kvr_sim_result *res)
{
    pthread_mutex_lock(&b->mu);
    memset(b->reqs, 0, b->n * sizeof *b->reqs);
    b->next = b->ndone = 0;
    b->ngaps = 0;
    b->policy = policy;
    b->run++;
    /* fresh prompts for every run, so a run finds no cache the previous one warmed */
    b->wl.seed = b->o.seed + 7919 * (b->run - 1);
    pthread_mutex_unlock(&b->mu);
    uint64_t t0 = kvr_now_ns();
    if (b->closed) {
        uint32_t c = (uint32_t)load;
        pthread_mutex_lock(&b->mu);
        uint32_t first = c < b->n ? c : b->n;
        b->next = first;
        pthread_mutex_unlock(&b->mu);
        for (uint32_t i = 0; i < first; i++)
            send_request(b, i);
    } else {
        for (uint32_t i = 0; i < b->n; i++) {
            uint64_t at = t0 + (uint64_t)((double)b->wl.reqs[i].arrival_ns / load);
            uint64_t now = kvr_now_ns();
            if (at > now)
                kvr_sleep_ns(at - now);
            send_request(b, i);
        }
    }
    uint64_t deadline = kvr_now_ns() + b->o.timeout_ms * 1000000ull;
    uint32_t maxisl = 1;
    for (uint32_t i = 0; i < b->n; i++)
        maxisl = b->wl.reqs[i].isl > maxisl ? b->wl.reqs[i].isl : maxisl;
    uint32_t *tok = malloc((size_t)maxisl * sizeof *tok);
    struct kvr_buf rbuf = {0};
    pthread_mutex_lock(&b->mu);
    while (b->ndone < b->n && kvr_now_ns() < deadline) {
        if (tok)
            resend_silent(b, tok, &rbuf);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    }
    free(tok);
    kvr_buf_free(&rbuf);
    uint32_t resent = 0;
    for (uint32_t i = 0; i < b->n; i++)
        resent += b->reqs[i].resends;
    if (resent)
        kvr_log(KVR_LOG_WARN, "resent", "requests=%u (nothing came back for %" PRIu64 " ms)",
                resent, b->o.resend_ms);
    /* collect */
    double *ttft = calloc(b->n + 1, sizeof *ttft), *e2e = calloc(b->n + 1, sizeof *e2e);
    size_t nf = 0;
    uint64_t cached = 0, isl = 0, toks = 0, last = t0;
    uint64_t ids[64] = {0}, counts[64] = {0};
    memset(res, 0, sizeof *res);
    for (uint32_t i = 0; i < b->n && ttft && e2e; i++) {
        struct breq *q = &b->reqs[i];
        if (!q->done || q->error || !q->t_first) {
            res->rejected++;
            continue;
        }
        ttft[nf] = (double)(q->t_first - q->t_send) / 1e6;
        e2e[nf] = (double)(q->t_last - q->t_send) / 1e6;
        nf++;
        cached += q->cached;
        isl += b->wl.reqs[i].isl;
        toks += q->ntok;
        last = q->t_last > last ? q->t_last : last;
        for (int k = 0; k < 64; k++) {
            if (ids[k] == q->worker || !ids[k]) {
                ids[k] = q->worker;
                counts[k]++;
                break;
            }
        }
    }
    res->policy = policy;
    res->load = load;
    res->requests = b->n;
    res->finished = (uint32_t)nf;
    res->ttft_ms = stat_of(ttft, nf);
    res->e2e_ms = stat_of(e2e, nf);
    res->itl_ms = stat_of(b->gaps, b->ngaps);
    res->ttft_sorted = ttft;
    res->hit_rate = isl ? (double)cached / (double)isl : 0;
    res->makespan_s = (double)(last - t0) / 1e9;
    res->throughput_tok_s = res->makespan_s > 0 ? (double)toks / res->makespan_s : 0;
    uint64_t maxc = 0, total = 0, nw = 0;
    for (int k = 0; k < 64 && ids[k]; k++) {
        maxc = counts[k] > maxc ? counts[k] : maxc;
        total += counts[k];
        nw++;
    }
    res->imbalance = total ? (double)maxc / ((double)total / (double)nw) : 0;
    pthread_mutex_unlock(&b->mu);
    free(e2e);
    return ttft ? 0 : 1;
}

/* Workers seen through their heartbeats (the fleet's size and shape, for reports and hop mode). */
static struct {
    pthread_mutex_t mu;
    uint64_t ids[256];
    uint32_t n, block_size;
    uint64_t capacity;
} fleet = {PTHREAD_MUTEX_INITIALIZER, {0}, 0, 0, 0};

static void on_hb(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc;
    (void)sub;
    (void)ctx;
    struct kvr_wire_heartbeat h;
    if (kvr_wire_decode_heartbeat(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), &h) ==
        KVR_OK) {
        pthread_mutex_lock(&fleet.mu);
        bool known = false;
        for (uint32_t i = 0; i < fleet.n; i++)
            known |= fleet.ids[i] == h.info.id;
        if (!known && !h.draining && fleet.n < 256) {
            fleet.ids[fleet.n++] = h.info.id;
            fleet.block_size = h.info.block_size;
            fleet.capacity = h.info.capacity_blocks;
        }
        pthread_mutex_unlock(&fleet.mu);
        kvr_wire_heartbeat_free(&h);
    }
    natsMsg_Destroy(msg);
}

/* Listen to heartbeats for up to ms (less once a worker is seen and quiet follows). */
static uint32_t discover(struct bench *b, uint32_t ms)
{
    char subj[256];
    natsSubscription *hb = NULL;
    kvr_subject(subj, sizeof subj, b->o.prefix, b->o.ns, "ev.*.hb");
    if (natsConnection_Subscribe(&hb, b->nc_sub, subj, on_hb, NULL) != NATS_OK)
        return 0;
    for (uint32_t t = 0; t < ms; t += 10)
        kvr_sleep_ns(10000000);
    natsSubscription_Unsubscribe(hb);
    natsSubscription_Destroy(hb);
    pthread_mutex_lock(&fleet.mu);
    uint32_t n = fleet.n;
    pthread_mutex_unlock(&fleet.mu);
    return n;
}

static int bench_load(struct bench *b)
{
    bool is_trace = false;
    kvr_workload_known(b->o.workload, &is_trace);
    uint64_t bad = 0;
    kvr_status st = is_trace
                        ? kvr_workload_load_trace(&b->wl, b->o.workload, b->o.trace, b->o.requests,
                                                  b->o.seed, &bad)
                        : kvr_workload_generate(&b->wl, b->o.workload, b->o.requests, b->o.seed);
    if (st != KVR_OK) {
        fprintf(stderr, "kvbench: workload %s: %s\n", b->o.workload, kvr_status_str(st));
        return 2;
    }
    b->n = b->wl.nreqs;
    b->closed = b->wl.reqs[0].arrival_ns == KVR_CLOSED_LOOP;
    uint32_t maxisl = 1;
    uint64_t outs = 0;
    for (uint32_t i = 0; i < b->n; i++) {
        maxisl = b->wl.reqs[i].isl > maxisl ? b->wl.reqs[i].isl : maxisl;
        outs += b->o.max_tokens ? b->o.max_tokens : b->wl.reqs[i].osl;
    }
    b->reqs = calloc(b->n, sizeof *b->reqs);
    b->tok = malloc((size_t)maxisl * sizeof *b->tok);
    b->capgaps = (size_t)outs + 16;
    b->gaps = malloc(b->capgaps * sizeof *b->gaps);
    return b->reqs && b->tok && b->gaps ? 0 : 1;
}

static int load_mode(struct bench *b)
{
    int rc = bench_load(b);
    if (rc)
        return rc;
    if (!b->o.workers && discover(b, 2500)) { /* the fleet, for the hit-rate reference */
        b->o.workers = fleet.n;
        b->o.num_blocks = (uint32_t)fleet.capacity;
        b->o.block_size = fleet.block_size;
    }
    enum kvr_policy pol[KVR_POLICY_COUNT];
    size_t np = 0;
    for (const char *s = b->o.policies; *s && np < KVR_POLICY_COUNT;) {
        size_t len = strcspn(s, ",");
        if (kvr_policy_parse(s, len, &pol[np]) != KVR_OK) {
            fprintf(stderr, "kvbench: unknown policy '%.*s'\n", (int)len, s);
            return 2;
        }
        np++;
        s += len + (s[len] == ',');
    }
    double load = b->closed ? (b->o.concurrency ? b->o.concurrency : 20)
                            : (b->o.rate_scale > 0 ? b->o.rate_scale : 1.0);
    struct kvr_sim_result *res = calloc(np, sizeof *res);
    for (size_t p = 0; p < np && res; p++) {
        if (run_policy(b, pol[p], load, &res[p]))
            return 1;
        const struct kvr_sim_result *r = &res[p];
        printf("%-18s load=%-6g ttft_ms mean=%.1f p50=%.1f p90=%.1f p99=%.1f  itl_ms mean=%.2f "
               "p99=%.2f  e2e_ms mean=%.0f  hit=%.3f  tok/s=%.0f  finished=%u failed=%u\n",
               kvr_policy_name(r->policy), r->load, r->ttft_ms.mean, r->ttft_ms.p50, r->ttft_ms.p90,
               r->ttft_ms.p99, r->itl_ms.mean, r->itl_ms.p99, r->e2e_ms.mean, r->hit_rate,
               r->throughput_tok_s, r->finished, r->rejected);
        fflush(stdout);
    }
    if (!res)
        return 1;
    if (np >= 2)
        printf("ratio %s/%s: ttft mean %.3f p90 %.3f, hit %.3f vs %.3f\n",
               kvr_policy_name(res[0].policy), kvr_policy_name(res[1].policy),
               res[1].ttft_ms.mean > 0 ? res[0].ttft_ms.mean / res[1].ttft_ms.mean : 0,
               res[1].ttft_ms.p90 > 0 ? res[0].ttft_ms.p90 / res[1].ttft_ms.p90 : 0,
               res[0].hit_rate, res[1].hit_rate);
    if (b->o.out[0]) {
        struct kvr_report_meta meta = {.source = "kvbench",
                                       .workload = b->o.workload,
                                       .workers = b->o.workers,
                                       .seed = b->o.seed,
                                       .load_kind = b->closed ? "concurrency" : "rate_scale"};
        kvr_sim_hit_ceiling(&b->wl, b->o.block_size, 0, &meta.hit_ceiling);
        if (b->o.workers)
            kvr_sim_hit_ceiling(&b->wl, b->o.block_size, (uint64_t)b->o.workers * b->o.num_blocks,
                                &meta.hit_ceiling_capacity);
        kvr_mkdir_p(b->o.out);
        if (kvr_report_write(b->o.out, &meta, res, np) != KVR_OK)
            fprintf(stderr, "kvbench: cannot write %s/report.json\n", b->o.out);
        else if (kvr_report_plots(b->o.out, &meta, res, np) != KVR_OK)
            fprintf(stderr, "kvbench: plots not drawn (is gnuplot installed?)\n");
        else
            printf("wrote %s/report.json, %s/report.md and plots\n", b->o.out, b->o.out);
    }
    int failed = 0;
    for (size_t p = 0; p < np; p++) {
        failed |= res[p].finished == 0;
        kvr_sim_result_free(&res[p]);
    }
    free(res);
    return failed;
}

/* --- NATS-hop mode -----------------------------------------------------------------------------
 */

/* Send request i (routed or direct) and wait for its final chunk; returns ns, or 0 on failure. */
static uint64_t one_hop(struct bench *b, uint32_t i, const char *subject, const void *data,
                        size_t len)
{
    char reply[192];
    snprintf(reply, sizeof reply, "%s.%u", b->inbox, i);
    pthread_mutex_lock(&b->mu);
    b->reqs[i] = (struct breq){.t_send = kvr_now_ns(), .sent = true};
    pthread_mutex_unlock(&b->mu);
    natsConnection_PublishRequest(b->nc_pub, subject, reply, data, (int)len);
    uint64_t deadline = kvr_now_ns() + 5000000000ull;
    pthread_mutex_lock(&b->mu);
    while (!b->reqs[i].done && kvr_now_ns() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    }
    uint64_t dt = b->reqs[i].done && !b->reqs[i].error ? b->reqs[i].t_last - b->reqs[i].t_send : 0;
    pthread_mutex_unlock(&b->mu);
    return dt;
}

static double pct(uint64_t *v, size_t n, double q)
{
    if (!n)
        return 0;
    for (size_t i = 1; i < n; i++) { /* insertion sort: a few thousand samples */
        uint64_t x = v[i];
        size_t j = i;
        for (; j > 0 && v[j - 1] > x; j--)
            v[j] = v[j - 1];
        v[j] = x;
    }
    return (double)v[(size_t)(q * (double)(n - 1))] / 1000.0;
}

static int hop_mode(struct bench *b)
{
    uint32_t n = b->o.requests ? b->o.requests : 2000;
    uint32_t window = b->o.hop_window ? b->o.hop_window : 256;
    uint64_t wid = b->o.worker_id;
    if (!wid && discover(b, 2500))
        wid = fleet.ids[0];
    if (!wid) {
        fprintf(stderr, "kvbench: no worker heartbeat seen (start kvworker --null)\n");
        return 1;
    }
    uint32_t total = 2 * n + 100000 * (uint32_t)(b->o.hop_seconds ? b->o.hop_seconds : 1) + 1;
    b->n = total;
    b->reqs = calloc(total, sizeof *b->reqs);
    uint32_t tok[1024];
    for (uint32_t t = 0; t < 1024; t++)
        tok[t] = (t * 2654435761u) % 32000;
    struct kvr_buf req = {0}, direct = {0};
    uint64_t *routed = calloc(n, sizeof *routed), *straight = calloc(n, sizeof *straight);
    if (!b->reqs || !routed || !straight)
        return 1;
    char subj_worker[256], tail[64];
    snprintf(tail, sizeof tail, "worker.%" PRIu64 ".generate", wid);
    kvr_subject(subj_worker, sizeof subj_worker, b->o.prefix, b->o.ns, tail);
    size_t nr = 0, nd = 0;
    for (uint32_t i = 0; i < n + 50; i++) { /* 50 warm-up rounds, not counted */
        char id[64];
        snprintf(id, sizeof id, "hop-%u", i);
        tok[0] = i; /* a new prompt each time */
        kvr_wire_encode_generate(&req, id, tok, 1024, 1, NULL);
        uint64_t a = one_hop(b, 2 * (i % n), b->subj_gen, req.data, req.len);
        kvr_wire_encode_worker_generate(&direct, req.data, req.len, 0x8000000000000000ull | i, 0,
                                        "kvbench");
        uint64_t d = one_hop(b, 2 * (i % n) + 1, subj_worker, direct.data, direct.len);
        if (i >= 50) {
            if (a)
                routed[nr++] = a;
            if (d)
                straight[nd++] = d;
        }
    }
    /* highest routed rate: keep `window` requests in flight for hop_seconds */
    pthread_mutex_lock(&b->mu);
    memset(b->reqs, 0, total * sizeof *b->reqs);
    b->ndone = 0;
    pthread_mutex_unlock(&b->mu);
    uint64_t t0 = kvr_now_ns(), end = t0 + b->o.hop_seconds * 1000000000ull;
    uint32_t sent = 2 * n;
    while (kvr_now_ns() < end && sent < total) {
        pthread_mutex_lock(&b->mu);
        uint32_t inflight = sent - 2 * n - b->ndone;
        pthread_mutex_unlock(&b->mu);
        if (inflight >= window) {
            kvr_sleep_ns(50000);
            continue;
        }
        char id[64], reply[192];
        snprintf(id, sizeof id, "rate-%" PRIu64 "-%u", t0, sent);
        snprintf(reply, sizeof reply, "%s.%u", b->inbox, sent);
        tok[0] = sent;
        kvr_wire_encode_generate(&req, id, tok, 1024, 1, NULL);
        pthread_mutex_lock(&b->mu);
        b->reqs[sent] = (struct breq){.t_send = kvr_now_ns(), .sent = true};
        pthread_mutex_unlock(&b->mu);
        natsConnection_PublishRequest(b->nc_pub, b->subj_gen, reply, req.data, (int)req.len);
        sent++;
    }
    kvr_sleep_ns(500000000);
    pthread_mutex_lock(&b->mu);
    uint32_t completed = b->ndone;
    uint32_t errors = 0;
    for (uint32_t i = 2 * n; i < sent; i++)
        errors += b->reqs[i].done && b->reqs[i].error;
    pthread_mutex_unlock(&b->mu);
    double secs = (double)(end - t0) / 1e9;
    double rp50 = pct(routed, nr, 0.5), dp50 = pct(straight, nd, 0.5);
    double rp99 = pct(routed, nr, 0.99), dp99 = pct(straight, nd, 0.99);
    printf("hop: %zu routed and %zu direct round trips of a 1,024-token prompt (worker %" PRIu64
           "), then %u routed requests in %.1f s with %u in flight (%u errors)\n",
           nr, nd, wid, sent - 2 * n, secs, window, errors);
    printf("routed_p50_us=%.0f direct_p50_us=%.0f routed_p99_us=%.0f direct_p99_us=%.0f "
           "ratio_p50=%.3f routed_max_rps=%.0f\n",
           rp50, dp50, rp99, dp99, dp50 > 0 ? rp50 / dp50 : 0, (double)(completed - errors) / secs);
    free(routed);
    free(straight);
    kvr_buf_free(&req);
    kvr_buf_free(&direct);
    return nr && nd ? 0 : 1;
}

/*
 * --mode digest: ask every router for its state digest (kv.<ns>.router.digest), print the answers,
 * exit 0 when they all agree.
 */
static int digest_mode(struct bench *b)
{
    char subj[256], inbox[64];
    kvr_subject(subj, sizeof subj, b->o.prefix, b->o.ns, "router.digest");
    natsInbox *ib = NULL;
    natsSubscription *sub = NULL;
    if (natsInbox_Create(&ib) != NATS_OK)
        return 1;
    snprintf(inbox, sizeof inbox, "%s", ib);
    natsInbox_Destroy(ib);
    if (natsConnection_SubscribeSync(&sub, b->nc_sub, inbox) != NATS_OK ||
        natsConnection_Flush(b->nc_sub) != NATS_OK ||
        natsConnection_PublishRequest(b->nc_pub, subj, inbox, "", 0) != NATS_OK)
        return 1;
    char first[32] = "";
    int answers = 0, differ = 0;
    uint64_t end = kvr_now_ns() + b->o.digest_wait_ms * 1000000ull;
    for (uint64_t now = kvr_now_ns(); now < end; now = kvr_now_ns()) {
        natsMsg *m = NULL;
        if (natsSubscription_NextMsg(&m, sub, (int64_t)((end - now) / 1000000 + 1)) != NATS_OK)
            break;
        const char *data = natsMsg_GetData(m);
        int len = natsMsg_GetDataLength(m);
        printf("%.*s\n", len, data);
        const char *d = strstr(data, "\"digest\":\"");
        char digest[32] = "";
        if (d)
            sscanf(d + 10, "%16[0-9a-f]", digest);
        if (!answers++)
            snprintf(first, sizeof first, "%s", digest);
        else
            differ += strcmp(first, digest) != 0;
        natsMsg_Destroy(m);
    }
    natsSubscription_Destroy(sub);
    fprintf(stderr, "kvbench: %d routers answered; %s\n", answers,
            !answers ? "none"
            : differ ? "their digests differ"
                     : "their digests agree");
    return answers && !differ ? 0 : 1;
}

int main(int argc, char **argv)
{
    static struct bench b;
    struct opts *o = &b.o;
    strcpy(o->nats, "nats://127.0.0.1:4222");
    strcpy(o->ns, "default");
    strcpy(o->prefix, "kv");
    strcpy(o->workload, "seed");
    strcpy(o->policies, "kv,round_robin");
    strcpy(o->mode, "load");
    strcpy(o->log_level, "warn");
    strcpy(o->trace, "");
    o->seed = 1;
    o->timeout_ms = 600000;
    o->block_size = 64;
    o->num_blocks = 16384;
    o->hop_window = 256;
    o->hop_seconds = 3;
    o->digest_wait_ms = 300;
    o->resend_ms = 2000;
    const struct kvr_opt table[] = {
        {"nats", "KVR_NATS", KVR_OPT_STR, o->nats, "NATS server URLs, comma-separated", 0, 0, NULL},
        {"namespace", "KVR_NAMESPACE", KVR_OPT_STR, o->ns, "subject namespace", 0, 0, NULL},
        {"prefix", "KVR_PREFIX", KVR_OPT_STR, o->prefix, "subject prefix", 0, 0, NULL},
        {"mode", NULL, KVR_OPT_STR, o->mode,
         "load (replay a workload), hop (NATS-hop cost) or digest (do the routers agree?)", 0, 0,
         NULL},
        {"workload", NULL, KVR_OPT_STR, o->workload,
         "seed, seed-isl, seed-osl, burst, "
         "conversation, synthetic",
         0, 0, NULL},
        {"trace", NULL, KVR_OPT_STR, o->trace, "trace file (default traces/<workload>_trace.jsonl)",
         0, 0, NULL},
        {"requests", NULL, KVR_OPT_U32, &o->requests, "requests (0: the workload's default)", 0, 0,
         NULL},
        {"policies", NULL, KVR_OPT_STR, o->policies, "one run per policy, comma-separated", 0, 0,
         NULL},
        {"concurrency", NULL, KVR_OPT_U32, &o->concurrency, "closed-loop clients (default 20)", 0,
         0, NULL},
        {"rate-scale", NULL, KVR_OPT_DOUBLE, &o->rate_scale, "open loop: arrival-rate factor", 0, 0,
         NULL},
        {"max-tokens", NULL, KVR_OPT_U32, &o->max_tokens, "override every output length", 0, 0,
         NULL},
        {"seed", NULL, KVR_OPT_U64, &o->seed, "workload seed", 0, 0, NULL},
        {"out", NULL, KVR_OPT_STR, o->out, "write report.json, report.md and plots here", 0, 0,
         NULL},
        {"workers", NULL, KVR_OPT_U32, &o->workers, "fleet size, for the hit-rate reference", 0, 0,
         NULL},
        {"num-blocks", NULL, KVR_OPT_U32, &o->num_blocks, "blocks per worker, likewise", 0, 0,
         NULL},
        {"block-size", NULL, KVR_OPT_U32, &o->block_size, "block size, likewise", 0, 0, NULL},
        {"timeout-ms", NULL, KVR_OPT_U64, &o->timeout_ms, "give up on a run after this long", 0, 0,
         NULL},
        {"resend-ms", NULL, KVR_OPT_U64, &o->resend_ms,
         "send a request again when nothing came back for this long (0: never)", 0, 0, NULL},
        {"worker-id", NULL, KVR_OPT_U64, &o->worker_id, "hop: the worker to call directly", 0, 0,
         NULL},
        {"hop-window", NULL, KVR_OPT_U32, &o->hop_window, "hop: requests in flight for max rate", 0,
         0, NULL},
        {"hop-seconds", NULL, KVR_OPT_U64, &o->hop_seconds, "hop: how long the max-rate phase", 0,
         0, NULL},
        {"digest-wait-ms", NULL, KVR_OPT_U64, &o->digest_wait_ms,
         "digest: how long to collect the routers' answers", 0, 0, NULL},
        {"log-level", "KVR_LOG_LEVEL", KVR_OPT_STR, o->log_level, "debug, info, warn or error", 0,
         0, NULL},
    };
    int rc = kvr_opts_parse(table, sizeof table / sizeof table[0], argc, argv, "kvbench",
                            "Load generator and client-side measurements for kvrouter.");
    if (rc)
        return rc == 1 ? 0 : rc;
    enum kvr_log_level lvl;
    bool is_trace = false;
    if (!kvr_log_parse_level(o->log_level, &lvl) ||
        (strcmp(o->mode, "load") && strcmp(o->mode, "hop") && strcmp(o->mode, "digest")) ||
        !kvr_workload_known(o->workload, &is_trace) || !o->block_size) {
        fprintf(stderr, "kvbench: bad --log-level, --mode, --workload or --block-size\n");
        return 2;
    }
    if (is_trace && !o->trace[0])
        snprintf(o->trace, sizeof o->trace, "traces/%s_trace.jsonl", o->workload);
    kvr_log_init("kvbench", lvl);
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    kvr_subject(b.subj_gen, sizeof b.subj_gen, o->prefix, o->ns, "generate");
    natsInbox *inbox = NULL;
    natsInbox_Create(&inbox);
    snprintf(b.inbox, sizeof b.inbox, "_KVB.%s", inbox + 7); /* after "_INBOX." */
    natsInbox_Destroy(inbox);
    if (kvr_connect(o->nats, "kvbench", &b.nc_pub) != KVR_OK ||
        kvr_connect(o->nats, "kvbench-inbox", &b.nc_sub) != KVR_OK)
        return 1;
    char wild[160];
    snprintf(wild, sizeof wild, "%s.*", b.inbox);
    if (natsConnection_Subscribe(&b.sub, b.nc_sub, wild, on_chunk, &b) != NATS_OK ||
        natsSubscription_SetPendingLimits(b.sub, -1, -1) != NATS_OK ||
        natsConnection_Flush(b.nc_sub) != NATS_OK)
        return 1;
    rc = !strcmp(o->mode, "hop")      ? hop_mode(&b)
         : !strcmp(o->mode, "digest") ? digest_mode(&b)
                                      : load_mode(&b);
    natsSubscription_Destroy(b.sub);
    natsConnection_Destroy(b.nc_pub);
    natsConnection_Destroy(b.nc_sub);
    kvr_workload_free(&b.wl);
    free(b.reqs);
    free(b.gaps);
    free(b.tok);
    kvr_buf_free(&b.buf);
    nats_Close();
    return rc;
}
