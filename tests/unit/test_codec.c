/*
 * The wire codec: round trips, the forwarding wrapper, and the error discipline of codec.h: every
 * decoder's byte cap, malformed input, over-long strings, over-many items, values out of range and
 * allocation failure, each with its exact status.
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "codec.h"
#include "codec_internal.h" /* kvr_wire_decode_generate_pb, to compare the fast path with */
#include "kvr/rng.h"
#include "kvrouter.pb-c.h" /* the ErrorCode enum, to check it against kvr_status */
#include "log.h"
#include "rec.h"
#include "reply.h" /* a refusal's answer is a chunk this codec encodes */

static const struct kvr_wire_limits lim = {1000, 500};

/* --- helpers: hand-written protobuf, and every decoder behind one signature ------------------ */

static void put(struct kvr_buf *b, const void *data, size_t n)
{
    cr_assert(eq(int, kvr_buf_reserve(b, b->len + n), KVR_OK));
    memcpy(b->data + b->len, data, n);
    b->len += n;
}

static void put_varint(struct kvr_buf *b, uint64_t v)
{
    for (;; v >>= 7) {
        uint8_t c = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        put(b, &c, 1);
        if (v <= 0x7f)
            break;
    }
}

/* A length-delimited field (a string, bytes or a submessage). */
static void put_len(struct kvr_buf *b, uint32_t field, const void *data, size_t n)
{
    put_varint(b, (uint64_t)field << 3 | 2);
    put_varint(b, n);
    put(b, data, n);
}

/* A string of n copies of c (NUL-terminated, free it). */
static char *repeat(char c, size_t n)
{
    char *s = malloc(n + 1);
    cr_assert(s != NULL);
    memset(s, c, n);
    s[n] = 0;
    return s;
}

static kvr_status dec_generate(const void *buf, size_t len)
{
    struct kvr_wire_request r;
    kvr_status st = kvr_wire_decode_generate(buf, len, &lim, &r);
    kvr_wire_request_free(&r);
    return st;
}

static kvr_status dec_worker_generate(const void *buf, size_t len)
{
    struct kvr_wire_request r;
    uint64_t key;
    uint32_t overlap;
    kvr_status st = kvr_wire_decode_worker_generate(buf, len, &lim, &r, &key, &overlap);
    kvr_wire_request_free(&r);
    return st;
}

static kvr_status dec_select(const void *buf, size_t len)
{
    struct kvr_wire_request r;
    bool book;
    kvr_status st = kvr_wire_decode_select(buf, len, &lim, &r, &book);
    kvr_wire_request_free(&r);
    return st;
}

static kvr_status dec_response(const void *buf, size_t len)
{
    struct kvr_wire_response r;
    kvr_status st = kvr_wire_decode_response(buf, len, &r);
    if (st == KVR_OK)
        kvr_wire_response_free(&r);
    else
        cr_assert(r.request_id == NULL && r.error == NULL, "cleaned up on an error");
    return st;
}

static kvr_status dec_select_response(const void *buf, size_t len)
{
    uint64_t wid, key;
    uint32_t overlap, n, err;
    return kvr_wire_decode_select_response(buf, len, &wid, &overlap, &n, &err, &key);
}

static kvr_status dec_kv(const void *buf, size_t len)
{
    struct kvr_wire_kv e;
    kvr_status st = kvr_wire_decode_kv(buf, len, &e);
    if (st == KVR_OK)
        kvr_wire_kv_free(&e);
    else
        cr_assert(e.blocks == NULL && e.ids == NULL && e.nblocks + e.nids == 0, "cleaned up");
    return st;
}

static kvr_status dec_tokens(const void *buf, size_t len)
{
    struct kvr_wire_tokens t;
    return kvr_wire_decode_tokens(buf, len, &t);
}

static kvr_status dec_done(const void *buf, size_t len)
{
    struct kvr_wire_done d;
    return kvr_wire_decode_done(buf, len, &d);
}

static kvr_status dec_batch(const void *buf, size_t len)
{
    struct kvr_wire_batch b;
    kvr_status st = kvr_wire_decode_batch(buf, len, &b);
    if (st != KVR_OK)
        cr_assert(b.ev == NULL && b.n == 0, "cleaned up");
    kvr_wire_batch_free(&b);
    return st;
}

static kvr_status dec_heartbeat(const void *buf, size_t len)
{
    struct kvr_wire_heartbeat h;
    kvr_status st = kvr_wire_decode_heartbeat(buf, len, &h);
    if (st == KVR_OK)
        kvr_wire_heartbeat_free(&h);
    else
        cr_assert(h.inflight == NULL && h.ninflight == 0, "cleaned up on an error");
    return st;
}

static kvr_status dec_gossip(const void *buf, size_t len)
{
    struct kvr_wire_gossip g;
    kvr_status st = kvr_wire_decode_gossip(buf, len, &g);
    if (st == KVR_OK)
        kvr_wire_gossip_free(&g);
    else
        cr_assert(g.router_id == NULL && g.d.reply == NULL && g.d.request_id == NULL &&
                      g.d.origin == NULL && g.d.rec.block_hashes == NULL,
                  "cleaned up on an error");
    return st;
}

static kvr_status dec_sync(const void *buf, size_t len)
{
    struct kvr_wire_sync s;
    kvr_status st = kvr_wire_decode_sync(buf, len, &s);
    if (st == KVR_OK)
        kvr_wire_sync_free(&s);
    else
        cr_assert(s.router_id == NULL && s.keys == NULL && s.nkeys == 0, "cleaned up on an error");
    return st;
}

static uint32_t page_calls; /* callbacks dec_page saw */

static void count_decision(void *ctx, const struct kvr_wire_decision *d)
{
    (void)ctx;
    (void)d;
    page_calls++;
}

static void count_entry(void *ctx, const struct kvr_index_record *e)
{
    (void)ctx;
    (void)e;
    page_calls++;
}

/* A page decode; on an error no callback may have run, and the head is reset. */
static kvr_status dec_page(const void *buf, size_t len)
{
    struct kvr_wire_page_head head = {true, 7, true};
    page_calls = 0;
    kvr_status st = kvr_wire_decode_page(buf, len, count_decision, count_entry, NULL, &head);
    if (st != KVR_OK) {
        cr_assert(eq(u32, page_calls, 0), "no callback before the whole page is checked");
        cr_assert(not(head.last));
        cr_assert(eq(u64, head.token, 0));
        cr_assert(not(head.index_partial));
    }
    return st;
}

struct decoder {
    const char *name;
    kvr_status (*fn)(const void *buf, size_t len);
    size_t cap; /* its byte cap */
};

static const struct decoder *decoders(size_t *n)
{
    static struct decoder d[] = {
        {"generate", dec_generate, 0},
        {"worker_generate", dec_worker_generate, 0},
        {"select", dec_select, 0},
        {"response", dec_response, KVR_WIRE_RESPONSE_MAX},
        {"select_response", dec_select_response, KVR_WIRE_SELECT_RESPONSE_MAX},
        {"kv", dec_kv, KVR_WIRE_KV_MAX},
        {"tokens", dec_tokens, KVR_WIRE_SMALL_EVENT_MAX},
        {"done", dec_done, KVR_WIRE_SMALL_EVENT_MAX},
        {"batch", dec_batch, KVR_WIRE_BATCH_BYTES_MAX},
        {"heartbeat", dec_heartbeat, KVR_WIRE_HEARTBEAT_MAX},
        {"gossip", dec_gossip, KVR_WIRE_GOSSIP_MAX},
        {"sync", dec_sync, KVR_WIRE_SYNC_MAX},
        {"page", dec_page, KVR_WIRE_PAGE_MAX},
    };
    for (int i = 0; i < 3; i++)
        d[i].cap = kvr_wire_request_cap(&lim);
    *n = sizeof d / sizeof d[0];
    return d;
}

/* --- round trips and the request decoders -------------------------------------------------- */

Test(codec, generate_round_trip_with_overrides)
{
    struct kvr_buf b = {0};
    uint32_t t[5] = {1, 2, 3, 4, 4000000000u};
    struct kvr_overrides ov = {KVR_OV_POLICY | KVR_OV_TEMPERATURE, KVR_POLICY_CHWBL, 0, 0.5};
    cr_assert(eq(int, kvr_wire_encode_generate(&b, "req-1", t, 5, 100, &ov), KVR_OK));
    struct kvr_wire_request r;
    cr_assert(eq(int, kvr_wire_decode_generate(b.data, b.len, &lim, &r), KVR_OK));
    cr_assert(eq(str, r.request_id, "req-1"));
    cr_assert(eq(u32, r.ntokens, 5));
    cr_assert(eq(int, memcmp(r.tokens, t, sizeof t), 0));
    cr_assert(eq(u32, r.max_tokens, 100));
    cr_assert(eq(u32, r.ov.flags, KVR_OV_POLICY | KVR_OV_TEMPERATURE));
    cr_assert(eq(int, r.ov.policy, KVR_POLICY_CHWBL));
    cr_assert(eq(dbl, r.ov.temperature, 0.5));
    kvr_wire_request_free(&r);
    kvr_buf_free(&b);
}

/* A forward's deadline is what its router left of the client's; a client's direct forward (after
 * a select, WorkerGenerate's own field 0) keeps the request's own: it was lost, and the request
 * never ended with ERR_DEADLINE. */
Test(codec, a_direct_forward_keeps_the_requests_deadline)
{
    uint32_t t[4] = {1, 2, 3, 4};
    Kvrouter__V1__GenerateRequest g = KVROUTER__V1__GENERATE_REQUEST__INIT;
    g.request_id = "d";
    g.token_ids = t;
    g.n_token_ids = 4;
    g.max_tokens = 8;
    g.deadline_ms = 500;
    uint8_t req[64];
    size_t n = kvrouter__v1__generate_request__pack(&g, req);
    struct kvr_buf fwd = {0};
    struct kvr_wire_request r;
    uint64_t key;
    uint32_t overlap;
    static const uint32_t outer[] = {0, 300}, want[] = {500, 300};
    for (int i = 0; i < 2; i++) {
        cr_assert(
            eq(int, kvr_wire_encode_worker_generate(&fwd, req, n, 9, 0, "r1", outer[i]), KVR_OK));
        cr_assert(eq(int,
                     kvr_wire_decode_worker_generate(fwd.data, fwd.len, &lim, &r, &key, &overlap),
                     KVR_OK));
        cr_assert(eq(u32, r.deadline_ms, want[i]), "outer %u", outer[i]);
        kvr_wire_request_free(&r);
    }
    kvr_buf_free(&fwd);
}

