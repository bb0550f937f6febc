/*
 * The adapter (kvworker --engine openai): a real engine (vLLM, SGLang, any OpenAI-compatible
 * server) behind a kvrouter worker. The worker's streams, cuts, repeats, rebinds, cancels,
 * deadlines and heartbeats are the simulated worker's (worker.c, presence.c); this backend
 * puts the engine under them:
 *
 * - a request goes to the engine's /v1/completions (prompt as token ids, streamed; src/openai);
 *   each chunk it streams becomes a GenerateResponse chunk (its token ids, its text made valid
 *   UTF-8 with no character split between chunks, the engine's cached_tokens from its usage);
 *   its first is the prefill-done event, every block_size tokens of prompt and output an
 *   output-block event, its end the final chunk (the engine's finish_reason) and the done event.
 *   An engine error becomes the contract's error; a cancel or a deadline closes the HTTP
 *   stream, which aborts the request in the engine.
 * - the engine's KV events (msgpack batches over ZeroMQ; src/kvevents) become KvEvents: the
 *   engine's block hash is the engine id, kvrouter's own hash is computed from the event's token
 *   ids at the block size (kvfeed.c); a gap the replay socket cannot fill, or a restarted engine,
 *   clears this worker's cache in the routers. Blocks of a LoRA adapter, with extra_keys or a
 *   cache_salt, or on another medium than the GPU are skipped (counted): kvrouter's hashes know
 *   none of these; so are a hybrid model's KV cache groups but the one followed, its
 *   full-attention group.
 * - its /metrics, read every --engine-metrics-ms on a thread of the adapter's own, give the
 *   heartbeat's waiting requests, KV usage and capacity; a block size other than the worker's
 *   refuses the start; an engine that does not answer makes the worker drain (routers send
 *   nothing new) until it does, and its cache is cleared when it is back.
 * - an engine without KV events (no --kv-events, or no batch for --kv-events-timeout-ms while
 *   requests with full blocks were served) is said in the heartbeat (no_kv_events): routers then
 *   learn this worker's cache from their own decisions, and say so in one warning.
 *
 * Threads: the client's (src/openai; its hooks), the subscriber's (src/kvevents; its hooks), the
 * poller (metrics); each takes the worker's mutex for what it changes and flushes after.
 */
#define _DEFAULT_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "kvfeed.h"
#include "kvzmq.h"
#include "log.h"
#include "openai.h"
#include "opts.h"
#include "signals.h"
#include "utf8.h"
#include "worker.h"

#define STARTUP_LOG_NS   (5 * KVR_NS_PER_S)  /* waiting for the engine: logged this often */
#define WARN_EVERY_NS    (10 * KVR_NS_PER_S) /* a repeated warning, at most this often */
#define PROBE_TIMEOUT_MS 2000                /* one metrics or health request, at most */

struct kvr_adapter {
    struct kvr_worker *w;
    struct kvr_oai *oai;
    struct kvr_kvsub *sub; /* NULL: the engine publishes no KV events */
    pthread_t poller;
    bool poller_started;
    pthread_mutex_t pm; /* the poller's stop flag */
    pthread_cond_t pcv;
    bool stop;
    /* under the worker's mutex: */
    struct kvr_buf text;         /* a chunk's text made valid */
    struct kvr_buf join;         /* a carried character's start and the next text */
    struct kvr_wk_kvfeed feed;   /* its KV events made the routers' */
    struct kvr_engine_metrics m; /* the engine's last /metrics */
    bool down;                   /* the engine does not answer */
    bool no_events;              /* it publishes no KV events (said in heartbeats) */
    uint64_t served_full_at;     /* a request that stored a full block ended, no batch since */
    uint64_t last_batch_ns;      /* when the last batch came (monotonic ns; 0: never) */
    double start_time;           /* the engine's process_start_time_seconds; 0: not known */
    uint64_t warned_other_at;    /* the last kv_batch_dropped */
    uint64_t warned_metrics_at;  /* the last engine_metrics_failed */
    uint64_t warned_rank_at;     /* the last kv_batch_other_rank */
    uint64_t failed_logged_at, failed_unlogged; /* engine failures: the last logged, since */
    struct kvr_wk_adapter_stats s;              /* */
    char url[KVR_OPT_STR_MAX]; /* the engine's URL as logs show it: no password (kvr_url_redact) */
};

