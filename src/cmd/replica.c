/*
 * Replication: how the routers of a fleet keep equal state (docs/architecture.md, "A fleet of
 * routers"). Every router receives every worker event itself, so only decisions travel:
 *
 * - gossip: each booking this router makes goes out as one Gossip message on
 *   kv.<ns>.router.gossip with (router id, epoch, seq); peers import it. A hello every second
 *   carries the last seq, so a lost tail is seen too.
 * - repair: a seq gap asks the origin (kv.<ns>.router.sync.<id>) for the decisions it still
 *   holds in that range; the pages come back to kv.<ns>.router.pages.<id>.
 * - snapshot: a new or restarted router asks one synced peer (kv.<ns>.router.sync, a queue
 *   group) for everything in flight and the index; KV events are held back meanwhile and
 *   replayed after it, in order. Request events are applied at once (the core keeps early ones).
 * - anti-entropy: each worker heartbeat lists the requests it holds; requests no worker holds
 *   are dropped, and keys nobody told this router about are looked up (kv.<ns>.router.lookup).
 * - digest: kv.<ns>.router.digest answers with a digest of the state, for tests and operators.
 *
 * Client errors for a failed request are sent by the router that decided it while it lives,
 * else by the live router with the smallest id.
 */
#define _DEFAULT_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/hash.h"
#include "router.h"

#define RING_SIZE  65536u         /* decisions an origin can still repair */
#define MAX_PEERS  1024u          /* routers remembered */
#define PAGE_BYTES (256u * 1024u) /* a sync page, well under NATS's 1 MB payload */
#define HELD_MAX   (1u << 20)     /* KV events held during a snapshot */
#define REPAIR_MAX 4096u          /* seqs asked at once */
#define LOOKUP_MAX 256u           /* keys asked at once */
#define SYNC_TRIES 2

static uint64_t hello_ns(const struct router *r)
{
    return r->o.hello_ms * 1000000ull;
}

static bool peer_alive(const struct router *r, const struct peer *p, uint64_t now)
{
    return p->heard_ns && now - p->heard_ns < hello_ns(r) * 7 / 2;
}

static struct peer *peer_get(struct router *r, const char *id)
{
    struct peer *p = NULL;
    HASH_FIND_STR(r->rep.peers, id, p);
    if (p || r->rep.npeers >= MAX_PEERS || strlen(id) >= sizeof p->id)
        return p;
    p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    strcpy(p->id, id);
    HASH_ADD_STR(r->rep.peers, id, p);
    r->rep.npeers++;
    return p;
}

kvr_status replica_init(struct router *r)
{
    struct replica *g = &r->rep;
    g->epoch = kvr_realtime_ns();
    g->ring = calloc(RING_SIZE, sizeof *g->ring);
    if (!g->ring)
        return KVR_ERR_NOMEM;
    char suffix[512];
    kvr_subject(g->subj_gossip, sizeof g->subj_gossip, r->o.prefix, r->o.ns, "router.gossip");
    kvr_subject(g->subj_lookup, sizeof g->subj_lookup, r->o.prefix, r->o.ns, "router.lookup");
    kvr_subject(g->subj_digest, sizeof g->subj_digest, r->o.prefix, r->o.ns, "router.digest");
    snprintf(suffix, sizeof suffix, "router.sync.%s", r->o.id);
    kvr_subject(g->subj_sync, sizeof g->subj_sync, r->o.prefix, r->o.ns, suffix);
    snprintf(suffix, sizeof suffix, "router.pages.%s", r->o.id);
    if (!kvr_subject(g->subj_pages, sizeof g->subj_pages, r->o.prefix, r->o.ns, suffix))
        return KVR_ERR_INVALID;
    return KVR_OK;
}

void replica_free(struct router *r)
{
    struct replica *g = &r->rep;
    struct peer *p, *tmp;
    HASH_ITER(hh, g->peers, p, tmp)
    {
        HASH_DEL(g->peers, p);
        free(p);
    }
    for (size_t i = 0; i < g->nheld; i++)
        free(g->held[i].data);
    free(g->held);
    free(g->ring);
    free(g->orphans);
    memset(g, 0, sizeof *g);
}

/* --- sending ------------------------------------------------------------------------------- */

