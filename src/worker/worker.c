/*
 * kvr_worker implementation.
 */
#define _DEFAULT_SOURCE
#include "worker.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "codec.h"
#include "kvr/hash.h"
#include "log.h"
#include "subject.h"

/* --- engine publications (under mu, inside kvr_engine_step_end) ----------------------------- */

static void emit(struct kvr_worker *w, const char *subject, kvr_status st)
{
    if (st == KVR_OK)
        kvr_outbox_add(&w->out, subject, w->buf.data, w->buf.len, KVR_OK);
    else
        w->out.dropped++;
}

static void on_stored(void *ctx, const uint64_t *parent, const struct kvr_kv_block *b, size_t n)
{
    struct kvr_worker *w = ctx;
    emit(w, w->subj_kv, kvr_wire_encode_stored(&w->buf, w->cfg->id, ++w->event_seq, parent, b, n));
}

static void on_removed(void *ctx, const uint64_t *ids, size_t n)
{
    struct kvr_worker *w = ctx;
    emit(w, w->subj_kv, kvr_wire_encode_removed(&w->buf, w->cfg->id, ++w->event_seq, ids, n));
}

static struct kvr_wreq *find(struct kvr_worker *w, uint64_t key)
{
    struct kvr_wreq *r = NULL;
    HASH_FIND(hh, w->reqs, &key, sizeof key, r);
    return r;
}

static void send_token(struct kvr_worker *w, struct kvr_wreq *r)
{
    uint32_t tok = (uint32_t)((r->key + r->produced) % 32000);
    r->produced++;
    emit(w, r->reply,
         kvr_wire_encode_chunk(&w->buf, &(struct kvr_wire_chunk){.request_id = r->request_id,
                                                                 .tokens = &tok,
                                                                 .ntokens = 1,
                                                                 .final = false,
                                                                 .error = KVR_OK,
                                                                 .worker_id = w->cfg->id,
                                                                 .cached_tokens = 0}));
}

static void on_prefill(void *ctx, uint64_t id)
{
    struct kvr_worker *w = ctx;
    emit(w, w->subj_tokens, kvr_wire_encode_tokens(&w->buf, w->cfg->id, id, KVR_WIRE_PREFILL_DONE));
    struct kvr_wreq *r = find(w, id);
    if (r)
        send_token(w, r); /* the prefill's own token */
}

static void on_token(void *ctx, uint64_t id)
{
    struct kvr_worker *w = ctx;
    struct kvr_wreq *r = find(w, id);
    if (r)
        send_token(w, r);
}

static void on_outblk(void *ctx, uint64_t id)
{
    struct kvr_worker *w = ctx;
    emit(w, w->subj_tokens, kvr_wire_encode_tokens(&w->buf, w->cfg->id, id, KVR_WIRE_OUTPUT_BLOCK));
}

static void free_req(struct kvr_wreq *r)
{
    free(r->reply);
    free(r->request_id);
    free(r);
}

static void on_done(void *ctx, const struct kvr_engine_result *res)
{
    struct kvr_worker *w = ctx;
    struct kvr_wreq *r = find(w, res->id);
    if (r) {
        emit(w, r->reply,
             kvr_wire_encode_chunk(&w->buf,
                                   &(struct kvr_wire_chunk){.request_id = r->request_id,
                                                            .tokens = NULL,
                                                            .ntokens = 0,
                                                            .final = true,
                                                            .error = KVR_OK,
                                                            .worker_id = w->cfg->id,
                                                            .cached_tokens = res->cached_tokens}));
        HASH_DEL(w->reqs, r);
        w->nreqs--;
        free_req(r);
    }
    emit(w, w->subj_done, kvr_wire_encode_done(&w->buf, w->cfg->id, res->id, 0, 0));
    w->served++;
}

/* --- set-up --------------------------------------------------------------------------------- */

