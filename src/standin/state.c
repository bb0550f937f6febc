/*
 * kvr_se_state implementation: requests, the engine's sink (tokens into streams, KV events into
 * batches), the engine thread, the drain and the test hooks.
 */
#define _DEFAULT_SOURCE
#include "state.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <uthash.h>

#include "clock.h"
#include "grow.h"
#include "kvr/hash.h"
#include "kvr/rng.h"
#include "log.h"
#include "metrics.h"

#define IDLE_NS      (200 * KVR_NS_PER_MS) /* the engine thread's longest sleep */
#define RELEASE_WAIT (1 * KVR_NS_PER_S)    /* the drain waits this long for HTTP sides */

struct kvr_se_req {
    uint64_t id;              /* the engine's request id */
    char cid[KVR_SE_ID_MAX];  /* "cmpl-<32 hex>" */
    uint64_t created;         /* Unix seconds at submission */
    uint64_t seed;            /* its output tokens (kvr_se_token) */
    uint64_t submitted;       /* monotonic ns */
    uint32_t isl, max_tokens; /* */
    uint32_t limit;           /* tokens it generates: max_tokens, or --stop-after below it */
    bool stream;              /* the flags of the request, fixed at submission */
    bool include_usage;       /* */
    bool continuous;          /* */
    bool token_ids;           /* */
    int evfd;                 /* eventfd: written when out grows or the request ends */
    /* under mu from here */
    uint32_t produced;      /* tokens generated */
    uint32_t cached_tokens; /* prompt tokens found cached, known at the prefill */
    enum kvr_se_end end;    /* */
    struct kvr_buf out;     /* stream bytes; out_at of them read */
    size_t out_at;          /* */
    uint8_t refs;           /* the engine side until it ends, the HTTP side until release */
    uint64_t *seq;          /* its full prompt blocks' sequence hashes, in the block table */
    uint32_t nseq;          /* */
    uint32_t *prompt;       /* with token_ids, its prompt until its first chunk echoes it as
                               prompt_token_ids, as vLLM does (owned; NULL: none, or echoed) */
    size_t echo_bytes;      /* that first chunk's bytes: unread, they are not "behind" */
    UT_hash_handle hh;      /* in st->reqs while the engine holds it */
};

/* --- requests (under mu) --------------------------------------------------------------------- */

static struct kvr_se_req *find(struct kvr_se_state *st, uint64_t id)
{
    struct kvr_se_req *r = NULL;
    HASH_FIND(hh, st->reqs, &id, sizeof id, r);
    return r;
}

static void wake(const struct kvr_se_req *r)
{
    uint64_t one = 1;
    if (write(r->evfd, &one, sizeof one) < 0 && errno != EAGAIN)
        kvr_log(KVR_LOG_WARN, "eventfd_write_failed", "error=\"%s\"", strerror(errno));
}

static void free_req(struct kvr_se_req *r)
{
    if (r->evfd >= 0)
        close(r->evfd);
    kvr_buf_free(&r->out);
    free(r->seq);
    free(r->prompt);
    free(r);
}

/* One side lets r go; the last frees it. */
static void unref(struct kvr_se_req *r)
{
    if (--r->refs == 0)
        free_req(r);
}

/* The engine side of r ends with how: out of the table, its blocks let go, the HTTP side told. */
static void retire(struct kvr_se_state *st, struct kvr_se_req *r, enum kvr_se_end how)
{
    HASH_DEL(st->reqs, r);
    st->nreqs--;
    if (st->pub)
        kvr_se_blocks_unref(&st->blocks, r->seq, r->nseq);
    r->end = how;
    wake(r);
    pthread_cond_broadcast(&st->changed);
    unref(r);
}

/* A stream event that could not be made (out of memory) is counted. */
static void count_oom(struct kvr_se_state *st, kvr_status made)
{
    if (made != KVR_OK)
        st->c.oom++;
}

static struct kvr_se_chunk chunk_of(const struct kvr_se_state *st, const struct kvr_se_req *r)
{
    return (struct kvr_se_chunk){.id = r->cid,
                                 .model = st->cfg->model,
                                 .created = r->created,
                                 .seed = r->seed,
                                 .token_ids = r->token_ids,
                                 .prompt_tokens = r->isl,
                                 .cached_tokens = r->cached_tokens};
}

/* Why r ends once it produced its limit: "stop" when that is below what it asked for. */
static const char *finish_of(const struct kvr_se_req *r)
{
    return r->limit < r->max_tokens ? "stop" : "length";
}

