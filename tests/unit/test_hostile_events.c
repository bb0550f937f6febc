/*
 * Bad inputs on the worker event stream a router follows (kv.<ns>.ev.<id>.<kind>: kv, tokens,
 * done, hb), through kvr_events_on_message: subjects that name no worker canonically, payloads
 * that speak for another worker, do not decode or are over a cap (all counted as bad_events in
 * $SRV.STATS), events naming nothing known (counted where they are), events out of order, and
 * the forgeries a router cannot tell from its workers' own (still open: subject permissions).
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "fleet.h"
#include "kvr/hash.h"
#include "kvrouter.pb-c.h"
#include "pending.h"
#include "test_hostile_rig.h"

TestSuite(hostile_events, .init = hr_setup, .fini = hr_teardown, .timeout = 60);

/* A heartbeat of worker wid as bytes (block size bs, capacity 4096, interval 1000 ms). */
static void hb_bytes(struct kvr_buf *b, uint64_t wid, uint32_t bs)
{
    struct kvr_wire_heartbeat h = {.info = {.id = wid, .block_size = bs, .capacity_blocks = 4096},
                                   .interval_ms = 1000};
    cr_assert(eq(int, kvr_wire_encode_heartbeat(b, &h), KVR_OK));
}

static bool known(uint64_t wid)
{
    return kvr_router_worker_load(hr_rd.core, wid, NULL, NULL, NULL) == KVR_OK;
}

/* data on subject: counted as one bad event more, and nothing published. */
static void bad(const char *row, const char *subject, const void *data, size_t len)
{
    uint64_t before = hr_stat("data.bad_events");
    size_t mark = hr_nsent;
    hr_event(subject, data, len);
    cr_assert(eq(u64, hr_stat("data.bad_events"), before + 1), "%s (%s): counted", row, subject);
    cr_assert(eq(sz, hr_nsent, mark), "%s: nothing published", row);
}

Test(hostile_events, a_subject_names_its_worker_in_canonical_digits_only)
{
    static const char *const subjects[] = {
        "kv.default.ev.+7.hb",
        "kv.default.ev.007.hb",
        "kv.default.ev.-1.hb",
        "kv.default.ev.0.hb",
        "kv.default.ev.0x7.hb",
        "kv.default.ev. 7.hb",
        "kv.default.ev.18446744073709551615.hb", /* 2^64-1 */
        "kv.default.ev.18446744073709551616.hb", /* 2^64: would wrap to 0 */
        "kv.default.ev.99999999999999999999999.hb",
        "kv.default.ev.7.hb.x", /* the kind is the last token */
        "kv.default.ev.7",
        "kv.default.ev..hb",
        "kv.default.ev.7.nope", /* no such kind */
    };
    struct kvr_buf b = {0};
    hb_bytes(&b, 7, 64);
    for (size_t i = 0; i < sizeof subjects / sizeof subjects[0]; i++)
        bad("a worker id or kind that is none", subjects[i], b.data, b.len);
    cr_assert(not(known(7)), "worker 7 was never announced");
    hr_event("kv.default.ev.7.hb", b.data, b.len);
    cr_assert(known(7), "its own subject announces it");
    kvr_buf_free(&b);
}

/* Once open: the id was taken from the token before the kind, whatever came before it, so a
 * worker allowed to publish on kv.<ns>.ev.9.> could speak for worker 7 on kv.<ns>.ev.9.7.hb. A
 * subject must be exactly <prefix>.<ns>.ev.<id>.<kind>. */
Test(hostile_events, a_subject_with_a_token_more_or_less_is_dropped)
{
    struct kvr_buf b = {0};
    hb_bytes(&b, 7, 64);
    bad("a token more", "kv.default.ev.9.7.hb", b.data, b.len);
    bad("a token less", "kv.default.ev.hb", b.data, b.len);
    bad("another namespace", "kv.other.ev.7.hb", b.data, b.len);
    cr_assert(not(known(7)));
    cr_assert(not(known(9)));
    kvr_buf_free(&b);
}

