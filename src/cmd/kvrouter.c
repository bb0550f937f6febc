/*
 * kvrouter: the KV-cache-aware router daemon. It takes requests on kv.<ns>.generate in a queue
 * group (replicas share the load), decides with the routing core and forwards each request to
 * kv.<ns>.worker.<wid>.generate keeping the client's reply subject; kv.<ns>.select answers with a
 * decision instead. It follows every worker through one wildcard subscription on kv.<ns>.ev.>
 * (KV events, prefill done, output blocks, done, heartbeats), so one worker's events reach it in
 * order. Errors reach the client as the final GenerateResponse chunk, with the NATS service error
 * headers. It answers $SRV.PING/INFO/STATS as service "kvrouter".
 *
 * Threads: nats.c delivers intake and events on their own threads; a timer thread ticks the core.
 * The core and the pending-request table are behind one mutex (read-select-book is one critical
 * section); messages made under it go out through an outbox after it is released.
 */
#define _DEFAULT_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvr/hash.h"
#include "kvr/policy.h"
#include "router.h"

#define SERVICE_NAME    "kvrouter"
#define SERVICE_VERSION "0.1.0"

static volatile sig_atomic_t got_signal;

static bool subject_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static void on_signal(int sig)
{
    got_signal = sig;
}

static uint64_t key_of(const char *reply, const char *request_id)
{
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "%s%c%s", reply ? reply : "", 0, request_id);
    uint64_t k = kvr_hash_bytes(buf, n > 0 && (size_t)n < sizeof buf ? (size_t)n : sizeof buf);
    return k ? k : 1;
}

void pending_free(struct pending *p)
{
    free(p->reply);
    free(p->request_id);
    free(p->raw);
    free(p);
}

struct pending *pending_find(struct router *r, uint64_t key)
{
    struct pending *p = NULL;
    HASH_FIND(hh, r->pend, &key, sizeof key, p);
    return p;
}

void pending_drop(struct router *r, struct pending *p)
{
    HASH_DEL(r->pend, p);
    pending_free(p);
}

/* Under mu: the final error chunk for a client. */
void queue_error(struct router *r, const char *reply, const char *request_id, kvr_status st)
{
    if (!reply)
        return;
    if (kvr_wire_encode_response(&r->buf, request_id, NULL, 0, true, st, 0, 0) == KVR_OK)
        kvr_outbox_add(&r->out, reply, r->buf.data, r->buf.len, st);
}

/* Under mu: forward a request to the worker the decision chose. */
static void queue_forward(struct router *r, const struct pending *p, const void *raw, size_t len,
                          const struct kvr_decision *d)
{
    char subject[512];
    snprintf(subject, sizeof subject, "%s%" PRIu64 ".generate", r->prefix_worker, d->worker_id);
    if (kvr_wire_encode_worker_generate(&r->buf, raw, len, p->key, d->overlap_blocks, r->o.id) ==
        KVR_OK)
        kvr_outbox_add_request(&r->out, subject, p->reply, r->buf.data, r->buf.len);
}

void flush(struct router *r)
{
    struct kvr_outbox local = {0};
    pthread_mutex_lock(&r->mu);
    kvr_outbox_swap(&local, &r->out);
    pthread_mutex_unlock(&r->mu);
    {
        struct kvr_sink sink = kvr_nats_sink(r->nc_req);
        kvr_outbox_flush(&local, &sink);
    }
    kvr_outbox_free(&local);
}

static const struct kvr_wire_limits *limits(const struct router *r)
{
    static struct kvr_wire_limits lim;
    lim.max_prompt_tokens = r->o.max_prompt_tokens;
    lim.max_output_tokens = r->o.max_output_tokens;
    return &lim;
}

#define MAX_PLACEMENTS 2 /* times a request that never reached its worker is placed again */

/* Under mu: remember p to place again once the core call that dropped it has returned. */
static void place_later(struct router *r, struct pending *p)
{
    if (r->nagain == r->capagain) {
        uint32_t cap = r->capagain ? r->capagain * 2 : 64;
        uint64_t *a = realloc(r->again, cap * sizeof *a);
        if (!a) {
            queue_error(r, p->reply, p->request_id, KVR_ERR_NOMEM);
            return;
        }
        r->again = a;
        r->capagain = cap;
    }
    r->again[r->nagain++] = p->key;
    p->worker_id = 0;
}

/* Under mu: place again the requests that never reached their worker (a lost forward, a worker
 * that died before starting them). */
