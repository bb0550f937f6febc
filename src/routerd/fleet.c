/*
 * Replication: peers, gossip, imports, anti-entropy, who answers a failed request.
 */
#define _DEFAULT_SOURCE
#include "fleet.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "kvr/hash.h"
#include "log.h"
#include "stats.h"
#include "send.h"
#include "service.h"
#include "subject.h"

#define REPAIR_MAX 4096u /* seqs asked at once */
#define LOOKUP_MAX 256u  /* keys asked at once */

static uint64_t hello_ns(const struct kvr_rd *rd)
{
    return rd->cfg->hello_ns;
}

bool kvr_fleet_peer_alive(const struct kvr_rd *rd, const struct kvr_peer *p, uint64_t now)
{
    /* its hellos may wait in the gossip queue: judged at what was applied, not at the clock */
    uint64_t heard = rd->fleet->heard_ns, t = heard && heard < now ? heard : now;
    return p && p->heard_ns && (p->heard_ns >= t || t - p->heard_ns < hello_ns(rd) * 7 / 2);
}

/* With the table full: forget the peer silent the longest of those silent now that no request
 * names as origin (made-up ids, or old incarnations' host-pid ids, do not fill it for good; nor
 * does one pinned by a request while the others could go). */
static bool evict_one(struct kvr_rd *rd)
{
    struct kvr_fleet *g = rd->fleet;
    uint64_t now = kvr_now_ns();
    struct kvr_peer *q, *tmp, *oldest = NULL;
    bool silent = false;
    HASH_ITER(hh, g->peers, q, tmp)
    {
        q->named = false;
        silent |= !kvr_fleet_peer_alive(rd, q, now);
    }
    if (!silent)
        return false; /* every one talks: the requests are not looked at */
    for (const struct kvr_pending *r = rd->pend.head; r; r = r->hh.next)
        if (r->origin) /* this module's peers, which a pending request only points at */
            ((struct kvr_peer *)r->origin)->named = true;
    HASH_ITER(hh, g->peers, q, tmp)
    {
        if (!q->named && !kvr_fleet_peer_alive(rd, q, now) &&
            (!oldest || q->heard_ns < oldest->heard_ns))
            oldest = q;
    }
    if (!oldest)
        return false;
    HASH_DEL(g->peers, oldest);
    free(oldest);
    g->npeers--;
    g->peers_evicted++;
    return true;
}

static struct kvr_peer *peer_get(struct kvr_rd *rd, const char *id)
{
    struct kvr_fleet *g = rd->fleet;
    struct kvr_peer *p = NULL;
    if (!kvr_id_ok(id, sizeof p->id - 1)) /* it names subjects (router.sync.<id>) and log lines */
        return NULL;
    HASH_FIND_STR(g->peers, id, p);
    if (p || (g->npeers >= KVR_FLEET_MAX_PEERS && !evict_one(rd)))
        return p;
    p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    strcpy(p->id, id);
    HASH_ADD_STR(g->peers, id, p);
    g->npeers++;
    return p;
}

static bool subject_of(const struct kvr_rd *rd, char *buf, size_t len, const char *what,
                       const char *id)
{
    char suffix[512];
    snprintf(suffix, sizeof suffix, "router.%s%s%s", what, id ? "." : "", id ? id : "");
    return kvr_subject(buf, len, rd->cfg->net.prefix, rd->cfg->net.ns, suffix);
}

kvr_status kvr_fleet_create(struct kvr_rd *rd)
{
    struct kvr_fleet *g = calloc(1, sizeof *g);
    if (!g || !(g->ring = calloc(KVR_FLEET_RING, sizeof *g->ring))) {
        free(g);
        return KVR_ERR_NOMEM;
    }
    rd->fleet = g;
    g->epoch = kvr_realtime_ns();
    const char *id = rd->cfg->id;
    bool ok = subject_of(rd, g->subj_gossip, sizeof g->subj_gossip, "gossip", id) &&
              subject_of(rd, g->subj_gossip_all, sizeof g->subj_gossip_all, "gossip", "*") &&
              subject_of(rd, g->subj_lookup, sizeof g->subj_lookup, "lookup", NULL) &&
              subject_of(rd, g->subj_digest, sizeof g->subj_digest, "digest", NULL) &&
              subject_of(rd, g->subj_sync, sizeof g->subj_sync, "sync", id) &&
              subject_of(rd, g->subj_pages, sizeof g->subj_pages, "pages", id);
    return ok ? KVR_OK : KVR_ERR_INVALID;
}