/* --- the engine's streams (the client's thread) ---------------------------------------------- */

/* Text for r: the start of a character carried from its last chunk, then this chunk's, made
 * valid UTF-8 into ad->text; the start of a character cut at its end is carried to the next. */
static void clean_text(struct kvr_adapter *ad, struct kvr_wreq *r, const char *text, size_t n)
{
    ad->text.len = 0;
    const char *in = text;
    if (r->nheld) {
        if (kvr_buf_reserve(&ad->join, r->nheld + n) != KVR_OK) {
            r->nheld = 0;
            return;
        }
        memcpy(ad->join.data, r->held, r->nheld);
        memcpy(ad->join.data + r->nheld, text, n);
        in = (const char *)ad->join.data;
        n += r->nheld;
    }
    size_t kept = 0;
    if (kvr_utf8_clean(&ad->text, in, n, &kept) != KVR_OK)
        kept = 0; /* out of memory: this chunk goes without its text */
    memcpy(r->held, in + n - kept, kept);
    r->nheld = (uint8_t)kept;
}

/* The output-block events r owes: one per block its prompt and output now reach past those
 * already announced. */
static void output_blocks(struct kvr_worker *w, struct kvr_wreq *r)
{
    uint32_t bs = w->cfg->engine.block_size;
    uint64_t need = ((uint64_t)r->prompt_tokens + r->generated + bs - 1) / bs;
    while (r->blocks < need) {
        kvr__worker_output_block(w, r->key);
        r->blocks++;
    }
}

/* r failed in the engine with st: its client and the routers are told; logged at most once a
 * second (an engine that dies fails everything it holds at once), with how many went unlogged. */
static void fail(struct kvr_adapter *ad, struct kvr_wreq *r, kvr_status st, const char *message)
{
    uint64_t now = kvr_now_ns();
    if (!ad->failed_logged_at || now - ad->failed_logged_at >= KVR_NS_PER_S) {
        kvr_log(KVR_LOG_WARN, "engine_request_failed",
                "key=%016" PRIx64 " error=\"%s\" why=\"%s\" unlogged=%" PRIu64, r->key,
                kvr_status_str(st), message, ad->failed_unlogged);
        ad->failed_logged_at = now;
        ad->failed_unlogged = 0;
    } else {
        ad->failed_unlogged++;
    }
    kvr__worker_failed(ad->w, r, st, message);
}

static void on_chunk(void *ctx, uint64_t key, const struct kvr_oai_chunk *ch)
{
    struct kvr_adapter *ad = ctx;
    struct kvr_worker *w = ad->w;
    pthread_mutex_lock(&w->mu);
    struct kvr_wreq *r = kvr__worker_find(w, key);
    if (r) {
        if (ch->have_usage && ch->usage.have_cached)
            r->cached_tokens = ch->usage.cached_tokens;
        if (ch->finish_reason)
            snprintf(r->finish, sizeof r->finish, "%s", ch->finish_reason);
        if (ch->n_tokens && !r->started) { /* its first token: the prefill is done */
            r->started = true;
            kvr__worker_prefill(w, key);
            r->blocks =
                (r->prompt_tokens + w->cfg->engine.block_size - 1) / w->cfg->engine.block_size;
        }
        clean_text(ad, r, ch->text, ch->text_len);
        uint32_t n = ch->n_token_ids ? ch->n_token_ids : ch->n_tokens;
        if (ch->n_token_ids > KVR_WIRE_RESPONSE_TOKENS_MAX || ad->text.len > KVR_WIRE_TEXT_MAX) {
            /* more than a client's decoder takes in one chunk: the stream cannot go on */
            kvr_oai_cancel(ad->oai, key);
            fail(ad, r, KVR_ERR_MALFORMED, "an engine chunk over the wire's limits");
        } else if (n > r->max_tokens - r->generated) {
            /* the engine was asked for max_tokens (a count in its usage is as untrusted as any
             * other field: it bounds the blocks announced for the request) */
            kvr_oai_cancel(ad->oai, key);
            fail(ad, r, KVR_ERR_MALFORMED, "the engine generated more than max_tokens");
        } else if (n || ad->text.len) {
            const char *t = ad->text.len ? (const char *)ad->text.data : NULL;
            if (ch->n_token_ids) {
                kvr__worker_tokens(w, r, ch->token_ids, ch->n_token_ids, t, (uint32_t)ad->text.len);
            } else { /* an engine without token ids: text only, at an unmoved position */
                kvr__worker_tokens(w, r, NULL, 0, t, (uint32_t)ad->text.len);
                r->generated += n;
                ad->s.chunks_without_ids++;
            }
            output_blocks(w, r);
        }
    }
    kvr__worker_unlock(w);
}