void replica_decided(struct router *r, const struct pending *p)
{
    struct replica *g = &r->rep;
    struct kvr_request_record rec;
    g->decided++;
    if (!r->o.gossip || kvr_router_export(r->core, p->key, &rec) != KVR_OK)
        return;
    uint64_t seq = ++g->seq;
    g->ring[seq % RING_SIZE] = (struct ring_slot){seq, p->key};
    if (r->o.test_drop_gossip && seq % r->o.test_drop_gossip == 0) {
        g->dropped_by_knob++;
        return;
    }
    if (kvr_wire_encode_gossip_decision(&r->buf, r->o.id, g->epoch, seq, &rec, p->reply,
                                        p->request_id, r->o.id) != KVR_OK)
        return;
    kvr_outbox_add(&r->out, g->subj_gossip, r->buf.data, r->buf.len, KVR_OK);
    g->sent++;
    g->sent_bytes += r->buf.len;
}

/* Under mu: ask (reply to our pages subject) with a SyncRequest. */
static void ask(struct router *r, const char *subject, struct kvr_wire_sync *q)
{
    q->router_id = r->o.id;
    q->token = ++r->rep.tokens;
    if (kvr_wire_encode_sync(&r->buf, q) == KVR_OK)
        kvr_outbox_add_request(&r->out, subject, r->rep.subj_pages, r->buf.data, r->buf.len);
}

/* Under mu: ask peer p directly (kv.<ns>.router.sync.<its id>). */
static void ask_peer(struct router *r, const struct peer *p, struct kvr_wire_sync *q)
{
    char subject[512], suffix[300];
    snprintf(suffix, sizeof suffix, "router.sync.%s", p->id);
    if (kvr_subject(subject, sizeof subject, r->o.prefix, r->o.ns, suffix))
        ask(r, subject, q);
}

static void ask_repair(struct router *r, struct peer *p, uint64_t from, uint64_t to)
{
    if (to - from >= REPAIR_MAX)
        from = to - REPAIR_MAX + 1; /* older ones: the heartbeats' anti-entropy */
    r->rep.gaps += to - from + 1;
    r->rep.repairs_asked++;
    struct kvr_wire_sync q = {.from_seq = from, .to_seq = to, .epoch = p->epoch};
    ask_peer(r, p, &q);
    kvr_log(KVR_LOG_DEBUG, "gossip_gap", "peer=%s from=%" PRIu64 " to=%" PRIu64, p->id, from, to);
}

static void finish_sync(struct router *r, bool complete);
static void settle_orphans(struct router *r, uint64_t now);

void replica_tick(struct router *r, uint64_t now)
{
    struct replica *g = &r->rep;
    if (g->syncing && g->synced && now > g->sync_deadline)
        finish_sync(r, false); /* a resync that got no answer: heartbeats and gossip fill in */
    if (g->norphans)
        settle_orphans(r, now);
    if (!r->o.gossip || now < g->next_hello_ns)
        return;
    g->next_hello_ns = now + hello_ns(r);
    if (kvr_wire_encode_gossip_hello(&r->buf, r->o.id, g->epoch, g->seq, r->sub_gen != NULL) ==
        KVR_OK)
        kvr_outbox_add(&r->out, g->subj_gossip, r->buf.data, r->buf.len, KVR_OK);
}

/* --- receiving decisions ------------------------------------------------------------------- */

static void import_decision(struct router *r, const struct kvr_wire_decision *d, uint64_t now,
                            bool repair)
{
    struct replica *g = &r->rep;
    kvr_status st = kvr_router_import(r->core, &d->rec, now);
    if (st == KVR_ERR_UNKNOWN_WORKER)
        g->unknown_worker++;
    else if (st == KVR_ERR_DUPLICATE)
        g->late++; /* already known, or its done came first */
    if (st != KVR_OK)
        return;
    g->imported++;
    g->repaired += repair;
    if (pending_find(r, d->rec.request_id))
        return;
    struct pending *p = calloc(1, sizeof *p);
    if (!p)
        return;
    p->key = d->rec.request_id;
    p->worker_id = d->rec.worker_id;
    p->request_id = strdup(d->request_id);
    p->reply = d->reply[0] ? strdup(d->reply) : NULL;
    /* a decision of this router's earlier incarnation is answered by this one */
    p->origin = strcmp(d->origin, r->o.id) ? peer_get(r, d->origin) : NULL;
    if (!p->request_id || (d->reply[0] && !p->reply)) {
        pending_free(p);
        return;
    }
    HASH_ADD(hh, r->pend, key, sizeof p->key, p);
}