void kvr_fleet_destroy(struct kvr_rd *rd)
{
    struct kvr_fleet *g = rd->fleet;
    if (!g)
        return;
    struct kvr_peer *p, *tmp;
    HASH_ITER(hh, g->peers, p, tmp)
    {
        HASH_DEL(g->peers, p);
        free(p);
    }
    free(g->ring);
    free(g);
    rd->fleet = NULL;
}

struct kvr_peer *kvr_fleet_serving_peer(struct kvr_rd *rd, uint64_t now)
{
    uint32_t n = 0;
    struct kvr_peer *p, *tmp, *pick = NULL;
    HASH_ITER(hh, rd->fleet->peers, p, tmp)
    {
        if (!p->serving || !kvr_fleet_peer_alive(rd, p, now))
            continue;
        n++;
        if (kvr_hash_seq(rd->fleet->tokens, n) % n == 0)
            pick = p; /* reservoir sampling */
    }
    return pick;
}

void kvr_fleet_ask(struct kvr_rd *rd, const char *subject, struct kvr_wire_sync *q)
{
    q->router_id = (char *)rd->cfg->id;
    q->token = ++rd->fleet->tokens;
    if (kvr_wire_encode_sync(&rd->buf, q) == KVR_OK)
        kvr_outbox_add_request(&rd->out, subject, rd->fleet->subj_pages, rd->buf.data, rd->buf.len);
    q->router_id = NULL;
}

void kvr_fleet_ask_peer(struct kvr_rd *rd, const struct kvr_peer *p, struct kvr_wire_sync *q)
{
    char subject[512];
    if (subject_of(rd, subject, sizeof subject, "sync", p->id))
        kvr_fleet_ask(rd, subject, q);
}

/* --- sending ------------------------------------------------------------------------------- */

void kvr_fleet_decided(struct kvr_rd *rd, const struct kvr_pending *p)
{
    struct kvr_fleet *g = rd->fleet;
    struct kvr_request_record rec;
    g->decided++;
    if (!rd->cfg->gossip || kvr_router_export(rd->core, p->key, &rec) != KVR_OK)
        return;
    uint64_t seq = ++g->seq;
    g->ring[seq % KVR_FLEET_RING] = (struct kvr_fleet_ring_slot){seq, p->key};
    if (rd->cfg->test_drop_gossip && seq % rd->cfg->test_drop_gossip == 0) {
        g->dropped_by_knob++;
        return;
    }
    if (kvr_wire_encode_gossip_decision(&rd->buf, rd->cfg->id, g->epoch, seq, &rec, p->reply,
                                        p->request_id, rd->cfg->id, p->decided_ns,
                                        p->attempts) != KVR_OK)
        return;
    kvr_outbox_add(&rd->out, g->subj_gossip, rd->buf.data, rd->buf.len, KVR_OK);
    g->sent++;
    g->sent_bytes += rd->buf.len;
}

static void ask_repair(struct kvr_rd *rd, struct kvr_peer *p, uint64_t from, uint64_t to)
{
    if (to - from >= REPAIR_MAX)
        from = to - REPAIR_MAX + 1; /* older ones: the heartbeats' anti-entropy */
    rd->fleet->gaps += to - from + 1;
    rd->fleet->repairs_asked++;
    struct kvr_wire_sync q = {.from_seq = from, .to_seq = to, .epoch = p->epoch};
    kvr_fleet_ask_peer(rd, p, &q);
    kvr_log(KVR_LOG_DEBUG, "gossip_gap", "peer=%s from=%" PRIu64 " to=%" PRIu64, p->id, from, to);
}

struct orphan_ctx {
    struct kvr_rd *rd;
    uint64_t now;
};

static void settle_orphan(void *ctx, struct kvr_pending *p);

