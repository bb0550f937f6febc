/*
 * kvr_worker implementation: streams, their ends and repeats, requests, cancels, deadlines, the
 * engine thread, the instance. Heartbeats, the id clash and the connection's state are in
 * presence.c; the events it publishes for the routers in events.c.
 */
#define _DEFAULT_SOURCE
#include "worker.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "codec.h"
#include "kvr/hash.h"
#include "kvr/rng.h"
#include "log.h"
#include "subject.h"

#define IDLE_NS (50 * KVR_NS_PER_MS) /* the engine thread's longest wait with nothing to do */

struct kvr_wreq *kvr__worker_find(struct kvr_worker *w, uint64_t key)
{
    struct kvr_wreq *r = NULL;
    HASH_FIND(hh, w->reqs, &key, sizeof key, r);
    return r;
}

/* --- streams (under mu) ---------------------------------------------------------------------- */

/* One chunk of r: n tokens from toks (and their text) at position pos; a final one with the
 * engine's finish reason (NULL: "length"). The first and the final name the cache. */
static void chunk(struct kvr_worker *w, const struct kvr_wreq *r, const uint32_t *toks, uint32_t n,
                  const char *text, uint32_t ntext, uint32_t pos, const char *finish)
{
    struct kvr_wire_chunk c = {.request_id = r->request_id,
                               .tokens = toks,
                               .ntokens = n,
                               .position = pos,
                               .final = finish != NULL,
                               .error = KVR_OK,
                               .worker_id = w->cfg->id,
                               .cached_tokens = pos == 0 || finish ? r->cached_tokens : 0,
                               .text = text,
                               .ntext = ntext,
                               .finish_reason = finish && *finish ? finish : NULL};
    kvr__worker_emit(w, r->reply, kvr_wire_encode_chunk(&w->buf, &c));
}

/* Tokens of r from from on that fit one chunk: at most KVR_WIRE_RESPONSE_TOKENS_MAX, and their
 * text at most KVR_WIRE_TEXT_MAX bytes (at least one token). */
static uint32_t piece(const struct kvr_wreq *r, uint32_t from)
{
    uint32_t n = r->ntoks - from;
    n = n < KVR_WIRE_RESPONSE_TOKENS_MAX ? n : KVR_WIRE_RESPONSE_TOKENS_MAX;
    if (!r->text_end || !n)
        return n;
    uint32_t base = from ? r->text_end[from - 1] : 0;
    while (n > 1 && r->text_end[from + n - 1] - base > KVR_WIRE_TEXT_MAX)
        n /= 2;
    return n;
}

/* r's stream so far again, from position 0, in pieces a decoder takes; an ended stream's last
 * piece is its final again, with its code (and the service error headers). Not counted as an
 * error again: the client was told once. */
void kvr__worker_repeat(struct kvr_worker *w, const struct kvr_wreq *r)
{
    bool ended = r->ended_at != 0;
    uint32_t from = 0;
    do {
        uint32_t n = piece(r, from);
        bool final = ended && from + n == r->ntoks;
        uint32_t t0 = r->text_end && from ? r->text_end[from - 1] : 0;
        uint32_t t1 = r->text_end && n ? r->text_end[from + n - 1] : t0;
        struct kvr_wire_chunk c = {.request_id = r->request_id,
                                   .tokens = r->toks ? r->toks + from : NULL,
                                   .ntokens = n,
                                   .position = from,
                                   .final = final,
                                   .error = final ? r->outcome : KVR_OK,
                                   .worker_id = w->cfg->id,
                                   .cached_tokens = from == 0 || final ? r->cached_tokens : 0,
                                   .text = r->text ? r->text + t0 : NULL,
                                   .ntext = t1 - t0,
                                   .finish_reason = final && *r->finish ? r->finish : NULL};
        if (kvr_wire_encode_chunk(&w->buf, &c) == KVR_OK)
            kvr_outbox_add(&w->out, r->reply, w->buf.data, w->buf.len, c.error);
        else
            w->c.dropped++;
        from += n;
    } while (from < r->ntoks);
}

/* Keep r's next n tokens (and their text) for a repeat; false when memory ran short (the stream
 * can then not be repeated: ntoks stays behind produced). */
