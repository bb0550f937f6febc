/*
 * kvr_wire over protobuf-c: the worker's event messages (KvEvent, TokensEvent, DoneEvent,
 * Heartbeat) and the cancels (a client's CancelRequest, a router's WorkerCancel). The same
 * discipline as codec.c (codec.h): byte cap first, repeated submessages counted on the wire before
 * protobuf-c allocates them, unpacking through the recording allocator, values checked before they
 * are copied. Pure and thread-safe.
 */
#include "codec.h"

#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "kvrouter.pb-c.h" /* generated from proto/kvrouter/v1/kvrouter.proto */

/* Field numbers the wire-level counts need (proto/kvrouter/v1/kvrouter.proto). */
#define KV_EVENT_STORED 3 /* KvEvent.stored */
#define STORED_BLOCKS   3 /* Stored.blocks */
#define BATCH_EVENTS    2 /* EventBatch.events */

/* --- worker events ----------------------------------------------------------------------- */

void kvr_wire_kv_free(struct kvr_wire_kv *e)
{
    free(e->blocks);
    free(e->ids);
    memset(e, 0, sizeof *e);
}

static kvr_status take_stored(const Kvrouter__V1__Stored *s, struct kvr_wire_kv *out)
{
    out->kind = KVR_WIRE_STORED;
    out->has_parent = s->has_parent;
    out->parent = s->parent;
    if (s->n_blocks > KVR_WIRE_STORED_BLOCKS_MAX)
        return KVR_ERR_TOO_LARGE;
    out->blocks = kvr_codec_array(s->n_blocks, sizeof *out->blocks);
    if (!out->blocks)
        return KVR_ERR_NOMEM;
    for (size_t i = 0; i < s->n_blocks; i++)
        out->blocks[i] = (struct kvr_kv_block){s->blocks[i]->engine_id, s->blocks[i]->local_hash};
    out->nblocks = (uint32_t)s->n_blocks;
    return KVR_OK;
}

static kvr_status take_removed(const Kvrouter__V1__Removed *r, struct kvr_wire_kv *out)
{
    out->kind = KVR_WIRE_REMOVED;
    if (r->n_engine_ids > KVR_WIRE_REMOVED_IDS_MAX)
        return KVR_ERR_TOO_LARGE;
    out->ids = kvr_codec_array(r->n_engine_ids, sizeof *out->ids);
    if (!out->ids)
        return KVR_ERR_NOMEM;
    if (r->n_engine_ids)
        memcpy(out->ids, r->engine_ids, r->n_engine_ids * sizeof *out->ids);
    out->nids = (uint32_t)r->n_engine_ids;
    return KVR_OK;
}

/*
 * The fast path of a KvEvent of Stored blocks, the engines' most frequent event. protobuf-c spends
 * ~220 ns a block on an 850-block event (a StoredBlock message allocated, initialised and freed
 * for each, each varint scanned twice); this path reads the blocks straight into their array.
 * The shape: worker_id and event_seq (varints) at most once each and stored once; in it,
 * has_parent (a one-byte varint) and parent (a varint) at most once each and any number of
 * blocks; in each block, engine_id and local_hash (varints) at most once each. Anything else (a
 * Removed or Cleared event, a field twice, an unknown field or wire type, over-many blocks,
 * broken framing) goes to protobuf-c, so every answer is the one protobuf-c gives
 * (tests/unit/test_codec.c and the kv fuzz target compare the two).
 */
struct fast_kv {
    uint64_t worker_id, event_seq, parent;
    bool has_parent;
    const uint8_t *stored, *blocks_end; /* the Stored message's bytes */
    size_t nblocks;                     /* its blocks */
};

/* A varint of at most five bytes at *p: protobuf-c refuses a longer key or length, even one
 * that pads a small value (a length of 0 in nine bytes: found by the kv fuzz target). */
static bool fast_varint5(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    const uint8_t *at = *p;
    return kvr_codec_varint(p, end, v) && *p - at <= 5;
}