void kvr_fleet_tick(struct kvr_rd *rd, uint64_t now)
{
    struct kvr_fleet *g = rd->fleet;
    if (rd->pend.norphans) {
        struct orphan_ctx c = {rd, now};
        kvr_pending_due_orphans(&rd->pend, now, settle_orphan, &c);
    }
    if (!rd->cfg->gossip || now < g->next_hello_ns)
        return;
    g->next_hello_ns = now + hello_ns(rd);
    if (kvr_wire_encode_gossip_hello(&rd->buf, rd->cfg->id, g->epoch, g->seq, rd->serving) ==
        KVR_OK)
        kvr_outbox_add(&rd->out, g->subj_gossip, rd->buf.data, rd->buf.len, KVR_OK);
}

/* --- receiving decisions ------------------------------------------------------------------- */

/* Of this router's decision p and a peer's d for the same request, whether d stands: a placed
 * decision over a queued one, else the earlier (ties: the smaller origin id). Every router
 * compares the same two decisions the same way, so they agree on the one that stands. */
static bool peer_stands(const struct kvr_rd *rd, const struct kvr_pending *p,
                        const struct kvr_wire_decision *d)
{
    if (!p->worker_id)
        return true;
    if (p->decided_ns != d->decided_ns)
        return d->decided_ns < p->decided_ns;
    return strcmp(d->origin, p->origin ? p->origin->id : rd->cfg->id) < 0;
}

/* Whether d comes from the router that decided p (this one, when p->origin is NULL). */
static bool same_origin(const struct kvr_rd *rd, const struct kvr_pending *p,
                        const struct kvr_wire_decision *d)
{
    return !strcmp(d->origin, p->origin ? p->origin->id : rd->cfg->id);
}

/* Whether d is p's origin placing p again (its worker never had it: a later placement) or at
 * last (it was queued): the origin's newer decision replaces its older one everywhere, with no
 * conflict. The placement count orders one origin's decisions; decided_ns, which orders
 * different origins' decisions, stays that of the first (place.c). */
static bool placed_anew(const struct kvr_pending *p, const struct kvr_wire_decision *d)
{
    return d->placement > p->attempts ||
           (d->placement == p->attempts && !p->worker_id && d->rec.worker_id);
}

/* d could not be booked on any router (KVR_ERR_INVALID into *st): over its worker's bounds. */
static bool refused_whole(struct kvr_rd *rd, const struct kvr_wire_decision *d, kvr_status *st)
{
    if (kvr_router_import_check(rd->core, &d->rec) != KVR_ERR_INVALID)
        return false;
    *st = KVR_ERR_INVALID;
    return true;
}

/*
 * Two routers decided one request (a resend reached both before either heard of the other's
 * decision, or one was paused with it in its socket): keep the decision that stands, stop the
 * other's worker silently (its client hears only the one that stands). True when d was taken in
 * place of p's decision (and its booking is to be imported); else *st says why not. A decision
 * no router could book (more blocks than its worker has: forged, or broken) replaces nothing,
 * checked before p's booking is cancelled; one on a worker this router has not heard of yet is
 * taken (the fleet agrees on it) and booked later, when a heartbeat of that worker lists it.
 * origin: d's origin as a peer (NULL: this router).
 */
