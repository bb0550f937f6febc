/*
 * The streaming client (openai.h). Ownership of a stream: under the lock, the key table and the
 * slot array hold every live stream; a stream not yet started sits in the queue and the caller
 * who cancels it frees it; once the thread has taken it, only the thread frees it: after its
 * end hook (no one else can find it then: its key is gone), or from the cancel list. The
 * thread's own fields (easy handle, parser, running list) are touched by the thread alone.
 * Hooks are called from curl's write callback or the completion loop, never under the lock,
 * and only after checking under the lock that the stream was not cancelled.
 */
#include "openai.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <time.h>

#include "chunk.h"
#include "clock.h"
#include "http.h"
#include "log.h"
#include "map.h"
#include "sse.h"

#define ERRBODY_MAX  4096                   /* bytes of an HTTP error body kept for its message */
#define LINGER_NS    (1000 * KVR_NS_PER_MS) /* after [DONE], the wait for the clean end */
#define SWEEP_NS     (10 * KVR_NS_PER_MS)   /* timeouts are checked this often, at most */
#define POLL_BUSY_MS 50   /* curl_multi_poll's wait when timeouts are to be checked */
#define POLL_IDLE_MS 1000 /* and when not (curl_multi_wakeup ends it early) */

/* Which of the stats' failure counters an error ends up in. */
enum fail_kind { FAIL_NONE, FAIL_HTTP, FAIL_LOST, FAIL_TIMEOUT, FAIL_STREAM, FAIL_MALFORMED };

struct stream {
    struct kvr_oai *c;
    uint64_t key;
    uint32_t slot; /* index in c->slots */
    /* under c->lock */
    bool cancelled;               /* kvr_oai_cancel took its key: no hook, freed by others */
    bool started;                 /* the thread took it from the queue */
    struct stream *qprev, *qnext; /* the queue (not started), or the cancel list (qnext) */
    /* the thread's own */
    struct stream *tnext;         /* the queue as the thread took it (qnext may change) */
    struct stream *rprev, *rnext; /* the running list */
    bool running;                 /* in the running list */
    CURL *easy;                   /* owned, from start */
    bool added;                   /* easy is in the multi handle */
    char *body;                   /* the request's JSON, owned (json_dumps) */
    struct kvr_sse sse;
    struct kvr_oai_scratch scratch;
    long http;              /* the HTTP status once the body started */
    bool checked;           /* status and content type were judged */
    bool ended;             /* its end hook was called */
    bool stop;              /* cancelled, seen by a delivery: abort the transfer */
    bool finish_seen;       /* a chunk had a finish_reason */
    bool done_seen;         /* data: [DONE] */
    bool has_outcome;       /* the thread ended it itself: outcome and why say how */
    bool bad_chunk;         /* the outcome is an event that failed to parse */
    enum fail_kind kind;    /* with has_outcome */
    kvr_status outcome;     /* with has_outcome */
    uint32_t counted;       /* tokens its chunks stood for so far (n_tokens summed) */
    uint64_t last_rx_ns;    /* when a byte last came (kvr_now_ns) */
    uint64_t linger_ns;     /* after [DONE]: when to stop waiting for the end */
    struct kvr_buf errbody; /* an HTTP error's body, at most ERRBODY_MAX bytes */
    char why[KVR_OAI_MESSAGE_MAX];
    char errbuf[CURL_ERROR_SIZE];
};