/* A field's key at *p: its number and wire type; false past end or beyond 32 bits. */
static bool fast_key(const uint8_t **p, const uint8_t *end, uint64_t *field, unsigned *type)
{
    uint64_t key;
    if (!fast_varint5(p, end, &key) || key > UINT32_MAX)
        return false;
    *field = key >> 3;
    *type = (unsigned)(key & 7);
    return true;
}

/* A length-delimited field's payload at *p: [*body, *body + *n), *p moved past it. */
static bool fast_body(const uint8_t **p, const uint8_t *end, const uint8_t **body, size_t *n)
{
    uint64_t len;
    if (!fast_varint5(p, end, &len) || len > UINT32_MAX || len > (uint64_t)(end - *p))
        return false;
    *body = *p;
    *n = (size_t)len;
    *p += len;
    return true;
}

/* The KvEvent's own fields, if they have the shape. */
static bool fast_kv_event(const uint8_t *p, const uint8_t *end, struct fast_kv *k)
{
    unsigned seen = 0;
    while (p < end) {
        uint64_t field, v;
        unsigned type;
        if (!fast_key(&p, end, &field, &type) || field < 1 || field > 3 || (seen & 1u << field))
            return false;
        seen |= 1u << field;
        if (field == 3) {
            size_t n;
            if (type != 2 || !fast_body(&p, end, &k->stored, &n))
                return false;
            k->blocks_end = k->stored + n;
        } else if (type != 0 || !kvr_codec_varint(&p, end, &v)) {
            return false;
        } else {
            *(field == 1 ? &k->worker_id : &k->event_seq) = v;
        }
    }
    return k->stored != NULL;
}

/* The Stored message's fields, if they have the shape; its blocks are counted, not read. */
static bool fast_stored(struct fast_kv *k)
{
    const uint8_t *p = k->stored, *end = k->blocks_end;
    unsigned seen = 0;
    while (p < end) {
        uint64_t field, v;
        unsigned type;
        const uint8_t *body, *at;
        size_t n;
        if (!fast_key(&p, end, &field, &type))
            return false;
        if (field == 3) {
            if (type != 2 || !fast_body(&p, end, &body, &n) ||
                ++k->nblocks > KVR_WIRE_STORED_BLOCKS_MAX)
                return false;
            continue;
        }
        if (field < 1 || field > 2 || type != 0 || (seen & 1u << field))
            return false;
        seen |= 1u << field;
        at = p;
        if (!kvr_codec_varint(&p, end, &v) || (field == 1 && p - at != 1))
            return false; /* a bool of more bytes: protobuf-c's reading of it, not ours */
        if (field == 1)
            k->has_parent = v != 0;
        else
            k->parent = v;
    }
    return true;
}

/* One block's fields into b, if they have the shape. */
static bool fast_block(const uint8_t *p, const uint8_t *end, struct kvr_kv_block *b)
{
    unsigned seen = 0;
    b->engine_id = b->local_hash = 0;
    while (p < end) {
        uint64_t field, v;
        unsigned type;
        if (!fast_key(&p, end, &field, &type) || field < 1 || field > 2 || type != 0 ||
            (seen & 1u << field) || !kvr_codec_varint(&p, end, &v))
            return false;
        seen |= 1u << field;
        *(field == 1 ? &b->engine_id : &b->local_hash) = v;
    }
    return true;
}

/* false when buf is not of the fast path's shape; else true, the decoder's answer in *st. */
static bool fast_kv(const uint8_t *buf, size_t len, struct kvr_wire_kv *out, kvr_status *st)
{
    struct fast_kv k = {0};
    if (!fast_kv_event(buf, buf + len, &k) || !fast_stored(&k))
        return false;
    struct kvr_kv_block *blocks = kvr_codec_array(k.nblocks, sizeof *blocks);
    if (!blocks) {
        *st = KVR_ERR_NOMEM;
        return true;
    }
    const uint8_t *p = k.stored, *end = k.blocks_end;
    size_t i = 0;
    while (p < end) { /* the framing was checked: only the blocks are read here */
        uint64_t field = 0, v;
        unsigned type;
        const uint8_t *body = NULL;
        size_t n = 0;
        fast_key(&p, end, &field, &type);
        if (field != 3) {
            kvr_codec_varint(&p, end, &v);
            continue;
        }
        fast_body(&p, end, &body, &n);
        if (!fast_block(body, body + n, &blocks[i++])) {
            free(blocks);
            return false;
        }
    }
    out->worker_id = k.worker_id;
    out->event_seq = k.event_seq;
    out->kind = KVR_WIRE_STORED;
    out->has_parent = k.has_parent;
    out->parent = k.parent;
    out->blocks = blocks;
    out->nblocks = (uint32_t)k.nblocks;
    *st = KVR_OK;
    return true;
}

