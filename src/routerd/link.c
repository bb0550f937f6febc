/*
 * The router daemon's NATS link.
 */
#define _DEFAULT_SOURCE
#include "link.h"

#include <string.h>

#include "api.h"
#include "clock.h"
#include "events.h"
#include "fleet.h"
#include "intake.h"
#include "log.h"
#include "settle.h"
#include "sync.h"
#include "timer.h"
#include "util.h"

#define DATA(msg) natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg)

static void on_select(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    struct kvr_link *l = ctx;
    kvr_intake_select(l->rd, natsMsg_GetReply(msg), DATA(msg));
    natsMsg_Destroy(msg);
}

static void on_cancel(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    struct kvr_link *l = ctx;
    kvr_intake_cancel(l->rd, DATA(msg));
    natsMsg_Destroy(msg);
}

/* Tests only (--test-stall-ms): <prefix>.<ns>.ev.stall holds the events' handler, not the state
 * lock, as a long burst of KV events would: what comes meanwhile waits in its queue. */
static bool stall_events(struct kvr_link *l, const char *subject)
{
    const struct kvr_rd *rd = l->rd;
    size_t k = strlen(rd->subj_ev);
    if (!rd->cfg->test_stall_ns || strncmp(subject, rd->subj_ev, k) || strcmp(subject + k, "stall"))
        return false;
    kvr_log(KVR_LOG_WARN, "test_stall_events", "ms=%llu",
            (unsigned long long)(rd->cfg->test_stall_ns / KVR_NS_PER_MS));
    kvr_sleep_ns(rd->cfg->test_stall_ns);
    return true;
}

/*
 * The loop thread's messages are destroyed in batches: nats.c frees a message on its collector
 * thread, which it wakes for the first message of each batch, a context switch per message when
 * they come one by one; and while the collector runs, each message handed over contends for its
 * lock. Held until KVR_LINK_DEAD_MAX are (or KVR_LINK_DEAD_BYTES of payload), or a tick has
 * passed. 1,024 rather than 64: 0.76-0.83x the router's CPU per request, 0.4x its context
 * switches (docs/benchmarks.md); the payload bound holds the memory where it was.
 */
static void bury_all(struct kvr_link *l)
{
    for (uint32_t i = 0; i < l->ndead; i++)
        natsMsg_Destroy(l->dead[i]);
    l->ndead = 0;
    l->dead_bytes = 0;
}

static void bury(struct kvr_link *l, natsMsg *msg)
{
    if (!l->ndead)
        l->dead_since = kvr_now_ns();
    l->dead[l->ndead++] = msg;
    l->dead_bytes += (size_t)natsMsg_GetDataLength(msg);
    if (l->ndead == KVR_LINK_DEAD_MAX || l->dead_bytes >= KVR_LINK_DEAD_BYTES)
        bury_all(l);
}

/*
 * The next message queued on sub, or NULL when none: asks how many are queued before taking one,
 * as nats.c 3.4.1's NextMsg on an empty queue formats a timeout into the thread's error stack
 * (about 2,800 instructions; two a round made 12 % of the router's instructions under load).
 */
static natsMsg *next(natsSubscription *sub)
{
    int queued = 0;
    natsMsg *msg = NULL;
    if (!sub || natsSubscription_GetPending(sub, &queued, NULL) != NATS_OK || queued <= 0 ||
        natsSubscription_NextMsg(&msg, sub, 0) != NATS_OK)
        return NULL;
    return msg;
}

/* The loop thread, after each read: the generates and the events it parsed (queues of ours, so
 * no waiting). */
static void take(void *ctx)
{
    struct kvr_link *l = ctx;
    natsSubscription *gen = atomic_load_explicit(&l->gen_taken, memory_order_acquire);
    natsSubscription *ev = atomic_load_explicit(&l->ev_taken, memory_order_acquire);
    natsMsg *msg;
    while ((msg = next(gen))) {
        kvr_intake_generate(l->rd, natsMsg_GetReply(msg), DATA(msg));
        bury(l, msg);
    }
    while ((msg = next(ev))) {
        if (!stall_events(l, natsMsg_GetSubject(msg)))
            kvr_events_on_message(l->rd, natsMsg_GetSubject(msg), DATA(msg));
        bury(l, msg);
    }
    if (l->ndead && kvr_now_ns() - l->dead_since >= l->rd->cfg->tick_ns)
        bury_all(l);
}

static void on_gossip(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    struct kvr_link *l = ctx;
    kvr_fleet_on_gossip(l->rd, natsMsg_GetSubject(msg), DATA(msg));
    natsMsg_Destroy(msg);
    kvr_backlog_done(&l->gossip_backlog);
}

