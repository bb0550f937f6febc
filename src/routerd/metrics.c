/*
 * The router's metrics and readiness.
 */
#define _DEFAULT_SOURCE
#include "metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "clock.h"
#include "fleet.h"

/* mu within KVR_RD_LOCK_WAIT_NS, or false. */
static bool lock_soon(struct kvr_rd *rd)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* pthread_mutex_timedlock's clock */
    uint64_t at = (uint64_t)ts.tv_sec * KVR_NS_PER_S + (uint64_t)ts.tv_nsec + KVR_RD_LOCK_WAIT_NS;
    ts = (struct timespec){(time_t)(at / KVR_NS_PER_S), (long)(at % KVR_NS_PER_S)};
    return pthread_mutex_timedlock(&rd->mu, &ts) == 0;
}

/* One endpoint's requests, errors by code and latency. */
static void endpoint(struct kvr_prom *p, const struct kvr_reply *r, int family)
{
    struct kvr_prom_label ep = {"endpoint", r->endpoint};
    if (family == 0) {
        kvr_prom_u64(p, &ep, 1, r->requests);
        return;
    }
    if (family == 2) {
        kvr_prom_histogram(p, &ep, 1, &r->latency);
        return;
    }
    for (int c = 1; c < KVR_REPLY_CODES; c++) {
        if (!r->by_code[c])
            continue;
        struct kvr_prom_label l[2] = {ep, {"code", kvr_status_name((kvr_status)c) + 4}};
        kvr_prom_u64(p, l, 2, r->by_code[c]);
    }
}

static void endpoints(struct kvr_prom *p, const struct kvr_rd *rd)
{
    static const struct {
        const char *name, *help;
        enum kvr_prom_type type;
    } f[3] = {
        {"kvrouter_requests_total", "Requests answered or refused, by endpoint.", KVR_PROM_COUNTER},
        {"kvrouter_errors_total", "Errors by endpoint and ErrorCode (answered or dropped).",
         KVR_PROM_COUNTER},
        {"kvrouter_decision_seconds", "Time to decide and book a request, by endpoint.",
         KVR_PROM_HISTOGRAM},
    };
    for (int i = 0; i < 3; i++) {
        kvr_prom_family(p, f[i].name, f[i].type, f[i].help);
        endpoint(p, &rd->generate, i);
        endpoint(p, &rd->select, i);
    }
}

/* The workers' figures as they stand (under mu): a copy, formatted once mu is released. */
struct worker_views {
    struct kvr_worker_view *v;
    uint32_t n;
};

static kvr_status take_workers(struct worker_views *wv, const struct kvr_rd *rd)
{
    uint32_t n = kvr_router_workers(rd->core, NULL, 0);
    wv->v = n ? malloc(n * sizeof *wv->v) : NULL;
    if (n && !wv->v)
        return KVR_ERR_NOMEM;
    wv->n = kvr_router_workers(rd->core, wv->v, n);
    return KVR_OK;
}

/* Each worker's figures, labelled by its id: without mu (a fleet of 65,536 workers took the
 * decision path's lock ~0.5 s a scrape when they were formatted under it). */
static void workers(struct kvr_prom *p, const struct worker_views *wv)
{
    static const char *const f[][2] = {
        {"kvrouter_worker_active_blocks", "Predicted KV blocks its in-flight requests hold."},
        {"kvrouter_worker_inflight_requests", "Requests booked on it."},
        {"kvrouter_worker_prefill_tokens", "Predicted prompt tokens it has still to prefill."},
        {"kvrouter_worker_capacity_blocks", "KV blocks it announced (0: unknown)."},
        {"kvrouter_worker_kv_usage_ratio", "KV usage it reported, 0 to 1."},
        {"kvrouter_worker_prefill_share_ratio",
         "Predicted share of its time the prefills booked on it take (their rate over "
         "--prefill-window-s); its decodes are priced 1 / (1 - share) slower, the share read as "
         "at most 0.8."},
        {"kvrouter_worker_waiting_requests", "Its queue length, as it reported it."},
        {"kvrouter_worker_draining", "1 while it announces it is shutting down."},
        {"kvrouter_worker_approximate",
         "1 while its engine publishes no KV events: its cache is learnt from decisions."},
    };
    const struct kvr_worker_view *v = wv->v;
    for (size_t k = 0; k < sizeof f / sizeof f[0]; k++) {
        kvr_prom_family(p, f[k][0], KVR_PROM_GAUGE, f[k][1]);
        for (uint32_t i = 0; i < wv->n; i++) {
            char id[24];
            snprintf(id, sizeof id, "%" PRIu64, v[i].id);
            struct kvr_prom_label l = {"worker", id};
            double x[] = {(double)v[i].active_blocks,
                          (double)v[i].inflight,
                          (double)v[i].prefill_tokens,
                          (double)v[i].capacity_blocks,
                          v[i].kv_usage,
                          v[i].prefill_share,
                          (double)v[i].waiting,
                          v[i].draining ? 1.0 : 0.0,
                          v[i].approximate ? 1.0 : 0.0};
            kvr_prom_f64(p, &l, 1, x[k]);
        }
    }
}