static bool resolve(struct kvr_rd *rd, struct kvr_pending *p, const struct kvr_wire_decision *d,
                    struct kvr_peer *origin, kvr_status *st)
{
    *st = KVR_ERR_DUPLICATE; /* already known */
    if (p->worker_id == d->rec.worker_id && p->decided_ns == d->decided_ns &&
        p->attempts == d->placement)
        return false;            /* the same decision again (a snapshot, a repair) */
    if (same_origin(rd, p, d)) { /* one router's decisions: never a conflict */
        if (!p->origin || !placed_anew(p, d))
            return false; /* this router's own (it knows its latest), or an older one, late */
        if (p->worker_id != d->rec.worker_id && refused_whole(rd, d, st))
            return false;
        p->attempts = d->placement;
        if (p->worker_id == d->rec.worker_id)
            return false; /* sent again to the same worker: booked there already */
        if (p->queued_notice) {
            /* queued at its origin until now (queued.c): nothing booked here */
            kvr_pending_notice(&rd->pend, p, false);
            p->orphan_at = 0; /* placed: no longer forgotten when its wait is over */
        } else {
            rd->fleet->placed_anew++;
            kvr_router_cancel(rd->core, p->key); /* its booking on the worker that never had it */
        }
        p->worker_id = d->rec.worker_id;
        return true;
    }
    bool peer = peer_stands(rd, p, d);
    if (peer && refused_whole(rd, d, st))
        return false;
    rd->n.conflicts++;
    uint64_t kept = peer ? d->rec.worker_id : p->worker_id;
    uint64_t loser = peer ? p->worker_id : d->rec.worker_id;
    bool mine = !p->origin; /* this router decided p: it stops whichever worker lost */
    if (loser && loser != kept && (mine || peer))
        kvr_send_cancel(rd, p->key, loser, KVR_ERR_CANCELLED, true);
    char id[128], who[96];
    kvr_log(KVR_LOG_INFO, "decision_conflict",
            "request=\"%s\" key=%016" PRIx64 " kept_worker=%" PRIu64 " other_worker=%" PRIu64
            " kept_origin=\"%s\"",
            kvr_log_safe(id, sizeof id, p->request_id), p->key, kept, loser,
            kvr_log_safe(who, sizeof who,
                         peer ? d->origin : (p->origin ? p->origin->id : rd->cfg->id)));
    if (!peer)
        return false;
    rd->n.superseded += mine;
    kvr_router_withdraw(rd->core, p->key); /* queued here, or booked on the worker that lost */
    kvr_pending_started(p);                /* its origin now places it, if anyone does */
    kvr_pending_notice(&rd->pend, p, false);
    p->worker_id = d->rec.worker_id;
    p->decided_ns = d->decided_ns;
    p->attempts = d->placement;
    p->origin = origin;
    return true;
}

/* Count a decision the core refused (st) at now, or nothing for KVR_OK. */
static void refused(struct kvr_fleet *g, const struct kvr_wire_decision *d, kvr_status st,
                    uint64_t now)
{
    if (st == KVR_OK)
        return;
    if (st == KVR_ERR_UNKNOWN_WORKER) {
        g->unknown_worker++;
    } else if (st == KVR_ERR_INVALID) {
        g->bad++; /* more blocks than its worker has: forged, or broken */
    } else if (st == KVR_ERR_DUPLICATE) {
        g->late++; /* already known, or its done came first */
    } else {
        /* out of memory, or max_inflight reached: its worker's load is missing here until the
         * request ends. Logged at most once per 10 s (a peer, or heartbeats' lookups, may bring
         * such decisions again and again), with the count since the last line. */
        g->import_failed++;
        if (g->import_failed_log_ns && now - g->import_failed_log_ns < 10 * KVR_NS_PER_S)
            return;
        kvr_log(KVR_LOG_WARN, "decision_not_imported",
                "key=%016" PRIx64 " worker=%" PRIu64 " error=\"%s\" since_last=%" PRIu64,
                d->rec.request_id, d->rec.worker_id, kvr_status_str(st),
                g->import_failed - g->import_failed_logged);
        g->import_failed_logged = g->import_failed;
        g->import_failed_log_ns = now;
    }
}

