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

/* --- router replicas ----------------------------------------------------------------------- */

void kvr_wire_decision_free(struct kvr_wire_decision *d)
{
    free((void *)d->rec.block_hashes);
    free(d->reply);
    free(d->request_id);
    free(d->origin);
    memset(d, 0, sizeof *d);
}

void kvr_wire_gossip_free(struct kvr_wire_gossip *g)
{
    free(g->router_id);
    kvr_wire_decision_free(&g->d);
    memset(g, 0, sizeof *g);
}

static void fill_decision_msg(Kvrouter__V1__Decision *m, const struct kvr_request_record *rec,
                              const char *reply, const char *request_id, const char *origin)
{
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
    m->origin = (char *)(origin ? origin : "");
}

/* Copy an unpacked Decision into d (validated). */
static kvr_status take_decision(const Kvrouter__V1__Decision *m, struct kvr_wire_decision *d)
{
    memset(d, 0, sizeof *d);
    if (!m || m->request_key == 0 || m->worker_id == 0 || m->overlap_blocks > m->n_block_hashes)
        return KVR_ERR_MALFORMED;
    uint64_t *h = malloc((m->n_block_hashes + 1) * sizeof *h);
    d->reply = dup_str(m->reply, 1024);
    d->request_id = dup_str(m->request_id, KVR_REQUEST_ID_MAX);
    d->origin = dup_str(m->origin, 1024);
    if (!h || !d->reply || !d->request_id || !d->origin) {
        free(h);
        kvr_wire_decision_free(d);
        return KVR_ERR_MALFORMED;
    }
    if (m->n_block_hashes)
        memcpy(h, m->block_hashes, m->n_block_hashes * sizeof *h);
    d->rec = (struct kvr_request_record){m->request_key,
                                         m->worker_id,
                                         h,
                                         (uint32_t)m->n_block_hashes,
                                         m->prompt_tokens,
                                         m->overlap_blocks,
                                         m->prefill_done,
                                         m->output_blocks};
    return KVR_OK;
}

kvr_status kvr_wire_encode_gossip_decision(struct kvr_buf *b, const char *router_id, uint64_t epoch,
                                           uint64_t seq, const struct kvr_request_record *rec,
                                           const char *reply, const char *request_id,
                                           const char *origin)
{
    Kvrouter__V1__Gossip g = KVROUTER__V1__GOSSIP__INIT;
    Kvrouter__V1__Decision d = KVROUTER__V1__DECISION__INIT;
    fill_decision_msg(&d, rec, reply, request_id, origin);
    g.router_id = (char *)router_id;
    g.epoch = epoch;
    g.seq = seq;
    g.body_case = KVROUTER__V1__GOSSIP__BODY_DECISION;
    g.decision = &d;
    return pack(b, &g.base);
}

kvr_status kvr_wire_encode_gossip_hello(struct kvr_buf *b, const char *router_id, uint64_t epoch,
                                        uint64_t seq, bool serving)
{
    Kvrouter__V1__Gossip g = KVROUTER__V1__GOSSIP__INIT;
    Kvrouter__V1__Hello h = KVROUTER__V1__HELLO__INIT;
    h.serving = serving;
    g.router_id = (char *)router_id;
    g.epoch = epoch;
    g.seq = seq;
    g.body_case = KVROUTER__V1__GOSSIP__BODY_HELLO;
    g.hello = &h;
    return pack(b, &g.base);
}

kvr_status kvr_wire_decode_gossip(const void *buf, size_t len, struct kvr_wire_gossip *out)
{
    memset(out, 0, sizeof *out);
    Kvrouter__V1__Gossip *m = kvrouter__v1__gossip__unpack(NULL, len, buf);
    if (!m)
        return KVR_ERR_MALFORMED;
    kvr_status st = KVR_OK;
    out->router_id = dup_str(m->router_id, 256);
    out->epoch = m->epoch;
    out->seq = m->seq;
    if (!out->router_id || !out->router_id[0]) {
        st = KVR_ERR_MALFORMED;
    } else if (m->body_case == KVROUTER__V1__GOSSIP__BODY_DECISION) {
        out->kind = KVR_WIRE_GOSSIP_DECISION;
        st = take_decision(m->decision, &out->d);
    } else if (m->body_case == KVROUTER__V1__GOSSIP__BODY_HELLO && m->hello) {
        out->kind = KVR_WIRE_GOSSIP_HELLO;
        out->serving = m->hello->serving;
    } else {
        st = KVR_ERR_MALFORMED;
    }
    kvrouter__v1__gossip__free_unpacked(m, NULL);
    if (st != KVR_OK)
        kvr_wire_gossip_free(out);
    return st;
}

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
    return pack(b, &m.base);
}

kvr_status kvr_wire_decode_sync(const void *buf, size_t len, struct kvr_wire_sync *out)
{
    memset(out, 0, sizeof *out);
    Kvrouter__V1__SyncRequest *m = kvrouter__v1__sync_request__unpack(NULL, len, buf);
    if (!m)
        return KVR_ERR_MALFORMED;
    kvr_status st = KVR_OK;
    out->router_id = dup_str(m->router_id, 256);
    out->full = m->full;
    out->from_seq = m->from_seq;
    out->to_seq = m->to_seq;
    out->epoch = m->epoch;
    out->token = m->token;
    out->keys = malloc((m->n_keys + 1) * sizeof *out->keys);
    if (!out->router_id || !out->keys || m->n_keys > 1000000 || m->to_seq - m->from_seq > 1000000)
        st = KVR_ERR_MALFORMED;
    else if (m->n_keys)
        memcpy(out->keys, m->keys, m->n_keys * sizeof *out->keys);
    out->nkeys = (uint32_t)m->n_keys;
    kvrouter__v1__sync_request__free_unpacked(m, NULL);
    if (st != KVR_OK)
        kvr_wire_sync_free(out);
    return st;
}