static void place_again(struct router *r)
{
    for (uint32_t i = 0; i < r->nagain; i++) {
        struct pending *p = pending_find(r, r->again[i]);
        struct kvr_wire_request q;
        if (!p || !p->raw || kvr_wire_decode_generate(p->raw, p->rawlen, limits(r), &q) != KVR_OK)
            continue;
        struct kvr_request req = {p->key, q.tokens, q.ntokens, q.max_tokens, q.ov, false};
        struct kvr_decision d;
        p->attempts++;
        r->placed_again++;
        kvr_status st = kvr_router_route(r->core, &req, kvr_now_ns(), &d);
        if (st == KVR_OK) {
            p->worker_id = d.worker_id;
            queue_forward(r, p, p->raw, p->rawlen, &d);
            replica_decided(r, p);
        } else if (st != KVR_ERR_QUEUED) { /* queued: PLACED forwards it */
            queue_error(r, p->reply, p->request_id, st);
            HASH_DEL(r->pend, p);
            pending_free(p);
        }
        kvr_log(KVR_LOG_INFO, "request_placed_again",
                "request=\"%s\" worker=%" PRIu64 " status=\"%s\"", q.request_id,
                st == KVR_OK ? d.worker_id : 0, kvr_status_str(st));
        kvr_wire_request_free(&q);
    }
    r->nagain = 0;
}

/* The core's reports (under mu, inside the call that caused them). */
static void on_core_event(void *ctx, const struct kvr_event *ev)
{
    struct router *r = ctx;
    struct pending *p = ev->request_id ? pending_find(r, ev->request_id) : NULL;
    switch (ev->kind) {
    case KVR_EV_PLACED:
        if (p && p->raw && !p->worker_id) {
            p->worker_id = ev->worker_id;
            queue_forward(r, p, p->raw, p->rawlen, ev->decision);
            replica_decided(r, p);
        }
        break;
    case KVR_EV_REJECTED:
    case KVR_EV_FAILED:
    case KVR_EV_EXPIRED:
        if (p && !p->origin && p->raw && p->attempts < MAX_PLACEMENTS &&
            (ev->status == KVR_ERR_NOT_DELIVERED || ev->kind == KVR_EV_FAILED)) {
            place_later(r, p); /* it never started: another worker can take it */
        } else if (p) {
            kvr_log(KVR_LOG_WARN, "request_failed",
                    "request=\"%s\" worker=%" PRIu64 " error=\"%s\"", p->request_id, ev->worker_id,
                    kvr_status_str(ev->status));
            replica_failed(r, p, ev->status);
        }
        break;
    case KVR_EV_WORKER_LEFT:
        kvr_log(KVR_LOG_WARN, "worker_left", "worker=%" PRIu64, ev->worker_id);
        break;
    }
}

static void count(struct router *r, int ep, kvr_status st, uint64_t t0)
{
    struct endpoint_stats *e = &r->ep[ep];
    e->requests++;
    e->processing_ns += kvr_now_ns() - t0;
    if (st != KVR_OK && st != KVR_ERR_QUEUED) {
        e->errors++;
        snprintf(e->last_error, sizeof e->last_error, "%s", kvr_status_str(st));
    }
}

/* kv.<ns>.generate */
static void on_generate(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc;
    (void)sub;
    struct router *r = ctx;
    uint64_t t0 = kvr_now_ns();
    const char *reply = natsMsg_GetReply(msg);
    const void *data = natsMsg_GetData(msg);
    size_t len = (size_t)natsMsg_GetDataLength(msg);
    struct kvr_wire_request q;
    kvr_status st = kvr_wire_decode_generate(data, len, limits(r), &q);
    pthread_mutex_lock(&r->mu);
    if (!reply || !*reply) {
        st = KVR_ERR_INVALID; /* nobody to answer: counted, dropped */
    } else if (st == KVR_OK) {
        uint64_t key = key_of(reply, q.request_id);
        struct pending *p = calloc(1, sizeof *p);
        if (!p || !(p->reply = strdup(reply)) || !(p->request_id = strdup(q.request_id))) {
            st = KVR_ERR_NOMEM;
        } else if (pending_find(r, key)) {
            /* the same client and id: a resend of a request the fleet already has in flight; its
             * answer goes to the same inbox */
            r->rep.resends++;
        } else {
            p->key = key;
            struct kvr_request req = {key, q.tokens, q.ntokens, q.max_tokens, q.ov, false};
            struct kvr_decision d;
            st = kvr_router_route(r->core, &req, kvr_now_ns(), &d);
            if ((st == KVR_OK || st == KVR_ERR_QUEUED) && (p->raw = malloc(len))) {
                memcpy(p->raw, data, len);
                p->rawlen = len;
            }
            if (st == KVR_OK) {
                p->worker_id = d.worker_id;
                queue_forward(r, p, data, len, &d);
            } else if (st == KVR_ERR_QUEUED && !p->raw) {
                st = KVR_ERR_NOMEM; /* the core holds it: it will be rejected at its deadline */
            }
            if (st == KVR_OK || st == KVR_ERR_QUEUED) {
                HASH_ADD(hh, r->pend, key, sizeof p->key, p);
                if (st == KVR_OK)
                    replica_decided(r, p);
                p = NULL;
            }
        }
        if (p)
            pending_free(p);
    }
    if (st != KVR_OK && st != KVR_ERR_QUEUED && reply && *reply)
        queue_error(r, reply, q.request_id ? q.request_id : "", st);
    count(r, 0, st, t0);
    pthread_mutex_unlock(&r->mu);
    if (st != KVR_OK && st != KVR_ERR_QUEUED)
        kvr_log(KVR_LOG_DEBUG, "request_refused", "request=\"%s\" error=\"%s\"",
                q.request_id ? q.request_id : "", kvr_status_str(st));
    kvr_wire_request_free(&q);
    natsMsg_Destroy(msg);
    flush(r);
}

