/*
 * kvbench --mode hop and --mode cancel. Latencies are kept as doubles (hop: microseconds,
 * cancel: milliseconds) and summarised with the project's one quantile (stats.h).
 */
#include "hop.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "codec.h"
#include "fleet.h"
#include "routers.h"
#include "stats.h"

#define HOP_TOKENS  1024               /* prompt length */
#define HOP_WARMUP  50                 /* rounds not counted */
#define HOP_WAIT_NS (5 * KVR_NS_PER_S) /* a round trip not decided by then has timed out */

struct hop {
    const struct kvr_bench_config *cfg;
    struct kvr_client *client;
    uint64_t worker;            /* called directly */
    char subj_worker[256];      /* its generate subject */
    uint32_t n;                 /* counted round trips of each kind */
    uint32_t tok[HOP_TOKENS];   /* the prompt; tok[0] changes every request */
    struct kvr_buf req, direct; /* encoded requests */
    double *routed, *straight;  /* round trips, us */
    size_t nrouted, nstraight;  /* */
    uint32_t failed[2];         /* counted round trips ended by an error: [0] routed, [1] direct */
    uint32_t timed_out[2];      /* ... not decided within HOP_WAIT_NS */
    uint32_t codes[KVR_CODE_SLOTS]; /* the latency phase's errors by code (kvr_code_slot) */
    uint32_t sent, completed;       /* the max-rate phase: requests sent, decided */
    uint32_t errors, unanswered;    /* ... of them ended by an error, never decided */
    struct kvr_contract contract;   /* ... what its streams broke of the contract */
    uint64_t rate_ns;               /* ... its length */
    uint64_t rate_elapsed_ns;       /* ... to its last final, when that came after it */
    struct kvr_routers_poll *polls; /* [2]: the routers' $SRV.STATS around that phase */
    struct kvr_routers_run routers; /* ... their difference (CPU seconds, decisions) */
};

/* The worker to call: --worker-id, else the first heartbeat heard; 0 if none. */
static uint64_t pick_worker(const struct hop *h)
{
    if (h->cfg->worker_id)
        return h->cfg->worker_id;
    struct kvr_fleet f;
    kvr_fleet_init(&f);
    uint64_t id = 0;
    if (kvr_fleet_discover(&f, h->client->nc_sub, h->cfg->net.prefix, h->cfg->net.ns,
                           2500 * KVR_NS_PER_MS))
        id = f.ids[0];
    kvr_fleet_free(&f);
    return id;
}

/*
 * Send request i to subject and wait for its final chunk: its round trip in us, 0 on failure.
 * side: 0 routed, 1 direct; a counted round trip that failed is counted there (ended by an error,
 * by its code, or timed out).
 */
static double one_hop(struct hop *h, uint32_t i, const char *subject, const struct kvr_buf *b,
                      int side, bool counted)
{
    kvr_client_publish(h->client, i, subject, b->data, b->len, 1);
    uint64_t dt = kvr_client_wait_one(h->client, i, kvr_now_ns() + HOP_WAIT_NS);
    if (dt || !counted)
        return (double)dt / 1000.0;
    struct kvr_client_req q = kvr_client_get(h->client, i);
    if (!q.done || !q.error) { /* not decided in time (or just after the wait) */
        h->timed_out[side]++;
    } else {
        h->failed[side]++;
        h->codes[kvr_code_slot(q.error)]++;
    }
    return 0;
}

/* Routed and direct round trips, alternating; round i is requests 2i (routed) and 2i + 1, so a
 * late answer of one that timed out is never taken for a later one's. */
static void latencies(struct hop *h)
{
    for (uint32_t i = 0; i < h->n + HOP_WARMUP; i++) {
        char id[64];
        bool counted = i >= HOP_WARMUP;
        snprintf(id, sizeof id, "hop-%u", i);
        h->tok[0] = i; /* a new prompt each time */
        kvr_wire_encode_generate(&h->req, id, h->tok, HOP_TOKENS, 1, NULL);
        double a = one_hop(h, 2 * i, h->client->subj_gen, &h->req, 0, counted);
        /* the key a router would give it: unique to this run's inbox, so a worker that
         * remembers the keys it ended (60 s) takes a later run's requests as new */
        kvr_wire_encode_worker_generate(&h->direct, h->req.data, h->req.len,
                                        kvr_client_key(h->client, 2 * i + 1, id), 0, "kvbench", 0);
        double d = one_hop(h, 2 * i + 1, h->subj_worker, &h->direct, 1, counted);
        if (counted) {
            if (a > 0)
                h->routed[h->nrouted++] = a;
            if (d > 0)
                h->straight[h->nstraight++] = d;
        }
    }
}

