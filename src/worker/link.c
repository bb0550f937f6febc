/*
 * The simulated worker's NATS link.
 */
#define _DEFAULT_SOURCE
#include "link.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "codec.h"
#include "log.h"
#include "metrics.h"
#include "procstat.h"
#include "settle.h"
#include "subject.h"
#include "util.h"

/* --- deliveries ------------------------------------------------------------------------------ */

static void on_generate(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    struct kvr_wk_link *l = ctx;
    kvr_worker_on_generate(l->w, natsMsg_GetReply(msg), natsMsg_GetData(msg),
                           (size_t)natsMsg_GetDataLength(msg));
    natsMsg_Destroy(msg);
}

static void on_cancel(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    struct kvr_wk_link *l = ctx;
    kvr_worker_on_cancel(l->w, natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg));
    natsMsg_Destroy(msg);
}

static void on_rebind(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    struct kvr_wk_link *l = ctx;
    kvr_worker_on_rebind(l->w, natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg));
    natsMsg_Destroy(msg);
}

static void on_hello(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    struct kvr_wk_link *l = ctx;
    kvr_worker_on_hello(l->w, natsMsg_GetReply(msg));
    natsMsg_Destroy(msg);
}

/* A router asks every worker to announce itself: the heartbeat thread answers (coalesced). */
static void on_announce(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc;
    (void)sub;
    struct kvr_wk_link *l = ctx;
    atomic_store(&l->announce_asked, true);
    natsMsg_Destroy(msg);
}

static void on_heartbeat(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    struct kvr_wk_link *l = ctx;
    kvr_worker_on_heartbeat(l->w, natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg));
    natsMsg_Destroy(msg);
}

/* The worker's own figures, under its mutex: the first endpoint's "data" in $SRV.STATS. */
static json_t *stats_data(const struct kvr_worker *w)
{
    const struct kvr_wk_counters *c = &w->c;
    json_t *o = json_object();
    struct {
        const char *name;
        uint64_t v;
    } f[] = {{"held", w->nreqs},
             {"served", c->served},
             {"duplicates", c->duplicates},
             {"cancelled", c->cancelled},
             {"deadlines", c->deadlines},
             {"drain_cut", c->drain_cut},
             {"early_cancels", c->early_cancels},
             {"late_cancels", c->late_cancels},
             {"bad_cancels", c->bad_cancels},
             {"bad_heartbeats", c->bad_heartbeats},
             {"repeats", c->repeats},
             {"rebind_asks", c->rebind_asks},
             {"rebinds", c->rebinds},
             {"rebinds_bad", c->rebinds_bad},
             {"resend_repeats", c->resend_repeats},
             {"resend_refused", c->resend_refused},
             {"dropped", c->dropped + w->out.dropped},
             {"publish_failed", atomic_load_explicit(&w->sink.failed, memory_order_relaxed)},
             {"event_batches", c->batches},
             {"batched_events", c->batched_events},
             {"recent", w->recent.n},
             {"recent_evicted", w->recent.evicted},
             {"instance", w->instance},
             {"started_ns", w->started_ns}};
    for (size_t i = 0; o && i < sizeof f / sizeof f[0]; i++)
        kvr_json_u64(o, f[i].name, f[i].v);
    return o;
}

static void on_srv(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    struct kvr_wk_link *l = ctx;
    const char *reply = natsMsg_GetReply(msg), *subject = natsMsg_GetSubject(msg);
    bool stats = !strncmp(subject, "$SRV.STATS", 10);
    pthread_mutex_lock(&l->w->mu);
    char *text = kvr_service_answer(&l->svc, subject, stats ? stats_data(l->w) : NULL);
    pthread_mutex_unlock(&l->w->mu);
    if (text && kvr_reply_usable(reply, l->w->cfg->net.prefix) && /* never a fleet's own subject */
        natsConnection_PublishString(nc, reply, text) != NATS_OK)
        atomic_fetch_add_explicit(&l->w->sink.failed, 1, memory_order_relaxed);
    free(text);
    natsMsg_Destroy(msg);
}

/* --- threads --------------------------------------------------------------------------------- */