/* kv.<ns>.select: a decision without forwarding; booked on request. */
static void on_select(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc;
    (void)sub;
    struct router *r = ctx;
    uint64_t t0 = kvr_now_ns();
    const char *reply = natsMsg_GetReply(msg);
    struct kvr_wire_request q;
    bool book = false;
    kvr_status st = kvr_wire_decode_select(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg),
                                           limits(r), &q, &book);
    struct kvr_buf b = {0};
    pthread_mutex_lock(&r->mu);
    struct kvr_decision d;
    uint64_t key = 0;
    if (st == KVR_OK) {
        key = key_of(reply, q.request_id);
        struct kvr_request req = {key, q.tokens, q.ntokens, q.max_tokens, q.ov, true};
        if (book && pending_find(r, key))
            st = KVR_ERR_DUPLICATE;
        else
            st = kvr_router_select(r->core, &req, kvr_now_ns(), &d);
        if (st == KVR_OK && book) /* booked in the same critical section: still atomic */
            st = kvr_router_book(r->core, key, d.worker_id, d.block_hashes, d.prompt_blocks,
                                 d.prompt_tokens, d.overlap_blocks, kvr_now_ns());
        if (st == KVR_OK && book) {
            struct pending *p = calloc(1, sizeof *p);
            if (p && (p->request_id = strdup(q.request_id))) {
                p->key = key;
                p->worker_id = d.worker_id;
                HASH_ADD(hh, r->pend, key, sizeof p->key, p);
                replica_decided(r, p);
            } else {
                free(p);
            }
        }
    }
    kvr_wire_encode_select_response(&b, st == KVR_OK ? &d : NULL, key, st);
    count(r, 1, st, t0);
    pthread_mutex_unlock(&r->mu);
    if (reply)
        kvr_publish(r->nc_req, reply, b.data, b.len, st);
    kvr_buf_free(&b);
    kvr_wire_request_free(&q);
    natsMsg_Destroy(msg);
}

/* Under mu: a KV event (now, or replayed after a snapshot). */
kvr_status apply_kv_event(struct router *r, uint64_t wid, const void *data, size_t len)
{
    struct kvr_wire_kv e;
    kvr_status st = kvr_wire_decode_kv(data, len, &e);
    if (st != KVR_OK)
        return st;
    if (e.kind == KVR_WIRE_STORED)
        st = kvr_router_kv_stored(r->core, wid, e.has_parent ? &e.parent : NULL, e.blocks,
                                  e.nblocks);
    else if (e.kind == KVR_WIRE_REMOVED)
        st = kvr_router_kv_removed(r->core, wid, e.ids, e.nids);
    else
        st = kvr_router_kv_cleared(r->core, wid);
    kvr_wire_kv_free(&e);
    return st;
}

/* Under mu: one worker event. */
static kvr_status apply_event(struct router *r, uint64_t wid, const char *kind, const void *data,
                              size_t len)
{
    uint64_t now = kvr_now_ns();
    if (!strcmp(kind, "hb")) {
        struct kvr_wire_heartbeat h;
        kvr_status st = kvr_wire_decode_heartbeat(data, len, &h);
        if (st != KVR_OK)
            return st;
        if (h.info.id != wid) {
            kvr_wire_heartbeat_free(&h);
            return KVR_ERR_INVALID;
        }
        h.info.timeout_ns = h.interval_ms ? (uint64_t)h.interval_ms * 3200000ull : 0;
        h.info.draining = h.draining;
        bool known = kvr_router_worker_load(r->core, wid, NULL, NULL, NULL) == KVR_OK;
        st = kvr_router_worker_seen(r->core, &h.info, now);
        if (st == KVR_OK) {
            if (h.interval_ms > r->hb_interval_ms)
                r->hb_interval_ms = h.interval_ms;
            replica_reconcile(r, wid, h.inflight, h.ninflight, h.interval_ms, now);
        }
        if (st == KVR_OK && !known)
            kvr_log(KVR_LOG_INFO, "worker_joined",
                    "worker=%" PRIu64 " block_size=%u capacity_blocks=%" PRIu64, wid,
                    h.info.block_size, h.info.capacity_blocks);
        else if (st == KVR_ERR_BLOCK_SIZE && !known)
            kvr_log(KVR_LOG_ERROR, "worker_refused",
                    "worker=%" PRIu64 " block_size=%u router_block_size=%u", wid, h.info.block_size,
                    r->o.block_size);
        kvr_wire_heartbeat_free(&h);
        return st;
    }
    if (!strcmp(kind, "kv"))
        return replica_hold_event(r, wid, data, len) ? KVR_OK : apply_kv_event(r, wid, data, len);
    if (!strcmp(kind, "tokens")) {
        struct kvr_wire_tokens t;
        kvr_status st = kvr_wire_decode_tokens(data, len, &t);
        if (st != KVR_OK)
            return st;
        if (t.kind != KVR_WIRE_PREFILL_DONE)
            return kvr_router_output_block(r->core, t.key, now);
        struct pending *p = pending_find(r, t.key);
        if (p && p->raw) { /* it started: it will not be placed again */
            free(p->raw);
            p->raw = NULL;
        }
        return kvr_router_prefill_done(r->core, t.key, now);
    }
    if (!strcmp(kind, "done")) {
        struct kvr_wire_done d;
        kvr_status st = kvr_wire_decode_done(data, len, &d);
        if (st != KVR_OK)
            return st;
        struct pending *p = pending_find(r, d.key);
        if (p)
            pending_drop(r, p);
        st = kvr_router_done_at(r->core, d.key, now);
        if (kvr_router_queue_len(r->core))
            kvr_router_tick(r->core, now); /* freed load may place waiting requests */
        return st;
    }
    return KVR_ERR_MALFORMED;
}