/* The highest routed rate: keep the window of requests in flight for --hop-seconds. */
static void max_rate(struct hop *h, uint32_t total)
{
    struct kvr_client *c = h->client;
    uint32_t window = h->cfg->hop_window, first = 2 * (h->n + HOP_WARMUP);
    kvr_client_begin(c, total, false, NULL, NULL, 0);
    kvr_routers_poll(c, h->cfg->net.prefix, h->cfg->net.ns, &h->polls[0]);
    uint64_t t0 = kvr_now_ns(), end = t0 + h->rate_ns;
    uint32_t sent = first;
    while (kvr_now_ns() < end && sent < total) {
        if (sent - first - kvr_client_done(c) >= window) {
            kvr_sleep_ns(50000);
            continue;
        }
        char id[64];
        snprintf(id, sizeof id, "rate-%" PRIu64 "-%u", t0, sent);
        h->tok[0] = sent;
        kvr_wire_encode_generate(&h->req, id, h->tok, HOP_TOKENS, 1, NULL);
        kvr_client_publish(c, sent, c->subj_gen, h->req.data, h->req.len, 1);
        sent++;
    }
    kvr_sleep_ns(500 * KVR_NS_PER_MS); /* for the answers on their way */
    /* a slow router (a sanitizer's build, a loaded machine) may still hold some of the window:
     * they get a round trip's time (HOP_WAIT_NS) before they count as unanswered */
    for (uint64_t wait_end = kvr_now_ns() + HOP_WAIT_NS;
         sent - first > kvr_client_done(c) && kvr_now_ns() < wait_end;)
        kvr_sleep_ns(KVR_NS_PER_MS);
    /* the rate's time: the phase, or to the last final when answers came after it (the drain's
     * wait: dividing by the phase alone overstated a slow fleet's rate by up to a window) */
    uint64_t last = end;
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = first; i < sent; i++)
        last = c->reqs[i].t_end > last ? c->reqs[i].t_end : last;
    pthread_mutex_unlock(&c->mu);
    h->rate_elapsed_ns = last - t0;
    kvr_client_contract(c, first, sent, &h->contract);
    h->sent = h->contract.requests;
    h->unanswered = h->contract.unanswered;
    h->completed = h->sent - h->unanswered;
    h->errors = h->completed - h->contract.finished;
    kvr_routers_poll(c, h->cfg->net.prefix, h->cfg->net.ns, &h->polls[1]);
    kvr_routers_diff(&h->polls[0], &h->polls[1], &h->routers);
}

/*
 * Why the routers' CPU per request of the max-rate phase cannot be given, into buf; NULL when it
 * can. It can when the same routers (service id and start) answered just before and just after
 * the phase, each once, some request finished and they report their CPU: a router heard on one
 * side only would leave its CPU out of the sum (or count its whole life), an answer left out
 * might be a router's, and two answers of one (id, start) cannot be told apart.
 */
static const char *cpu_na_why(const struct hop *h, char *buf, size_t len)
{
    const struct kvr_routers_run *r = &h->routers;
    uint32_t same = r->answered - r->fresh, gone = r->before > same ? r->before - same : 0;
    uint32_t ignored = h->polls[0].ignored + h->polls[1].ignored;
    if (!r->answered)
        snprintf(buf, len, "no router answered after the phase");
    else if (gone)
        snprintf(buf, len, "%u router(s) answered before the phase and not after it", gone);
    else if (r->fresh)
        snprintf(buf, len, "%u router(s) new or restarted during the phase", r->fresh);
    else if (ignored)
        snprintf(buf, len,
                 "%u answer(s) not counted: malformed, a second answer of one router (id and "
                 "start), or past %d routers",
                 ignored, KVR_ROUTERS_MAX);
    else if (!h->contract.finished)
        snprintf(buf, len, "no request finished");
    else if (r->cpu_seconds <= 0)
        snprintf(buf, len, "no router reports its CPU");
    else
        return NULL;
    return buf;
}

