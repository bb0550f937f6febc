/*
 * kvr_wire over protobuf-c: the client's and the worker's request messages (GenerateRequest,
 * WorkerGenerate, SelectRequest and SelectResponse, GenerateResponse), and the helpers
 * codec_events.c and codec_fleet.c share through codec_internal.h. A decoder
 * refuses a message over its byte cap before protobuf-c sees it, counts repeated submessages on
 * the wire before protobuf-c allocates them, unpacks through an allocator that records failure
 * (so out-of-memory is never reported as malformed), then checks lengths and values before it
 * copies into plain structs. Encoding fills a stack message and packs it into the caller's buffer.
 * A forwarded request is never re-encoded: WorkerGenerate and SelectRequest are written as field 1
 * (the client's bytes, length-delimited) followed by the router's own fields, which protobuf reads
 * as one message. Pure and thread-safe.
 */
#include "codec.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "kvr/policy.h"
#include "kvrouter.pb-c.h" /* generated from proto/kvrouter/v1/kvrouter.proto */

/* --- shared helpers (codec_internal.h) ------------------------------------------------------ */

static _Thread_local long fail_countdown = -1; /* kvr_wire_fail_alloc: allocations to go */

long kvr_wire_fail_alloc(long n)
{
    long was = fail_countdown;
    fail_countdown = n;
    return was;
}

void *kvr_codec_array(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    if (fail_countdown >= 0 && fail_countdown-- == 0)
        return NULL;
    size_t bytes = n * size;
    return malloc(bytes ? bytes : 1);
}

static void *alloc_recording(void *data, size_t size)
{
    struct kvr_codec_alloc *a = data;
    void *p = kvr_codec_array(size, 1);
    if (!p)
        a->failed = true;
    return p;
}

static void free_plain(void *data, void *p)
{
    (void)data;
    free(p);
}

void *kvr_codec_unpack(struct kvr_codec_alloc *a, const ProtobufCMessageDescriptor *d,
                       const void *buf, size_t len, kvr_status *st)
{
    a->pc = (ProtobufCAllocator){alloc_recording, free_plain, a};
    a->failed = false;
    ProtobufCMessage *m = protobuf_c_message_unpack(d, &a->pc, len, buf);
    *st = m ? KVR_OK : a->failed ? KVR_ERR_NOMEM : KVR_ERR_MALFORMED;
    return m;
}

void *kvr_codec_unpack_capped(struct kvr_codec_alloc *a, const ProtobufCMessageDescriptor *d,
                              const void *buf, size_t len, const struct kvr_codec_caps *caps,
                              kvr_status *st)
{
    if (len > caps->max_bytes) {
        *st = KVR_ERR_TOO_LARGE;
        return NULL;
    }
    size_t n;
    *st = kvr_codec_count(buf, len, caps->field, caps->sub, &n);
    if (*st == KVR_OK && n > caps->max_items)
        *st = KVR_ERR_TOO_LARGE;
    return *st == KVR_OK ? kvr_codec_unpack(a, d, buf, len, st) : NULL;
}

char *kvr_codec_str(char *s)
{
    static char empty[1];
    return s ? s : empty;
}

kvr_status kvr_codec_dup(const char *s, size_t max, char **out)
{
    size_t n = s ? strlen(s) : 0;
    *out = NULL;
    if (n > max)
        return KVR_ERR_TOO_LARGE;
    char *d = kvr_codec_array(n + 1, 1);
    if (!d)
        return KVR_ERR_NOMEM;
    memcpy(d, s ? s : "", n);
    d[n] = 0;
    *out = d;
    return KVR_OK;
}