static void apply_gossip(struct router *r, const struct kvr_wire_gossip *m, size_t len)
{
    struct replica *g = &r->rep;
    uint64_t now = kvr_now_ns();
    if (!strcmp(m->router_id, r->o.id)) {
        if (m->epoch != g->epoch) {
            g->bad++;
            kvr_log(KVR_LOG_WARN, "router_id_clash", "id=%s (another router uses this id)",
                    r->o.id);
        }
        return;
    }
    struct peer *p = peer_get(r, m->router_id);
    if (!p) {
        g->bad++;
        return;
    }
    g->received++;
    g->received_bytes += len;
    if (m->epoch < p->epoch) {
        g->stale++; /* from an earlier incarnation, overtaken by its restart */
        return;
    }
    bool hello = m->kind == KVR_WIRE_GOSSIP_HELLO;
    if (m->epoch > p->epoch) {
        /* new, or restarted: what it decided before is in snapshots and heartbeats */
        kvr_log(KVR_LOG_INFO, p->epoch ? "peer_restarted" : "peer_joined", "peer=%s", p->id);
        p->epoch = m->epoch;
        p->next_seq = hello ? m->seq + 1 : m->seq;
    } else if (!peer_alive(r, p, now)) {
        kvr_log(KVR_LOG_INFO, "peer_back", "peer=%s", p->id);
    }
    p->heard_ns = now;
    if (hello) {
        p->serving = m->serving;
        if (m->seq >= p->next_seq) { /* the tail of its decisions never came */
            ask_repair(r, p, p->next_seq, m->seq);
            p->next_seq = m->seq + 1;
        }
        return;
    }
    if (m->seq > p->next_seq)
        ask_repair(r, p, p->next_seq, m->seq - 1);
    if (m->seq >= p->next_seq)
        p->next_seq = m->seq + 1;
    import_decision(r, &m->d, now, false);
}

static void on_gossip(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc;
    (void)sub;
    struct router *r = ctx;
    size_t len = (size_t)natsMsg_GetDataLength(msg);
    struct kvr_wire_gossip m;
    kvr_status st = kvr_wire_decode_gossip(natsMsg_GetData(msg), len, &m);
    pthread_mutex_lock(&r->mu);
    if (st == KVR_OK)
        apply_gossip(r, &m, len);
    else
        r->rep.bad++;
    pthread_mutex_unlock(&r->mu);
    if (st != KVR_OK)
        kvr_log(KVR_LOG_WARN, "gossip_dropped", "bytes=%zu error=\"%s\"", len, kvr_status_str(st));
    kvr_wire_gossip_free(&m);
    natsMsg_Destroy(msg);
    flush(r);
}

/* --- snapshots, repairs, lookups: serving ------------------------------------------------- */

struct pager {
    struct router *r;
    struct kvr_page page;
    struct kvr_buf buf;
    struct kvr_outbox out; /* published after mu is released */
    const char *reply;
    uint64_t token;
    uint32_t records;
};

static void pager_flush(struct pager *pg, bool last)
{
    if (kvr_page_encode(&pg->page, &pg->buf, last, pg->token) == KVR_OK) {
        kvr_outbox_add(&pg->out, pg->reply, pg->buf.data, pg->buf.len, KVR_OK);
        pg->r->rep.pages_sent++;
    }
}

static void pager_record(void *ctx, const struct kvr_request_record *rec)
{
    struct pager *pg = ctx;
    struct router *r = pg->r;
    struct pending *p = pending_find(r, rec->request_id);
    const char *origin = p && p->origin ? p->origin->id : r->o.id;
    if (kvr_page_add_decision(&pg->page, rec, p ? p->reply : NULL, p ? p->request_id : NULL,
                              origin) != KVR_OK)
        return;
    pg->records++;
    if (pg->page.approx > PAGE_BYTES)
        pager_flush(pg, false);
}

static void pager_entry(void *ctx, const struct kvr_index_record *rec)
{
    struct pager *pg = ctx;
    if (kvr_page_add_entry(&pg->page, rec) == KVR_OK && pg->page.approx > PAGE_BYTES)
        pager_flush(pg, false);
}