struct kvr_oai {
    struct kvr_oai_hooks hooks;
    char url[KVR_OAI_URL_MAX];     /* base URL + "/v1/completions" */
    char model[KVR_OAI_MODEL_MAX]; /* the "model" field */
    long connect_ms, idle_ms, total_ms;
    uint32_t max_streams; /* in flight, at most */
    uint32_t max_event;   /* bytes in one SSE event */
    bool return_ids;      /* send return_token_ids */
    bool continuous;      /* send continuous_usage_stats */
    CURLM *multi;         /* the thread's; curl_multi_wakeup from any thread */
    struct curl_slist *headers;
    pthread_t thread;
    clockid_t cpu_clock; /* the thread's CPU clock */
    bool have_cpu_clock;
    pthread_mutex_t lock; /* guards what follows */
    struct kvr_map keys;  /* key in flight -> slot */
    struct stream **slots;
    uint32_t n_slots;     /* 2 * max_streams: in flight, and cancelled or lingering ones */
    uint32_t *free_slots; /* a stack of n_free free slot indices */
    uint32_t n_free;
    uint32_t in_flight;
    struct stream *q_head, *q_tail; /* submitted, not started */
    struct stream *cancels;         /* cancelled after the thread took them */
    bool stopping;
    struct kvr_oai_stats stats;
    /* the thread's own */
    struct stream *running; /* started, not yet removed */
    uint64_t rx_pending;    /* bytes received, not yet counted in stats */
    uint64_t swept_ns;      /* the last timeout sweep */
};

/* ---- streams ---- */

static void stream_free(struct stream *s)
{
    if (s->easy)
        curl_easy_cleanup(s->easy);
    free(s->body);
    kvr_sse_free(&s->sse);
    kvr_oai_scratch_free(&s->scratch);
    kvr_buf_free(&s->errbody);
    free(s);
}

/* Give s's slot back (under the lock). */
static void slot_release(struct kvr_oai *c, struct stream *s)
{
    c->slots[s->slot] = NULL;
    c->free_slots[c->n_free++] = s->slot;
}

/* The thread frees a stream it took: out of curl, out of the running list, slot back. */
static void stream_retire(struct kvr_oai *c, struct stream *s)
{
    if (s->added)
        curl_multi_remove_handle(c->multi, s->easy);
    s->added = false;
    if (s->running) {
        if (s->rprev)
            s->rprev->rnext = s->rnext;
        else
            c->running = s->rnext;
        if (s->rnext)
            s->rnext->rprev = s->rprev;
        s->running = false;
    }
    pthread_mutex_lock(&c->lock);
    slot_release(c, s);
    pthread_mutex_unlock(&c->lock);
    stream_free(s);
}

/* Stop a transfer without freeing (a cancelled stream waits for the cancel list). */
static void stream_detach(struct kvr_oai *c, struct stream *s)
{
    if (s->added)
        curl_multi_remove_handle(c->multi, s->easy);
    s->added = false;
}

static void count_failure(struct kvr_oai_stats *st, enum fail_kind kind)
{
    st->failed++;
    switch (kind) {
    case FAIL_HTTP:
        st->failed_http++;
        break;
    case FAIL_LOST:
        st->failed_lost++;
        break;
    case FAIL_TIMEOUT:
        st->failed_timeout++;
        break;
    case FAIL_STREAM:
        st->failed_stream++;
        break;
    case FAIL_MALFORMED:
        st->failed_malformed++;
        break;
    default:
        st->failed_other++;
        break;
    }
}

/*
 * Call the end hook of s unless it was cancelled: true when it was called (s is then the
 * thread's alone: its key is gone), false when cancelled (the cancel list frees it).
 */
static bool stream_end(struct kvr_oai *c, struct stream *s, kvr_status st, enum fail_kind kind,
                       const char *why)
{
    pthread_mutex_lock(&c->lock);
    if (s->cancelled) {
        pthread_mutex_unlock(&c->lock);
        return false;
    }
    kvr_map_del(&c->keys, s->key);
    c->in_flight--;
    c->stats.bytes += c->rx_pending;
    c->rx_pending = 0;
    if (st == KVR_OK)
        c->stats.finished++;
    else
        count_failure(&c->stats, kind);
    if (s->bad_chunk)
        c->stats.bad_chunks++;
    s->ended = true;
    pthread_mutex_unlock(&c->lock);
    c->hooks.end(c->hooks.ctx, s->key, st, why ? why : "");
    return true;
}

