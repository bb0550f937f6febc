/*
 * kvbench --mode direct. Times are kvr_now_ns() values; the figures are milliseconds, kept as
 * doubles and summarised with the project's one quantile (stats.h). The direct stream in flight
 * (one at a time) is shared with kvr_oai's thread under its own mutex.
 */
#include "direct.h"

#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../openai/openai.h"
#include "../sim/report.h"
#include "codec.h"
#include "stats.h"

#define DIRECT_REQUESTS   200u                /* rounds without --requests */
#define DIRECT_MAX_TOKENS 16u                 /* output tokens without --max-tokens */
#define DIRECT_WAIT_NS    (30 * KVR_NS_PER_S) /* one request, at most */
#define DIRECT_PRINTED    10u                 /* failures printed per path; the rest counted */
#define DIRECT_GIVE_UP    3u                  /* failures in a row on one path stop the run */
#define PROBE_MS          5000                /* the engine's /health */

/* One copy of a request as it ended. */
struct sample {
    kvr_status st;                      /* KVR_OK: answered in full */
    double ttft, e2e;                   /* ms from the send to the first token, to the end */
    uint32_t ntok;                      /* tokens received */
    char why[KVR_OAI_MESSAGE_MAX + 64]; /* a failure in words */
};

/* One path's figures over the counted rounds. */
struct path {
    const char *name;                 /* "fleet", "direct" */
    double *ttft, *e2e;               /* ms, one per request answered in full */
    size_t nok;                       /* requests answered in full */
    uint32_t failed;                  /* requests that failed */
    uint64_t tokens;                  /* received by the requests answered in full */
    uint32_t by_code[KVR_CODE_SLOTS]; /* failures by kvr_status (kvr_code_slot) */
};

/* The direct stream in flight, written by kvr_oai's hooks. */
struct stream {
    pthread_mutex_t mu;
    pthread_cond_t cv;                 /* signalled at the end hook */
    uint64_t key;                      /* the submission awaited; 0: none */
    uint64_t t_first, t_end;           /* its first chunk with a token, its end hook */
    uint32_t ntok;                     /* tokens so far */
    bool stopped;                      /* finish_reason "stop" came (the model's own end: an
                                          end of sequence before max_tokens) */
    bool done;                         /* the end hook ran */
    kvr_status st;                     /* ... with this status */
    char message[KVR_OAI_MESSAGE_MAX]; /* ... and message */
};

struct direct {
    const struct kvr_bench_config *cfg;
    struct kvr_client *client;
    struct kvr_oai *oai;
    struct stream s;
    uint64_t run;                /* realtime at the start: ids and prompts never repeat */
    uint32_t rounds, warmup;     /* counted rounds, rounds before them */
    uint32_t ptok, max_tokens;   /* every request's */
    uint32_t *tok;               /* the prompt */
    struct kvr_buf req;          /* the fleet's encoded request */
    uint64_t next_key;           /* the next direct submission's key */
    uint64_t deadline;           /* --timeout-ms from the start */
    uint32_t done;               /* counted rounds run */
    uint32_t warm_failed;        /* copies of the warm-up rounds that failed */
    double submit_us;            /* the direct requests' kvr_oai_submit, summed (body built) */
    uint32_t submits;            /* ... how many */
    uint32_t in_a_row[2];        /* the fleet's, direct's last failures in a row */
    const char *stop;            /* why the run stopped before its last round; NULL: it did not */
    struct path fleet, straight; /* */
};

/* --- the direct path (kvr_oai) ------------------------------------------------------------- */

static void on_chunk(void *ctx, uint64_t key, const struct kvr_oai_chunk *ch)
{
    uint64_t now = kvr_now_ns();
    struct stream *s = ctx;
    pthread_mutex_lock(&s->mu);
    if (key == s->key && !s->done && ch->n_tokens) {
        if (!s->t_first)
            s->t_first = now;
        s->ntok += ch->n_tokens;
    }
    if (key == s->key && !s->done && ch->finish_reason)
        s->stopped = !strcmp(ch->finish_reason, "stop"); /* not "abort": a failure */
    pthread_mutex_unlock(&s->mu);
}