static bool subjects(struct kvr_worker *w)
{
    const char *p = w->cfg->net.prefix, *ns = w->cfg->net.ns;
    char tail[128];
    bool ok = true;
    static const char *const kinds[] = {"kv", "tokens", "done", "hb"};
    char *dst[] = {w->subj_kv, w->subj_tokens, w->subj_done, w->subj_hb};
    for (int i = 0; i < 4; i++) {
        snprintf(tail, sizeof tail, "ev.%" PRIu64 ".%s", w->cfg->id, kinds[i]);
        ok &= kvr_subject(dst[i], sizeof w->subj_kv, p, ns, tail);
    }
    snprintf(tail, sizeof tail, "worker.%" PRIu64 ".generate", w->cfg->id);
    return ok && kvr_subject(w->subj_gen, sizeof w->subj_gen, p, ns, tail);
}

kvr_status kvr_worker_init(struct kvr_worker *w, const struct kvr_wk_config *cfg,
                           struct kvr_sink sink)
{
    memset(w, 0, sizeof *w);
    w->cfg = cfg;
    w->sink = sink;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    kvr_reply_init(&w->generate, "generate", cfg->id);
    if (!subjects(w))
        return KVR_ERR_INVALID;
    struct kvr_engine_sink es = {w,         on_stored, on_removed, on_prefill,
                                 on_outblk, NULL,      on_token,   on_done};
    kvr_status st;
    w->eng = kvr_engine_create(&cfg->engine, &es, &st);
    return w->eng ? KVR_OK : st;
}

void kvr_worker_free(struct kvr_worker *w)
{
    kvr_engine_destroy(w->eng);
    struct kvr_wreq *r, *tmp;
    HASH_ITER(hh, w->reqs, r, tmp)
    {
        HASH_DEL(w->reqs, r);
        free_req(r);
    }
    kvr_outbox_free(&w->out);
    kvr_buf_free(&w->buf);
    kvr_reply_free(&w->generate);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

void kvr_worker_flush(struct kvr_worker *w)
{
    kvr_outbox_send(&w->out, &w->mu, &w->sink);
}

/* --- requests ------------------------------------------------------------------------------- */

/* Under mu: hand q (key, answered at reply) to the engine. */
static kvr_status submit(struct kvr_worker *w, const struct kvr_wire_request *q, uint64_t key,
                         const char *reply)
{
    if (w->draining)
        return KVR_ERR_SHUTDOWN;
    if (find(w, key))
        return KVR_ERR_DUPLICATE;
    if (w->nreqs >= KVR_WIRE_INFLIGHT_MAX)
        return KVR_ERR_OVERLOADED; /* a heartbeat lists every request held: no more than fit */
    uint32_t nb = q->ntokens / w->cfg->engine.block_size;
    uint64_t *h = malloc((2 * (size_t)nb + 1) * sizeof *h);
    struct kvr_wreq *r = calloc(1, sizeof *r);
    if (r) {
        r->key = key;
        r->reply = strdup(reply);
        r->request_id = strdup(q->request_id);
    }
    kvr_status st = h && r && r->reply && r->request_id ? KVR_OK : KVR_ERR_NOMEM;
    if (st == KVR_OK) {
        kvr_hash_prompt(q->tokens, q->ntokens, w->cfg->engine.block_size, h, h + nb);
        struct kvr_engine_request er = {key, h + nb, h, nb, q->ntokens, q->max_tokens};
        st = kvr_engine_submit(w->eng, &er, kvr_now_ns());
    }
    if (st == KVR_OK) {
        HASH_ADD(hh, w->reqs, key, sizeof r->key, r);
        w->nreqs++;
        pthread_cond_signal(&w->cv);
    } else if (r) {
        free_req(r);
    }
    free(h);
    return st;
}

/* Under mu, null mode: the whole answer at once, and the done event the router waits for. */
static void answer_now(struct kvr_worker *w, const struct kvr_wire_request *q, uint64_t key,
                       const char *reply)
{
    uint32_t tok = (uint32_t)(key % 32000);
    emit(w, reply,
         kvr_wire_encode_chunk(&w->buf, &(struct kvr_wire_chunk){.request_id = q->request_id,
                                                                 .tokens = &tok,
                                                                 .ntokens = 1,
                                                                 .final = true,
                                                                 .error = KVR_OK,
                                                                 .worker_id = w->cfg->id,
                                                                 .cached_tokens = 0}));
    emit(w, w->subj_done, kvr_wire_encode_done(&w->buf, w->cfg->id, key, 0, 0));
}

void kvr_worker_on_generate(struct kvr_worker *w, const char *reply, const void *data, size_t len)
{
    uint64_t t0 = kvr_now_ns();
    struct kvr_wire_limits lim = {w->cfg->max_prompt_tokens, w->cfg->max_output_tokens};
    struct kvr_wire_request q;
    uint64_t key = 0;
    uint32_t overlap = 0;
    kvr_status st = kvr_wire_decode_worker_generate(data, len, &lim, &q, &key, &overlap);
    pthread_mutex_lock(&w->mu);
    if (st == KVR_OK && !(reply && *reply))
        st = KVR_ERR_INVALID;
    if (st == KVR_OK && w->cfg->null_mode)
        answer_now(w, &q, key, reply);
    else if (st == KVR_OK)
        st = submit(w, &q, key, reply);
    if (st != KVR_OK)
        kvr_reply_error(&w->generate, &w->out, reply, q.request_id, st);
    kvr_reply_count(&w->generate, kvr_now_ns() - t0);
    pthread_mutex_unlock(&w->mu);
    kvr_wire_request_free(&q);
    kvr_worker_flush(w);
}

/* --- threads -------------------------------------------------------------------------------- */

/* Under mu: wait up to 50 ms for work or a stop. */
static void idle(struct kvr_worker *w)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 50000000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&w->cv, &w->mu, &until);
}