static void on_end(void *ctx, uint64_t key, kvr_status st, const char *message)
{
    struct kvr_adapter *ad = ctx;
    struct kvr_worker *w = ad->w;
    pthread_mutex_lock(&w->mu);
    struct kvr_wreq *r = kvr__worker_find(w, key);
    if (r && r->nheld) { /* a character the stream never completed */
        r->nheld = 0;
        kvr__worker_tokens(w, r, NULL, 0, KVR_UTF8_REPLACEMENT, 3);
    }
    if (r && st == KVR_OK && !strcmp(r->finish, "abort")) { /* SGLang: it gave up on it */
        st = KVR_ERR_IO;
        message = "the engine aborted the request (finish_reason abort)";
    }
    if (r && st == KVR_OK) {
        /* it computed a full block the engine should have announced, and no batch came since
         * it arrived: evidence the engine publishes none (a prompt served from the cache stores
         * nothing new, so it is none) */
        uint32_t bs = w->cfg->engine.block_size;
        if (r->prompt_tokens / bs > r->cached_tokens / bs && ad->last_batch_ns < r->arrived &&
            !ad->served_full_at)
            ad->served_full_at = kvr_now_ns();
        kvr__worker_finished(w, key, r->finish);
    } else if (r) {
        fail(ad, r, st, message);
    }
    kvr__worker_unlock(w);
}

/* Under mu: whether a warning last said at *at (0: never) is due again at now; if so, now is
 * its time. */
static bool warn_due(uint64_t *at, uint64_t now)
{
    if (*at && now - *at < WARN_EVERY_NS)
        return false;
    *at = now;
    return true;
}

/* --- the engine's KV events (the subscriber's thread) ---------------------------------------- */

/* Under mu: whether b is another data-parallel rank's than --engine-dp-rank (a batch that says
 * none is taken): skipped, counted, said at most every WARN_EVERY_NS. */
static bool other_rank(struct kvr_adapter *ad, uint64_t seq, const struct kvr_kvev_batch *b,
                       uint64_t now)
{
    int32_t rank = ad->w->cfg->adapter.dp_rank;
    if (rank < 0 || !b->has_dp_rank || b->dp_rank == rank)
        return false;
    ad->s.kv_other_rank++;
    if (warn_due(&ad->warned_rank_at, now))
        kvr_log(KVR_LOG_WARN, "kv_batch_other_rank",
                "seq=%" PRIu64 " batch_rank=%" PRId64 " dp_rank=%d skipped=%" PRIu64
                " hint=\"vLLM publishes rank N's KV events on the --kv-events-config endpoint's "
                "port + N: give --kv-events (and --kv-replay) that port\"",
                seq, b->dp_rank, (int)rank, ad->s.kv_other_rank);
    return true;
}

static void on_batch(void *ctx, uint64_t seq, struct kvr_kvev_batch *b, bool replayed)
{
    struct kvr_adapter *ad = ctx;
    struct kvr_worker *w = ad->w;
    uint64_t now = kvr_now_ns();
    pthread_mutex_lock(&w->mu);
    if (other_rank(ad, seq, b, now)) {
        pthread_mutex_unlock(&w->mu);
        return;
    }
    ad->s.kv_batches++;
    ad->served_full_at = 0;
    ad->last_batch_ns = now;
    if (ad->no_events && ad->w->cfg->adapter.kv_events[0]) {
        ad->no_events = false;
        kvr_log(KVR_LOG_INFO, "kv_events_flowing", "seq=%" PRIu64, seq);
    }
    kvr__wk_kvfeed_batch(&ad->feed, b, now);
    kvr__worker_unlock(w);
}