Test(hostile_events, a_payload_speaks_for_the_worker_of_its_subject_only)
{
    struct kvr_buf b = {0};
    hb_bytes(&b, 7, 64);
    hr_event("kv.default.ev.7.hb", b.data, b.len);
    hb_bytes(&b, 8, 64);
    bad("heartbeat of worker 8 on worker 7's subject", "kv.default.ev.7.hb", b.data, b.len);
    struct kvr_kv_block blk = {1, 2};
    cr_assert(eq(int, kvr_wire_encode_stored(&b, 8, 1, NULL, &blk, 1), KVR_OK));
    bad("stored", "kv.default.ev.7.kv", b.data, b.len);
    uint64_t id = 1;
    cr_assert(eq(int, kvr_wire_encode_removed(&b, 8, 2, &id, 1), KVR_OK));
    bad("removed", "kv.default.ev.7.kv", b.data, b.len);
    cr_assert(eq(int, kvr_wire_encode_cleared(&b, 8, 3), KVR_OK));
    bad("cleared", "kv.default.ev.7.kv", b.data, b.len);
    cr_assert(eq(int, kvr_wire_encode_tokens(&b, 8, 55, KVR_WIRE_PREFILL_DONE), KVR_OK));
    bad("tokens", "kv.default.ev.7.tokens", b.data, b.len);
    cr_assert(eq(int, kvr_wire_encode_done(&b, 8, 55, KVR_OK, 1), KVR_OK));
    bad("done", "kv.default.ev.7.done", b.data, b.len);
    cr_assert(eq(int, kvr_wire_encode_done(&b, 0, 55, KVR_OK, 1), KVR_OK));
    bad("done naming no worker", "kv.default.ev.7.done", b.data, b.len);
    cr_assert(not(known(8)));
    kvr_buf_free(&b);
}

static void pack(struct kvr_buf *b, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    cr_assert(eq(int, kvr_buf_reserve(b, n + 1), KVR_OK));
    b->len = protobuf_c_message_pack(m, b->data);
}

Test(hostile_events, payloads_that_do_not_decode_or_are_over_a_cap_are_counted)
{
    struct kvr_buf b = {0};
    hb_bytes(&b, 7, 64);
    hr_event("kv.default.ev.7.hb", b.data, b.len);
    bad("truncated heartbeat", "kv.default.ev.7.hb", b.data, b.len - 2);
    uint8_t junk[2048];
    memset(junk, 0xff, sizeof junk);
    static const char *const kinds[] = {"hb", "kv", "tokens", "done"};
    for (int i = 0; i < 4; i++) {
        char s[64];
        snprintf(s, sizeof s, "kv.default.ev.7.%s", kinds[i]);
        bad("junk bytes", s, junk, 16);
    }
    bad("a tokens event of 2,048 bytes (cap 1,024)", "kv.default.ev.7.tokens", junk, sizeof junk);
    Kvrouter__V1__TokensEvent t = KVROUTER__V1__TOKENS_EVENT__INIT;
    t.worker_id = 7;
    t.request_key = 55;
    t.kind = 7; /* no such kind */
    pack(&b, &t.base);
    bad("tokens kind 7", "kv.default.ev.7.tokens", b.data, b.len);
    Kvrouter__V1__KvEvent e = KVROUTER__V1__KV_EVENT__INIT;
    e.worker_id = 7; /* and no event in it */
    pack(&b, &e.base);
    bad("a KvEvent without its event", "kv.default.ev.7.kv", b.data, b.len);
    hb_bytes(&b, 7, 0);
    bad("heartbeat block size 0", "kv.default.ev.7.hb", b.data, b.len);
    kvr_buf_free(&b);
}