/* kv.<ns>.ev.<wid>.<kind>, every worker through this one subscription */
static void on_event(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc;
    (void)sub;
    struct router *r = ctx;
    const char *subject = natsMsg_GetSubject(msg);
    const char *kind = strrchr(subject, '.');
    const char *wid_end = kind;
    const char *wid_start = wid_end;
    while (wid_start > subject && wid_start[-1] != '.')
        wid_start--;
    char wid_s[32] = "";
    size_t wlen = (size_t)(wid_end - wid_start);
    kvr_status st = KVR_ERR_MALFORMED;
    if (kind && wlen > 0 && wlen < sizeof wid_s) {
        memcpy(wid_s, wid_start, wlen);
        char *end;
        uint64_t wid = strtoull(wid_s, &end, 10);
        if (*end == 0 && wid) {
            pthread_mutex_lock(&r->mu);
            st = apply_event(r, wid, kind + 1, natsMsg_GetData(msg),
                             (size_t)natsMsg_GetDataLength(msg));
            place_again(r);
            pthread_mutex_unlock(&r->mu);
        }
    }
    if (st == KVR_ERR_MALFORMED || st == KVR_ERR_INVALID) {
        pthread_mutex_lock(&r->mu);
        r->ev_errors++;
        pthread_mutex_unlock(&r->mu);
        kvr_log(KVR_LOG_WARN, "event_dropped", "subject=%s error=\"%s\"", subject,
                kvr_status_str(st));
    }
    natsMsg_Destroy(msg);
    flush(r);
}

/* --- $SRV (the NATS service API, by hand: NATS-NOTES.md section 2) -------------------------- */

static int srv_common(const struct router *r, char *buf, size_t len, const char *type)
{
    return snprintf(buf, len,
                    "{\"type\":\"io.nats.micro.v1.%s\",\"name\":\"" SERVICE_NAME "\",\"id\":\"%s\","
                    "\"version\":\"" SERVICE_VERSION "\",\"metadata\":{\"router_id\":\"%s\"}",
                    type, r->instance, r->o.id);
}

static int srv_stats(struct router *r, char *buf, size_t len)
{
    char started[64];
    kvr_rfc3339(started, sizeof started, r->started_real);
    int n = srv_common(r, buf, len, "stats_response");
    n += snprintf(buf + n, len - (size_t)n, ",\"started\":\"%s\",\"endpoints\":[", started);
    pthread_mutex_lock(&r->mu);
    struct kvr_router_stats s;
    kvr_router_stats(r->core, &s);
    for (int i = 0; i < 2; i++) {
        const struct endpoint_stats *e = &r->ep[i];
        n += snprintf(buf + n, len - (size_t)n,
                      "%s{\"name\":\"%s\",\"subject\":\"%s\",\"queue_group\":\"kvrouter\","
                      "\"num_requests\":%" PRIu64 ",\"num_errors\":%" PRIu64
                      ",\"last_error\":\"%s\",\"processing_time\":%" PRIu64
                      ",\"average_processing_time\":%" PRIu64,
                      i ? "," : "", e->name, e->subject, e->requests, e->errors, e->last_error,
                      e->processing_ns, e->requests ? e->processing_ns / e->requests : 0);
        if (i == 0)
            n += snprintf(buf + n, len - (size_t)n,
                          ",\"data\":{\"decisions\":%" PRIu64 ",\"rejected\":%" PRIu64
                          ",\"overloaded\":%" PRIu64 ",\"queued\":%" PRIu64
                          ",\"workers\":%u,\"inflight\":%u,\"queue_len\":%u,\"index_entries\":%u"
                          ",\"nodes\":%u,\"active_blocks\":%" PRIu64 ",\"memory_bytes\":%zu"
                          ",\"failed_requests\":%" PRIu64 ",\"unknown_request_events\":%" PRIu64
                          ",\"unknown_worker_events\":%" PRIu64 ",\"bad_events\":%" PRIu64
                          ",\"workers_joined\":%" PRIu64 ",\"workers_left\":%" PRIu64
                          ",\"placed_again\":%" PRIu64,
                          s.decisions, s.rejected, s.overloaded, s.queued, s.workers, s.inflight,
                          s.queue_len, s.index_entries, s.nodes, s.active_blocks, s.memory_bytes,
                          s.failed_requests, s.unknown_request, s.unknown_worker, r->ev_errors,
                          s.workers_joined, s.workers_left, r->placed_again);
        if (i == 0) {
            n += snprintf(buf + n, len - (size_t)n, ",\"replication\":{");
            n += replica_stats_json(r, buf + n, len - (size_t)n);
            n += snprintf(buf + n, len - (size_t)n, "}}");
        }
        n += snprintf(buf + n, len - (size_t)n, "}");
    }
    pthread_mutex_unlock(&r->mu);
    n += snprintf(buf + n, len - (size_t)n, "]}");
    return n;
}

