/* The wire codec: round trips, the forwarding wrapper, and refusal of bad input. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "kvr/rng.h"

static const struct kvr_wire_limits lim = {1000, 500};

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

Test(codec, forwarding_wraps_the_client_bytes_unchanged)
{
    struct kvr_buf req = {0}, fwd = {0};
    uint32_t t[300];
    for (int i = 0; i < 300; i++)
        t[i] = (uint32_t)i * 7;
    cr_assert(eq(int, kvr_wire_encode_generate(&req, "abc", t, 300, 9, NULL), KVR_OK));
    cr_assert(
        eq(int, kvr_wire_encode_worker_generate(&fwd, req.data, req.len, 42, 7, "r1"), KVR_OK));
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
    kvr_wire_request_free(&r);
    free(big);
    cr_assert(eq(int, kvr_wire_encode_generate(&b, "out", t, 2, 501, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_generate(b.data, b.len, &lim, &r), KVR_ERR_INVALID));
    kvr_wire_request_free(&r);
    char id[KVR_REQUEST_ID_MAX + 2];
    memset(id, 'x', sizeof id - 1);
    id[sizeof id - 1] = 0;
    cr_assert(eq(int, kvr_wire_encode_generate(&b, id, t, 2, 5, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_generate(b.data, b.len, &lim, &r), KVR_ERR_INVALID));
    kvr_wire_request_free(&r);
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
    cr_assert(eq(int, kvr_wire_encode_done(&b, 7, 124, 0), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_done(b.data, b.len, &dn), KVR_OK));
    cr_assert(eq(u64, dn.key, 124));
    uint64_t infl[3] = {1, 2, 3};
    struct kvr_wire_heartbeat
        h = {{.id = 7, .block_size = 64, .capacity_blocks = 16384, .waiting = 2, .kv_usage = 0.25},
             infl,
             3,
             1000,
             false},
        g;
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &h), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_heartbeat(b.data, b.len, &g), KVR_OK));
    cr_assert(eq(u64, g.info.id, 7));
    cr_assert(eq(u32, g.info.block_size, 64));
    cr_assert(eq(u64, g.info.capacity_blocks, 16384));
    cr_assert(eq(u32, g.ninflight, 3));
    cr_assert(eq(u64, g.inflight[2], 3));
    kvr_wire_heartbeat_free(&g);
    h.info.id = 0;
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &h), KVR_OK));
    cr_assert(eq(int, kvr_wire_decode_heartbeat(b.data, b.len, &g), KVR_ERR_INVALID));
    struct kvr_wire_response rs;
    cr_assert(eq(int,
                 kvr_wire_encode_response(&b, "x", infl == NULL ? NULL : (uint32_t[]){1, 2}, 2,
                                          true, KVR_ERR_WORKER_LOST, 7, 0),
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
    struct kvr_request_record rec = {77, 5, h, 3, 150, 2, true, 4};
    cr_assert(eq(int,
                 kvr_wire_encode_gossip_decision(&b, "r1", 9, 42, &rec, "_INBOX.x", "req-7", "r1"),
                 KVR_OK));
    struct kvr_wire_gossip g;
    cr_assert(eq(int, kvr_wire_decode_gossip(b.data, b.len, &g), KVR_OK));
    cr_assert(eq(str, g.router_id, "r1"));
    cr_assert(eq(u64, g.epoch, 9));
    cr_assert(eq(u64, g.seq, 42));
    cr_assert(eq(int, g.kind, KVR_WIRE_GOSSIP_DECISION));
    cr_assert(eq(u64, g.d.rec.request_id, 77));
    cr_assert(eq(u64, g.d.rec.worker_id, 5));
    cr_assert(eq(u32, g.d.rec.nblocks, 3));
    cr_assert(eq(u64, g.d.rec.block_hashes[2], 33));
    cr_assert(eq(u32, g.d.rec.prompt_tokens, 150));
    cr_assert(eq(u32, g.d.rec.overlap_blocks, 2));
    cr_assert(g.d.rec.prefill_done);
    cr_assert(eq(u32, g.d.rec.output_blocks, 4));
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

    /* a decision naming no worker, a cached prefix longer than the prompt, no sender: refused */
    rec.worker_id = 0;
    kvr_wire_encode_gossip_decision(&b, "r1", 9, 43, &rec, "", "", "r1");
    cr_assert(eq(int, kvr_wire_decode_gossip(b.data, b.len, &g), KVR_ERR_MALFORMED));
    rec.worker_id = 5;
    rec.overlap_blocks = 4;
    kvr_wire_encode_gossip_decision(&b, "r1", 9, 44, &rec, "", "", "r1");
    cr_assert(eq(int, kvr_wire_decode_gossip(b.data, b.len, &g), KVR_ERR_MALFORMED));
    kvr_wire_encode_gossip_hello(&b, "", 3, 8, true);
    cr_assert(eq(int, kvr_wire_decode_gossip(b.data, b.len, &g), KVR_ERR_MALFORMED));
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
    cr_assert(eq(int, kvr_wire_decode_sync(b.data, b.len, &t), KVR_ERR_MALFORMED));
    kvr_buf_free(&b);
}

struct page_seen {
    uint32_t decisions, entries;
    uint64_t hash_sum, ttl_sum;
    char last_origin[16];
};

static void seen_decision(void *ctx, const struct kvr_wire_decision *d)
{
    struct page_seen *s = ctx;
    s->decisions++;
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
        struct kvr_request_record rec = {i, 1 + i % 4, h, 4, 200, 1, false, 0};
        cr_assert(eq(int, kvr_page_add_decision(&p, &rec, "_INBOX.a", "id", i == 300 ? "rz" : "ra"),
                     KVR_OK));
    }
    for (uint32_t i = 1; i <= 1000; i++) {
        struct kvr_index_record e = {1 + i % 4, i, false, 0, 5000000ull};
        cr_assert(eq(int, kvr_page_add_entry(&p, &e), KVR_OK));
    }
    cr_assert(gt(sz, p.approx, 1000));
    cr_assert(eq(int, kvr_page_encode(&p, &b, true, 31), KVR_OK));
    cr_assert(eq(sz, p.approx, 0));
    struct page_seen seen = {0};
    bool last = false;
    uint64_t token = 0;
    cr_assert(eq(
        int, kvr_wire_decode_page(b.data, b.len, seen_decision, seen_entry, &seen, &last, &token),
        KVR_OK));
    cr_assert(last);
    cr_assert(eq(u64, token, 31));
    cr_assert(eq(u32, seen.decisions, 300));
    cr_assert(eq(u32, seen.entries, 1000));
    cr_assert(eq(u64, seen.hash_sum, expect));
    cr_assert(eq(u64, seen.ttl_sum, 1000 * 5000000ull));
    cr_assert(eq(str, seen.last_origin, "rz"));
    /* the emptied page encodes to an empty page */
    cr_assert(eq(int, kvr_page_encode(&p, &b, false, 32), KVR_OK));
    memset(&seen, 0, sizeof seen);
    cr_assert(eq(
        int, kvr_wire_decode_page(b.data, b.len, seen_decision, seen_entry, &seen, &last, &token),
        KVR_OK));
    cr_assert(not(last));
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
        bool last;
        uint64_t token;
        kvr_wire_decode_page(buf, n, seen_decision, seen_entry, &seen, &last, &token);
    }
}
