/*
 * kvr_wire over protobuf-c for router replicas: Gossip (one decision, a hello or a queued notice),
 * SyncRequest (a snapshot, a repair or a lookup) and SyncPage (decisions and index entries, built
 * with kvr_page in pages of ~256 KB). A decision is checked in one place (check_decision) whether
 * it comes in a Gossip or in a page, and a page is checked whole (its counts on the wire before
 * protobuf-c allocates, then every record) before its callbacks see any of it; they see views into
 * the unpacked message, so nothing can fail half-way through a page. Decoders follow codec.h's
 * error discipline, with the helpers of codec_internal.h. Pure and thread-safe.
 */
#include "codec.h"

#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "kvrouter.pb-c.h" /* generated from proto/kvrouter/v1/kvrouter.proto */

/* Field numbers the wire-level counts need (proto/kvrouter/v1/kvrouter.proto). */
#define SYNC_PAGE_DECISIONS 1 /* SyncPage.decisions */
#define SYNC_PAGE_ENTRIES   2 /* SyncPage.entries */

#define NS_PER_MS 1000000ull

/* --- decisions --------------------------------------------------------------------------- */

void kvr_wire_decision_free(struct kvr_wire_decision *d)
{
    free((void *)d->rec.block_hashes);
    free(d->reply);
    free(d->request_id);
    free(d->origin);
    memset(d, 0, sizeof *d);
}

static void fill_decision_msg(Kvrouter__V1__Decision *m, const struct kvr_request_record *rec,
                              const char *reply, const char *request_id, const char *origin,
                              uint64_t decided_ns, uint32_t placement)
{
    m->decided_ns = decided_ns;
    m->placement = placement;
    m->request_key = rec->request_id;
    m->worker_id = rec->worker_id;
    m->block_hashes = (uint64_t *)rec->block_hashes;
    m->n_block_hashes = rec->nblocks;
    m->prompt_tokens = rec->prompt_tokens;
    m->overlap_blocks = rec->overlap_blocks;
    m->reply = (char *)(reply ? reply : "");
    m->request_id = (char *)(request_id ? request_id : "");
    m->prefill_done = rec->prefill_done;
    m->output_blocks = rec->output_blocks;
    m->max_tokens = rec->max_tokens;
    m->origin = (char *)(origin ? origin : "");
}

/* An unpacked Decision within the caps (else KVR_ERR_TOO_LARGE) and naming a request and a worker,
 * with a cached prefix no longer than its blocks (else KVR_ERR_INVALID). */
static kvr_status check_decision(const Kvrouter__V1__Decision *m)
{
    if (!m)
        return KVR_ERR_MALFORMED;
    if (m->n_block_hashes > KVR_WIRE_DECISION_BLOCKS_MAX ||
        strlen(kvr_codec_str(m->reply)) > KVR_REPLY_MAX ||
        strlen(kvr_codec_str(m->request_id)) > KVR_REQUEST_ID_MAX ||
        strlen(kvr_codec_str(m->origin)) > KVR_ROUTER_ID_MAX)
        return KVR_ERR_TOO_LARGE;
    if (m->request_key == 0 || m->worker_id == 0 || m->overlap_blocks > m->n_block_hashes)
        return KVR_ERR_INVALID;
    return KVR_OK;
}

/* A view of a checked Decision: d borrows m's hashes and strings. */
static void view_decision(const Kvrouter__V1__Decision *m, struct kvr_wire_decision *d)
{
    d->rec = (struct kvr_request_record){
        m->request_key,   m->worker_id,      m->block_hashes, (uint32_t)m->n_block_hashes,
        m->prompt_tokens, m->overlap_blocks, m->prefill_done, m->output_blocks,
        m->max_tokens};
    d->reply = kvr_codec_str(m->reply);
    d->request_id = kvr_codec_str(m->request_id);
    d->origin = kvr_codec_str(m->origin);
    d->decided_ns = m->decided_ns;
    d->placement = m->placement;
}

