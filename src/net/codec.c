/*
 * kvr_wire implementation over protobuf-c. Decoding unpacks with protobuf-c (which rejects
 * malformed input), validates, and copies into plain structs; encoding fills a stack message and
 * packs it into the caller's buffer. A forwarded request is never re-encoded: WorkerGenerate and
 * SelectRequest are written as field 1 (the client's bytes, length-delimited) followed by the
 * router's own fields, which protobuf reads as one message.
 */
#include "codec.h"

#include <stdlib.h>
#include <string.h>

#include "kvr/policy.h"
#include "kvrouter.pb-c.h" /* generated from proto/kvrouter/v1/kvrouter.proto */

kvr_status kvr_buf_reserve(struct kvr_buf *b, size_t cap)
{
    if (cap <= b->cap)
        return KVR_OK;
    size_t n = b->cap ? b->cap : 256;
    while (n < cap)
        n *= 2;
    uint8_t *d = realloc(b->data, n);
    if (!d)
        return KVR_ERR_NOMEM;
    b->data = d;
    b->cap = n;
    return KVR_OK;
}

void kvr_buf_free(struct kvr_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

static char *dup_str(const char *s, size_t max)
{
    size_t n = s ? strlen(s) : 0;
    if (n > max)
        return NULL;
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s ? s : "", n);
        d[n] = 0;
    }
    return d;
}

void kvr_wire_request_free(struct kvr_wire_request *r)
{
    free(r->request_id);
    free(r->tokens);
    memset(r, 0, sizeof *r);
}

/* Validate and copy an unpacked GenerateRequest. */
static kvr_status take_request(const Kvrouter__V1__GenerateRequest *m,
                               const struct kvr_wire_limits *lim, struct kvr_wire_request *out)
{
    memset(out, 0, sizeof *out);
    if (!m)
        return KVR_ERR_MALFORMED;
    if (strlen(m->request_id) > KVR_REQUEST_ID_MAX)
        return KVR_ERR_INVALID;
    out->request_id = dup_str(m->request_id, KVR_REQUEST_ID_MAX);
    if (!out->request_id)
        return KVR_ERR_NOMEM;
    out->max_tokens = m->max_tokens;
    if (m->n_token_ids == 0)
        return KVR_ERR_EMPTY_PROMPT;
    if (m->n_token_ids > lim->max_prompt_tokens)
        return KVR_ERR_PROMPT_TOO_LONG;
    if (m->max_tokens == 0 || m->max_tokens > lim->max_output_tokens)
        return KVR_ERR_INVALID;
    const Kvrouter__V1__Overrides *o = m->overrides;
    if (o) {
        if (o->policy && o->policy[0]) {
            if (kvr_policy_parse(o->policy, strlen(o->policy), &out->ov.policy) != KVR_OK)
                return KVR_ERR_UNKNOWN_POLICY;
            out->ov.flags |= KVR_OV_POLICY;
        }
        if (o->has_overlap_weight) {
            if (!(o->overlap_weight >= 0 && o->overlap_weight <= 1e6))
                return KVR_ERR_INVALID;
            out->ov.flags |= KVR_OV_OVERLAP_WEIGHT;
            out->ov.overlap_weight = o->overlap_weight;
        }
        if (o->has_temperature) {
            if (!(o->temperature >= 0 && o->temperature <= 1e6))
                return KVR_ERR_INVALID;
            out->ov.flags |= KVR_OV_TEMPERATURE;
            out->ov.temperature = o->temperature;
        }
    }
    out->tokens = malloc(m->n_token_ids * sizeof *out->tokens);
    if (!out->tokens)
        return KVR_ERR_NOMEM;
    memcpy(out->tokens, m->token_ids, m->n_token_ids * sizeof *out->tokens);
    out->ntokens = (uint32_t)m->n_token_ids;
    return KVR_OK;
}