Test(hostile_events, kv_events_held_during_a_snapshot_are_bounded_before_they_are_copied)
{
    /* while a snapshot is applied, KV events are held to be applied after it: one over the
     * wire's bound is refused at once (it was copied whatever its size, for any worker id) */
    hr_rd.holding = true;
    size_t big = 4u << 20;
    uint8_t *junk = malloc(big);
    cr_assert(ne(ptr, junk, NULL));
    memset(junk, 0xff, big);
    bad("4 MiB on a worker's kv subject", "kv.default.ev.999.kv", junk, big);
    cr_assert(eq(u32, hr_rd.nheld, 0), "not held");
    cr_assert(eq(sz, hr_rd.held_bytes, 0));
    /* within the bound: held, its bytes counted, and judged when applied after the snapshot */
    hr_event("kv.default.ev.999.kv", junk, 64);
    cr_assert(eq(u32, hr_rd.nheld, 1));
    cr_assert(eq(sz, hr_rd.held_bytes, 64));
    free(junk);
}

Test(hostile_events, repeated_fields_over_their_caps_are_counted)
{
    uint32_t n = KVR_WIRE_INFLIGHT_MAX + 1;
    uint64_t *keys = calloc(n, sizeof *keys);
    for (uint32_t i = 0; i < n; i++)
        keys[i] = 1000 + i;
    struct kvr_wire_heartbeat h = {.info = {.id = 7, .block_size = 64, .capacity_blocks = 4096},
                                   .interval_ms = 1000,
                                   .inflight = keys,
                                   .ninflight = n};
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &h), KVR_OK));
    bad("heartbeat with 65,537 keys in flight", "kv.default.ev.7.hb", b.data, b.len);
    h.ninflight = 0;
    h.ended = keys;
    h.nended = KVR_WIRE_ENDED_MAX + 1;
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &h), KVR_OK));
    bad("heartbeat with 16,385 ended keys", "kv.default.ev.7.hb", b.data, b.len);
    cr_assert(not(known(7)));
    hr_heartbeat(7, 4096, NULL, 0, 1000);
    struct kvr_kv_block *blk = calloc(KVR_WIRE_STORED_BLOCKS_MAX + 1, sizeof *blk);
    for (uint32_t i = 0; i <= KVR_WIRE_STORED_BLOCKS_MAX; i++)
        blk[i] = (struct kvr_kv_block){i + 1, i * 7919u};
    cr_assert(eq(int, kvr_wire_encode_stored(&b, 7, 1, NULL, blk, KVR_WIRE_STORED_BLOCKS_MAX + 1),
                 KVR_OK));
    bad("stored event with 65,537 blocks", "kv.default.ev.7.kv", b.data, b.len);
    cr_assert(eq(u64, hr_stat("data.index_entries"), 0));
    free(blk);
    free(keys);
    kvr_buf_free(&b);
}

Test(hostile_events, events_naming_nothing_known_are_counted_where_they_are)
{
    hr_heartbeat(7, 4096, NULL, 0, 1000);
    struct kvr_buf b = {0};
    struct kvr_kv_block blk = {1, 2};
    cr_assert(eq(int, kvr_wire_encode_stored(&b, 9, 1, NULL, &blk, 1), KVR_OK));
    hr_event("kv.default.ev.9.kv", b.data, b.len);
    cr_assert(eq(u64, hr_stat("data.unknown_worker_events"), 1), "a worker never announced");
    cr_assert(eq(int, kvr_wire_encode_tokens(&b, 7, 55, KVR_WIRE_OUTPUT_BLOCK), KVR_OK));
    hr_event("kv.default.ev.7.tokens", b.data, b.len);
    cr_assert(eq(u64, hr_stat("data.unknown_request_events"), 1), "a request never decided");
    cr_assert(eq(u64, hr_stat("data.replication.early_events"), 1), "kept 60 s for its decision");
    uint64_t parent = 12345, ids[3] = {77, 78, 79};
    cr_assert(eq(int, kvr_wire_encode_stored(&b, 7, 2, &parent, &blk, 1), KVR_OK));
    hr_event("kv.default.ev.7.kv", b.data, b.len);
    cr_assert(eq(int, kvr_wire_encode_removed(&b, 7, 3, ids, 3), KVR_OK));
    hr_event("kv.default.ev.7.kv", b.data, b.len);
    struct kvr_router_stats s;
    kvr_router_stats(hr_rd.core, &s); /* the index's counters are not in $SRV.STATS */
    cr_assert(eq(u64, s.index.unknown_parent, 1), "a parent never stored: the event refused");
    cr_assert(eq(u64, s.index.unknown_block, 3), "ids never stored: skipped");
    cr_assert(eq(u64, hr_stat("data.index_entries"), 0));
    hb_bytes(&b, 8, 32); /* the router's blocks are 64 tokens */
    hr_event("kv.default.ev.8.hb", b.data, b.len);
    kvr_router_stats(hr_rd.core, &s);
    cr_assert(not(known(8)), "a worker with other blocks is refused (logged worker_refused)");
    cr_assert(eq(u64, s.bad_block_size, 1));
    cr_assert(eq(u64, hr_stat("data.bad_events"), 0), "none of these is a bad event");
    kvr_buf_free(&b);
}