/* The routers' CPU per request routed in the max-rate phase: " router_cpu_us_per_request=12.3"
 * (the CPU seconds of every router of the namespace, from their $SRV.STATS.kvrouter answers just
 * before and after the phase, over the requests that ended without error in it); "=na" when
 * cpu_na_why says why not. */
static void print_router_cpu(const struct hop *h)
{
    const struct kvr_routers_run *r = &h->routers;
    char why[160];
    if (cpu_na_why(h, why, sizeof why)) {
        printf(" router_cpu_us_per_request=na");
        return;
    }
    printf(" router_cpu_us_per_request=%.1f router_cpu_s=%.3f",
           r->cpu_seconds * 1e6 / h->contract.finished, r->cpu_seconds);
}

/* The failures of both phases, and the max-rate phase's contract; whether there were any. */
static bool print_failures(const struct hop *h)
{
    char line[768];
    uint32_t lat = h->failed[0] + h->failed[1] + h->timed_out[0] + h->timed_out[1];
    printf("latency phase: routed failed=%u timed_out=%u, direct failed=%u timed_out=%u "
           "(of %u each)\n",
           h->failed[0], h->timed_out[0], h->failed[1], h->timed_out[1], h->n);
    if (h->failed[0] + h->failed[1])
        printf("latency phase errors: %s\n", kvr_contract_codes(h->codes, line, sizeof line));
    printf("max-rate phase: sent=%u finished=%u errors=%u unanswered=%u\n", h->sent,
           h->contract.finished, h->errors, h->unanswered);
    if (h->errors)
        printf("max-rate phase errors: %s\n",
               kvr_contract_codes(h->contract.errors, line, sizeof line));
    printf("contract (max-rate phase): %s\n", kvr_contract_format(&h->contract, line, sizeof line));
    bool failed = lat || h->errors || h->unanswered || !h->nrouted || !h->nstraight;
    if (failed)
        printf("hop: FAIL (a round trip or request failed, timed out or went unanswered: the "
               "figures above leave it out)\n");
    return failed;
}

/* Everything measured; 1 when a phase had failures, else 0. */
static int print_result(struct hop *h)
{
    kvr_sort_doubles(h->routed, h->nrouted);
    kvr_sort_doubles(h->straight, h->nstraight);
    double rp50 = kvr_quantile_sorted(h->routed, h->nrouted, 0.5);
    double dp50 = kvr_quantile_sorted(h->straight, h->nstraight, 0.5);
    double rp99 = kvr_quantile_sorted(h->routed, h->nrouted, 0.99);
    double dp99 = kvr_quantile_sorted(h->straight, h->nstraight, 0.99);
    double secs = (double)h->rate_ns / 1e9;
    printf("hop: %zu routed and %zu direct round trips of a 1,024-token prompt (worker %" PRIu64
           "), then %u routed requests in %.1f s with %u in flight (%u errors, %u unanswered)\n",
           h->nrouted, h->nstraight, h->worker, h->sent, secs, h->cfg->hop_window, h->errors,
           h->unanswered);
    printf("routed_p50_us=%.0f direct_p50_us=%.0f routed_p99_us=%.0f direct_p99_us=%.0f "
           "ratio_p50=%.3f routed_max_rps=%.0f",
           rp50, dp50, rp99, dp99, dp50 > 0 ? rp50 / dp50 : 0,
           h->rate_elapsed_ns ? (double)h->contract.finished * 1e9 / (double)h->rate_elapsed_ns
                              : 0);
    print_router_cpu(h);
    printf("\n");
    char line[768], why[160];
    printf("routers (max-rate phase): %s", kvr_routers_format(&h->routers, line, sizeof line));
    if (cpu_na_why(h, why, sizeof why))
        printf("; router_cpu_us_per_request=na: %s", why);
    printf("\n");
    return print_failures(h) ? 1 : 0;
}