kvr_status kvr_wire_decode_generate(const void *buf, size_t len, const struct kvr_wire_limits *lim,
                                    struct kvr_wire_request *out)
{
    Kvrouter__V1__GenerateRequest *m = kvrouter__v1__generate_request__unpack(NULL, len, buf);
    kvr_status st = take_request(m, lim, out);
    if (m)
        kvrouter__v1__generate_request__free_unpacked(m, NULL);
    return st;
}

kvr_status kvr_wire_decode_worker_generate(const void *buf, size_t len,
                                           const struct kvr_wire_limits *lim,
                                           struct kvr_wire_request *out, uint64_t *key,
                                           uint32_t *overlap)
{
    Kvrouter__V1__WorkerGenerate *m = kvrouter__v1__worker_generate__unpack(NULL, len, buf);
    kvr_status st = take_request(m ? m->request : NULL, lim, out);
    if (m) {
        *key = m->request_key;
        *overlap = m->overlap_blocks;
        if (st == KVR_OK && m->request_key == 0)
            st = KVR_ERR_INVALID;
        kvrouter__v1__worker_generate__free_unpacked(m, NULL);
    }
    return st;
}

kvr_status kvr_wire_decode_select(const void *buf, size_t len, const struct kvr_wire_limits *lim,
                                  struct kvr_wire_request *out, bool *book)
{
    Kvrouter__V1__SelectRequest *m = kvrouter__v1__select_request__unpack(NULL, len, buf);
    kvr_status st = take_request(m ? m->request : NULL, lim, out);
    if (m) {
        *book = m->book;
        kvrouter__v1__select_request__free_unpacked(m, NULL);
    }
    return st;
}

void kvr_wire_response_free(struct kvr_wire_response *r)
{
    free(r->request_id);
    free(r->error);
    memset(r, 0, sizeof *r);
}

kvr_status kvr_wire_decode_response(const void *buf, size_t len, struct kvr_wire_response *out)
{
    memset(out, 0, sizeof *out);
    Kvrouter__V1__GenerateResponse *m = kvrouter__v1__generate_response__unpack(NULL, len, buf);
    if (!m)
        return KVR_ERR_MALFORMED;
    out->request_id = dup_str(m->request_id, KVR_REQUEST_ID_MAX);
    out->error = dup_str(m->error, 4096);
    out->ntokens = (uint32_t)m->n_token_ids;
    out->final = m->final;
    out->error_code = m->error_code;
    out->worker_id = m->worker_id;
    out->cached_tokens = m->cached_tokens;
    kvrouter__v1__generate_response__free_unpacked(m, NULL);
    if (!out->request_id || !out->error) {
        kvr_wire_response_free(out);
        return KVR_ERR_MALFORMED;
    }
    return KVR_OK;
}

void kvr_wire_kv_free(struct kvr_wire_kv *e)
{
    free(e->blocks);
    free(e->ids);
    memset(e, 0, sizeof *e);
}

kvr_status kvr_wire_decode_kv(const void *buf, size_t len, struct kvr_wire_kv *out)
{
    memset(out, 0, sizeof *out);
    Kvrouter__V1__KvEvent *m = kvrouter__v1__kv_event__unpack(NULL, len, buf);
    if (!m)
        return KVR_ERR_MALFORMED;
    kvr_status st = KVR_OK;
    out->worker_id = m->worker_id;
    out->event_seq = m->event_seq;
    switch (m->event_case) {
    case KVROUTER__V1__KV_EVENT__EVENT_STORED: {
        const Kvrouter__V1__Stored *s = m->stored;
        out->kind = KVR_WIRE_STORED;
        out->has_parent = s->has_parent;
        out->parent = s->parent;
        out->nblocks = (uint32_t)s->n_blocks;
        out->blocks = malloc((s->n_blocks + 1) * sizeof *out->blocks);
        if (!out->blocks) {
            st = KVR_ERR_NOMEM;
            break;
        }
        for (size_t i = 0; i < s->n_blocks; i++)
            out->blocks[i] =
                (struct kvr_kv_block){s->blocks[i]->engine_id, s->blocks[i]->local_hash};
        break;
    }
    case KVROUTER__V1__KV_EVENT__EVENT_REMOVED: {
        const Kvrouter__V1__Removed *r = m->removed;
        out->kind = KVR_WIRE_REMOVED;
        out->nids = (uint32_t)r->n_engine_ids;
        out->ids = malloc((r->n_engine_ids + 1) * sizeof *out->ids);
        if (!out->ids) {
            st = KVR_ERR_NOMEM;
            break;
        }
        if (r->n_engine_ids)
            memcpy(out->ids, r->engine_ids, r->n_engine_ids * sizeof *out->ids);
        break;
    }
    case KVROUTER__V1__KV_EVENT__EVENT_CLEARED:
        out->kind = KVR_WIRE_CLEARED;
        break;
    default:
        st = KVR_ERR_MALFORMED;
    }
    kvrouter__v1__kv_event__free_unpacked(m, NULL);
    if (st != KVR_OK)
        kvr_wire_kv_free(out);
    return st;
}