static bool keep(struct kvr_wreq *r, const uint32_t *toks, uint32_t n, const char *text,
                 uint32_t ntext)
{
    if (r->ntoks != r->produced || n > r->max_tokens - r->ntoks)
        return false;
    if (!n) /* text with no token (an engine without ids): no repeat could place it */
        return true;
    uint32_t cap = r->captoks;
    if (!KVR_GROW(r->toks, r->captoks, r->ntoks + n, 64))
        return false;
    if (ntext || r->text_end) { /* an engine that gives text: its end after every token */
        uint32_t *e = r->text_end;
        if (r->captoks != cap || !e) {
            e = realloc(e, (size_t)r->captoks * sizeof *e);
            if (!e)
                return false;
            if (!r->text_end)
                memset(e, 0, (size_t)r->ntoks * sizeof *e); /* the tokens before had none */
            r->text_end = e;
        }
        if (ntext > KVR_WK_TEXT_MAX - r->ntext ||
            !KVR_GROW(r->text, r->captext, r->ntext + ntext, 256))
            return false;
        memcpy(r->text + r->ntext, text, ntext);
        r->ntext += ntext;
        for (uint32_t i = 0; i < n; i++)
            r->text_end[r->ntoks + i] = r->ntext; /* the chunk's text, with its last token */
    }
    if (n)
        memcpy(r->toks + r->ntoks, toks, (size_t)n * sizeof *toks);
    r->ntoks += n;
    return true;
}

void kvr__worker_tokens(struct kvr_worker *w, struct kvr_wreq *r, const uint32_t *toks, uint32_t n,
                        const char *text, uint32_t ntext)
{
    keep(r, toks, n, text, ntext); /* else ntoks stays behind produced: no repeat */
    chunk(w, r, toks, n, text, ntext, r->produced, NULL);
    r->produced += n;
    r->generated += n;
}

static void free_req(struct kvr_wreq *r)
{
    free(r->reply);
    free(r->request_id);
    free(r->toks);
    free(r->text_end);
    free(r->text);
    free(r);
}

/* key ended here with outcome (silent: stopped for another worker's copy, so not ended in the
 * fleet): a forward for it in the next 60 s is a duplicate. */
static void remember(struct kvr_worker *w, uint64_t key, kvr_status outcome, bool silent,
                     uint64_t now)
{
    if (kvr_recent_put(&w->recent, key, KVR_RECENT_ENDED, outcome, silent, now) != KVR_OK)
        w->c.dropped++;
}

/* What kept stream r costs of the budget, in 4-byte units: its tokens and their text (an engine's
 * chunk may carry up to KVR_WIRE_TEXT_MAX bytes for one token). */
static uint64_t kept_weight(const struct kvr_wreq *r)
{
    return (uint64_t)r->ntoks + (r->ntext + 3u) / 4u;
}

/* Free the kept streams past their time (none while a repeat is pending) or over the budget. */
static void prune_kept(struct kvr_worker *w, uint64_t now)
{
    struct kvr_wreq *r;
    while ((r = w->kept) && (w->nkept > KVR_WK_KEPT_MAX || w->kept_tokens > KVR_WK_KEPT_TOKENS ||
                             (!w->cut_at && r->ended_at + KVR_WK_RESEND_KEPT_NS <= now))) {
        if (!r->superseded)
            HASH_DELETE(hk, w->kept_by, r);
        if (!(w->kept = r->next))
            w->kept_tail = NULL;
        w->nkept--;
        w->kept_tokens -= kept_weight(r);
        free_req(r);
    }
}

/* r ended with outcome: no longer held, remembered as ended, and its stream kept a while for a
 * repeat after a cut (unless nothing was ever due to its client). */
static void forget(struct kvr_worker *w, struct kvr_wreq *r, kvr_status outcome, bool silent,
                   uint64_t now)
{
    remember(w, r->key, outcome, silent, now);
    kvr_log(KVR_LOG_DEBUG, "request_ended", "key=%016" PRIx64 " status=%d tokens=%u silent=%s",
            r->key, (int)outcome, r->generated, silent ? "true" : "false");
    HASH_DEL(w->reqs, r);
    w->nreqs--;
    if (silent || w->clashed) {
        free_req(r);
        return;
    }
    r->ended_at = now ? now : 1;
    r->outcome = outcome;
    r->next = NULL;
    if (w->kept_tail)
        w->kept_tail->next = r;
    else
        w->kept = r;
    w->kept_tail = r;
    struct kvr_wreq *older;
    HASH_FIND(hk, w->kept_by, &r->key, sizeof r->key, older);
    if (older) { /* the key ended here before (recent lost it): the newer stream is the one kept */
        HASH_DELETE(hk, w->kept_by, older);
        older->superseded = true; /* freed in turn by prune_kept */
    }
    HASH_ADD(hk, w->kept_by, key, sizeof r->key, r);
    w->nkept++;
    w->kept_tokens += kept_weight(r);
    prune_kept(w, now);
}