static void pager_key(struct pager *pg, uint64_t key)
{
    struct kvr_request_record rec;
    if (kvr_router_export(pg->r->core, key, &rec) == KVR_OK)
        pager_record(pg, &rec);
}

/* kv.<ns>.router.sync (full), .lookup (keys) and .repair.<id> (a seq range) */
static void on_sync_request(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc;
    (void)sub;
    struct router *r = ctx;
    const char *reply = natsMsg_GetReply(msg);
    struct kvr_wire_sync q;
    kvr_status st =
        kvr_wire_decode_sync(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), &q);
    struct pager pg = {.r = r, .reply = reply, .token = q.token};
    kvr_page_init(&pg.page);
    pthread_mutex_lock(&r->mu);
    if (st != KVR_OK || !reply || !*reply) {
        r->rep.bad++;
    } else if (q.full) {
        uint64_t now = kvr_now_ns();
        kvr_router_export_requests(r->core, pager_record, &pg);
        kvr_router_export_index(r->core, pager_entry, &pg, now);
        pager_flush(&pg, true);
        r->rep.snapshots_served++;
    } else if (q.nkeys) {
        for (uint32_t i = 0; i < q.nkeys; i++)
            pager_key(&pg, q.keys[i]);
        if (pg.records) /* those who know nothing stay silent */
            pager_flush(&pg, true);
    } else if (q.epoch == r->rep.epoch && q.from_seq <= q.to_seq) {
        for (uint64_t s = q.from_seq; s <= q.to_seq && s <= r->rep.seq; s++) {
            const struct ring_slot *slot = &r->rep.ring[s % RING_SIZE];
            if (slot->seq == s)
                pager_key(&pg, slot->key); /* requests already done are not repaired */
        }
        pager_flush(&pg, true);
    }
    pthread_mutex_unlock(&r->mu);
    if (q.full && st == KVR_OK)
        kvr_log(KVR_LOG_INFO, "snapshot_served", "to=%s requests=%u pages=%u", q.router_id,
                pg.records, pg.out.n);
    {
        struct kvr_sink sink = kvr_nats_sink(r->nc_req);
        kvr_outbox_flush(&pg.out, &sink);
    }
    kvr_outbox_free(&pg.out);
    kvr_page_free(&pg.page);
    kvr_buf_free(&pg.buf);
    kvr_wire_sync_free(&q);
    natsMsg_Destroy(msg);
}

/* --- snapshots, repairs, lookups: receiving ----------------------------------------------- */

struct page_ctx {
    struct router *r;
    uint64_t now;
    bool snapshot; /* the pages of the snapshot this router is waiting for */
};

static void page_decision(void *ctx, const struct kvr_wire_decision *d)
{
    struct page_ctx *c = ctx;
    import_decision(c->r, d, c->now, !c->snapshot);
}

static void page_entry(void *ctx, const struct kvr_index_record *e)
{
    struct page_ctx *c = ctx;
    if (c->snapshot)
        kvr_router_import_index(c->r->core, e, c->now);
}

/* Under mu: the snapshot is in (or will not come): replay the held KV events, in order. */
static void finish_sync(struct router *r, bool complete)
{
    struct replica *g = &r->rep;
    size_t held = g->nheld;
    for (size_t i = 0; i < g->nheld; i++) {
        kvr_status st = apply_kv_event(r, g->held[i].worker_id, g->held[i].data, g->held[i].len);
        r->ev_errors += st == KVR_ERR_MALFORMED;
        free(g->held[i].data);
    }
    g->nheld = 0;
    g->syncing = false;
    if (complete)
        g->synced = true;
    struct kvr_router_stats s;
    kvr_router_stats(r->core, &s);
    kvr_log(complete ? KVR_LOG_INFO : KVR_LOG_WARN, complete ? "synced" : "sync_incomplete",
            "requests=%u index_entries=%u held_events=%zu", s.inflight, s.index_entries, held);
}