static void on_end(void *ctx, uint64_t key, kvr_status st, const char *message)
{
    uint64_t now = kvr_now_ns();
    struct stream *s = ctx;
    pthread_mutex_lock(&s->mu);
    if (key == s->key && !s->done) {
        s->done = true;
        s->st = st;
        s->t_end = now;
        snprintf(s->message, sizeof s->message, "%s", message);
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

/* Under s->mu: wait on cv until deadline_ns (CLOCK_MONOTONIC, as kvr_now_ns) at most. */
static void wait_until(struct stream *s, uint64_t deadline_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(deadline_ns / KVR_NS_PER_S),
                          .tv_nsec = (long)(deadline_ns % KVR_NS_PER_S)};
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
}

/* Send the prompt in d->tok straight to the engine and wait for the end of its stream. */
static void direct_one(struct direct *d, uint64_t deadline, struct sample *out)
{
    struct stream *s = &d->s;
    uint64_t key = d->next_key++;
    pthread_mutex_lock(&s->mu);
    s->key = key;
    s->t_first = s->t_end = 0;
    s->ntok = 0;
    s->stopped = false;
    s->done = false;
    s->message[0] = '\0';
    pthread_mutex_unlock(&s->mu);
    uint64_t t0 = kvr_now_ns();
    kvr_status st = kvr_oai_submit(d->oai, key, d->tok, d->ptok, d->max_tokens);
    uint64_t t_send = kvr_now_ns(); /* the body built: the request is on its way */
    d->submit_us += (double)(t_send - t0) / 1e3;
    d->submits++;
    if (st != KVR_OK) {
        *out = (struct sample){.st = st};
        snprintf(out->why, sizeof out->why, "refused by kvr_oai_submit: %s", kvr_status_str(st));
        return;
    }
    pthread_mutex_lock(&s->mu);
    while (!s->done && kvr_now_ns() < deadline)
        wait_until(s, deadline);
    struct stream got = *s;
    s->key = 0; /* a hook still running for it finds it unknown */
    pthread_mutex_unlock(&s->mu);
    *out = (struct sample){.st = got.st, .ntok = got.ntok};
    if (!got.done) {
        kvr_oai_cancel(d->oai, key);
        out->st = KVR_ERR_TIMEOUT;
        snprintf(out->why, sizeof out->why, "no end after %.1f s (cancelled); %u tokens",
                 (double)(kvr_now_ns() - t_send) / 1e9, got.ntok);
    } else if (got.st != KVR_OK) {
        snprintf(out->why, sizeof out->why, "%s: %s", kvr_status_str(got.st),
                 got.message[0] ? got.message : "(no message)");
    } else if ((got.ntok < d->max_tokens && !got.stopped) || !got.t_first) {
        out->st = KVR_ERR_INTERRUPTED; /* as the fleet's client judges a short stream */
        snprintf(out->why, sizeof out->why, "ended after %u of %u tokens", got.ntok, d->max_tokens);
    } else {
        out->ttft = (double)(got.t_first - t_send) / 1e6;
        out->e2e = (double)(got.t_end - t_send) / 1e6;
    }
}

/* --- the fleet path (kvr_client) ----------------------------------------------------------- */

/* Send the prompt in d->tok as round i through the routers and wait for its answer. */
static void fleet_one(struct direct *d, uint32_t i, uint64_t deadline, struct sample *out)
{
    struct kvr_client *c = d->client;
    char id[64];
    snprintf(id, sizeof id, "direct-%" PRIu64 "-%u", d->run, i);
    kvr_status st = kvr_wire_encode_generate(&d->req, id, d->tok, d->ptok, d->max_tokens, NULL);
    if (st != KVR_OK) {
        *out = (struct sample){.st = st};
        snprintf(out->why, sizeof out->why, "not encoded: %s", kvr_status_str(st));
        return;
    }
    kvr_client_publish(c, i, c->subj_gen, d->req.data, d->req.len, d->max_tokens);
    kvr_client_wait_one(c, i, deadline);
    struct kvr_client_req q = kvr_client_get(c, i);
    *out = (struct sample){.st = q.error, .ntok = q.ntok};
    if (!q.done) {
        kvr_client_cancel(c, i, id);
        out->st = KVR_ERR_TIMEOUT;
        snprintf(out->why, sizeof out->why, "no answer after %.1f s (cancelled); %u tokens",
                 (double)(kvr_now_ns() - q.t_send) / 1e9, q.ntok);
    } else if (q.error) {
        snprintf(out->why, sizeof out->why, "%u (%s)%s; %u tokens", q.error,
                 kvr_status_str((kvr_status)q.error), q.no_responders ? ", no router listened" : "",
                 q.ntok);
    } else if (!q.t_first) {
        out->st = KVR_ERR_INTERRUPTED;
        snprintf(out->why, sizeof out->why, "finished without a token");
    } else {
        out->ttft = (double)(q.t_first - q.t_send) / 1e6;
        out->e2e = (double)(q.t_final - q.t_send) / 1e6;
    }
}

/* --- rounds -------------------------------------------------------------------------------- */

static void add(struct path *p, const struct sample *x, uint32_t round)
{
    if (x->st == KVR_OK) {
        p->ttft[p->nok] = x->ttft;
        p->e2e[p->nok++] = x->e2e;
        p->tokens += x->ntok;
        return;
    }
    if (p->failed++ < DIRECT_PRINTED)
        fprintf(stderr, "kvbench: round %u: %s request failed: %s\n", round, p->name, x->why);
    p->by_code[kvr_code_slot((uint32_t)x->st)]++;
}

/*
 * Round i (the first d->warmup not counted): both copies, each with a prompt of its own. false
 * when the run's deadline came before a copy was sent (the round is not counted).
 */
static bool round_one(struct direct *d, uint32_t i)
{
    bool fleet_first = i % 2 == 0;
    struct sample x[2]; /* fleet, direct */
    for (int k = 0; k < 2; k++) {
        int p = (k == 0) == fleet_first ? 0 : 1; /* 0: the fleet, 1: direct */
        uint64_t now = kvr_now_ns(), deadline = now + DIRECT_WAIT_NS;
        if (now >= d->deadline)
            return false;
        deadline = deadline < d->deadline ? deadline : d->deadline;
        kvr_client_prompt(d->tok, d->ptok, d->run + 2ull * i + (uint64_t)p);
        if (p == 0)
            fleet_one(d, i, deadline, &x[0]);
        else
            direct_one(d, deadline, &x[1]);
    }
    for (int k = 0; k < 2; k++) {
        if (i >= d->warmup) {
            add(k ? &d->straight : &d->fleet, &x[k], i - d->warmup);
        } else if (x[k].st != KVR_OK) {
            d->warm_failed++;
            fprintf(stderr, "kvbench: warm-up round %u: %s request failed (not counted): %s\n", i,
                    k ? "direct" : "fleet", x[k].why);
        }
        d->in_a_row[k] = x[k].st == KVR_OK ? 0 : d->in_a_row[k] + 1;
        if (d->in_a_row[k] >= DIRECT_GIVE_UP)
            d->stop = k ? "the engine failed 3 requests in a row"
                        : "the fleet failed 3 requests in a row";
    }
    return true;
}

/* --- the figures --------------------------------------------------------------------------- */

/* The figures of both paths, computed once. */
struct figures {
    struct kvr_stat ttft[2], e2e[2]; /* fleet, direct */
    double tokens[2];                /* mean tokens of the requests answered in full */
    double ratio_mean, ratio_p50, ratio_p90;
    double diff_mean, diff_p50; /* ms, fleet - direct */
    bool answered;              /* both paths answered some request in full */
    bool mean_met, p50_met;     /* fleet <= 1.1 x direct + 1 ms (the target) */
};

static double ratio(double a, double b)
{
    return b > 0 ? a / b : 0;
}

static void figure(struct direct *d, struct figures *f)
{
    struct path *p[2] = {&d->fleet, &d->straight};
    for (int k = 0; k < 2; k++) {
        f->ttft[k] = kvr_stat_of(p[k]->ttft, p[k]->nok);
        f->e2e[k] = kvr_stat_of(p[k]->e2e, p[k]->nok);
        f->tokens[k] = p[k]->nok ? (double)p[k]->tokens / (double)p[k]->nok : 0;
    }
    f->ratio_mean = ratio(f->ttft[0].mean, f->ttft[1].mean);
    f->ratio_p50 = ratio(f->ttft[0].p50, f->ttft[1].p50);
    f->ratio_p90 = ratio(f->ttft[0].p90, f->ttft[1].p90);
    f->diff_mean = f->ttft[0].mean - f->ttft[1].mean;
    f->diff_p50 = f->ttft[0].p50 - f->ttft[1].p50;
    f->answered = d->fleet.nok && d->straight.nok;
    f->mean_met = f->ttft[0].mean <= 1.1 * f->ttft[1].mean + 1.0;
    f->p50_met = f->ttft[0].p50 <= 1.1 * f->ttft[1].p50 + 1.0;
}

static void print_figures(const struct direct *d, const struct figures *f)
{
    const struct path *p[2] = {&d->fleet, &d->straight};
    printf("%-7s %6s %6s %10s %10s %10s %10s %10s %7s\n", "path", "ok", "failed", "ttft_mean",
           "ttft_p50", "ttft_p90", "ttft_p99", "e2e_mean", "tokens");
    for (int k = 0; k < 2; k++)
        printf("%-7s %6zu %6u %10.3f %10.3f %10.3f %10.3f %10.3f %7.2f\n", p[k]->name, p[k]->nok,
               p[k]->failed, f->ttft[k].mean, f->ttft[k].p50, f->ttft[k].p90, f->ttft[k].p99,
               f->e2e[k].mean, f->tokens[k]);
    printf("(times in ms; tokens: the mean received by the requests answered in full)\n");
    printf("fleet/direct ttft: mean x%.3f, p50 x%.3f, p90 x%.3f; fleet - direct: mean %+.3f ms, "
           "p50 %+.3f ms\n",
           f->ratio_mean, f->ratio_p50, f->ratio_p90, f->diff_mean, f->diff_p50);
    if (f->answered)
        printf("target (fleet ttft <= 1.1 x direct + 1 ms): mean %s (%.3f ms, limit %.3f), p50 %s "
               "(%.3f ms, limit %.3f)\n",
               f->mean_met ? "met" : "missed", f->ttft[0].mean, 1.1 * f->ttft[1].mean + 1.0,
               f->p50_met ? "met" : "missed", f->ttft[0].p50, 1.1 * f->ttft[1].p50 + 1.0);
    else
        printf("target (fleet ttft <= 1.1 x direct + 1 ms): n/a (a path answered nothing)\n");
    for (int k = 0; k < 2; k++) {
        char codes[512];
        if (p[k]->failed)
            printf("%s failures by code: %s\n", p[k]->name,
                   kvr_contract_codes(p[k]->by_code, codes, sizeof codes));
    }
    printf("direct_ttft fleet_mean_ms=%.3f direct_mean_ms=%.3f fleet_p50_ms=%.3f "
           "direct_p50_ms=%.3f ratio_mean=%.3f ratio_p50=%.3f ratio_p90=%.3f diff_mean_ms=%.3f "
           "diff_p50_ms=%.3f fleet_failed=%u direct_failed=%u\n",
           f->ttft[0].mean, f->ttft[1].mean, f->ttft[0].p50, f->ttft[1].p50, f->ratio_mean,
           f->ratio_p50, f->ratio_p90, f->diff_mean, f->diff_p50, d->fleet.failed,
           d->straight.failed);
}

static json_t *stat_json(const struct kvr_stat *s)
{
    return json_pack("{s:f, s:f, s:f, s:f, s:f}", "mean", s->mean, "p50", s->p50, "p90", s->p90,
                     "p99", s->p99, "max", s->max);
}

static json_t *path_json(const struct path *p, const struct figures *f, int k)
{
    json_t *codes = json_object();
    for (unsigned c = 0; codes && c < KVR_CODE_SLOTS; c++) {
        char name[8];
        snprintf(name, sizeof name, "%u", c);
        if (p->by_code[c])
            json_object_set_new(codes, name, json_integer(p->by_code[c]));
    }
    return json_pack("{s:I, s:I, s:o, s:o, s:o, s:f}", "ok", (json_int_t)p->nok, "failed",
                     (json_int_t)p->failed, "errors_by_code", codes, "ttft_ms",
                     stat_json(&f->ttft[k]), "e2e_ms", stat_json(&f->e2e[k]), "tokens_mean",
                     f->tokens[k]);
}

/* The figures as one JSON object; NULL when memory is short. */
static json_t *report_json(const struct direct *d, const struct figures *f)
{
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:I}", "source", "kvbench", "mode",
                          "direct", "engine_url", d->cfg->engine, "model", kvr_oai_model(d->oai),
                          "prompt_tokens", (json_int_t)d->ptok, "max_tokens",
                          (json_int_t)d->max_tokens, "concurrency", (json_int_t)1);
    json_t *rounds = json_pack("{s:I, s:I, s:I, s:I, s:s?}", "asked", (json_int_t)d->rounds, "run",
                               (json_int_t)d->done, "warmup", (json_int_t)d->warmup,
                               "warmup_failed", (json_int_t)d->warm_failed, "stopped", d->stop);
    json_t *paths = json_pack("{s:o, s:o}", "fleet", path_json(&d->fleet, f, 0), "direct",
                              path_json(&d->straight, f, 1));
    json_t *ratio = json_pack("{s:f, s:f, s:f}", "mean", f->ratio_mean, "p50", f->ratio_p50, "p90",
                              f->ratio_p90);
    json_t *diff = json_pack("{s:f, s:f}", "mean", f->diff_mean, "p50", f->diff_p50);
    json_t *target =
        f->answered ? json_pack("{s:b, s:b}", "mean", f->mean_met, "p50", f->p50_met) : json_null();
    double submit = d->submits ? d->submit_us / d->submits : 0;
    /* json_object_set_new takes its value even when it fails (o NULL, the value NULL) */
    int bad = json_object_set_new(o, "rounds", rounds);
    bad |= json_object_set_new(o, "paths", paths);
    bad |= json_object_set_new(o, "ttft_ratio", ratio);
    bad |= json_object_set_new(o, "ttft_diff_ms", diff);
    bad |= json_object_set_new(o, "target_1_1x_plus_1ms", target);
    bad |= json_object_set_new(o, "direct_submit_us_mean", json_real(submit));
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* <out>/report.json, when --out is given. */
static void write_json(const struct direct *d, const struct figures *f)
{
    const struct kvr_bench_config *cfg = d->cfg;
    if (!cfg->out[0])
        return;
    char path[KVR_OPT_STR_MAX + 16];
    snprintf(path, sizeof path, "%s/report.json", cfg->out);
    json_t *o = report_json(d, f);
    kvr_mkdir_p(cfg->out);
    if (!o || json_dump_file(o, path, JSON_INDENT(2) | JSON_SORT_KEYS))
        fprintf(stderr, "kvbench: cannot write %s\n", path);
    else
        printf("wrote %s\n", path);
    json_decref(o);
}