/* Check an unpacked Decision and copy it into d (owned; zeroed on an error). */
static kvr_status take_decision(const Kvrouter__V1__Decision *m, struct kvr_wire_decision *d)
{
    memset(d, 0, sizeof *d);
    kvr_status st = check_decision(m);
    if (st != KVR_OK)
        return st;
    struct kvr_wire_decision v;
    view_decision(m, &v);
    uint64_t *h = kvr_codec_array(v.rec.nblocks, sizeof *h);
    if (!h)
        return KVR_ERR_NOMEM;
    if (v.rec.nblocks)
        memcpy(h, v.rec.block_hashes, v.rec.nblocks * sizeof *h);
    d->rec = v.rec;
    d->rec.block_hashes = h;
    d->decided_ns = v.decided_ns;
    d->placement = v.placement;
    st = kvr_codec_dup(v.reply, KVR_REPLY_MAX, &d->reply);
    if (st == KVR_OK)
        st = kvr_codec_dup(v.request_id, KVR_REQUEST_ID_MAX, &d->request_id);
    if (st == KVR_OK)
        st = kvr_codec_dup(v.origin, KVR_ROUTER_ID_MAX, &d->origin);
    if (st != KVR_OK)
        kvr_wire_decision_free(d);
    return st;
}

/* --- gossip ------------------------------------------------------------------------------ */

void kvr_wire_gossip_free(struct kvr_wire_gossip *g)
{
    free(g->router_id);
    kvr_wire_decision_free(&g->d);
    free(g->q.reply);
    free(g->q.request_id);
    memset(g, 0, sizeof *g);
}

/* g, its body set, from router_id (epoch, seq) into b. */
static kvr_status pack_gossip(struct kvr_buf *b, const char *router_id, uint64_t epoch,
                              uint64_t seq, Kvrouter__V1__Gossip *g)
{
    g->router_id = (char *)router_id;
    g->epoch = epoch;
    g->seq = seq;
    return kvr_codec_pack(b, &g->base);
}

kvr_status kvr_wire_encode_gossip_decision(struct kvr_buf *b, const char *router_id, uint64_t epoch,
                                           uint64_t seq, const struct kvr_request_record *rec,
                                           const char *reply, const char *request_id,
                                           const char *origin, uint64_t decided_ns,
                                           uint32_t placement)
{
    Kvrouter__V1__Gossip g = KVROUTER__V1__GOSSIP__INIT;
    Kvrouter__V1__Decision d = KVROUTER__V1__DECISION__INIT;
    fill_decision_msg(&d, rec, reply, request_id, origin, decided_ns, placement);
    g.body_case = KVROUTER__V1__GOSSIP__BODY_DECISION;
    g.decision = &d;
    return pack_gossip(b, router_id, epoch, seq, &g);
}

kvr_status kvr_wire_encode_gossip_hello(struct kvr_buf *b, const char *router_id, uint64_t epoch,
                                        uint64_t seq, bool serving)
{
    Kvrouter__V1__Gossip g = KVROUTER__V1__GOSSIP__INIT;
    Kvrouter__V1__Hello h = KVROUTER__V1__HELLO__INIT;
    h.serving = serving;
    g.body_case = KVROUTER__V1__GOSSIP__BODY_HELLO;
    g.hello = &h;
    return pack_gossip(b, router_id, epoch, seq, &g);
}

kvr_status kvr_wire_encode_gossip_queued(struct kvr_buf *b, const char *router_id, uint64_t epoch,
                                         uint64_t seq, const struct kvr_wire_queued *q)
{
    Kvrouter__V1__Gossip g = KVROUTER__V1__GOSSIP__INIT;
    Kvrouter__V1__Queued m = KVROUTER__V1__QUEUED__INIT;
    m.reply = (char *)(q->reply ? q->reply : "");
    m.request_id = (char *)(q->request_id ? q->request_id : "");
    m.decided_ns = q->decided_ns;
    m.wait_ms = q->wait_ms;
    m.released = q->released;
    m.error_code = (Kvrouter__V1__ErrorCode)q->error_code;
    g.body_case = KVROUTER__V1__GOSSIP__BODY_QUEUED;
    g.queued = &m;
    return pack_gossip(b, router_id, epoch, seq, &g);
}

/* Check an unpacked Queued notice and copy it into q (owned). */
static kvr_status take_queued(const Kvrouter__V1__Queued *m, struct kvr_wire_queued *q)
{
    if (!kvr_codec_str(m->reply)[0])
        return KVR_ERR_INVALID; /* nobody to absorb a resend for */
    kvr_status st = kvr_codec_dup(m->reply, KVR_REPLY_MAX, &q->reply);
    if (st == KVR_OK)
        st = kvr_codec_dup(m->request_id, KVR_REQUEST_ID_MAX, &q->request_id);
    q->decided_ns = m->decided_ns;
    q->wait_ms = m->wait_ms;
    q->released = m->released;
    q->error_code = (uint32_t)m->error_code;
    return st;
}