/* The thread aborts s itself: the status is delivered when curl reports the transfer done. */
static void stream_fail(struct stream *s, kvr_status st, enum fail_kind kind, const char *why)
{
    if (s->has_outcome)
        return;
    s->has_outcome = true;
    s->outcome = st;
    s->kind = kind;
    snprintf(s->why, sizeof s->why, "%s", why);
}

/* ---- the body of a stream ---- */

/* Tokens a chunk stands for (openai.h, struct kvr_oai_chunk): a usage counts what the stream's
 * earlier chunks did not, so an engine's usage after chunks counted by their text adds no token
 * twice. */
static uint32_t chunk_tokens(struct stream *s, const struct kvr_oai_chunk *ch)
{
    uint32_t n = 0;
    if (ch->token_ids)
        n = ch->n_token_ids;
    else if (s->scratch.has_choice && ch->have_usage)
        n = ch->usage.completion_tokens > s->counted ? ch->usage.completion_tokens - s->counted : 0;
    else if (s->scratch.has_choice)
        n = ch->text_len > 0;
    s->counted = n > UINT32_MAX - s->counted ? UINT32_MAX : s->counted + n;
    return n;
}

/* One SSE event of s: [DONE], or a chunk for the hook. false stops the parser. */
static bool on_event(void *ud, const char *data, size_t len)
{
    struct stream *s = ud;
    struct kvr_oai *c = s->c;
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        s->done_seen = true;
        return false;
    }
    if (len == 0)
        return true; /* an empty event carries nothing */
    struct kvr_oai_chunk ch;
    char why[KVR_OAI_MESSAGE_MAX];
    kvr_status st = kvr_oai_chunk_parse(&s->scratch, data, len, &ch, why, sizeof why);
    if (st == KVR_ERR_IO && s->finish_seen) { /* an engine's error after its finish (SGLang's */
        s->done_seen = true;                  /* usage chunk failing): every token came */
        return false;
    }
    if (st != KVR_OK) {
        s->bad_chunk = st == KVR_ERR_MALFORMED;
        stream_fail(s, st, st == KVR_ERR_IO ? FAIL_STREAM : FAIL_MALFORMED, why);
        return false;
    }
    ch.n_tokens = chunk_tokens(s, &ch);
    if (ch.finish_reason)
        s->finish_seen = true;
    pthread_mutex_lock(&c->lock);
    if (s->cancelled) {
        pthread_mutex_unlock(&c->lock);
        s->stop = true;
        return false;
    }
    c->stats.chunks++;
    c->stats.tokens += ch.n_tokens;
    c->stats.bytes += c->rx_pending;
    c->rx_pending = 0;
    pthread_mutex_unlock(&c->lock);
    c->hooks.chunk(c->hooks.ctx, s->key, &ch);
    kvr_oai_scratch_release(&s->scratch); /* a stream waiting keeps no parsed chunk */
    return true;
}