void kvr__worker_finished(struct kvr_worker *w, uint64_t key, const char *finish)
{
    struct kvr_wreq *r = kvr__worker_find(w, key);
    uint32_t tokens = 0;
    if (r) {
        if (finish && finish != r->finish) /* the adapter's is r's own: no copy onto itself */
            snprintf(r->finish, sizeof r->finish, "%s", finish);
        chunk(w, r, NULL, 0, NULL, 0, r->produced, r->finish);
        tokens = r->generated;
        forget(w, r, KVR_OK, false, kvr_now_ns());
    }
    kvr__worker_done(w, key, KVR_OK, tokens);
    w->c.served++;
}

void kvr__worker_failed(struct kvr_worker *w, struct kvr_wreq *r, kvr_status st, const char *detail)
{
    if (!w->clashed)
        kvr_reply_fail(&w->generate, &w->out, r->reply, r->request_id, st,
                       &(struct kvr_reply_why){.position = r->produced,
                                               .cached_tokens = r->cached_tokens,
                                               .detail = detail && *detail ? detail : NULL});
    kvr__worker_done(w, r->key, st, r->generated);
    w->c.engine_errors++;
    forget(w, r, st, false, kvr_now_ns());
}

/* End held request r before the engine finished it, with why (cancelled, deadline): the engine
 * lets it go, the client gets its final chunk unless silent, the routers its done event. */
static void end_early(struct kvr_worker *w, struct kvr_wreq *r, kvr_status why, bool silent,
                      uint64_t now)
{
    if (w->be) /* none once closed: a cancel delivered before the link unsubscribed */
        w->be->cancel(w, r->key);
    if (!silent && !w->clashed)
        kvr_reply_fail(
            &w->generate, &w->out, r->reply, r->request_id, why,
            &(struct kvr_reply_why){.position = r->produced, .cached_tokens = r->cached_tokens});
    /* a silent stop: the request is another worker's, and has not ended */
    kvr__worker_done(w, r->key, silent ? KVR_ERR_SUPERSEDED : why, r->generated);
    if (why == KVR_ERR_DEADLINE)
        w->c.deadlines++;
    else if (why == KVR_ERR_SHUTDOWN)
        w->c.drain_cut++;
    else
        w->c.cancelled++;
    forget(w, r, why, silent, now);
}

void kvr_worker_cut_held(struct kvr_worker *w)
{
    pthread_mutex_lock(&w->mu);
    uint64_t now = kvr_now_ns();
    struct kvr_wreq *r, *tmp;
    HASH_ITER(hh, w->reqs, r, tmp)
    {
        if (w->clashed) /* the older instance serves them all */
            break;
        end_early(w, r, KVR_ERR_SHUTDOWN, false, now);
    }
    kvr__worker_unlock(w);
}

/* --- set-up ---------------------------------------------------------------------------------- */

static bool subjects(struct kvr_worker *w)
{
    const char *p = w->cfg->net.prefix, *ns = w->cfg->net.ns;
    char tail[128];
    bool ok = true;
    static const char *const ev[] = {"kv", "tokens", "done", "hb", "rebind", "batch"};
    char *dst[] = {w->subj_kv, w->subj_tokens, w->subj_done,
                   w->subj_hb, w->subj_ask,    w->subj_batch};
    for (int i = 0; i < 6; i++) {
        snprintf(tail, sizeof tail, "ev.%" PRIu64 ".%s", w->cfg->id, ev[i]);
        ok &= kvr_subject(dst[i], sizeof w->subj_kv, p, ns, tail);
    }
    static const char *const own[] = {"generate", "cancel", "hello", "rebind"};
    char *mine[] = {w->subj_gen, w->subj_cancel, w->subj_hello, w->subj_rebind};
    for (int i = 0; i < 4; i++) {
        snprintf(tail, sizeof tail, "worker.%" PRIu64 ".%s", w->cfg->id, own[i]);
        ok &= kvr_subject(mine[i], sizeof w->subj_gen, p, ns, tail);
    }
    ok &= kvr_subject(w->subj_announce, sizeof w->subj_announce, p, ns, "worker.announce");
    return ok;
}