/* r's next token: its stream event, unless its client fell too far behind (then it is cancelled
 * after the step: not from inside the engine's callback). */
static void produce(struct kvr_se_state *st, struct kvr_se_req *r)
{
    uint32_t i = r->produced++;
    st->c.generation_tokens++;
    if (!r->stream)
        return;
    if (r->out.len - r->out_at > st->cfg->stream_buffer_bytes + r->echo_bytes) {
        if (r->end == KVR_SE_RUNNING && KVR_GROW(st->cancels, st->capcancels, st->ncancels + 1, 16))
            st->cancels[st->ncancels++] = r->id;
        r->end = KVR_SE_OVERFLOW; /* still held: retired after the step */
        return;
    }
    struct kvr_se_chunk c = chunk_of(st, r);
    c.from = i;
    c.n = 1;
    c.choices = true;
    c.finish = r->produced == r->limit ? finish_of(r) : NULL;
    c.usage = r->continuous;
    c.completion_tokens = r->produced;
    c.prompt_ids = r->prompt; /* on the first chunk only */
    size_t before = r->out.len;
    count_oom(st, kvr_se_wire_sse_chunk(&r->out, &c));
    if (r->prompt)
        r->echo_bytes = r->out.len - before;
    free(r->prompt);
    r->prompt = NULL;
    wake(r);
}

/* --- the engine's sink (under mu, inside step_end) ------------------------------------------- */

/* A block's id on the wire: the engine's own (kvrouter's sequence hash) mixed with the process's
 * salt, a bijection. A real engine's block hashes are its own (vLLM's depend on its hash function
 * and seed, and change with a restart), so the router and the adapter must never take them for
 * their own: with the sequence hash itself on the wire, a test could pass that vLLM would fail. */
static uint64_t wire_id(const struct kvr_se_state *st, uint64_t engine_id)
{
    return kvr_mix64(engine_id ^ st->kv_salt);
}

static void on_stored(void *ctx, const uint64_t *parent, const struct kvr_kv_block *b, size_t n)
{
    struct kvr_se_state *st = ctx;
    if (!st->pub)
        return;
    if (n > UINT32_MAX || !KVR_GROW(st->scratch, st->capscratch, (uint32_t)n, 64) ||
        !KVR_GROW(st->scratch_tok, st->capscratch_tok, (uint32_t)n, 64)) {
        st->c.oom++;
        return;
    }
    uint32_t k = 0;
    uint64_t up = parent ? wire_id(st, *parent) : 0;
    const uint64_t *p = parent ? &up : NULL;
    for (size_t i = 0; i < n; i++) {
        const uint32_t *tok = kvr_se_blocks_stored(&st->blocks, b[i].engine_id);
        if (tok) {
            st->scratch[k] = wire_id(st, b[i].engine_id);
            st->scratch_tok[k++] = tok;
            continue;
        }
        /* tokens unknown (counted): the run is cut there, the block is not announced */
        kvr_se_batcher_stored(&st->batcher, p, st->scratch, st->scratch_tok, k);
        up = wire_id(st, b[i].engine_id);
        p = &up;
        k = 0;
    }
    kvr_se_batcher_stored(&st->batcher, p, st->scratch, st->scratch_tok, k);
}

static void on_removed(void *ctx, const uint64_t *ids, size_t n)
{
    struct kvr_se_state *st = ctx;
    if (!st->pub)
        return;
    for (size_t i = 0; i < n; i++)
        kvr_se_blocks_removed(&st->blocks, ids[i]);
    for (size_t i = 0; i < n; i += 4096) { /* their wire ids, a scratch's worth at a time */
        uint32_t m = (uint32_t)(n - i < 4096 ? n - i : 4096);
        if (!KVR_GROW(st->scratch, st->capscratch, m, 64)) {
            st->c.oom++;
            return;
        }
        for (uint32_t j = 0; j < m; j++)
            st->scratch[j] = wire_id(st, ids[i + j]);
        kvr_se_batcher_removed(&st->batcher, st->scratch, m);
    }
}

