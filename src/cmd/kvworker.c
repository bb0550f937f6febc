/*
 * kvworker: a simulated inference worker on NATS. It runs the simulated engine (src/engine) in real
 * time (step times divided by --speedup), takes requests on kv.<ns>.worker.<id>.generate, streams
 * GenerateResponse chunks (one per token) to each request's reply subject, and publishes what a
 * real engine adapter publishes: KV events, prefill done, output blocks, done, and a heartbeat
 * (block size, capacity, load, the request keys it holds). --null answers every request at once
 * (to measure the router's own overhead). SIGTERM/SIGINT: stop taking requests, finish the ones in
 * hand, exit 0.
 *
 * Threads: nats.c's delivery thread decodes requests and submits them; the engine thread steps
 * the engine; the heartbeat thread reports; all engine state is behind one mutex, and messages
 * made under it go out through an outbox after it is released.
 */
#define _DEFAULT_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uthash.h>

#include "../engine/engine.h"
#include "codec.h"
#include "kvr/hash.h"
#include "outbox.h"
#include "opts.h"
#include "util.h"

struct opts {
    char nats[KVR_OPT_STR_MAX];
    char ns[KVR_OPT_STR_MAX];
    char prefix[KVR_OPT_STR_MAX];
    char log_level[KVR_OPT_STR_MAX];
    uint64_t id;
    uint32_t block_size, num_blocks, max_batched_tokens, max_seqs;
    uint32_t max_prompt_tokens, max_output_tokens, heartbeat_ms, drain_timeout_ms;
    double speedup;
    bool null_mode;
};

struct wreq {
    uint64_t key;      /* the router's id for the request: the engine's request id */
    char *reply;       /* the client's reply subject */
    char *request_id;  /* the client's id */
    uint32_t produced; /* tokens sent */
    UT_hash_handle hh; /* by key; the worker owns the item */
};

struct worker {
    struct opts o;
    natsConnection *nc_in, *nc_out;
    natsSubscription *sub;
    struct kvr_engine *eng;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct wreq *reqs;     /* uthash head */
    struct kvr_outbox out; /* filled under mu */
    struct kvr_buf buf;    /* encoding scratch, under mu */
    uint64_t event_seq;    /* KV event sequence number */
    bool stopping;         /* threads exit */
    bool draining;         /* no new requests */
    char subj_kv[256], subj_tokens[256], subj_done[256], subj_hb[256], subj_gen[256];
    char name_in[64], name_out[64]; /* connection names (they outlive the connections) */
    uint64_t errors, served;
};

static volatile sig_atomic_t got_signal;

static void on_signal(int sig)
{
    got_signal = sig;
}

/* --- engine publications (called under mu, inside kvr_engine_step_end) ---------------------- */

static void emit(struct worker *w, const char *subject, kvr_status st)
{
    if (st == KVR_OK)
        kvr_outbox_add(&w->out, subject, w->buf.data, w->buf.len, KVR_OK);
}

static void on_stored(void *ctx, const uint64_t *parent, const struct kvr_kv_block *b, size_t n)
{
    struct worker *w = ctx;
    emit(w, w->subj_kv, kvr_wire_encode_stored(&w->buf, w->o.id, ++w->event_seq, parent, b, n));
}

static void on_removed(void *ctx, const uint64_t *ids, size_t n)
{
    struct worker *w = ctx;
    emit(w, w->subj_kv, kvr_wire_encode_removed(&w->buf, w->o.id, ++w->event_seq, ids, n));
}

static struct wreq *find(struct worker *w, uint64_t key)
{
    struct wreq *r = NULL;
    HASH_FIND(hh, w->reqs, &key, sizeof key, r);
    return r;
}

static void send_token(struct worker *w, struct wreq *r)
{
    uint32_t tok = (uint32_t)((r->key + r->produced) % 32000);
    r->produced++;
    if (kvr_wire_encode_response(&w->buf, r->request_id, &tok, 1, false, KVR_OK, w->o.id, 0) ==
        KVR_OK)
        kvr_outbox_add(&w->out, r->reply, w->buf.data, w->buf.len, KVR_OK);
}

static void on_prefill(void *ctx, uint64_t id)
{
    struct worker *w = ctx;
    emit(w, w->subj_tokens, kvr_wire_encode_tokens(&w->buf, w->o.id, id, KVR_WIRE_PREFILL_DONE));
    struct wreq *r = find(w, id);
    if (r)
        send_token(w, r); /* the prefill's own token */
}

