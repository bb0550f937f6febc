/*
 * Replication: snapshots, repairs and lookups.
 */
#define _DEFAULT_SOURCE
#include "sync.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "events.h"
#include "fleet.h"
#include "log.h"
#include "stats.h"
#include "subject.h"

#define SYNC_PAGE_BYTES (256u * 1024u) /* a page, well under NATS's 1 MB payload */
/* and at most this many records of a kind: a page is applied under the receiver's mutex, which
 * one message should hold for about a millisecond at most (KVR_WIRE_PAGE_ITEMS_MAX) */
#define SYNC_PAGE_ITEMS KVR_WIRE_PAGE_ITEMS_MAX
#define SYNC_TRIES      2
/* a snapshot whose index has holes (its sender's has, or its walk was cut short) is asked again
 * of a peer (any serving peer may be picked: it is random) after this long, this many times in a
 * row at most */
#define SYNC_PARTIAL_RETRY_NS (1000 * KVR_NS_PER_MS)
#define SYNC_PARTIAL_TRIES    3

/* --- serving ------------------------------------------------------------------------------- */

struct pager {
    struct kvr_rd *rd;
    struct kvr_page page;
    struct kvr_buf buf;
    struct kvr_outbox out; /* published after mu is released */
    const char *reply;
    uint64_t token;
    uint32_t records;
    uint32_t pages; /* made */
};

static void pager_flush(struct pager *pg, bool last)
{
    if (kvr_page_encode(&pg->page, &pg->buf, last, pg->token) == KVR_OK) {
        kvr_outbox_add(&pg->out, pg->reply, pg->buf.data, pg->buf.len, KVR_OK);
        pg->rd->fleet->pages_sent++;
        pg->pages++;
    }
}

static void pager_record(void *ctx, const struct kvr_request_record *rec)
{
    struct pager *pg = ctx;
    struct kvr_rd *rd = pg->rd;
    const struct kvr_pending *p = kvr_pending_find(&rd->pend, rec->request_id);
    const char *origin = p && p->origin ? p->origin->id : rd->cfg->id;
    if (kvr_page_add_decision(&pg->page, rec, p ? p->reply : NULL, p ? p->request_id : NULL, origin,
                              p ? p->decided_ns : 0, p ? p->attempts : 0) != KVR_OK)
        return;
    pg->records++;
    if (pg->page.approx > SYNC_PAGE_BYTES || pg->page.ndecisions >= SYNC_PAGE_ITEMS)
        pager_flush(pg, false);
}

static void pager_entry(void *ctx, const struct kvr_index_record *rec)
{
    struct pager *pg = ctx;
    if (kvr_page_add_entry(&pg->page, rec) == KVR_OK &&
        (pg->page.approx > SYNC_PAGE_BYTES || pg->page.nentries >= SYNC_PAGE_ITEMS))
        pager_flush(pg, false);
}

static void pager_key(struct pager *pg, uint64_t key)
{
    struct kvr_request_record rec;
    if (kvr_router_export(pg->rd->core, key, &rec) == KVR_OK)
        pager_record(pg, &rec);
}

/*
 * Under mu: whether this router knows its index misses KV events: its events connection is down,
 * or came back and the catch-up is due; numbered events never came; it is taking a snapshot
 * itself (or never took one), or the last one it took in had holes and it asks again soon. Its
 * snapshots say so: an asker with an index of its own keeps it. Not a retry due because a peer's
 * answer had holes and this router kept its own index: that index is as whole as before, and
 * were it said to have holes, routers that all ask each other again after a server node's restart
 * would each keep their own and never trade (a clean-clone CI run: 127 index entries against 21,
 * three tries each).
 */
static bool index_has_holes(const struct kvr_rd *rd)
{
    const struct kvr_fleet *g = rd->fleet;
    return rd->blind || rd->resync_at || rd->kv_gap || g->syncing || !g->synced ||
           (g->resync_retry_at && g->took_holes);
}

/*
 * A snapshot is served in slices, mu released between them, so a router serving one keeps routing
 * (every in-flight request and every index entry under mu at once held it 39 ms for an index of
 * 131,072 entries, ~300 ns an entry: seconds for a large fleet's). A slice ends at a page made,
 * SNAP_SLICE_ITEMS items visited or SNAP_SLICE_BYTES of records added, so it holds mu about as
 * long as applying one page does at the asker; its pages are published before the next. Between
 * slices the state changes (kvr_router_export_begin says how the walks take it): the asker holds
 * the KV events and hears the decisions that come meanwhile, as with a snapshot taken at once, and
 * refuses a record of a request that ended there. A walk chasing items made active again stops at
 * SNAP_VISITS_FACTOR times what there was at its start (cut): what it had not visited yet is never
 * sent, so its last page says the index has holes, and the asker asks again (answered).
 */