void kvr_worker_run_engine(struct kvr_worker *w)
{
    pthread_mutex_lock(&w->mu);
    while (!w->stopping) {
        uint64_t now = kvr_now_ns();
        uint64_t dur = kvr_engine_step_begin(w->eng, now);
        if (!dur) {
            idle(w);
            continue;
        }
        pthread_mutex_unlock(&w->mu);
        uint64_t end = now + dur, t = kvr_now_ns();
        if (end > t)
            kvr_sleep_ns(end - t);
        pthread_mutex_lock(&w->mu);
        kvr_engine_step_end(w->eng, kvr_now_ns());
        pthread_mutex_unlock(&w->mu);
        kvr_worker_flush(w);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
}

void kvr_worker_heartbeat(struct kvr_worker *w)
{
    struct kvr_wire_heartbeat h = {.info = {.id = w->cfg->id,
                                            .block_size = w->cfg->engine.block_size,
                                            .capacity_blocks = w->cfg->engine.num_blocks},
                                   .interval_ms = (uint32_t)(w->cfg->heartbeat_ns / KVR_NS_PER_MS)};
    pthread_mutex_lock(&w->mu);
    struct kvr_engine_stats es;
    kvr_engine_stats(w->eng, &es);
    h.info.waiting = es.waiting;
    h.info.kv_usage = es.kv_usage;
    h.draining = w->draining;
    h.inflight = malloc(((size_t)w->nreqs + 1) * sizeof *h.inflight);
    for (struct kvr_wreq *r = w->reqs; h.inflight && r; r = r->hh.next)
        h.inflight[h.ninflight++] = r->key;
    emit(w, w->subj_hb, h.inflight ? kvr_wire_encode_heartbeat(&w->buf, &h) : KVR_ERR_NOMEM);
    pthread_mutex_unlock(&w->mu);
    free(h.inflight);
    kvr_worker_flush(w);
}

void kvr_worker_set_draining(struct kvr_worker *w)
{
    pthread_mutex_lock(&w->mu);
    w->draining = true;
    pthread_mutex_unlock(&w->mu);
}

uint32_t kvr_worker_held(struct kvr_worker *w)
{
    pthread_mutex_lock(&w->mu);
    uint32_t n = w->nreqs;
    pthread_mutex_unlock(&w->mu);
    return n;
}

void kvr_worker_stop(struct kvr_worker *w)
{
    pthread_mutex_lock(&w->mu);
    w->stopping = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

bool kvr_worker_stopping(struct kvr_worker *w)
{
    pthread_mutex_lock(&w->mu);
    bool s = w->stopping;
    pthread_mutex_unlock(&w->mu);
    return s;
}
