/*
 * The worker's event stream on a live fleet (a real nats-server on 127.0.0.1, the real kvrouter
 * and kvworker): with --event-batch, a request's lifecycle (KV stored, prefill done, output
 * blocks, done) reaches the router as EventBatches only, and leaves it with nothing in flight,
 * learnt from the events themselves (not from the heartbeats' lists of ended requests); without
 * it, the same router handles the single events as before; and a forged batch's bad events are
 * counted and dropped one by one, its good ones applied. A spy connection subscribed to the
 * worker's event subjects counts what went where.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "harness.h"

static struct nats_srv srv;
static natsConnection *nc;

static void setup(void)
{
    h_setup(&srv, 1, &nc);
}

static void teardown(void)
{
    h_teardown(&nc);
}

TestSuite(events, .init = setup, .fini = teardown, .timeout = 120);

/* A counter of the (one) router's $SRV.STATS: its generate endpoint's, at path. */
static uint64_t router_stat(const char *path)
{
    json_t *stats = h_stats(nc, 3000);
    uint64_t v = h_json_u64(h_endpoint(stats, "generate"), path);
    json_decref(stats);
    return v;
}

/* What the spy saw on kv.default.ev.1.>: messages by kind, and the events inside the batches. */
struct seen {
    uint32_t kv, tokens, done, hb, batch, other;
    uint32_t batched[4]; /* events in batches, by enum kvr_wire_batch_kind */
};

static void count_batch(struct seen *s, const void *data, size_t len)
{
    struct kvr_wire_batch_iter it;
    uint32_t n;
    cr_assert(eq(int, kvr_wire_batch_open(data, len, &it, &n), KVR_OK), "a well-formed batch");
    cr_assert(ge(u32, n, 1), "never an empty batch");
    cr_assert(le(u32, n, 64), "at most 64 events in one");
    struct kvr_wire_batch_item e;
    while (kvr_wire_batch_next(&it, &e)) {
        cr_assert(ne(int, e.kind, KVR_WIRE_BATCH_BAD));
        s->batched[e.kind]++;
    }
}

/* Read the spy's messages until none came for 300 ms. */
static void spy_read(natsSubscription *spy, struct seen *s)
{
    natsMsg *m = NULL;
    while (natsSubscription_NextMsg(&m, spy, 300) == NATS_OK) {
        const char *subj = natsMsg_GetSubject(m), *kind = strrchr(subj, '.') + 1;
        s->kv += !strcmp(kind, "kv");
        s->tokens += !strcmp(kind, "tokens");
        s->done += !strcmp(kind, "done");
        s->hb += !strcmp(kind, "hb");
        if (!strcmp(kind, "batch")) {
            s->batch++;
            count_batch(s, natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m));
        } else if (strcmp(kind, "kv") && strcmp(kind, "tokens") && strcmp(kind, "done") &&
                   strcmp(kind, "hb")) {
            s->other++;
        }
        natsMsg_Destroy(m);
    }
}

/* n requests at once (sharing a prefix, so KV events and cache hits), all served. */
static void serve(uint32_t n)
{
    struct h_req q[16];
    cr_assert(le(u32, n, 16));
    for (uint32_t i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "ev-%u", i);
        cr_assert(h_send(nc, H_GEN, &q[i], id, 1000 + i, 128, 384, 80));
    }
    for (uint32_t i = 0; i < n; i++) {
        cr_assert(h_collect(&q[i], 20000), "request %u answered", i);
        cr_assert(eq(u32, q[i].res.error_code, 0), "request %u served", i);
        cr_assert(eq(u32, q[i].res.tokens, 80));
        natsSubscription_Destroy(q[i].sub);
    }
}

/* Poll (up to 3 s) until the router holds nothing in flight; assert it. */
static void until_nothing_in_flight(void)
{
    uint64_t inflight = 1, pending = 1;
    for (int i = 0; i < 150 && (inflight || pending); i++, h_sleep_ms(20)) {
        inflight = router_stat("data.inflight");
        pending = router_stat("data.pending");
    }
    cr_assert(eq(u64, inflight, 0), "every booking freed");
    cr_assert(eq(u64, pending, 0), "nothing pending");
}