kvr_status kvr_wire_decode_kv(const void *buf, size_t len, struct kvr_wire_kv *out)
{
    memset(out, 0, sizeof *out);
    if (len > KVR_WIRE_KV_MAX)
        return KVR_ERR_TOO_LARGE;
    kvr_status st;
    return fast_kv(buf, len, out, &st) ? st : kvr_wire_decode_kv_pb(buf, len, out);
}

kvr_status kvr_wire_decode_kv_pb(const void *buf, size_t len, struct kvr_wire_kv *out)
{
    memset(out, 0, sizeof *out);
    struct kvr_codec_alloc a;
    kvr_status st;
    const struct kvr_codec_caps caps = {KVR_WIRE_KV_MAX, KV_EVENT_STORED, STORED_BLOCKS,
                                        KVR_WIRE_STORED_BLOCKS_MAX};
    Kvrouter__V1__KvEvent *m =
        kvr_codec_unpack_capped(&a, &kvrouter__v1__kv_event__descriptor, buf, len, &caps, &st);
    if (!m)
        return st;
    out->worker_id = m->worker_id;
    out->event_seq = m->event_seq;
    switch (m->event_case) {
    case KVROUTER__V1__KV_EVENT__EVENT_STORED:
        st = take_stored(m->stored, out);
        break;
    case KVROUTER__V1__KV_EVENT__EVENT_REMOVED:
        st = take_removed(m->removed, out);
        break;
    case KVROUTER__V1__KV_EVENT__EVENT_CLEARED:
        out->kind = KVR_WIRE_CLEARED;
        break;
    default:
        st = KVR_ERR_MALFORMED;
    }
    kvrouter__v1__kv_event__free_unpacked(m, &a.pc);
    if (st != KVR_OK)
        kvr_wire_kv_free(out);
    return st;
}

static kvr_status take_tokens(const Kvrouter__V1__TokensEvent *m, struct kvr_wire_tokens *out)
{
    if (m->kind == KVROUTER__V1__TOKENS_EVENT__KIND__OUTPUT_BLOCK)
        out->kind = KVR_WIRE_OUTPUT_BLOCK;
    else if (m->kind == KVROUTER__V1__TOKENS_EVENT__KIND__PREFILL_DONE)
        out->kind = KVR_WIRE_PREFILL_DONE;
    else
        return KVR_ERR_INVALID;
    out->worker_id = m->worker_id;
    out->key = m->request_key;
    return KVR_OK;
}

static void take_done(const Kvrouter__V1__DoneEvent *m, struct kvr_wire_done *out)
{
    out->worker_id = m->worker_id;
    out->key = m->request_key;
    out->status = (uint32_t)m->status;
    out->output_tokens = m->output_tokens;
}

kvr_status kvr_wire_decode_tokens(const void *buf, size_t len, struct kvr_wire_tokens *out)
{
    memset(out, 0, sizeof *out);
    if (len > KVR_WIRE_SMALL_EVENT_MAX)
        return KVR_ERR_TOO_LARGE;
    struct kvr_codec_alloc a;
    kvr_status why;
    Kvrouter__V1__TokensEvent *m =
        kvr_codec_unpack(&a, &kvrouter__v1__tokens_event__descriptor, buf, len, &why);
    if (!m)
        return why;
    kvr_status st = take_tokens(m, out);
    if (st != KVR_OK)
        memset(out, 0, sizeof *out);
    kvrouter__v1__tokens_event__free_unpacked(m, &a.pc);
    return st;
}