static void on_srv(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)sub;
    struct router *r = ctx;
    const char *verb = natsMsg_GetSubject(msg) + 5; /* after "$SRV." */
    size_t k = strcspn(verb, ".");
    char buf[16384];
    int n = 0;
    if (k == 4 && !memcmp(verb, "PING", 4)) {
        n = srv_common(r, buf, sizeof buf, "ping_response");
        n += snprintf(buf + n, sizeof buf - (size_t)n, "}");
    } else if (k == 4 && !memcmp(verb, "INFO", 4)) {
        n = srv_common(r, buf, sizeof buf, "info_response");
        n += snprintf(buf + n, sizeof buf - (size_t)n,
                      ",\"description\":\"KV-cache-aware LLM request router\",\"endpoints\":["
                      "{\"name\":\"generate\",\"subject\":\"%s\",\"queue_group\":\"kvrouter\","
                      "\"metadata\":null},{\"name\":\"select\",\"subject\":\"%s\","
                      "\"queue_group\":\"kvrouter\",\"metadata\":null}]}",
                      r->ep[0].subject, r->ep[1].subject);
    } else if (k == 5 && !memcmp(verb, "STATS", 5)) {
        n = srv_stats(r, buf, sizeof buf);
    }
    const char *reply = natsMsg_GetReply(msg);
    if (n > 0 && (size_t)n < sizeof buf && reply)
        natsConnection_Publish(nc, reply, buf, n);
    natsMsg_Destroy(msg);
}

/* --- main --------------------------------------------------------------------------------------
 */

/*
 * Timer thread: whether the events connection was cut since the last tick. Events published
 * meanwhile are lost to this router (core NATS), so it catches up from a peer once its
 * subscriptions have had time to reach the whole cluster again.
 */
static bool events_were_cut(struct router *r, natsStatistics *st)
{
    uint64_t reconnects = 0;
    if (!st || natsConnection_GetStats(r->nc_ev, st) != NATS_OK ||
        natsStatistics_GetCounts(st, NULL, NULL, NULL, NULL, &reconnects) != NATS_OK)
        return false;
    bool cut = reconnects != r->reconnects;
    r->reconnects = reconnects;
    return cut;
}

#define CATCH_UP_DELAY_NS 250000000ull /* interest propagation across a cluster, and a margin */

static void *timer_thread(void *arg)
{
    struct router *r = arg;
    natsStatistics *st = NULL;
    natsStatistics_Create(&st);
    events_were_cut(r, st);
    for (;;) {
        kvr_sleep_ns((uint64_t)r->o.tick_ms * 1000000ull);
        bool up = natsConnection_Status(r->nc_ev) == NATS_CONN_STATUS_CONNECTED;
        bool cut = events_were_cut(r, st);
        pthread_mutex_lock(&r->mu);
        bool stop = r->stopping;
        uint64_t now = kvr_now_ns();
        if (!stop && !up) {
            r->blind = true;      /* no worker can be heard: judge none of them meanwhile */
            replica_tick(r, now); /* but say hello: its requests are still in good hands */
        } else if (!stop) {
            if (r->blind || cut) {
                r->blind = false;
                r->resync_at = now + CATCH_UP_DELAY_NS;
                kvr_router_excuse_silence(r->core, now);
            }
            if (r->resync_at && now >= r->resync_at) {
                r->resync_at = 0;
                replica_resync(r);
            }
            kvr_router_tick(r->core, now);
            place_again(r);
            replica_tick(r, now);
        }
        pthread_mutex_unlock(&r->mu);
        if (stop)
            break;
        flush(r);
    }
    natsStatistics_Destroy(st);
    nats_ReleaseThreadMemory();
    return NULL;
}