/* Step over the field at *p: its number in *field and, if length-delimited, its payload. */
static bool next_field(const uint8_t **p, const uint8_t *end, uint64_t *field, const uint8_t **body,
                       size_t *blen)
{
    uint64_t key, v;
    if (!kvr_codec_varint(p, end, &key))
        return false;
    *field = key >> 3;
    *body = NULL;
    *blen = 0;
    switch (key & 7) {
    case 0: /* varint */
        return kvr_codec_varint(p, end, &v);
    case 1: /* 64-bit */
    case 5: /* 32-bit */
        v = (key & 7) == 1 ? 8 : 4;
        break;
    case 2: /* length-delimited */
        if (!kvr_codec_varint(p, end, &v))
            return false;
        *body = *p;
        break;
    default: /* groups, not in proto3, and unknown wire types */
        return false;
    }
    if (v > (uint64_t)(end - *p))
        return false;
    *blen = *body ? (size_t)v : 0;
    *p += v;
    return true;
}

kvr_status kvr_codec_count(const void *buf, size_t len, uint32_t field, uint32_t sub, size_t *n)
{
    *n = 0;
    if (len == 0)
        return KVR_OK;
    const uint8_t *p = buf, *end = p + len;
    while (p < end) {
        uint64_t f;
        const uint8_t *body;
        size_t blen, k;
        if (!next_field(&p, end, &f, &body, &blen))
            return KVR_ERR_MALFORMED;
        if (f != field)
            continue;
        if (!sub) {
            (*n)++;
        } else if (body) { /* another wire type: protobuf-c refuses it */
            kvr_status st = kvr_codec_count(body, blen, sub, 0, &k);
            if (st != KVR_OK)
                return st;
            *n += k;
        }
    }
    return KVR_OK;
}

bool kvr_codec_nul_in(const void *buf, size_t len, uint32_t field, uint32_t sub)
{
    const uint8_t *p = buf, *end = p + len;
    while (p < end) {
        uint64_t f;
        const uint8_t *body;
        size_t blen;
        if (!next_field(&p, end, &f, &body, &blen))
            return false;
        if (f != field || !body)
            continue;
        if (sub ? kvr_codec_nul_in(body, blen, sub, 0) : memchr(body, 0, blen) != NULL)
            return true;
    }
    return false;
}

kvr_status kvr_codec_pack(struct kvr_buf *b, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    kvr_status st = kvr_buf_reserve(b, n + 1);
    if (st != KVR_OK)
        return st;
    b->len = protobuf_c_message_pack(m, b->data);
    return KVR_OK;
}

/* --- requests ---------------------------------------------------------------------------- */

size_t kvr_wire_request_cap(const struct kvr_wire_limits *lim)
{
    uint64_t cap = (uint64_t)lim->max_prompt_tokens * 5u + KVR_WIRE_SLACK;
#if SIZE_MAX < UINT64_MAX
    if (cap > SIZE_MAX)
        return SIZE_MAX;
#endif
    return (size_t)cap;
}

void kvr_wire_request_free(struct kvr_wire_request *r)
{
    free(r->request_id);
    free(r->tokens);
    memset(r, 0, sizeof *r);
}

/* Validate and copy the overrides of a GenerateRequest (o may be NULL: none). */
static kvr_status take_overrides(const Kvrouter__V1__Overrides *o, struct kvr_overrides *ov)
{
    if (!o)
        return KVR_OK;
    if (o->policy && o->policy[0]) {
        if (kvr_policy_parse(o->policy, strlen(o->policy), &ov->policy) != KVR_OK)
            return KVR_ERR_UNKNOWN_POLICY;
        ov->flags |= KVR_OV_POLICY;
    }
    if (o->has_overlap_weight) {
        if (!(o->overlap_weight >= 0 && o->overlap_weight <= 1e6))
            return KVR_ERR_BAD_OVERRIDE;
        ov->flags |= KVR_OV_OVERLAP_WEIGHT;
        ov->overlap_weight = o->overlap_weight;
    }
    if (o->has_temperature) {
        if (!(o->temperature >= 0 && o->temperature <= 1e6))
            return KVR_ERR_BAD_OVERRIDE;
        ov->flags |= KVR_OV_TEMPERATURE;
        ov->temperature = o->temperature;
    }
    return KVR_OK;
}