kvr_status kvr_wire_decode_done(const void *buf, size_t len, struct kvr_wire_done *out)
{
    memset(out, 0, sizeof *out);
    if (len > KVR_WIRE_SMALL_EVENT_MAX)
        return KVR_ERR_TOO_LARGE;
    struct kvr_codec_alloc a;
    kvr_status why;
    Kvrouter__V1__DoneEvent *m =
        kvr_codec_unpack(&a, &kvrouter__v1__done_event__descriptor, buf, len, &why);
    if (!m)
        return why;
    take_done(m, out);
    kvrouter__v1__done_event__free_unpacked(m, &a.pc);
    return KVR_OK;
}

void kvr_wire_batch_free(struct kvr_wire_batch *b)
{
    free(b->ev);
    memset(b, 0, sizeof *b);
}

/* One event of a batch of worker wid into out. */
static kvr_status take_event(const Kvrouter__V1__LifecycleEvent *e, uint64_t wid,
                             struct kvr_wire_event *out)
{
    kvr_status st = KVR_OK;
    if (e->event_case == KVROUTER__V1__LIFECYCLE_EVENT__EVENT_TOKENS) {
        out->kind = KVR_WIRE_EV_TOKENS;
        st = take_tokens(e->tokens, &out->u.tokens);
        if (st == KVR_OK && out->u.tokens.worker_id != wid)
            st = KVR_ERR_INVALID;
    } else if (e->event_case == KVROUTER__V1__LIFECYCLE_EVENT__EVENT_DONE) {
        out->kind = KVR_WIRE_EV_DONE;
        take_done(e->done, &out->u.done);
        if (out->u.done.worker_id != wid)
            st = KVR_ERR_INVALID;
    } else {
        st = KVR_ERR_INVALID;
    }
    return st;
}

kvr_status kvr_wire_decode_batch(const void *buf, size_t len, struct kvr_wire_batch *out)
{
    memset(out, 0, sizeof *out);
    struct kvr_codec_alloc a;
    kvr_status st;
    const struct kvr_codec_caps caps = {KVR_WIRE_BATCH_BYTES_MAX, BATCH_EVENTS, 0,
                                        KVR_WIRE_BATCH_MAX};
    Kvrouter__V1__EventBatch *m =
        kvr_codec_unpack_capped(&a, &kvrouter__v1__event_batch__descriptor, buf, len, &caps, &st);
    if (!m)
        return st;
    out->worker_id = m->worker_id;
    if (m->n_events) {
        out->ev = kvr_codec_array(m->n_events, sizeof *out->ev);
        st = out->ev ? KVR_OK : KVR_ERR_NOMEM;
    }
    for (size_t i = 0; st == KVR_OK && i < m->n_events; i++)
        st = take_event(m->events[i], m->worker_id, &out->ev[i]);
    out->n = st == KVR_OK ? (uint32_t)m->n_events : 0;
    kvrouter__v1__event_batch__free_unpacked(m, &a.pc);
    if (st != KVR_OK)
        kvr_wire_batch_free(out);
    return st;
}

void kvr_wire_heartbeat_free(struct kvr_wire_heartbeat *h)
{
    free(h->inflight);
    free(h->ended);
    memset(h, 0, sizeof *h);
}