/* This process among those that may share its id: a random instance, non-zero, and its start. */
static void identity(struct kvr_worker *w)
{
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, GRND_NONBLOCK) != (ssize_t)sizeof x) /* no entropy yet: mix */
        x = kvr_mix64(kvr_realtime_ns() ^ ((uint64_t)getpid() << 32) ^ (uintptr_t)w);
    w->instance = x ? x : 1;
    w->started_ns = kvr_realtime_ns();
}

kvr_status kvr_worker_init(struct kvr_worker *w, const struct kvr_wk_config *cfg,
                           struct kvr_sink sink)
{
    memset(w, 0, sizeof *w);
    w->cfg = cfg;
    w->sink = sink;
    identity(w);
    pthread_mutex_init(&w->mu, NULL);
    kvr_cond_init_monotonic(&w->cv); /* deadlines are monotonic */
    kvr_turns_init(&w->turns);
    kvr_reply_init(&w->generate, "generate", cfg->id);
    kvr_recent_init(&w->recent, KVR_RECENT_MAX, KVR_RECENT_TTL_NS);
    if (!subjects(w))
        return KVR_ERR_INVALID;
    return cfg->engine_kind == KVR_WK_ENGINE_OPENAI ? kvr__wk_adapter_open(w) : kvr__wk_sim_open(w);
}

void kvr_worker_free(struct kvr_worker *w)
{
    kvr_worker_close_engine(w);
    struct kvr_wreq *r, *tmp;
    HASH_ITER(hh, w->reqs, r, tmp)
    {
        HASH_DEL(w->reqs, r);
        free_req(r);
    }
    HASH_CLEAR(hk, w->kept_by);
    for (r = w->kept; r; r = tmp) {
        tmp = r->next;
        free_req(r);
    }
    kvr_wk_deadlines_free(&w->deadlines);
    kvr_recent_free(&w->recent);
    kvr_outbox_free(&w->out);
    kvr_buf_free(&w->buf);
    kvr_buf_free(&w->bbuf);
    kvr_reply_free(&w->generate);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    kvr_turns_destroy(&w->turns);
}

void kvr_worker_close_engine(struct kvr_worker *w)
{
    /* taken out under mu first: until the link unsubscribes, its deliveries read it under mu */
    pthread_mutex_lock(&w->mu);
    const struct kvr_wk_backend *be = w->be;
    w->be = NULL;
    pthread_mutex_unlock(&w->mu);
    if (be)
        be->free(w); /* its threads joined: nothing calls in any more */
}

void kvr__worker_unlock(struct kvr_worker *w)
{
    kvr__worker_beat_if_wanted(w);
    struct kvr_outbox local = {0};
    uint64_t turn = 0;
    if (w->clashed) {
        kvr_outbox_free(&w->out); /* the older instance serves everything: say nothing */
    } else if (w->out.n) {
        kvr_outbox_swap(&local, &w->out);
        turn = kvr_turns_take(&w->turns);
    }
    pthread_mutex_unlock(&w->mu);
    /* in turn: without it, a repeat for a resend (positions 0..66, made on a delivery thread)
     * could go out after the engine thread's later chunks (67, 68, ...), and a client that keeps
     * positions in order had a gap no repeat filled (seen once in CI, under ASan:
     * `contract::a_stream_that_lost_its_first_chunks_is_filled_by_a_resend`, 67 of 300 tokens) */
    if (local.n)
        kvr_turns_flush(&w->turns, turn, &local, &w->sink, NULL);
    kvr_outbox_free(&local);
}

void kvr_worker_flush(struct kvr_worker *w)
{
    pthread_mutex_lock(&w->mu);
    kvr__worker_seal(w);
    kvr__worker_unlock(w);
}

/* --- requests (under mu) --------------------------------------------------------------------- */