/* Judge the status and content type once the body starts. */
static void check_headers(struct stream *s)
{
    s->checked = true;
    curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &s->http);
    if (s->http >= 400)
        return;
    if (s->http < 200 || s->http > 299) {
        char why[64];
        snprintf(why, sizeof why, "unexpected http status %ld", s->http);
        stream_fail(s, KVR_ERR_IO, FAIL_HTTP, why);
        return;
    }
    const char *type = NULL;
    curl_easy_getinfo(s->easy, CURLINFO_CONTENT_TYPE, &type);
    if (type && strncasecmp(type, "text/event-stream", 17) != 0)
        stream_fail(s, KVR_ERR_MALFORMED, FAIL_MALFORMED, "the answer is not an event stream");
}

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *ud)
{
    struct stream *s = ud;
    size_t n = size * nmemb;
    s->last_rx_ns = kvr_now_ns();
    s->c->rx_pending += n;
    if (s->ended)
        return n; /* after [DONE]: wait for the clean end, keep the connection */
    if (!s->checked)
        check_headers(s);
    if (s->has_outcome || s->stop)
        return CURL_WRITEFUNC_ERROR;
    if (s->http >= 400) {
        size_t room = ERRBODY_MAX - s->errbody.len;
        size_t k = n < room ? n : room;
        if (kvr_buf_reserve(&s->errbody, s->errbody.len + k + 1) == KVR_OK) {
            memcpy(s->errbody.data + s->errbody.len, ptr, k);
            s->errbody.len += k;
        }
        return k < n ? CURL_WRITEFUNC_ERROR : n; /* enough for a message */
    }
    kvr_status st = kvr_sse_feed(&s->sse, ptr, n, on_event, s);
    if (st == KVR_ERR_TOO_LARGE) {
        char why[80];
        snprintf(why, sizeof why, "an event over %u bytes", s->c->max_event);
        s->bad_chunk = true;
        stream_fail(s, st, FAIL_MALFORMED, why);
    } else if (st != KVR_OK) {
        stream_fail(s, st, FAIL_NONE, "out of memory");
    }
    if (s->has_outcome || s->stop)
        return CURL_WRITEFUNC_ERROR;
    if (s->done_seen) {
        if (!stream_end(s->c, s, KVR_OK, FAIL_NONE, ""))
            return CURL_WRITEFUNC_ERROR; /* cancelled meanwhile */
        s->linger_ns = s->last_rx_ns + LINGER_NS;
    }
    return n;
}

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *ud)
{
    struct stream *s = ud;
    s->last_rx_ns = kvr_now_ns();
    return size * nmemb;
}

/* The final status of a transfer that curl reports done (rc), into *kind and why. */
static kvr_status transfer_status(struct stream *s, CURLcode rc, enum fail_kind *kind, char *why,
                                  size_t whylen)
{
    if (s->has_outcome) {
        *kind = s->kind;
        snprintf(why, whylen, "%s", s->why);
        return s->outcome;
    }
    if (!s->checked) { /* no body came: the status alone, if any */
        curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &s->http);
        if (s->http > 0 && s->http < 400 && rc == CURLE_OK)
            check_headers(s);
    }
    if (s->has_outcome) {
        *kind = s->kind;
        snprintf(why, whylen, "%s", s->why);
        return s->outcome;
    }
    if (s->http >= 400) {
        char msg[KVR_OAI_MESSAGE_MAX - 16];
        kvr_oai_error_message(s->errbody.len ? (const char *)s->errbody.data : "", s->errbody.len,
                              msg, sizeof msg);
        snprintf(why, whylen, "http %ld: %s", s->http, msg);
        *kind = FAIL_HTTP;
        return kvr_oai_http_status(s->http, msg);
    }
    kvr_status st = kvr_oai_curl_status(rc);
    if (s->finish_seen && (st == KVR_OK || st == KVR_ERR_WORKER_LOST || st == KVR_ERR_TIMEOUT))
        return KVR_OK; /* every token came; only the usage chunk or [DONE] is missing */
    if (st == KVR_OK) {
        *kind = FAIL_LOST;
        snprintf(why, whylen, "the stream ended before [DONE]");
        return KVR_ERR_WORKER_LOST;
    }
    *kind = st == KVR_ERR_WORKER_LOST ? FAIL_LOST
            : st == KVR_ERR_TIMEOUT   ? FAIL_TIMEOUT
                                      : FAIL_NONE;
    char safe[KVR_OAI_MESSAGE_MAX - 16];
    kvr_log_safe(safe, sizeof safe, s->errbuf[0] ? s->errbuf : curl_easy_strerror(rc));
    snprintf(why, whylen, "%s", safe);
    return st;
}