/* Tests only (--test-stall-ms): hold the state mutex, as a handler stuck inside it would. */
static void on_stall(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    struct kvr_link *l = ctx;
    natsMsg_Destroy(msg);
    pthread_mutex_lock(&l->rd->mu);
    kvr_log(KVR_LOG_WARN, "test_stall", "ms=%llu",
            (unsigned long long)(l->rd->cfg->test_stall_ns / KVR_NS_PER_MS));
    kvr_sleep_ns(l->rd->cfg->test_stall_ns);
    pthread_mutex_unlock(&l->rd->mu);
}

static void on_page(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    struct kvr_link *l = ctx;
    kvr_sync_on_page(l->rd, DATA(msg));
    natsMsg_Destroy(msg);
}

static void on_sync(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    struct kvr_link *l = ctx;
    kvr_sync_on_request(l->rd, natsMsg_GetReply(msg), DATA(msg));
    natsMsg_Destroy(msg);
}

static void on_lookup(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    struct kvr_link *l = ctx;
    kvr_sync_on_lookup(l->rd, natsMsg_GetReply(msg), DATA(msg));
    natsMsg_Destroy(msg);
}

static void on_digest(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    struct kvr_link *l = ctx;
    kvr_api_on_digest(l->rd, natsMsg_GetReply(msg));
    natsMsg_Destroy(msg);
}

static void on_srv(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    struct kvr_link *l = ctx;
    kvr_api_on_srv(l->rd, &l->svc, natsMsg_GetSubject(msg), natsMsg_GetReply(msg));
    natsMsg_Destroy(msg);
}

kvr_status kvr_link_connect(struct kvr_link *l, struct kvr_rd *rd)
{
    memset(l, 0, sizeof *l);
    l->rd = rd;
    snprintf(l->name_req, sizeof l->name_req, "kvrouter-%s", rd->cfg->id);
    snprintf(l->name_ev, sizeof l->name_ev, "kvrouter-%s-events", rd->cfg->id);
    /* it ticks as the timer does: an idle loop says each tick that it has heard everything */
    kvr_status st = kvr_loop_start(&l->loop, rd->cfg->tick_ns, take, l);
    if (st == KVR_OK)
        st = kvr_connect_loop(&rd->cfg->net, l->name_req, &l->loop, &l->nc_req);
    if (st == KVR_OK)
        st = kvr_connect_loop(&rd->cfg->net, l->name_ev, &l->loop, &l->nc_ev);
    if (st == KVR_OK) {
        struct kvr_sink sink = kvr_nats_sink(l->nc_req);
        rd->sink.publish = sink.publish; /* not the counter: /metrics may read it already */
        rd->sink.ctx = sink.ctx;
        /* a request is forwarded in a message of the same server: it must fit with the wrapper */
        /* what the decoders (a worker's takes the forward whole) and the server both take */
        int64_t payload = natsConnection_GetMaxPayload(l->nc_req);
        uint64_t cap = kvr_wire_request_cap(&rd->lim);
        uint64_t max = payload > 0 && (uint64_t)payload < cap ? (uint64_t)payload : cap;
        rd->max_request_bytes =
            max > KVR_WIRE_FORWARD_ENVELOPE ? max - KVR_WIRE_FORWARD_ENVELOPE : 1;
    }
    kvr_api_init(&l->svc, rd);
    return st;
}

/* Subscribe (queue group when queue is not NULL) with kvr_pending_bound, its completion tracked
 * for the close (kvr_settle). */
static natsStatus subscribe(natsSubscription **sub, natsConnection *nc, const char *subject,
                            const char *queue, natsMsgHandler cb, struct kvr_link *l)
{
    if (!l->settle && !(l->settle = kvr_settle_new()))
        return NATS_NO_MEMORY;
    natsStatus s = kvr_settle_subscribe(l->settle, sub, nc, subject, queue, cb, l);
    if (s == NATS_OK)
        s = kvr_pending_bound(*sub);
    return s;
}

/* The synchronous sub, just made, with kvr_pending_bound, for the loop thread to take from
 * (through *slot): what came since waits in its queue, and the loop takes it now. */
static natsStatus loop_takes(struct kvr_link *l, natsSubscription *sub,
                             _Atomic(natsSubscription *) *slot)
{
    natsStatus s = kvr_pending_bound(sub);
    if (s == NATS_OK) {
        atomic_store_explicit(slot, sub, memory_order_release);
        kvr_loop_wake(&l->loop);
    }
    return s;
}

static kvr_status failed(natsStatus s, const char *what)
{
    if (s != NATS_OK)
        kvr_log(KVR_LOG_ERROR, "subscribe_failed", "what=%s error=\"%s\"", what,
                natsStatus_GetText(s));
    return kvr_nats_status(s);
}