/* A page under construction keeps records and, in one arena, the hashes and strings they use. */
struct page_decision {
    struct kvr_request_record rec;            /* block_hashes unused: hashes at arena offset */
    size_t hashes, reply, request_id, origin; /* arena offsets */
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

kvr_status kvr_page_add_decision(struct kvr_page *p, const struct kvr_request_record *rec,
                                 const char *reply, const char *request_id, const char *origin)
{
    if (p->ndecisions == p->capd) {
        uint32_t cap = p->capd ? p->capd * 2 : 64;
        void *d = realloc(p->decisions, cap * sizeof(struct page_decision));
        if (!d)
            return KVR_ERR_NOMEM;
        p->decisions = d;
        p->capd = cap;
    }
    struct page_decision *pd = (struct page_decision *)p->decisions + p->ndecisions;
    pd->rec = *rec;
    reply = reply ? reply : "";
    request_id = request_id ? request_id : "";
    origin = origin ? origin : "";
    kvr_status st =
        arena_put(&p->strings, rec->block_hashes, rec->nblocks * sizeof(uint64_t), &pd->hashes);
    if (st == KVR_OK)
        st = arena_put(&p->strings, reply, strlen(reply), &pd->reply);
    if (st == KVR_OK)
        st = arena_put(&p->strings, request_id, strlen(request_id), &pd->request_id);
    if (st == KVR_OK)
        st = arena_put(&p->strings, origin, strlen(origin), &pd->origin);
    if (st != KVR_OK)
        return st;
    p->ndecisions++;
    p->approx += 64 + rec->nblocks * 9 + strlen(reply) + strlen(request_id) + strlen(origin);
    return KVR_OK;
}

kvr_status kvr_page_add_entry(struct kvr_page *p, const struct kvr_index_record *rec)
{
    if (p->nentries == p->cape) {
        uint32_t cap = p->cape ? p->cape * 2 : 256;
        void *e = realloc(p->entries, cap * sizeof(struct kvr_index_record));
        if (!e)
            return KVR_ERR_NOMEM;
        p->entries = e;
        p->cape = cap;
    }
    ((struct kvr_index_record *)p->entries)[p->nentries++] = *rec;
    p->approx += 40;
    return KVR_OK;
}

kvr_status kvr_page_encode(struct kvr_page *p, struct kvr_buf *b, bool last, uint64_t token)
{
    Kvrouter__V1__SyncPage m = KVROUTER__V1__SYNC_PAGE__INIT;
    Kvrouter__V1__Decision *d = calloc(p->ndecisions + 1, sizeof *d);
    Kvrouter__V1__Decision **dp = calloc(p->ndecisions + 1, sizeof *dp);
    Kvrouter__V1__IndexEntry *e = calloc(p->nentries + 1, sizeof *e);
    Kvrouter__V1__IndexEntry **ep = calloc(p->nentries + 1, sizeof *ep);
    kvr_status st = d && dp && e && ep ? KVR_OK : KVR_ERR_NOMEM;
    for (uint32_t i = 0; st == KVR_OK && i < p->ndecisions; i++) {
        const struct page_decision *pd = (const struct page_decision *)p->decisions + i;
        Kvrouter__V1__Decision x = KVROUTER__V1__DECISION__INIT;
        struct kvr_request_record rec = pd->rec;
        rec.block_hashes = (const uint64_t *)(p->strings.data + pd->hashes);
        fill_decision_msg(&x, &rec, (char *)p->strings.data + pd->reply,
                          (char *)p->strings.data + pd->request_id,
                          (char *)p->strings.data + pd->origin);
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
        x.ttl_left_ms = r->ttl_left_ns / 1000000;
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
        st = pack(b, &m.base);
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

kvr_status kvr_wire_decode_page(const void *buf, size_t len,
                                void (*on_decision)(void *ctx, const struct kvr_wire_decision *d),
                                void (*on_entry)(void *ctx, const struct kvr_index_record *e),
                                void *ctx, bool *last, uint64_t *token)
{
    Kvrouter__V1__SyncPage *m = kvrouter__v1__sync_page__unpack(NULL, len, buf);
    if (!m)
        return KVR_ERR_MALFORMED;
    *last = m->last;
    *token = m->token;
    for (size_t i = 0; i < m->n_decisions; i++) {
        struct kvr_wire_decision d;
        if (on_decision && take_decision(m->decisions[i], &d) == KVR_OK) {
            on_decision(ctx, &d);
            kvr_wire_decision_free(&d);
        }
    }
    for (size_t i = 0; i < m->n_entries; i++) {
        const Kvrouter__V1__IndexEntry *x = m->entries[i];
        struct kvr_index_record r = {x->worker_id, x->seq, x->has_engine, x->engine_id,
                                     x->ttl_left_ms * 1000000ull};
        if (x->worker_id && on_entry)
            on_entry(ctx, &r);
    }
    kvrouter__v1__sync_page__free_unpacked(m, NULL);
    return KVR_OK;
}