static void on_prefill(void *ctx, uint64_t id)
{
    struct kvr_se_state *st = ctx;
    struct kvr_se_req *r = find(st, id);
    struct kvr_engine_progress p;
    if (!r)
        return;
    if (kvr_engine_progress(st->eng, id, &p))
        r->cached_tokens = p.cached_tokens;
    st->c.prefix_queries += r->isl;
    st->c.prefix_hits += r->cached_tokens;
    uint64_t now = kvr_now_ns();
    kvr_prom_hist_observe(&st->c.ttft, now - r->submitted);
    produce(st, r); /* the prefill's own token: the first chunk */
}

static void on_token(void *ctx, uint64_t id)
{
    struct kvr_se_state *st = ctx;
    struct kvr_se_req *r = find(st, id);
    if (r)
        produce(st, r);
}

static void on_done(void *ctx, const struct kvr_engine_result *res)
{
    struct kvr_se_state *st = ctx;
    struct kvr_se_req *r = find(st, res->id);
    if (!r)
        return;
    if (r->end == KVR_SE_OVERFLOW)
        return; /* retired after the step, with the overflows */
    r->cached_tokens = res->cached_tokens;
    if (r->stream && r->include_usage) {
        struct kvr_se_chunk c = chunk_of(st, r);
        c.usage = c.cached = true;
        c.completion_tokens = r->produced;
        count_oom(st, kvr_se_wire_sse_chunk(&r->out, &c));
    }
    if (r->stream)
        count_oom(st, kvr_se_wire_sse_done(&r->out));
    st->c.finished++;
    st->c.stopped += r->limit < r->max_tokens;
    retire(st, r, KVR_SE_FINISHED);
}

/* --- set-up ---------------------------------------------------------------------------------- */

static kvr_status publish(void *ctx, const void *payload, size_t len)
{
    struct kvr_se_state *st = ctx;
    return kvr_kvpub_publish(st->pub, payload, len, NULL);
}

static struct kvr_engine *new_engine(struct kvr_se_state *st, kvr_status *err)
{
    struct kvr_engine_sink sink = {st,   on_stored, on_removed, on_prefill,
                                   NULL, NULL,      on_token,   on_done};
    return kvr_engine_create(&st->cfg->engine, &sink, err);
}

static kvr_status open_pub(struct kvr_se_state *st, char *why, size_t len)
{
    const struct kvr_se_config *cfg = st->cfg;
    static const enum kvr_kvev_hash_form forms[] = {KVR_KVEV_HASH_INT, KVR_KVEV_HASH_UINT,
                                                    KVR_KVEV_HASH_BYTES32};
    static const enum kvr_kvev_layout layouts[] = {KVR_KVEV_LAYOUT_NEW, KVR_KVEV_LAYOUT_OLD,
                                                   KVR_KVEV_LAYOUT_MAP};
    /* vLLM V1 appends its data-parallel rank; the older layout predates it */
    struct kvr_kvev_encoding how = {forms[cfg->kv_hash], layouts[cfg->kv_layout],
                                    cfg->kv_layout != KVR_SE_LAYOUT_OLD};
    kvr_status err =
        kvr_se_batcher_init(&st->batcher, &how, NULL, cfg->engine.block_size, publish, st);
    st->batcher.hybrid = cfg->kv_hybrid;
    st->batcher.dp_rank = cfg->dp_rank;
    if (err != KVR_OK) {
        snprintf(why, len, "KV events: --block-size %u does not fit a batch",
                 cfg->engine.block_size);
        return err;
    }
    st->pub = kvr_kvpub_open(cfg->kv_events, cfg->kv_replay[0] ? cfg->kv_replay : NULL,
                             cfg->kv_topic, cfg->kv_replay_batches, &err);
    if (!st->pub)
        snprintf(why, len, "KV events: cannot bind %s%s%s: %s", cfg->kv_events,
                 cfg->kv_replay[0] ? " and " : "", cfg->kv_replay, kvr_status_str(err));
    return st->pub ? KVR_OK : err;
}

static uint64_t draw_salt(void)
{
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, GRND_NONBLOCK) != (ssize_t)sizeof x)
        x = kvr_mix64(kvr_realtime_ns() ^ ((uint64_t)getpid() << 32));
    return x;
}