Test(codec, forwarding_wraps_the_client_bytes_unchanged)
{
    struct kvr_buf req = {0}, fwd = {0};
    uint32_t t[300];
    for (int i = 0; i < 300; i++)
        t[i] = (uint32_t)i * 7;
    cr_assert(eq(int, kvr_wire_encode_generate(&req, "abc", t, 300, 9, NULL), KVR_OK));
    cr_assert(
        eq(int, kvr_wire_encode_worker_generate(&fwd, req.data, req.len, 42, 7, "r1", 0), KVR_OK));
    struct kvr_wire_request r;
    uint64_t key = 0;
    uint32_t overlap = 0;
    cr_assert(eq(int, kvr_wire_decode_worker_generate(fwd.data, fwd.len, &lim, &r, &key, &overlap),
                 KVR_OK));
    cr_assert(eq(u64, key, 42));
    cr_assert(eq(u32, overlap, 7));
    cr_assert(eq(u32, r.ntokens, 300));
    cr_assert(eq(u32, r.tokens[299], 299 * 7));
    kvr_wire_request_free(&r);
    bool book = false;
    cr_assert(eq(int, kvr_wire_encode_select_request(&fwd, req.data, req.len, true), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_select(fwd.data, fwd.len, &lim, &r, &book), KVR_OK));
    cr_assert(book);
    cr_assert(eq(str, r.request_id, "abc"));
    kvr_wire_request_free(&r);
    kvr_buf_free(&req);
    kvr_buf_free(&fwd);
}

Test(codec, bad_requests_are_named_errors)
{
    struct kvr_buf b = {0};
    struct kvr_wire_request r;
    uint32_t t[2] = {1, 2};
    cr_assert(eq(int, kvr_wire_encode_generate(&b, "empty", t, 0, 10, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_generate(b.data, b.len, &lim, &r), KVR_ERR_EMPTY_PROMPT));
    cr_assert(eq(str, r.request_id, "empty"), "the id survives to name the error");
    kvr_wire_request_free(&r);
    uint32_t *big = calloc(1001, sizeof *big);
    cr_assert(eq(int, kvr_wire_encode_generate(&b, "big", big, 1001, 10, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_generate(b.data, b.len, &lim, &r), KVR_ERR_PROMPT_TOO_LONG));
    char why[128];
    cr_assert(eq(str, (char *)kvr_wire_request_why(&r, KVR_ERR_PROMPT_TOO_LONG, why, sizeof why),
                 "1001 tokens, the limit is 1000"));
    kvr_wire_request_free(&r);
    free(big);
    /* max_tokens over the limit and max_tokens 0 are two mistakes, with two codes */
    cr_assert(eq(int, kvr_wire_encode_generate(&b, "out", t, 2, 501, NULL), KVR_OK));
    cr_assert(
        eq(int, kvr_wire_decode_generate(b.data, b.len, &lim, &r), KVR_ERR_MAX_TOKENS_TOO_LARGE));
    cr_assert(eq(str,
                 (char *)kvr_wire_request_why(&r, KVR_ERR_MAX_TOKENS_TOO_LARGE, why, sizeof why),
                 "501 requested, the limit is 500"));
    cr_assert(eq(str, r.request_id, "out"));
    kvr_wire_request_free(&r);
    cr_assert(eq(int, kvr_wire_encode_generate(&b, "zero", t, 2, 0, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_generate(b.data, b.len, &lim, &r), KVR_ERR_MAX_TOKENS_ZERO));
    kvr_wire_request_free(&r);
    /* a request id at its cap is fine; one byte more is over it */
    char *id = repeat('x', KVR_REQUEST_ID_MAX);
    cr_assert(eq(int, kvr_wire_encode_generate(&b, id, t, 2, 5, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_generate(b.data, b.len, &lim, &r), KVR_OK));
    cr_assert(eq(sz, strlen(r.request_id), KVR_REQUEST_ID_MAX));
    kvr_wire_request_free(&r);
    free(id);
    id = repeat('x', KVR_REQUEST_ID_MAX + 1);
    cr_assert(eq(int, kvr_wire_encode_generate(&b, id, t, 2, 5, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_generate(b.data, b.len, &lim, &r), KVR_ERR_ID_TOO_LONG));
    cr_assert(eq(ptr, r.request_id, NULL));
    cr_assert(eq(u64, r.got, KVR_REQUEST_ID_MAX + 1));
    kvr_wire_request_free(&r);
    free(id);
    /* an unknown policy name, written by hand: Overrides{policy = "nope"} in field 4 */
    cr_assert(eq(int, kvr_wire_encode_generate(&b, "p", t, 2, 5, NULL), KVR_OK));
    uint8_t extra[] = {0x22, 0x06, 0x0a, 0x04, 'n', 'o', 'p', 'e'};
    kvr_buf_reserve(&b, b.len + sizeof extra);
    memcpy(b.data + b.len, extra, sizeof extra);
    cr_assert(eq(int, kvr_wire_decode_generate(b.data, b.len + sizeof extra, &lim, &r),
                 KVR_ERR_UNKNOWN_POLICY));
    kvr_wire_request_free(&r);
    kvr_buf_free(&b);
}

Test(codec, garbage_never_crashes)
{
    struct kvr_rng rng;
    kvr_rng_seed(&rng, 5);
    uint8_t buf[512];
    for (int k = 0; k < 20000; k++) {
        size_t n = kvr_rng_below(&rng, sizeof buf);
        for (size_t i = 0; i < n; i++)
            buf[i] = (uint8_t)kvr_rng_next(&rng);
        struct kvr_wire_request r;
        uint64_t key;
        uint32_t ov;
        bool book;
        kvr_wire_decode_generate(buf, n, &lim, &r);
        kvr_wire_request_free(&r);
        kvr_wire_decode_worker_generate(buf, n, &lim, &r, &key, &ov);
        kvr_wire_request_free(&r);
        kvr_wire_decode_select(buf, n, &lim, &r, &book);
        kvr_wire_request_free(&r);
        struct kvr_wire_kv e;
        if (kvr_wire_decode_kv(buf, n, &e) == KVR_OK)
            kvr_wire_kv_free(&e);
        struct kvr_wire_heartbeat h;
        if (kvr_wire_decode_heartbeat(buf, n, &h) == KVR_OK)
            kvr_wire_heartbeat_free(&h);
        struct kvr_wire_tokens tk;
        kvr_wire_decode_tokens(buf, n, &tk);
        struct kvr_wire_done dn;
        kvr_wire_decode_done(buf, n, &dn);
        struct kvr_wire_response rs;
        if (kvr_wire_decode_response(buf, n, &rs) == KVR_OK)
            kvr_wire_response_free(&rs);
        size_t nd;
        const struct decoder *d = decoders(&nd);
        for (size_t i = 0; k % 4 == 0 && i < nd; i++)
            cr_assert(ne(int, d[i].fn(buf, n), KVR_ERR_NOMEM), "%s: garbage is not NOMEM",
                      d[i].name);
    }
    cr_assert(
        eq(int, kvr_wire_decode_kv("\\xff\\xff", 2, &(struct kvr_wire_kv){0}), KVR_ERR_MALFORMED));
}

Test(codec, events_round_trip)
{
    struct kvr_buf b = {0};
    struct kvr_kv_block blocks[3] = {{1, 11}, {2, 22}, {3, 33}};
    uint64_t parent = 99;
    cr_assert(eq(int, kvr_wire_encode_stored(&b, 7, 5, &parent, blocks, 3), KVR_OK));
    struct kvr_wire_kv e;
    cr_assert(eq(int, kvr_wire_decode_kv(b.data, b.len, &e), KVR_OK));
    cr_assert(eq(int, e.kind, KVR_WIRE_STORED));
    cr_assert(e.has_parent);
    cr_assert(eq(u64, e.parent, 99));
    cr_assert(eq(u32, e.nblocks, 3));
    cr_assert(eq(u64, e.blocks[2].local_hash, 33));
    cr_assert(eq(u64, e.worker_id, 7));
    cr_assert(eq(u64, e.event_seq, 5));
    kvr_wire_kv_free(&e);
    uint64_t ids[2] = {4, 5};
    cr_assert(eq(int, kvr_wire_encode_removed(&b, 7, 6, ids, 2), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_kv(b.data, b.len, &e), KVR_OK));
    cr_assert(eq(int, e.kind, KVR_WIRE_REMOVED));
    cr_assert(eq(u32, e.nids, 2));
    cr_assert(eq(u64, e.ids[1], 5));
    kvr_wire_kv_free(&e);
    cr_assert(eq(int, kvr_wire_encode_cleared(&b, 7, 7), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_kv(b.data, b.len, &e), KVR_OK));
    cr_assert(eq(int, e.kind, KVR_WIRE_CLEARED));
    kvr_wire_kv_free(&e);
    struct kvr_wire_tokens tk;
    cr_assert(eq(int, kvr_wire_encode_tokens(&b, 7, 123, KVR_WIRE_OUTPUT_BLOCK), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_tokens(b.data, b.len, &tk), KVR_OK));
    cr_assert(eq(int, tk.kind, KVR_WIRE_OUTPUT_BLOCK));
    cr_assert(eq(u64, tk.key, 123));
    struct kvr_wire_done dn;
    cr_assert(eq(int, kvr_wire_encode_done(&b, 7, 124, 0, 0), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_done(b.data, b.len, &dn), KVR_OK));
    cr_assert(eq(u64, dn.key, 124));
    uint64_t infl[3] = {1, 2, 3};
    struct kvr_wire_heartbeat
        h = {{.id = 7, .block_size = 64, .capacity_blocks = 16384, .waiting = 2, .kv_usage = 0.25},
             infl,
             3,
             1000,
             false,
             0xfeedull,
             12345,
             (uint64_t[]){77, 78},
             2,
             UINT64_MAX - 1,
             5},
        g;
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &h), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_heartbeat(b.data, b.len, &g), KVR_OK));
    cr_assert(eq(u64, g.info.id, 7));
    cr_assert(eq(u32, g.info.block_size, 64));
    cr_assert(eq(u64, g.info.capacity_blocks, 16384));
    cr_assert(eq(u32, g.ninflight, 3));
    cr_assert(eq(u64, g.inflight[2], 3));
    cr_assert(eq(u32, g.nended, 2));
    cr_assert(eq(u64, g.ended[1], 78));
    cr_assert(eq(u64, g.instance, 0xfeed));
    cr_assert(eq(u64, g.last_event_seq, UINT64_MAX - 1));
    cr_assert(eq(u32, g.forwards_waiting, 5));
    cr_assert(not(g.info.approximate));
    kvr_wire_heartbeat_free(&g);
    h.info.approximate = true; /* an engine without KV events */
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &h), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_heartbeat(b.data, b.len, &g), KVR_OK));
    cr_assert(g.info.approximate);
    kvr_wire_heartbeat_free(&g);
    h.info.id = 0;
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &h), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_heartbeat(b.data, b.len, &g), KVR_ERR_INVALID));
    struct kvr_wire_response rs;
    cr_assert(
        eq(int,
           kvr_wire_encode_chunk(
               &b, &(struct kvr_wire_chunk){.request_id = "x",
                                            .tokens = infl == NULL ? NULL : (uint32_t[]){1, 2},
                                            .ntokens = 2,
                                            .final = true,
                                            .error = KVR_ERR_WORKER_LOST,
                                            .worker_id = 7,
                                            .cached_tokens = 0}),
           KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_response(b.data, b.len, &rs), KVR_OK));
    cr_assert(rs.final);
    cr_assert(eq(u32, rs.error_code, KVR_ERR_WORKER_LOST));
    cr_assert(eq(str, rs.error, "worker lost"));
    cr_assert(eq(u32, rs.ntokens, 2));
    kvr_wire_response_free(&rs);
    kvr_buf_free(&b);
}