static void on_page(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc;
    (void)sub;
    struct router *r = ctx;
    bool last = false;
    uint64_t token = 0;
    pthread_mutex_lock(&r->mu);
    /* while a snapshot is awaited, pages are taken as its (repair pages carry no index entries) */
    uint64_t expect = r->rep.syncing ? r->rep.sync_token : 0;
    struct page_ctx c = {r, kvr_now_ns(), expect != 0};
    if (expect && r->rep.resync &&
        kvr_wire_decode_page(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), NULL, NULL,
                             NULL, &last, &token) == KVR_OK &&
        token == expect) { /* the snapshot's index replaces the one with holes in it */
        kvr_router_index_clear(r->core);
        r->rep.resync = false;
    }
    kvr_status st = kvr_wire_decode_page(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg),
                                         page_decision, page_entry, &c, &last, &token);
    if (st != KVR_OK) {
        r->rep.bad++;
    } else {
        r->rep.pages_received++;
        if (expect && token == expect && last)
            finish_sync(r, true);
    }
    pthread_mutex_unlock(&r->mu);
    natsMsg_Destroy(msg);
    flush(r);
}

/* A live peer that serves (so it has the fleet's state), a different one from call to call. */
static struct peer *serving_peer(struct router *r)
{
    uint64_t now = kvr_now_ns();
    uint32_t n = 0;
    struct peer *p, *tmp, *pick = NULL;
    HASH_ITER(hh, r->rep.peers, p, tmp)
    {
        if (!p->serving || !peer_alive(r, p, now))
            continue;
        n++;
        if (kvr_hash_seq(r->rep.tokens, n) % n == 0)
            pick = p; /* reservoir sampling */
    }
    return pick;
}

/* Under mu: hold KV events back and ask one synced peer for everything. */
static void ask_snapshot(struct router *r, const struct peer *from)
{
    struct replica *g = &r->rep;
    g->syncing = true;
    g->sync_deadline = kvr_now_ns() + r->o.sync_timeout_ms * 1000000ull;
    struct kvr_wire_sync q = {.full = true};
    ask_peer(r, from, &q);
    g->sync_token = q.token;
    kvr_log(KVR_LOG_INFO, "snapshot_asked", "peer=%s", from->id);
}

void replica_resync(struct router *r)
{
    struct replica *g = &r->rep;
    struct peer *from = r->o.gossip && g->synced && !g->syncing ? serving_peer(r) : NULL;
    if (!from)
        return;
    g->resync = true;
    g->resyncs++;
    ask_snapshot(r, from);
    kvr_log(KVR_LOG_INFO, "resync", "reason=\"connection back\"");
}

void replica_sync(struct router *r)
{
    struct replica *g = &r->rep;
    uint64_t t0 = kvr_now_ns();
    for (int attempt = 0; attempt < SYNC_TRIES; attempt++) {
        pthread_mutex_lock(&r->mu);
        struct peer *from = r->o.gossip ? serving_peer(r) : NULL;
        if (!from) {
            g->synced = true;
            pthread_mutex_unlock(&r->mu);
            kvr_log(KVR_LOG_INFO, "sync_skipped", "reason=\"%s\"",
                    r->o.gossip ? "no serving peer" : "gossip off");
            return;
        }
        ask_snapshot(r, from);
        pthread_mutex_unlock(&r->mu);
        flush(r);
        for (;;) {
            kvr_sleep_ns(2000000);
            pthread_mutex_lock(&r->mu);
            bool done = g->synced, late = kvr_now_ns() > g->sync_deadline;
            if (!done && late && attempt + 1 == SYNC_TRIES)
                finish_sync(r, false); /* go on: gossip, lookups and heartbeats fill in */
            pthread_mutex_unlock(&r->mu);
            if (done) {
                pthread_mutex_lock(&r->mu);
                g->sync_ms = (kvr_now_ns() - t0) / 1000000;
                pthread_mutex_unlock(&r->mu);
                return;
            }
            if (late)
                break;
        }
        kvr_log(KVR_LOG_WARN, "sync_timeout", "attempt=%d", attempt + 1);
    }
    pthread_mutex_lock(&r->mu);
    g->synced = true; /* anti-entropy from here on */
    pthread_mutex_unlock(&r->mu);
}