/* A fleet of one router and worker 1 (heartbeats every 1 s: their lists of ended requests come
 * late), the worker started with extra; a spy on its events, subscribed before it starts. */
static natsSubscription *fleet(const char *const *extra)
{
    natsSubscription *spy = NULL;
    cr_assert(eq(int, natsConnection_SubscribeSync(&spy, nc, "kv.default.ev.1.>"), NATS_OK));
    natsSubscription_SetPendingLimits(spy, -1, -1);
    natsConnection_Flush(nc);
    h_worker(srv.url, "1", 20, 1000, extra);
    h_router(srv.url, "r1", NULL);
    h_until_served(nc, H_GEN, 1, 20000);
    return spy;
}

Test(events, a_routed_lifecycle_through_batched_events_leaves_nothing_in_flight)
{
    natsSubscription *spy = fleet(H_ARGS("--event-batch"));
    serve(12);
    until_nothing_in_flight();
    struct seen s = {0};
    spy_read(spy, &s);
    natsSubscription_Destroy(spy);
    cr_log_info("batches %u: tokens %u, done %u, kv %u; heartbeats %u", s.batch,
                s.batched[KVR_WIRE_BATCH_TOKENS], s.batched[KVR_WIRE_BATCH_DONE],
                s.batched[KVR_WIRE_BATCH_KV], s.hb);
    cr_assert(eq(u32, s.kv + s.tokens + s.done + s.other, 0), "no single event");
    cr_assert(ge(u32, s.batched[KVR_WIRE_BATCH_DONE], 13), "every done (the probe's too)");
    cr_assert(ge(u32, s.batched[KVR_WIRE_BATCH_TOKENS], 2 * 13), "prefill done, output blocks");
    cr_assert(ge(u32, s.batched[KVR_WIRE_BATCH_KV], 1), "KV events");
    uint32_t events = s.batched[1] + s.batched[2] + s.batched[3];
    cr_assert(lt(u32, s.batch, events), "fewer messages than events (%u for %u)", s.batch, events);
    cr_assert(eq(u64, router_stat("data.ends_from_heartbeats"), 0), "ended by the batches");
    cr_assert(eq(u64, router_stat("data.bad_events"), 0));
    cr_assert(eq(u64, router_stat("data.unknown_request_events"), 0));
    cr_assert(gt(u64, router_stat("data.index_entries"), 0), "the KV events applied");
    h_end();
}

Test(events, a_router_still_handles_a_worker_sending_single_events)
{
    natsSubscription *spy = fleet(NULL);
    serve(12);
    until_nothing_in_flight();
    struct seen s = {0};
    spy_read(spy, &s);
    natsSubscription_Destroy(spy);
    cr_assert(eq(u32, s.batch, 0), "no batch without --event-batch");
    cr_assert(ge(u32, s.done, 13), "single done events");
    cr_assert(ge(u32, s.tokens, 2 * 13));
    cr_assert(ge(u32, s.kv, 1));
    cr_assert(eq(u64, router_stat("data.ends_from_heartbeats"), 0), "ended by the done events");
    cr_assert(eq(u64, router_stat("data.bad_events"), 0));
    cr_assert(gt(u64, router_stat("data.index_entries"), 0), "the KV events applied");
    h_end();
}

static void publish(const char *subject, const struct kvr_buf *b)
{
    cr_assert(eq(int, natsConnection_Publish(nc, subject, b->data, (int)b->len), NATS_OK));
    cr_assert(eq(int, natsConnection_Flush(nc), NATS_OK));
}

/* Poll (up to 2 s) until the router's counter at path reaches want; its last value. */
static uint64_t until_stat(const char *path, uint64_t want)
{
    uint64_t v = router_stat(path);
    for (int i = 0; i < 100 && v < want; i++, h_sleep_ms(20))
        v = router_stat(path);
    return v;
}