/* curl says the transfer of s is over. */
static void stream_done(struct kvr_oai *c, struct stream *s, CURLcode rc)
{
    stream_detach(c, s);
    if (s->ended) {
        stream_retire(c, s);
        return;
    }
    enum fail_kind kind = FAIL_NONE;
    char why[KVR_OAI_MESSAGE_MAX];
    kvr_status st = transfer_status(s, rc, &kind, why, sizeof why);
    if (stream_end(c, s, st, kind, st == KVR_OK ? "" : why))
        stream_retire(c, s);
}

/* ---- the thread ---- */

/* Start the transfer of s; on failure its end hook says why. */
static void stream_start(struct kvr_oai *c, struct stream *s)
{
    pthread_mutex_lock(&c->lock);
    bool cancelled = s->cancelled; /* since the thread took it: on the cancel list */
    if (!cancelled)
        c->stats.started++;
    pthread_mutex_unlock(&c->lock);
    if (cancelled)
        return; /* no request for the engine to abort */
    s->last_rx_ns = kvr_now_ns();
    s->running = true;
    s->rprev = NULL;
    s->rnext = c->running;
    if (c->running)
        c->running->rprev = s;
    c->running = s;
    kvr_sse_init(&s->sse, c->max_event);
    CURL *e = curl_easy_init();
    s->easy = e;
    if (!e) {
        if (stream_end(c, s, KVR_ERR_NOMEM, FAIL_NONE, "out of memory"))
            stream_retire(c, s);
        return;
    }
    kvr_oai_curl_defaults(e, c->connect_ms, c->total_ms);
    curl_easy_setopt(e, CURLOPT_URL, c->url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, c->headers);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, s->body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(s->body));
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, s);
    curl_easy_setopt(e, CURLOPT_PRIVATE, s);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, s->errbuf);
    if (curl_multi_add_handle(c->multi, e) != CURLM_OK) {
        if (stream_end(c, s, KVR_ERR_IO, FAIL_NONE, "curl_multi_add_handle failed"))
            stream_retire(c, s);
        return;
    }
    s->added = true;
}

/* Idle timeouts, and streams past [DONE] whose connection never ended. */
static void sweep(struct kvr_oai *c, uint64_t now)
{
    c->swept_ns = now;
    struct stream *next;
    for (struct stream *s = c->running; s; s = next) {
        next = s->rnext;
        if (s->ended) {
            if (now > s->linger_ns)
                stream_retire(c, s);
        } else if (c->idle_ms > 0 && now - s->last_rx_ns > (uint64_t)c->idle_ms * KVR_NS_PER_MS) {
            char why[64]; /* silent after its finish: every token came, as in transfer_status */
            snprintf(why, sizeof why, "no data for %ld ms", c->idle_ms);
            stream_detach(c, s);
            kvr_status st = s->finish_seen ? KVR_OK : KVR_ERR_TIMEOUT;
            if (stream_end(c, s, st, FAIL_TIMEOUT, st == KVR_OK ? "" : why))
                stream_retire(c, s);
        }
    }
}

/* Take the queue and the cancel list; false when stopping. */
static bool take_work(struct kvr_oai *c, struct stream **queue, struct stream **cancels)
{
    pthread_mutex_lock(&c->lock);
    bool go = !c->stopping;
    *queue = c->q_head;
    for (struct stream *s = c->q_head; s; s = s->qnext) {
        s->started = true; /* a cancel now puts it on the cancel list, through qnext */
        s->tnext = s->qnext;
    }
    c->q_head = c->q_tail = NULL;
    *cancels = c->cancels;
    c->cancels = NULL;
    c->stats.bytes += c->rx_pending;
    c->rx_pending = 0;
    pthread_mutex_unlock(&c->lock);
    return go;
}