Test(hostile_events, a_heartbeat_of_unknown_keys_asks_the_peers_a_bounded_question)
{
    enum { N = 1000 };
    uint64_t keys[N];
    for (uint32_t i = 0; i < N; i++)
        keys[i] = 0xabc0000ull + i;
    hr_heartbeat(7, 4096, keys, N, 1000);
    const struct hr_sent *m = NULL;
    cr_assert(eq(int, hr_count("kv.default.router.lookup", 0, &m), 1), "one lookup");
    struct kvr_wire_sync q;
    cr_assert(eq(int, kvr_wire_decode_sync(m->data, m->len, &q), KVR_OK));
    cr_assert(eq(u32, q.nkeys, 256), "at most 256 keys asked");
    kvr_wire_sync_free(&q);
    cr_assert(eq(u64, hr_stat("data.replication.lookups"), 1));
}

Test(hostile_events, events_out_of_order_are_absorbed)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_done(&b, 1, 4242, KVR_OK, 3), KVR_OK));
    hr_event("kv.default.ev.1.done", b.data, b.len); /* before its decision */
    hr_event("kv.default.ev.1.done", b.data, b.len); /* and twice */
    uint64_t h[2] = {11, 12};
    struct kvr_request_record rec = {4242, 1, h, 2, 128, 0, false, 0, 0};
    hr_gossip("peer", 5, 1, &rec, "_INBOX.late", "peer");
    cr_assert(eq(u32, hr_rd.pend.n, 0), "its done came first: over");
    cr_assert(eq(u64, hr_stat("data.replication.already_known"), 1));
    cr_assert(eq(u64, hr_stat("data.replication.conflicts"), 1));
    cr_assert(eq(int, hr_count("kv.default.worker.1.cancel", 0, NULL), 1),
              "taken for a paused router's copy: its worker stopped silently");
    hr_gossip("peer", 5, 1, &rec, "_INBOX.late", "peer"); /* the same decision again, a repair */
    cr_assert(eq(u64, hr_stat("data.replication.already_known"), 2), "refused every time");
    cr_assert(eq(u64, hr_stat("data.bad_events"), 0));
    kvr_buf_free(&b);
}

/* The Stored event of worker wid for the 2 blocks of the prompt hr_generate makes from base. */
static void stored_prompt(uint64_t wid, uint32_t base)
{
    uint32_t t[128];
    for (uint32_t i = 0; i < 128; i++)
        t[i] = base * 1000 + i;
    struct kvr_kv_block blk[2] = {{1, kvr_hash_block(t, 64)}, {2, kvr_hash_block(t + 64, 64)}};
    struct kvr_buf b = {0};
    char s[64];
    snprintf(s, sizeof s, "kv.default.ev.%llu.kv", (unsigned long long)wid);
    cr_assert(eq(int, kvr_wire_encode_stored(&b, wid, 1, NULL, blk, 2), KVR_OK));
    hr_event(s, b.data, b.len);
    kvr_buf_free(&b);
}