/* Validate and copy a GenerateRequest into out (zeroed); NULL: none was sent. *adopt, when adopt
 * and *adopt are not NULL, is m's token array itself (from kvr_codec_array): taken instead of
 * copied when the request is good (*adopt is then NULL), else left to the caller. */
static kvr_status take_request_tokens(const Kvrouter__V1__GenerateRequest *m,
                                      const struct kvr_wire_limits *lim,
                                      struct kvr_wire_request *out, uint32_t **adopt)
{
    if (!m)
        return KVR_ERR_MALFORMED;
    kvr_status st = kvr_codec_dup(m->request_id, KVR_REQUEST_ID_MAX, &out->request_id);
    if (st == KVR_ERR_TOO_LARGE) {
        out->got = strlen(m->request_id);
        out->limit = KVR_REQUEST_ID_MAX;
        return KVR_ERR_ID_TOO_LONG;
    }
    if (st != KVR_OK)
        return st;
    out->max_tokens = m->max_tokens;
    if (m->n_token_ids == 0)
        return KVR_ERR_EMPTY_PROMPT;
    if (m->n_token_ids > lim->max_prompt_tokens) {
        out->got = m->n_token_ids;
        out->limit = lim->max_prompt_tokens;
        return KVR_ERR_PROMPT_TOO_LONG;
    }
    if (m->max_tokens == 0)
        return KVR_ERR_MAX_TOKENS_ZERO;
    if (m->max_tokens > lim->max_output_tokens) {
        out->got = m->max_tokens;
        out->limit = lim->max_output_tokens;
        return KVR_ERR_MAX_TOKENS_TOO_LARGE;
    }
    out->deadline_ms = m->deadline_ms;
    st = take_overrides(m->overrides, &out->ov);
    if (st != KVR_OK)
        return st;
    out->ntokens = (uint32_t)m->n_token_ids;
    if (adopt && *adopt) {
        out->tokens = *adopt;
        *adopt = NULL;
        return KVR_OK;
    }
    out->tokens = kvr_codec_array(m->n_token_ids, sizeof *out->tokens);
    if (!out->tokens)
        return KVR_ERR_NOMEM;
    memcpy(out->tokens, m->token_ids, m->n_token_ids * sizeof *out->tokens);
    return KVR_OK;
}

static kvr_status take_request(const Kvrouter__V1__GenerateRequest *m,
                               const struct kvr_wire_limits *lim, struct kvr_wire_request *out)
{
    return take_request_tokens(m, lim, out, NULL);
}

/* A request decoder's end: on an error only the request id and the figures stay (so the error
 * can name them). */
static kvr_status request_done(kvr_status st, struct kvr_wire_request *out)
{
    if (st != KVR_OK) {
        struct kvr_wire_request keep = {.request_id = out->request_id,
                                        .got = out->got,
                                        .limit = out->limit,
                                        .invalid = out->invalid};
        free(out->tokens);
        *out = keep;
    }
    return st;
}

const char *kvr_wire_request_why(const struct kvr_wire_request *r, kvr_status st, char *buf,
                                 size_t len)
{
    const char *unit = NULL;
    switch (st) {
    case KVR_ERR_PROMPT_TOO_LONG:
        unit = "tokens";
        break;
    case KVR_ERR_MAX_TOKENS_TOO_LARGE:
        unit = "requested";
        break;
    case KVR_ERR_FULL:
        unit = "KV blocks needed for prompt and output";
        break;
    case KVR_ERR_ID_TOO_LONG:
    case KVR_ERR_REPLY_TOO_LONG:
    case KVR_ERR_TOO_LARGE:
        unit = "bytes";
        break;
    default:
        break;
    }
    if (unit && r && r->limit)
        snprintf(buf, len, "%" PRIu64 " %s, the limit is %" PRIu64, r->got, unit, r->limit);
    else if (st == KVR_ERR_INVALID && r && r->invalid)
        snprintf(buf, len, "%s", r->invalid);
    else if (len)
        buf[0] = 0;
    return buf;
}