/* --- the run ------------------------------------------------------------------------------- */

/* The engine's client, its model asked from /v1/models; false (printed) if it cannot be had. */
static bool connect_engine(struct direct *d)
{
    const char *url = d->cfg->engine;
    kvr_status st = kvr_oai_health(url, PROBE_MS);
    if (st != KVR_OK) {
        fprintf(stderr, "kvbench: engine %s not ready: GET /health: %s\n", url, kvr_status_str(st));
        return false;
    }
    /* as the adapter asks: token ids, continuous usage; a stream idle 30 s is given up */
    struct kvr_oai_config oc = {.base_url = url,
                                .idle_timeout_ms = (long)(DIRECT_WAIT_NS / KVR_NS_PER_MS),
                                .max_streams = 4,
                                .return_token_ids = true,
                                .continuous_usage = true};
    struct kvr_oai_hooks h = {on_chunk, on_end, &d->s};
    if (!(d->oai = kvr_oai_create(&oc, &h, &st)))
        fprintf(stderr, "kvbench: engine %s: %s\n", url, kvr_status_str(st));
    return d->oai != NULL;
}

static bool alloc_paths(struct direct *d)
{
    d->fleet.name = "fleet";
    d->straight.name = "direct";
    d->tok = calloc(d->ptok, sizeof *d->tok);
    d->fleet.ttft = calloc(d->rounds, sizeof(double));
    d->fleet.e2e = calloc(d->rounds, sizeof(double));
    d->straight.ttft = calloc(d->rounds, sizeof(double));
    d->straight.e2e = calloc(d->rounds, sizeof(double));
    return d->tok && d->fleet.ttft && d->fleet.e2e && d->straight.ttft && d->straight.e2e;
}