static void *engine_thread(void *arg)
{
    struct kvr_wk_link *l = arg;
    kvr_worker_run_engine(l->w);
    nats_ReleaseThreadMemory();
    return NULL;
}

static bool connected(const struct kvr_wk_link *l)
{
    return natsConnection_Status(l->nc_out) == NATS_CONN_STATUS_CONNECTED &&
           natsConnection_Status(l->nc_in) == NATS_CONN_STATUS_CONNECTED;
}

/* A beat every period on the clock (a late one does not push the next back), each sent without
 * waiting on the worker's mutex behind the busy threads (kvr_worker_beat); the stop is seen
 * within 10 ms, without the mutex either. One more as soon as both connections are up after a
 * cut (l->back, set by their hooks once the worker knows): routers lose a worker silent for 3.2
 * periods, and a server node's restart can take most of them before the library sees the cut. */
static void *heartbeat_thread(void *arg)
{
    struct kvr_wk_link *l = arg;
    uint64_t period = l->w->cfg->heartbeat_ns, next = kvr_now_ns(), announced = 0;
    while (!kvr_worker_stopping(l->w)) {
        uint64_t now = kvr_now_ns();
        /* each beat asks whether both connections are up right before it (a beat can wait for
         * the mutex a while), and only then (the library's locks are not taken every 10 ms) */
        if (atomic_load(&l->back) && connected(l) && atomic_exchange(&l->back, false)) {
            kvr_worker_beat(l->w);
        } else if (now - announced >= KVR_WK_ANNOUNCE_GAP_NS && atomic_load(&l->announce_asked) &&
                   atomic_exchange(&l->announce_asked, false)) {
            announced = now; /* the ask's answer: a heartbeat now, not in place of the next */
            if (connected(l))
                kvr_worker_beat(l->w);
        }
        if (now >= next) {
            /* one buffered while disconnected would arrive late and list stale requests: skip */
            if (connected(l))
                kvr_worker_beat(l->w);
            next += period;
            now = kvr_now_ns();
            if (next <= now) /* over a period late (a stopped process): start again from now */
                next = now + period;
        }
        uint64_t left = next - now;
        kvr_sleep_ns(left < 10 * KVR_NS_PER_MS ? left : 10 * KVR_NS_PER_MS);
    }
    nats_ReleaseThreadMemory();
    return NULL;
}

#define LINK_SUBS 9 /* the link's subscriptions */

/* The link's subscriptions (NULL before they are made) into out; returns LINK_SUBS. */
static size_t link_subs(const struct kvr_wk_link *l, natsSubscription **out)
{
    natsSubscription *all[LINK_SUBS] = {l->sub_gen,    l->sub_rebind, l->sub_cancel,
                                        l->sub_hello,  l->sub_hb,     l->sub_srv[0],
                                        l->sub_srv[1], l->sub_srv[2], l->sub_announce};
    memcpy(out, all, sizeof all);
    return LINK_SUBS;
}

/* --- the operators' endpoints (on the HTTP server's threads) ------------------------------- */

/* The NATS families: reconnects per connection, messages the library dropped (0 until live). */
static void nats_metrics(struct kvr_wk_link *l, struct kvr_prom *p)
{
    bool live = atomic_load_explicit(&l->live, memory_order_acquire);
    kvr_prom_family(p, "kvworker_nats_reconnects_total", KVR_PROM_COUNTER,
                    "Reconnects of each NATS connection (in: cancels, hellos, $SRV; out: "
                    "forwards, tokens, events).");
    kvr_prom_u64(p, &(struct kvr_prom_label){"connection", "in"}, 1,
                 live ? kvr_nats_reconnects(l->nc_in) : 0);
    kvr_prom_u64(p, &(struct kvr_prom_label){"connection", "out"}, 1,
                 live ? kvr_nats_reconnects(l->nc_out) : 0);
    natsSubscription *subs[LINK_SUBS];
    uint64_t dropped = live ? kvr_nats_dropped(subs, link_subs(l, subs)) : 0;
    kvr_prom_counter(p, "kvworker_nats_dropped_messages_total",
                     "Messages the client library dropped (a slow consumer's pending limit).",
                     dropped);
}