bool replica_hold_event(struct router *r, uint64_t worker_id, const void *data, size_t len)
{
    struct replica *g = &r->rep;
    if (!g->syncing)
        return false;
    if (g->nheld == g->capheld) {
        size_t cap = g->capheld ? g->capheld * 2 : 1024;
        struct held_event *h = cap <= HELD_MAX ? realloc(g->held, cap * sizeof *h) : NULL;
        if (!h) {
            g->held_dropped++; /* applied now instead: at worst a stale entry until evicted */
            return false;
        }
        g->held = h;
        g->capheld = cap;
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) {
        g->held_dropped++;
        return false;
    }
    memcpy(copy, data, len);
    g->held[g->nheld++] = (struct held_event){worker_id, copy, len};
    return true;
}

/* --- anti-entropy and answering clients ---------------------------------------------------- */

void replica_reconcile(struct router *r, uint64_t worker_id, const uint64_t *keys, uint32_t n,
                       uint32_t interval_ms, uint64_t now)
{
    if (!r->rep.synced)
        return; /* without the snapshot it would drop nothing but ask for everything */
    uint64_t grace = 2ull * (interval_ms ? interval_ms : 1000) * 1000000ull;
    uint64_t unknown[LOOKUP_MAX];
    uint32_t nunknown = 0;
    uint32_t dropped = kvr_router_reconcile(r->core, worker_id, keys, n, now, grace, unknown,
                                            &nunknown, LOOKUP_MAX);
    if (dropped)
        kvr_log(KVR_LOG_WARN, "reconciled", "worker=%" PRIu64 " dropped=%u", worker_id, dropped);
    if (nunknown && r->o.gossip) {
        struct kvr_wire_sync q = {.keys = unknown, .nkeys = nunknown};
        ask(r, r->rep.subj_lookup, &q);
        r->rep.lookups++;
    }
}

/* Whether this router answers for requests whose origin is silent: the live one with the smallest
 * id does. */
static bool stands_in(struct router *r, uint64_t now)
{
    struct peer *q, *tmp;
    HASH_ITER(hh, r->rep.peers, q, tmp)
    {
        if (peer_alive(r, q, now) && strcmp(q->id, r->o.id) < 0)
            return false;
    }
    return true;
}

void replica_failed(struct router *r, struct pending *p, kvr_status st)
{
    struct replica *g = &r->rep;
    uint64_t now = kvr_now_ns();
    if (!p->origin) {
        queue_error(r, p->reply, p->request_id, st);
    } else if (!peer_alive(r, p->origin, now) && !p->orphan_at) {
        /* its origin is silent: maybe gone, maybe cut off for a moment (then it places the
         * request again itself). Wait, then answer if it is still silent. */
        if (g->norphans == g->caporphans) {
            uint32_t cap = g->caporphans ? g->caporphans * 2 : 64;
            uint64_t *o = realloc(g->orphans, cap * sizeof *o);
            if (o) {
                g->orphans = o;
                g->caporphans = cap;
            }
        }
        if (g->norphans < g->caporphans) {
            p->orphan_at = now + 8 * hello_ns(r);
            p->orphan_status = st;
            g->orphans[g->norphans++] = p->key;
            return;
        }
        if (stands_in(r, now))
            queue_error(r, p->reply, p->request_id, st);
    }
    pending_drop(r, p);
}

/* Under mu: orphans whose grace period is over. */
static void settle_orphans(struct router *r, uint64_t now)
{
    struct replica *g = &r->rep;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < g->norphans; i++) {
        struct pending *p = pending_find(r, g->orphans[i]);
        if (!p || !p->orphan_at)
            continue;
        if (now < p->orphan_at) {
            g->orphans[kept++] = g->orphans[i];
            continue;
        }
        p->orphan_at = 0;
        struct kvr_request_record rec;
        if (kvr_router_export(r->core, p->key, &rec) == KVR_OK)
            continue; /* placed again meanwhile: in flight */
        if (!peer_alive(r, p->origin, now) && stands_in(r, now)) {
            queue_error(r, p->reply, p->request_id, p->orphan_status);
            g->orphans_answered++;
        }
        pending_drop(r, p);
    }
    g->norphans = kept;
}

/* --- digest and stats ---------------------------------------------------------------------- */

static int digest_json(struct router *r, char *buf, size_t len)
{
    struct kvr_digest d;
    kvr_router_digest(r->core, &d);
    return snprintf(buf, len,
                    "\"digest\":\"%016" PRIx64 "\",\"digest_workers\":\"%016" PRIx64
                    "\",\"digest_requests\":\"%016" PRIx64 "\",\"digest_index\":\"%016" PRIx64
                    "\",\"workers\":%u,\"requests\":%u,\"index_entries\":%u",
                    d.combined, d.workers, d.requests, d.index, d.nworkers, d.nrequests,
                    d.nentries);
}