void kvr_fleet_import(struct kvr_rd *rd, const struct kvr_wire_decision *d, uint64_t now,
                      bool repair)
{
    struct kvr_fleet *g = rd->fleet;
    /* its reply becomes a subject (an error to the client), its origin a peer */
    if ((d->reply[0] && (!kvr_subject_ok(d->reply, KVR_REPLY_MAX) ||
                         !kvr_reply_usable(d->reply, rd->cfg->net.prefix))) ||
        !kvr_id_ok(d->origin, KVR_RD_ID_MAX - 1)) {
        g->bad++;
        return;
    }
    struct kvr_peer *origin = NULL;
    if (strcmp(d->origin, rd->cfg->id) && !(origin = peer_get(rd, d->origin))) {
        /* no room for its origin (every slot a live peer's, or no memory): taken as this
         * router's own, its client would be answered by two routers */
        refused(g, d, KVR_ERR_FULL, now);
        return;
    }
    struct kvr_pending *known = kvr_pending_find(&rd->pend, d->rec.request_id);
    kvr_status st;
    if (known && !resolve(rd, known, d, origin, &st)) {
        refused(g, d, st, now);
        return;
    }
    const struct kvr_recent_item *ended =
        known ? NULL : kvr_rd_ended(rd, d->rec.request_id, now, NULL);
    if (ended && ended->kind == KVR_RECENT_ENDED) {
        /* a decision for a request that ended here already. Not started: a paused router placed
         * a copy it found in its socket; its client has its answer, so the copy is stopped
         * before it streams. Started: a peer's record from before it heard the end (a snapshot,
         * a lookup's answer); booked again, it would stay until a reconcile dropped it */
        if (d->reply[0] && !d->rec.prefill_done) {
            rd->n.conflicts++;
            kvr_send_cancel(rd, d->rec.request_id, d->rec.worker_id, KVR_ERR_CANCELLED, true);
        }
        g->late++;
        return;
    }
    st = kvr_router_import(rd->core, &d->rec, now);
    refused(g, d, st, now);
    if (known || st != KVR_OK)
        return;
    g->imported++;
    kvr_log(KVR_LOG_DEBUG, "decision_imported", "key=%016" PRIx64 " worker=%" PRIu64 " origin=%s",
            d->rec.request_id, d->rec.worker_id, d->origin);
    g->repaired += repair;
    struct kvr_pending *p = NULL;
    st = kvr_pending_add(&rd->pend, d->rec.request_id, d->reply[0] ? d->reply : NULL, d->request_id,
                         NULL, 0, &p);
    if (st == KVR_ERR_DUPLICATE)
        return;
    if (st != KVR_OK) {
        g->lost++; /* booked, but this router could not answer its client for the origin */
        return;
    }
    p->worker_id = d->rec.worker_id;
    p->decided_ns = d->decided_ns;
    p->attempts = d->placement;
    p->origin = origin; /* NULL: this router's earlier incarnation's, answered by this one */
    if (!d->reply[0] && !d->rec.prefill_done) /* a booked select: it expires here too */
        kvr_pending_booked(&rd->pend, p, now + rd->cfg->booking_ttl_ns);
}

/* A gossip message from a peer (not this router). */
static void apply_gossip(struct kvr_rd *rd, const struct kvr_wire_gossip *m, size_t len)
{
    struct kvr_fleet *g = rd->fleet;
    uint64_t now = kvr_now_ns();
    struct kvr_peer *p = peer_get(rd, m->router_id);
    if (!p) {
        g->bad++;
        return;
    }
    g->received++;
    g->received_bytes += len;
    /* a hello and a queued notice carry the seq of its last decision, a decision its own */
    bool hello = m->kind == KVR_WIRE_GOSSIP_HELLO, queued = m->kind == KVR_WIRE_GOSSIP_QUEUED;
    if (m->epoch < p->epoch && kvr_fleet_peer_alive(rd, p, now)) {
        g->stale++; /* from an earlier incarnation, overtaken by its restart */
        return;
    }
    if (m->epoch < p->epoch) { /* the newer one fell silent while this one talks: a forgery, or
                                  a clock set back; heard again, so a forged epoch holds only
                                  while its forger keeps sending */
        kvr_log(KVR_LOG_WARN, "peer_epoch_back", "peer=%s", p->id);
        g->epochs_back++;
        p->epoch = m->epoch;
        p->next_seq = hello || queued ? m->seq + 1 : m->seq;
    }
    if (m->epoch > p->epoch) {
        /* new, or restarted: what it decided before is in snapshots and heartbeats */
        kvr_log(KVR_LOG_INFO, p->epoch ? "peer_restarted" : "peer_joined", "peer=%s", p->id);
        p->epoch = m->epoch;
        p->next_seq = hello || queued ? m->seq + 1 : m->seq;
    } else if (!kvr_fleet_peer_alive(rd, p, now)) {
        kvr_log(KVR_LOG_INFO, "peer_back", "peer=%s", p->id);
    }
    p->heard_ns = now;
    if (hello || queued) {
        if (hello)
            p->serving = m->serving;
        if (m->seq >= p->next_seq) { /* the tail of its decisions never came */
            ask_repair(rd, p, p->next_seq, m->seq);
            p->next_seq = m->seq + 1;
        }
        if (queued)
            kvr_fleet_on_queued(rd, p, &m->q, now);
        return;
    }
    if (m->seq > p->next_seq)
        ask_repair(rd, p, p->next_seq, m->seq - 1);
    if (m->seq >= p->next_seq)
        p->next_seq = m->seq + 1;
    kvr_fleet_import(rd, &m->d, now, false);
}