#define SNAP_SLICE_ITEMS   KVR_WIRE_PAGE_ITEMS_MAX
#define SNAP_SLICE_BYTES   (64u * 1024u)
#define SNAP_VISITS_FACTOR 2u

struct snapshot {
    bool requests_done, done, cut;
    uint64_t visits, budget;
};

/* Under mu: start serving a snapshot into pg (s: its walks). */
static void snapshot_begin(struct kvr_rd *rd, struct pager *pg, struct snapshot *s)
{
    struct kvr_router_stats st;
    kvr_router_stats(rd->core, &st);
    pg->page.index_partial = index_has_holes(rd);
    rd->fleet->snapshots_served_partial += pg->page.index_partial;
    kvr_router_export_begin(rd->core);
    *s = (struct snapshot){.budget =
                               SNAP_VISITS_FACTOR * ((uint64_t)st.inflight + st.index_entries + 1)};
}

/* Under mu: one slice of the snapshot into pg. */
static void snapshot_slice(struct kvr_rd *rd, struct pager *pg, struct snapshot *s)
{
    uint32_t pages = pg->pages, items = 0;
    size_t bytes = pg->page.approx;
    uint64_t now = kvr_now_ns();
    while (!s->done && pg->pages == pages && items < SNAP_SLICE_ITEMS &&
           pg->page.approx - bytes < SNAP_SLICE_BYTES) {
        uint32_t n = s->requests_done
                         ? kvr_router_export_index_some(rd->core, pager_entry, pg, now, 1)
                         : kvr_router_export_requests_some(rd->core, pager_record, pg, 1);
        if (!n && s->requests_done)
            s->done = true;
        s->requests_done |= !n;
        items += n;
        if ((s->visits += n) > s->budget)
            s->done = s->cut = true;
    }
    if (s->done) {
        pg->page.index_partial |= s->cut; /* cut: not the whole index */
        rd->fleet->snapshots_served_cut += s->cut;
        pager_flush(pg, true);
        rd->fleet->snapshots_served++;
    }
}

/* Serve the snapshot begun (mu not held): its slices, each published before the next. */
static void snapshot_serve(struct kvr_rd *rd, struct pager *pg, struct snapshot *s)
{
    while (!s->done) {
        pthread_mutex_lock(&rd->mu);
        snapshot_slice(rd, pg, s);
        rd->out.dropped += pg->out.dropped;
        pg->out.dropped = 0;
        pthread_mutex_unlock(&rd->mu);
        kvr_outbox_flush(&pg->out, &rd->sink, NULL);
    }
    if (s->cut)
        kvr_log(KVR_LOG_WARN, "snapshot_cut",
                "visits=%llu reason=\"the state kept changing under it\" action=\"the last page "
                "says the index has holes: the asker asks again\"",
                (unsigned long long)s->visits);
}

/* Under mu: answer q (not a snapshot; its keys sorted) into pg. */
static void serve(struct kvr_rd *rd, const struct kvr_wire_sync *q, struct pager *pg)
{
    struct kvr_fleet *g = rd->fleet;
    if (q->nkeys) {
        for (uint32_t i = 0; i < q->nkeys; i++)
            if (!i || q->keys[i] != q->keys[i - 1]) /* each key once (sorted: repeats adjoin) */
                pager_key(pg, q->keys[i]);
        if (pg->records) /* those who know nothing stay silent */
            pager_flush(pg, true);
    } else if (q->epoch == g->epoch && q->from_seq <= q->to_seq) {
        uint64_t from = q->from_seq, to = q->to_seq < g->seq ? q->to_seq : g->seq;
        if (to >= from && to - from >= KVR_FLEET_RING)
            from = to - KVR_FLEET_RING + 1; /* older ones are overwritten in the ring anyway */
        for (uint64_t s = from; s <= to; s++) {
            const struct kvr_fleet_ring_slot *slot = &g->ring[s % KVR_FLEET_RING];
            if (slot->seq == s)
                pager_key(pg, slot->key); /* requests already done are not repaired */
        }
        pager_flush(pg, true);
    }
}

/* Whether reply is the pages subject of the router the request names: pages list clients' reply
 * subjects and ids, so they go to a router's own subject only (which permissions fence). */