static void on_token(void *ctx, uint64_t id)
{
    struct worker *w = ctx;
    struct wreq *r = find(w, id);
    if (r)
        send_token(w, r);
}

static void on_outblk(void *ctx, uint64_t id)
{
    struct worker *w = ctx;
    emit(w, w->subj_tokens, kvr_wire_encode_tokens(&w->buf, w->o.id, id, KVR_WIRE_OUTPUT_BLOCK));
}

static void free_req(struct wreq *r)
{
    free(r->reply);
    free(r->request_id);
    free(r);
}

static void on_done(void *ctx, const struct kvr_engine_result *res)
{
    struct worker *w = ctx;
    struct wreq *r = find(w, res->id);
    if (r) {
        if (kvr_wire_encode_response(&w->buf, r->request_id, NULL, 0, true, KVR_OK, w->o.id,
                                     res->cached_tokens) == KVR_OK)
            kvr_outbox_add(&w->out, r->reply, w->buf.data, w->buf.len, KVR_OK);
        HASH_DEL(w->reqs, r);
        free_req(r);
    }
    emit(w, w->subj_done, kvr_wire_encode_done(&w->buf, w->o.id, res->id, 0));
    w->served++;
}

/* --- requests --------------------------------------------------------------------------------- */

/* Tell a client its request failed (final chunk with the error, and the service headers). */
static void reply_error(struct worker *w, const char *reply, const char *request_id, kvr_status st)
{
    struct kvr_buf b = {0};
    w->errors++;
    if (reply && kvr_wire_encode_response(&b, request_id, NULL, 0, true, st, w->o.id, 0) == KVR_OK)
        kvr_publish(w->nc_out, reply, b.data, b.len, st);
    kvr_buf_free(&b);
    kvr_log(KVR_LOG_WARN, "request_refused", "request=\"%s\" error=\"%s\"",
            request_id ? request_id : "", kvr_status_str(st));
}

static kvr_status submit(struct worker *w, const struct kvr_wire_request *q, uint64_t key,
                         const char *reply)
{
    uint32_t nb = q->ntokens / w->o.block_size;
    uint64_t *h = malloc((2 * (size_t)nb + 1) * sizeof *h);
    struct wreq *r = calloc(1, sizeof *r);
    if (!h || !r) {
        free(h);
        free(r);
        return KVR_ERR_NOMEM;
    }
    kvr_hash_prompt(q->tokens, q->ntokens, w->o.block_size, h, h + nb);
    r->key = key;
    r->reply = strdup(reply);
    r->request_id = strdup(q->request_id);
    kvr_status st = r->reply && r->request_id ? KVR_OK : KVR_ERR_NOMEM;
    pthread_mutex_lock(&w->mu);
    if (st == KVR_OK && w->draining)
        st = KVR_ERR_SHUTDOWN;
    if (st == KVR_OK && find(w, key))
        st = KVR_ERR_DUPLICATE;
    if (st == KVR_OK) {
        struct kvr_engine_request er = {key, h + nb, h, nb, q->ntokens, q->max_tokens};
        st = kvr_engine_submit(w->eng, &er, kvr_now_ns());
    }
    if (st == KVR_OK) {
        HASH_ADD(hh, w->reqs, key, sizeof r->key, r);
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    if (st != KVR_OK)
        free_req(r);
    free(h);
    return st;
}

/* Null mode: the whole answer at once, and the done event the router waits for. */
static void answer_now(struct worker *w, const struct kvr_wire_request *q, uint64_t key,
                       const char *reply)
{
    struct kvr_buf b = {0};
    uint32_t tok = (uint32_t)(key % 32000);
    if (kvr_wire_encode_response(&b, q->request_id, &tok, 1, true, KVR_OK, w->o.id, 0) == KVR_OK)
        kvr_publish(w->nc_out, reply, b.data, b.len, KVR_OK);
    if (kvr_wire_encode_done(&b, w->o.id, key, 0) == KVR_OK)
        kvr_publish(w->nc_out, w->subj_done, b.data, b.len, KVR_OK);
    kvr_buf_free(&b);
}

static void on_generate(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc;
    (void)sub;
    struct worker *w = ctx;
    const char *reply = natsMsg_GetReply(msg);
    struct kvr_wire_limits lim = {w->o.max_prompt_tokens, w->o.max_output_tokens};
    struct kvr_wire_request q;
    uint64_t key = 0;
    uint32_t overlap = 0;
    kvr_status st = kvr_wire_decode_worker_generate(
        natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), &lim, &q, &key, &overlap);
    if (!reply || !*reply) {
        w->errors++;
        kvr_log(KVR_LOG_WARN, "request_dropped", "reason=\"no reply subject\"");
    } else if (st != KVR_OK) {
        reply_error(w, reply, q.request_id, st);
    } else if (w->o.null_mode) {
        answer_now(w, &q, key, reply);
    } else if ((st = submit(w, &q, key, reply)) != KVR_OK) {
        reply_error(w, reply, q.request_id, st);
    }
    kvr_wire_request_free(&q);
    natsMsg_Destroy(msg);
}