kvr_status kvr_se_state_init(struct kvr_se_state *st, const struct kvr_se_config *cfg, char *why,
                             size_t len)
{
    memset(st, 0, sizeof *st);
    st->cfg = cfg;
    st->salt = draw_salt();
    st->kv_salt = cfg->kv_hash_seed ? cfg->kv_hash_seed : st->salt;
    kvr_se_blocks_init(&st->blocks, cfg->engine.block_size);
    pthread_mutex_init(&st->mu, NULL);
    kvr_cond_init_monotonic(&st->work); /* kvr_now_ns's clock */
    kvr_cond_init_monotonic(&st->changed);
    kvr_status err = KVR_OK;
    st->eng = new_engine(st, &err);
    if (!st->eng)
        snprintf(why, len, "engine: %s (check --num-blocks, --block-size, --speedup)",
                 kvr_status_str(err));
    else if (cfg->kv_events[0])
        err = open_pub(st, why, len);
    if (err != KVR_OK)
        kvr_se_state_free(st);
    return err;
}

/* --- the engine thread ----------------------------------------------------------------------- */

static void wait_until(struct kvr_se_state *st, uint64_t until)
{
    struct timespec ts = {(time_t)(until / KVR_NS_PER_S), (long)(until % KVR_NS_PER_S)};
    pthread_cond_timedwait(&st->work, &st->mu, &ts);
}

/* The streams that fell behind in the step just ended: cancelled now (outside the callbacks). */
static void settle_overflows(struct kvr_se_state *st)
{
    for (uint32_t i = 0; i < st->ncancels; i++) {
        struct kvr_se_req *r = find(st, st->cancels[i]);
        if (!r)
            continue;
        kvr_engine_cancel(st->eng, r->id); /* it may have finished in the step: no matter */
        st->c.overflows++;
        kvr_log(KVR_LOG_WARN, "stream_overflow", "id=%s unread=%zu", r->cid,
                r->out.len - r->out_at);
        retire(st, r, KVR_SE_OVERFLOW);
    }
    st->ncancels = 0;
}

/* Let the step in progress run until end (or a stall's end), mu released while waiting. */
static void step_wait(struct kvr_se_state *st, uint64_t end)
{
    for (;;) {
        uint64_t now = kvr_now_ns(), until = end > st->stall_until ? end : st->stall_until;
        if (now >= until || st->stopping)
            return;
        wait_until(st, until < now + IDLE_NS ? until : now + IDLE_NS);
    }
}