/* A request over its byte cap: the figures for the error. */
static kvr_status too_large(struct kvr_wire_request *out, size_t len,
                            const struct kvr_wire_limits *lim)
{
    out->got = len;
    out->limit = kvr_wire_request_cap(lim);
    return KVR_ERR_TOO_LARGE;
}

/*
 * The fast path of a client's GenerateRequest. protobuf-c spends ~4.2 us on 1,024 tokens (each
 * varint scanned twice, an allocation per field), this path ~2.5 us (2-core test box, the hop
 * prompt, outside the router). Nearly every request has one shape: request_id of
 * printable ASCII, token_ids packed once, max_tokens and deadline_ms, each at most once, no
 * overrides and no other field. That shape is read here, the tokens straight into their array.
 * Anything else (overrides, a field twice, unpacked or over-many tokens, an unknown field or wire
 * type, a varint past 32 bits, another byte in the id, broken framing) goes to protobuf-c, so
 * every answer is the one protobuf-c gives (tests/unit/test_codec.c compares the two).
 */
struct fast_request {
    const uint8_t *id, *tok; /* the id's and the packed tokens' bytes (NULL: absent) */
    size_t idlen, toklen;    /* */
    uint32_t max_tokens;     /* */
    uint32_t deadline_ms;    /* */
};