static void core(struct kvr_prom *p, const struct kvr_rd *rd)
{
    struct kvr_router_stats s;
    kvr_router_stats(rd->core, &s);
    kvr_prom_counter(p, "kvrouter_decisions_total", "Requests routed and booked here.",
                     s.decisions);
    kvr_prom_counter(p, "kvrouter_queued_total", "Requests that had to wait for a worker.",
                     s.queued);
    kvr_prom_counter(p, "kvrouter_rejected_total", "Requests refused by the core (any reason).",
                     s.rejected);
    kvr_prom_counter(p, "kvrouter_routed_blocks_total",
                     "Prompt blocks of the requests routed here.", s.routed_blocks);
    kvr_prom_counter(
        p, "kvrouter_routed_overlap_blocks_total",
        "Prompt blocks the decisions expected cached on their worker (predicted overlap).",
        s.routed_overlap);
    kvr_prom_gauge(p, "kvrouter_queue_depth", "Requests waiting for a worker.", s.queue_len);
    kvr_prom_gauge(p, "kvrouter_inflight_requests", "Requests in flight, fleet-wide as known here.",
                   s.inflight);
    kvr_prom_gauge(p, "kvrouter_workers", "Workers registered.", s.workers);
    kvr_prom_gauge(p, "kvrouter_active_blocks", "Predicted active KV blocks over all workers.",
                   (double)s.active_blocks);
    kvr_prom_gauge(p, "kvrouter_index_entries", "Worker-block entries in the prefix index.",
                   s.index_entries);
    kvr_prom_gauge(p, "kvrouter_index_max_entries",
                   "Bound on prefix-index entries (--index-max-entries, or from the workers' "
                   "announced capacity).",
                   s.index_max);
    kvr_prom_family(p, "kvrouter_index_pruned_total", KVR_PROM_COUNTER,
                    "Prefix-index entries pruned to keep the bound, by kind (event: blocks the "
                    "engines still hold, lost hits; ttl: approximate-mode guesses).");
    kvr_prom_u64(p, &(struct kvr_prom_label){"kind", "event"}, 1, s.index.pruned_live);
    kvr_prom_u64(p, &(struct kvr_prom_label){"kind", "ttl"}, 1,
                 s.index.pruned - s.index.pruned_live);
    kvr_prom_counter(p, "kvrouter_kv_events_ignored_total",
                     "KV events dropped unapplied: the router is approximate (--approximate).",
                     s.kv_ignored);
    kvr_prom_gauge(p, "kvrouter_memory_bytes", "Heap held by the routing core.",
                   (double)s.memory_bytes);
    kvr_prom_counter(
        p, "kvrouter_completions_total",
        "Requests held here (this router's decisions and its peers') that completed saying "
        "their output (what the own-decode price learns from).",
        s.completions);
    kvr_prom_counter(p, "kvrouter_completion_tokens_total",
                     "Tokens those completions generated (each at most its max_tokens).",
                     s.completion_tokens);
    kvr_prom_counter(p, "kvrouter_completion_limit_tokens_total",
                     "The sum of those completions' max_tokens: tokens over limit is the share "
                     "of max_tokens clients use.",
                     s.completion_limit);
    kvr_prom_counter(p, "kvrouter_bad_events_total",
                     "Worker events dropped as malformed or forged.", rd->ev_errors);
    kvr_prom_counter(p, "kvrouter_kv_events_missed_total",
                     "KV events a worker numbered that never reached this router.",
                     rd->kvseq.missed);
    kvr_prom_counter(p, "kvrouter_kv_resyncs_total",
                     "Snapshots taken from a peer because KV events were missed.", rd->kv_resyncs);
    kvr_prom_counter(p, "kvrouter_worker_announces_asked_total",
                     "Asks that every worker announce itself (at start, after a cut).",
                     rd->announces);
    kvr_prom_counter(p, "kvrouter_event_batches_total",
                     "EventBatch messages applied (workers started with --event-batch-ms).",
                     rd->n.event_batches);
    kvr_prom_counter(p, "kvrouter_batched_events_total",
                     "Lifecycle events that came in EventBatch messages.", rd->n.batched_events);
    kvr_prom_counter(p, "kvrouter_failed_requests_total",
                     "In-flight requests failed by a worker's loss.", s.failed_requests);
    kvr_prom_counter(p, "kvrouter_stalls_total",
                     "Housekeeping ticks far later than due (the router was "
                     "stopped).",
                     rd->stalls);
    kvr_prom_gauge(p, "kvrouter_events_behind_seconds",
                   "How far behind the worker events' handler ran at the last tick: workers are "
                   "judged silent by the events applied, not by the clock.",
                   (double)rd->events_behind_ns / 1e9);
}