/* --- threads ---------------------------------------------------------------------------------- */

static void flush_outbox(struct worker *w)
{
    struct kvr_outbox local = {0};
    pthread_mutex_lock(&w->mu);
    kvr_outbox_swap(&local, &w->out);
    pthread_mutex_unlock(&w->mu);
    {
        struct kvr_sink sink = kvr_nats_sink(w->nc_out);
        kvr_outbox_flush(&local, &sink);
    }
    kvr_outbox_free(&local);
}

static void *engine_thread(void *arg)
{
    struct worker *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->stopping) {
        uint64_t now = kvr_now_ns();
        uint64_t dur = kvr_engine_step_begin(w->eng, now);
        if (!dur) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 50000000;
            if (until.tv_nsec >= 1000000000) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&w->cv, &w->mu, &until);
            continue;
        }
        pthread_mutex_unlock(&w->mu);
        uint64_t end = now + dur, t = kvr_now_ns();
        if (end > t)
            kvr_sleep_ns(end - t);
        pthread_mutex_lock(&w->mu);
        kvr_engine_step_end(w->eng, kvr_now_ns());
        pthread_mutex_unlock(&w->mu);
        flush_outbox(w);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void heartbeat(struct worker *w)
{
    /* one buffered while disconnected would arrive late and list stale requests: skip it */
    if (natsConnection_Status(w->nc_out) != NATS_CONN_STATUS_CONNECTED ||
        natsConnection_Status(w->nc_in) != NATS_CONN_STATUS_CONNECTED)
        return;
    struct kvr_wire_heartbeat h = {
        .info = {.id = w->o.id, .block_size = w->o.block_size, .capacity_blocks = w->o.num_blocks},
        .interval_ms = w->o.heartbeat_ms};
    struct kvr_buf b = {0};
    pthread_mutex_lock(&w->mu);
    struct kvr_engine_stats es;
    kvr_engine_stats(w->eng, &es);
    h.info.waiting = es.waiting;
    h.info.kv_usage = es.kv_usage;
    h.draining = w->draining;
    h.inflight = malloc(((size_t)HASH_COUNT(w->reqs) + 1) * sizeof *h.inflight);
    if (h.inflight)
        for (struct wreq *r = w->reqs; r; r = r->hh.next)
            h.inflight[h.ninflight++] = r->key;
    pthread_mutex_unlock(&w->mu);
    if (kvr_wire_encode_heartbeat(&b, &h) == KVR_OK)
        kvr_publish(w->nc_out, w->subj_hb, b.data, b.len, KVR_OK);
    free(h.inflight);
    kvr_buf_free(&b);
}

static void *heartbeat_thread(void *arg)
{
    struct worker *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        bool stop = w->stopping;
        pthread_mutex_unlock(&w->mu);
        if (stop)
            return NULL;
        heartbeat(w);
        for (uint32_t slept = 0; slept < w->o.heartbeat_ms; slept += 10) {
            kvr_sleep_ns(10000000);
            pthread_mutex_lock(&w->mu);
            stop = w->stopping;
            pthread_mutex_unlock(&w->mu);
            if (stop)
                return NULL;
        }
    }
}

/* --- main ------------------------------------------------------------------------------------- */