int kvr_hop_run(const struct kvr_bench_config *cfg, struct kvr_client *client)
{
    struct hop h = {.cfg = cfg, .client = client, .rate_ns = cfg->hop_ns};
    h.n = cfg->requests ? cfg->requests : 2000;
    h.worker = pick_worker(&h);
    if (!h.worker) {
        fprintf(stderr, "kvbench: no worker heartbeat seen (start kvworker --null)\n");
        return 1;
    }
    uint64_t secs = (cfg->hop_ns + KVR_NS_PER_S - 1) / KVR_NS_PER_S;
    uint64_t total = 2ull * (h.n + HOP_WARMUP) + 100000 * (secs ? secs : 1) + 1;
    for (uint32_t t = 0; t < HOP_TOKENS; t++)
        h.tok[t] = (t * 2654435761u) % 32000;
    char tail[64];
    snprintf(tail, sizeof tail, "worker.%" PRIu64 ".generate", h.worker);
    kvr_subject(h.subj_worker, sizeof h.subj_worker, cfg->net.prefix, cfg->net.ns, tail);
    h.routed = calloc(h.n, sizeof *h.routed);
    h.straight = calloc(h.n, sizeof *h.straight);
    h.polls = calloc(2, sizeof *h.polls);
    int rc = 1;
    if (total <= UINT32_MAX && h.routed && h.straight && h.polls &&
        kvr_client_begin(client, (uint32_t)total, false, NULL, NULL, 0) == KVR_OK) {
        latencies(&h);
        max_rate(&h, (uint32_t)total);
        rc = print_result(&h);
    } else { /* it exited 1 saying nothing */
        fprintf(stderr,
                "kvbench: no memory for %" PRIu64 " request records (--requests %u, "
                "--hop-seconds %" PRIu64 ")\n",
                total, h.n, secs);
    }
    kvr_client_end(client);
    free(h.routed);
    free(h.straight);
    free(h.polls);
    kvr_buf_free(&h.req);
    kvr_buf_free(&h.direct);
    return rc;
}

/* --- --mode cancel ------------------------------------------------------------------------- */

#define CX_PROMPT   512u                /* the long requests' prompt, fresh tokens */
#define CX_TOKENS   16384u              /* their max_tokens, without --max-tokens */
#define CX_START_NS (10 * KVR_NS_PER_S) /* for the first --cancel-after tokens */
#define CX_END_NS   (5 * KVR_NS_PER_S)  /* from the cancel, for the final chunk and done event */

struct cancel {
    const struct kvr_bench_config *cfg;
    struct kvr_client *client;
    struct kvr_watch watch;    /* the done events */
    uint64_t run;              /* realtime at start: ids never repeat across runs */
    uint32_t max_tokens;       /* the requests' */
    uint32_t tok[CX_PROMPT];   /* prompt scratch of the encoder */
    double *to_final;          /* ms from each cancel to its final chunk */
    double *to_done;           /* ... to its done event */
    size_t nfinal, ndone;      /* */
    uint32_t cancelled;        /* final chunks ERR_CANCELLED */
    uint32_t done_cancelled;   /* done events with status ERR_CANCELLED */
    uint32_t early;            /* ended before --cancel-after tokens: never cancelled */
    uint64_t after, after_max; /* non-final chunks after the cancel: all, most in one request */
};

static void cx_id(const struct cancel *x, uint32_t i, char *buf, size_t len)
{
    snprintf(buf, len, "cx%" PRIu64 "-%u", x->run, i);
}

/* The client's encoder. */
static bool cx_encode(void *ctx, uint32_t i, struct kvr_buf *out, uint32_t *max_tokens)
{
    struct cancel *x = ctx;
    char id[64];
    cx_id(x, i, id, sizeof id);
    kvr_client_prompt(x->tok, CX_PROMPT, x->run + i);
    *max_tokens = x->max_tokens;
    return kvr_wire_encode_generate(out, id, x->tok, CX_PROMPT, *max_tokens, NULL) == KVR_OK;
}

/* Request i: sent, cancelled after --cancel-after tokens, its final and done event awaited. */
static void cx_one(struct cancel *x, uint32_t i)
{
    struct kvr_client *c = x->client;
    char id[64];
    cx_id(x, i, id, sizeof id);
    kvr_watch_set(&x->watch, i, kvr_client_key(c, i, id));
    kvr_client_send(c, i);
    struct kvr_client_req q = kvr_client_wait_tokens(c, i, kvr_now_ns() + CX_START_NS);
    if (q.done || q.ntok < x->cfg->cancel_after) {
        x->early++;
        return;
    }
    kvr_client_cancel(c, i, id);
    uint64_t end = kvr_now_ns() + CX_END_NS;
    kvr_client_wait_one(c, i, end);
    while (!kvr_watch_get(&x->watch, i).dones && kvr_now_ns() < end)
        kvr_sleep_ns(100 * 1000);
}