Test(codec, gossip_round_trip)
{
    struct kvr_buf b = {0};
    uint64_t h[3] = {11, 22, 33};
    struct kvr_request_record rec = {77, 5, h, 3, 150, 2, true, 4, 300};
    cr_assert(eq(
        int,
        kvr_wire_encode_gossip_decision(&b, "r1", 9, 42, &rec, "_INBOX.x", "req-7", "r1", 123, 2),
        KVR_OK));
    struct kvr_wire_gossip g;
    cr_assert(eq(int, kvr_wire_decode_gossip(b.data, b.len, &g), KVR_OK));
    cr_assert(eq(str, g.router_id, "r1"));
    cr_assert(eq(u64, g.epoch, 9));
    cr_assert(eq(u64, g.seq, 42));
    cr_assert(eq(int, g.kind, KVR_WIRE_GOSSIP_DECISION));
    cr_assert(eq(u64, g.d.rec.request_id, 77));
    cr_assert(eq(u64, g.d.rec.worker_id, 5));
    cr_assert(eq(u64, g.d.decided_ns, 123));
    cr_assert(eq(u32, g.d.placement, 2), "its origin's third placement");
    cr_assert(eq(u32, g.d.rec.nblocks, 3));
    cr_assert(eq(u64, g.d.rec.block_hashes[2], 33));
    cr_assert(eq(u32, g.d.rec.prompt_tokens, 150));
    cr_assert(eq(u32, g.d.rec.overlap_blocks, 2));
    cr_assert(g.d.rec.prefill_done);
    cr_assert(eq(u32, g.d.rec.output_blocks, 4));
    cr_assert(eq(u32, g.d.rec.max_tokens, 300));
    cr_assert(eq(str, g.d.reply, "_INBOX.x"));
    cr_assert(eq(str, g.d.request_id, "req-7"));
    cr_assert(eq(str, g.d.origin, "r1"));
    kvr_wire_gossip_free(&g);

    cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, "r2", 3, 8, true), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_gossip(b.data, b.len, &g), KVR_OK));
    cr_assert(eq(int, g.kind, KVR_WIRE_GOSSIP_HELLO));
    cr_assert(g.serving);
    cr_assert(eq(u64, g.seq, 8));
    kvr_wire_gossip_free(&g);

    /* a decision naming no worker or no request, a cached prefix longer than the prompt, no
     * sender: well-formed, values out of range */
    rec.worker_id = 0;
    kvr_wire_encode_gossip_decision(&b, "r1", 9, 43, &rec, "", "", "r1", 0, 0);
    cr_assert(eq(int, kvr_wire_decode_gossip(b.data, b.len, &g), KVR_ERR_INVALID));
    cr_assert(eq(ptr, g.router_id, NULL), "freed and zeroed on an error");
    rec.worker_id = 5;
    rec.request_id = 0;
    kvr_wire_encode_gossip_decision(&b, "r1", 9, 43, &rec, "", "", "r1", 0, 0);
    cr_assert(eq(int, kvr_wire_decode_gossip(b.data, b.len, &g), KVR_ERR_INVALID));
    rec.request_id = 77;
    rec.overlap_blocks = 4;
    kvr_wire_encode_gossip_decision(&b, "r1", 9, 44, &rec, "", "", "r1", 0, 0);
    cr_assert(eq(int, kvr_wire_decode_gossip(b.data, b.len, &g), KVR_ERR_INVALID));
    kvr_wire_encode_gossip_hello(&b, "", 3, 8, true);
    cr_assert(eq(int, kvr_wire_decode_gossip(b.data, b.len, &g), KVR_ERR_INVALID));
    kvr_buf_free(&b);
}

Test(codec, a_queued_notice_round_trip_and_its_checks)
{
    struct kvr_buf b = {0};
    struct kvr_wire_queued q = {"_INBOX.q", "req-8", 1234, 5000, false, KVR_OK};
    cr_assert(eq(int, kvr_wire_encode_gossip_queued(&b, "r4", 3, 17, &q), KVR_OK));
    struct kvr_wire_gossip g;
    cr_assert(eq(int, kvr_wire_decode_gossip(b.data, b.len, &g), KVR_OK));
    cr_assert(eq(int, g.kind, KVR_WIRE_GOSSIP_QUEUED));
    cr_assert(eq(str, g.router_id, "r4"));
    cr_assert(eq(u64, g.seq, 17), "the seq of its last decision");
    cr_assert(eq(str, g.q.reply, "_INBOX.q"));
    cr_assert(eq(str, g.q.request_id, "req-8"));
    cr_assert(eq(u64, g.q.decided_ns, 1234));
    cr_assert(eq(u32, g.q.wait_ms, 5000));
    cr_assert(not(g.q.released));
    kvr_wire_gossip_free(&g);
    q.released = true;
    q.error_code = KVR_ERR_OVERLOADED;
    cr_assert(eq(int, kvr_wire_encode_gossip_queued(&b, "r4", 3, 17, &q), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_gossip(b.data, b.len, &g), KVR_OK));
    cr_assert(g.q.released);
    cr_assert(eq(u32, g.q.error_code, KVR_ERR_OVERLOADED), "the answer its client got");
    kvr_wire_gossip_free(&g);
    q.reply = ""; /* nobody to absorb a resend for */
    cr_assert(eq(int, kvr_wire_encode_gossip_queued(&b, "r4", 3, 17, &q), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_gossip(b.data, b.len, &g), KVR_ERR_INVALID));
    cr_assert(eq(ptr, g.q.reply, NULL), "freed and zeroed on an error");
    char longer[KVR_REQUEST_ID_MAX + 2];
    memset(longer, 'i', sizeof longer - 1);
    longer[sizeof longer - 1] = 0;
    q.reply = "_INBOX.q";
    q.request_id = longer;
    cr_assert(eq(int, kvr_wire_encode_gossip_queued(&b, "r4", 3, 17, &q), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_gossip(b.data, b.len, &g), KVR_ERR_TOO_LARGE));
    kvr_buf_free(&b);
}

Test(codec, sync_request_round_trip)
{
    struct kvr_buf b = {0};
    uint64_t keys[2] = {5, 6};
    struct kvr_wire_sync s = {"r3", false, keys, 2, 10, 20, 7, 99}, t;
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &s), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_sync(b.data, b.len, &t), KVR_OK));
    cr_assert(eq(str, t.router_id, "r3"));
    cr_assert(not(t.full));
    cr_assert(eq(u32, t.nkeys, 2));
    cr_assert(eq(u64, t.keys[1], 6));
    cr_assert(eq(u64, t.from_seq, 10));
    cr_assert(eq(u64, t.to_seq, 20));
    cr_assert(eq(u64, t.epoch, 7));
    cr_assert(eq(u64, t.token, 99));
    kvr_wire_sync_free(&t);
    s.from_seq = 30; /* a backwards range */
    kvr_wire_encode_sync(&b, &s);
    cr_assert(eq(int, kvr_wire_decode_sync(b.data, b.len, &t), KVR_ERR_INVALID));
    cr_assert(eq(ptr, t.router_id, NULL), "freed and zeroed on an error");
    s.from_seq = 10; /* the longest repair range, and one more */
    s.to_seq = 10 + KVR_WIRE_SYNC_RANGE_MAX;
    kvr_wire_encode_sync(&b, &s);
    cr_assert(eq(int, kvr_wire_decode_sync(b.data, b.len, &t), KVR_OK));
    kvr_wire_sync_free(&t);
    s.to_seq++;
    kvr_wire_encode_sync(&b, &s);
    cr_assert(eq(int, kvr_wire_decode_sync(b.data, b.len, &t), KVR_ERR_INVALID));
    kvr_buf_free(&b);
}

struct page_seen {
    uint32_t decisions, entries, placements;
    uint64_t hash_sum, ttl_sum;
    char last_origin[16];
};

static void seen_decision(void *ctx, const struct kvr_wire_decision *d)
{
    struct page_seen *s = ctx;
    s->decisions++;
    s->placements += d->placement;
    for (uint32_t i = 0; i < d->rec.nblocks; i++)
        s->hash_sum += d->rec.block_hashes[i];
    snprintf(s->last_origin, sizeof s->last_origin, "%s", d->origin);
}

static void seen_entry(void *ctx, const struct kvr_index_record *e)
{
    struct page_seen *s = ctx;
    s->entries++;
    s->ttl_sum += e->ttl_left_ns;
}

Test(codec, sync_pages_carry_decisions_and_entries)
{
    struct kvr_page p;
    kvr_page_init(&p);
    struct kvr_buf b = {0};
    uint64_t expect = 0;
    for (uint32_t i = 1; i <= 300; i++) {
        uint64_t h[4] = {i, i + 1, i + 2, i + 3};
        expect += 4 * (uint64_t)i + 6;
        struct kvr_request_record rec = {i, 1 + i % 4, h, 4, 200, 1, false, 0, 0};
        cr_assert(
            eq(int,
               kvr_page_add_decision(&p, &rec, "_INBOX.a", "id", i == 300 ? "rz" : "ra", 0, i % 2),
               KVR_OK));
    }
    for (uint32_t i = 1; i <= 500; i++) { /* within KVR_WIRE_PAGE_ITEMS_MAX */
        struct kvr_index_record e = {1 + i % 4, i, false, 0, 5000000ull};
        cr_assert(eq(int, kvr_page_add_entry(&p, &e), KVR_OK));
    }
    cr_assert(gt(sz, p.approx, 1000));
    cr_assert(eq(int, kvr_page_encode(&p, &b, true, 31), KVR_OK));
    cr_assert(eq(sz, p.approx, 0));
    struct page_seen seen = {0};
    struct kvr_wire_page_head head;
    cr_assert(eq(int, kvr_wire_decode_page(b.data, b.len, seen_decision, seen_entry, &seen, &head),
                 KVR_OK));
    cr_assert(head.last);
    cr_assert(eq(u64, head.token, 31));
    cr_assert(not(head.index_partial));
    cr_assert(eq(u32, seen.decisions, 300));
    cr_assert(eq(u32, seen.entries, 500));
    cr_assert(eq(u64, seen.hash_sum, expect));
    cr_assert(eq(u64, seen.ttl_sum, 500 * 5000000ull));
    cr_assert(eq(str, seen.last_origin, "rz"));
    cr_assert(eq(u32, seen.placements, seen.decisions / 2), "each decision's placement kept");
    /* the emptied page encodes to an empty page; a sender's holes are said on every page */
    p.index_partial = true;
    cr_assert(eq(int, kvr_page_encode(&p, &b, false, 32), KVR_OK));
    memset(&seen, 0, sizeof seen);
    cr_assert(eq(int, kvr_wire_decode_page(b.data, b.len, seen_decision, seen_entry, &seen, &head),
                 KVR_OK));
    cr_assert(not(head.last));
    cr_assert(head.index_partial);
    cr_assert(eq(u32, seen.decisions + seen.entries, 0));
    kvr_page_free(&p);
    kvr_buf_free(&b);
}