/* Both connections made and connected, else false with why. */
static bool links_up(struct kvr_wk_link *l, char *why, size_t len)
{
    if (!atomic_load_explicit(&l->live, memory_order_acquire)) {
        snprintf(why, len, "starting: connecting to NATS, asking whether its id is free");
        return false;
    }
    bool in = natsConnection_Status(l->nc_in) == NATS_CONN_STATUS_CONNECTED;
    bool out = natsConnection_Status(l->nc_out) == NATS_CONN_STATUS_CONNECTED;
    if (!in || !out)
        snprintf(why, len, "NATS connection %s down (reconnecting)",
                 !in && !out ? "in and out"
                 : !in       ? "in"
                             : "out");
    return in && out;
}

static bool http_ready(void *ctx, char *why, size_t len)
{
    struct kvr_wk_link *l = ctx;
    return links_up(l, why, len) && kvr_wk_ready(l->w, why, len);
}

static kvr_status http_metrics(void *ctx, struct kvr_buf *out)
{
    struct kvr_wk_link *l = ctx;
    struct kvr_prom p;
    kvr_prom_begin(&p, out);
    kvr_status st = kvr_wk_metrics(l->w, &p);
    if (st != KVR_OK)
        return st;
    char why[KVR_HTTPD_WHY_MAX];
    kvr_prom_gauge(&p, "kvworker_ready", "1 when /readyz answers ready.",
                   http_ready(l, why, sizeof why) ? 1 : 0);
    nats_metrics(l, &p);
    struct kvr_procstat ps;
    kvr_procstat_read(&ps);
    return kvr_prom_process(&p, &ps);
}

static kvr_status start_http(struct kvr_wk_link *l)
{
    struct kvr_httpd_hooks h = {.metrics = http_metrics, .readyz = http_ready, .ctx = l};
    return kvr_httpd_serve(l->w->cfg->metrics_addr, &h, &l->http);
}

/* --- connections ----------------------------------------------------------------------------- */

/* The outgoing connection's cut and return, on the library's callback thread. */
static void on_out_cut(void *ctx)
{
    struct kvr_wk_link *l = ctx;
    if (l->w)
        kvr_worker_on_disconnected(l->w);
}

static void on_out_back(void *ctx)
{
    struct kvr_wk_link *l = ctx;
    if (l->w)
        kvr_worker_on_reconnected(l->w);
    atomic_store(&l->back, true); /* after: a beat sent before the worker knew would be dropped */
}

static void on_in_back(void *ctx)
{
    struct kvr_wk_link *l = ctx;
    atomic_store(&l->back, true);
}

/* Does another process serve this id? Any answer to the hello says so; no responders (at once)
 * or silence says not. */
static kvr_status ask_hello(struct kvr_wk_link *l)
{
    natsMsg *m = NULL;
    natsStatus s =
        natsConnection_Request(&m, l->nc_out, l->w->subj_hello, NULL, 0, KVR_WK_HELLO_TIMEOUT_MS);
    if (s == NATS_NO_RESPONDERS || s == NATS_TIMEOUT)
        return KVR_OK;
    if (s != NATS_OK) {
        kvr_log(KVR_LOG_ERROR, "hello_failed", "subject=%s error=\"%s\"", l->w->subj_hello,
                natsStatus_GetText(s));
        return kvr_nats_status(s);
    }
    struct kvr_wire_heartbeat h = {0};
    kvr_wire_decode_heartbeat(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), &h);
    kvr_log(KVR_LOG_ERROR, "worker_id_clash",
            "id=%" PRIu64 " other_instance=%016" PRIx64 " other_started_ns=%" PRIu64
            " action=refuse_to_start",
            l->w->cfg->id, h.instance, h.started_ns);
    kvr_wire_heartbeat_free(&h);
    natsMsg_Destroy(m);
    return KVR_ERR_WORKER_ID_CLASH;
}

/* The forwards waiting in the library's queue of the generate subscription: received, not
 * delivered yet (w->queued, read under w->mu for each heartbeat). */