/* Room for r's deadline; the heap sheds its stale entries once they outnumber the live ones. */
static bool push_deadline(struct kvr_worker *w, const struct kvr_wreq *r)
{
    struct kvr_wk_deadlines *h = &w->deadlines;
    if (h->n > 2 * w->nreqs + 1024) {
        h->n = 0;
        for (struct kvr_wreq *q = w->reqs; q; q = q->hh.next)
            if (q->deadline)
                kvr_wk_deadlines_push(h, (struct kvr_wk_deadline){q->deadline, q->key});
    }
    return kvr_wk_deadlines_push(h, (struct kvr_wk_deadline){r->deadline, r->key});
}

static struct kvr_wreq *new_req(const struct kvr_wire_request *q, uint64_t key, const char *reply,
                                uint64_t now)
{
    struct kvr_wreq *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->key = key;
    r->reply = strdup(reply);
    r->request_id = strdup(q->request_id);
    r->max_tokens = q->max_tokens;
    r->prompt_tokens = q->ntokens;
    r->arrived = now;
    r->deadline = q->deadline_ms ? now + q->deadline_ms * KVR_NS_PER_MS : 0;
    if (!r->reply || !r->request_id) {
        free_req(r);
        return NULL;
    }
    return r;
}

/* Hand q (key, answered at reply, arrived at now, prepared into prep) to the engine. */
static kvr_status submit(struct kvr_worker *w, const struct kvr_wire_request *q, uint64_t key,
                         const char *reply, struct kvr_wk_prep *prep, uint64_t now)
{
    if (w->draining || !w->be)
        return KVR_ERR_SHUTDOWN;
    if (w->nreqs >= KVR_WIRE_INFLIGHT_MAX)
        return KVR_ERR_OVERLOADED; /* a heartbeat lists every request held: no more than fit */
    struct kvr_wreq *r = new_req(q, key, reply, now);
    kvr_status st = r ? KVR_OK : KVR_ERR_NOMEM;
    if (st == KVR_OK && r->deadline && !push_deadline(w, r))
        st = KVR_ERR_NOMEM;
    if (st == KVR_OK)
        st = w->be->submit(w, r, q, prep, now);
    if (st == KVR_OK) {
        HASH_ADD(hh, w->reqs, key, sizeof r->key, r);
        w->nreqs++;
        pthread_cond_signal(&w->cv);
        kvr_log(KVR_LOG_DEBUG, "request_taken", "key=%016" PRIx64, key);
    } else if (r) {
        free_req(r);
    }
    return st;
}

/* Null mode: the whole answer at once, and the done event the router waits for. */
static void answer_now(struct kvr_worker *w, const struct kvr_wire_request *q, uint64_t key,
                       const char *reply, uint64_t now)
{
    uint32_t tok = (uint32_t)(key % 32000);
    struct kvr_wreq r = {.key = key, .reply = (char *)reply, .request_id = q->request_id};
    chunk(w, &r, &tok, 1, NULL, 0, 0, "");
    kvr__worker_done(w, key, KVR_OK, 1);
    remember(w, key, KVR_OK, false, now);
}

/* A forward whose cancel came first: ended at once (the client told unless silent), and the done
 * event frees the routers' booking. */
static void end_unborn(struct kvr_worker *w, const struct kvr_wire_request *q, uint64_t key,
                       const char *reply, const struct kvr_recent_item *cancel, uint64_t now)
{
    kvr_status why = cancel->outcome;
    if (!cancel->silent)
        kvr_reply_fail(&w->generate, &w->out, reply, q->request_id, why, NULL);
    kvr__worker_done(w, key, cancel->silent ? KVR_ERR_SUPERSEDED : why, 0);
    if (why == KVR_ERR_DEADLINE)
        w->c.deadlines++;
    else
        w->c.cancelled++;
    remember(w, key, why, cancel->silent, now); /* replaces the cancel: a resend is a duplicate */
}

/* A forward for a key held or ended here: dropped, counted, never answered (an answer would be
 * a second final chunk on the client's stream). */
static void absorb(struct kvr_worker *w, uint64_t key, const char *why)
{
    w->c.duplicates++;
    kvr_log(KVR_LOG_DEBUG, "duplicate_absorbed", "key=%016" PRIx64 " was=%s", key, why);
}