Test(codec, replica_garbage_never_crashes)
{
    struct kvr_rng rng;
    kvr_rng_seed(&rng, 9);
    uint8_t buf[512];
    struct page_seen seen = {0};
    for (int k = 0; k < 20000; k++) {
        size_t n = kvr_rng_below(&rng, sizeof buf);
        for (size_t i = 0; i < n; i++)
            buf[i] = (uint8_t)kvr_rng_next(&rng);
        struct kvr_wire_gossip g;
        if (kvr_wire_decode_gossip(buf, n, &g) == KVR_OK)
            kvr_wire_gossip_free(&g);
        struct kvr_wire_sync s;
        if (kvr_wire_decode_sync(buf, n, &s) == KVR_OK)
            kvr_wire_sync_free(&s);
        struct kvr_wire_page_head head;
        kvr_wire_decode_page(buf, n, seen_decision, seen_entry, &seen, &head);
    }
}

/* --- the error discipline ------------------------------------------------------------------ */

Test(codec, every_decoder_caps_its_bytes_before_protobuf_sees_them)
{
    size_t n;
    const struct decoder *d = decoders(&n);
    size_t most = 0;
    for (size_t i = 0; i < n; i++)
        most = d[i].cap > most ? d[i].cap : most;
    uint8_t *buf = malloc(most + 1);
    cr_assert(buf != NULL);
    memset(buf, 0xff, most + 1); /* no valid message: a decoder that unpacked it would say so */
    for (size_t i = 0; i < n; i++) {
        cr_assert(eq(int, d[i].fn(buf, d[i].cap + 1), KVR_ERR_TOO_LARGE), "%s", d[i].name);
        cr_assert(eq(int, d[i].fn(buf, d[i].cap), KVR_ERR_MALFORMED), "%s: at its cap", d[i].name);
    }
    free(buf);
    /* the request cap follows the limits: 5 bytes a token plus the fixed allowance */
    cr_assert(eq(sz, kvr_wire_request_cap(&lim), 1000 * 5 + KVR_WIRE_SLACK));
    struct kvr_wire_limits huge = {UINT32_MAX, 1};
    cr_assert(
        eq(u64, (uint64_t)kvr_wire_request_cap(&huge), (uint64_t)UINT32_MAX * 5 + KVR_WIRE_SLACK));
}

Test(codec, a_prompt_over_the_byte_cap_is_too_large_under_it_too_long)
{
    struct kvr_buf b = {0};
    struct kvr_wire_request r;
    uint32_t *t = malloc(2000 * sizeof *t);
    for (int i = 0; i < 2000; i++)
        t[i] = 4000000000u; /* 5 bytes each: 10 KB, over 1000 * 5 + 4096 */
    cr_assert(eq(int, kvr_wire_encode_generate(&b, "big", t, 2000, 10, NULL), KVR_OK));
    cr_assert(gt(sz, b.len, kvr_wire_request_cap(&lim)));
    cr_assert(eq(int, kvr_wire_decode_generate(b.data, b.len, &lim, &r), KVR_ERR_TOO_LARGE));
    kvr_wire_request_free(&r);
    cr_assert(eq(int, kvr_wire_encode_generate(&b, "long", t, 1001, 10, NULL), KVR_OK));
    cr_assert(le(sz, b.len, kvr_wire_request_cap(&lim)));
    cr_assert(eq(int, kvr_wire_decode_generate(b.data, b.len, &lim, &r), KVR_ERR_PROMPT_TOO_LONG));
    cr_assert(eq(str, r.request_id, "long"));
    kvr_wire_request_free(&r);
    /* the longest prompt of the largest tokens fits its own cap, forwarded too */
    struct kvr_buf fwd = {0};
    cr_assert(eq(int, kvr_wire_encode_generate(&b, "max", t, 1000, 10, NULL), KVR_OK));
    char *rid = repeat('r', KVR_ROUTER_ID_MAX);
    cr_assert(eq(int, kvr_wire_encode_worker_generate(&fwd, b.data, b.len, UINT64_MAX, 7, rid, 0),
                 KVR_OK));
    cr_assert(eq(int, dec_worker_generate(fwd.data, fwd.len), KVR_OK));
    free(rid);
    free(t);
    kvr_buf_free(&fwd);
    kvr_buf_free(&b);
}

/* A request as long as a router lets through (the cap less the envelope), padded with a field
 * of a newer version, still fits the worker's cap once wrapped with every field at its largest. */
Test(codec, a_request_a_router_takes_fits_its_forward)
{
    size_t cap = kvr_wire_request_cap(&lim), want = cap - KVR_WIRE_FORWARD_ENVELOPE;
    struct kvr_buf b = {0}, fwd = {0};
    uint32_t t[4] = {1, 2, 3, 4};
    cr_assert(eq(int, kvr_wire_encode_generate(&b, "padded", t, 4, 10, NULL), KVR_OK));
    size_t pad = want - b.len - 3; /* field 15, length-delimited: a tag and a 2-byte length */
    cr_assert(eq(int, kvr_buf_reserve(&b, want), KVR_OK));
    b.data[b.len++] = 0x7a;
    b.data[b.len++] = (uint8_t)(0x80 | (pad & 0x7f));
    b.data[b.len++] = (uint8_t)(pad >> 7);
    memset(b.data + b.len, 'p', pad);
    b.len += pad;
    cr_assert(eq(sz, b.len, want));
    char *rid = repeat('r', KVR_ROUTER_ID_MAX);
    cr_assert(eq(int,
                 kvr_wire_encode_worker_generate(&fwd, b.data, b.len, UINT64_MAX, UINT32_MAX, rid,
                                                 UINT32_MAX),
                 KVR_OK));
    cr_assert(le(sz, fwd.len, cap), "a forward of %zu bytes over the worker's cap %zu", fwd.len,
              cap);
    cr_assert(eq(int, dec_worker_generate(fwd.data, fwd.len), KVR_OK));
    free(rid);
    kvr_buf_free(&fwd);
    kvr_buf_free(&b);
}

Test(codec, every_decoder_refuses_malformed_bytes)
{
    static const struct {
        const char *what;
        const uint8_t *bytes;
        size_t len;
    } bad[] = {
        {"an unterminated varint", (const uint8_t *)"\xff\xff", 2},
        {"a length past the end",
         (const uint8_t *)"\x0a\x05"
                          "ab",
         4},
        {"a group (not proto3)", (const uint8_t *)"\x0b\x0c", 2},
        {"a 64-bit field cut short", (const uint8_t *)"\x09\x01\x02", 3},
    };
    size_t n;
    const struct decoder *d = decoders(&n);
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        for (size_t i = 0; i < n; i++)
            cr_assert(eq(int, d[i].fn(bad[k].bytes, bad[k].len), KVR_ERR_MALFORMED), "%s: %s",
                      d[i].name, bad[k].what);
    /* a count on the wire stops at broken framing inside a submessage too */
    cr_assert(eq(int, dec_kv("\x1a\x02\x1a\x05", 4), KVR_ERR_MALFORMED));
}

Test(codec, a_message_without_what_says_what_it_is_is_malformed)
{
    /* KvEvent{worker_id 7} without an event; Gossip{router_id "r1"} without a body;
     * WorkerGenerate{request_key 42} and SelectRequest{book} without a request */
    cr_assert(eq(int, dec_kv("\x08\x07", 2), KVR_ERR_MALFORMED));
    cr_assert(eq(int, dec_gossip("\x0a\x02r1", 4), KVR_ERR_MALFORMED));
    cr_assert(eq(int, dec_worker_generate("\x10\x2a", 2), KVR_ERR_MALFORMED));
    cr_assert(eq(int, dec_select("\x10\x01", 2), KVR_ERR_MALFORMED));
    /* an empty buffer is an empty message: not a request, but a valid (all-zero) done event */
    cr_assert(eq(int, dec_generate("", 0), KVR_ERR_EMPTY_PROMPT));
    cr_assert(eq(int, dec_done("", 0), KVR_OK));
}

