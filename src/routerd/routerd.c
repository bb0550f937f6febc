/*
 * kvr_routerd: the router daemon's lifecycle.
 */
#define _DEFAULT_SOURCE
#include "routerd.h"

#include <inttypes.h>
#include <stdlib.h>

#include "clock.h"
#include "fleet.h"
#include "httpd.h"
#include "link.h"
#include "log.h"
#include "metrics.h"
#include "place.h"
#include "procstat.h"
#include "sync.h"

struct kvr_routerd {
    struct kvr_rd rd;
    struct kvr_link link;
    struct kvr_httpd *http; /* --metrics-addr; NULL: none */
};

static kvr_status no_sink(void *ctx, const struct kvr_outmsg *m)
{
    return KVR_ERR_IO; /* before the connection exists nothing can be sent */
}

struct kvr_routerd *kvr_routerd_create(const struct kvr_rd_config *cfg, kvr_status *st)
{
    struct kvr_routerd *d = calloc(1, sizeof *d);
    *st = d ? kvr_rd_init(&d->rd, cfg, (struct kvr_sink){.publish = no_sink, .ctx = NULL})
            : KVR_ERR_NOMEM;
    if (*st == KVR_OK)
        *st = kvr_fleet_create(&d->rd);
    if (*st == KVR_OK)
        d->rd.forward_failed = kvr_place_forward_failed;
    if (*st != KVR_OK && d) {
        kvr_fleet_destroy(&d->rd);
        kvr_rd_free(&d->rd);
        free(d);
        return NULL;
    }
    return d;
}

/*
 * Learn the fleet before taking requests: a router that knows no worker yet would answer "no
 * workers" while its peers could serve. Workers and peers announce themselves periodically:
 * listen one announcement period past the first worker (at most the warm-up).
 */
static void warm_up(struct kvr_rd *rd)
{
    uint64_t end = kvr_now_ns() + rd->cfg->warmup_ns, seen_at = 0;
    while (kvr_now_ns() < end) {
        pthread_mutex_lock(&rd->mu);
        struct kvr_router_stats st;
        kvr_router_stats(rd->core, &st);
        uint64_t hb = (uint64_t)rd->hb_interval_ms * KVR_NS_PER_MS;
        uint64_t period = hb > rd->cfg->hello_ns ? hb : rd->cfg->hello_ns;
        pthread_mutex_unlock(&rd->mu);
        if (st.workers && !seen_at)
            seen_at = kvr_now_ns();
        if (seen_at && kvr_now_ns() > seen_at + period * 11 / 10)
            break;
        kvr_sleep_ns(10 * KVR_NS_PER_MS);
    }
}

/* --- the operators' endpoints (on the HTTP server's threads) ------------------------------- */

static kvr_status http_metrics(void *ctx, struct kvr_buf *out)
{
    struct kvr_routerd *d = ctx;
    struct kvr_prom p;
    kvr_prom_begin(&p, out);
    kvr_status st = kvr_rd_metrics(&d->rd, &p);
    if (st != KVR_OK)
        return st;
    char why[160];
    kvr_prom_gauge(&p, "kvrouter_ready", "1 when /readyz answers ready.",
                   kvr_rd_ready(&d->rd, why, sizeof why) ? 1 : 0);
    kvr_link_metrics(&d->link, &p);
    struct kvr_procstat ps;
    kvr_procstat_read(&ps);
    return kvr_prom_process(&p, &ps);
}

static bool http_ready(void *ctx, char *why, size_t len)
{
    struct kvr_routerd *d = ctx;
    return kvr_rd_ready(&d->rd, why, len);
}

static kvr_status start_http(struct kvr_routerd *d)
{
    struct kvr_httpd_hooks h = {.metrics = http_metrics, .readyz = http_ready, .ctx = d};
    return kvr_httpd_serve(d->rd.cfg->metrics_addr, &h, &d->http);
}

kvr_status kvr_routerd_start(struct kvr_routerd *d)
{
    kvr_status st = start_http(d);
    if (st == KVR_OK)
        st = kvr_link_connect(&d->link, &d->rd);
    if (st == KVR_OK)
        st = kvr_link_listen(&d->link);
    if (st != KVR_OK)
        return st;
    warm_up(&d->rd);
    kvr_sync_start(&d->rd);
    st = kvr_link_serve(&d->link);
    if (st == KVR_OK)
        st = kvr_link_start_timer(&d->link);
    return st;
}

void kvr_routerd_drain(struct kvr_routerd *d)
{
    struct kvr_rd *rd = &d->rd;
    kvr_link_drain_requests(&d->link, 10000);
    uint64_t deadline = kvr_now_ns() + rd->cfg->drain_timeout_ns;
    for (;;) {
        pthread_mutex_lock(&rd->mu);
        uint32_t waiting = kvr_router_queue_len(rd->core) + rd->pend.nwaiting;
        pthread_mutex_unlock(&rd->mu);
        if (!waiting || kvr_now_ns() > deadline)
            break;
        kvr_sleep_ns(20 * KVR_NS_PER_MS);
    }
    pthread_mutex_lock(&rd->mu);
    kvr_place_refuse_unplaced(rd, KVR_ERR_SHUTDOWN); /* what the drain could not place */
    kvr_place_settle(rd);
    kvr_rd_unlock_flush(rd);
}

bool kvr_routerd_destroy(struct kvr_routerd *d)
{
    if (!d)
        return true;
    kvr_httpd_stop(d->http); /* its hooks read the state and the link */
    kvr_link_stop_timer(&d->link);
    kvr_rd_flush(&d->rd);
    struct kvr_router_stats s;
    pthread_mutex_lock(&d->rd.mu); /* the event stream still delivers until the link closes */
    kvr_router_stats(d->rd.core, &s);
    pthread_mutex_unlock(&d->rd.mu);
    bool settled = kvr_link_close(&d->link);
    kvr_log(KVR_LOG_INFO, "router_stopped",
            "decisions=%" PRIu64 " rejected=%" PRIu64 " inflight_left=%u", s.decisions, s.rejected,
            s.inflight);
    if (!settled)
        return false; /* a handler may still read it all: the exit frees it */
    kvr_fleet_destroy(&d->rd);
    kvr_rd_free(&d->rd);
    free(d);
    return true;
}