/* A gossip message with this router's id: its own echo, or another router using the same id. */
static void own_gossip(struct kvr_rd *rd, const struct kvr_wire_gossip *m)
{
    if (m->epoch == rd->fleet->epoch)
        return;
    rd->fleet->bad++;
    kvr_log(KVR_LOG_WARN, "router_id_clash", "id=%s (another router uses this id)", rd->cfg->id);
}

void kvr_fleet_on_gossip(struct kvr_rd *rd, const char *subject, const void *data, size_t len)
{
    struct kvr_wire_gossip m;
    kvr_status st = kvr_wire_decode_gossip(data, len, &m);
    const char *dot = subject ? strrchr(subject, '.') : NULL;
    bool forged = st == KVR_OK && (!dot || strcmp(dot + 1, m.router_id));
    if (forged) {
        kvr_wire_gossip_free(&m); /* under another router's id than its subject's */
        st = KVR_ERR_INVALID;
    }
    pthread_mutex_lock(&rd->mu);
    uint64_t left = 0;
    bool logged = false;
    if (st != KVR_OK) {
        rd->fleet->bad++;
        logged = kvr_log_gate_pass(&rd->gossip_log, &left); /* a line per message: a flood */
    } else if (!strcmp(m.router_id, rd->cfg->id)) {
        own_gossip(rd, &m);
    } else {
        apply_gossip(rd, &m, len);
    }
    pthread_mutex_unlock(&rd->mu);
    char safe[160];
    if (logged)
        kvr_log(KVR_LOG_WARN, "gossip_dropped",
                "subject=\"%s\" bytes=%zu error=\"%s\" suppressed=%" PRIu64,
                kvr_log_safe(safe, sizeof safe, subject ? subject : ""), len,
                forged ? "router id is not the subject's" : kvr_status_str(st), left);
    if (st == KVR_OK)
        kvr_wire_gossip_free(&m);
    kvr_rd_flush(rd);
}

/* --- anti-entropy and answering clients ---------------------------------------------------- */

/*
 * out[0..na) (room for na + nb) and the sorted b[0..nb) into one sorted run in out: the
 * heartbeat's keys come sorted (events.c), and a few bookings sorted here and merged keep it so,
 * so the core need not sort 65,536 keys under the mutex.
 */
static void merge_sorted(uint64_t *out, uint32_t na, const uint64_t *b, uint32_t nb)
{
    kvr_sort_u64(out, na);
    uint32_t i = na, j = nb, k = na + nb;
    while (j > 0) /* from the back: out's own run moves up as b's fills in */
        out[--k] = i > 0 && out[i - 1] > b[j - 1] ? out[--i] : b[--j];
}

void kvr_fleet_reconcile(struct kvr_rd *rd, uint64_t worker_id, const uint64_t *keys, uint32_t n,
                         uint32_t interval_ms, uint32_t waiting, uint64_t now)
{
    if (!rd->fleet->synced)
        return; /* without the snapshot it would drop nothing but ask for everything */
    uint64_t grace = 2ull * (interval_ms ? interval_ms : 1000) * KVR_NS_PER_MS;
    if (waiting) {
        /* a worker behind on its messages: any request it does not list may wait in its queue,
         * so none is judged missing (a grace of now suspends judgement and clears first
         * strikes); it is judged again once its queue is empty. Taken for lost and placed
         * elsewhere, a request would be served twice */
        grace = now;
        rd->fleet->reconcile_waits++;
    }
    uint64_t unknown[LOOKUP_MAX];
    uint32_t nunknown = 0, nbooked = 0;
    uint64_t *held = NULL;
    if (rd->pend.nbookings && (held = malloc(((size_t)n + rd->pend.nbookings) * sizeof *held))) {
        /* a booking within its TTL counts as held: its client forwards it when it likes */
        nbooked = kvr_pending_live_bookings(&rd->pend, worker_id, now, held, rd->pend.nbookings);
        merge_sorted(held, nbooked, keys, n);
        keys = held;
    }
    uint32_t dropped = kvr_router_reconcile(rd->core, worker_id, keys, n + nbooked, now, grace,
                                            unknown, &nunknown, LOOKUP_MAX);
    free(held);
    if (dropped)
        kvr_log(KVR_LOG_WARN, "reconciled", "worker=%" PRIu64 " dropped=%u", worker_id, dropped);
    if (nunknown && rd->cfg->gossip) {
        struct kvr_wire_sync q = {.keys = unknown, .nkeys = nunknown};
        kvr_fleet_ask(rd, rd->fleet->subj_lookup, &q);
        rd->fleet->lookups++;
    }
}