Test(codec, over_long_strings_are_too_large)
{
    struct kvr_buf b = {0}, req = {0};
    char *id = repeat('i', KVR_REQUEST_ID_MAX + 1), *rid = repeat('r', KVR_ROUTER_ID_MAX + 1);
    char *reply = repeat('s', KVR_REPLY_MAX + 1), *text = repeat('e', KVR_ERROR_TEXT_MAX + 1);
    /* a response's request id, and its error text (appended: a later field wins) */
    cr_assert(eq(int,
                 kvr_wire_encode_chunk(
                     &b, &(struct kvr_wire_chunk){.request_id = id, .final = true, .worker_id = 1}),
                 KVR_OK));
    cr_assert(eq(int, dec_response(b.data, b.len), KVR_ERR_TOO_LARGE));
    cr_assert(
        eq(int,
           kvr_wire_encode_chunk(
               &b, &(struct kvr_wire_chunk){.request_id = "x", .final = true, .worker_id = 1}),
           KVR_OK));
    put_len(&b, 6, text, KVR_ERROR_TEXT_MAX);
    cr_assert(eq(int, dec_response(b.data, b.len), KVR_OK), "at its cap");
    put_len(&b, 6, text, KVR_ERROR_TEXT_MAX + 1);
    cr_assert(eq(int, dec_response(b.data, b.len), KVR_ERR_TOO_LARGE));
    /* the router id of a forward, of a gossip, of a sync request */
    uint32_t t[2] = {1, 2};
    cr_assert(eq(int, kvr_wire_encode_generate(&req, "q", t, 2, 5, NULL), KVR_OK));
    cr_assert(
        eq(int, kvr_wire_encode_worker_generate(&b, req.data, req.len, 9, 0, rid, 0), KVR_OK));
    cr_assert(eq(int, dec_worker_generate(b.data, b.len), KVR_ERR_TOO_LARGE));
    cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, rid, 1, 1, true), KVR_OK));
    cr_assert(eq(int, dec_gossip(b.data, b.len), KVR_ERR_TOO_LARGE));
    rid[KVR_ROUTER_ID_MAX] = 0;
    cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, rid, 1, 1, true), KVR_OK));
    cr_assert(eq(int, dec_gossip(b.data, b.len), KVR_OK), "at its cap");
    rid[KVR_ROUTER_ID_MAX] = 'r';
    struct kvr_wire_sync s = {.router_id = rid};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &s), KVR_OK));
    cr_assert(eq(int, dec_sync(b.data, b.len), KVR_ERR_TOO_LARGE));
    /* a decision's reply, request id and origin, in a gossip and in a page */
    uint64_t h[1] = {11};
    struct kvr_request_record rec = {77, 5, h, 1, 64, 1, false, 0, 0};
    const char *strs[3][3] = {{reply, "q", "r1"}, {"_INBOX.a", id, "r1"}, {"_INBOX.a", "q", rid}};
    struct kvr_page p;
    kvr_page_init(&p);
    for (int k = 0; k < 3; k++) {
        cr_assert(eq(int,
                     kvr_wire_encode_gossip_decision(&b, "r1", 1, 1, &rec, strs[k][0], strs[k][1],
                                                     strs[k][2], 0, 0),
                     KVR_OK));
        cr_assert(eq(int, dec_gossip(b.data, b.len), KVR_ERR_TOO_LARGE), "string %d", k);
        cr_assert(eq(int, kvr_page_add_decision(&p, &rec, "ok", "ok", "ok", 0, 0), KVR_OK));
        cr_assert(eq(int, kvr_page_add_decision(&p, &rec, strs[k][0], strs[k][1], strs[k][2], 0, 0),
                     KVR_OK));
        cr_assert(eq(int, kvr_page_encode(&p, &b, true, 1), KVR_OK));
        cr_assert(eq(int, dec_page(b.data, b.len), KVR_ERR_TOO_LARGE), "string %d", k);
    }
    kvr_page_free(&p);
    free(id);
    free(rid);
    free(reply);
    free(text);
    kvr_buf_free(&req);
    kvr_buf_free(&b);
}

/* Encode n items of a repeated field into b with encoder k. */
static void encode_items(struct kvr_buf *b, int k, uint32_t n)
{
    uint64_t *ids = calloc(n, sizeof *ids);
    struct kvr_kv_block *blocks = calloc(n, sizeof *blocks);
    uint32_t *toks = calloc(n, sizeof *toks);
    cr_assert(ids && blocks && toks);
    for (uint32_t i = 0; i < n; i++) {
        ids[i] = i + 1;
        blocks[i] = (struct kvr_kv_block){i + 1, i + 2};
    }
    struct kvr_wire_heartbeat hb = {
        .info = {.id = 7, .block_size = 64}, .inflight = ids, .ninflight = n, .interval_ms = 1000};
    struct kvr_wire_sync s = {"r1", false, ids, n, 0, 0, 1, 2};
    struct kvr_request_record rec = {77, 5, ids, n, 64 * n, 0, false, 0, 0};
    b->len = 0;
    switch (k) {
    case 0:
        cr_assert(eq(int, kvr_wire_encode_stored(b, 7, 1, NULL, blocks, n), KVR_OK));
        break;
    case 1:
        cr_assert(eq(int, kvr_wire_encode_removed(b, 7, 1, ids, n), KVR_OK));
        break;
    case 2:
        cr_assert(eq(int, kvr_wire_encode_heartbeat(b, &hb), KVR_OK));
        break;
    case 3:
        cr_assert(eq(int,
                     kvr_wire_encode_chunk(b, &(struct kvr_wire_chunk){.request_id = "x",
                                                                       .tokens = toks,
                                                                       .ntokens = n,
                                                                       .worker_id = 7}),
                     KVR_OK));
        break;
    case 4: /* a SelectResponse of n empty candidates, by hand */
        for (uint32_t i = 0; i < n; i++)
            put_len(b, 4, "", 0);
        break;
    case 5:
        cr_assert(eq(int, kvr_wire_encode_gossip_decision(b, "r1", 1, 1, &rec, "", "q", "r1", 0, 0),
                     KVR_OK));
        break;
    case 6:
        cr_assert(eq(int, kvr_wire_encode_sync(b, &s), KVR_OK));
        break;
    }
    free(ids);
    free(blocks);
    free(toks);
}

Test(codec, over_many_items_are_too_large)
{
    static const struct {
        const char *what;
        kvr_status (*fn)(const void *buf, size_t len);
        uint32_t max;
    } items[] = {
        {"stored blocks", dec_kv, KVR_WIRE_STORED_BLOCKS_MAX},
        {"removed ids", dec_kv, KVR_WIRE_REMOVED_IDS_MAX},
        {"heartbeat keys", dec_heartbeat, KVR_WIRE_INFLIGHT_MAX},
        {"response tokens", dec_response, KVR_WIRE_RESPONSE_TOKENS_MAX},
        {"candidates", dec_select_response, KVR_WIRE_CANDIDATES_MAX},
        {"decision hashes", dec_gossip, KVR_WIRE_DECISION_BLOCKS_MAX},
        {"sync keys", dec_sync, KVR_WIRE_SYNC_KEYS_MAX},
    };
    struct kvr_buf b = {0};
    for (int k = 0; k < (int)(sizeof items / sizeof items[0]); k++) {
        encode_items(&b, k, items[k].max);
        cr_assert(eq(int, items[k].fn(b.data, b.len), KVR_OK), "%s at the cap", items[k].what);
        encode_items(&b, k, items[k].max + 1);
        cr_assert(eq(int, items[k].fn(b.data, b.len), KVR_ERR_TOO_LARGE), "%s", items[k].what);
    }
    /* a page of too many decisions, and of too many entries */
    struct kvr_page p;
    kvr_page_init(&p);
    uint64_t h[1] = {11};
    for (uint32_t i = 0; i <= KVR_WIRE_PAGE_ITEMS_MAX; i++) {
        struct kvr_request_record rec = {i + 1, 5, h, 1, 64, 0, false, 0, 0};
        cr_assert(eq(int, kvr_page_add_decision(&p, &rec, "", "", "", 0, 0), KVR_OK));
    }
    cr_assert(eq(int, kvr_page_encode(&p, &b, true, 1), KVR_OK));
    cr_assert(eq(int, dec_page(b.data, b.len), KVR_ERR_TOO_LARGE));
    for (uint32_t i = 0; i < KVR_WIRE_PAGE_ITEMS_MAX; i++) {
        struct kvr_index_record e = {5, i, true, i, 0};
        cr_assert(eq(int, kvr_page_add_entry(&p, &e), KVR_OK));
    }
    cr_assert(eq(int, kvr_page_encode(&p, &b, true, 1), KVR_OK));
    cr_assert(eq(int, dec_page(b.data, b.len), KVR_OK), "entries at the cap");
    cr_assert(eq(u32, page_calls, KVR_WIRE_PAGE_ITEMS_MAX));
    for (uint32_t i = 0; i <= KVR_WIRE_PAGE_ITEMS_MAX; i++) {
        struct kvr_index_record e = {5, i, true, i, 0};
        cr_assert(eq(int, kvr_page_add_entry(&p, &e), KVR_OK));
    }
    cr_assert(eq(int, kvr_page_encode(&p, &b, true, 1), KVR_OK));
    cr_assert(eq(int, dec_page(b.data, b.len), KVR_ERR_TOO_LARGE));
    kvr_page_free(&p);
    kvr_buf_free(&b);
}

Test(codec, values_out_of_range_are_invalid)
{
    struct kvr_buf b = {0}, req = {0};
    uint32_t t[2] = {1, 2};
    /* a forward without a request key */
    cr_assert(eq(int, kvr_wire_encode_generate(&req, "q", t, 2, 5, NULL), KVR_OK));
    cr_assert(
        eq(int, kvr_wire_encode_worker_generate(&b, req.data, req.len, 0, 0, "r1", 0), KVR_OK));
    cr_assert(eq(int, dec_worker_generate(b.data, b.len), KVR_ERR_INVALID));
    struct kvr_wire_request r;
    uint64_t key = 1;
    uint32_t overlap = 1;
    cr_assert(eq(int, kvr_wire_decode_worker_generate(b.data, b.len, &lim, &r, &key, &overlap),
                 KVR_ERR_INVALID));
    cr_assert(eq(str, r.request_id, "q"), "the id names the error");
    cr_assert(r.tokens == NULL && r.ntokens == 0 && r.max_tokens == 0, "the rest is zeroed");
    cr_assert(eq(u64, key, 0));
    kvr_wire_request_free(&r);
    /* TokensEvent{kind 5}: not a kind */
    cr_assert(eq(int, dec_tokens("\x08\x07\x10\x01\x18\x05", 6), KVR_ERR_INVALID));
    cr_assert(eq(int, dec_tokens("\x08\x07\x10\x01\x18\x01", 6), KVR_OK));
    /* a heartbeat without a block size */
    struct kvr_wire_heartbeat h = {.info = {.id = 7, .block_size = 0}, .interval_ms = 1000};
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &h), KVR_OK));
    cr_assert(eq(int, dec_heartbeat(b.data, b.len), KVR_ERR_INVALID));
    /* pages with one bad record are refused whole: a decision naming no worker, an entry naming
     * no worker, an entry whose TTL overflows in nanoseconds */
    uint64_t hs[2] = {1, 2};
    struct kvr_request_record good = {77, 5, hs, 2, 128, 1, false, 0, 0}, bad = good;
    bad.worker_id = 0;
    struct kvr_index_record e = {5, 1, true, 9, 0}, noworker = {0, 1, true, 9, 0};
    struct kvr_page p;
    kvr_page_init(&p);
    kvr_page_add_decision(&p, &good, "", "q", "r1", 0, 0);
    kvr_page_add_decision(&p, &bad, "", "q", "r1", 0, 0);
    kvr_page_add_entry(&p, &e);
    cr_assert(eq(int, kvr_page_encode(&p, &b, true, 3), KVR_OK));
    cr_assert(eq(int, dec_page(b.data, b.len), KVR_ERR_INVALID));
    kvr_page_add_decision(&p, &good, "", "q", "r1", 0, 0);
    kvr_page_add_entry(&p, &e);
    kvr_page_add_entry(&p, &noworker);
    cr_assert(eq(int, kvr_page_encode(&p, &b, true, 3), KVR_OK));
    cr_assert(eq(int, dec_page(b.data, b.len), KVR_ERR_INVALID));
    kvr_page_add_entry(&p, &e);
    cr_assert(eq(int, kvr_page_encode(&p, &b, true, 3), KVR_OK));
    struct kvr_buf x = {0};
    put_varint(&x, 0x08); /* IndexEntry{worker_id 5, ttl_left_ms UINT64_MAX} */
    put_varint(&x, 5);
    put_varint(&x, 0x28);
    put_varint(&x, UINT64_MAX);
    put_len(&b, 2, x.data, x.len);
    cr_assert(eq(int, dec_page(b.data, b.len), KVR_ERR_INVALID));
    b.len -= x.len + 2;
    cr_assert(eq(int, dec_page(b.data, b.len), KVR_OK));
    cr_assert(eq(u32, page_calls, 1));
    kvr_page_free(&p);
    kvr_buf_free(&x);
    kvr_buf_free(&req);
    kvr_buf_free(&b);
}