kvr_status kvr_wire_decode_gossip(const void *buf, size_t len, struct kvr_wire_gossip *out)
{
    memset(out, 0, sizeof *out);
    if (len > KVR_WIRE_GOSSIP_MAX)
        return KVR_ERR_TOO_LARGE;
    struct kvr_codec_alloc a;
    kvr_status why;
    Kvrouter__V1__Gossip *m =
        kvr_codec_unpack(&a, &kvrouter__v1__gossip__descriptor, buf, len, &why);
    if (!m)
        return why;
    kvr_status st = KVR_OK;
    if (m->body_case == KVROUTER__V1__GOSSIP__BODY_DECISION && m->decision)
        out->kind = KVR_WIRE_GOSSIP_DECISION;
    else if (m->body_case == KVROUTER__V1__GOSSIP__BODY_HELLO && m->hello)
        out->kind = KVR_WIRE_GOSSIP_HELLO;
    else if (m->body_case == KVROUTER__V1__GOSSIP__BODY_QUEUED && m->queued)
        out->kind = KVR_WIRE_GOSSIP_QUEUED;
    else
        st = KVR_ERR_MALFORMED;
    if (st == KVR_OK)
        st = kvr_codec_dup(m->router_id, KVR_ROUTER_ID_MAX, &out->router_id);
    if (st == KVR_OK && out->kind == KVR_WIRE_GOSSIP_DECISION)
        st = take_decision(m->decision, &out->d);
    if (st == KVR_OK && out->kind == KVR_WIRE_GOSSIP_HELLO)
        out->serving = m->hello->serving;
    if (st == KVR_OK && out->kind == KVR_WIRE_GOSSIP_QUEUED)
        st = take_queued(m->queued, &out->q);
    if (st == KVR_OK && !out->router_id[0])
        st = KVR_ERR_INVALID;
    out->epoch = m->epoch;
    out->seq = m->seq;
    kvrouter__v1__gossip__free_unpacked(m, &a.pc);
    if (st != KVR_OK)
        kvr_wire_gossip_free(out);
    return st;
}

/* --- sync requests ----------------------------------------------------------------------- */

void kvr_wire_sync_free(struct kvr_wire_sync *s)
{
    free(s->router_id);
    free(s->keys);
    memset(s, 0, sizeof *s);
}

kvr_status kvr_wire_encode_sync(struct kvr_buf *b, const struct kvr_wire_sync *s)
{
    Kvrouter__V1__SyncRequest m = KVROUTER__V1__SYNC_REQUEST__INIT;
    m.router_id = s->router_id ? s->router_id : "";
    m.full = s->full;
    m.keys = s->keys;
    m.n_keys = s->nkeys;
    m.from_seq = s->from_seq;
    m.to_seq = s->to_seq;
    m.epoch = s->epoch;
    m.token = s->token;
    return kvr_codec_pack(b, &m.base);
}

kvr_status kvr_wire_decode_sync(const void *buf, size_t len, struct kvr_wire_sync *out)
{
    memset(out, 0, sizeof *out);
    if (len > KVR_WIRE_SYNC_MAX)
        return KVR_ERR_TOO_LARGE;
    struct kvr_codec_alloc a;
    kvr_status why;
    Kvrouter__V1__SyncRequest *m =
        kvr_codec_unpack(&a, &kvrouter__v1__sync_request__descriptor, buf, len, &why);
    if (!m)
        return why;
    kvr_status st = KVR_ERR_TOO_LARGE;
    if (m->n_keys <= KVR_WIRE_SYNC_KEYS_MAX)
        st = kvr_codec_dup(m->router_id, KVR_ROUTER_ID_MAX, &out->router_id);
    if (st == KVR_OK && m->to_seq - m->from_seq > KVR_WIRE_SYNC_RANGE_MAX) /* backwards wraps */
        st = KVR_ERR_INVALID;
    if (st == KVR_OK && !(out->keys = kvr_codec_array(m->n_keys, sizeof *out->keys)))
        st = KVR_ERR_NOMEM;
    if (st == KVR_OK && m->n_keys)
        memcpy(out->keys, m->keys, m->n_keys * sizeof *out->keys);
    out->nkeys = (uint32_t)m->n_keys;
    out->full = m->full;
    out->from_seq = m->from_seq;
    out->to_seq = m->to_seq;
    out->epoch = m->epoch;
    out->token = m->token;
    kvrouter__v1__sync_request__free_unpacked(m, &a.pc);
    if (st != KVR_OK)
        kvr_wire_sync_free(out);
    return st;
}

/* --- pages ------------------------------------------------------------------------------- */