static int setup(struct worker *w)
{
    const char *p = w->o.prefix, *ns = w->o.ns;
    char tail[128];
    snprintf(tail, sizeof tail, "ev.%" PRIu64 ".kv", w->o.id);
    kvr_subject(w->subj_kv, sizeof w->subj_kv, p, ns, tail);
    snprintf(tail, sizeof tail, "ev.%" PRIu64 ".tokens", w->o.id);
    kvr_subject(w->subj_tokens, sizeof w->subj_tokens, p, ns, tail);
    snprintf(tail, sizeof tail, "ev.%" PRIu64 ".done", w->o.id);
    kvr_subject(w->subj_done, sizeof w->subj_done, p, ns, tail);
    snprintf(tail, sizeof tail, "ev.%" PRIu64 ".hb", w->o.id);
    kvr_subject(w->subj_hb, sizeof w->subj_hb, p, ns, tail);
    snprintf(tail, sizeof tail, "worker.%" PRIu64 ".generate", w->o.id);
    if (!kvr_subject(w->subj_gen, sizeof w->subj_gen, p, ns, tail))
        return 2;
    struct kvr_engine_config ec;
    kvr_engine_config_default(&ec);
    ec.block_size = w->o.block_size;
    ec.num_blocks = w->o.num_blocks;
    ec.max_batched_tokens = w->o.max_batched_tokens;
    ec.max_seqs = w->o.max_seqs;
    ec.speedup = w->o.speedup;
    struct kvr_engine_sink sink = {w,         on_stored, on_removed, on_prefill,
                                   on_outblk, NULL,      on_token,   on_done};
    kvr_status st;
    w->eng = kvr_engine_create(&ec, &sink, &st);
    if (!w->eng) {
        fprintf(stderr, "kvworker: engine: %s\n", kvr_status_str(st));
        return 2;
    }
    snprintf(w->name_in, sizeof w->name_in, "kvworker-%" PRIu64 "-in", w->o.id);
    if (kvr_connect(w->o.nats, w->name_in, &w->nc_in) != KVR_OK)
        return 1;
    snprintf(w->name_out, sizeof w->name_out, "kvworker-%" PRIu64, w->o.id);
    if (kvr_connect(w->o.nats, w->name_out, &w->nc_out) != KVR_OK)
        return 1;
    if (natsConnection_Subscribe(&w->sub, w->nc_in, w->subj_gen, on_generate, w) != NATS_OK ||
        natsSubscription_SetPendingLimits(w->sub, -1, -1) != NATS_OK ||
        natsConnection_Flush(w->nc_in) != NATS_OK) {
        kvr_log(KVR_LOG_ERROR, "subscribe_failed", "subject=%s", w->subj_gen);
        return 1;
    }
    return 0;
}

static void drain(struct worker *w)
{
    pthread_mutex_lock(&w->mu);
    w->draining = true;
    pthread_mutex_unlock(&w->mu);
    natsSubscription_Drain(w->sub);
    natsSubscription_WaitForDrainCompletion(w->sub, 5000);
    heartbeat(w); /* routers stop sending here */
    uint64_t deadline = kvr_now_ns() + (uint64_t)w->o.drain_timeout_ms * 1000000ull;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        unsigned left = HASH_COUNT(w->reqs);
        pthread_mutex_unlock(&w->mu);
        if (!left || kvr_now_ns() > deadline) {
            if (left)
                kvr_log(KVR_LOG_WARN, "drain_timeout", "requests_left=%u", left);
            break;
        }
        kvr_sleep_ns(20000000);
    }
    flush_outbox(w);
}