/* A varint of at most 32 bits at *p (5 bytes at most, the fifth under 0x10). */
static bool get_u32(const uint8_t **p, const uint8_t *end, uint32_t *v)
{
    uint32_t x = 0;
    for (unsigned i = 0; i < 5 && *p < end; i++) {
        uint8_t c = *(*p)++;
        if (i == 4 && c > 0x0f)
            return false;
        x |= (uint32_t)(c & 0x7f) << (7 * i);
        if (!(c & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

/* The fields of buf[0..len) into r (zeroed), if it has the fast path's shape. */
static bool fast_scan(const uint8_t *p, const uint8_t *end, struct fast_request *r)
{
    unsigned seen = 0;
    while (p < end) {
        uint32_t key, n;
        if (!get_u32(&p, end, &key))
            return false;
        uint32_t field = key >> 3, type = key & 7;
        if (field == 0 || field == 4 || field > 5 || (seen & 1u << field))
            return false;
        seen |= 1u << field;
        if (field > 2) { /* max_tokens, deadline_ms */
            if (type != 0 || !get_u32(&p, end, field == 3 ? &r->max_tokens : &r->deadline_ms))
                return false;
            continue;
        }
        if (type != 2 || !get_u32(&p, end, &n) || n > (size_t)(end - p))
            return false;
        *(field == 1 ? &r->id : &r->tok) = p;
        *(field == 1 ? &r->idlen : &r->toklen) = n;
        p += n;
    }
    for (size_t i = 0; i < r->idlen; i++)
        if (r->id[i] < 0x20 || r->id[i] > 0x7e)
            return false;
    return r->idlen <= KVR_REQUEST_ID_MAX;
}

#define STOP_BITS 0x8080808080808080ull /* the continuation bit of each of 8 bytes */

/* How many varints end in p[0..len): the bytes without the continuation bit. */
static size_t count_ends(const uint8_t *p, size_t len)
{
    size_t n = 0, i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t x;
        memcpy(&x, p + i, 8);
        n += (size_t)((((~x & STOP_BITS) >> 7) * 0x0101010101010101ull) >> 56);
    }
    for (; i < len; i++)
        n += !(p[i] & 0x80);
    return n;
}

/* The packed varints of p[0..len) into t: false if one is past 32 bits. A plain loop over bytes:
 * faster here than protobuf-c's (which scans each varint twice) and than a branch-free one. */
static bool unpack_u32s(const uint8_t *p, size_t len, uint32_t *t)
{
    const uint8_t *end = p + len;
    while (p < end)
        if (!get_u32(&p, end, t++))
            return false;
    return true;
}

/* The packed tokens of r into an array of *n (NULL: not the fast shape, or no memory, *nomem). */
static uint32_t *fast_tokens(const struct fast_request *r, const struct kvr_wire_limits *lim,
                             size_t *n, bool *nomem)
{
    if (r->toklen == 0) /* no tokens field at all: tok is NULL */
        return NULL;
    const uint8_t *p = r->tok, *end = r->tok + r->toklen;
    if (end[-1] & 0x80)
        return NULL;
    *n = count_ends(p, r->toklen);
    if (*n > lim->max_prompt_tokens)
        return NULL; /* refused by protobuf-c's path, with its figures */
    uint32_t *t = kvr_codec_array(*n, sizeof *t);
    *nomem = !t;
    if (t && !unpack_u32s(p, r->toklen, t)) {
        free(t);
        return NULL;
    }
    return t;
}

/* false when buf is not of the fast path's shape; else true, the decoder's answer in *st. */
static bool fast_generate(const void *buf, size_t len, const struct kvr_wire_limits *lim,
                          struct kvr_wire_request *out, kvr_status *st)
{
    struct fast_request r = {0};
    bool nomem = false;
    size_t n;
    if (!fast_scan(buf, (const uint8_t *)buf + len, &r))
        return false;
    uint32_t *tokens = fast_tokens(&r, lim, &n, &nomem);
    *st = KVR_ERR_NOMEM;
    if (!tokens)
        return nomem;
    char id[KVR_REQUEST_ID_MAX + 1];
    memcpy(id, r.id ? (const void *)r.id : "", r.idlen);
    id[r.idlen] = 0;
    Kvrouter__V1__GenerateRequest m = KVROUTER__V1__GENERATE_REQUEST__INIT;
    m.request_id = id;
    m.token_ids = tokens;
    m.n_token_ids = n;
    m.max_tokens = r.max_tokens;
    m.deadline_ms = r.deadline_ms;
    *st = request_done(take_request_tokens(&m, lim, out, &tokens), out);
    free(tokens); /* NULL once taken */
    return true;
}

/* The field numbers the NUL check follows (proto/kvrouter/v1/kvrouter.proto). */
#define GENERATE_REQUEST_ID 1u /* GenerateRequest.request_id */
#define NESTED_REQUEST      1u /* WorkerGenerate.request, SelectRequest.request */

/* st, or KVR_ERR_INVALID if the request in buf (field `field` of it, else buf itself) holds an id
 * with a NUL byte: protobuf-c cut it there, and two of a client's requests would read as one
 * (kvr_codec_nul_in). No refusal of it names a request: the id as far as it reads ("a" of "a\0b")
 * may be another request of the same client, which would read the refusal as its own final.
 * Never on the fast path, which takes printable ids alone. */
static kvr_status refuse_nul_id(kvr_status st, const void *buf, size_t len, uint32_t field,
                                struct kvr_wire_request *out)
{
    bool nul = field ? kvr_codec_nul_in(buf, len, field, GENERATE_REQUEST_ID)
                     : kvr_codec_nul_in(buf, len, GENERATE_REQUEST_ID, 0);
    if (!nul)
        return st;
    if (out->request_id) /* whatever the answer (max_tokens 0 too), it names no request: emptied
                            in place, so a readable request's error still has its (empty) id */
        out->request_id[0] = 0;
    if (st != KVR_OK)
        return st;
    out->invalid = "request_id holds a NUL byte";
    return KVR_ERR_INVALID;
}

kvr_status kvr_wire_decode_generate(const void *buf, size_t len, const struct kvr_wire_limits *lim,
                                    struct kvr_wire_request *out)
{
    memset(out, 0, sizeof *out);
    if (len > kvr_wire_request_cap(lim))
        return too_large(out, len, lim);
    kvr_status st;
    return fast_generate(buf, len, lim, out, &st) ? st
                                                  : kvr_wire_decode_generate_pb(buf, len, lim, out);
}

kvr_status kvr_wire_decode_generate_pb(const void *buf, size_t len,
                                       const struct kvr_wire_limits *lim,
                                       struct kvr_wire_request *out)
{
    memset(out, 0, sizeof *out);
    if (len > kvr_wire_request_cap(lim))
        return too_large(out, len, lim);
    struct kvr_codec_alloc a;
    kvr_status why;
    Kvrouter__V1__GenerateRequest *m =
        kvr_codec_unpack(&a, &kvrouter__v1__generate_request__descriptor, buf, len, &why);
    if (!m)
        return why;
    kvr_status st = refuse_nul_id(take_request(m, lim, out), buf, len, 0, out);
    kvrouter__v1__generate_request__free_unpacked(m, &a.pc);
    return request_done(st, out);
}

kvr_status kvr_wire_decode_worker_generate(const void *buf, size_t len,
                                           const struct kvr_wire_limits *lim,
                                           struct kvr_wire_request *out, uint64_t *key,
                                           uint32_t *overlap)
{
    memset(out, 0, sizeof *out);
    *key = 0;
    *overlap = 0;
    if (len > kvr_wire_request_cap(lim))
        return too_large(out, len, lim);
    struct kvr_codec_alloc a;
    kvr_status why;
    Kvrouter__V1__WorkerGenerate *m =
        kvr_codec_unpack(&a, &kvrouter__v1__worker_generate__descriptor, buf, len, &why);
    if (!m)
        return why;
    *key = m->request_key;
    *overlap = m->overlap_blocks;
    kvr_status st = KVR_ERR_TOO_LARGE;
    if (strlen(kvr_codec_str(m->router_id)) <= KVR_ROUTER_ID_MAX)
        st = take_request(m->request, lim, out);
    if (st == KVR_OK && m->request_key == 0)
        st = KVR_ERR_INVALID;
    st = refuse_nul_id(st, buf, len, NESTED_REQUEST, out);
    if (st == KVR_OK && m->deadline_ms) /* what a router left of it; a client's direct forward
                                            (after a select) carries its own in its request */
        out->deadline_ms = m->deadline_ms;
    kvrouter__v1__worker_generate__free_unpacked(m, &a.pc);
    return request_done(st, out);
}

kvr_status kvr_wire_decode_select(const void *buf, size_t len, const struct kvr_wire_limits *lim,
                                  struct kvr_wire_request *out, bool *book)
{
    memset(out, 0, sizeof *out);
    *book = false;
    if (len > kvr_wire_request_cap(lim))
        return too_large(out, len, lim);
    struct kvr_codec_alloc a;
    kvr_status why;
    Kvrouter__V1__SelectRequest *m =
        kvr_codec_unpack(&a, &kvrouter__v1__select_request__descriptor, buf, len, &why);
    if (!m)
        return why;
    *book = m->book;
    kvr_status st =
        refuse_nul_id(take_request(m->request, lim, out), buf, len, NESTED_REQUEST, out);
    kvrouter__v1__select_request__free_unpacked(m, &a.pc);
    return request_done(st, out);
}

/* --- responses --------------------------------------------------------------------------- */

void kvr_wire_response_free(struct kvr_wire_response *r)
{
    free(r->request_id);
    free(r->error);
    free(r->text);
    memset(r, 0, sizeof *r);
}

kvr_status kvr_wire_decode_response(const void *buf, size_t len, struct kvr_wire_response *out)
{
    memset(out, 0, sizeof *out);
    if (len > KVR_WIRE_RESPONSE_MAX)
        return KVR_ERR_TOO_LARGE;
    struct kvr_codec_alloc a;
    kvr_status why;
    Kvrouter__V1__GenerateResponse *m =
        kvr_codec_unpack(&a, &kvrouter__v1__generate_response__descriptor, buf, len, &why);
    if (!m)
        return why;
    kvr_status st = KVR_ERR_TOO_LARGE;
    if (m->n_token_ids <= KVR_WIRE_RESPONSE_TOKENS_MAX)
        st = kvr_codec_dup(m->request_id, KVR_REQUEST_ID_MAX, &out->request_id);
    if (st == KVR_OK)
        st = kvr_codec_dup(m->error, KVR_ERROR_TEXT_MAX, &out->error);
    if (st == KVR_OK)
        st = kvr_codec_dup(m->text, KVR_WIRE_TEXT_MAX, &out->text);
    if (st == KVR_OK && strlen(m->finish_reason) > KVR_WIRE_FINISH_REASON_MAX)
        st = KVR_ERR_TOO_LARGE;
    if (st == KVR_OK) {
        out->ntext = (uint32_t)strlen(out->text);
        strcpy(out->finish_reason, m->finish_reason);
    }
    out->ntokens = (uint32_t)m->n_token_ids;
    out->final = m->final;
    out->error_code = m->error_code;
    out->worker_id = m->worker_id;
    out->cached_tokens = m->cached_tokens;
    out->position = m->position;
    kvrouter__v1__generate_response__free_unpacked(m, &a.pc);
    if (st != KVR_OK)
        kvr_wire_response_free(out);
    return st;
}

/* --- encoders ---------------------------------------------------------------------------- */

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
    return kvr_codec_pack(b, &m.base);
}

char *kvr_codec_error_text(char *buf, size_t len, kvr_status st, const char *detail)
{
    if (detail && detail[0])
        snprintf(buf, len, "%s: %s", kvr_status_str(st), detail);
    else
        snprintf(buf, len, "%s", kvr_status_str(st));
    return buf;
}

kvr_status kvr_wire_encode_chunk(struct kvr_buf *b, const struct kvr_wire_chunk *c)
{
    Kvrouter__V1__GenerateResponse m = KVROUTER__V1__GENERATE_RESPONSE__INIT;
    char text[KVR_ERROR_TEXT_MAX + 1];
    m.request_id = (char *)(c->request_id ? c->request_id : "");
    m.token_ids = (uint32_t *)c->tokens;
    m.n_token_ids = c->ntokens;
    m.position = c->position;
    m.final = c->final;
    if (c->final && c->error == KVR_OK && c->finish_reason)
        m.finish_reason = (char *)c->finish_reason;
    else if (c->final)
        m.finish_reason = (char *)(c->error == KVR_OK              ? "length"
                                   : c->error == KVR_ERR_CANCELLED ? "cancelled"
                                                                   : "error");
    if (c->ntext > KVR_WIRE_TEXT_MAX)
        return KVR_ERR_TOO_LARGE;
    char *body = NULL;
    if (c->ntext) { /* protobuf-c packs a string up to its NUL: a copy with one */
        if (!(body = malloc((size_t)c->ntext + 1)))
            return KVR_ERR_NOMEM;
        memcpy(body, c->text, c->ntext);
        body[c->ntext] = 0;
        m.text = body;
    }
    m.error_code = (Kvrouter__V1__ErrorCode)c->error;
    if (c->error != KVR_OK)
        m.error = kvr_codec_error_text(text, sizeof text, c->error, c->detail);
    m.worker_id = c->worker_id;
    m.cached_tokens = c->cached_tokens;
    kvr_status st = kvr_codec_pack(b, &m.base);
    free(body);
    return st;
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
                                           uint64_t key, uint32_t overlap, const char *router_id,
                                           uint32_t deadline_ms)
{
    Kvrouter__V1__WorkerGenerate m = KVROUTER__V1__WORKER_GENERATE__INIT;
    m.request_key = key;
    m.overlap_blocks = overlap;
    m.router_id = (char *)(router_id ? router_id : "");
    m.deadline_ms = deadline_ms;
    return wrap(b, request, len, &m.base);
}

kvr_status kvr_wire_encode_select_request(struct kvr_buf *b, const void *request, size_t len,
                                          bool book)
{
    Kvrouter__V1__SelectRequest m = KVROUTER__V1__SELECT_REQUEST__INIT;
    m.book = book;
    return wrap(b, request, len, &m.base);
}