static void *client_thread(void *arg)
{
    struct kvr_oai *c = arg;
    prctl(PR_SET_NAME, "kvr-openai"); /* for top -H and perf */
    for (;;) {
        struct stream *queue, *cancels, *next;
        bool go = take_work(c, &queue, &cancels);
        for (struct stream *s = cancels; s; s = next) {
            next = s->qnext;
            stream_retire(c, s);
        }
        if (!go) /* what was taken stays in the slots, which destroy frees */
            break;
        for (struct stream *s = queue; s; s = next) {
            next = s->tnext;
            stream_start(c, s);
        }
        int active = 0;
        curl_multi_perform(c->multi, &active);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(c->multi, &left))) {
            if (m->msg != CURLMSG_DONE)
                continue;
            char *priv = NULL;
            CURLcode rc = m->data.result;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &priv);
            stream_done(c, (struct stream *)priv, rc);
        }
        uint64_t now = kvr_now_ns();
        if (c->running && now - c->swept_ns >= SWEEP_NS)
            sweep(c, now);
        /* with streams running, wake often enough for the sweep; else wait for work */
        curl_multi_poll(c->multi, NULL, 0, c->running ? POLL_BUSY_MS : POLL_IDLE_MS, NULL);
    }
    return NULL;
}

/* ---- the API ---- */

static kvr_status config_check(const struct kvr_oai_config *cfg, const struct kvr_oai_hooks *h)
{
    if (!cfg || !h || !h->chunk || !h->end)
        return KVR_ERR_INVALID;
    if (cfg->connect_timeout_ms < 0 || cfg->idle_timeout_ms < 0 || cfg->total_timeout_ms < 0)
        return KVR_ERR_INVALID;
    if (cfg->max_streams > KVR_OAI_MAX_STREAMS_LIMIT)
        return KVR_ERR_INVALID;
    if (cfg->model && strlen(cfg->model) >= KVR_OAI_MODEL_MAX)
        return KVR_ERR_INVALID;
    if (cfg->pin_dp_rank && cfg->dp_rank > KVR_OAI_DP_RANK_MAX)
        return KVR_ERR_INVALID;
    return KVR_OK;
}

static kvr_status client_init(struct kvr_oai *c, const struct kvr_oai_config *cfg)
{
    if (!kvr_oai_base_url(cfg->base_url, c->url, sizeof c->url))
        return KVR_ERR_INVALID;
    c->connect_ms = cfg->connect_timeout_ms ? cfg->connect_timeout_ms : KVR_OAI_CONNECT_MS;
    c->idle_ms = cfg->idle_timeout_ms;
    c->total_ms = cfg->total_timeout_ms;
    c->max_streams = cfg->max_streams ? cfg->max_streams : KVR_OAI_MAX_STREAMS;
    c->max_event = cfg->max_event_bytes ? cfg->max_event_bytes : KVR_OAI_EVENT_BYTES;
    c->return_ids = cfg->return_token_ids;
    c->continuous = cfg->continuous_usage;
    if (cfg->model && cfg->model[0]) {
        snprintf(c->model, sizeof c->model, "%s", cfg->model);
    } else {
        kvr_status st =
            kvr_oai_model_first(c->url, c->connect_ms + 5000, c->model, sizeof c->model);
        if (st != KVR_OK)
            return st;
    }
    strcat(c->url, "/v1/completions"); /* kvr_oai_base_url left room */
    c->n_slots = 2 * c->max_streams;
    c->slots = calloc(c->n_slots, sizeof *c->slots);
    c->free_slots = malloc(c->n_slots * sizeof *c->free_slots);
    if (!c->slots || !c->free_slots || kvr_map_init(&c->keys, c->max_streams) != KVR_OK)
        return KVR_ERR_NOMEM;
    for (uint32_t i = 0; i < c->n_slots; i++)
        c->free_slots[c->n_free++] = c->n_slots - 1 - i;
    if (kvr_oai_http_headers(cfg->pin_dp_rank, cfg->dp_rank, &c->headers) != KVR_OK)
        return KVR_ERR_NOMEM;
    c->multi = curl_multi_init();
    return c->multi ? KVR_OK : KVR_ERR_NOMEM;
}