/* Still open: KV events are believed. One forged Stored event makes a worker look as if it held a
 * prompt, and the router sends that prompt's requests there. */
Test(hostile_events, still_open_a_forged_stored_event_steers_routing)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    hr_heartbeat(2, 4096, NULL, 0, 1000);
    for (uint64_t wid = 1; wid <= 2; wid++) {
        uint32_t base = 10 + (uint32_t)wid;
        stored_prompt(wid, base); /* forged: neither ever computed it */
        char id[16], subject[64];
        snprintf(id, sizeof id, "steer-%u", base);
        hr_generate("_INBOX.s", id, base, 128, 8);
        snprintf(subject, sizeof subject, "kv.default.worker.%llu.generate",
                 (unsigned long long)wid);
        const struct hr_sent *m = NULL;
        cr_assert(eq(int, hr_count(subject, 0, &m), 1), "sent where the forgery says");
        struct kvr_wire_limits lim = {1 << 20, 1 << 16};
        struct kvr_wire_request q;
        uint64_t key;
        uint32_t overlap = 0;
        cr_assert(eq(int,
                     kvr_wire_decode_worker_generate(m->data, m->len, &lim, &q, &key, &overlap),
                     KVR_OK));
        kvr_wire_request_free(&q);
        cr_assert(eq(u32, overlap, 2), "expecting both blocks cached");
    }
}

/* Still open: a done event is believed. A forged one ends a live request in every router: its
 * booking goes (the worker looks idle) and the client's resend is ignored as ended. */
Test(hostile_events, still_open_a_forged_done_ends_a_live_request)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    hr_generate("_INBOX.v", "live", 1, 128, 8);
    hr_done(1, kvr_pending_key("_INBOX.v", "live"), 0); /* forged */
    cr_assert(eq(u32, hr_rd.pend.n, 0), "no longer in flight here");
    hr_generate("_INBOX.v", "live", 1, 128, 8);
    cr_assert(eq(u64, hr_stat("data.resends_after_end"), 1), "the resend is not routed again");
    cr_assert(eq(int, hr_count("kv.default.worker.1.generate", 0, NULL), 1));
    cr_assert(eq(u64, hr_stat("data.repeats_asked"), 1), "but its worker, which still holds it, "
                                                         "is asked to repeat the stream");
    cr_assert(eq(int, hr_count("kv.default.worker.1.rebind", 0, NULL), 1));
}

/* Worker 1's done for each key of [first, first + n), status st, in one EventBatch. */
static void dones_batched(uint64_t first, uint32_t n, kvr_status st)
{
    struct kvr_wire_event *ev = calloc(n, sizeof *ev);
    for (uint32_t i = 0; i < n; i++) {
        ev[i].kind = KVR_WIRE_EV_DONE;
        ev[i].u.done = (struct kvr_wire_done){1, first + i, (uint32_t)st, 1};
    }
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_batch(&b, 1, ev, n), KVR_OK));
    hr_event("kv.default.ev.1.batch", b.data, b.len);
    kvr_buf_free(&b);
    free(ev);
}

/* Anyone who may publish on a worker's events subject could send dones for made-up keys: each was
 * remembered with the ends of this router's own requests (a done may come before its decision's
 * gossip), so 65,536 of them evicted every one, and a client's resend of a request that had ended
 * was generated a second time. They are remembered apart now, and evict only their like. */