static void on_reset(void *ctx, const char *why)
{
    struct kvr_adapter *ad = ctx;
    struct kvr_worker *w = ad->w;
    kvr_log(KVR_LOG_WARN, "kv_events_reset",
            "why=\"%s\" action=\"this worker's cache is cleared in the routers\"", why);
    pthread_mutex_lock(&w->mu);
    kvr__wk_kvfeed_cleared(&ad->feed);
    ad->s.kv_resets++;
    kvr__worker_unlock(w);
}

static void on_bad(void *ctx, uint64_t seq, kvr_status st)
{
    struct kvr_adapter *ad = ctx;
    uint64_t now = kvr_now_ns();
    pthread_mutex_lock(&ad->w->mu);
    bool say = warn_due(&ad->warned_other_at, now);
    pthread_mutex_unlock(&ad->w->mu);
    if (say)
        kvr_log(KVR_LOG_WARN, "kv_batch_dropped", "seq=%" PRIu64 " error=\"%s\"", seq,
                kvr_status_str(st));
}

/* --- the engine's load and health (the poller) ------------------------------------------------ */

/* Under mu: a new process start in the engine's metrics is a restart, between two polls or
 * while idle (no batch to show its sequence starting again): what it cached is gone. */
static void restarted(struct kvr_adapter *ad, const struct kvr_engine_metrics *m)
{
    if (!m->have_start_time)
        return;
    if (ad->start_time && m->start_time != ad->start_time) {
        kvr_log(KVR_LOG_WARN, "engine_restarted",
                "url=%s action=\"this worker's cache is cleared in the routers\"", ad->url);
        if (ad->sub) { /* its sequence starts again: from 0, not from the old one's; the
                          subscriber's reset clears what it learnt */
            kvr_kvsub_rewind(ad->sub);
        } else { /* what the routers learnt from decisions */
            kvr__wk_kvfeed_cleared(&ad->feed);
            ad->s.kv_resets++;
        }
    }
    ad->start_time = m->start_time;
}

/* Under mu: the engine answers its /health but its /metrics failed with st (an error status, a
 * text with no sample, too large): the load in the heartbeats is the last read, so say so. */
static void metrics_failed(struct kvr_adapter *ad, kvr_status st, uint64_t now)
{
    ad->s.metrics_failed++;
    if (!warn_due(&ad->warned_metrics_at, now))
        return;
    kvr_log(KVR_LOG_WARN, "engine_metrics_failed",
            "url=%s/metrics error=\"%s\" failed=%" PRIu64
            " action=\"heartbeats keep the last waiting requests and KV usage read\"",
            ad->url, kvr_status_str(st), ad->s.metrics_failed);
}

/* Read the engine once: its metrics, else its health. Takes the worker's mutex. */
static void probe(struct kvr_adapter *ad)
{
    struct kvr_worker *w = ad->w;
    const struct kvr_wk_adapter_config *a = &w->cfg->adapter;
    struct kvr_engine_metrics m;
    kvr_status st = kvr_oai_engine_metrics_rank(a->url, PROBE_TIMEOUT_MS, a->dp_rank, &m);
    if (st == KVR_OK && m.rank_labelled && !m.rank_seen)
        st = KVR_ERR_MALFORMED; /* its ranks changed: the last figures stand, said */
    kvr_status health = st == KVR_OK ? KVR_OK : kvr_oai_health(a->url, PROBE_TIMEOUT_MS);
    pthread_mutex_lock(&w->mu);
    uint64_t now = kvr_now_ns(); /* after served_full_at, which the client's thread sets under mu */
    if (st == KVR_OK) {
        ad->m = m;
        if (m.have_num_blocks && m.num_blocks)
            w->capacity = m.num_blocks;
        restarted(ad, &m);
    }
    bool down = health != KVR_OK;
    if (st != KVR_OK && !down)
        metrics_failed(ad, st, now);
    if (down != ad->down) {
        ad->down = down;
        if (down) {
            ad->s.engine_downs++;
            kvr_log(KVR_LOG_ERROR, "engine_down",
                    "url=%s error=\"%s\" action=\"draining: routers send nothing new here\"",
                    ad->url, kvr_status_str(health));
        } else { /* it may have restarted: what it cached is gone */
            kvr_log(KVR_LOG_INFO, "engine_up", "url=%s", ad->url);
            kvr__wk_kvfeed_cleared(&ad->feed);
        }
    }
    snprintf(w->engine_why, sizeof w->engine_why, "%s",
             down ? "the engine does not answer its /health" : "");
    bool quiet = a->kv_events[0] && !ad->no_events && ad->served_full_at &&
                 now - ad->served_full_at >= a->events_timeout_ns;
    if (quiet) {
        ad->no_events = true;
        kvr_log(KVR_LOG_WARN, "kv_events_missing",
                "endpoint=%s quiet_s=%" PRIu64
                " hint=\"the engine served requests with full blocks but published no KV "
                "event: is it started with --kv-events-config publishing on this endpoint, "
                "with prefix caching on?\" action=\"routers learn this worker's cache from "
                "their decisions until a batch comes\"",
                a->kv_events, (uint64_t)((now - ad->served_full_at) / KVR_NS_PER_S));
    }
    kvr__worker_unlock(w); /* a Cleared made above */
}