static void free_direct(struct direct *d)
{
    kvr_oai_destroy(d->oai); /* no hook runs after it: the stream can go */
    pthread_cond_destroy(&d->s.cv);
    pthread_mutex_destroy(&d->s.mu);
    free(d->tok);
    free(d->fleet.ttft);
    free(d->fleet.e2e);
    free(d->straight.ttft);
    free(d->straight.e2e);
    kvr_buf_free(&d->req);
    free(d);
}

/* Every round, then the figures; the exit status. */
static int measure(struct direct *d)
{
    const struct kvr_bench_config *cfg = d->cfg;
    printf("direct: %u rounds (after %u warm-up rounds), one request at a time, each round one "
           "request through the fleet (%s) and one straight to %s (model %s), alternating "
           "which goes first; every request %u fresh random prompt tokens, max_tokens %u\n",
           d->rounds, d->warmup, d->client->subj_gen, cfg->engine, kvr_oai_model(d->oai), d->ptok,
           d->max_tokens);
    fflush(stdout);
    uint32_t total = d->warmup + d->rounds, i = 0;
    while (i < total && !d->stop && round_one(d, i))
        i++;
    if (i == total)
        d->stop = NULL; /* a give-up in the last round: every round ran */
    else if (!d->stop)
        d->stop = "--timeout-ms reached";
    d->done = i > d->warmup ? i - d->warmup : 0;
    struct figures f;
    figure(d, &f);
    print_figures(d, &f);
    if (d->warm_failed)
        printf("warm-up: %u copies failed (not counted; printed above)\n", d->warm_failed);
    if (d->submits)
        printf("direct requests: kvr_oai_submit (the JSON body built) took %.1f us on average, "
               "not in their times\n",
               d->submit_us / d->submits);
    write_json(d, &f);
    int rc = d->fleet.failed || d->straight.failed || !d->fleet.nok || !d->straight.nok;
    if (d->stop) {
        fprintf(stderr,
                "kvbench: stopped after %u of %u rounds (and %u of %u warm-up rounds): %s\n",
                d->done, d->rounds, i < d->warmup ? i : d->warmup, d->warmup, d->stop);
        rc = 1;
    }
    printf("direct: %s\n", rc ? "FAIL (a request failed or a path had no answer)" : "ok");
    return rc;
}