static void client_free(struct kvr_oai *c)
{
    for (uint32_t i = 0; c->slots && i < c->n_slots; i++) {
        struct stream *s = c->slots[i];
        if (s && s->added)
            curl_multi_remove_handle(c->multi, s->easy);
        if (s)
            stream_free(s);
    }
    if (c->multi)
        curl_multi_cleanup(c->multi);
    curl_slist_free_all(c->headers);
    kvr_map_free(&c->keys);
    free(c->slots);
    free(c->free_slots);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

struct kvr_oai *kvr_oai_create(const struct kvr_oai_config *cfg, const struct kvr_oai_hooks *h,
                               kvr_status *st)
{
    *st = config_check(cfg, h);
    if (*st != KVR_OK)
        return NULL;
    if (!kvr_oai_curl_init()) {
        *st = KVR_ERR_IO;
        return NULL;
    }
    struct kvr_oai *c = calloc(1, sizeof *c);
    if (!c) {
        *st = KVR_ERR_NOMEM;
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    c->hooks = *h;
    *st = client_init(c, cfg);
    if (*st == KVR_OK && pthread_create(&c->thread, NULL, client_thread, c) != 0)
        *st = KVR_ERR_IO;
    if (*st != KVR_OK) {
        client_free(c);
        return NULL;
    }
    c->have_cpu_clock = pthread_getcpuclockid(c->thread, &c->cpu_clock) == 0;
    return c;
}

void kvr_oai_destroy(struct kvr_oai *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    c->stopping = true;
    pthread_mutex_unlock(&c->lock);
    curl_multi_wakeup(c->multi);
    pthread_join(c->thread, NULL);
    client_free(c);
}

const char *kvr_oai_model(const struct kvr_oai *c)
{
    return c->model;
}

/* The request's JSON (ENGINES.md §2); NULL when out of memory. */
static char *request_body(const struct kvr_oai *c, const uint32_t *prompt, uint32_t n,
                          uint32_t max_tokens)
{
    json_t *root = json_object();
    json_t *ids = json_array();
    json_t *opts = json_object();
    bool ok = root && ids && opts;
    for (uint32_t i = 0; ok && i < n; i++)
        ok = json_array_append_new(ids, json_integer(prompt[i])) == 0;
    ok = ok && json_object_set_new(opts, "include_usage", json_true()) == 0;
    if (c->continuous)
        ok = ok && json_object_set_new(opts, "continuous_usage_stats", json_true()) == 0;
    ok = ok && json_object_set_new(root, "model", json_string(c->model)) == 0;
    ok = ok && json_object_set(root, "prompt", ids) == 0;
    ok = ok && json_object_set_new(root, "max_tokens", json_integer(max_tokens)) == 0;
    ok = ok && json_object_set_new(root, "stream", json_true()) == 0;
    ok = ok && json_object_set(root, "stream_options", opts) == 0;
    if (c->return_ids)
        ok = ok && json_object_set_new(root, "return_token_ids", json_true()) == 0;
    char *body = ok ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(ids);
    json_decref(opts);
    json_decref(root);
    return body;
}

char *kvr_oai_body(const struct kvr_oai *c, const uint32_t *prompt, uint32_t n, uint32_t max_tokens,
                   kvr_status *st)
{
    *st = KVR_OK;
    if (n == 0)
        *st = KVR_ERR_EMPTY_PROMPT;
    else if (!prompt)
        *st = KVR_ERR_INVALID;
    else if (n > KVR_OAI_MAX_PROMPT)
        *st = KVR_ERR_PROMPT_TOO_LONG;
    else if (max_tokens == 0)
        *st = KVR_ERR_MAX_TOKENS_ZERO;
    char *body = *st == KVR_OK ? request_body(c, prompt, n, max_tokens) : NULL;
    if (*st == KVR_OK && !body)
        *st = KVR_ERR_NOMEM;
    return body;
}

kvr_status kvr_oai_submit(struct kvr_oai *c, uint64_t key, const uint32_t *prompt, uint32_t n,
                          uint32_t max_tokens)
{
    kvr_status st;
    char *body = kvr_oai_body(c, prompt, n, max_tokens, &st);
    if (body)
        return kvr_oai_submit_body(c, key, body);
    pthread_mutex_lock(&c->lock);
    c->stats.refused++;
    pthread_mutex_unlock(&c->lock);
    return st;
}

kvr_status kvr_oai_submit_body(struct kvr_oai *c, uint64_t key, char *body)
{
    kvr_status st = body ? KVR_OK : KVR_ERR_INVALID;
    struct stream *s = st == KVR_OK ? calloc(1, sizeof *s) : NULL;
    if (st == KVR_OK && !s)
        st = KVR_ERR_NOMEM;
    if (s) {
        s->c = c;
        s->key = key;
        s->body = body;
    } else {
        free(body);
    }
    pthread_mutex_lock(&c->lock);
    bool created = false;
    uint32_t *slot = NULL;
    if (st == KVR_OK && c->stopping)
        st = KVR_ERR_SHUTDOWN;
    else if (st == KVR_OK && (c->in_flight >= c->max_streams || c->n_free == 0))
        st = KVR_ERR_OVERLOADED;
    if (st == KVR_OK && !(slot = kvr_map_upsert(&c->keys, key, &created)))
        st = KVR_ERR_NOMEM;
    else if (st == KVR_OK && !created)
        st = KVR_ERR_DUPLICATE;
    if (st == KVR_OK) {
        s->slot = c->free_slots[--c->n_free];
        c->slots[s->slot] = s;
        *slot = s->slot;
        s->qprev = c->q_tail;
        if (c->q_tail)
            c->q_tail->qnext = s;
        else
            c->q_head = s;
        c->q_tail = s;
        c->in_flight++;
        c->stats.submitted++;
    } else {
        c->stats.refused++;
    }
    pthread_mutex_unlock(&c->lock);
    if (st != KVR_OK) {
        if (s)
            stream_free(s);
        return st;
    }
    curl_multi_wakeup(c->multi);
    return KVR_OK;
}

void kvr_oai_cancel(struct kvr_oai *c, uint64_t key)
{
    struct stream *gone = NULL;
    pthread_mutex_lock(&c->lock);
    uint32_t slot = kvr_map_get(&c->keys, key);
    struct stream *s = slot == KVR_NIL ? NULL : c->slots[slot];
    if (s) {
        kvr_map_del(&c->keys, key);
        s->cancelled = true;
        c->in_flight--;
        c->stats.cancelled++;
        if (!s->started) { /* still queued: the thread never saw it */
            if (s->qprev)
                s->qprev->qnext = s->qnext;
            else
                c->q_head = s->qnext;
            if (s->qnext)
                s->qnext->qprev = s->qprev;
            else
                c->q_tail = s->qprev;
            slot_release(c, s);
            gone = s;
        } else {
            s->qnext = c->cancels;
            c->cancels = s;
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (gone)
        stream_free(gone);
    else if (s)
        curl_multi_wakeup(c->multi);
}

void kvr_oai_stats(struct kvr_oai *c, struct kvr_oai_stats *out)
{
    pthread_mutex_lock(&c->lock);
    *out = c->stats;
    out->in_flight = c->in_flight;
    pthread_mutex_unlock(&c->lock);
    struct timespec ts;
    if (c->have_cpu_clock && clock_gettime(c->cpu_clock, &ts) == 0)
        out->thread_cpu_ns = (uint64_t)ts.tv_sec * KVR_NS_PER_S + (uint64_t)ts.tv_nsec;
}