Test(hostile_events, a_flood_of_dones_for_made_up_keys_does_not_make_a_router_forget_what_ended)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    hr_generate("_INBOX.e", "ended", 1, 128, 8);
    hr_done(1, kvr_pending_key("_INBOX.e", "ended"), 8);
    cr_assert(eq(u32, hr_rd.pend.n, 0), "it ended");
    struct kvr_buf b = {0};
    const uint64_t first = 1u << 20;                /* made-up keys from here on */
    for (uint32_t i = 0; i < KVR_RECENT_MAX; i++) { /* a worker's refusal every 4th */
        kvr_status st = i % 4 == 3 ? KVR_ERR_NOMEM : KVR_OK;
        cr_assert(eq(int, kvr_wire_encode_done(&b, 1, first + i, st, 1), KVR_OK));
        hr_event("kv.default.ev.1.done", b.data, b.len);
    }
    for (uint32_t k = 0; k < 4; k++) /* and in batches, 256 a batch */
        dones_batched(first + KVR_RECENT_MAX + 256 * k, 256, KVR_OK);
    kvr_buf_free(&b);
    size_t mark = hr_nsent;
    hr_generate("_INBOX.e", "ended", 1, 128, 8); /* its resend */
    cr_assert(eq(int, hr_count("kv.default.worker.1.generate", mark, NULL), 0), "not placed again");
    cr_assert(eq(u64, hr_stat("data.resends_after_end"), 1));
    cr_assert(eq(u64, hr_stat("data.recent_evicted"), 0), "nothing that ended here forgotten");
    cr_assert(eq(u64, hr_stat("data.early_dones"), KVR_RD_EARLY_DONES), "bounded");
    cr_assert(
        eq(u64, hr_stat("data.early_dones_evicted"), KVR_RECENT_MAX + 1024 - KVR_RD_EARLY_DONES));
    cr_assert(eq(u64, hr_stat("data.bad_events"), 0), "dones of a known worker: not bad");
    /* what they are kept for still holds for the last of them: a decision that comes after its
     * done is refused, as a peer's request's done can overtake its decision's gossip */
    uint64_t h[2] = {11, 12};
    struct kvr_request_record rec = {first + KVR_RECENT_MAX + 1023, 1, h, 2, 128, 0, true, 0, 0};
    hr_gossip("peer", 5, 1, &rec, "_INBOX.late", "peer");
    cr_assert(eq(u64, hr_stat("data.replication.already_known"), 1));
    cr_assert(eq(u32, hr_rd.pend.n, 0));
}

/* A RebindAsk of worker wid for n keys, on worker sub's subject. */
static void rebind_ask(uint64_t wid, uint64_t sub, const uint64_t *keys, uint32_t n)
{
    struct kvr_wire_rebind_ask a = {.worker_id = wid, .keys = (uint64_t *)keys, .nkeys = n};
    struct kvr_buf b = {0};
    char s[64];
    snprintf(s, sizeof s, "kv.default.ev.%llu.rebind", (unsigned long long)sub);
    cr_assert(eq(int, kvr_wire_encode_rebind_ask(&b, &a), KVR_OK));
    hr_event(s, b.data, b.len);
    kvr_buf_free(&b);
}