static bool to_a_router(const struct kvr_rd *rd, const struct kvr_wire_sync *q, const char *reply)
{
    char want[600], tail[320];
    if (!reply || !kvr_id_ok(q->router_id, KVR_RD_ID_MAX - 1))
        return false;
    snprintf(tail, sizeof tail, "router.pages.%s", q->router_id);
    return kvr_subject(want, sizeof want, rd->cfg->net.prefix, rd->cfg->net.ns, tail) &&
           !strcmp(reply, want);
}

/* A SyncRequest; on the lookup subject (every router hears it) only request keys are asked: a
 * snapshot or a repair asked there had every router of the fleet serve it at once. */
static void on_request(struct kvr_rd *rd, const char *reply, const void *data, size_t len,
                       bool lookup)
{
    struct kvr_wire_sync q;
    kvr_status st = kvr_wire_decode_sync(data, len, &q);
    if (st == KVR_OK && lookup && (q.full || !q.nkeys)) {
        kvr_wire_sync_free(&q);
        st = KVR_ERR_INVALID;
    }
    if (st == KVR_OK) /* before mu: serve answers each key once */
        kvr_sort_u64(q.keys, q.nkeys);
    struct pager pg = {.rd = rd, .reply = reply, .token = st == KVR_OK ? q.token : 0};
    kvr_page_init(&pg.page);
    struct snapshot snap = {.done = true};
    bool full = st == KVR_OK && q.full;
    if (full) /* one snapshot at a time: the walks' cursors are the router's own */
        pthread_mutex_lock(&rd->snap_mu);
    pthread_mutex_lock(&rd->mu);
    if (st != KVR_OK || !to_a_router(rd, &q, reply))
        rd->fleet->bad++;
    else if (q.full)
        snapshot_begin(rd, &pg, &snap);
    else
        serve(rd, &q, &pg);
    rd->out.dropped += pg.out.dropped; /* pages not made (memory): the router's counter */
    pg.out.dropped = 0;
    pthread_mutex_unlock(&rd->mu);
    kvr_outbox_flush(&pg.out, &rd->sink, NULL);
    if (!snap.done) {
        snapshot_serve(rd, &pg, &snap);
        kvr_log(KVR_LOG_INFO, "snapshot_served", "requests=%u pages=%u index=%s", pg.records,
                pg.pages, pg.page.index_partial ? "partial" : "whole");
    }
    if (full)
        pthread_mutex_unlock(&rd->snap_mu);
    kvr_outbox_free(&pg.out);
    kvr_page_free(&pg.page);
    kvr_buf_free(&pg.buf);
    if (st == KVR_OK)
        kvr_wire_sync_free(&q);
}

void kvr_sync_on_request(struct kvr_rd *rd, const char *reply, const void *data, size_t len)
{
    on_request(rd, reply, data, len, false);
}

void kvr_sync_on_lookup(struct kvr_rd *rd, const char *reply, const void *data, size_t len)
{
    on_request(rd, reply, data, len, true);
}

/* --- receiving ----------------------------------------------------------------------------- */

struct page_ctx {
    struct kvr_rd *rd;
    uint64_t now;
    bool snapshot; /* the pages of the snapshot this router is waiting for */
    bool entries;  /* ... and their index entries are taken */
};

static void page_decision(void *ctx, const struct kvr_wire_decision *d)
{
    struct page_ctx *c = ctx;
    kvr_fleet_import(c->rd, d, c->now, !c->snapshot);
}

static void page_entry(void *ctx, const struct kvr_index_record *e)
{
    struct page_ctx *c = ctx;
    if (c->entries)
        kvr_router_import_index(c->rd->core, e, c->now);
}

static void apply_again(void *ctx, const struct kvr_kvlog_event *e)
{
    struct kvr_rd *rd = ctx;
    kvr_events_apply_kv_again(rd, e->worker_id, e->data, e->len);
}

/* Under mu: the snapshot is in (or will not come): replay the held KV events, in order; when its
 * index replaced this one's, the last moment's before the ask first (kvlog.h). */