kvr_status kvr_link_listen(struct kvr_link *l)
{
    const struct kvr_rd_config *c = l->rd->cfg;
    const struct kvr_fleet *g = l->rd->fleet;
    char subj[256];
    kvr_subject(subj, sizeof subj, c->net.prefix, c->net.ns, "ev.>");
    /* nothing had reached it before it existed: applied up to now (the timer starts later) */
    kvr_backlog_start(&l->gossip_backlog, kvr_now_ns());
    natsStatus s = natsConnection_SubscribeSync(&l->sub_ev, l->nc_ev, subj);
    if (s == NATS_OK)
        s = loop_takes(l, l->sub_ev, &l->ev_taken);
    if (s == NATS_OK)
        s = subscribe(&l->sub_gossip, l->nc_ev, g->subj_gossip_all, NULL, on_gossip, l);
    if (s == NATS_OK)
        s = subscribe(&l->sub_pages, l->nc_ev, g->subj_pages, NULL, on_page, l);
    if (s == NATS_OK)
        s = subscribe(&l->sub_sync, l->nc_ev, g->subj_sync, NULL, on_sync, l);
    if (s == NATS_OK)
        s = subscribe(&l->sub_lookup, l->nc_ev, g->subj_lookup, NULL, on_lookup, l);
    if (s == NATS_OK)
        s = subscribe(&l->sub_digest, l->nc_req, g->subj_digest, NULL, on_digest, l);
    kvr_subject(subj, sizeof subj, c->net.prefix, c->net.ns, "cancel");
    if (s == NATS_OK) /* every router: the one that holds the request acts */
        s = subscribe(&l->sub_cancel, l->nc_req, subj, NULL, on_cancel, l);
    kvr_subject(subj, sizeof subj, c->net.prefix, c->net.ns, "router.stall");
    if (s == NATS_OK && c->test_stall_ns)
        s = subscribe(&l->sub_stall, l->nc_req, subj, NULL, on_stall, l);
    if (s == NATS_OK)
        s = kvr_flush_subscribed(l->nc_ev);
    if (s == NATS_OK)
        s = kvr_flush_subscribed(l->nc_req);
    if (s == NATS_OK) { /* listening: the workers announce themselves now, not at their next beat */
        pthread_mutex_lock(&l->rd->mu);
        kvr_timer_announce(l->rd, kvr_now_ns());
        pthread_mutex_unlock(&l->rd->mu);
        kvr_rd_flush(l->rd);
    }
    return failed(s, "events");
}

kvr_status kvr_link_serve(struct kvr_link *l)
{
    natsStatus s =
        natsConnection_QueueSubscribeSync(&l->sub_gen, l->nc_req, l->svc.ep[0].subject, "kvrouter");
    if (s == NATS_OK)
        s = loop_takes(l, l->sub_gen, &l->gen_taken);
    if (s == NATS_OK)
        s = subscribe(&l->sub_sel, l->nc_req, l->svc.ep[1].subject, "kvrouter", on_select, l);
    char srv[3][256];
    kvr_service_subjects(&l->svc, srv);
    for (int i = 0; i < 3 && s == NATS_OK; i++)
        s = subscribe(&l->sub_srv[i], l->nc_req, srv[i], NULL, on_srv, l);
    if (s == NATS_OK)
        s = kvr_flush_subscribed(l->nc_req);
    if (s == NATS_OK) {
        pthread_mutex_lock(&l->rd->mu);
        l->rd->serving = true;
        pthread_mutex_unlock(&l->rd->mu);
        atomic_store_explicit(&l->live, true, memory_order_release);
    }
    return failed(s, "requests");
}

/* Timer thread: whether the events connection was cut since the last look. */
static bool events_were_cut(struct kvr_link *l)
{
    uint64_t reconnects = 0;
    if (!l->stats || natsConnection_GetStats(l->nc_ev, l->stats) != NATS_OK ||
        natsStatistics_GetCounts(l->stats, NULL, NULL, NULL, NULL, &reconnects) != NATS_OK)
        return false;
    bool cut = reconnects != l->reconnects;
    l->reconnects = reconnects;
    return cut;
}

/* Timer thread: up to when what reached sub is applied (backlog.h); 0 when it cannot tell. */
static uint64_t heard(struct kvr_backlog *b, natsSubscription *sub, uint64_t now)
{
    int pending = 0;
    int64_t delivered = 0;
    if (!sub ||
        natsSubscription_GetStats(sub, &pending, NULL, NULL, NULL, &delivered, NULL) != NATS_OK)
        return 0;
    return kvr_backlog_note(b, now, (uint64_t)delivered + (uint64_t)pending);
}