kvr_status kvr_wire_decode_tokens(const void *buf, size_t len, struct kvr_wire_tokens *out)
{
    Kvrouter__V1__TokensEvent *m = kvrouter__v1__tokens_event__unpack(NULL, len, buf);
    if (!m)
        return KVR_ERR_MALFORMED;
    out->worker_id = m->worker_id;
    out->key = m->request_key;
    out->kind = m->kind == KVROUTER__V1__TOKENS_EVENT__KIND__OUTPUT_BLOCK ? KVR_WIRE_OUTPUT_BLOCK
                                                                          : KVR_WIRE_PREFILL_DONE;
    bool known = m->kind == KVROUTER__V1__TOKENS_EVENT__KIND__OUTPUT_BLOCK ||
                 m->kind == KVROUTER__V1__TOKENS_EVENT__KIND__PREFILL_DONE;
    kvrouter__v1__tokens_event__free_unpacked(m, NULL);
    return known ? KVR_OK : KVR_ERR_MALFORMED;
}

kvr_status kvr_wire_decode_done(const void *buf, size_t len, struct kvr_wire_done *out)
{
    Kvrouter__V1__DoneEvent *m = kvrouter__v1__done_event__unpack(NULL, len, buf);
    if (!m)
        return KVR_ERR_MALFORMED;
    out->worker_id = m->worker_id;
    out->key = m->request_key;
    out->status = m->status;
    kvrouter__v1__done_event__free_unpacked(m, NULL);
    return KVR_OK;
}

void kvr_wire_heartbeat_free(struct kvr_wire_heartbeat *h)
{
    free(h->inflight);
    memset(h, 0, sizeof *h);
}

kvr_status kvr_wire_decode_heartbeat(const void *buf, size_t len, struct kvr_wire_heartbeat *out)
{
    memset(out, 0, sizeof *out);
    Kvrouter__V1__Heartbeat *m = kvrouter__v1__heartbeat__unpack(NULL, len, buf);
    if (!m)
        return KVR_ERR_MALFORMED;
    kvr_status st = KVR_OK;
    out->info.id = m->worker_id;
    out->info.block_size = m->block_size;
    out->info.capacity_blocks = m->capacity_blocks;
    out->info.waiting = m->waiting;
    out->info.kv_usage = m->kv_usage >= 0 && m->kv_usage <= 1 ? m->kv_usage : 0;
    out->interval_ms = m->interval_ms;
    out->draining = m->draining;
    out->ninflight = (uint32_t)m->n_inflight;
    out->inflight = malloc((m->n_inflight + 1) * sizeof *out->inflight);
    if (out->inflight && m->n_inflight)
        memcpy(out->inflight, m->inflight, m->n_inflight * sizeof *out->inflight);
    else if (!out->inflight)
        st = KVR_ERR_NOMEM;
    if (st == KVR_OK && (m->worker_id == 0 || m->block_size == 0))
        st = KVR_ERR_INVALID;
    kvrouter__v1__heartbeat__free_unpacked(m, NULL);
    if (st != KVR_OK)
        kvr_wire_heartbeat_free(out);
    return st;
}