kvr_status kvr_wire_decode_heartbeat(const void *buf, size_t len, struct kvr_wire_heartbeat *out)
{
    memset(out, 0, sizeof *out);
    if (len > KVR_WIRE_HEARTBEAT_MAX)
        return KVR_ERR_TOO_LARGE;
    struct kvr_codec_alloc a;
    kvr_status why;
    Kvrouter__V1__Heartbeat *m =
        kvr_codec_unpack(&a, &kvrouter__v1__heartbeat__descriptor, buf, len, &why);
    if (!m)
        return why;
    kvr_status st = KVR_OK;
    if (m->n_inflight > KVR_WIRE_INFLIGHT_MAX || m->n_ended > KVR_WIRE_ENDED_MAX)
        st = KVR_ERR_TOO_LARGE;
    else if (m->worker_id == 0 || m->block_size == 0)
        st = KVR_ERR_INVALID;
    else if (!(out->inflight = kvr_codec_array(m->n_inflight, sizeof *out->inflight)) ||
             !(out->ended = kvr_codec_array(m->n_ended, sizeof *out->ended)))
        st = KVR_ERR_NOMEM;
    if (st == KVR_OK && m->n_inflight)
        memcpy(out->inflight, m->inflight, m->n_inflight * sizeof *out->inflight);
    if (st == KVR_OK && m->n_ended)
        memcpy(out->ended, m->ended, m->n_ended * sizeof *out->ended);
    out->ninflight = (uint32_t)m->n_inflight;
    out->nended = (uint32_t)m->n_ended;
    out->info.id = m->worker_id;
    out->info.block_size = m->block_size;
    out->info.capacity_blocks = m->capacity_blocks;
    out->info.waiting = m->waiting;
    out->info.kv_usage = m->kv_usage >= 0 && m->kv_usage <= 1 ? m->kv_usage : 0;
    out->interval_ms = m->interval_ms;
    out->draining = m->draining;
    out->instance = m->instance;
    out->started_ns = m->started_ns;
    out->info.approximate = m->no_kv_events;
    out->last_event_seq = m->last_event_seq;
    out->forwards_waiting = m->forwards_waiting;
    kvrouter__v1__heartbeat__free_unpacked(m, &a.pc);
    if (st != KVR_OK)
        kvr_wire_heartbeat_free(out);
    return st;
}

/* --- cancellation ------------------------------------------------------------------------ */

kvr_status kvr_wire_encode_cancel(struct kvr_buf *b, const char *request_id, const char *reply)
{
    Kvrouter__V1__CancelRequest m = KVROUTER__V1__CANCEL_REQUEST__INIT;
    m.request_id = (char *)(request_id ? request_id : "");
    m.reply = (char *)(reply ? reply : "");
    return kvr_codec_pack(b, &m.base);
}

void kvr_wire_cancel_free(struct kvr_wire_cancel *c)
{
    free(c->request_id);
    free(c->reply);
    memset(c, 0, sizeof *c);
}

kvr_status kvr_wire_decode_cancel(const void *buf, size_t len, struct kvr_wire_cancel *out)
{
    memset(out, 0, sizeof *out);
    if (len > KVR_WIRE_CANCEL_MAX)
        return KVR_ERR_TOO_LARGE;
    struct kvr_codec_alloc a;
    kvr_status why;
    Kvrouter__V1__CancelRequest *m =
        kvr_codec_unpack(&a, &kvrouter__v1__cancel_request__descriptor, buf, len, &why);
    if (!m)
        return why;
    kvr_status st = kvr_codec_dup(m->request_id, KVR_REQUEST_ID_MAX, &out->request_id);
    if (st == KVR_ERR_TOO_LARGE)
        st = KVR_ERR_ID_TOO_LONG;
    if (st == KVR_OK) {
        st = kvr_codec_dup(m->reply, KVR_REPLY_MAX, &out->reply);
        if (st == KVR_ERR_TOO_LARGE)
            st = KVR_ERR_REPLY_TOO_LONG;
    }
    if (st == KVR_OK && !out->reply[0])
        st = KVR_ERR_NO_REPLY;
    /* either cut short at a NUL byte would name another request (kvr_codec_nul_in) */
    if (st == KVR_OK && (kvr_codec_nul_in(buf, len, 1, 0) || kvr_codec_nul_in(buf, len, 2, 0)))
        st = KVR_ERR_INVALID;
    kvrouter__v1__cancel_request__free_unpacked(m, &a.pc);
    if (st != KVR_OK)
        kvr_wire_cancel_free(out);
    return st;
}

kvr_status kvr_wire_encode_worker_cancel(struct kvr_buf *b, const struct kvr_wire_worker_cancel *c,
                                         const char *router_id)
{
    Kvrouter__V1__WorkerCancel m = KVROUTER__V1__WORKER_CANCEL__INIT;
    m.request_key = c->key;
    m.reason = (Kvrouter__V1__ErrorCode)c->reason;
    m.silent = c->silent;
    m.router_id = (char *)(router_id ? router_id : "");
    return kvr_codec_pack(b, &m.base);
}