static int make_core(struct router *r)
{
    struct kvr_router_config c;
    kvr_router_config_default(&c);
    c.block_size = r->o.block_size;
    if (kvr_policy_parse(r->o.policy, strlen(r->o.policy), &c.policy) != KVR_OK) {
        fprintf(stderr, "kvrouter: unknown --policy %s\n", r->o.policy);
        return 2;
    }
    if (strcmp(r->o.cost, "time") && strcmp(r->o.cost, "blocks")) {
        fprintf(stderr, "kvrouter: --kv-cost must be time or blocks\n");
        return 2;
    }
    c.cost_model = strcmp(r->o.cost, "time") ? KVR_COST_BLOCKS : KVR_COST_TIME;
    c.overlap_weight = r->o.overlap_weight;
    c.cache_weight = r->o.cache_weight;
    c.temperature = r->o.temperature;
    c.busy_threshold = r->o.busy_threshold;
    c.approximate = r->o.approximate;
    c.max_prompt_tokens = r->o.max_prompt_tokens;
    c.queue_max = r->o.queue_max;
    c.queue_timeout_ns = r->o.queue_timeout_ms * 1000000ull;
    c.worker_timeout_ns = r->o.worker_timeout_ms * 1000000ull;
    c.request_ttl_ns = r->o.request_ttl_s * 1000000000ull;
    c.seed = r->o.seed ? r->o.seed : kvr_realtime_ns();
    c.on_event = on_core_event;
    c.event_ctx = r;
    kvr_status st;
    r->core = kvr_router_create(&c, &st);
    if (!r->core) {
        fprintf(stderr, "kvrouter: %s\n", kvr_status_str(st));
        return 2;
    }
    return 0;
}

static int subscribe(struct router *r)
{
    char subj[256];
    snprintf(r->name_req, sizeof r->name_req, "kvrouter-%s", r->o.id);
    if (kvr_connect(r->o.nats, r->name_req, &r->nc_req) != KVR_OK)
        return 1;
    snprintf(r->name_ev, sizeof r->name_ev, "kvrouter-%s-events", r->o.id);
    if (kvr_connect(r->o.nats, r->name_ev, &r->nc_ev) != KVR_OK)
        return 1;
    natsStatus s = NATS_OK;
    kvr_subject(subj, sizeof subj, r->o.prefix, r->o.ns, "ev.>");
    s = natsConnection_Subscribe(&r->sub_ev, r->nc_ev, subj, on_event, r);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(r->sub_ev, -1, -1);
    if (s == NATS_OK)
        s = replica_subscribe(r);
    if (s == NATS_OK)
        s = natsConnection_Flush(r->nc_ev);
    /* learn the fleet before taking requests: a router that knows no worker yet would answer
     * "no workers" while its peers could serve. Workers and peers announce themselves
     * periodically: listen one announcement period past the first worker. */
    uint64_t end = kvr_now_ns() + r->o.warmup_ms * 1000000ull, seen_at = 0;
    while (s == NATS_OK && kvr_now_ns() < end) {
        pthread_mutex_lock(&r->mu);
        struct kvr_router_stats st;
        kvr_router_stats(r->core, &st);
        uint64_t period = r->hb_interval_ms > r->o.hello_ms ? r->hb_interval_ms : r->o.hello_ms;
        pthread_mutex_unlock(&r->mu);
        if (st.workers && !seen_at)
            seen_at = kvr_now_ns();
        if (seen_at && kvr_now_ns() > seen_at + period * 1100000ull)
            break;
        kvr_sleep_ns(10000000);
    }
    if (s == NATS_OK)
        replica_sync(r);
    kvr_subject(r->ep[0].subject, sizeof r->ep[0].subject, r->o.prefix, r->o.ns, "generate");
    kvr_subject(r->ep[1].subject, sizeof r->ep[1].subject, r->o.prefix, r->o.ns, "select");
    if (s == NATS_OK)
        s = natsConnection_QueueSubscribe(&r->sub_gen, r->nc_req, r->ep[0].subject, "kvrouter",
                                          on_generate, r);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(r->sub_gen, -1, -1);
    if (s == NATS_OK)
        s = natsConnection_QueueSubscribe(&r->sub_sel, r->nc_req, r->ep[1].subject, "kvrouter",
                                          on_select, r);
    char srv[3][256];
    snprintf(srv[0], sizeof srv[0], "$SRV.*");
    snprintf(srv[1], sizeof srv[1], "$SRV.*." SERVICE_NAME);
    snprintf(srv[2], sizeof srv[2], "$SRV.*." SERVICE_NAME ".%s", r->instance);
    for (int i = 0; i < 3 && s == NATS_OK; i++)
        s = natsConnection_Subscribe(&r->sub_srv[i], r->nc_req, srv[i], on_srv, r);
    if (s == NATS_OK)
        s = natsConnection_Flush(r->nc_req);
    if (s != NATS_OK) {
        kvr_log(KVR_LOG_ERROR, "subscribe_failed", "error=\"%s\"", natsStatus_GetText(s));
        return 1;
    }
    return 0;
}

/* SIGTERM: stop taking requests (the queue group's other members take them), settle the
 * requests waiting here, exit. Requests already forwarded belong to their workers. */