static void *poll_main(void *arg)
{
    struct kvr_adapter *ad = arg;
    uint64_t period = ad->w->cfg->adapter.metrics_ns;
    pthread_mutex_lock(&ad->pm);
    while (!ad->stop) {
        pthread_mutex_unlock(&ad->pm);
        probe(ad);
        pthread_mutex_lock(&ad->pm);
        uint64_t until = kvr_now_ns() + period;
        struct timespec ts = {(time_t)(until / KVR_NS_PER_S), (long)(until % KVR_NS_PER_S)};
        while (!ad->stop && kvr_now_ns() < until)
            pthread_cond_timedwait(&ad->pcv, &ad->pm, &ts);
    }
    pthread_mutex_unlock(&ad->pm);
    return NULL;
}

/* --- the backend ------------------------------------------------------------------------------ */

/* The request's JSON body, which for a long prompt costs milliseconds: built before the worker's
 * mutex is taken, which the heartbeat, the streams and the KV events need meanwhile. */
static void prepare(struct kvr_worker *w, const struct kvr_wire_request *q,
                    struct kvr_wk_prep *prep)
{
    prep->data = kvr_oai_body(w->ad->oai, q->tokens, q->ntokens, q->max_tokens, &prep->st);
}

static kvr_status submit(struct kvr_worker *w, struct kvr_wreq *r, const struct kvr_wire_request *q,
                         struct kvr_wk_prep *prep, uint64_t now)
{
    if (w->ad->down)
        return KVR_ERR_WORKER_LOST;
    if (prep->st != KVR_OK)
        return prep->st;
    char *body = prep->data;
    prep->data = NULL;
    return kvr_oai_submit_body(w->ad->oai, r->key, body);
}

static void cancel(struct kvr_worker *w, uint64_t key)
{
    kvr_oai_cancel(w->ad->oai, key); /* closes the stream: the engine aborts the request */
}

static uint64_t step_begin(struct kvr_worker *w, uint64_t now)
{
    return 0; /* the engine steps itself */
}

static void step_end(struct kvr_worker *w, uint64_t now)
{
}

static void load(struct kvr_worker *w, struct kvr_worker_info *info)
{
    const struct kvr_adapter *ad = w->ad;
    info->waiting = ad->m.have_waiting
                        ? (uint32_t)(ad->m.waiting < UINT32_MAX ? ad->m.waiting : UINT32_MAX)
                        : 0;
    info->kv_usage = ad->m.have_kv_usage ? ad->m.kv_usage : 0;
    info->capacity_blocks = w->capacity;
    info->approximate = ad->no_events;
    info->draining = ad->down;
}

static void destroy(struct kvr_worker *w)
{
    struct kvr_adapter *ad = w->ad;
    if (!ad)
        return;
    if (ad->poller_started) {
        pthread_mutex_lock(&ad->pm);
        ad->stop = true;
        pthread_cond_broadcast(&ad->pcv);
        pthread_mutex_unlock(&ad->pm);
        pthread_join(ad->poller, NULL);
    }
    kvr_kvsub_close(ad->sub);
    kvr_oai_destroy(ad->oai);
    pthread_cond_destroy(&ad->pcv);
    pthread_mutex_destroy(&ad->pm);
    kvr_buf_free(&ad->text);
    kvr_buf_free(&ad->join);
    kvr__wk_kvfeed_free(&ad->feed);
    free(ad);
    w->ad = NULL;
}