kvr_status kvr_wire_decode_worker_cancel(const void *buf, size_t len,
                                         struct kvr_wire_worker_cancel *out)
{
    memset(out, 0, sizeof *out);
    if (len > KVR_WIRE_SMALL_EVENT_MAX)
        return KVR_ERR_TOO_LARGE;
    struct kvr_codec_alloc a;
    kvr_status why;
    Kvrouter__V1__WorkerCancel *m =
        kvr_codec_unpack(&a, &kvrouter__v1__worker_cancel__descriptor, buf, len, &why);
    if (!m)
        return why;
    kvr_status st = KVR_OK;
    if (strlen(kvr_codec_str(m->router_id)) > KVR_ROUTER_ID_MAX)
        st = KVR_ERR_TOO_LARGE;
    else if (m->request_key == 0 ||
             ((int)m->reason != KVR_ERR_CANCELLED && (int)m->reason != KVR_ERR_DEADLINE))
        st = KVR_ERR_INVALID;
    if (st == KVR_OK)
        *out = (struct kvr_wire_worker_cancel){m->request_key, (kvr_status)m->reason, m->silent};
    kvrouter__v1__worker_cancel__free_unpacked(m, &a.pc);
    return st;
}

/* --- rebinds after a worker's cut ---------------------------------------------------------- */

kvr_status kvr_wire_encode_rebind_ask(struct kvr_buf *b, const struct kvr_wire_rebind_ask *r)
{
    Kvrouter__V1__RebindAsk m = KVROUTER__V1__REBIND_ASK__INIT;
    m.worker_id = r->worker_id;
    m.n_request_keys = r->nkeys;
    m.request_keys = (uint64_t *)r->keys;
    return kvr_codec_pack(b, &m.base);
}

void kvr_wire_rebind_ask_free(struct kvr_wire_rebind_ask *r)
{
    free(r->keys);
    memset(r, 0, sizeof *r);
}

kvr_status kvr_wire_decode_rebind_ask(const void *buf, size_t len, struct kvr_wire_rebind_ask *out)
{
    memset(out, 0, sizeof *out);
    if (len > (size_t)KVR_WIRE_REBIND_MAX * 9u + KVR_WIRE_SLACK)
        return KVR_ERR_TOO_LARGE;
    struct kvr_codec_alloc a;
    kvr_status why;
    Kvrouter__V1__RebindAsk *m =
        kvr_codec_unpack(&a, &kvrouter__v1__rebind_ask__descriptor, buf, len, &why);
    if (!m)
        return why;
    kvr_status st = KVR_OK;
    if (m->n_request_keys > KVR_WIRE_REBIND_MAX)
        st = KVR_ERR_TOO_LARGE;
    else if (m->worker_id == 0)
        st = KVR_ERR_INVALID;
    else if (!(out->keys = kvr_codec_array(m->n_request_keys, sizeof *out->keys)))
        st = KVR_ERR_NOMEM;
    if (st == KVR_OK && m->n_request_keys)
        memcpy(out->keys, m->request_keys, m->n_request_keys * sizeof *out->keys);
    out->worker_id = m->worker_id;
    out->nkeys = st == KVR_OK ? (uint32_t)m->n_request_keys : 0;
    kvrouter__v1__rebind_ask__free_unpacked(m, &a.pc);
    if (st != KVR_OK)
        kvr_wire_rebind_ask_free(out);
    return st;
}

kvr_status kvr_wire_encode_worker_rebind(struct kvr_buf *b, uint64_t key, const char *router_id,
                                         bool repeat)
{
    Kvrouter__V1__WorkerRebind m = KVROUTER__V1__WORKER_REBIND__INIT;
    m.request_key = key;
    m.router_id = (char *)(router_id ? router_id : "");
    m.repeat = repeat;
    return kvr_codec_pack(b, &m.base);
}