Test(events, a_forged_batch_has_its_bad_events_counted_and_its_good_ones_applied)
{
    h_worker(srv.url, "1", 20, 200, NULL); /* it sends nothing but heartbeats: no request */
    h_router(srv.url, "r1", NULL);
    h_until_served(nc, H_GEN, 1, 20000);
    until_nothing_in_flight();
    uint64_t entries = router_stat("data.index_entries"), bad = router_stat("data.bad_events");
    struct kvr_buf b = {0}, e = {0};
    struct kvr_kv_block blocks[3] = {{0xa1, 0x1001}, {0xa2, 0x1002}, {0xa3, 0x1003}};
    cr_assert(eq(int, kvr_wire_encode_stored(&e, 1, 1, NULL, blocks, 1), KVR_OK));
    cr_assert(eq(int, kvr_wire_batch_append(&b, KVR_WIRE_BATCH_KV, e.data, e.len), KVR_OK));
    cr_assert(eq(int, kvr_wire_batch_append(&b, KVR_WIRE_BATCH_TOKENS, "\xff", 1), KVR_OK));
    cr_assert(eq(int, kvr_wire_encode_stored(&e, 7, 2, &blocks[0].engine_id, blocks + 1, 1),
                 KVR_OK)); /* worker 7's, on worker 1's subject */
    cr_assert(eq(int, kvr_wire_batch_append(&b, KVR_WIRE_BATCH_KV, e.data, e.len), KVR_OK));
    uint8_t empty[] = {0x0a, 0x00}; /* an event with nothing in it */
    cr_assert(eq(int, kvr_buf_reserve(&b, b.len + 2), KVR_OK));
    memcpy(b.data + b.len, empty, 2);
    b.len += 2;
    cr_assert(
        eq(int, kvr_wire_encode_stored(&e, 1, 3, &blocks[0].engine_id, blocks + 1, 2), KVR_OK));
    cr_assert(eq(int, kvr_wire_batch_append(&b, KVR_WIRE_BATCH_KV, e.data, e.len), KVR_OK));
    publish("kv.default.ev.1.batch", &b);
    cr_assert(eq(u64, until_stat("data.bad_events", bad + 3), bad + 3), "the three bad ones");
    cr_assert(eq(u64, until_stat("data.index_entries", entries + 3), entries + 3),
              "the two good ones: three blocks");
    cr_assert(eq(u64, router_stat("data.workers"), 1), "no worker 7");
    /* a batch cut short is one bad message, nothing of it applied */
    b.len = 0;
    cr_assert(eq(int, kvr_wire_encode_removed(&e, 1, 4, &blocks[0].engine_id, 1), KVR_OK));
    cr_assert(eq(int, kvr_wire_batch_append(&b, KVR_WIRE_BATCH_KV, e.data, e.len), KVR_OK));
    cr_assert(eq(int, kvr_wire_batch_append(&b, KVR_WIRE_BATCH_KV, e.data, e.len), KVR_OK));
    b.len--;
    publish("kv.default.ev.1.batch", &b);
    cr_assert(eq(u64, until_stat("data.bad_events", bad + 4), bad + 4), "counted once");
    h_sleep_ms(100);
    cr_assert(eq(u64, router_stat("data.index_entries"), entries + 3), "its removal not applied");
    /* and one over the count cap, the same */
    b.len = 0;
    for (uint32_t i = 0; i <= KVR_WIRE_BATCH_EVENTS_MAX; i++)
        cr_assert(eq(int, kvr_wire_batch_append(&b, KVR_WIRE_BATCH_KV, e.data, e.len), KVR_OK));
    publish("kv.default.ev.1.batch", &b);
    cr_assert(eq(u64, until_stat("data.bad_events", bad + 5), bad + 5), "counted once");
    h_sleep_ms(100);
    cr_assert(eq(u64, router_stat("data.index_entries"), entries + 3), "nothing removed");
    kvr_buf_free(&b);
    kvr_buf_free(&e);
    h_end();
}