/* Whether this router answers for requests whose origin is silent: the live one with the
 * smallest id does. */
static bool stands_in(const struct kvr_rd *rd, uint64_t now)
{
    struct kvr_peer *q, *tmp;
    HASH_ITER(hh, rd->fleet->peers, q, tmp)
    {
        if (kvr_fleet_peer_alive(rd, q, now) && strcmp(q->id, rd->cfg->id) < 0)
            return false;
    }
    return true;
}

/* Tell p's client it failed with st (naming its worker). */
static void tell(struct kvr_rd *rd, const struct kvr_pending *p, kvr_status st)
{
    if (!p->reply)
        return; /* a booked select: its client forwards it itself (docs/protocol.md) */
    struct kvr_reply_why why = {.worker_id = p->worker_id};
    kvr_reply_fail(&rd->generate, &rd->out, p->reply, p->request_id, st, &why);
}

void kvr_fleet_answered_in(struct kvr_recent *t, uint64_t key, kvr_status st, uint64_t now)
{
    bool ended = st == KVR_ERR_CANCELLED || st == KVR_ERR_DEADLINE;
    kvr_recent_put(t, key, ended ? KVR_RECENT_ENDED : KVR_RECENT_FAILED, ended ? KVR_OK : st, false,
                   now);
}

void kvr_fleet_answered(struct kvr_rd *rd, uint64_t key, kvr_status st, uint64_t now)
{
    kvr_fleet_answered_in(&rd->recent, key, st, now);
}

void kvr_fleet_failed(struct kvr_rd *rd, struct kvr_pending *p, kvr_status st)
{
    uint64_t now = kvr_now_ns();
    if (!p->origin) {
        tell(rd, p, st);
        kvr_fleet_unqueued(rd, p, st);
    } else if (!kvr_fleet_peer_alive(rd, p->origin, now) && !p->orphan_at) {
        /* its origin is silent: maybe gone, maybe cut off for a moment (then it places the
         * request again itself). Wait, then answer if it is still silent. */
        if (kvr_pending_orphan(&rd->pend, p, now + 8 * hello_ns(rd), st) == KVR_OK)
            return;
        if (stands_in(rd, now))
            tell(rd, p, st);
    }
    if (p->reply) /* (its origin answers it the same, a live one at once) */
        kvr_fleet_answered(rd, p->key, st, now);
    kvr_pending_drop(&rd->pend, p);
}

/* An orphan whose grace period is over. */
static void settle_orphan(void *ctx, struct kvr_pending *p)
{
    struct orphan_ctx *c = ctx;
    struct kvr_rd *rd = c->rd;
    struct kvr_request_record rec;
    if (kvr_router_export(rd->core, p->key, &rec) == KVR_OK)
        return; /* placed again meanwhile: in flight */
    bool silent = !kvr_fleet_peer_alive(rd, p->origin, c->now);
    if (silent && p->reply && stands_in(rd, c->now)) { /* (a booked select: nobody to tell) */
        tell(rd, p, p->orphan_status);
        rd->fleet->orphans_answered++;
    }
    if (silent || !p->queued_notice) /* a live origin's queued one: it answers as it likes */
        kvr_fleet_answered(rd, p->key, p->orphan_status, c->now);
    kvr_pending_drop(&rd->pend, p);
}

/* --- stats ---------------------------------------------------------------------------------- */