kvr_status kvr_wire_decode_worker_rebind(const void *buf, size_t len, uint64_t *key, bool *repeat)
{
    *key = 0;
    *repeat = false;
    if (len > KVR_WIRE_SMALL_EVENT_MAX)
        return KVR_ERR_TOO_LARGE;
    struct kvr_codec_alloc a;
    kvr_status why;
    Kvrouter__V1__WorkerRebind *m =
        kvr_codec_unpack(&a, &kvrouter__v1__worker_rebind__descriptor, buf, len, &why);
    if (!m)
        return why;
    kvr_status st = m->request_key ? KVR_OK : KVR_ERR_INVALID;
    if (st == KVR_OK && strlen(kvr_codec_str(m->router_id)) > KVR_ROUTER_ID_MAX)
        st = KVR_ERR_TOO_LARGE;
    if (st == KVR_OK) {
        *key = m->request_key;
        *repeat = m->repeat;
    }
    kvrouter__v1__worker_rebind__free_unpacked(m, &a.pc);
    return st;
}

/* --- event encoders ---------------------------------------------------------------------- */

kvr_status kvr_wire_encode_stored(struct kvr_buf *b, uint64_t worker_id, uint64_t seq,
                                  const uint64_t *parent, const struct kvr_kv_block *blocks,
                                  size_t n)
{
    Kvrouter__V1__KvEvent m = KVROUTER__V1__KV_EVENT__INIT;
    Kvrouter__V1__Stored s = KVROUTER__V1__STORED__INIT;
    Kvrouter__V1__StoredBlock *sb = calloc(n + 1, sizeof *sb);
    Kvrouter__V1__StoredBlock **ptrs = calloc(n + 1, sizeof *ptrs);
    if (!sb || !ptrs) {
        free(sb);
        free(ptrs);
        return KVR_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        Kvrouter__V1__StoredBlock x = KVROUTER__V1__STORED_BLOCK__INIT;
        x.engine_id = blocks[i].engine_id;
        x.local_hash = blocks[i].local_hash;
        sb[i] = x;
        ptrs[i] = &sb[i];
    }
    s.has_parent = parent != NULL;
    s.parent = parent ? *parent : 0;
    s.blocks = ptrs;
    s.n_blocks = n;
    m.worker_id = worker_id;
    m.event_seq = seq;
    m.event_case = KVROUTER__V1__KV_EVENT__EVENT_STORED;
    m.stored = &s;
    kvr_status st = kvr_codec_pack(b, &m.base);
    free(sb);
    free(ptrs);
    return st;
}

kvr_status kvr_wire_encode_removed(struct kvr_buf *b, uint64_t worker_id, uint64_t seq,
                                   const uint64_t *ids, size_t n)
{
    Kvrouter__V1__KvEvent m = KVROUTER__V1__KV_EVENT__INIT;
    Kvrouter__V1__Removed r = KVROUTER__V1__REMOVED__INIT;
    r.engine_ids = (uint64_t *)ids;
    r.n_engine_ids = n;
    m.worker_id = worker_id;
    m.event_seq = seq;
    m.event_case = KVROUTER__V1__KV_EVENT__EVENT_REMOVED;
    m.removed = &r;
    return kvr_codec_pack(b, &m.base);
}

kvr_status kvr_wire_encode_cleared(struct kvr_buf *b, uint64_t worker_id, uint64_t seq)
{
    Kvrouter__V1__KvEvent m = KVROUTER__V1__KV_EVENT__INIT;
    Kvrouter__V1__Cleared c = KVROUTER__V1__CLEARED__INIT;
    m.worker_id = worker_id;
    m.event_seq = seq;
    m.event_case = KVROUTER__V1__KV_EVENT__EVENT_CLEARED;
    m.cleared = &c;
    return kvr_codec_pack(b, &m.base);
}

static void fill_tokens(Kvrouter__V1__TokensEvent *m, uint64_t worker_id, uint64_t key,
                        enum kvr_wire_tokens_kind kind)
{
    m->worker_id = worker_id;
    m->request_key = key;
    m->kind = kind == KVR_WIRE_OUTPUT_BLOCK ? KVROUTER__V1__TOKENS_EVENT__KIND__OUTPUT_BLOCK
                                            : KVROUTER__V1__TOKENS_EVENT__KIND__PREFILL_DONE;
}