static void *engine_main(void *arg)
{
    struct kvr_se_state *st = arg;
    pthread_mutex_lock(&st->mu);
    while (!st->stopping) {
        uint64_t now = kvr_now_ns();
        if (st->stall_until > now) {
            step_wait(st, now);
            continue;
        }
        uint64_t dur = kvr_engine_step_begin(st->eng, now);
        if (!dur) {
            wait_until(st, now + IDLE_NS);
            continue;
        }
        step_wait(st, now + dur);
        if (st->stopping)
            break;
        if (st->pub)
            kvr_se_batcher_begin(&st->batcher, (double)kvr_realtime_ns() / 1e9);
        kvr_engine_step_end(st->eng, kvr_now_ns());
        st->c.steps++;
        if (st->pub)
            kvr_se_batcher_flush(&st->batcher);
        settle_overflows(st);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

kvr_status kvr_se_state_start(struct kvr_se_state *st)
{
    if (pthread_create(&st->thread, NULL, engine_main, st))
        return KVR_ERR_NOMEM;
    st->running = true;
    return KVR_OK;
}

void kvr_se_state_stop(struct kvr_se_state *st)
{
    if (!st->running)
        return;
    pthread_mutex_lock(&st->mu);
    st->stopping = true;
    pthread_cond_broadcast(&st->work);
    pthread_mutex_unlock(&st->mu);
    pthread_join(st->thread, NULL);
    st->running = false;
}

void kvr_se_state_free(struct kvr_se_state *st)
{
    kvr_se_state_stop(st);
    struct kvr_se_req *r, *tmp;
    HASH_ITER(hh, st->reqs, r, tmp)
    {
        HASH_DEL(st->reqs, r);
        free_req(r); /* no HTTP side is left: the server stopped first */
    }
    kvr_kvpub_close(st->pub);
    kvr_se_batcher_free(&st->batcher);
    kvr_se_blocks_free(&st->blocks);
    kvr_engine_destroy(st->eng);
    free(st->cancels);
    free(st->scratch);
    free(st->scratch_tok);
    pthread_cond_destroy(&st->work);
    pthread_cond_destroy(&st->changed);
    pthread_mutex_destroy(&st->mu);
    memset(st, 0, sizeof *st);
}

/* --- the HTTP side --------------------------------------------------------------------------- */

/* A new request for c, its hashes made (outside mu); NULL when memory ran out. */
static struct kvr_se_req *new_req(const struct kvr_se_state *st, const struct kvr_se_completion *c)
{
    uint32_t bs = st->cfg->engine.block_size, nb = c->nprompt / bs;
    struct kvr_se_req *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    r->seq = malloc((2 * (size_t)nb + 1) * sizeof *r->seq);
    if (c->return_token_ids && c->stream && (r->prompt = malloc((size_t)c->nprompt * 4)))
        memcpy(r->prompt, c->prompt, (size_t)c->nprompt * 4);
    if (r->evfd < 0 || !r->seq || (c->return_token_ids && c->stream && !r->prompt)) {
        free_req(r);
        return NULL;
    }
    kvr_hash_prompt(c->prompt, c->nprompt, bs, r->seq + nb, r->seq); /* seq, then local */
    r->nseq = nb;
    r->created = kvr_realtime_ns() / KVR_NS_PER_S;
    r->seed = kvr_se_prompt_seed(c->prompt, c->nprompt);
    r->isl = c->nprompt;
    r->max_tokens = c->max_tokens;
    uint32_t stop = st->cfg->stop_after;
    r->limit = stop && stop < c->max_tokens ? stop : c->max_tokens;
    r->stream = c->stream;
    r->include_usage = c->include_usage;
    r->continuous = c->continuous_usage;
    r->token_ids = c->return_token_ids;
    r->refs = 2;
    return r;
}

/* Under mu: r into the engine (and its blocks into the table). */
static kvr_status enter(struct kvr_se_state *st, struct kvr_se_req *r,
                        const struct kvr_se_completion *c)
{
    r->id = ++st->next_id;
    uint64_t a = kvr_mix64(st->salt ^ r->id);
    snprintf(r->cid, sizeof r->cid, "cmpl-%016" PRIx64 "%016" PRIx64, a, kvr_mix64(a));
    if (st->pub && kvr_se_blocks_ref(&st->blocks, r->seq, c->prompt, r->nseq) != KVR_OK)
        return KVR_ERR_NOMEM;
    r->submitted = kvr_now_ns();
    struct kvr_engine_request er = {r->id, r->seq, r->seq + r->nseq, r->nseq, r->isl, r->limit};
    kvr_status err = kvr_engine_submit(st->eng, &er, r->submitted);
    if (err != KVR_OK) {
        if (st->pub)
            kvr_se_blocks_unref(&st->blocks, r->seq, r->nseq);
        return err;
    }
    HASH_ADD(hh, st->reqs, id, sizeof r->id, r);
    st->nreqs++;
    st->nlive++;
    st->c.requests++;
    st->c.prompt_tokens += r->isl;
    pthread_cond_signal(&st->work);
    return KVR_OK;
}

kvr_status kvr_se_submit(struct kvr_se_state *st, const struct kvr_se_completion *c,
                         struct kvr_se_req **out, struct kvr_se_refusal *why)
{
    *out = NULL;
    struct kvr_se_req *r = new_req(st, c);
    kvr_status err = r ? KVR_OK : KVR_ERR_NOMEM;
    pthread_mutex_lock(&st->mu);
    if (err == KVR_OK && st->draining) {
        kvr_se_refuse(why, 503, NULL, "kvengine is shutting down");
        err = KVR_ERR_SHUTDOWN;
    } else if (err == KVR_OK && st->nlive >= st->cfg->max_inflight) {
        kvr_se_refuse(why, 429, NULL,
                      "too many requests in flight: %u, at most %u (--max-inflight)", st->nlive,
                      st->cfg->max_inflight);
        err = KVR_ERR_OVERLOADED;
    } else if (err == KVR_OK) {
        err = enter(st, r, c);
        if (err != KVR_OK)
            kvr_se_refuse(why, 500, NULL, "the engine refused the request: %s",
                          kvr_status_str(err));
    } else {
        kvr_se_refuse(why, 500, NULL, "out of memory");
    }
    pthread_mutex_unlock(&st->mu);
    if (err != KVR_OK && r)
        free_req(r);
    *out = err == KVR_OK ? r : NULL;
    return err;
}

int kvr_se_req_fd(const struct kvr_se_req *r)
{
    return r->evfd;
}

bool kvr_se_req_stream(const struct kvr_se_req *r)
{
    return r->stream;
}

size_t kvr_se_read(struct kvr_se_state *st, struct kvr_se_req *r, char *buf, size_t max,
                   enum kvr_se_end *end)
{
    uint64_t v;
    while (read(r->evfd, &v, sizeof v) == (ssize_t)sizeof v) /* before looking: no wake lost */
        ;
    pthread_mutex_lock(&st->mu);
    size_t n = r->out.len - r->out_at;
    n = n < max ? n : max;
    if (r->end == KVR_SE_OVERFLOW || r->end == KVR_SE_CANCELLED)
        n = 0; /* the stream is cut: what it holds is never sent */
    if (n)
        memcpy(buf, r->out.data + r->out_at, n);
    r->out_at += n;
    if (r->out_at == r->out.len) {
        r->out.len = r->out_at = 0;
    } else if (r->out_at > r->out.len - r->out_at) { /* the buffer holds at most 2x unread */
        memmove(r->out.data, r->out.data + r->out_at, r->out.len - r->out_at);
        r->out.len -= r->out_at;
        r->out_at = 0;
    }
    *end = n ? KVR_SE_RUNNING : r->end;
    pthread_mutex_unlock(&st->mu);
    return n;
}

enum kvr_se_end kvr_se_outcome(struct kvr_se_state *st, struct kvr_se_req *r, struct kvr_buf *out,
                               unsigned *status)
{
    uint64_t v;
    while (read(r->evfd, &v, sizeof v) == (ssize_t)sizeof v)
        ;
    pthread_mutex_lock(&st->mu);
    enum kvr_se_end end = r->end;
    struct kvr_se_chunk c = chunk_of(st, r);
    pthread_mutex_unlock(&st->mu);
    if (end == KVR_SE_FINISHED) {
        c.choices = c.cached = true;
        c.finish = finish_of(r);
        c.n = c.completion_tokens = r->limit; /* produced, now fixed */
        *status = kvr_se_wire_completion(out, &c) == KVR_OK ? 200 : 500;
    } else if (end != KVR_SE_RUNNING) {
        struct kvr_se_refusal why;
        kvr_se_refuse(&why, 503, NULL, "kvengine is shutting down: the request was aborted");
        *status = 503;
        kvr_se_wire_error(out, st->cfg->error_shape, &why);
    }
    return end;
}

void kvr_se_release(struct kvr_se_state *st, struct kvr_se_req *r)
{
    pthread_mutex_lock(&st->mu);
    if (r->end == KVR_SE_RUNNING) { /* its client went away: the engine stops it at once */
        kvr_engine_cancel(st->eng, r->id);
        st->c.aborted++;
        kvr_log(KVR_LOG_DEBUG, "request_aborted", "id=%s produced=%u", r->cid, r->produced);
        retire(st, r, KVR_SE_CANCELLED);
    } else if (find(st, r->id) == r) { /* an overflow whose cancel could not be queued */
        kvr_engine_cancel(st->eng, r->id);
        st->c.overflows++;
        retire(st, r, r->end);
    }
    st->nlive--;
    pthread_cond_broadcast(&st->changed);
    unref(r);
    pthread_mutex_unlock(&st->mu);
}

/* --- drain ----------------------------------------------------------------------------------- */

/* Wait on changed until pred holds or the monotonic deadline passes. */
static bool wait_for(struct kvr_se_state *st, const uint32_t *count, uint64_t deadline)
{
    while (*count) {
        uint64_t now = kvr_now_ns();
        if (now >= deadline)
            return false;
        struct timespec ts = {(time_t)(deadline / KVR_NS_PER_S), (long)(deadline % KVR_NS_PER_S)};
        pthread_cond_timedwait(&st->changed, &st->mu, &ts);
    }
    return true;
}

/* Abort every request held: the engine lets it go; a stream is told and ended. */
static uint32_t abort_all(struct kvr_se_state *st)
{
    struct kvr_se_refusal why;
    kvr_se_refuse(&why, 503, NULL, "kvengine is shutting down: the request was aborted");
    uint32_t n = 0;
    struct kvr_se_req *r, *tmp;
    HASH_ITER(hh, st->reqs, r, tmp)
    {
        kvr_engine_cancel(st->eng, r->id);
        if (r->stream && r->end == KVR_SE_RUNNING) {
            count_oom(st, kvr_se_wire_sse_error(&r->out, st->cfg->error_shape, &why));
            count_oom(st, kvr_se_wire_sse_done(&r->out));
        }
        st->c.shutdown++;
        retire(st, r, r->end == KVR_SE_OVERFLOW ? KVR_SE_OVERFLOW : KVR_SE_SHUTDOWN);
        n++;
    }
    return n;
}

uint32_t kvr_se_drain(struct kvr_se_state *st, uint64_t timeout_ns)
{
    pthread_mutex_lock(&st->mu);
    st->draining = true;
    uint64_t now = kvr_now_ns();
    wait_for(st, &st->nreqs, now + timeout_ns);
    uint32_t n = abort_all(st);
    wait_for(st, &st->nlive, kvr_now_ns() + RELEASE_WAIT);
    pthread_mutex_unlock(&st->mu);
    return n;
}

bool kvr_se_draining(struct kvr_se_state *st)
{
    pthread_mutex_lock(&st->mu);
    bool d = st->draining;
    pthread_mutex_unlock(&st->mu);
    return d;
}

/* --- test hooks ------------------------------------------------------------------------------ */

bool kvr_se_drop_batches(struct kvr_se_state *st, uint32_t n)
{
    if (!st->pub)
        return false;
    kvr_kvpub_drop(st->pub, n);
    pthread_mutex_lock(&st->mu);
    st->c.drops += n;
    pthread_mutex_unlock(&st->mu);
    return true;
}

void kvr_se_stall(struct kvr_se_state *st, uint32_t ms)
{
    pthread_mutex_lock(&st->mu);
    st->stall_until = kvr_now_ns() + ms * KVR_NS_PER_MS;
    st->c.stalls++;
    pthread_cond_broadcast(&st->work);
    pthread_mutex_unlock(&st->mu);
}

kvr_status kvr_se_clear(struct kvr_se_state *st, struct kvr_se_refusal *why)
{
    kvr_status err = KVR_OK;
    pthread_mutex_lock(&st->mu);
    if (st->nreqs) {
        kvr_se_refuse(why, 409, NULL, "%u requests are running: the cache is reset only idle",
                      st->nreqs);
        err = KVR_ERR_FULL;
    } else {
        /* the engine has no reset: a new, empty one (no request is held, so none is lost) */
        struct kvr_engine *fresh = new_engine(st, &err);
        if (fresh) {
            struct kvr_engine_stats es;
            kvr_engine_stats(st->eng, &es);
            st->c.engine_base[0] += es.preemptions; /* the metrics' counters go on from there */
            st->c.engine_base[1] += es.cancelled;
            kvr_engine_destroy(st->eng);
            st->eng = fresh;
            st->c.clears++;
            if (st->pub) {
                kvr_se_blocks_cleared(&st->blocks);
                kvr_se_batcher_begin(&st->batcher, (double)kvr_realtime_ns() / 1e9);
                kvr_se_batcher_cleared(&st->batcher);
                kvr_se_batcher_flush(&st->batcher);
            }
        } else {
            kvr_se_refuse(why, 500, NULL, "cannot make a new engine: %s", kvr_status_str(err));
        }
    }
    pthread_mutex_unlock(&st->mu);
    return err;
}

void kvr_se_count_refusal(struct kvr_se_state *st, unsigned status)
{
    size_t i = 0;
    while (i + 1 < KVR_SE_REFUSAL_CODES && kvr_se_refusal_codes[i] != status)
        i++; /* the last slot (0) counts any other status */
    pthread_mutex_lock(&st->mu);
    st->c.refused[i]++;
    pthread_mutex_unlock(&st->mu);
}

/* --- metrics --------------------------------------------------------------------------------- */

void kvr_se_snapshot_take(struct kvr_se_state *st, struct kvr_se_snapshot *out)
{
    struct kvr_se_snapshot s = {.cfg = st->cfg};
    pthread_mutex_lock(&st->mu);
    kvr_engine_stats(st->eng, &s.engine);
    s.c = st->c;
    s.held = st->nreqs;
    s.blocks = st->blocks.n;
    s.blocks_cached = st->blocks.ncached;
    s.untracked = st->blocks.untracked;
    s.unknown_removed = st->blocks.unknown_removed;
    s.kv_batches = st->batcher.batches;
    s.kv_events = st->batcher.events;
    s.kv_failed = st->batcher.failed;
    s.kv_dropped = st->batcher.dropped;
    s.draining = st->draining;
    pthread_mutex_unlock(&st->mu);
    if ((s.has_pub = st->pub != NULL))
        kvr_kvpub_stats(st->pub, &s.pub);
    *out = s;
}