Test(codec, select_response_round_trip)
{
    struct kvr_buf b = {0};
    uint64_t wids[3] = {4, 5, 6};
    double costs[3] = {1.5, 0.5, 2.5};
    struct kvr_decision d = {.worker_id = 5,
                             .policy = KVR_POLICY_KV,
                             .overlap_blocks = 3,
                             .cost = 0.5,
                             .ncandidates = 3,
                             .worker_ids = wids,
                             .costs = costs};
    cr_assert(eq(int, kvr_wire_encode_select_response(&b, &d, 99, KVR_OK, "r1", NULL), KVR_OK));
    uint64_t wid = 0, key = 0;
    uint32_t overlap = 0, n = 0, err = 1;
    cr_assert(eq(int,
                 kvr_wire_decode_select_response(b.data, b.len, &wid, &overlap, &n, &err, &key),
                 KVR_OK));
    cr_assert(eq(u64, wid, 5));
    cr_assert(eq(u32, overlap, 3));
    cr_assert(eq(u32, n, 3));
    cr_assert(eq(u32, err, 0));
    cr_assert(eq(u64, key, 99));
    cr_assert(eq(int, kvr_wire_encode_select_response(&b, NULL, 0, KVR_ERR_NO_WORKERS, "r1", NULL),
                 KVR_OK));
    cr_assert(eq(int,
                 kvr_wire_decode_select_response(b.data, b.len, &wid, &overlap, &n, &err, &key),
                 KVR_OK));
    cr_assert(eq(u32, err, KVR_ERR_NO_WORKERS));
    cr_assert(eq(u32, n, 0));
    kvr_buf_free(&b);
}

/* The answer to a select over 20,000 workers (each with its full view, as --explain gives) fits
 * NATS's default 1 MB payload: the chosen worker, then the cheapest, and how many were weighed;
 * without costs (a pruned decision), the chosen one and the first in registry order. */
Test(codec, a_select_answer_over_a_large_fleet_fits_one_message)
{
    enum { N = 20000 };
    uint64_t *wids = malloc(N * sizeof *wids);
    double *costs = malloc(N * sizeof *costs);
    struct kvr_candidate *full = calloc(N, sizeof *full);
    for (uint32_t i = 0; i < N; i++) {
        wids[i] = UINT64_MAX - i;
        costs[i] = (double)((i * 7919u) % N) + 0.25; /* a permutation of 0.25 .. N - 0.75 */
        full[i] = (struct kvr_candidate){.overlap_blocks = UINT32_MAX,
                                         .prefill_tokens = UINT64_MAX,
                                         .decode_blocks = UINT64_MAX,
                                         .inflight = UINT32_MAX,
                                         .busy = true,
                                         .too_small = i % 3 == 0};
    }
    struct kvr_decision d = {.worker_id = wids[N - 1],
                             .ncandidates = N,
                             .worker_ids = wids,
                             .costs = costs,
                             .candidates = full};
    struct kvr_buf b = {0};
    for (int pass = 0; pass < 2; pass++) {
        cr_assert(eq(int, kvr_wire_encode_select_response(&b, &d, 99, KVR_OK, "r1", NULL), KVR_OK));
        cr_assert(le(sz, b.len, (size_t)1 << 20), "%zu bytes", b.len);
        Kvrouter__V1__SelectResponse *m =
            kvrouter__v1__select_response__unpack(NULL, b.len, b.data);
        cr_assert(ne(ptr, m, NULL));
        cr_assert(eq(u32, m->weighed, N));
        cr_assert(eq(sz, m->n_candidates, KVR_WIRE_CANDIDATES_LISTED));
        cr_assert(eq(u64, m->candidates[0]->worker_id, wids[N - 1]), "the chosen worker first");
        for (uint32_t j = 0; j < m->n_candidates; j++) { /* each says why it was skipped */
            uint64_t i = UINT64_MAX - m->candidates[j]->worker_id;
            cr_assert(m->candidates[j]->busy);
            cr_assert(eq(int, m->candidates[j]->too_small, i % 3 == 0), "worker index %" PRIu64, i);
        }
        for (uint32_t j = 1; j < m->n_candidates; j++) {
            uint64_t want = d.costs ? 0 : wids[j - 1]; /* registry order */
            if (d.costs && j >= 2)
                cr_assert(lt(dbl, m->candidates[j - 1]->cost, m->candidates[j]->cost));
            else if (!d.costs)
                cr_assert(eq(u64, m->candidates[j]->worker_id, want));
        }
        if (d.costs) /* the cheapest: 0.25, 1.25, ... but for the chosen worker's */
            cr_assert(lt(dbl, m->candidates[m->n_candidates - 1]->cost,
                         (double)KVR_WIRE_CANDIDATES_LISTED + 0.5));
        kvrouter__v1__select_response__free_unpacked(m, NULL);
        d.costs = NULL;
    }
    free(wids);
    free(costs);
    free(full);
    kvr_buf_free(&b);
}

/*
 * Fail each allocation a decoder makes in turn (protobuf-c's and the decoder's own): each time the
 * status is KVR_ERR_NOMEM, never KVR_ERR_MALFORMED, and nothing leaks (valgrind); once the failure
 * comes after the last allocation, the decode succeeds.
 */
static void fail_each_allocation(const char *name, kvr_status (*fn)(const void *, size_t),
                                 const struct kvr_buf *b)
{
    long k = 0;
    for (;; k++) {
        cr_assert(lt(long, k, 100000), "%s: never succeeded", name);
        kvr_wire_fail_alloc(k);
        kvr_status st = fn(b->data, b->len);
        long left = kvr_wire_fail_alloc(-1);
        if (left >= 0) { /* the failure never came: every allocation succeeded */
            cr_assert(eq(int, st, KVR_OK), "%s", name);
            break;
        }
        cr_assert(eq(int, st, KVR_ERR_NOMEM), "%s: allocation %ld failed", name, k);
    }
    cr_assert(ge(long, k, 1), "%s: allocates (so each allocation was made to fail)", name);
}

Test(codec, allocation_failure_is_nomem_never_malformed)
{
    struct kvr_buf b = {0}, req = {0};
    uint32_t t[3] = {1, 2, 3};
    struct kvr_overrides ov = {KVR_OV_POLICY, KVR_POLICY_CHWBL, 0, 0};
    cr_assert(eq(int, kvr_wire_encode_generate(&req, "req", t, 3, 5, &ov), KVR_OK));
    fail_each_allocation("generate", dec_generate, &req);
    kvr_wire_encode_worker_generate(&b, req.data, req.len, 42, 1, "r1", 0);
    fail_each_allocation("worker_generate", dec_worker_generate, &b);
    kvr_wire_encode_select_request(&b, req.data, req.len, true);
    fail_each_allocation("select", dec_select, &b);
    kvr_wire_encode_chunk(&b, &(struct kvr_wire_chunk){.request_id = "req",
                                                       .tokens = t,
                                                       .ntokens = 3,
                                                       .final = true,
                                                       .error = KVR_ERR_WORKER_LOST,
                                                       .worker_id = 7});
    fail_each_allocation("response", dec_response, &b);
    uint64_t wids[2] = {4, 5};
    double costs[2] = {1, 2};
    struct kvr_decision d = {.worker_id = 5, .ncandidates = 2, .worker_ids = wids, .costs = costs};
    kvr_wire_encode_select_response(&b, &d, 9, KVR_OK, "r1", NULL);
    fail_each_allocation("select_response", dec_select_response, &b);
    encode_items(&b, 0, 3);
    fail_each_allocation("stored", dec_kv, &b);
    encode_items(&b, 1, 3);
    fail_each_allocation("removed", dec_kv, &b);
    encode_items(&b, 2, 3);
    fail_each_allocation("heartbeat", dec_heartbeat, &b);
    encode_items(&b, 5, 3);
    fail_each_allocation("gossip", dec_gossip, &b);
    encode_items(&b, 6, 3);
    fail_each_allocation("sync", dec_sync, &b);
    struct kvr_page p;
    kvr_page_init(&p);
    uint64_t h[2] = {1, 2};
    struct kvr_request_record rec = {77, 5, h, 2, 128, 1, false, 0, 0};
    struct kvr_index_record e = {5, 1, true, 9, 0};
    kvr_page_add_decision(&p, &rec, "_INBOX.a", "q", "r1", 0, 0);
    kvr_page_add_entry(&p, &e);
    kvr_page_encode(&p, &b, true, 3);
    fail_each_allocation("page", dec_page, &b);
    kvr_page_free(&p);
    /* the small events allocate once, in protobuf-c */
    kvr_wire_encode_done(&b, 7, 9, 0, 0);
    kvr_wire_fail_alloc(0);
    cr_assert(eq(int, dec_done(b.data, b.len), KVR_ERR_NOMEM));
    kvr_wire_encode_tokens(&b, 7, 9, KVR_WIRE_OUTPUT_BLOCK);
    kvr_wire_fail_alloc(0);
    cr_assert(eq(int, dec_tokens(b.data, b.len), KVR_ERR_NOMEM));
    cr_assert(eq(long, kvr_wire_fail_alloc(-1), -1));
    kvr_buf_free(&req);
    kvr_buf_free(&b);
}

/* The proto's ErrorCode and kvr_status are one list: every status has the enum value of the same
 * number and name (KVR_ERR_X is ERR_X, KVR_OK is OK), and the enum has nothing else. */