static void *timer_thread(void *arg)
{
    struct kvr_link *l = arg;
    events_were_cut(l);
    for (;;) {
        kvr_sleep_ns(l->rd->cfg->tick_ns);
        pthread_mutex_lock(&l->rd->mu);
        bool stop = l->stopping;
        pthread_mutex_unlock(&l->rd->mu);
        if (stop)
            break;
        uint64_t now = kvr_now_ns();
        struct kvr_timer_seen seen = {
            .events_up = natsConnection_Status(l->nc_ev) == NATS_CONN_STATUS_CONNECTED,
            .events_cut = events_were_cut(l),
            .events_heard = kvr_loop_heard(&l->loop),
            .gossip_heard = heard(&l->gossip_backlog, l->sub_gossip, now),
        };
        kvr_timer_tick_seen(l->rd, now, &seen);
    }
    nats_ReleaseThreadMemory();
    return NULL;
}

kvr_status kvr_link_start_timer(struct kvr_link *l)
{
    if (natsStatistics_Create(&l->stats) != NATS_OK)
        return KVR_ERR_NOMEM;
    if (pthread_create(&l->timer, NULL, timer_thread, l))
        return KVR_ERR_NOMEM;
    l->timer_running = true;
    return KVR_OK;
}

void kvr_link_stop_timer(struct kvr_link *l)
{
    if (!l->timer_running)
        return;
    pthread_mutex_lock(&l->rd->mu);
    l->stopping = true;
    pthread_mutex_unlock(&l->rd->mu);
    pthread_join(l->timer, NULL);
    l->timer_running = false;
}

void kvr_link_drain_requests(struct kvr_link *l, int timeout_ms)
{
    natsSubscription *subs[] = {l->sub_gen, l->sub_sel};
    for (int i = 0; i < 2; i++)
        if (subs[i])
            natsSubscription_Drain(subs[i]);
    for (int i = 0; i < 2; i++)
        if (subs[i])
            natsSubscription_WaitForDrainCompletion(subs[i], timeout_ms);
}

void kvr_link_metrics(struct kvr_link *l, struct kvr_prom *p)
{
    /* the connections and subscriptions are made on the main thread: read once it has */
    bool live = atomic_load_explicit(&l->live, memory_order_acquire);
    kvr_prom_family(p, "kvrouter_nats_reconnects_total", KVR_PROM_COUNTER,
                    "Reconnects of each NATS connection.");
    kvr_prom_u64(p, &(struct kvr_prom_label){"connection", "requests"}, 1,
                 live ? kvr_nats_reconnects(l->nc_req) : 0);
    kvr_prom_u64(p, &(struct kvr_prom_label){"connection", "events"}, 1,
                 live ? kvr_nats_reconnects(l->nc_ev) : 0);
    natsSubscription *subs[] = {l->sub_ev,   l->sub_gossip, l->sub_pages,
                                l->sub_sync, l->sub_lookup, l->sub_digest,
                                l->sub_gen,  l->sub_sel,    l->sub_cancel};
    kvr_prom_counter(p, "kvrouter_nats_dropped_messages_total",
                     "Messages the client library dropped (a slow consumer's pending limit).",
                     live ? kvr_nats_dropped(subs, sizeof subs / sizeof subs[0]) : 0);
}

bool kvr_link_close(struct kvr_link *l)
{
    if (l->nc_req)
        natsConnection_FlushTimeout(l->nc_req, 2000); /* the loop reads its PONG */
    kvr_loop_stop(&l->loop);                          /* before its subscriptions go */
    bury_all(l);                                      /* what it handled last */
    natsSubscription *subs[] = {l->sub_ev,     l->sub_gossip, l->sub_pages,  l->sub_sync,
                                l->sub_lookup, l->sub_digest, l->sub_gen,    l->sub_sel,
                                l->sub_cancel, l->sub_srv[0], l->sub_srv[1], l->sub_srv[2],
                                l->sub_stall};
    size_t n = sizeof subs / sizeof subs[0];
    /* a handler may still be running (or start once more): wait it out, as it reads l and rd */
    if (!kvr_settle_close(l->settle, subs, n))
        return false;
    for (size_t i = 0; i < n; i++)
        natsSubscription_Destroy(subs[i]);
    kvr_conn_destroy(l->nc_req);
    kvr_conn_destroy(l->nc_ev);
    kvr_loop_free(&l->loop); /* once its connections are gone */
    natsStatistics_Destroy(l->stats);
    memset(l, 0, sizeof *l);
    return true;
}