/* A forward for key, neither held nor ended here (copy_of_known). */
static kvr_status take(struct kvr_worker *w, const struct kvr_wire_request *q, uint64_t key,
                       const char *reply, struct kvr_wk_prep *prep, uint64_t now)
{
    const struct kvr_recent_item *it = kvr_recent_find(&w->recent, key, now);
    if (it) { /* a cancel came first */
        end_unborn(w, q, key, reply, it, now);
        return KVR_OK;
    }
    if (w->cfg->null_mode) {
        answer_now(w, q, key, reply, now);
        return KVR_OK;
    }
    return submit(w, q, key, reply, prep, now);
}

/* Whether q can ever finish here: its prompt and output in the KV pool at once (else the engine
 * would block everything behind it, or preempt it forever); the simulated engine admits a chunk
 * only while its free-block watermark stays free, again after a preemption or with the prompt
 * cached, so there the pool less the watermark. KVR_ERR_FULL with the figures. */
static kvr_status fits_engine(const struct kvr_worker *w, struct kvr_wire_request *q)
{
    uint32_t bs = w->cfg->engine.block_size;
    uint64_t need = ((uint64_t)q->ntokens + q->max_tokens + bs - 1) / bs, limit = w->capacity;
    uint64_t mark = w->eng ? kvr_engine_watermark_blocks(&w->cfg->engine) : 0;
    limit = limit > mark ? limit - mark : 0;
    if (!w->capacity || need <= limit) /* 0: an engine that did not say */
        return KVR_OK;
    q->got = need;
    q->limit = limit;
    return KVR_ERR_FULL;
}

/* Under mu: a forward refused with st: its client is told (with the figures of a limit passed),
 * and the routers by a done event (when it names a request), so its booking goes at once; the
 * key is remembered as ended (a copy of the forward is absorbed, heartbeats list it as ended). */
static void refuse(struct kvr_worker *w, const struct kvr_wire_request *q, uint64_t key,
                   const char *reply, kvr_status st, uint64_t now)
{
    kvr_reply_refuse(&w->generate, &w->out, reply, q, st);
    if (key) {
        kvr__worker_done(w, key, st, 0);
        remember(w, key, st, false, now);
    }
}

/* Under mu: whether key is held or ended here: a forward naming it is a copy to absorb, whatever
 * it says (one without a reply, or refused, must not end the stream it copies). */
static bool copy_of_known(struct kvr_worker *w, uint64_t key, uint64_t now)
{
    if (!key)
        return false;
    if (kvr__worker_find(w, key)) {
        absorb(w, key, "held");
        return true;
    }
    const struct kvr_recent_item *it = kvr_recent_find(&w->recent, key, now);
    if (it && it->kind == KVR_RECENT_ENDED) {
        absorb(w, key, it->outcome == KVR_OK ? "finished" : kvr_status_str(it->outcome));
        return true;
    }
    return false;
}

void kvr_worker_on_generate(struct kvr_worker *w, const char *reply, const void *data, size_t len)
{
    atomic_fetch_add(&w->taking, 1); /* in hand, not listed yet: heartbeats count it waiting */
    uint64_t t0 = kvr_now_ns();
    struct kvr_wire_limits lim = {w->cfg->max_prompt_tokens, w->cfg->max_output_tokens};
    struct kvr_wire_request q;
    uint64_t key = 0;
    uint32_t overlap = 0;
    kvr_status st = kvr_wire_decode_worker_generate(data, len, &lim, &q, &key, &overlap);
    if (!kvr_reply_usable(reply, w->cfg->net.prefix))
        reply = NULL; /* never answered: the fleet's own subjects, or none */
    struct kvr_wk_prep prep = {NULL, KVR_OK};
    if (st == KVR_OK && reply && !w->cfg->null_mode && w->be->prepare)
        w->be->prepare(w, &q, &prep); /* outside mu: heartbeats and streams go on meanwhile */
    pthread_mutex_lock(&w->mu);
    if (!w->clashed) { /* a yielding instance takes nothing: the older one has it */
        if (!copy_of_known(w, key, t0)) {
            if (st == KVR_OK && !reply)
                st = KVR_ERR_NO_REPLY;
            if (st == KVR_OK)
                st = fits_engine(w, &q);
            if (st == KVR_OK)
                st = take(w, &q, key, reply, &prep, t0);
            if (st != KVR_OK)
                refuse(w, &q, key, reply, st, t0);
        }
        kvr_reply_count(&w->generate, kvr_now_ns() - t0);
    }
    atomic_fetch_sub(&w->taking, 1); /* held (listed) or answered: the beat at unlock says so */
    kvr__worker_unlock(w);
    free(prep.data);
    kvr_wire_request_free(&q);
}