static uint32_t queued_forwards(void *ctx)
{
    const struct kvr_wk_link *l = ctx;
    int msgs = 0;
    if (natsSubscription_GetPending(l->sub_gen, &msgs, NULL) != NATS_OK || msgs < 0)
        return 0;
    return (uint32_t)msgs;
}

/* Subscribe cb to subject on nc (with kvr_pending_bound when unlimited, else nats.c's limits),
 * its completion tracked for the teardown (kvr_settle). */
static natsStatus sub_async(struct kvr_wk_link *l, natsSubscription **sub, natsConnection *nc,
                            const char *subject, natsMsgHandler cb, bool unlimited)
{
    natsStatus s = kvr_settle_subscribe(l->settle, sub, nc, subject, NULL, cb, l);
    if (s == NATS_OK && unlimited)
        s = kvr_pending_bound(*sub);
    return s;
}

static kvr_status subscribe(struct kvr_wk_link *l)
{
    struct kvr_worker *w = l->w;
    l->settle = kvr_settle_new();
    if (!l->settle)
        return KVR_ERR_NOMEM;
    /* the clash watch and the cancels before the first request can arrive */
    natsStatus s = sub_async(l, &l->sub_hb, l->nc_in, w->subj_hb, on_heartbeat, false);
    if (s == NATS_OK)
        s = sub_async(l, &l->sub_hello, l->nc_in, w->subj_hello, on_hello, false);
    if (s == NATS_OK)
        s = sub_async(l, &l->sub_cancel, l->nc_in, w->subj_cancel, on_cancel, true);
    if (s == NATS_OK)
        s = sub_async(l, &l->sub_announce, l->nc_in, w->subj_announce, on_announce, false);
    /* forwards (and rebinds) on the connection the tokens go out on: a server that lets workers
     * answer clients by response permission only grants it to the connection that received the
     * client's reply subject */
    if (s == NATS_OK)
        s = sub_async(l, &l->sub_gen, l->nc_out, w->subj_gen, on_generate, true);
    if (s == NATS_OK)
        s = sub_async(l, &l->sub_rebind, l->nc_out, w->subj_rebind, on_rebind, true);
    if (s == NATS_OK)
        s = kvr_flush_subscribed(l->nc_out);
    char srv[3][256];
    kvr_service_subjects(&l->svc, srv);
    for (int i = 0; i < 3 && s == NATS_OK; i++)
        s = sub_async(l, &l->sub_srv[i], l->nc_in, srv[i], on_srv, false);
    if (s == NATS_OK)
        s = kvr_flush_subscribed(l->nc_in);
    if (s != NATS_OK)
        kvr_log(KVR_LOG_ERROR, "subscribe_failed", "subject=%s error=\"%s\"", w->subj_gen,
                natsStatus_GetText(s));
    return kvr_nats_status(s);
}

kvr_status kvr_wk_link_start(struct kvr_wk_link *l, struct kvr_worker *w)
{
    memset(l, 0, sizeof *l);
    l->w = w;
    char id[32];
    snprintf(id, sizeof id, "%" PRIu64, w->cfg->id);
    kvr_service_init(&l->svc, "kvworker", "0.2.0", "simulated LLM inference worker", "worker_id",
                     id);
    kvr_service_add(&l->svc, "generate", w->subj_gen, NULL, &w->generate);
    snprintf(l->name_in, sizeof l->name_in, "kvworker-%" PRIu64 "-in", w->cfg->id);
    snprintf(l->name_out, sizeof l->name_out, "kvworker-%" PRIu64, w->cfg->id);
    l->hooks_out = (struct kvr_conn_hooks){l->name_out, on_out_cut, on_out_back, l};
    l->hooks_in = (struct kvr_conn_hooks){l->name_in, NULL, on_in_back, l};
    kvr_status st = start_http(l);
    if (st == KVR_OK)
        st = kvr_connect_hooked(&w->cfg->net, &l->hooks_in, &l->nc_in);
    if (st == KVR_OK)
        st = kvr_connect_hooked(&w->cfg->net, &l->hooks_out, &l->nc_out);
    if (st != KVR_OK)
        return st;
    struct kvr_sink sink = kvr_nats_sink(l->nc_out);
    w->sink.publish = sink.publish; /* not the counter: /metrics may read it already */
    w->sink.ctx = sink.ctx;
    if ((st = ask_hello(l)) != KVR_OK || (st = subscribe(l)) != KVR_OK)
        return st;
    pthread_mutex_lock(&w->mu);
    w->serving = true;
    w->queued = queued_forwards;
    w->queued_ctx = l;
    pthread_mutex_unlock(&w->mu);
    atomic_store_explicit(&l->live, true, memory_order_release);
    if (pthread_create(&l->engine, NULL, engine_thread, l))
        return KVR_ERR_NOMEM;
    if (pthread_create(&l->heartbeat, NULL, heartbeat_thread, l)) {
        kvr_worker_stop(w);
        pthread_join(l->engine, NULL);
        return KVR_ERR_NOMEM;
    }
    l->threads = true;
    return KVR_OK;
}