/* Pack any message into b. */
static kvr_status pack(struct kvr_buf *b, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    kvr_status st = kvr_buf_reserve(b, n + 1);
    if (st != KVR_OK)
        return st;
    b->len = protobuf_c_message_pack(m, b->data);
    return KVR_OK;
}

kvr_status kvr_wire_encode_generate(struct kvr_buf *b, const char *request_id,
                                    const uint32_t *tokens, uint32_t ntokens, uint32_t max_tokens,
                                    const struct kvr_overrides *ov)
{
    Kvrouter__V1__GenerateRequest m = KVROUTER__V1__GENERATE_REQUEST__INIT;
    Kvrouter__V1__Overrides o = KVROUTER__V1__OVERRIDES__INIT;
    m.request_id = (char *)(request_id ? request_id : "");
    m.token_ids = (uint32_t *)tokens;
    m.n_token_ids = ntokens;
    m.max_tokens = max_tokens;
    if (ov && ov->flags) {
        if (ov->flags & KVR_OV_POLICY)
            o.policy = (char *)kvr_policy_name(ov->policy);
        o.has_overlap_weight = (ov->flags & KVR_OV_OVERLAP_WEIGHT) != 0;
        o.overlap_weight = ov->overlap_weight;
        o.has_temperature = (ov->flags & KVR_OV_TEMPERATURE) != 0;
        o.temperature = ov->temperature;
        m.overrides = &o;
    }
    return pack(b, &m.base);
}

kvr_status kvr_wire_encode_response(struct kvr_buf *b, const char *request_id,
                                    const uint32_t *tokens, uint32_t ntokens, bool final,
                                    kvr_status error, uint64_t worker_id, uint32_t cached_tokens)
{
    Kvrouter__V1__GenerateResponse m = KVROUTER__V1__GENERATE_RESPONSE__INIT;
    m.request_id = (char *)(request_id ? request_id : "");
    m.token_ids = (uint32_t *)tokens;
    m.n_token_ids = ntokens;
    m.final = final;
    if (final)
        m.finish_reason = (char *)(error == KVR_OK ? "length" : "error");
    m.error_code = (uint32_t)error;
    m.error = (char *)(error == KVR_OK ? "" : kvr_status_str(error));
    m.worker_id = worker_id;
    m.cached_tokens = cached_tokens;
    return pack(b, &m.base);
}

/* b = field 1 holding raw (length-delimited), then the packed message m. */
static kvr_status wrap(struct kvr_buf *b, const void *raw, size_t len, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    kvr_status st = kvr_buf_reserve(b, 1 + 10 + len + n);
    if (st != KVR_OK)
        return st;
    uint8_t *p = b->data;
    *p++ = 0x0a; /* field 1, wire type 2 */
    for (size_t v = len;; v >>= 7) {
        *p++ = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        if (v <= 0x7f)
            break;
    }
    memcpy(p, raw, len);
    p += len;
    p += protobuf_c_message_pack(m, p);
    b->len = (size_t)(p - b->data);
    return KVR_OK;
}

kvr_status kvr_wire_encode_worker_generate(struct kvr_buf *b, const void *request, size_t len,
                                           uint64_t key, uint32_t overlap, const char *router_id)
{
    Kvrouter__V1__WorkerGenerate m = KVROUTER__V1__WORKER_GENERATE__INIT;
    m.request_key = key;
    m.overlap_blocks = overlap;
    m.router_id = (char *)(router_id ? router_id : "");
    return wrap(b, request, len, &m.base);
}

kvr_status kvr_wire_encode_select_request(struct kvr_buf *b, const void *request, size_t len,
                                          bool book)
{
    Kvrouter__V1__SelectRequest m = KVROUTER__V1__SELECT_REQUEST__INIT;
    m.book = book;
    return wrap(b, request, len, &m.base);
}