int main(int argc, char **argv)
{
    static struct worker w;
    struct opts *o = &w.o;
    strcpy(o->nats, "nats://127.0.0.1:4222");
    strcpy(o->ns, "default");
    strcpy(o->prefix, "kv");
    strcpy(o->log_level, "info");
    o->block_size = 64;
    o->num_blocks = 16384;
    o->max_batched_tokens = 8192;
    o->max_seqs = 256;
    o->max_prompt_tokens = 1u << 20;
    o->max_output_tokens = 1u << 16;
    o->heartbeat_ms = 1000;
    o->drain_timeout_ms = 60000;
    o->speedup = 1.0;
    const struct kvr_opt table[] = {
        {"nats", "KVR_NATS", KVR_OPT_STR, o->nats, "NATS server URLs, comma-separated", 0, 0, NULL},
        {"namespace", "KVR_NAMESPACE", KVR_OPT_STR, o->ns, "subject namespace", 0, 0, NULL},
        {"prefix", "KVR_PREFIX", KVR_OPT_STR, o->prefix, "subject prefix", 0, 0, NULL},
        {"id", "KVR_WORKER_ID", KVR_OPT_U64, &o->id, "worker id (non-zero; default: random)", 0, 0,
         NULL},
        {"block-size", "KVR_BLOCK_SIZE", KVR_OPT_U32, &o->block_size, "tokens per KV block", 0, 0,
         NULL},
        {"num-blocks", "KVR_NUM_BLOCKS", KVR_OPT_U32, &o->num_blocks, "KV pool size, blocks", 0, 0,
         NULL},
        {"max-batched-tokens", NULL, KVR_OPT_U32, &o->max_batched_tokens, "tokens per step", 0, 0,
         NULL},
        {"max-seqs", NULL, KVR_OPT_U32, &o->max_seqs, "sequences per step", 0, 0, NULL},
        {"speedup", "KVR_SPEEDUP", KVR_OPT_DOUBLE, &o->speedup, "engine time is divided by this", 0,
         0, NULL},
        {"null", "KVR_NULL", KVR_OPT_BOOL, &o->null_mode, "answer every request at once", 0, 0,
         NULL},
        {"heartbeat-ms", NULL, KVR_OPT_U32, &o->heartbeat_ms, "heartbeat period", 0, 0, NULL},
        {"max-prompt-tokens", NULL, KVR_OPT_U32, &o->max_prompt_tokens, "longer prompts refused", 0,
         0, NULL},
        {"max-output-tokens", NULL, KVR_OPT_U32, &o->max_output_tokens, "larger max_tokens refused",
         0, 0, NULL},
        {"drain-timeout-ms", NULL, KVR_OPT_U32, &o->drain_timeout_ms, "on SIGTERM, wait this long",
         0, 0, NULL},
        {"log-level", "KVR_LOG_LEVEL", KVR_OPT_STR, o->log_level, "debug, info, warn or error", 0,
         0, NULL},
    };
    int rc = kvr_opts_parse(table, sizeof table / sizeof table[0], argc, argv, "kvworker",
                            "A simulated LLM inference worker on NATS.");
    if (rc)
        return rc == 1 ? 0 : rc;
    enum kvr_log_level lvl;
    if (!kvr_log_parse_level(o->log_level, &lvl) || !o->block_size || !o->heartbeat_ms ||
        !(o->speedup > 0)) {
        fprintf(stderr, "kvworker: bad --log-level, --block-size, --heartbeat-ms or --speedup\n");
        return 2;
    }
    kvr_log_init("kvworker", lvl);
    if (!o->id)
        o->id = ((uint64_t)getpid() << 20) ^ (kvr_realtime_ns() & 0xfffff) ^ 1;
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    rc = setup(&w);
    if (rc)
        return rc;
    pthread_t engine, hb;
    pthread_create(&engine, NULL, engine_thread, &w);
    pthread_create(&hb, NULL, heartbeat_thread, &w);
    kvr_log(KVR_LOG_INFO, "worker_started",
            "id=%" PRIu64 " subject=%s block_size=%u num_blocks=%u speedup=%g null=%d", o->id,
            w.subj_gen, o->block_size, o->num_blocks, o->speedup, o->null_mode);
    while (!got_signal)
        kvr_sleep_ns(20000000);
    kvr_log(KVR_LOG_INFO, "worker_draining", "signal=%d", (int)got_signal);
    drain(&w);
    pthread_mutex_lock(&w.mu);
    w.stopping = true;
    pthread_cond_signal(&w.cv);
    pthread_mutex_unlock(&w.mu);
    pthread_join(engine, NULL);
    pthread_join(hb, NULL);
    flush_outbox(&w);
    natsConnection_FlushTimeout(w.nc_out, 2000);
    kvr_log(KVR_LOG_INFO, "worker_stopped", "served=%" PRIu64 " errors=%" PRIu64, w.served,
            w.errors);
    natsSubscription_Destroy(w.sub);
    natsConnection_Destroy(w.nc_in);
    natsConnection_Destroy(w.nc_out);
    kvr_engine_destroy(w.eng);
    struct wreq *r, *tmp;
    HASH_ITER(hh, w.reqs, r, tmp)
    {
        HASH_DEL(w.reqs, r);
        free_req(r);
    }
    kvr_outbox_free(&w.out);
    kvr_buf_free(&w.buf);
    nats_Close();
    return 0;
}