int replica_stats_json(struct router *r, char *buf, size_t len)
{
    struct replica *g = &r->rep;
    uint64_t now = kvr_now_ns(), alive = 0;
    struct peer *p, *tmp;
    HASH_ITER(hh, g->peers, p, tmp)
    alive += peer_alive(r, p, now);
    struct kvr_router_stats s;
    kvr_router_stats(r->core, &s);
    const struct {
        const char *name;
        uint64_t value;
    } counters[] = {
        {"epoch", g->epoch},
        {"seq", g->seq},
        {"sync_ms", g->sync_ms},
        {"peers", g->npeers},
        {"peers_alive", alive},
        {"decided", g->decided},
        {"gossip_sent", g->sent},
        {"gossip_bytes", g->sent_bytes},
        {"gossip_received", g->received},
        {"gossip_received_bytes", g->received_bytes},
        {"gossip_bad", g->bad},
        {"gossip_stale", g->stale},
        {"imported", g->imported},
        {"already_known", g->late},
        {"late_decisions", s.late_decisions},
        {"early_events", s.early_events},
        {"import_unknown_worker", g->unknown_worker},
        {"gaps", g->gaps},
        {"repairs_asked", g->repairs_asked},
        {"repaired", g->repaired},
        {"lookups", g->lookups},
        {"reconciled", s.reconciled},
        {"pages_sent", g->pages_sent},
        {"pages_received", g->pages_received},
        {"snapshots_served", g->snapshots_served},
        {"held_dropped", g->held_dropped},
        {"resends", g->resends},
        {"resyncs", g->resyncs},
        {"orphans_answered", g->orphans_answered},
        {"gossip_dropped_by_test_knob", g->dropped_by_knob},
    };
    int n = snprintf(buf, len, "\"synced\":%s,\"gossip_bytes_per_decision\":%.1f,",
                     g->synced ? "true" : "false",
                     g->sent ? (double)g->sent_bytes / (double)g->sent : 0.0);
    for (size_t i = 0; i < sizeof counters / sizeof counters[0] && n > 0 && (size_t)n < len; i++)
        n += snprintf(buf + n, len - (size_t)n, "\"%s\":%" PRIu64 ",", counters[i].name,
                      counters[i].value);
    if (n < 0 || (size_t)n >= len)
        return n;
    return n + digest_json(r, buf + n, len - (size_t)n);
}

/* kv.<ns>.router.digest: every router answers (collect the answers for a while). */
static void on_digest(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)sub;
    struct router *r = ctx;
    char buf[4096];
    pthread_mutex_lock(&r->mu);
    int n = snprintf(buf, sizeof buf, "{\"router_id\":\"%s\",", r->o.id);
    n += replica_stats_json(r, buf + n, sizeof buf - (size_t)n);
    pthread_mutex_unlock(&r->mu);
    n += snprintf(buf + n, sizeof buf - (size_t)n, "}");
    const char *reply = natsMsg_GetReply(msg);
    if (reply && n > 0 && (size_t)n < sizeof buf)
        natsConnection_Publish(nc, reply, buf, n);
    natsMsg_Destroy(msg);
}

natsStatus replica_subscribe(struct router *r)
{
    struct replica *g = &r->rep;
    natsStatus s = natsConnection_Subscribe(&r->sub_gossip, r->nc_ev, g->subj_gossip, on_gossip, r);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(r->sub_gossip, -1, -1);
    if (s == NATS_OK)
        s = natsConnection_Subscribe(&r->sub_pages, r->nc_ev, g->subj_pages, on_page, r);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(r->sub_pages, -1, -1);
    if (s == NATS_OK)
        s = natsConnection_Subscribe(&r->sub_sync, r->nc_ev, g->subj_sync, on_sync_request, r);
    if (s == NATS_OK)
        s = natsConnection_Subscribe(&r->sub_lookup, r->nc_ev, g->subj_lookup, on_sync_request, r);
    if (s == NATS_OK)
        s = natsConnection_Subscribe(&r->sub_digest, r->nc_req, g->subj_digest, on_digest, r);
    return s;
}