/* What the router remembers of requests it no longer holds, forgotten early: a table was full. */
static void recent_evicted(struct kvr_prom *p, const struct kvr_rd *rd)
{
    kvr_prom_family(p, "kvrouter_recent_evicted_total", KVR_PROM_COUNTER,
                    "Keys forgotten before their 60 s because their table was full, by table: "
                    "ended (requests this router held, or answered: a resend of one is routed "
                    "again), dones (dones of requests it did not hold: a peer's, or made up), "
                    "cancels (cancels before their request).");
    kvr_prom_u64(p, &(struct kvr_prom_label){"table", "ended"}, 1, rd->recent.evicted);
    kvr_prom_u64(p, &(struct kvr_prom_label){"table", "dones"}, 1, rd->early_dones.evicted);
    kvr_prom_u64(p, &(struct kvr_prom_label){"table", "cancels"}, 1, rd->early_cancels.evicted);
}

/* Messages lost on their way out: not made (memory), or refused by NATS. */
static void losses(struct kvr_prom *p, struct kvr_rd *rd)
{
    kvr_prom_counter(p, "kvrouter_outbox_dropped_total",
                     "Messages that could not be made (memory).", rd->out.dropped);
    kvr_prom_counter(p, "kvrouter_publish_failed_total",
                     "Messages NATS refused to publish: a connection cut past the client's "
                     "reconnect buffer, or closed, or a payload over the server's limit (a "
                     "forward is placed again or answered; anything else is lost).",
                     atomic_load_explicit(&rd->sink.failed, memory_order_relaxed));
}