int kvr_direct_run(const struct kvr_bench_config *cfg, struct kvr_client *client)
{
    struct direct *d = calloc(1, sizeof *d);
    if (!d)
        return 1;
    pthread_mutex_init(&d->s.mu, NULL);
    kvr_cond_init_monotonic(&d->s.cv);
    d->cfg = cfg;
    d->client = client;
    d->run = kvr_realtime_ns();
    d->rounds = cfg->requests ? cfg->requests : DIRECT_REQUESTS;
    d->warmup = cfg->warmup;
    d->ptok = cfg->prompt_tokens;
    d->max_tokens = cfg->max_tokens ? cfg->max_tokens : DIRECT_MAX_TOKENS;
    d->next_key = 1;
    d->deadline = cfg->timeout_ns ? kvr_now_ns() + cfg->timeout_ns : UINT64_MAX;
    int rc = 1;
    uint64_t total = (uint64_t)d->rounds + d->warmup;
    if (total > UINT32_MAX || !alloc_paths(d)) {
        fprintf(stderr, "kvbench: out of memory for %" PRIu64 " rounds\n", total);
    } else if (connect_engine(d)) {
        if (kvr_client_begin(client, (uint32_t)total, false, NULL, NULL, 0) == KVR_OK)
            rc = measure(d);
        else
            fprintf(stderr, "kvbench: out of memory for %" PRIu64 " rounds\n", total);
        kvr_client_end(client);
    }
    free_direct(d);
    return rc;
}