Test(hostile_events, a_rebind_ask_gets_a_worker_its_own_clients_only)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    hr_heartbeat(7, 4096, NULL, 0, 1000);
    uint8_t junk[16];
    memset(junk, 0xff, sizeof junk);
    bad("junk", "kv.default.ev.7.rebind", junk, sizeof junk);
    uint64_t *keys = calloc(KVR_WIRE_REBIND_MAX + 1, sizeof *keys);
    for (uint32_t i = 0; i <= KVR_WIRE_REBIND_MAX; i++)
        keys[i] = 1000 + i;
    size_t mark = hr_nsent;
    rebind_ask(8, 7, keys, 1); /* worker 8's ask on worker 7's subject */
    rebind_ask(0, 7, keys, 1);
    rebind_ask(7, 7, keys, KVR_WIRE_REBIND_MAX + 1);
    cr_assert(eq(u64, hr_stat("data.bad_events"), 4), "junk, another worker's, none's, too many");
    hr_generate("_INBOX.theirs", "client", 1, 128, 8);
    uint64_t theirs = kvr_pending_key("_INBOX.theirs", "client");
    uint64_t wid = kvr_pending_find(&hr_rd.pend, theirs)->worker_id, other = wid == 1 ? 7 : 1;
    keys[0] = theirs;
    rebind_ask(other, other, keys, 3); /* the other worker asks for this client, and 2 unknowns */
    cr_assert(eq(u64, hr_stat("data.replication.rebinds_unknown"), 3));
    char subject[64];
    snprintf(subject, sizeof subject, "kv.default.worker.%llu.rebind", (unsigned long long)other);
    cr_assert(eq(int, hr_count(subject, mark, NULL), 0), "nothing for it");
    rebind_ask(wid, wid, keys, 1); /* its own worker's */
    snprintf(subject, sizeof subject, "kv.default.worker.%llu.rebind", (unsigned long long)wid);
    const struct hr_sent *m = NULL;
    cr_assert(eq(int, hr_count(subject, mark, &m), 1));
    cr_assert(eq(str, m->reply, "_INBOX.theirs"), "with its client's inbox as reply");
    free(keys);
}

/* EventBatches (kvworker --event-batch-ms): applied in order as if each had come alone; refused
 * whole, and counted once, when any of it does not decode or speaks for another worker. */