/* A page under construction keeps records and, in one arena, the hashes and strings they use. */
struct page_decision {
    struct kvr_request_record rec;            /* block_hashes unused: hashes at arena offset */
    size_t hashes, reply, request_id, origin; /* arena offsets */
    uint64_t decided_ns;                      /* */
    uint32_t placement;                       /* */
};

void kvr_page_init(struct kvr_page *p)
{
    memset(p, 0, sizeof *p);
}

void kvr_page_free(struct kvr_page *p)
{
    free(p->decisions);
    free(p->entries);
    kvr_buf_free(&p->strings);
    memset(p, 0, sizeof *p);
}

static kvr_status arena_put(struct kvr_buf *a, const void *data, size_t len, size_t *off)
{
    size_t at = (a->len + 7) & ~(size_t)7;
    kvr_status st = kvr_buf_reserve(a, at + len + 1);
    if (st != KVR_OK)
        return st;
    if (len)
        memcpy(a->data + at, data, len);
    a->data[at + len] = 0;
    a->len = at + len + 1;
    *off = at;
    return KVR_OK;
}

/* Make room for one more item in a page's array of *cap items of size bytes. */
static kvr_status page_grow(void **items, uint32_t n, uint32_t *cap, uint32_t first, size_t size)
{
    if (n < *cap)
        return KVR_OK;
    if (*cap > UINT32_MAX / 2)
        return KVR_ERR_FULL;
    uint32_t c = *cap ? *cap * 2 : first;
    void *d = realloc(*items, (size_t)c * size);
    if (!d)
        return KVR_ERR_NOMEM;
    *items = d;
    *cap = c;
    return KVR_OK;
}

kvr_status kvr_page_add_decision(struct kvr_page *p, const struct kvr_request_record *rec,
                                 const char *reply, const char *request_id, const char *origin,
                                 uint64_t decided_ns, uint32_t placement)
{
    kvr_status st =
        page_grow(&p->decisions, p->ndecisions, &p->capd, 64, sizeof(struct page_decision));
    if (st != KVR_OK)
        return st;
    struct page_decision *pd = (struct page_decision *)p->decisions + p->ndecisions;
    pd->rec = *rec;
    pd->decided_ns = decided_ns;
    pd->placement = placement;
    reply = reply ? reply : "";
    request_id = request_id ? request_id : "";
    origin = origin ? origin : "";
    st = arena_put(&p->strings, rec->block_hashes, (size_t)rec->nblocks * sizeof(uint64_t),
                   &pd->hashes);
    if (st == KVR_OK)
        st = arena_put(&p->strings, reply, strlen(reply), &pd->reply);
    if (st == KVR_OK)
        st = arena_put(&p->strings, request_id, strlen(request_id), &pd->request_id);
    if (st == KVR_OK)
        st = arena_put(&p->strings, origin, strlen(origin), &pd->origin);
    if (st != KVR_OK)
        return st;
    p->ndecisions++;
    p->approx +=
        64 + (size_t)rec->nblocks * 9 + strlen(reply) + strlen(request_id) + strlen(origin);
    return KVR_OK;
}

kvr_status kvr_page_add_entry(struct kvr_page *p, const struct kvr_index_record *rec)
{
    kvr_status st =
        page_grow(&p->entries, p->nentries, &p->cape, 256, sizeof(struct kvr_index_record));
    if (st != KVR_OK)
        return st;
    ((struct kvr_index_record *)p->entries)[p->nentries++] = *rec;
    p->approx += 40;
    return KVR_OK;
}