/* A router's cancel: end the request if held, else remember it for a forward still to come. */
static void cancel(struct kvr_worker *w, const struct kvr_wire_worker_cancel *c, uint64_t now)
{
    struct kvr_wreq *r = kvr__worker_find(w, c->key);
    if (r) {
        end_early(w, r, c->reason, c->silent, now);
        return;
    }
    const struct kvr_recent_item *it = kvr_recent_find(&w->recent, c->key, now);
    if (it && it->kind == KVR_RECENT_ENDED) {
        w->c.late_cancels++; /* its stream has ended: nothing more to say */
        return;
    }
    if (kvr_recent_put(&w->recent, c->key, KVR_RECENT_CANCELLED, c->reason, c->silent, now) ==
        KVR_OK)
        w->c.early_cancels++;
    else
        w->c.dropped++;
}

void kvr_worker_on_cancel(struct kvr_worker *w, const void *data, size_t len)
{
    struct kvr_wire_worker_cancel c;
    kvr_status st = kvr_wire_decode_worker_cancel(data, len, &c);
    uint64_t now = kvr_now_ns();
    pthread_mutex_lock(&w->mu);
    uint64_t left;
    if (st != KVR_OK) {
        w->c.bad_cancels++;
        if (kvr_log_gate_pass(&w->cancel_log, &left)) /* whoever may publish there: a flood */
            kvr_log(KVR_LOG_WARN, "cancel_dropped", "error=\"%s\" suppressed=%" PRIu64,
                    kvr_status_str(st), left);
    } else if (!w->clashed) {
        cancel(w, &c, now);
    }
    kvr__worker_unlock(w);
}

/* --- deadlines and the engine thread (under mu) ---------------------------------------------- */

/* The earliest deadline of a held request (stale entries dropped on the way), 0 when none. */
static uint64_t next_deadline(struct kvr_worker *w)
{
    struct kvr_wk_deadlines *h = &w->deadlines;
    while (h->n) {
        struct kvr_wreq *r = kvr__worker_find(w, h->v[0].key);
        if (r && r->deadline == h->v[0].at)
            return h->v[0].at;
        kvr_wk_deadlines_pop(h);
    }
    return 0;
}

/* End every held request whose deadline has passed at now. */
static void expire(struct kvr_worker *w, uint64_t now)
{
    uint64_t at;
    while (!w->clashed && (at = next_deadline(w)) && at <= now) {
        struct kvr_wk_deadline d = kvr_wk_deadlines_pop(&w->deadlines);
        end_early(w, kvr__worker_find(w, d.key), KVR_ERR_DEADLINE, false, now);
    }
}

bool kvr__worker_repeats(const struct kvr_wreq *r, uint64_t cut_at)
{
    uint64_t from = cut_at > KVR_WK_KEPT_NS ? cut_at - KVR_WK_KEPT_NS : 0;
    if (!kvr__worker_whole(r) || r->superseded)
        return false; /* short of its tokens (memory ran out, or an engine that gave no ids), or
                         a newer stream of its key */
    return r->ended_at ? r->ended_at >= from : r->ntoks > 0;
}

/* The repeat after a cut, once due at now: every stream open at the cut or since, and those that
 * ended in the KVR_WK_KEPT_NS before it (a final lost in the cut is lost with them). */
static void repeat_due(struct kvr_worker *w, uint64_t now)
{
    if (!w->repeat_at || now < w->repeat_at || w->cut || w->clashed)
        return;
    uint32_t n = 0;
    for (struct kvr_wreq *r = w->kept; r; r = r->next) {
        if (kvr__worker_repeats(r, w->cut_at)) {
            kvr__worker_repeat(w, r);
            n++;
        }
    }
    for (struct kvr_wreq *r = w->reqs; r; r = r->hh.next) {
        if (kvr__worker_repeats(r, w->cut_at)) {
            kvr__worker_repeat(w, r);
            n++;
        }
    }
    w->c.repeats += n;
    kvr_log(KVR_LOG_INFO, "streams_repeated", "streams=%u cut_ms_ago=%" PRIu64, n,
            (uint64_t)((now - w->cut_at) / KVR_NS_PER_MS));
    w->cut_at = w->repeat_at = 0;
}