static const struct kvr_wk_backend adapter = {"openai",   prepare,  submit, cancel,
                                              step_begin, step_end, load,   destroy};

/* Wait for the engine to answer its /health, up to the connect timeout (0: for ever) or a
 * signal, logging every STARTUP_LOG_NS. */
static kvr_status await_engine(const struct kvr_wk_config *cfg)
{
    uint64_t t0 = kvr_now_ns(), logged = 0, limit = cfg->net.connect_timeout_ns;
    for (;;) {
        kvr_status st = kvr_oai_health(cfg->adapter.url, PROBE_TIMEOUT_MS);
        uint64_t now = kvr_now_ns();
        if (st == KVR_OK)
            return KVR_OK;
        if ((limit && now - t0 >= limit) || kvr_signal_received())
            return st;
        if (!logged || now - logged >= STARTUP_LOG_NS) {
            logged = now;
            char shown[KVR_OPT_STR_MAX];
            kvr_url_redact(cfg->adapter.url, shown, sizeof shown);
            kvr_log(KVR_LOG_INFO, "engine_waiting", "url=%s error=\"%s\"", shown,
                    kvr_status_str(st));
        }
        kvr_sleep_ns(100 * KVR_NS_PER_MS);
    }
}

/* The engine's block size against the worker's: a mismatch makes every overlap zero. */
static kvr_status check_engine(struct kvr_worker *w, const struct kvr_engine_metrics *m)
{
    uint32_t bs = w->cfg->engine.block_size;
    if (m->have_block_size && m->block_size != bs) {
        kvr_log(KVR_LOG_ERROR, "engine_block_size_mismatch",
                "engine_block_size=%u block_size=%u hint=\"give kvworker and the routers "
                "--block-size %u, or start the engine with --block-size %u\"",
                m->block_size, bs, m->block_size, bs);
        return KVR_ERR_BLOCK_SIZE;
    }
    int32_t rank = w->cfg->adapter.dp_rank;
    if (rank >= 0 && m->rank_labelled && !m->rank_seen) {
        kvr_log(KVR_LOG_ERROR, "engine_dp_rank_missing",
                "dp_rank=%d hint=\"the engine's /metrics labels no series engine=\\\"%d\\\": "
                "give --engine-dp-rank a rank below its --data-parallel-size (with one server "
                "per rank, --data-parallel-external-lb, give none)\"",
                (int)rank, (int)rank);
        return KVR_ERR_INVALID;
    }
    if (rank >= 0 && !m->rank_labelled)
        kvr_log(KVR_LOG_WARN, "engine_dp_rank_unlabelled",
                "dp_rank=%d hint=\"the engine's /metrics labels no rank (engine=\\\"N\\\"): "
                "its figures are read whole\"",
                (int)rank);
    if (!m->have_block_size)
        kvr_log(KVR_LOG_WARN, "engine_block_size_unknown",
                "block_size=%u hint=\"the engine's /metrics does not say its block size: make "
                "sure it is %u\"",
                bs, bs);
    return KVR_OK;
}

/*
 * The largest SSE event a stream may bring: vLLM echoes the whole prompt in a stream's first
 * chunk (prompt_token_ids, with return_token_ids), up to 11 bytes a token in its JSON
 * ("4294967295,") and 12 with a space after the comma, on top of a chunk's own bound. So a prompt
 * the worker takes is never failed for its echo; the parser's buffer grows only as far as each
 * event needs.
 */
static uint32_t event_bytes(const struct kvr_wk_config *cfg)
{
    uint64_t n = KVR_OAI_EVENT_BYTES + (uint64_t)cfg->max_prompt_tokens * 12;
    return n < UINT32_MAX ? (uint32_t)n : UINT32_MAX;
}