/* Request i's figures, after the run (its late chunks counted too). */
static void cx_tally(struct cancel *x, uint32_t i)
{
    struct kvr_client_req q = kvr_client_get(x->client, i);
    struct kvr_watch_item w = kvr_watch_get(&x->watch, i);
    if (!q.t_cancel)
        return;
    if (q.done && q.t_final >= q.t_cancel)
        x->to_final[x->nfinal++] = (double)(q.t_final - q.t_cancel) / 1e6;
    if (w.dones && w.t_done >= q.t_cancel)
        x->to_done[x->ndone++] = (double)(w.t_done - q.t_cancel) / 1e6;
    x->cancelled += q.done && q.error == KVR_ERR_CANCELLED;
    x->done_cancelled += w.dones && w.status == KVR_ERR_CANCELLED;
    x->after += q.after_cancel;
    x->after_max = q.after_cancel > x->after_max ? q.after_cancel : x->after_max;
}

static void cx_stat(const char *name, double *v, size_t n)
{
    kvr_sort_doubles(v, n);
    printf("%s p50=%.2f p99=%.2f max=%.2f (%zu measured)\n", name, kvr_quantile_sorted(v, n, 0.5),
           kvr_quantile_sorted(v, n, 0.99), n ? v[n - 1] : 0, n);
}

/* The figures; the exit status: 1 unless every request ended cancelled. */
static int cx_print(struct cancel *x, uint32_t n)
{
    struct kvr_contract k;
    char line[512];
    kvr_client_contract(x->client, 0, n, &k);
    cx_stat("cancel_to_final_ms", x->to_final, x->nfinal);
    cx_stat("cancel_to_done_ms ", x->to_done, x->ndone);
    printf("chunks_after_cancel total=%" PRIu64 " mean=%.2f max=%" PRIu64 "\n", x->after,
           n ? (double)x->after / n : 0, x->after_max);
    printf("ended_cancelled=%u/%u done_events_cancelled=%u/%u ended_before_the_cancel=%u\n",
           x->cancelled, n, x->done_cancelled, n, x->early);
    printf("contract: %s\n", kvr_contract_format(&k, line, sizeof line));
    int rc = x->cancelled == n ? 0 : 1;
    printf("cancel: %s\n",
           rc ? "FAIL (some request did not end cancelled)" : "ok (every request ended cancelled)");
    return rc;
}

int kvr_cancel_run(const struct kvr_bench_config *cfg, struct kvr_client *client)
{
    uint32_t n = cfg->trials;
    struct cancel *x = calloc(1, sizeof *x);
    int rc = 1;
    if (!x || !(x->to_final = calloc(n, sizeof *x->to_final)) ||
        !(x->to_done = calloc(n, sizeof *x->to_done)) ||
        kvr_client_begin(client, n, false, cx_encode, x, 0) != KVR_OK)
        goto out;
    x->cfg = cfg;
    x->client = client;
    x->run = kvr_realtime_ns();
    x->max_tokens = cfg->max_tokens ? cfg->max_tokens : CX_TOKENS;
    kvr_client_wake_at(client, cfg->cancel_after);
    if (kvr_watch_start(&x->watch, client->nc_sub, cfg->net.prefix, cfg->net.ns, n) == KVR_OK) {
        printf("cancel: %u requests of %u fresh prompt tokens and max_tokens %u, one at a time, "
               "each cancelled after %u tokens; done events matched by the request key kvbench "
               "computes as the routers do (hash of reply subject, NUL, request_id)\n",
               n, CX_PROMPT, x->max_tokens, cfg->cancel_after);
        fflush(stdout);
        for (uint32_t i = 0; i < n; i++)
            cx_one(x, i);
        kvr_sleep_ns(cfg->linger_ns); /* chunks and finals still on their way are counted */
        for (uint32_t i = 0; i < n; i++)
            cx_tally(x, i);
        rc = cx_print(x, n);
        kvr_watch_stop(&x->watch);
    }
out:
    kvr_client_end(client);
    if (x) {
        free(x->to_final);
        free(x->to_done);
    }
    free(x);
    return rc;
}