kvr_status kvr_page_encode(struct kvr_page *p, struct kvr_buf *b, bool last, uint64_t token)
{
    Kvrouter__V1__SyncPage m = KVROUTER__V1__SYNC_PAGE__INIT;
    Kvrouter__V1__Decision *d = calloc((size_t)p->ndecisions + 1, sizeof *d);
    Kvrouter__V1__Decision **dp = calloc((size_t)p->ndecisions + 1, sizeof *dp);
    Kvrouter__V1__IndexEntry *e = calloc((size_t)p->nentries + 1, sizeof *e);
    Kvrouter__V1__IndexEntry **ep = calloc((size_t)p->nentries + 1, sizeof *ep);
    kvr_status st = d && dp && e && ep ? KVR_OK : KVR_ERR_NOMEM;
    for (uint32_t i = 0; st == KVR_OK && i < p->ndecisions; i++) {
        const struct page_decision *pd = (const struct page_decision *)p->decisions + i;
        Kvrouter__V1__Decision x = KVROUTER__V1__DECISION__INIT;
        struct kvr_request_record rec = pd->rec;
        rec.block_hashes = (const uint64_t *)(p->strings.data + pd->hashes);
        fill_decision_msg(&x, &rec, (char *)p->strings.data + pd->reply,
                          (char *)p->strings.data + pd->request_id,
                          (char *)p->strings.data + pd->origin, pd->decided_ns, pd->placement);
        d[i] = x;
        dp[i] = &d[i];
    }
    for (uint32_t i = 0; st == KVR_OK && i < p->nentries; i++) {
        const struct kvr_index_record *r = (const struct kvr_index_record *)p->entries + i;
        Kvrouter__V1__IndexEntry x = KVROUTER__V1__INDEX_ENTRY__INIT;
        x.worker_id = r->worker_id;
        x.seq = r->seq;
        x.has_engine = r->has_engine;
        x.engine_id = r->engine_id;
        x.ttl_left_ms = r->ttl_left_ns / NS_PER_MS;
        e[i] = x;
        ep[i] = &e[i];
    }
    if (st == KVR_OK) {
        m.decisions = dp;
        m.n_decisions = p->ndecisions;
        m.entries = ep;
        m.n_entries = p->nentries;
        m.last = last;
        m.token = token;
        m.index_partial = p->index_partial;
        st = kvr_codec_pack(b, &m.base);
    }
    free(d);
    free(dp);
    free(e);
    free(ep);
    p->ndecisions = p->nentries = 0;
    p->approx = 0;
    p->strings.len = 0;
    return st;
}

/* An unpacked page whose every record is good (codec.h, kvr_wire_decode_page). */
static kvr_status check_page(const Kvrouter__V1__SyncPage *m)
{
    if (m->n_decisions > KVR_WIRE_PAGE_ITEMS_MAX || m->n_entries > KVR_WIRE_PAGE_ITEMS_MAX)
        return KVR_ERR_TOO_LARGE;
    for (size_t i = 0; i < m->n_decisions; i++) {
        kvr_status st = check_decision(m->decisions[i]);
        if (st != KVR_OK)
            return st;
    }
    for (size_t i = 0; i < m->n_entries; i++) {
        const Kvrouter__V1__IndexEntry *x = m->entries[i];
        if (x->worker_id == 0 || x->ttl_left_ms > UINT64_MAX / NS_PER_MS)
            return KVR_ERR_INVALID;
    }
    return KVR_OK;
}

/* Refuse over-many records before protobuf-c allocates one struct for each. */
static kvr_status check_page_counts(const void *buf, size_t len)
{
    size_t nd, ne;
    kvr_status st = kvr_codec_count(buf, len, SYNC_PAGE_DECISIONS, 0, &nd);
    if (st == KVR_OK)
        st = kvr_codec_count(buf, len, SYNC_PAGE_ENTRIES, 0, &ne);
    if (st == KVR_OK && (nd > KVR_WIRE_PAGE_ITEMS_MAX || ne > KVR_WIRE_PAGE_ITEMS_MAX))
        st = KVR_ERR_TOO_LARGE;
    return st;
}

kvr_status kvr_wire_decode_page(const void *buf, size_t len,
                                void (*on_decision)(void *ctx, const struct kvr_wire_decision *d),
                                void (*on_entry)(void *ctx, const struct kvr_index_record *e),
                                void *ctx, struct kvr_wire_page_head *head)
{
    *head = (struct kvr_wire_page_head){0};
    if (len > KVR_WIRE_PAGE_MAX)
        return KVR_ERR_TOO_LARGE;
    kvr_status st = check_page_counts(buf, len);
    if (st != KVR_OK)
        return st;
    struct kvr_codec_alloc a;
    kvr_status why;
    Kvrouter__V1__SyncPage *m =
        kvr_codec_unpack(&a, &kvrouter__v1__sync_page__descriptor, buf, len, &why);
    if (!m)
        return why;
    st = check_page(m);
    if (st == KVR_OK)
        *head = (struct kvr_wire_page_head){m->last, m->token, m->index_partial};
    for (size_t i = 0; st == KVR_OK && on_decision && i < m->n_decisions; i++) {
        struct kvr_wire_decision d;
        view_decision(m->decisions[i], &d);
        on_decision(ctx, &d);
    }
    for (size_t i = 0; st == KVR_OK && on_entry && i < m->n_entries; i++) {
        const Kvrouter__V1__IndexEntry *x = m->entries[i];
        struct kvr_index_record r = {x->worker_id, x->seq, x->has_engine, x->engine_id,
                                     x->ttl_left_ms * NS_PER_MS};
        on_entry(ctx, &r);
    }
    kvrouter__v1__sync_page__free_unpacked(m, &a.pc);
    return st;
}