static void drain(struct router *r)
{
    natsSubscription_Drain(r->sub_gen);
    natsSubscription_Drain(r->sub_sel);
    natsSubscription_WaitForDrainCompletion(r->sub_gen, 10000);
    natsSubscription_WaitForDrainCompletion(r->sub_sel, 10000);
    uint64_t deadline = kvr_now_ns() + r->o.queue_timeout_ms * 1000000ull + 1000000000ull;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        uint32_t waiting = kvr_router_queue_len(r->core);
        pthread_mutex_unlock(&r->mu);
        if (!waiting || kvr_now_ns() > deadline)
            break;
        kvr_sleep_ns(20000000);
    }
    flush(r);
    natsConnection_FlushTimeout(r->nc_req, 2000);
}

int main(int argc, char **argv)
{
    static struct router r;
    struct opts *o = &r.o;
    strcpy(o->nats, "nats://127.0.0.1:4222");
    strcpy(o->ns, "default");
    strcpy(o->prefix, "kv");
    strcpy(o->policy, "kv");
    strcpy(o->cost, "time");
    strcpy(o->log_level, "info");
    o->block_size = 64;
    o->max_prompt_tokens = 1u << 20;
    o->max_output_tokens = 1u << 16;
    o->queue_max = 1024;
    o->queue_timeout_ms = 5000;
    o->worker_timeout_ms = 3200;
    o->request_ttl_s = 600;
    o->tick_ms = 20;
    o->warmup_ms = 2000;
    o->overlap_weight = 1.0;
    o->cache_weight = 4.0;
    o->busy_threshold = 0.95;
    o->gossip = true;
    o->hello_ms = 1000;
    o->sync_timeout_ms = 1000;
    const struct kvr_opt table[] = {
        {"nats", "KVR_NATS", KVR_OPT_STR, o->nats, "NATS server URLs, comma-separated", 0, 0, NULL},
        {"namespace", "KVR_NAMESPACE", KVR_OPT_STR, o->ns, "subject namespace", 0, 0, NULL},
        {"prefix", "KVR_PREFIX", KVR_OPT_STR, o->prefix, "subject prefix", 0, 0, NULL},
        {"id", "KVR_ROUTER_ID", KVR_OPT_STR, o->id, "router id (default: host-pid)", 0, 0, NULL},
        {"block-size", "KVR_BLOCK_SIZE", KVR_OPT_U32, &o->block_size, "tokens per KV block", 0, 0,
         NULL},
        {"policy", "KVR_POLICY", KVR_OPT_STR, o->policy, "default policy", 0, 0, NULL},
        {"kv-cost", NULL, KVR_OPT_STR, o->cost, "kv cost model: time or blocks", 0, 0, NULL},
        {"overlap-weight", NULL, KVR_OPT_DOUBLE, &o->overlap_weight, "kv: weight of cache reuse", 0,
         0, NULL},
        {"cache-weight", NULL, KVR_OPT_DOUBLE, &o->cache_weight, "kv time model: recompute charge",
         0, 0, NULL},
        {"temperature", NULL, KVR_OPT_DOUBLE, &o->temperature, "kv: 0 = cheapest, > 0 samples", 0,
         0, NULL},
        {"busy-threshold", NULL, KVR_OPT_DOUBLE, &o->busy_threshold,
         "skip workers above this fraction of their KV capacity (0: off)", 0, 0, NULL},
        {"approximate", "KVR_APPROXIMATE", KVR_OPT_BOOL, &o->approximate,
         "workers publish no KV events: learn the cache from decisions", 0, 0, NULL},
        {"max-prompt-tokens", NULL, KVR_OPT_U32, &o->max_prompt_tokens, "longer prompts refused", 0,
         0, NULL},
        {"max-output-tokens", NULL, KVR_OPT_U32, &o->max_output_tokens, "larger max_tokens refused",
         0, 0, NULL},
        {"queue-max", NULL, KVR_OPT_U32, &o->queue_max, "requests that may wait for a worker", 0, 0,
         NULL},
        {"queue-timeout-ms", NULL, KVR_OPT_U64, &o->queue_timeout_ms, "then they get 'overloaded'",
         0, 0, NULL},
        {"worker-timeout-ms", NULL, KVR_OPT_U64, &o->worker_timeout_ms,
         "a worker silent this long is removed (default: 3.2 heartbeats it announced)", 0, 0, NULL},
        {"request-ttl-s", NULL, KVR_OPT_U64, &o->request_ttl_s, "stale in-flight requests dropped",
         0, 0, NULL},
        {"seed", NULL, KVR_OPT_U64, &o->seed, "seeds random choices (0: from the clock)", 0, 0,
         NULL},
        {"tick-ms", NULL, KVR_OPT_U32, &o->tick_ms, "housekeeping period", 0, 0, NULL},
        {"warmup-ms", NULL, KVR_OPT_U64, &o->warmup_ms,
         "at start, listen this long (at most) for workers before taking requests", 0, 0, NULL},
        {"gossip", "KVR_GOSSIP", KVR_OPT_BOOL, &o->gossip,
         "share decisions with the other routers (--gossip=false: each router on its own)", 0, 0,
         NULL},
        {"hello-ms", NULL, KVR_OPT_U64, &o->hello_ms, "period of the hello to the other routers", 0,
         0, NULL},
        {"sync-timeout-ms", NULL, KVR_OPT_U64, &o->sync_timeout_ms,
         "at start, wait this long (twice at most) for a peer's snapshot", 0, 0, NULL},
        {"test-drop-gossip", NULL, KVR_OPT_U64, &o->test_drop_gossip,
         "tests only: do not send every Nth decision (0: send all)", 0, 0, NULL},
        {"log-level", "KVR_LOG_LEVEL", KVR_OPT_STR, o->log_level, "debug, info, warn or error", 0,
         0, NULL},
    };
    int rc = kvr_opts_parse(table, sizeof table / sizeof table[0], argc, argv, "kvrouter",
                            "The KV-cache-aware LLM request router.");
    if (rc)
        return rc == 1 ? 0 : rc;
    enum kvr_log_level lvl;
    if (!kvr_log_parse_level(o->log_level, &lvl) || !o->tick_ms || !o->hello_ms) {
        fprintf(stderr, "kvrouter: bad --log-level, --tick-ms or --hello-ms\n");
        return 2;
    }
    kvr_log_init("kvrouter", lvl);
    if (!o->id[0]) {
        char host[128] = "host";
        gethostname(host, sizeof host - 1);
        snprintf(o->id, sizeof o->id, "%s-%d", host, (int)getpid());
        for (char *c = o->id; *c; c++)
            if (!subject_char(*c))
                *c = '_';
    }
    for (const char *c = o->id; *c; c++) {
        if (!subject_char(*c)) { /* it names subjects (kv.<ns>.router.pages.<id>) */
            fprintf(stderr, "kvrouter: --id may hold letters, digits, '-' and '_' only\n");
            return 2;
        }
    }
    snprintf(r.instance, sizeof r.instance, "%016" PRIx64,
             kvr_hash_bytes(o->id, strlen(o->id)) ^ kvr_realtime_ns());
    snprintf(r.prefix_worker, sizeof r.prefix_worker, "%s.%s.worker.", o->prefix, o->ns);
    r.ep[0].name = "generate";
    r.ep[1].name = "select";
    r.started_real = kvr_realtime_ns();
    pthread_mutex_init(&r.mu, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    if ((rc = make_core(&r)))
        return rc;
    if (replica_init(&r) != KVR_OK) {
        fprintf(stderr, "kvrouter: out of memory or subjects too long\n");
        return 2;
    }
    if ((rc = subscribe(&r)))
        return rc;
    pthread_t timer;
    pthread_create(&timer, NULL, timer_thread, &r);
    kvr_log(KVR_LOG_INFO, "router_started", "id=%s subject=%s policy=%s block_size=%u", o->id,
            r.ep[0].subject, o->policy, o->block_size);
    while (!got_signal)
        kvr_sleep_ns(20000000);
    kvr_log(KVR_LOG_INFO, "router_draining", "signal=%d", (int)got_signal);
    drain(&r);
    pthread_mutex_lock(&r.mu);
    r.stopping = true;
    pthread_mutex_unlock(&r.mu);
    pthread_join(timer, NULL);
    natsSubscription_Unsubscribe(r.sub_ev);
    natsSubscription_Unsubscribe(r.sub_gossip);
    natsSubscription_Unsubscribe(r.sub_pages);
    natsSubscription_Unsubscribe(r.sub_lookup);
    natsSubscription_Unsubscribe(r.sub_digest);
    natsSubscription_Unsubscribe(r.sub_sync);
    for (int i = 0; i < 3; i++)
        natsSubscription_Unsubscribe(r.sub_srv[i]);
    struct kvr_router_stats s;
    kvr_router_stats(r.core, &s);
    kvr_log(KVR_LOG_INFO, "router_stopped",
            "decisions=%" PRIu64 " rejected=%" PRIu64 " inflight_left=%u", s.decisions, s.rejected,
            s.inflight);
    natsSubscription_Destroy(r.sub_gen);
    natsSubscription_Destroy(r.sub_sel);
    natsSubscription_Destroy(r.sub_ev);
    natsSubscription_Destroy(r.sub_gossip);
    natsSubscription_Destroy(r.sub_pages);
    natsSubscription_Destroy(r.sub_lookup);
    natsSubscription_Destroy(r.sub_digest);
    natsSubscription_Destroy(r.sub_sync);
    for (int i = 0; i < 3; i++)
        natsSubscription_Destroy(r.sub_srv[i]);
    natsConnection_Destroy(r.nc_req);
    natsConnection_Destroy(r.nc_ev);
    kvr_router_destroy(r.core);
    struct pending *p, *tmp;
    HASH_ITER(hh, r.pend, p, tmp)
    {
        HASH_DEL(r.pend, p);
        pending_free(p);
    }
    replica_free(&r);
    free(r.again);
    kvr_outbox_free(&r.out);
    kvr_buf_free(&r.buf);
    nats_Close();
    return 0;
}