kvr_status kvr_wire_encode_select_response(struct kvr_buf *b, const struct kvr_decision *d,
                                           uint64_t key, kvr_status error)
{
    Kvrouter__V1__SelectResponse m = KVROUTER__V1__SELECT_RESPONSE__INIT;
    Kvrouter__V1__Candidate *cand = NULL, **ptrs = NULL;
    m.error_code = (uint32_t)error;
    m.error = (char *)(error == KVR_OK ? "" : kvr_status_str(error));
    if (error == KVR_OK && d) {
        m.worker_id = d->worker_id;
        m.overlap_blocks = d->overlap_blocks;
        m.cost = d->cost;
        m.request_key = key;
        m.policy = (char *)kvr_policy_name(d->policy);
        cand = calloc(d->ncandidates + 1, sizeof *cand);
        ptrs = calloc(d->ncandidates + 1, sizeof *ptrs);
        if (!cand || !ptrs) {
            free(cand);
            free(ptrs);
            return KVR_ERR_NOMEM;
        }
        for (uint32_t i = 0; i < d->ncandidates; i++) {
            Kvrouter__V1__Candidate c = KVROUTER__V1__CANDIDATE__INIT;
            c.worker_id = d->worker_ids[i];
            c.cost = d->costs[i];
            if (d->candidates) {
                c.overlap_blocks = d->candidates[i].overlap_blocks;
                c.prefill_tokens = d->candidates[i].prefill_tokens;
                c.decode_blocks = d->candidates[i].decode_blocks;
                c.inflight = d->candidates[i].inflight;
                c.busy = d->candidates[i].busy;
            }
            cand[i] = c;
            ptrs[i] = &cand[i];
        }
        m.candidates = ptrs;
        m.n_candidates = d->ncandidates;
    }
    kvr_status st = pack(b, &m.base);
    free(cand);
    free(ptrs);
    return st;
}

kvr_status kvr_wire_decode_select_response(const void *buf, size_t len, uint64_t *worker_id,
                                           uint32_t *overlap, uint32_t *ncandidates,
                                           uint32_t *error_code, uint64_t *key)
{
    Kvrouter__V1__SelectResponse *m = kvrouter__v1__select_response__unpack(NULL, len, buf);
    if (!m)
        return KVR_ERR_MALFORMED;
    *worker_id = m->worker_id;
    *overlap = m->overlap_blocks;
    *ncandidates = (uint32_t)m->n_candidates;
    *error_code = m->error_code;
    *key = m->request_key;
    kvrouter__v1__select_response__free_unpacked(m, NULL);
    return KVR_OK;
}

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
    kvr_status st = pack(b, &m.base);
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
    return pack(b, &m.base);
}

kvr_status kvr_wire_encode_cleared(struct kvr_buf *b, uint64_t worker_id, uint64_t seq)
{
    Kvrouter__V1__KvEvent m = KVROUTER__V1__KV_EVENT__INIT;
    Kvrouter__V1__Cleared c = KVROUTER__V1__CLEARED__INIT;
    m.worker_id = worker_id;
    m.event_seq = seq;
    m.event_case = KVROUTER__V1__KV_EVENT__EVENT_CLEARED;
    m.cleared = &c;
    return pack(b, &m.base);
}

kvr_status kvr_wire_encode_tokens(struct kvr_buf *b, uint64_t worker_id, uint64_t key,
                                  enum kvr_wire_tokens_kind kind)
{
    Kvrouter__V1__TokensEvent m = KVROUTER__V1__TOKENS_EVENT__INIT;
    m.worker_id = worker_id;
    m.request_key = key;
    m.kind = kind == KVR_WIRE_OUTPUT_BLOCK ? KVROUTER__V1__TOKENS_EVENT__KIND__OUTPUT_BLOCK
                                           : KVROUTER__V1__TOKENS_EVENT__KIND__PREFILL_DONE;
    return pack(b, &m.base);
}

kvr_status kvr_wire_encode_done(struct kvr_buf *b, uint64_t worker_id, uint64_t key,
                                uint32_t status)
{
    Kvrouter__V1__DoneEvent m = KVROUTER__V1__DONE_EVENT__INIT;
    m.worker_id = worker_id;
    m.request_key = key;
    m.status = status;
    return pack(b, &m.base);
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
    return pack(b, &m.base);
}