static void finish(struct kvr_rd *rd, bool complete)
{
    struct kvr_fleet *g = rd->fleet;
    uint32_t held = rd->nheld;
    rd->holding = false;
    if (g->replay_kv) {
        g->kv_replayed += kvr_kvlog_replay(&rd->kvlog, apply_again, rd);
        g->replay_kv = false;
    }
    for (uint32_t i = 0; i < rd->nheld; i++) {
        kvr_status st =
            kvr_events_apply_kv(rd, rd->held[i].worker_id, rd->held[i].data, rd->held[i].len);
        rd->ev_errors += kvr_events_bad(st);
        free(rd->held[i].data);
    }
    rd->nheld = 0;
    rd->held_bytes = 0;
    g->syncing = false;
    g->resync = false;
    if (complete)
        g->synced = true;
    struct kvr_router_stats s;
    kvr_router_stats(rd->core, &s);
    kvr_log(complete ? KVR_LOG_INFO : KVR_LOG_WARN, complete ? "synced" : "sync_incomplete",
            "requests=%u index_entries=%u held_events=%u", s.inflight, s.index_entries, held);
}

/* Under mu: the first page of a resync's answer. Its index replaces this one's, unless its sender
 * says its own has holes too (index_has_holes): then this one's is kept, its gaps and all, rather
 * than traded for gaps elsewhere, and another peer asked (answered). */
static void resync_answered(struct kvr_rd *rd, bool partial)
{
    struct kvr_fleet *g = rd->fleet;
    g->resync = false;
    g->keep_index = partial;
    if (!partial) {
        kvr_router_index_clear(rd->core);
        g->replay_kv = true;
    }
}

/*
 * Under mu: the last page of the awaited snapshot is in; holes: it says the index sent has holes
 * (its sender's index has them, or the sender's walk was cut short: kvr_sync_on_page). A resync
 * whose first page said so kept this router's own index (resync_answered); any other answer with
 * holes was taken as it came (a resync's index replaced at its first page, which said nothing of
 * a cut to come; a start-up snapshot's, whatever it said). Either way a peer is asked again
 * later, SYNC_PARTIAL_TRIES answers with holes in a row at most.
 */
static void answered(struct kvr_rd *rd, bool holes)
{
    struct kvr_fleet *g = rd->fleet;
    bool kept = g->keep_index;
    g->keep_index = false;
    finish(rd, true);
    if (!kept) /* kept: this index is what it was */
        g->took_holes = holes;
    if (!kept && !holes) {
        g->partial_answers = 0;
        return;
    }
    if (kept)
        g->resyncs_kept_index++;
    else
        g->snapshots_incomplete++;
    bool again = ++g->partial_answers < SYNC_PARTIAL_TRIES;
    g->resync_retry_at = again ? kvr_now_ns() + SYNC_PARTIAL_RETRY_NS : 0;
    if (!again)
        g->partial_answers = 0;
    const char *action = again ? "ask a peer again in 1 s" : "none: KV events fill this index in";
    if (kept)
        kvr_log(KVR_LOG_WARN, "resync_index_kept",
                "reason=\"the peer's index has holes too\" action=\"%s\"", action);
    else
        kvr_log(KVR_LOG_WARN, "snapshot_incomplete",
                "reason=\"the snapshot's index has holes (its walk was cut short, or its sender's "
                "index has them)\" kept=\"what came\" action=\"%s\"",
                action);
}

void kvr_sync_on_page(struct kvr_rd *rd, const void *data, size_t len)
{
    struct kvr_wire_page_head head;
    pthread_mutex_lock(&rd->mu);
    struct kvr_fleet *g = rd->fleet;
    /* while a snapshot is awaited, the pages with its token are its: their index entries are
     * taken (repair pages, and anyone else's, carry none that count) */
    uint64_t expect = g->syncing ? g->sync_token : 0;
    bool ours = expect && kvr_wire_decode_page(data, len, NULL, NULL, NULL, &head) == KVR_OK &&
                head.token == expect;
    if (ours && g->resync)
        resync_answered(rd, head.index_partial);
    struct page_ctx c = {rd, kvr_now_ns(), ours, ours && !g->keep_index};
    kvr_status st = kvr_wire_decode_page(data, len, page_decision, page_entry, &c, &head);
    if (st != KVR_OK) {
        g->bad++;
    } else {
        g->pages_received++;
        if (ours && head.last) /* index_partial on a last page only: the walk was cut */
            answered(rd, head.index_partial);
    }
    pthread_mutex_unlock(&rd->mu);
    kvr_rd_flush(rd);
}

/* Under mu: hold KV events back and ask peer from for everything. */
static void ask_snapshot(struct kvr_rd *rd, const struct kvr_peer *from)
{
    struct kvr_fleet *g = rd->fleet;
    g->syncing = true;
    g->keep_index = false;
    g->replay_kv = false;
    rd->holding = true;
    g->sync_asked_ns = kvr_now_ns(); /* KV events are held from here on */
    g->sync_deadline = g->sync_asked_ns + rd->cfg->sync_timeout_ns;
    struct kvr_wire_sync q = {.full = true};
    kvr_fleet_ask_peer(rd, from, &q);
    g->sync_token = q.token;
    kvr_log(KVR_LOG_INFO, "snapshot_asked", "peer=%s", from->id);
}