static void digest(struct kvr_rd *rd, json_t *obj)
{
    struct kvr_digest d;
    char hex[4][17];
    kvr_router_digest(rd->core, &d);
    snprintf(hex[0], sizeof hex[0], "%016" PRIx64, d.combined);
    snprintf(hex[1], sizeof hex[1], "%016" PRIx64, d.workers);
    snprintf(hex[2], sizeof hex[2], "%016" PRIx64, d.requests);
    snprintf(hex[3], sizeof hex[3], "%016" PRIx64, d.index);
    json_object_set_new(obj, "digest", json_string(hex[0]));
    json_object_set_new(obj, "digest_workers", json_string(hex[1]));
    json_object_set_new(obj, "digest_requests", json_string(hex[2]));
    json_object_set_new(obj, "digest_index", json_string(hex[3]));
    kvr_json_u64(obj, "workers", d.nworkers);
    kvr_json_u64(obj, "requests", d.nrequests);
    kvr_json_u64(obj, "index_entries", d.nentries);
}

void kvr_fleet_stats(struct kvr_rd *rd, json_t *obj)
{
    struct kvr_fleet *g = rd->fleet;
    uint64_t now = kvr_now_ns(), alive = 0;
    struct kvr_peer *p, *tmp;
    HASH_ITER(hh, g->peers, p, tmp)
    alive += kvr_fleet_peer_alive(rd, p, now);
    struct kvr_router_stats s;
    kvr_router_stats(rd->core, &s);
    const struct {
        const char *name;
        uint64_t value;
    } counters[] = {
        {"epoch", g->epoch},
        {"seq", g->seq},
        {"sync_ms", g->sync_ms},
        {"peers", g->npeers},
        {"peers_alive", alive},
        {"peers_evicted", g->peers_evicted},
        {"decided", g->decided},
        {"gossip_sent", g->sent},
        {"gossip_bytes", g->sent_bytes},
        {"gossip_received", g->received},
        {"gossip_received_bytes", g->received_bytes},
        {"gossip_bad", g->bad},
        {"gossip_stale", g->stale},
        {"imported", g->imported},
        {"imported_unanswerable", g->lost},
        {"already_known", g->late},
        {"late_decisions", s.late_decisions},
        {"early_events", s.early_events},
        {"import_unknown_worker", g->unknown_worker},
        {"import_failed", g->import_failed},
        {"gaps", g->gaps},
        {"repairs_asked", g->repairs_asked},
        {"repaired", g->repaired},
        {"lookups", g->lookups},
        {"reconciled", s.reconciled},
        {"reconcile_waits", g->reconcile_waits},
        {"queued_sent", g->queued_sent},
        {"queued_heard", g->queued_heard},
        {"queued_released", g->queued_released},
        {"pages_sent", g->pages_sent},
        {"pages_received", g->pages_received},
        {"snapshots_served", g->snapshots_served},
        {"snapshots_served_partial", g->snapshots_served_partial},
        {"snapshots_served_cut", g->snapshots_served_cut},
        {"snapshots_incomplete", g->snapshots_incomplete},
        {"held_dropped", rd->held_dropped},
        {"resends", g->resends},
        {"resyncs", g->resyncs},
        {"resyncs_kept_index", g->resyncs_kept_index},
        {"kv_events_replayed", g->kv_replayed},
        {"kv_log_dropped", rd->kvlog.dropped},
        {"orphans_answered", g->orphans_answered},
        {"placed_anew", g->placed_anew},
        {"gossip_dropped_by_test_knob", g->dropped_by_knob},
        {"conflicts", rd->n.conflicts},
        {"superseded", rd->n.superseded},
        {"stale_events", rd->n.stale_events},
        {"peer_epochs_back", g->epochs_back},
        {"rebinds_sent", rd->n.rebinds_sent},
        {"rebinds_unknown", rd->n.rebinds_unknown},
    };
    json_object_set_new(obj, "synced", json_boolean(g->synced));
    json_object_set_new(obj, "gossip_bytes_per_decision",
                        json_real(g->sent ? (double)g->sent_bytes / (double)g->sent : 0.0));
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
        kvr_json_u64(obj, counters[i].name, counters[i].value);
    digest(rd, obj);
}