void kvr_wk_link_drain(struct kvr_wk_link *l)
{
    /* routers first hear it is leaving, while what they send meanwhile is still served: the
     * subscription drained at once left the forwards of that moment to no one (each placed again
     * only by a reconcile, ~1.5 s later) */
    kvr_worker_set_draining(l->w, false);
    if (connected(l)) {
        kvr_worker_heartbeat(l->w);
        kvr_sleep_ns(KVR_WK_LEAVE_NS);
    }
    /* then the subscription goes, and what it still delivers is served: the forwards waiting in
     * its queue were sent before the routers heard (a worker behind on its messages has seconds
     * of them), and refused they ended their clients' streams with ERR_SHUTDOWN. Refused only
     * after it (a drain that ran out of time) */
    natsSubscription_Drain(l->sub_gen);
    natsSubscription_WaitForDrainCompletion(l->sub_gen, 5000);
    kvr_worker_set_draining(l->w, true);
    if (connected(l))
        kvr_worker_heartbeat(l->w); /* routers stop sending here */
    uint64_t deadline = kvr_now_ns() + l->w->cfg->drain_timeout_ns;
    uint32_t left;
    /* the requests held, and the repeat after a cut (kvr_worker_held); an outgoing connection
     * closed for good carries nothing more */
    while ((left = kvr_worker_held(l->w)) && kvr_now_ns() <= deadline &&
           !kvr_worker_clashed(l->w) && !natsConnection_IsClosed(l->nc_out))
        kvr_sleep_ns(20 * KVR_NS_PER_MS);
    if (left) { /* what is still held ends now, told: else its clients heard nothing from here */
        kvr_log(KVR_LOG_WARN, "drain_timeout", "requests_left=%u", left);
        kvr_worker_cut_held(l->w);
    }
    kvr_worker_flush(l->w);
}

bool kvr_wk_link_close(struct kvr_wk_link *l)
{
    kvr_httpd_stop(l->http); /* its hooks read the worker and the connections */
    l->http = NULL;
    if (l->threads) {
        kvr_worker_stop(l->w);
        pthread_join(l->engine, NULL);
        pthread_join(l->heartbeat, NULL);
    }
    /* no delivery from here on: a handler may still be running (or start once more), and it
     * reads l, w and w's engine, so it is waited out before the engine closes */
    natsSubscription *subs[LINK_SUBS];
    size_t n = link_subs(l, subs);
    if (!kvr_settle_close(l->settle, subs, n))
        return false;
    if (l->w) {
        pthread_mutex_lock(&l->w->mu);
        l->w->queued = NULL; /* its subscriptions go */
        pthread_mutex_unlock(&l->w->mu);
        kvr_worker_close_engine(l->w);
        kvr_worker_flush(l->w);
    }
    if (l->nc_out)
        natsConnection_FlushTimeout(l->nc_out, 2000);
    for (size_t i = 0; i < n; i++)
        natsSubscription_Destroy(subs[i]);
    kvr_conn_destroy(l->nc_in);
    kvr_conn_destroy(l->nc_out);
    memset(l, 0, sizeof *l);
    return true;
}