static void replication(struct kvr_prom *p, const struct kvr_rd *rd)
{
    const struct kvr_fleet *g = rd->fleet;
    uint64_t now = kvr_now_ns(), alive = 0;
    const struct kvr_peer *q, *tmp;
    HASH_ITER(hh, g->peers, q, tmp) alive += kvr_fleet_peer_alive(rd, q, now);
    kvr_prom_counter(p, "kvrouter_gossip_sent_total", "Decisions gossiped to the peers.", g->sent);
    kvr_prom_counter(p, "kvrouter_gossip_received_total", "Gossip messages received from peers.",
                     g->received);
    kvr_prom_family(p, "kvrouter_gossip_bytes_total", KVR_PROM_COUNTER,
                    "Gossip bytes, by direction.");
    kvr_prom_u64(p, &(struct kvr_prom_label){"direction", "sent"}, 1, g->sent_bytes);
    kvr_prom_u64(p, &(struct kvr_prom_label){"direction", "received"}, 1, g->received_bytes);
    kvr_prom_counter(p, "kvrouter_gossip_bad_total",
                     "Replication messages dropped as malformed or forged.", g->bad);
    kvr_prom_counter(p, "kvrouter_replication_gaps_total",
                     "Gaps seen in peers' decision sequences.", g->gaps);
    kvr_prom_counter(p, "kvrouter_replication_repaired_total", "Decisions recovered by repairs.",
                     g->repaired);
    kvr_prom_counter(p, "kvrouter_replication_import_failed_total",
                     "Peers' decisions not booked here: out of memory, or max_inflight reached.",
                     g->import_failed);
    kvr_prom_counter(p, "kvrouter_replication_resyncs_total", "Snapshots taken again after a cut.",
                     g->resyncs);
    kvr_prom_counter(p, "kvrouter_replication_resyncs_kept_index_total",
                     "Snapshots taken again whose sender's index had holes too: this router kept "
                     "its own index.",
                     g->resyncs_kept_index);
    kvr_prom_counter(p, "kvrouter_replication_kv_events_replayed_total",
                     "KV events applied again after a resync replaced the index: those of the "
                     "second before the ask after any it knows it missed, which the peer may not "
                     "have applied yet.",
                     g->kv_replayed);
    kvr_prom_counter(p, "kvrouter_replication_reconcile_waits_total",
                     "Worker heartbeats that said forwards wait in the worker's queue: no request "
                     "it did not list was judged never to have reached it.",
                     g->reconcile_waits);
    kvr_prom_family(p, "kvrouter_replication_queued_total", KVR_PROM_COUNTER,
                    "Requests queued at their origin, as Queued notices: sent (queued here, and "
                    "released unplaced), heard (a peer's held here, its resends absorbed), "
                    "released (a peer's forgotten as its origin answered it).");
    kvr_prom_u64(p, &(struct kvr_prom_label){"notice", "sent"}, 1, g->queued_sent);
    kvr_prom_u64(p, &(struct kvr_prom_label){"notice", "heard"}, 1, g->queued_heard);
    kvr_prom_u64(p, &(struct kvr_prom_label){"notice", "released"}, 1, g->queued_released);
    kvr_prom_counter(p, "kvrouter_replication_kv_log_dropped_total",
                     "KV events let go from the last second's log before their second passed (its "
                     "8,192 messages or 8 MiB were full, or a message was larger): a resync then "
                     "applies less of that second again.",
                     rd->kvlog.dropped);
    kvr_prom_counter(p, "kvrouter_replication_snapshots_served_partial_total",
                     "Snapshots served while this router's own index had holes (marked so).",
                     g->snapshots_served_partial);
    kvr_prom_counter(p, "kvrouter_replication_snapshots_served_cut_total",
                     "Snapshots whose walk stopped before the end, the state changing under it "
                     "(their last page marked: the index sent has holes).",
                     g->snapshots_served_cut);
    kvr_prom_counter(p, "kvrouter_replication_snapshots_incomplete_total",
                     "Snapshots taken as they came though their index had holes (a walk cut short; "
                     "at start-up, a sender's index with holes): a peer is asked again.",
                     g->snapshots_incomplete);
    kvr_prom_gauge(p, "kvrouter_peers", "Peer routers known.", g->npeers);
    kvr_prom_gauge(p, "kvrouter_peers_alive", "Peer routers heard within 3.5 hellos.",
                   (double)alive);
    kvr_prom_gauge(p, "kvrouter_gossip_behind_seconds",
                   "How far behind the gossip handler ran at the last tick: peers are judged "
                   "silent by the gossip applied, not by the clock.",
                   (double)g->behind_ns / 1e9);
    kvr_prom_gauge(p, "kvrouter_synced", "1 once the start-up snapshot is applied.",
                   g->synced ? 1 : 0);
}

kvr_status kvr_rd_metrics(struct kvr_rd *rd, struct kvr_prom *p)
{
    if (!lock_soon(rd))
        return KVR_ERR_TIMEOUT; /* the decision path is stuck: 503, and /readyz says so */
    endpoints(p, rd);
    core(p, rd);
    recent_evicted(p, rd);
    losses(p, rd);
    if (rd->fleet)
        replication(p, rd);
    struct worker_views wv;
    kvr_status st = take_workers(&wv, rd);
    pthread_mutex_unlock(&rd->mu);
    if (st != KVR_OK)
        return st;
    workers(p, &wv);
    free(wv.v);
    return kvr_prom_end(p);
}

bool kvr_rd_ready(struct kvr_rd *rd, char *why, size_t len)
{
    uint64_t tick = atomic_load_explicit(&rd->alive_ns, memory_order_relaxed), now = kvr_now_ns();
    if (!tick) {
        snprintf(why, len, "starting: connecting, warming up or taking a snapshot");
        return false;
    }
    if (now - tick > KVR_RD_READY_STALL_NS) {
        snprintf(why, len, "the decision path has not run for %" PRIu64 " ms",
                 (uint64_t)((now - tick) / KVR_NS_PER_MS));
        return false;
    }
    if (!lock_soon(rd)) {
        snprintf(why, len, "the state lock is held over %llu ms",
                 (unsigned long long)(KVR_RD_LOCK_WAIT_NS / KVR_NS_PER_MS));
        return false;
    }
    struct kvr_router_stats s;
    kvr_router_stats(rd->core, &s);
    const char *no = !rd->serving                      ? "not serving yet (warming up or draining)"
                     : rd->fleet && !rd->fleet->synced ? "waiting for a peer's snapshot"
                     : !s.workers                      ? "no worker seen"
                                                       : NULL;
    pthread_mutex_unlock(&rd->mu);
    if (no)
        snprintf(why, len, "%s", no);
    return !no;
}