Test(hostile_events, a_batch_is_applied_as_its_events_alone_or_refused_whole)
{
    hr_heartbeat(7, 4096, NULL, 0, 1000);
    hr_generate("_INBOX.b", "one", 1, 128, 8);
    hr_generate("_INBOX.b", "two", 500, 128, 8);
    uint64_t k1 = kvr_pending_key("_INBOX.b", "one"), k2 = kvr_pending_key("_INBOX.b", "two");
    cr_assert(eq(u32, hr_rd.pend.n, 2));
    struct kvr_wire_event ev[4] = {{.kind = KVR_WIRE_EV_TOKENS},
                                   {.kind = KVR_WIRE_EV_TOKENS},
                                   {.kind = KVR_WIRE_EV_TOKENS},
                                   {.kind = KVR_WIRE_EV_DONE}};
    ev[0].u.tokens = (struct kvr_wire_tokens){7, k1, KVR_WIRE_PREFILL_DONE};
    ev[1].u.tokens = (struct kvr_wire_tokens){7, k2, KVR_WIRE_PREFILL_DONE};
    ev[2].u.tokens = (struct kvr_wire_tokens){7, k1, KVR_WIRE_OUTPUT_BLOCK};
    ev[3].u.done = (struct kvr_wire_done){7, k1, KVR_OK, 8};
    struct kvr_buf b = {0};

    /* refused whole: worker 8's batch on worker 7's subject; one event of worker 8 inside worker
     * 7's; 0xff bytes; an event of no kind; 257 events (two batches' bytes back to back) */
    cr_assert(eq(int, kvr_wire_encode_batch(&b, 8, ev, 4), KVR_OK));
    bad("a batch of worker 8", "kv.default.ev.7.batch", b.data, b.len);
    Kvrouter__V1__DoneEvent d = KVROUTER__V1__DONE_EVENT__INIT;
    d.worker_id = 8;
    d.request_key = k2;
    Kvrouter__V1__DoneEvent own = KVROUTER__V1__DONE_EVENT__INIT; /* worker 7's: valid alone */
    own.worker_id = 7;
    own.request_key = k1;
    Kvrouter__V1__LifecycleEvent e0 = KVROUTER__V1__LIFECYCLE_EVENT__INIT,
                                 e1 = KVROUTER__V1__LIFECYCLE_EVENT__INIT, *ep[2] = {&e0, &e1};
    e0.event_case = KVROUTER__V1__LIFECYCLE_EVENT__EVENT_DONE;
    e0.done = &own;
    e1.event_case = KVROUTER__V1__LIFECYCLE_EVENT__EVENT_DONE;
    e1.done = &d;
    Kvrouter__V1__EventBatch m = KVROUTER__V1__EVENT_BATCH__INIT;
    m.worker_id = 7;
    m.n_events = 2;
    m.events = ep;
    pack(&b, &m.base);
    bad("worker 8's done in worker 7's batch", "kv.default.ev.7.batch", b.data, b.len);
    uint8_t junk[64];
    memset(junk, 0xff, sizeof junk);
    bad("0xff bytes", "kv.default.ev.7.batch", junk, sizeof junk);
    e1.event_case = KVROUTER__V1__LIFECYCLE_EVENT__EVENT__NOT_SET;
    pack(&b, &m.base);
    bad("an event of no kind", "kv.default.ev.7.batch", b.data, b.len);
    static struct kvr_wire_event many[KVR_WIRE_BATCH_MAX];
    for (uint32_t i = 0; i < KVR_WIRE_BATCH_MAX; i++)
        many[i] = ev[0];
    struct kvr_buf two = {0};
    cr_assert(eq(int, kvr_wire_encode_batch(&two, 7, many, KVR_WIRE_BATCH_MAX), KVR_OK));
    cr_assert(eq(int, kvr_wire_encode_batch(&b, 7, many, 1), KVR_OK));
    cr_assert(eq(int, kvr_buf_reserve(&two, two.len + b.len), KVR_OK));
    memcpy(two.data + two.len, b.data, b.len);
    two.len += b.len;
    bad("257 events", "kv.default.ev.7.batch", two.data, two.len);
    kvr_buf_free(&two);
    cr_assert(eq(u32, hr_rd.pend.n, 2), "nothing of them applied (not the first's valid done)");
    cr_assert(eq(u64, hr_stat("data.event_batches"), 0));

    /* applied: both started, the first took a block and ended; the second is still on */
    uint64_t blocks0, blocks1;
    cr_assert(eq(int, kvr_router_worker_load(hr_rd.core, 7, &blocks0, NULL, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_encode_batch(&b, 7, ev, 4), KVR_OK));
    hr_event("kv.default.ev.7.batch", b.data, b.len);
    cr_assert(eq(u64, hr_stat("data.event_batches"), 1));
    cr_assert(eq(u64, hr_stat("data.batched_events"), 4));
    cr_assert(eq(u32, hr_rd.pend.n, 1), "the first ended");
    cr_assert(kvr_pending_find(&hr_rd.pend, k2) != NULL, "the second is on");
    cr_assert(eq(int, kvr_router_worker_load(hr_rd.core, 7, &blocks1, NULL, NULL), KVR_OK));
    cr_assert(lt(u64, blocks1, blocks0), "the first's blocks are freed");
    cr_assert(eq(u64, hr_stat("data.unknown_request_events"), 0), "in order: none was unknown");
    /* the same batch again: its events name a request that ended, as they would alone */
    hr_event("kv.default.ev.7.batch", b.data, b.len);
    cr_assert(eq(u64, hr_stat("data.bad_events"), 5), "not bad, only late");
    cr_assert(kvr_pending_find(&hr_rd.pend, k2) != NULL, "the second still on");
    kvr_buf_free(&b);
}

/* Whoever may publish on the events subjects (without NATS permissions, anyone) wrote a warning
 * line per message that did not decode: 1,001 lines for 1,001. Now at most KVR_REPLY_LOG_PER_S a
 * second, the next one written saying how many were left out; every one is counted. */
static void bad_heartbeat(void *ctx)
{
    (void)ctx;
    hr_event("kv.default.ev.7.hb", rec_junk, sizeof rec_junk);
}

Test(hostile_events, a_flood_of_bad_events_is_logged_in_few_lines)
{
    uint64_t before = hr_stat("data.bad_events");
    rec_log_flood(bad_heartbeat, NULL, "test_hostile", "msg=event_dropped");
    cr_assert(eq(u64, hr_stat("data.bad_events"), before + 1001), "every one counted");
}