Test(codec, error_codes_match_the_proto)
{
    const ProtobufCEnumDescriptor *e = &kvrouter__v1__error_code__descriptor;
    unsigned statuses = 0;
#define CHECK_CODE(N, V, T)                                                                        \
    do {                                                                                           \
        const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(e, V);                  \
        cr_assert(v != NULL, "status %s (%d) is missing from ErrorCode", #N, V);                   \
        const char *want = strcmp(#N, "KVR_OK") ? #N + 4 : "OK";                                   \
        cr_assert(eq(str, (char *)v->name, (char *)want));                                         \
        statuses++;                                                                                \
    } while (0);
    KVR_STATUS_LIST(CHECK_CODE)
#undef CHECK_CODE
    cr_assert(eq(u32, e->n_values, statuses), "ErrorCode has values kvr_status does not");
}

Test(codec, a_chunk_carries_an_engines_text_and_finish_reason)
{
    struct kvr_buf b = {0};
    uint32_t t[2] = {5, 6};
    struct kvr_wire_chunk c = {.request_id = "x",
                               .tokens = t,
                               .ntokens = 2,
                               .final = true,
                               .text = "ab\xc3\xa9",
                               .ntext = 4,
                               .finish_reason = "stop"};
    cr_assert(eq(int, kvr_wire_encode_chunk(&b, &c), KVR_OK));
    struct kvr_wire_response r;
    cr_assert(eq(int, kvr_wire_decode_response(b.data, b.len, &r), KVR_OK));
    cr_assert(eq(u32, r.ntext, 4));
    cr_assert(eq(str, r.text, "ab\xc3\xa9"));
    cr_assert(eq(str, r.finish_reason, "stop"));
    kvr_wire_response_free(&r);
    c.finish_reason = NULL; /* the simulated worker's: from the outcome */
    c.ntext = 0;
    cr_assert(eq(int, kvr_wire_encode_chunk(&b, &c), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_response(b.data, b.len, &r), KVR_OK));
    cr_assert(eq(str, r.finish_reason, "length"));
    cr_assert(eq(u32, r.ntext, 0));
    kvr_wire_response_free(&r);
    c.ntext = KVR_WIRE_TEXT_MAX + 1;
    cr_assert(eq(int, kvr_wire_encode_chunk(&b, &c), KVR_ERR_TOO_LARGE));
    kvr_buf_free(&b);
}

/* The fast path and protobuf-c give the same answer: status, id, tokens, figures. */
static void same_as_protobuf(const uint8_t *buf, size_t len, const struct kvr_wire_limits *l)
{
    struct kvr_wire_request a, b;
    kvr_status sa = kvr_wire_decode_generate(buf, len, l, &a);
    kvr_status sb = kvr_wire_decode_generate_pb(buf, len, l, &b);
    cr_assert(eq(int, sa, sb), "len %zu", len);
    cr_assert(eq(int, !a.request_id, !b.request_id));
    if (a.request_id)
        cr_assert(eq(str, a.request_id, b.request_id));
    cr_assert(eq(u32, a.ntokens, b.ntokens));
    if (a.ntokens)
        cr_assert(eq(int, memcmp(a.tokens, b.tokens, a.ntokens * sizeof *a.tokens), 0));
    cr_assert(eq(u32, a.max_tokens, b.max_tokens));
    cr_assert(eq(u32, a.deadline_ms, b.deadline_ms));
    cr_assert(eq(u64, a.got, b.got));
    cr_assert(eq(u64, a.limit, b.limit));
    cr_assert(eq(int, memcmp(&a.ov, &b.ov, sizeof a.ov), 0));
    kvr_wire_request_free(&a);
    kvr_wire_request_free(&b);
}

Test(codec, generate_fast_path_answers_as_protobuf_does)
{
    struct kvr_wire_limits small = {64, 100};
    struct kvr_buf b = {0};
    struct kvr_rng rng;
    kvr_rng_seed(&rng, 11);
    uint32_t t[80];
    for (int round = 0; round < 4000; round++) {
        uint32_t n = (uint32_t)kvr_rng_below(&rng, 80);
        for (uint32_t i = 0; i < n; i++) /* 1 to 5 bytes each */
            t[i] = (uint32_t)(kvr_rng_next(&rng) >> kvr_rng_below(&rng, 64));
        char id[300];
        size_t idlen =
            kvr_rng_below(&rng, 4) ? kvr_rng_below(&rng, 8) : 250 + kvr_rng_below(&rng, 20);
        for (size_t i = 0; i < idlen; i++)
            id[i] = (char)(kvr_rng_below(&rng, 20) ? 'a' + kvr_rng_below(&rng, 26)
                                                   : 1 + kvr_rng_below(&rng, 255));
        id[idlen] = 0;
        uint32_t max = (uint32_t)kvr_rng_below(&rng, 120);
        struct kvr_overrides ov = {KVR_OV_POLICY, KVR_POLICY_CHWBL, 0, 0};
        cr_assert(eq(
            int, kvr_wire_encode_generate(&b, id, t, n, max, kvr_rng_below(&rng, 8) ? NULL : &ov),
            KVR_OK));
        same_as_protobuf(b.data, b.len, &small);
        /* mutated: bytes changed, cut short, a field appended twice */
        uint8_t m[1024];
        size_t len = b.len < sizeof m ? b.len : sizeof m;
        memcpy(m, b.data, len);
        for (int k = (int)kvr_rng_below(&rng, 4); k > 0 && len; k--)
            m[kvr_rng_below(&rng, len)] = (uint8_t)kvr_rng_next(&rng);
        same_as_protobuf(m, len, &small);
        same_as_protobuf(m, kvr_rng_below(&rng, len + 1), &small);
        if (len + 2 <= sizeof m) {
            m[len] = (uint8_t)(kvr_rng_below(&rng, 6) << 3 | kvr_rng_below(&rng, 3));
            m[len + 1] = (uint8_t)kvr_rng_below(&rng, 3);
            same_as_protobuf(m, len + 2, &small);
        }
    }
    kvr_buf_free(&b);
}

/* m packed into b (replacing its contents). */
static void pack_into(struct kvr_buf *b, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    cr_assert(eq(int, kvr_buf_reserve(b, n + 1), KVR_OK));
    b->len = protobuf_c_message_pack(m, b->data);
}

/* b with a copy of data[0..len) appended. */
static void append_to(struct kvr_buf *b, const void *data, size_t len)
{
    cr_assert(eq(int, kvr_buf_reserve(b, b->len + len), KVR_OK));
    memcpy(b->data + b->len, data, len);
    b->len += len;
}

/* A batch of n events of worker 7 alternating prefill, output block and done of keys from 100. */
static void batch_of(struct kvr_wire_event *ev, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        memset(&ev[i], 0, sizeof ev[i]);
        if (i % 3 == 2) {
            ev[i].kind = KVR_WIRE_EV_DONE;
            ev[i].u.done = (struct kvr_wire_done){7, 100 + i, i % 2 ? KVR_ERR_CANCELLED : 0, i};
        } else {
            ev[i].kind = KVR_WIRE_EV_TOKENS;
            ev[i].u.tokens = (struct kvr_wire_tokens){
                7, 100 + i, i % 3 ? KVR_WIRE_OUTPUT_BLOCK : KVR_WIRE_PREFILL_DONE};
        }
    }
}

Test(codec, an_event_batch_keeps_its_events_in_order_and_refuses_what_no_worker_sends)
{
    static struct kvr_wire_event ev[KVR_WIRE_BATCH_MAX + 1];
    struct kvr_buf b = {0};
    struct kvr_wire_batch out;
    batch_of(ev, KVR_WIRE_BATCH_MAX + 1);
    /* the largest batch fits its byte cap, and comes back event for event */
    cr_assert(eq(int, kvr_wire_encode_batch(&b, 7, ev, KVR_WIRE_BATCH_MAX), KVR_OK));
    cr_assert(le(sz, b.len, KVR_WIRE_BATCH_BYTES_MAX));
    cr_assert(eq(int, kvr_wire_decode_batch(b.data, b.len, &out), KVR_OK));
    cr_assert(eq(u64, out.worker_id, 7));
    cr_assert(eq(u32, out.n, KVR_WIRE_BATCH_MAX));
    for (uint32_t i = 0; i < out.n; i++) {
        cr_assert(eq(int, out.ev[i].kind, ev[i].kind), "event %u", i);
        if (ev[i].kind == KVR_WIRE_EV_DONE) {
            cr_assert(eq(u64, out.ev[i].u.done.key, ev[i].u.done.key));
            cr_assert(eq(u32, out.ev[i].u.done.status, ev[i].u.done.status));
            cr_assert(eq(u32, out.ev[i].u.done.output_tokens, i));
        } else {
            cr_assert(eq(u64, out.ev[i].u.tokens.key, ev[i].u.tokens.key));
            cr_assert(eq(int, out.ev[i].u.tokens.kind, ev[i].u.tokens.kind));
        }
    }
    kvr_wire_batch_free(&out);
    cr_assert(out.ev == NULL && out.n == 0);
    /* the encoder takes 1 to KVR_WIRE_BATCH_MAX events */
    cr_assert(eq(int, kvr_wire_encode_batch(&b, 7, ev, 0), KVR_ERR_INVALID));
    cr_assert(eq(int, kvr_wire_encode_batch(&b, 7, ev, KVR_WIRE_BATCH_MAX + 1), KVR_ERR_INVALID));
    /* one event more than the cap, written by hand (two batches' events merge on the wire):
     * counted before protobuf-c allocates them */
    struct kvr_buf two = {0};
    cr_assert(eq(int, kvr_wire_encode_batch(&b, 7, ev, KVR_WIRE_BATCH_MAX / 2 + 1), KVR_OK));
    kvr_buf_set(&two, b.data, b.len);
    cr_assert(eq(int, kvr_wire_encode_batch(&b, 7, ev, KVR_WIRE_BATCH_MAX / 2), KVR_OK));
    append_to(&two, b.data, b.len);
    cr_assert(eq(int, dec_batch(two.data, two.len), KVR_ERR_TOO_LARGE));
    /* an event that names another worker than the batch's: the whole batch is refused */
    ev[1].u.tokens.worker_id = 8;
    cr_assert(eq(int, kvr_wire_encode_batch(&b, 7, ev, 3), KVR_OK)); /* the encoder writes 7 */
    Kvrouter__V1__TokensEvent t = KVROUTER__V1__TOKENS_EVENT__INIT;
    t.worker_id = 8;
    t.request_key = 5;
    Kvrouter__V1__LifecycleEvent le = KVROUTER__V1__LIFECYCLE_EVENT__INIT, *lp = &le;
    le.event_case = KVROUTER__V1__LIFECYCLE_EVENT__EVENT_TOKENS;
    le.tokens = &t;
    Kvrouter__V1__EventBatch m = KVROUTER__V1__EVENT_BATCH__INIT;
    m.worker_id = 7;
    m.n_events = 1;
    m.events = &lp;
    pack_into(&b, &m.base);
    cr_assert(eq(int, dec_batch(b.data, b.len), KVR_ERR_INVALID));
    /* an event of no kind */
    le.event_case = KVROUTER__V1__LIFECYCLE_EVENT__EVENT__NOT_SET;
    pack_into(&b, &m.base);
    cr_assert(eq(int, dec_batch(b.data, b.len), KVR_ERR_INVALID));
    /* a tokens event of an unknown kind */
    t.worker_id = 7;
    t.kind = 5;
    le.event_case = KVROUTER__V1__LIFECYCLE_EVENT__EVENT_TOKENS;
    pack_into(&b, &m.base);
    cr_assert(eq(int, dec_batch(b.data, b.len), KVR_ERR_INVALID));
    /* no event at all: a batch of none, harmless */
    m.n_events = 0;
    pack_into(&b, &m.base);
    cr_assert(eq(int, dec_batch(b.data, b.len), KVR_OK));
    /* each allocation failing is NOMEM, never a partial batch */
    cr_assert(eq(int, kvr_wire_encode_batch(&b, 7, ev + 2, 3), KVR_OK));
    fail_each_allocation("batch", dec_batch, &b);
    kvr_buf_free(&two);
    kvr_buf_free(&b);
}

/* The KvEvent fast path and protobuf-c give the same answer: status, kind, every field. */
static void kv_same_as_protobuf(const uint8_t *buf, size_t len)
{
    struct kvr_wire_kv a, b;
    kvr_status sa = kvr_wire_decode_kv(buf, len, &a);
    kvr_status sb = kvr_wire_decode_kv_pb(buf, len, &b);
    cr_assert(eq(int, sa, sb), "len %zu", len);
    cr_assert(eq(u64, a.worker_id, b.worker_id));
    cr_assert(eq(u64, a.event_seq, b.event_seq));
    cr_assert(eq(int, a.kind, b.kind));
    cr_assert(eq(int, a.has_parent, b.has_parent));
    cr_assert(eq(u64, a.parent, b.parent));
    cr_assert(eq(u32, a.nblocks, b.nblocks));
    for (uint32_t i = 0; i < a.nblocks; i++) {
        cr_assert(eq(u64, a.blocks[i].engine_id, b.blocks[i].engine_id), "block %u", i);
        cr_assert(eq(u64, a.blocks[i].local_hash, b.blocks[i].local_hash), "block %u", i);
    }
    cr_assert(eq(u32, a.nids, b.nids));
    if (a.nids)
        cr_assert(eq(int, memcmp(a.ids, b.ids, a.nids * sizeof *a.ids), 0));
    kvr_wire_kv_free(&a);
    kvr_wire_kv_free(&b);
}

/* A random value of 1 to 10 varint bytes. */
static uint64_t any_width(struct kvr_rng *rng)
{
    return kvr_rng_next(rng) >> kvr_rng_below(rng, 64);
}

Test(codec, kv_fast_path_answers_as_protobuf_does)
{
    struct kvr_buf b = {0};
    struct kvr_rng rng;
    kvr_rng_seed(&rng, 12);
    struct kvr_kv_block blk[70];
    uint64_t ids[8];
    for (int round = 0; round < 4000; round++) {
        uint32_t n = (uint32_t)kvr_rng_below(&rng, 70);
        for (uint32_t i = 0; i < n; i++)
            blk[i] = (struct kvr_kv_block){any_width(&rng), any_width(&rng)};
        uint64_t parent = any_width(&rng), wid = any_width(&rng), seq = any_width(&rng);
        int kind = (int)kvr_rng_below(&rng, 8);
        if (kind == 0) {
            for (int i = 0; i < 8; i++)
                ids[i] = any_width(&rng);
            cr_assert(eq(int, kvr_wire_encode_removed(&b, wid, seq, ids, 8), KVR_OK));
        } else if (kind == 1) {
            cr_assert(eq(int, kvr_wire_encode_cleared(&b, wid, seq), KVR_OK));
        } else {
            cr_assert(eq(int,
                         kvr_wire_encode_stored(&b, wid, seq, kind % 2 ? &parent : NULL, blk, n),
                         KVR_OK));
        }
        kv_same_as_protobuf(b.data, b.len);
        /* mutated: bytes changed, cut short, a field appended (another event, a field twice) */
        uint8_t m[2048];
        size_t len = b.len < sizeof m - 16 ? b.len : sizeof m - 16;
        memcpy(m, b.data, len);
        for (int k = (int)kvr_rng_below(&rng, 4); k > 0 && len; k--)
            m[kvr_rng_below(&rng, len)] = (uint8_t)kvr_rng_next(&rng);
        kv_same_as_protobuf(m, len);
        kv_same_as_protobuf(m, kvr_rng_below(&rng, len + 1));
        m[len] = (uint8_t)(kvr_rng_below(&rng, 7) << 3 | kvr_rng_below(&rng, 3));
        m[len + 1] = (uint8_t)kvr_rng_below(&rng, 3);
        kv_same_as_protobuf(m, len + 2);
    }
    /* bool widths and bit 64 and past: has_parent of 2 bytes, a 10-byte varint whose last byte
     * carries more than bit 63, an 11-byte varint */
    static const uint8_t odd[][16] = {
        {0x1a, 0x03, 0x08, 0x80, 0x01}, /* stored { has_parent of 2 bytes } */
        {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f},       /* worker_id */
        {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, /* 11 bytes */
        {0x1a, 0x0d, 0x1a, 0x0b, 0x10, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
         0x02}, /* stored { block { local_hash: bit 64 only } } */
        /* padded keys and lengths, which protobuf-c refuses past five bytes (the kv fuzz target:
         * a stored of length 0 in nine bytes) */
        {0x08, 0x29, 0x1a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00},
        {0x08, 0x29, 0x1a, 0x80, 0x80, 0x80, 0x80, 0x00},                   /* 5 bytes */
        {0x88, 0x80, 0x80, 0x80, 0x80, 0x00, 0x29, 0x1a, 0x00},             /* a 6-byte key */
        {0x1a, 0x05, 0x9a, 0x80, 0x80, 0x80, 0x00, 0x1a, 0x02, 0x08, 0x01}, /* block key */
    };
    static const size_t odd_len[] = {5, 11, 12, 15, 12, 8, 9, 11};
    for (size_t i = 0; i < sizeof odd_len / sizeof odd_len[0]; i++)
        kv_same_as_protobuf(odd[i], odd_len[i]);
    kvr_buf_free(&b);
}

/* --- refusals in the logs (reply.c) --------------------------------------------------------- */

static void no_reply(void *ctx)
{
    kvr_reply_error(ctx, NULL, NULL, "x", KVR_ERR_NO_REPLY);
}

/* A request without a reply subject is a warning: it was never written at --log-level warn (the
 * line was gated on info). And anyone may publish such requests: each was a line, without bound;
 * now at most KVR_REPLY_LOG_PER_S a second, the next saying how many were left out. */
Test(codec, refusals_are_logged_at_their_level_and_a_flood_in_few_lines)
{
    struct kvr_reply r;
    kvr_reply_init(&r, "generate", 0);
    rec_log_begin("test_codec", KVR_LOG_WARN);
    kvr_reply_error(&r, NULL, NULL, "a", KVR_ERR_NO_REPLY);
    const char *text = rec_log_end("test_codec");
    cr_assert(strstr(text, "level=warn") && strstr(text, "msg=request_dropped"),
              "a dropped request is a warning at --log-level warn: %s", text);

    kvr_reply_init(&r, "generate", 0);
    rec_log_flood(no_reply, &r, "test_codec", "msg=request_dropped");
    cr_assert(eq(u64, r.dropped, 1001));
    cr_assert(eq(u64, r.by_code[KVR_ERR_NO_REPLY], 1001));
    kvr_reply_free(&r);
}

/* A GenerateRequest{request_id id[0..n), token_ids [1, 2], max_tokens 4}, written by hand: the
 * library's encoder cannot write a NUL byte into a string. */
static void raw_generate(struct kvr_buf *b, const char *id, size_t n)
{
    b->len = 0;
    put_len(b, 1, id, n);
    put_len(b, 2, "\x01\x02", 2);
    put_varint(b, 3 << 3);
    put_varint(b, 4);
}

Test(codec, a_request_id_holding_a_nul_byte_is_invalid)
{
    struct kvr_buf g = {0}, w = {0};
    struct kvr_wire_request r;
    char why[128];
    raw_generate(&g, "a\0b", 3); /* protobuf-c reads "a": "a\0c" would be the same request */
    cr_assert(eq(int, kvr_wire_decode_generate(g.data, g.len, &lim, &r), KVR_ERR_INVALID));
    cr_assert(eq(str, (char *)kvr_wire_request_why(&r, KVR_ERR_INVALID, why, sizeof why),
                 "request_id holds a NUL byte"));
    cr_assert(eq(str, r.request_id, ""), "an empty id: \"a\" may be another request's");
    kvr_wire_request_free(&r);
    /* the same request nested in a select and in a forward */
    put_len(&w, 1, g.data, g.len);
    cr_assert(eq(int, dec_select(w.data, w.len), KVR_ERR_INVALID));
    put_varint(&w, 2 << 3); /* request_key 9 */
    put_varint(&w, 9);
    cr_assert(eq(int, dec_worker_generate(w.data, w.len), KVR_ERR_INVALID));
    /* without the NUL all three are served; a NUL elsewhere (a token 0) is no concern */
    raw_generate(&g,
                 "a\x01"
                 "b",
                 3);
    cr_assert(eq(int, dec_generate(g.data, g.len), KVR_OK));
    raw_generate(&g, "ab", 2);
    put_len(&g, 2, "\x00", 1);
    cr_assert(eq(int, dec_generate(g.data, g.len), KVR_OK));
    w.len = 0;
    put_len(&w, 1, g.data, g.len);
    cr_assert(eq(int, dec_select(w.data, w.len), KVR_OK));
    put_varint(&w, 2 << 3);
    put_varint(&w, 9);
    cr_assert(eq(int, dec_worker_generate(w.data, w.len), KVR_OK));
    /* a cancel naming its request or its reply subject with a NUL byte */
    struct kvr_wire_cancel c;
    for (int bad = 0; bad < 3; bad++) {
        w.len = 0;
        put_len(&w, 1, bad == 1 ? "a\0b" : "ab", 3 - (bad != 1));
        put_len(&w, 2, bad == 2 ? "_INBOX.x\0y" : "_INBOX.x", bad == 2 ? 10 : 8);
        cr_assert(
            eq(int, kvr_wire_decode_cancel(w.data, w.len, &c), bad ? KVR_ERR_INVALID : KVR_OK),
            "cancel %d", bad);
        kvr_wire_cancel_free(&c);
    }
    kvr_buf_free(&g);
    kvr_buf_free(&w);
}