/* Whatever is due at now: deadlines, the repeat, what has been kept long enough. */
static void housekeep(struct kvr_worker *w, uint64_t now)
{
    expire(w, now);
    if (w->ask_at && now >= w->ask_at && !w->cut) { /* again, for routers that were cut too */
        kvr__worker_ask_rebind(w);
        w->ask_at = 0;
    }
    repeat_due(w, now);
    prune_kept(w, now);
    kvr_recent_expire(&w->recent, now);
    if (w->nbatch && now >= w->batch_due)
        kvr__worker_seal(w);
}

/* The earlier of two times, 0 standing for none. */
static uint64_t earlier(uint64_t a, uint64_t b)
{
    return a && b ? (a < b ? a : b) : a | b;
}

/* When something is next due (a deadline, the rebind ask, the repeat, the held events), 0 when
 * nothing is. */
static uint64_t next_due(struct kvr_worker *w)
{
    uint64_t next = earlier(next_deadline(w), w->cut ? 0 : w->repeat_at);
    next = earlier(next, w->cut ? 0 : w->ask_at);
    return earlier(next, w->nbatch ? w->batch_due : 0);
}

uint64_t kvr_worker_tick(struct kvr_worker *w, uint64_t now)
{
    pthread_mutex_lock(&w->mu);
    housekeep(w, now);
    uint64_t next = next_due(w);
    kvr__worker_unlock(w);
    return next;
}

/* Wait on cv until the monotonic time until (ns), a signal or a spurious wake-up. */
static void wait_until(struct kvr_worker *w, uint64_t until)
{
    struct timespec ts = {(time_t)(until / KVR_NS_PER_S), (long)(until % KVR_NS_PER_S)};
    pthread_cond_timedwait(&w->cv, &w->mu, &ts);
}

/* Publish what the outbox holds (and a heartbeat asked for), mu released meanwhile. */
static void flush_locked(struct kvr_worker *w)
{
    if (!w->out.n && !atomic_load_explicit(&w->beat_wanted, memory_order_relaxed))
        return;
    kvr__worker_unlock(w);
    pthread_mutex_lock(&w->mu);
}

/* One turn of the engine loop at now: readiness sees the thread alive. */
static void stamp(struct kvr_worker *w, uint64_t now)
{
    atomic_store_explicit(&w->engine_ns, now, memory_order_relaxed);
}

/* Wait until the earliest of until, what comes due next, and KVR_WK_ENGINE_WAKE_NS from now. */
static void wait_turn(struct kvr_worker *w, uint64_t now, uint64_t until)
{
    uint64_t next = next_due(w), wake = now + KVR_WK_ENGINE_WAKE_NS;
    until = next && next < until ? next : until;
    wait_until(w, until < wake ? until : wake);
}

/* Let the step in progress run until end, doing what comes due meanwhile (a deadline ends a
 * request at once, not at the step's end). */
static void step_wait(struct kvr_worker *w, uint64_t end)
{
    for (;;) {
        housekeep(w, kvr_now_ns());
        flush_locked(w);
        uint64_t now = kvr_now_ns();
        stamp(w, now);
        if (now >= end || w->stopping)
            return;
        wait_turn(w, now, end);
    }
}

void kvr_worker_run_engine(struct kvr_worker *w)
{
    pthread_mutex_lock(&w->mu);
    while (!w->stopping) {
        housekeep(w, kvr_now_ns());
        flush_locked(w);
        if (w->stopping)
            break;
        uint64_t now = kvr_now_ns();
        stamp(w, now);
        uint64_t dur = w->be->step_begin(w, now);
        if (!dur) { /* nothing to do: until work comes, something is due, or IDLE_NS */
            wait_turn(w, now, now + IDLE_NS);
            continue;
        }
        step_wait(w, now + dur);
        w->be->step_end(w, kvr_now_ns());
        flush_locked(w);
    }
    pthread_mutex_unlock(&w->mu);
}