static void fill_done(Kvrouter__V1__DoneEvent *m, uint64_t worker_id, uint64_t key, uint32_t status,
                      uint32_t output_tokens)
{
    m->worker_id = worker_id;
    m->request_key = key;
    m->status = (Kvrouter__V1__ErrorCode)status;
    m->output_tokens = output_tokens;
}

kvr_status kvr_wire_encode_tokens(struct kvr_buf *b, uint64_t worker_id, uint64_t key,
                                  enum kvr_wire_tokens_kind kind)
{
    Kvrouter__V1__TokensEvent m = KVROUTER__V1__TOKENS_EVENT__INIT;
    fill_tokens(&m, worker_id, key, kind);
    return kvr_codec_pack(b, &m.base);
}

kvr_status kvr_wire_encode_done(struct kvr_buf *b, uint64_t worker_id, uint64_t key,
                                uint32_t status, uint32_t output_tokens)
{
    Kvrouter__V1__DoneEvent m = KVROUTER__V1__DONE_EVENT__INIT;
    fill_done(&m, worker_id, key, status, output_tokens);
    return kvr_codec_pack(b, &m.base);
}

/* One event of a batch and its submessage, on the encoder's stack. */
struct batch_slot {
    Kvrouter__V1__LifecycleEvent e;
    union {
        Kvrouter__V1__TokensEvent t;
        Kvrouter__V1__DoneEvent d;
    } u;
};

kvr_status kvr_wire_encode_batch(struct kvr_buf *b, uint64_t worker_id,
                                 const struct kvr_wire_event *ev, uint32_t n)
{
    if (n == 0 || n > KVR_WIRE_BATCH_MAX || !ev)
        return KVR_ERR_INVALID;
    struct batch_slot slot[KVR_WIRE_BATCH_MAX];
    Kvrouter__V1__LifecycleEvent *ptr[KVR_WIRE_BATCH_MAX];
    for (uint32_t i = 0; i < n; i++) {
        struct batch_slot *s = &slot[i];
        kvrouter__v1__lifecycle_event__init(&s->e);
        if (ev[i].kind == KVR_WIRE_EV_TOKENS) {
            kvrouter__v1__tokens_event__init(&s->u.t);
            fill_tokens(&s->u.t, worker_id, ev[i].u.tokens.key, ev[i].u.tokens.kind);
            s->e.event_case = KVROUTER__V1__LIFECYCLE_EVENT__EVENT_TOKENS;
            s->e.tokens = &s->u.t;
        } else {
            kvrouter__v1__done_event__init(&s->u.d);
            fill_done(&s->u.d, worker_id, ev[i].u.done.key, ev[i].u.done.status,
                      ev[i].u.done.output_tokens);
            s->e.event_case = KVROUTER__V1__LIFECYCLE_EVENT__EVENT_DONE;
            s->e.done = &s->u.d;
        }
        ptr[i] = &s->e;
    }
    Kvrouter__V1__EventBatch m = KVROUTER__V1__EVENT_BATCH__INIT;
    m.worker_id = worker_id;
    m.n_events = n;
    m.events = ptr;
    return kvr_codec_pack(b, &m.base);
}

kvr_status kvr_wire_encode_heartbeat(struct kvr_buf *b, const struct kvr_wire_heartbeat *h)
{
    Kvrouter__V1__Heartbeat m = KVROUTER__V1__HEARTBEAT__INIT;
    m.worker_id = h->info.id;
    m.block_size = h->info.block_size;
    m.capacity_blocks = h->info.capacity_blocks;
    m.waiting = h->info.waiting;
    m.kv_usage = h->info.kv_usage;
    m.inflight = h->inflight;
    m.n_inflight = h->ninflight;
    m.interval_ms = h->interval_ms;
    m.draining = h->draining;
    m.instance = h->instance;
    m.started_ns = h->started_ns;
    m.ended = h->ended;
    m.n_ended = h->nended;
    m.no_kv_events = h->info.approximate;
    m.last_event_seq = h->last_event_seq;
    m.forwards_waiting = h->forwards_waiting;
    return kvr_codec_pack(b, &m.base);
}