/* Whether e comes after every event of its worker this router knows it missed: applied again over
 * a snapshot, an older one could undo one it missed (a store of a block since removed). */
static bool after_the_missed(void *ctx, const struct kvr_kvlog_event *e)
{
    const struct kvr_rd *rd = ctx;
    return e->seq > kvr_kvseq_last_missing(&rd->kvseq, e->worker_id);
}

/* Under mu, as a resync asks (before its missed numbers are settled): mark the KV events to apply
 * again if its snapshot replaces the index (kvlog.h): of the window before the ask, none from
 * before a cut, each after the last of its worker's events known missed. Those applied later
 * (held, or applied at once past the hold's bound) are not marked. */
static void mark_replay(struct kvr_rd *rd)
{
    uint64_t t = rd->fleet->sync_asked_ns, w = rd->cfg->kv_replay_ns;
    uint64_t from = t > w ? t - w : 0;
    kvr_kvlog_mark(&rd->kvlog, from > rd->kv_cut_ns ? from : rd->kv_cut_ns, after_the_missed, rd);
}

bool kvr_sync_resync(struct kvr_rd *rd, const char *reason)
{
    struct kvr_fleet *g = rd->fleet;
    struct kvr_peer *from = rd->cfg->gossip && g->synced && !g->syncing
                                ? kvr_fleet_serving_peer(rd, kvr_now_ns())
                                : NULL;
    if (!from)
        return false;
    g->resync = true;
    g->resyncs++;
    ask_snapshot(rd, from);
    mark_replay(rd);
    kvr_log(KVR_LOG_INFO, "resync", "reason=\"%s\"", reason);
    return true;
}

void kvr_sync_tick(struct kvr_rd *rd, uint64_t now)
{
    struct kvr_fleet *g = rd->fleet;
    if (g->syncing && g->synced && now > g->sync_deadline)
        finish(rd, false);
    if (g->resync_retry_at && now >= g->resync_retry_at) {
        g->resync_retry_at = 0;
        kvr_sync_resync(rd, "the last snapshot's index had holes");
    }
}

/* Without mu: wait for the snapshot asked; true once applied, false past its deadline. */
static bool await_snapshot(struct kvr_rd *rd, bool last_try)
{
    struct kvr_fleet *g = rd->fleet;
    for (;;) {
        kvr_sleep_ns(2 * KVR_NS_PER_MS);
        pthread_mutex_lock(&rd->mu);
        bool done = g->synced, late = kvr_now_ns() > g->sync_deadline;
        if (!done && late && last_try)
            finish(rd, false); /* go on: gossip, lookups and heartbeats fill in */
        pthread_mutex_unlock(&rd->mu);
        if (done || late)
            return done;
    }
}

void kvr_sync_start(struct kvr_rd *rd)
{
    struct kvr_fleet *g = rd->fleet;
    uint64_t t0 = kvr_now_ns();
    for (int attempt = 0; attempt < SYNC_TRIES; attempt++) {
        pthread_mutex_lock(&rd->mu);
        struct kvr_peer *from = rd->cfg->gossip ? kvr_fleet_serving_peer(rd, kvr_now_ns()) : NULL;
        if (!from) {
            g->synced = true;
            pthread_mutex_unlock(&rd->mu);
            kvr_log(KVR_LOG_INFO, "sync_skipped", "reason=\"%s\"",
                    rd->cfg->gossip ? "no serving peer" : "gossip off");
            return;
        }
        ask_snapshot(rd, from);
        pthread_mutex_unlock(&rd->mu);
        kvr_rd_flush(rd);
        if (await_snapshot(rd, attempt + 1 == SYNC_TRIES)) {
            pthread_mutex_lock(&rd->mu);
            g->sync_ms = (kvr_now_ns() - t0) / KVR_NS_PER_MS;
            pthread_mutex_unlock(&rd->mu);
            return;
        }
        kvr_log(KVR_LOG_WARN, "sync_timeout", "attempt=%d", attempt + 1);
    }
    pthread_mutex_lock(&rd->mu);
    g->synced = true; /* anti-entropy from here on */
    pthread_mutex_unlock(&rd->mu);
}