kvr_status kvr__wk_adapter_open(struct kvr_worker *w)
{
    const struct kvr_wk_config *cfg = w->cfg;
    const struct kvr_wk_adapter_config *a = &cfg->adapter;
    struct kvr_adapter *ad = calloc(1, sizeof *ad);
    if (!ad)
        return KVR_ERR_NOMEM;
    ad->w = w;
    kvr_url_redact(a->url, ad->url, sizeof ad->url);
    kvr__wk_kvfeed_init(&ad->feed, w, &ad->s);
    pthread_mutex_init(&ad->pm, NULL);
    kvr_cond_init_monotonic(&ad->pcv);
    w->ad = ad;
    w->be = &adapter;
    w->capacity = cfg->engine.num_blocks;
    kvr_status st = await_engine(cfg);
    if (st != KVR_OK) {
        kvr_log(KVR_LOG_ERROR, "engine_unreachable", "url=%s error=\"%s\"", ad->url,
                kvr_status_str(st));
        return st;
    }
    struct kvr_engine_metrics m;
    if (kvr_oai_engine_metrics_rank(a->url, PROBE_TIMEOUT_MS, a->dp_rank, &m) == KVR_OK) {
        if ((st = check_engine(w, &m)) != KVR_OK)
            return st;
        ad->m = m;
        if (m.have_num_blocks && m.num_blocks)
            w->capacity = m.num_blocks;
        ad->start_time = m.have_start_time ? m.start_time : 0;
    }
    struct kvr_oai_config oc = {.base_url = a->url,
                                .model = a->model,
                                .idle_timeout_ms = (long)(a->idle_timeout_ns / KVR_NS_PER_MS),
                                .max_streams = a->max_streams,
                                .max_event_bytes = event_bytes(cfg),
                                .return_token_ids = a->token_ids,
                                .continuous_usage = true,
                                .pin_dp_rank = a->dp_rank >= 0,
                                .dp_rank = a->dp_rank >= 0 ? (uint32_t)a->dp_rank : 0};
    struct kvr_oai_hooks oh = {on_chunk, on_end, ad};
    if (!(ad->oai = kvr_oai_create(&oc, &oh, &st)))
        return st;
    if (a->kv_events[0]) {
        struct kvr_kvsub_config sc = {.endpoint = a->kv_events,
                                      .replay_endpoint = a->kv_replay[0] ? a->kv_replay : NULL,
                                      .topic = a->kv_topic};
        struct kvr_kvsub_hooks sh = {ad, on_batch, on_reset, on_bad};
        if (!(ad->sub = kvr_kvsub_open(&sc, &sh, &st)))
            return st;
    } else {
        ad->no_events = true;
        kvr_log(KVR_LOG_WARN, "kv_events_off",
                "url=%s action=\"no --kv-events: routers learn this worker's cache from their "
                "decisions (approximate mode for it)\"",
                ad->url);
    }
    char model[256]; /* the engine's to name: a quote in it would forge log fields */
    kvr_log(KVR_LOG_INFO, "engine_ready",
            "url=%s model=\"%s\" kv_events=%s capacity_blocks=%" PRIu64 " block_size=%u dp_rank=%d",
            ad->url, kvr_log_safe(model, sizeof model, kvr_oai_model(ad->oai)),
            a->kv_events[0] ? a->kv_events : "none", w->capacity, cfg->engine.block_size,
            (int)a->dp_rank);
    if (pthread_create(&ad->poller, NULL, poll_main, ad)) /* it writes w->capacity under mu */
        return KVR_ERR_IO;
    ad->poller_started = true;
    return KVR_OK;
}

void kvr__wk_adapter_stats(struct kvr_worker *w, struct kvr_wk_adapter_stats *out)
{
    *out = w->ad->s; /* under mu */
    out->down = w->ad->down;
    out->no_events = w->ad->no_events;
    struct kvr_oai_stats os;
    kvr_oai_stats(w->ad->oai, &os);
    out->streams = os.in_flight;
    out->client_cpu_ns = os.thread_cpu_ns;
    if (w->ad->sub) {
        struct kvr_kvsub_stats ss;
        kvr_kvsub_stats(w->ad->sub, &ss);
        out->kv_gaps = ss.gaps;
        out->kv_gaps_filled = ss.gaps_filled;
        out->kv_bad = ss.bad;
        out->kv_gap_fill_ns = ss.last_gap_fill_ns;
    }
}
