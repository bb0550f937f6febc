/*
 * The router daemon's state machines without NATS: intake, pending requests, re-placement,
 * resend absorption, the queue, orphans and the reply discipline, driven through the handlers
 * with real protobuf bytes and observed through a recording sink (what would have been published).
 */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include "../criterion_gt.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backlog.h"
#include "clock.h"
#include "codec.h"
#include "events.h"
#include "fleet.h"
#include "intake.h"
#include "metrics.h"
#include "kvr/hash.h"
#include "place.h"
#include "rec.h"
#include "send.h"
#include "state.h"
#include "subject.h"
#include "sync.h"
#include "timer.h"

/* A gossip message as its router publishes it: on the subject named by its router id. */
static void gossip_in(struct kvr_rd *r, const void *data, size_t len)
{
    struct kvr_wire_gossip g;
    char subject[600] = "kv.default.router.gossip.?";
    if (kvr_wire_decode_gossip(data, len, &g) == KVR_OK) {
        snprintf(subject, sizeof subject, "kv.default.router.gossip.%s", g.router_id);
        kvr_wire_gossip_free(&g);
    }
    kvr_fleet_on_gossip(r, subject, data, len);
}

/* Decisions gossiped from rec_sent[from] on; *last (when given): the last one's decided_ns and
 * placement (0, 0: none). */
struct last_decision {
    uint64_t decided_ns;
    uint32_t placement;
    uint32_t max_tokens;
};
/* How many of the gossip messages sent from rec_sent[from] on fn counts (it may take from g). */
static int each_gossip(size_t from, bool (*fn)(void *ctx, struct kvr_wire_gossip *g), void *ctx)
{
    int n = 0;
    for (size_t i = from; i < rec_nsent; i++) {
        struct kvr_wire_gossip g;
        if (strncmp(rec_sent[i].subject, "kv.default.router.gossip.", 25) ||
            kvr_wire_decode_gossip(rec_sent[i].data, rec_sent[i].len, &g) != KVR_OK)
            continue;
        n += fn(ctx, &g);
        kvr_wire_gossip_free(&g);
    }
    return n;
}

static bool a_decision(void *ctx, struct kvr_wire_gossip *g)
{
    struct last_decision *last = ctx;
    if (g->kind != KVR_WIRE_GOSSIP_DECISION)
        return false;
    if (last)
        *last = (struct last_decision){g->d.decided_ns, g->d.placement, g->d.rec.max_tokens};
    return true;
}

static int gossiped(size_t from, struct last_decision *last)
{
    return each_gossip(from, a_decision, last);
}

static int decisions_since(size_t from)
{
    return gossiped(from, NULL);
}

static struct last_decision last_decision(size_t from)
{
    struct last_decision at = {0, 0, 0};
    gossiped(from, &at);
    return at;
}

static int queued_notices(size_t from, bool released, struct kvr_wire_queued *last);

/* --- the daemon state under test ----------------------------------------------------------- */

static struct kvr_rd_config cfg;
static struct kvr_rd rd;

/* The state under test, with at most max_inflight requests in flight (0: the default). */
static void setup_with(uint32_t max_inflight)
{
    rec_reset();
    kvr_rd_config_default(&cfg);
    strcpy(cfg.id, "r1");
    cfg.core.seed = 7;
    cfg.hello_ns = 2 * KVR_NS_PER_MS;
    cfg.heartbeat_min_ns = 1 * KVR_NS_PER_MS; /* workers that die within milliseconds */
    if (max_inflight)
        cfg.core.max_inflight = max_inflight;
    cr_assert(eq(int, kvr_rd_init(&rd, &cfg, (struct kvr_sink){.publish = rec_record, .ctx = NULL}),
                 KVR_OK));
    cr_assert(eq(int, kvr_fleet_create(&rd), KVR_OK));
    rd.fleet->synced = true; /* nobody to take a snapshot from */
    rd.serving = true;
}

static void setup(void)
{
    setup_with(0);
}

static void teardown(void)
{
    kvr_fleet_destroy(&rd);
    kvr_rd_free(&rd);
    rec_reset();
}

TestSuite(routerd, .init = setup, .fini = teardown, .timeout = 30);

/* Start again with cfg as it stands. */
static void restart(void)
{
    kvr_fleet_destroy(&rd);
    kvr_rd_free(&rd);
    cr_assert(eq(int, kvr_rd_init(&rd, &cfg, (struct kvr_sink){.publish = rec_record, .ctx = NULL}),
                 KVR_OK));
    cr_assert(eq(int, kvr_fleet_create(&rd), KVR_OK));
    rd.fleet->synced = true;
    rd.serving = true;
}

/* Start again with workers busy above half their capacity (so requests queue). */
static void busy_above_half(void)
{
    cfg.core.busy_threshold = 0.5;
    restart();
}

/* Worker wid's heartbeat listing keys[0..n), with `waiting` forwards it has not taken yet. */
static void heartbeat_waiting(uint64_t wid, uint64_t capacity, const uint64_t *keys, uint32_t n,
                              uint32_t interval_ms, uint32_t waiting)
{
    struct rec_event e = rec_heartbeat(wid, capacity, keys, n, interval_ms, waiting);
    kvr_events_on_message(&rd, e.subject, e.b.data, e.b.len);
    kvr_buf_free(&e.b);
}

static void heartbeat(uint64_t wid, uint64_t capacity, const uint64_t *keys, uint32_t n,
                      uint32_t interval_ms)
{
    heartbeat_waiting(wid, capacity, keys, n, interval_ms, 0);
}

/* An event encoded in b (freed here) on worker wid's events subject of this kind ("hb", "kv"...),
 * as the events subscription brings it. */
static void event_in(uint64_t wid, const char *kind, struct kvr_buf *b)
{
    char subject[64];
    snprintf(subject, sizeof subject, "kv.default.ev.%llu.%s", (unsigned long long)wid, kind);
    kvr_events_on_message(&rd, subject, b->data, b->len);
    kvr_buf_free(b);
}

/* Worker wid's done event for key, with status st, having streamed output tokens. */
static void worker_streamed(uint64_t wid, uint64_t key, kvr_status st, uint32_t output)
{
    struct kvr_buf b = {0};
    char subject[64];
    snprintf(subject, sizeof subject, "kv.default.ev.%llu.done", (unsigned long long)wid);
    cr_assert(eq(int, kvr_wire_encode_done(&b, wid, key, st, output), KVR_OK));
    kvr_events_on_message(&rd, subject, b.data, b.len);
    kvr_buf_free(&b);
}

static void worker_ended(uint64_t wid, uint64_t key, kvr_status st)
{
    worker_streamed(wid, key, st, 0);
}

static void worker_done(uint64_t wid, uint64_t key)
{
    worker_ended(wid, key, KVR_OK);
}

/* Send a GenerateRequest of n tokens from base with client id and reply subject. */
static void generate(const char *reply, const char *id, uint32_t base, uint32_t n)
{
    uint32_t *t = malloc(n * sizeof *t);
    for (uint32_t i = 0; i < n; i++)
        t[i] = base * 1000 + i;
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_generate(&b, id, t, n, 8, NULL), KVR_OK));
    kvr_intake_generate(&rd, reply, b.data, b.len);
    kvr_buf_free(&b);
    free(t);
}

/* The state's /metrics text, NUL-terminated; free it. */
static char *metrics_text(void)
{
    struct kvr_buf b = {0};
    struct kvr_prom p;
    kvr_prom_begin(&p, &b);
    cr_assert(eq(int, kvr_rd_metrics(&rd, &p), KVR_OK));
    char *text = strndup((const char *)b.data, b.len);
    kvr_buf_free(&b);
    return text;
}

/* --- tests ----------------------------------------------------------------------------------- */

Test(routerd, a_request_is_forwarded_booked_and_gossiped)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    generate("_INBOX.c1", "req-1", 1, 256);
    const struct rec_sent *fwd = NULL;
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, &fwd), 1));
    cr_assert(eq(str, (char *)fwd->reply, "_INBOX.c1"), "the client's reply subject is kept");
    struct kvr_wire_request q;
    uint64_t key = 0;
    uint32_t overlap = 9;
    struct kvr_wire_limits lim = {1 << 20, 1 << 16};
    cr_assert(eq(int,
                 kvr_wire_decode_worker_generate(fwd->data, fwd->len, &lim, &q, &key, &overlap),
                 KVR_OK));
    cr_assert(eq(str, q.request_id, "req-1"));
    cr_assert(eq(u64, key, kvr_pending_key("_INBOX.c1", "req-1")));
    kvr_wire_request_free(&q);
    cr_assert(eq(int, decisions_since(0), 1), "one gossip per decision");
    cr_assert(eq(u32, rd.pend.n, 1));
    worker_done(1, key);
    cr_assert(eq(u32, rd.pend.n, 0), "done frees the pending entry");
}

/* A completed request's done event says how much of its max_tokens it used; the router prices the
 * next ones of that max_tokens at it (generate() asks for 8). Only completions teach: a failure,
 * a done that says nothing (0) and an end a heartbeat lists do not. */
Test(routerd, completions_teach_what_a_max_tokens_will_generate)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    for (int k = 0; k < 40; k++) {
        char id[16];
        snprintf(id, sizeof id, "o%d", k);
        generate("_INBOX.o", id, 1 + k, 64);
        uint64_t key = kvr_pending_key("_INBOX.o", id);
        if (k < 8)
            worker_streamed(1, key, KVR_ERR_WORKER_LOST, 1);
        else if (k < 16)
            worker_streamed(1, key, KVR_OK, 0);
        else if (k < 24) {
            struct kvr_wire_heartbeat h = {
                .info = {.id = 1, .block_size = 64, .capacity_blocks = 4096},
                .interval_ms = 1000,
                .ended = &key,
                .nended = 1};
            struct kvr_buf b = {0};
            cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &h), KVR_OK));
            kvr_events_on_message(&rd, "kv.default.ev.1.hb", b.data, b.len);
            kvr_buf_free(&b);
        } else
            worker_streamed(1, key, KVR_OK, 2);
        cr_assert(eq(u32, kvr_router_expected_output(rd.core, 8), k < 39 ? 8 : 2),
                  "after %d: nothing learned before 16 completions", k + 1);
    }
    cr_assert(eq(u32, rd.pend.n, 0));
    cr_assert(eq(u32, kvr_router_expected_output(rd.core, 1000), 1000), "another max_tokens");
    struct kvr_router_stats s;
    kvr_router_stats(rd.core, &s);
    cr_assert(eq(u64, s.completions, 16));
    cr_assert(eq(u64, s.completion_tokens, 32));
    cr_assert(eq(u64, s.completion_limit, 128));
    char *text = metrics_text();
    cr_assert(strstr(text, "\nkvrouter_completion_tokens_total 32\n") != NULL);
    cr_assert(strstr(text, "\nkvrouter_completion_limit_tokens_total 128\n") != NULL);
    free(text);
}

/* Peers' decisions carry their max_tokens (this router's gossip too), so the completions of the
 * requests they routed teach this router as well: 16 of max_tokens 8 that generated 4 each. */
Test(routerd, a_peers_decisions_teach_too)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    generate("_INBOX.m", "mine", 1, 64);
    cr_assert(eq(u32, last_decision(0).max_tokens, 8), "this router's gossip carries it");
    worker_done(1, kvr_pending_key("_INBOX.m", "mine"));
    uint64_t hashes[2] = {11, 12};
    for (uint64_t k = 1; k <= 16; k++) {
        struct kvr_request_record rec = {500 + k, 1, hashes, 2, 128, 0, false, 0, 8};
        struct kvr_buf b = {0};
        cr_assert(eq(int,
                     kvr_wire_encode_gossip_decision(&b, "r2", 5, k, &rec, "_INBOX.p", "p", "r2",
                                                     kvr_realtime_ns(), 0),
                     KVR_OK));
        gossip_in(&rd, b.data, b.len);
        kvr_buf_free(&b);
        cr_assert(eq(u32, rd.pend.n, 1), "decision %llu booked", (unsigned long long)k);
        worker_streamed(1, 500 + k, KVR_OK, 4);
    }
    cr_assert(eq(u32, kvr_router_expected_output(rd.core, 8), 4));
}

static void select_request(const char *reply, const char *id, bool book);

/* The same lesson from booked selects (their client forwards them) and from dones that come in a
 * worker's EventBatch: 16 requests of max_tokens 8 that each generated 6. */
Test(routerd, booked_selects_and_batched_dones_teach_too)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    struct kvr_wire_event ev[16];
    for (int k = 0; k < 16; k++) {
        char id[16];
        snprintf(id, sizeof id, "s%d", k);
        size_t mark = rec_nsent;
        select_request("_INBOX.s", id, true);
        const struct rec_sent *m = NULL;
        uint64_t wid, key = 0;
        uint32_t overlap, ncand, code;
        cr_assert(eq(int, rec_count("_INBOX.s", mark, &m), 1));
        cr_assert(eq(
            int,
            kvr_wire_decode_select_response(m->data, m->len, &wid, &overlap, &ncand, &code, &key),
            KVR_OK));
        cr_assert(not(eq(u64, key, 0)), "booked");
        ev[k] = (struct kvr_wire_event){
            .kind = KVR_WIRE_EV_DONE,
            .u.done = {.worker_id = 1, .key = key, .status = KVR_OK, .output_tokens = 6}};
    }
    cr_assert(eq(u32, kvr_router_expected_output(rd.core, 8), 8), "nothing has ended yet");
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_batch(&b, 1, ev, 16), KVR_OK));
    kvr_events_on_message(&rd, "kv.default.ev.1.batch", b.data, b.len);
    kvr_buf_free(&b);
    cr_assert(eq(u32, rd.pend.n, 0));
    cr_assert(eq(u32, kvr_router_expected_output(rd.core, 8), 6));
}

/* The intake hashes a prompt before taking the mutex: on the stack up to 256 blocks, in an array
 * of its own past that; either way the router books the prompt's own hashes. */
Test(routerd, prompts_hashed_before_the_lock_are_booked_by_their_own_hashes)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    uint32_t B = cfg.core.block_size, sizes[3] = {B / 2, 10 * B + 3, 300 * B};
    for (uint32_t k = 0; k < 3; k++) {
        char id[16];
        snprintf(id, sizeof id, "h%u", k);
        generate("_INBOX.h", id, 7 + k, sizes[k]);
        struct kvr_request_record rec;
        cr_assert(
            eq(int, kvr_router_export(rd.core, kvr_pending_key("_INBOX.h", id), &rec), KVR_OK));
        uint32_t n = sizes[k] / B;
        cr_assert(eq(u32, rec.nblocks, n));
        uint32_t *t = malloc(sizes[k] * sizeof *t);
        uint64_t *want = malloc((n + 1) * sizeof *want);
        for (uint32_t i = 0; i < sizes[k]; i++)
            t[i] = (7 + k) * 1000 + i; /* as generate() makes them */
        kvr_hash_prompt(t, sizes[k], B, NULL, want);
        cr_assert(n == 0 || memcmp(rec.block_hashes, want, n * sizeof *want) == 0, "prompt %u", k);
        free(t);
        free(want);
    }
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 3));
}

Test(routerd, a_resend_is_absorbed_not_routed_twice)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    generate("_INBOX.c1", "same", 1, 128);
    generate("_INBOX.c1", "same", 1, 128);
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 1));
    cr_assert(eq(u64, rd.fleet->resends, 1));
    cr_assert(eq(u64, rd.generate.errors, 0), "a resend is no error");
    const struct rec_sent *rb = NULL;
    cr_assert(eq(int, rec_count("kv.default.worker.1.rebind", 0, &rb), 1),
              "its worker is asked for the stream so far (the client lacks some of it)");
    cr_assert(eq(str, (char *)rb->reply, "_INBOX.c1"));
    uint64_t got = 0;
    bool again = false;
    cr_assert(eq(int, kvr_wire_decode_worker_rebind(rb->data, rb->len, &got, &again), KVR_OK));
    cr_assert(eq(u64, got, kvr_pending_key("_INBOX.c1", "same")));
    cr_assert(again);
    cr_assert(eq(u64, rd.n.repeats_asked, 1));
    generate("_INBOX.c2", "same", 1, 128); /* another client may use the same id */
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 2));
}

Test(routerd, every_refusal_is_answered_and_counted_by_code)
{
    generate("_INBOX.c1", "nobody", 1, 64);
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count("_INBOX.c1", 0, &m), 1));
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_NO_WORKERS));
    heartbeat(1, 4096, NULL, 0, 1000);
    generate("_INBOX.c2", "empty", 1, 0);
    cr_assert(eq(int, rec_count("_INBOX.c2", 0, &m), 1));
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_EMPTY_PROMPT));
    uint8_t junk[32];
    memset(junk, 0xff, sizeof junk);
    kvr_intake_generate(&rd, "_INBOX.c3", junk, sizeof junk);
    cr_assert(eq(int, rec_count("_INBOX.c3", 0, &m), 1));
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_MALFORMED));
    size_t before = rec_nsent;
    generate(NULL, "no-reply", 1, 64); /* nobody to answer: counted, dropped */
    cr_assert(eq(sz, rec_nsent, before), "nothing is published without a reply subject");
    cr_assert(eq(u64, rd.generate.errors, 4));
    cr_assert(eq(u64, rd.generate.dropped, 1));
    cr_assert(eq(u64, rd.generate.by_code[KVR_ERR_NO_WORKERS], 1));
    cr_assert(eq(u64, rd.generate.by_code[KVR_ERR_EMPTY_PROMPT], 1));
    cr_assert(eq(u64, rd.generate.by_code[KVR_ERR_MALFORMED], 1));
    cr_assert(eq(u64, rd.generate.by_code[KVR_ERR_NO_REPLY], 1));
    cr_assert(eq(u64, rd.generate.requests, 4));
}

/* A decision as gossip brings it: decided by router `origin` (which sends it) for key on worker
 * wid, first at decided_ns, its origin's placement `placement` of it. */
static void peer_decision_at(const char *origin, uint64_t seq, uint64_t key, uint64_t wid,
                             const char *reply, const char *id, uint64_t decided_ns,
                             uint32_t placement)
{
    uint64_t hashes[2] = {11, 12};
    struct kvr_request_record rec = {key, wid, hashes, 2, 128, 0, false, 0, 0};
    struct kvr_buf b = {0};
    cr_assert(eq(int,
                 kvr_wire_encode_gossip_decision(&b, origin, 5, seq, &rec, reply, id, origin,
                                                 decided_ns, placement),
                 KVR_OK));
    gossip_in(&rd, b.data, b.len);
    kvr_buf_free(&b);
}

/* A peer's record of a request that ended here (in a snapshot or a lookup's answer built before
 * that peer heard the end) is not booked again: it stayed booked until a reconcile dropped it,
 * and, this router's own, was then answered a second time. */
Test(routerd, a_stale_record_of_a_request_that_ended_here_is_not_booked_again)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    generate("_INBOX.s", "stale", 1, 128);
    uint64_t key = kvr_pending_key("_INBOX.s", "stale");
    worker_done(1, key);
    struct kvr_request_record out;
    cr_assert(not(eq(int, kvr_router_export(rd.core, key, &out), KVR_OK)), "it ended");
    uint64_t hashes[2] = {11, 12};
    struct kvr_request_record rec = {key, 1, hashes, 2, 128, 0, true, 0, 0}; /* started */
    struct kvr_buf b = {0};
    cr_assert(eq(int,
                 kvr_wire_encode_gossip_decision(&b, "peer", 5, 1, &rec, "_INBOX.s", "stale", "r1",
                                                 kvr_realtime_ns(), 0),
                 KVR_OK));
    size_t mark = rec_nsent;
    gossip_in(&rd, b.data, b.len);
    kvr_buf_free(&b);
    cr_assert(not(eq(int, kvr_router_export(rd.core, key, &out), KVR_OK)), "not booked again");
    cr_assert(eq(ptr, kvr_pending_find(&rd.pend, key), NULL));
    cr_assert(eq(int, rec_count("_INBOX.s", mark, NULL), 0));
    cr_assert(eq(int, rec_count("kv.default.worker.1.cancel", mark, NULL), 0), "nothing to stop");
}

Test(routerd, a_request_that_never_started_is_placed_again_elsewhere)
{
    heartbeat(1, 4096, NULL, 0, 1); /* a 1 ms interval: removed after 3.2 ms of silence */
    generate("_INBOX.c1", "moves", 1, 256);
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 1));
    struct last_decision first = last_decision(0);
    cr_assert(gt(u64, first.decided_ns, 0), "the first decision was gossiped");
    cr_assert(eq(u32, first.placement, 0));
    heartbeat(2, 4096, NULL, 0, 1000);
    kvr_sleep_ns(10 * KVR_NS_PER_MS);
    size_t mark = rec_nsent;
    kvr_timer_tick(&rd, kvr_now_ns(), true, false); /* worker 1 times out */
    cr_assert(eq(int, rec_count("kv.default.worker.2.generate", mark, NULL), 1),
              "placed again on the live worker");
    cr_assert(eq(int, rec_count("_INBOX.c1", 0, NULL), 0), "the client hears no error");
    cr_assert(eq(u64, rd.placed_again, 1));
    cr_assert(eq(int, decisions_since(mark), 1), "the new decision");
    struct last_decision again = last_decision(mark);
    cr_assert(eq(u32, again.placement, 1), "its second placement: peers replace the first one");
    cr_assert(eq(u64, again.decided_ns, first.decided_ns),
              "decided when it first was: how it ranks against another router's decision");
    /* a peer's repair brings this router's first decision back: its own, and older */
    uint64_t key = kvr_pending_key("_INBOX.c1", "moves"), hashes[2] = {11, 12};
    struct kvr_request_record rec = {key, 1, hashes, 2, 128, 0, false, 0, 0};
    struct kvr_buf b = {0};
    cr_assert(eq(int,
                 kvr_wire_encode_gossip_decision(&b, "peer", 5, 1, &rec, "_INBOX.c1", "moves", "r1",
                                                 first.decided_ns, 0),
                 KVR_OK));
    gossip_in(&rd, b.data, b.len);
    kvr_buf_free(&b);
    cr_assert(eq(u64, rd.fleet->late, 1), "taken as known");
    struct kvr_pending *p = kvr_pending_find(&rd.pend, key);
    cr_assert(not(eq(ptr, p, NULL)));
    cr_assert(eq(u64, p->worker_id, 2), "its own latest stands");
    cr_assert(eq(u64, rd.n.conflicts, 0));
    cr_assert(eq(int, rec_count("kv.default.worker.2.cancel", 0, NULL), 0));
}

Test(routerd, a_peer_placing_its_request_again_replaces_its_first_decision)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    heartbeat(2, 4096, NULL, 0, 1000);
    uint64_t key = kvr_pending_key("_INBOX.e", "moved"), t = kvr_realtime_ns();
    peer_decision_at("peer", 1, key, 1, "_INBOX.e", "moved", t, 0);
    struct kvr_pending *p = kvr_pending_find(&rd.pend, key);
    cr_assert(not(eq(ptr, p, NULL)));
    cr_assert(eq(u64, p->worker_id, 1));
    /* worker 1 never had it: its origin placed it again on worker 2 (decided_ns unchanged) */
    peer_decision_at("peer", 2, key, 2, "_INBOX.e", "moved", t, 1);
    cr_assert(eq(u64, p->worker_id, 2), "the later placement of its origin stands");
    cr_assert(eq(u64, rd.n.conflicts, 0), "no conflict: one router's decisions");
    cr_assert(eq(u64, rd.fleet->placed_anew, 1));
    cr_assert(eq(int, rec_count("kv.default.worker.1.cancel", 0, NULL), 0));
    cr_assert(eq(int, rec_count("kv.default.worker.2.cancel", 0, NULL), 0));
    struct kvr_request_record rec;
    cr_assert(eq(int, kvr_router_export(rd.core, key, &rec), KVR_OK));
    cr_assert(eq(u64, rec.worker_id, 2), "booked on worker 2 only");
    /* the first decision again, late (a repair): replaced already */
    peer_decision_at("peer", 1, key, 1, "_INBOX.e", "moved", t, 0);
    cr_assert(eq(u64, p->worker_id, 2));
    cr_assert(eq(u64, rd.n.conflicts, 0));
    /* another router's decision for it, made later than the origin's first: the origin's
     * stands, however often it was placed since (every router ranks by decided_ns alike) */
    peer_decision_at("other", 1, key, 1, "_INBOX.e", "moved", t + 1000, 0);
    cr_assert(eq(u64, p->worker_id, 2));
    cr_assert(eq(u64, rd.n.conflicts, 1));
    worker_done(2, key);
    cr_assert(eq(u32, rd.pend.n, 0), "its done ends it here too");
}

/* Gossip `origin`'s decision number seq for key on worker wid: 8 blocks, over a 4-block worker. */
static void peer_decision_big(const char *origin, uint64_t seq, uint64_t key, uint64_t wid,
                              uint64_t decided_ns, uint32_t placement)
{
    uint64_t many[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct kvr_request_record big = {key, wid, many, 8, 512, 0, false, 0, 0};
    struct kvr_buf b = {0};
    cr_assert(eq(int,
                 kvr_wire_encode_gossip_decision(&b, origin, 5, seq, &big, "_INBOX.u", "unknown",
                                                 origin, decided_ns, placement),
                 KVR_OK));
    gossip_in(&rd, b.data, b.len);
    kvr_buf_free(&b);
}

/* Peers' decisions keep the in-flight bound too (once only this router's own were bounded); one
 * refused for it is counted and logged, and nothing of it is kept. */
Test(routerd, a_peers_decision_past_the_in_flight_bound_is_counted_not_booked)
{
    teardown();
    setup_with(1); /* one request in flight at most */
    heartbeat(1, 4096, NULL, 0, 1000);
    uint64_t t = kvr_realtime_ns();
    uint64_t a = kvr_pending_key("_INBOX.a", "a"), b = kvr_pending_key("_INBOX.b", "b");
    peer_decision_at("peer", 1, a, 1, "_INBOX.a", "a", t, 0);
    peer_decision_at("peer", 2, b, 1, "_INBOX.b", "b", t, 0);
    cr_assert(eq(u64, rd.fleet->imported, 1));
    cr_assert(eq(u64, rd.fleet->import_failed, 1), "counted where an operator sees it");
    cr_assert(eq(ptr, kvr_pending_find(&rd.pend, b), NULL), "nothing of it kept");
    struct kvr_request_record rec;
    cr_assert(eq(int, kvr_router_export(rd.core, b, &rec), KVR_ERR_UNKNOWN_REQUEST));
    /* one whose done came first is not in flight: late, as ever, however full the router is */
    uint64_t c = kvr_pending_key("_INBOX.c", "c");
    worker_done(1, c);
    peer_decision_at("peer", 3, c, 1, "_INBOX.c", "c", t, 0);
    cr_assert(eq(u64, rd.fleet->import_failed, 1));
    cr_assert(eq(u64, rd.fleet->late, 1), "a tombstone");
    /* another refused within 10 s: counted, not logged again (the next line says how many) */
    uint64_t e = kvr_pending_key("_INBOX.e", "e");
    peer_decision_at("peer", 4, e, 1, "_INBOX.e", "e", t, 0);
    cr_assert(eq(u64, rd.fleet->import_failed, 2));
    cr_assert(eq(u64, rd.fleet->import_failed_logged, 1));
}

/* Once open: a decision taking the place of a known one was checked only after the known one's
 * booking was cancelled, so one that no router can book (more blocks than its worker has) left
 * the request pointed at a worker it had no booking on, and stopped the other worker. Now it
 * replaces nothing; one on a worker not heard of yet is still taken (the fleet agrees on it). */
Test(routerd, a_decision_no_router_can_book_replaces_nothing)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    heartbeat(2, 4, NULL, 0, 1000); /* 4 blocks */
    uint64_t key = kvr_pending_key("_INBOX.u", "unknown"), t = kvr_realtime_ns();
    peer_decision_at("peer", 1, key, 1, "_INBOX.u", "unknown", t, 0);
    struct kvr_pending *p = kvr_pending_find(&rd.pend, key);
    cr_assert(not(eq(ptr, p, NULL)));
    /* its origin placed it again on worker 2, with 8 blocks */
    peer_decision_big("peer", 2, key, 2, t, 1);
    cr_assert(eq(u64, rd.fleet->bad, 1));
    cr_assert(eq(u64, rd.fleet->placed_anew, 0));
    /* another router's earlier decision, which would stand, the same way */
    peer_decision_big("other", 1, key, 2, t - 1000, 0);
    cr_assert(eq(u64, rd.fleet->bad, 2));
    cr_assert(eq(u64, rd.n.conflicts, 0));
    cr_assert(eq(int, rec_count("kv.default.worker.1.cancel", 0, NULL), 0), "nobody stopped");
    cr_assert(eq(u64, p->worker_id, 1));
    struct kvr_request_record rec;
    cr_assert(eq(int, kvr_router_export(rd.core, key, &rec), KVR_OK), "still booked");
    cr_assert(eq(u64, rec.worker_id, 1));
    /* placed again on worker 9, which this router has not heard of: taken, booked later */
    peer_decision_at("peer", 3, key, 9, "_INBOX.u", "unknown", t, 2);
    cr_assert(eq(u64, p->worker_id, 9));
    cr_assert(eq(u64, rd.fleet->placed_anew, 1));
    cr_assert(eq(u64, rd.fleet->unknown_worker, 1));
    cr_assert(not(eq(int, kvr_router_export(rd.core, key, &rec), KVR_OK)), "not on worker 1");
}

Test(routerd, a_request_that_started_fails_to_its_client_once)
{
    heartbeat(1, 4096, NULL, 0, 1);
    heartbeat(2, 4096, NULL, 0, 1);
    generate("_INBOX.c1", "started", 1, 256);
    const struct rec_sent *fwd = NULL;
    int on1 = rec_count("kv.default.worker.1.generate", 0, &fwd);
    uint64_t wid = on1 ? 1 : 2;
    uint64_t key = kvr_pending_key("_INBOX.c1", "started");
    struct kvr_buf b = {0};
    char subject[64];
    snprintf(subject, sizeof subject, "kv.default.ev.%llu.tokens", (unsigned long long)wid);
    cr_assert(eq(int, kvr_wire_encode_tokens(&b, wid, key, KVR_WIRE_PREFILL_DONE), KVR_OK));
    kvr_events_on_message(&rd, subject, b.data, b.len); /* its first token: it started */
    kvr_buf_free(&b);
    kvr_sleep_ns(10 * KVR_NS_PER_MS);
    heartbeat(3 - wid, 4096, NULL, 0, 1); /* the other one lives on; the request's dies */
    kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count("_INBOX.c1", 0, &m), 1), "exactly one answer");
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_WORKER_LOST));
    cr_assert(eq(u64, rd.placed_again, 0));
    cr_assert(eq(u32, rd.pend.n, 0));
}

Test(routerd, a_queued_request_is_forwarded_when_load_frees)
{
    busy_above_half();
    heartbeat(1, 8, NULL, 0, 1000); /* 8 blocks of 64 tokens: busy above 4 */
    generate("_INBOX.a", "first", 1, 320);
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 1));
    generate("_INBOX.b", "second", 2, 320);
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 1), "it waits");
    cr_assert(eq(int, rec_count("_INBOX.b", 0, NULL), 0), "waiting is no error");
    cr_assert(eq(u32, rd.pend.n, 2));
    worker_done(1, kvr_pending_key("_INBOX.a", "first"));
    const struct rec_sent *fwd = NULL;
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, &fwd), 2), "placed");
    cr_assert(eq(str, (char *)fwd->reply, "_INBOX.b"));
    cr_assert(eq(int, decisions_since(0), 2));
}

/* A peer's decision for request "orphan", made at time 0. */
static void peer_decision(const char *peer, uint64_t seq, uint64_t key, uint64_t wid,
                          const char *reply)
{
    peer_decision_at(peer, seq, key, wid, reply, "orphan", 0, 0);
}

Test(routerd, an_orphan_is_answered_after_its_grace_by_the_smallest_live_id)
{
    strcpy(cfg.id, "a-first"); /* smaller than the peer's id: this router stands in */
    heartbeat(1, 4096, NULL, 0, 1);
    peer_decision("z-peer", 1, 4242, 1, "_INBOX.o");
    cr_assert(eq(u32, rd.pend.n, 1));
    cr_assert(eq(u64, rd.fleet->imported, 1));
    kvr_sleep_ns(12 * KVR_NS_PER_MS); /* the peer is silent for 3.5 hellos; worker 1 too */
    kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    cr_assert(eq(int, rec_count("_INBOX.o", 0, NULL), 0), "not within the grace period");
    cr_assert(eq(u32, rd.pend.norphans, 1));
    kvr_sleep_ns(20 * KVR_NS_PER_MS); /* 8 hellos */
    kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count("_INBOX.o", 0, &m), 1), "answered once its grace is over");
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_WORKER_LOST));
    cr_assert(eq(u64, rd.fleet->orphans_answered, 1));
    cr_assert(eq(u32, rd.pend.n, 0));
}

/* A peer's booked select has no client to tell (its client forwards it itself): orphaned when its
 * worker is lost while its origin is silent, it is dropped after the grace without a word, and
 * not counted as an orphan answered (it was: orphans_answered 1, no answer sent). */
Test(routerd, a_peers_booked_select_orphaned_is_not_counted_answered)
{
    strcpy(cfg.id, "a-first"); /* smaller than the peer's id: this router stands in */
    heartbeat(1, 4096, NULL, 0, 1);
    peer_decision("z-peer", 1, 4343, 1, ""); /* booked: no reply subject */
    cr_assert(eq(u32, rd.pend.n, 1));
    kvr_sleep_ns(12 * KVR_NS_PER_MS); /* the peer is silent for 3.5 hellos; worker 1 too */
    kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    cr_assert(eq(u32, rd.pend.norphans, 1));
    kvr_sleep_ns(20 * KVR_NS_PER_MS); /* 8 hellos */
    kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    cr_assert(eq(u32, rd.pend.n, 0), "dropped once its grace is over");
    cr_assert(eq(u64, rd.generate.errors, 0));
    cr_assert(eq(u64, rd.fleet->orphans_answered, 0), "nobody was answered");
}

Test(routerd, a_live_origin_answers_its_own_failed_requests)
{
    cfg.hello_ns = 500 * KVR_NS_PER_MS; /* the peer stays alive however slow the run (valgrind) */
    heartbeat(1, 4096, NULL, 0, 1);
    peer_decision("a-peer", 1, 777, 1, "_INBOX.p");
    /* the peer is heard (hellos keep it alive); worker 1 dies: the origin answers, not us */
    struct kvr_buf b = {0};
    for (int i = 0; i < 3; i++) {
        kvr_sleep_ns(4 * KVR_NS_PER_MS);
        cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, "a-peer", 5, 1, true), KVR_OK));
        gossip_in(&rd, b.data, b.len);
        kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    }
    kvr_buf_free(&b);
    cr_assert(eq(int, rec_count("_INBOX.p", 0, NULL), 0));
    cr_assert(eq(u32, rd.pend.n, 0), "dropped here: its origin tells the client");
}

Test(routerd, a_gossip_gap_asks_its_origin_for_a_repair)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    peer_decision("peer", 1, 1001, 1, "_INBOX.x");
    peer_decision("peer", 4, 1004, 1, "_INBOX.y"); /* 2 and 3 never came */
    cr_assert(eq(u64, rd.fleet->gaps, 2));
    const struct rec_sent *ask = NULL;
    cr_assert(eq(int, rec_count("kv.default.router.sync.peer", 0, &ask), 1));
    struct kvr_wire_sync q;
    cr_assert(eq(int, kvr_wire_decode_sync(ask->data, ask->len, &q), KVR_OK));
    cr_assert(eq(u64, q.from_seq, 2));
    cr_assert(eq(u64, q.to_seq, 3));
    cr_assert(eq(str, (char *)ask->reply, rd.fleet->subj_pages));
    kvr_wire_sync_free(&q);
}

Test(routerd, forged_and_malformed_events_are_counted_and_dropped)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    uint8_t junk[16];
    memset(junk, 0xff, sizeof junk);
    kvr_events_on_message(&rd, "kv.default.ev.1.kv", junk, sizeof junk);
    kvr_events_on_message(&rd, "kv.default.ev.x.hb", junk, sizeof junk);
    kvr_events_on_message(&rd, "kv.default.ev.1.nope", junk, sizeof junk);
    kvr_events_on_message(&rd, "kv.default.ev.01.done", junk, sizeof junk);
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_done(&b, 2, 55, 0, 0), KVR_OK));
    kvr_events_on_message(&rd, "kv.default.ev.1.done", b.data, b.len); /* names worker 2 */
    kvr_buf_free(&b);
    cr_assert(eq(u64, rd.ev_errors, 5));
    generate("_INBOX.ok", "still", 1, 64);
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 1), "still serving");
}

Test(routerd, a_booked_select_is_pending_and_gossiped)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    uint32_t t[128];
    for (int i = 0; i < 128; i++)
        t[i] = (uint32_t)i;
    struct kvr_buf req = {0}, sel = {0};
    cr_assert(eq(int, kvr_wire_encode_generate(&req, "sel", t, 128, 4, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_encode_select_request(&sel, req.data, req.len, true), KVR_OK));
    kvr_intake_select(&rd, "_INBOX.s", sel.data, sel.len);
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count("_INBOX.s", 0, &m), 1));
    uint64_t wid = 0, key = 0;
    uint32_t overlap, ncand, code = 99;
    cr_assert(eq(
        int, kvr_wire_decode_select_response(m->data, m->len, &wid, &overlap, &ncand, &code, &key),
        KVR_OK));
    cr_assert(eq(u32, code, 0));
    cr_assert(eq(u64, wid, 1));
    cr_assert(eq(u64, key, kvr_pending_key("_INBOX.s", "sel")));
    cr_assert(eq(u32, rd.pend.n, 1));
    cr_assert(eq(int, decisions_since(0), 1));
    kvr_intake_select(&rd, "_INBOX.s", sel.data, sel.len); /* the same booked again */
    cr_assert(eq(int, rec_count("_INBOX.s", 0, &m), 2));
    cr_assert(eq(
        int, kvr_wire_decode_select_response(m->data, m->len, &wid, &overlap, &ncand, &code, &key),
        KVR_OK));
    cr_assert(eq(u32, code, KVR_ERR_DUPLICATE));
    cr_assert(eq(u64, rd.select.by_code[KVR_ERR_DUPLICATE], 1));
    kvr_buf_free(&req);
    kvr_buf_free(&sel);
}

Test(routerd, a_request_key_covers_the_whole_reply_subject_and_id)
{
    char a[1100], b[1100];
    memset(a, 'x', sizeof a - 1);
    a[sizeof a - 1] = 0;
    memcpy(b, a, sizeof a);
    b[1050] = 'y'; /* the same first 1,050 bytes */
    cr_assert(ne(u64, kvr_pending_key(a, "id"), kvr_pending_key(b, "id")));
    char id1[257], id2[257];
    memset(id1, 'i', 256);
    id1[256] = 0;
    memcpy(id2, id1, sizeof id1);
    id2[255] = 'j';
    a[1024] = 0; /* the longest reply subject the fleet takes, and the longest id */
    cr_assert(ne(u64, kvr_pending_key(a, id1), kvr_pending_key(a, id2)),
              "the id's last byte counts");
    /* short keys are what they always were: XXH3 of "<reply>\0<id>" */
    cr_assert(
        eq(u64, kvr_pending_key("_INBOX.c1", "req-1"), kvr_hash_bytes("_INBOX.c1\0req-1", 15)));
    heartbeat(1, 4096, NULL, 0, 1000);
    char longer[1100];
    memset(longer, 'z', 1099);
    memcpy(longer, "_INBOX.", 7);
    longer[1099] = 0;
    size_t mark = rec_nsent;
    generate(longer, "too-long", 1, 64);
    cr_assert(eq(sz, rec_nsent, mark + 1),
              "one answer, to the client (its subject is cut in the record)");
    cr_assert(eq(u32, rec_error_in(&rec_sent[mark]), KVR_ERR_REPLY_TOO_LONG),
              "a reply subject peers cannot take is refused");
    cr_assert(eq(u64, rd.generate.by_code[KVR_ERR_REPLY_TOO_LONG], 1));
}

/* --- the client contract (docs/protocol.md) ----------------------------------------------- */

/* The chunk m as decoded (free it). */
static struct kvr_wire_response chunk(const struct rec_sent *m)
{
    struct kvr_wire_response r;
    cr_assert(eq(int, kvr_wire_decode_response(m->data, m->len, &r), KVR_OK));
    return r;
}

static void cancel_request(const char *reply, const char *id)
{
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_cancel(&b, id, reply), KVR_OK));
    kvr_intake_cancel(&rd, b.data, b.len);
    kvr_buf_free(&b);
}

Test(routerd, a_resend_after_the_end_asks_its_worker_for_a_repeat)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    generate("_INBOX.e", "done-once", 1, 128);
    uint64_t key = kvr_pending_key("_INBOX.e", "done-once");
    worker_done(1, key);
    size_t mark = rec_nsent;
    generate("_INBOX.e", "done-once", 1, 128);
    const struct rec_sent *rb = NULL;
    cr_assert(eq(int, rec_count("kv.default.worker.1.rebind", mark, &rb), 1),
              "its worker is asked to publish the stream again");
    cr_assert(eq(sz, rec_nsent, mark + 1), "and nothing else: no second forward, no chunk");
    cr_assert(eq(str, (char *)rb->reply, "_INBOX.e"), "the client's reply: the server's grant");
    uint64_t got = 0;
    bool again = false;
    cr_assert(eq(int, kvr_wire_decode_worker_rebind(rb->data, rb->len, &got, &again), KVR_OK));
    cr_assert(eq(u64, got, key));
    cr_assert(again, "a repeat, not a rebind after a cut");
    cr_assert(eq(u64, rd.n.resends_after_end, 1));
    cr_assert(eq(u64, rd.n.repeats_asked, 1));
    generate("_INBOX.e", "another", 1, 128);
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", mark, NULL), 1));
}

/* Heartbeat h of worker h.info.id (block size 64, capacity 4096), on its subject. */
static void heartbeat_as(struct kvr_wire_heartbeat h)
{
    h.info.block_size = 64;
    h.info.capacity_blocks = 4096;
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &h), KVR_OK));
    event_in(h.info.id, "hb", &b);
}

/* Worker wid's heartbeat (a 1 ms interval) from its process `instance`. */
static void heartbeat_of(uint64_t wid, uint64_t instance)
{
    heartbeat_as(
        (struct kvr_wire_heartbeat){.info = {.id = wid}, .interval_ms = 1, .instance = instance});
}

/* The answer on reply since mark, if it is the one final ERR_WORKER_LOST naming worker wid and
 * nothing went to that worker's rebind subject. */
static void answered_worker_lost(const char *reply, size_t mark, uint64_t wid)
{
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count("kv.default.worker.1.rebind", mark, NULL), 0), "nobody to ask");
    cr_assert(eq(int, rec_count(reply, mark, &m), 1), "the resend is answered");
    struct kvr_wire_response r = chunk(m);
    cr_assert(r.final);
    cr_assert(eq(u32, r.error_code, KVR_ERR_WORKER_LOST));
    cr_assert(eq(u64, r.worker_id, wid));
    kvr_wire_response_free(&r);
}

/* A worker that left and came back under the same id (a rolling restart) is another process: the
 * streams kept for a resend went with the one that ended them, and a repeat asked of the new one
 * is counted there as bad, in silence. Its registry entry alone said nothing of it (back before
 * its silence wrote it off, or written off and joined again), so the client resent into silence
 * until it gave up; it is answered ERR_WORKER_LOST naming the worker, as when the worker is gone.
 * The same process heard again is still asked for the repeat. */
Test(routerd, a_resend_after_the_end_whose_worker_restarted_is_answered_worker_lost)
{
    heartbeat_of(1, 0xa);
    generate("_INBOX.r", "fast", 1, 128);
    generate("_INBOX.r", "slow", 2, 128);
    worker_done(1, kvr_pending_key("_INBOX.r", "fast"));
    worker_done(1, kvr_pending_key("_INBOX.r", "slow"));
    heartbeat_of(1, 0xa); /* the same process */
    size_t mark = rec_nsent;
    generate("_INBOX.r", "fast", 1, 128);
    cr_assert(eq(int, rec_count("kv.default.worker.1.rebind", mark, NULL), 1), "asked to repeat");
    /* restarted before its silence told (3.2 intervals) */
    heartbeat_of(1, 0xb);
    mark = rec_nsent;
    generate("_INBOX.r", "fast", 1, 128);
    answered_worker_lost("_INBOX.r", mark, 1);
    /* written off, then back: a new process */
    kvr_sleep_ns(10 * KVR_NS_PER_MS);
    kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    cr_assert(
        eq(int, kvr_router_worker_load(rd.core, 1, NULL, NULL, NULL), KVR_ERR_UNKNOWN_WORKER));
    heartbeat_of(1, 0xc);
    mark = rec_nsent;
    generate("_INBOX.r", "slow", 2, 128);
    answered_worker_lost("_INBOX.r", mark, 1);
    cr_assert(eq(u64, rd.n.resends_worker_gone, 2));
}

Test(routerd, a_cancel_reaches_the_worker_or_the_queue_or_waits_for_its_request)
{
    busy_above_half();
    heartbeat(1, 8, NULL, 0, 1000); /* 8 blocks: one 320-token request makes it busy */
    generate("_INBOX.a", "running", 1, 320);
    generate("_INBOX.b", "queued", 2, 320);
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 1));
    cancel_request("_INBOX.a", "running");
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count("kv.default.worker.1.cancel", 0, &m), 1), "its worker is told");
    struct kvr_wire_worker_cancel c;
    cr_assert(eq(int, kvr_wire_decode_worker_cancel(m->data, m->len, &c), KVR_OK));
    cr_assert(eq(u64, c.key, kvr_pending_key("_INBOX.a", "running")));
    cr_assert(eq(int, c.reason, KVR_ERR_CANCELLED));
    cr_assert(not(c.silent));
    cancel_request("_INBOX.b", "queued"); /* waiting here: this router answers */
    cr_assert(eq(int, rec_count("_INBOX.b", 0, &m), 1));
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_CANCELLED));
    cr_assert(eq(u32, kvr_router_queue_len(rd.core), 0));
    cancel_request("_INBOX.c", "early"); /* before its request */
    generate("_INBOX.c", "early", 3, 64);
    cr_assert(eq(int, rec_count("_INBOX.c", 0, &m), 1), "answered at once");
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_CANCELLED));
    generate("_INBOX.c", "early", 3, 64);
    cr_assert(eq(int, rec_count("_INBOX.c", 0, NULL), 1), "once");
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 1));
}

Test(routerd, of_two_decisions_for_one_request_the_earlier_stands)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    heartbeat(2, 4096, NULL, 0, 1000);
    generate("_INBOX.d", "twice", 1, 128);
    uint64_t key = kvr_pending_key("_INBOX.d", "twice");
    struct kvr_pending *p = kvr_pending_find(&rd.pend, key);
    cr_assert(not(eq(ptr, p, NULL)));
    uint64_t mine = p->worker_id, theirs = mine == 1 ? 2 : 1;
    /* a peer decided the same request a moment earlier, on the other worker */
    uint64_t hashes[2] = {11, 12};
    struct kvr_request_record rec = {key, theirs, hashes, 2, 128, 0, false, 0, 0};
    struct kvr_buf b = {0};
    cr_assert(eq(int,
                 kvr_wire_encode_gossip_decision(&b, "peer", 5, 1, &rec, "_INBOX.d", "twice",
                                                 "peer", p->decided_ns - 1, 0),
                 KVR_OK));
    gossip_in(&rd, b.data, b.len);
    char subject[64];
    snprintf(subject, sizeof subject, "kv.default.worker.%llu.cancel", (unsigned long long)mine);
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count(subject, 0, &m), 1), "this router stops its own worker");
    struct kvr_wire_worker_cancel c;
    cr_assert(eq(int, kvr_wire_decode_worker_cancel(m->data, m->len, &c), KVR_OK));
    cr_assert(c.silent, "without a chunk: the client hears the other worker only");
    cr_assert(eq(u64, p->worker_id, theirs));
    cr_assert(eq(u64, rd.n.superseded, 1));
    /* its prefill counts where the peer's decision put it, as on the peer, not twice */
    kvr_router_tick(rd.core, kvr_now_ns());
    struct kvr_worker_view v[2];
    cr_assert(eq(u32, kvr_router_workers(rd.core, v, 2), 2));
    cr_assert(gt(dbl, v[theirs - 1].prefill_share, 0.0));
    cr_assert(lt(dbl, v[mine - 1].prefill_share, v[theirs - 1].prefill_share * 1e-9),
              "this router's own decision never stood: %g", v[mine - 1].prefill_share);
    worker_done(mine, key); /* the stopped copy's done frees nothing */
    cr_assert(eq(u32, rd.pend.n, 1));
    cr_assert(eq(u64, rd.n.stale_events, 1));
    /* the same decision again (a repair) is no conflict; a later one loses */
    gossip_in(&rd, b.data, b.len);
    cr_assert(eq(u64, rd.n.conflicts, 1));
    worker_done(theirs, key);
    cr_assert(eq(u32, rd.pend.n, 0));
    kvr_buf_free(&b);
}

static void prefill_done(uint64_t wid, uint64_t key)
{
    struct kvr_buf b = {0};
    char subject[64];
    snprintf(subject, sizeof subject, "kv.default.ev.%llu.tokens", (unsigned long long)wid);
    cr_assert(eq(int, kvr_wire_encode_tokens(&b, wid, key, KVR_WIRE_PREFILL_DONE), KVR_OK));
    kvr_events_on_message(&rd, subject, b.data, b.len);
    kvr_buf_free(&b);
}

Test(routerd, a_queued_request_fails_at_once_when_the_last_worker_leaves)
{
    busy_above_half();
    heartbeat(1, 8, NULL, 0, 1); /* a 1 ms interval: gone after 3.2 ms of silence */
    generate("_INBOX.a", "fills", 1, 320);
    prefill_done(1, kvr_pending_key("_INBOX.a", "fills")); /* it started: it cannot move */
    generate("_INBOX.b", "waits", 2, 320);
    cr_assert(eq(u32, kvr_router_queue_len(rd.core), 1));
    kvr_sleep_ns(10 * KVR_NS_PER_MS);
    kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count("_INBOX.b", 0, &m), 1));
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_NO_WORKERS),
              "not overloaded after the queue timeout");
    cr_assert(eq(int, rec_count("_INBOX.a", 0, &m), 1));
    struct kvr_wire_response r = chunk(m);
    cr_assert(eq(u32, r.error_code, KVR_ERR_WORKER_LOST));
    cr_assert(eq(u64, r.worker_id, 1), "worker lost names the worker");
    kvr_wire_response_free(&r);
    /* and the worker, if alive after all (paused), is told to stop it without a word: its stream
     * went on past the client's final, a second final at its end */
    cr_assert(eq(int, rec_count("kv.default.worker.1.cancel", 0, &m), 1));
    struct kvr_wire_worker_cancel c;
    cr_assert(eq(int, kvr_wire_decode_worker_cancel(m->data, m->len, &c), KVR_OK));
    cr_assert(eq(u64, c.key, kvr_pending_key("_INBOX.a", "fills")));
    cr_assert(c.silent);
}

Test(routerd, a_deadline_ends_a_queued_request)
{
    busy_above_half();
    heartbeat(1, 8, NULL, 0, 1000);
    generate("_INBOX.a", "fills", 1, 320);
    uint32_t t[512];
    for (uint32_t i = 0; i < 512; i++)
        t[i] = 9000 + i;
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_generate(&b, "hurry", t, 512, 8, NULL), KVR_OK));
    uint8_t deadline[] = {0x28, 0x05}; /* GenerateRequest.deadline_ms = 5 */
    kvr_buf_reserve(&b, b.len + sizeof deadline);
    memcpy(b.data + b.len, deadline, sizeof deadline);
    kvr_intake_generate(&rd, "_INBOX.h", b.data, b.len + sizeof deadline);
    kvr_buf_free(&b);
    cr_assert(eq(int, rec_count("_INBOX.h", 0, NULL), 0), "it waits");
    struct kvr_wire_queued q = {0};
    cr_assert(eq(int, queued_notices(0, false, &q), 1));
    cr_assert(le(u32, q.wait_ms, 5), "its peers hold it no longer than its deadline");
    free(q.reply);
    free(q.request_id);
    kvr_sleep_ns(10 * KVR_NS_PER_MS);
    kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count("_INBOX.h", 0, &m), 1));
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_DEADLINE));
    generate("_INBOX.h", "hurry", 1, 64); /* a resend now: it ended, as after a cancel */
    cr_assert(eq(int, rec_count("_INBOX.h", 0, NULL), 1), "ignored");
    cr_assert(eq(u64, rd.n.resends_after_end, 1));
}

Test(routerd, the_deadline_a_worker_gets_never_ends_a_request_early)
{
    struct kvr_pending p = {0};
    uint64_t now = 1000 * KVR_NS_PER_S;
    cr_assert(eq(u32, kvr_send_deadline_left(&p, now), 0), "no deadline");
    p.deadline_ns = now + 299 * KVR_NS_PER_MS + KVR_NS_PER_MS / 2;
    cr_assert(eq(u32, kvr_send_deadline_left(&p, now), 300), "299.5 ms left: 300, never 299");
    p.deadline_ns = now + 300 * KVR_NS_PER_MS;
    cr_assert(eq(u32, kvr_send_deadline_left(&p, now), 300));
    p.deadline_ns = now + 1000;
    cr_assert(eq(u32, kvr_send_deadline_left(&p, now), 1));
    p.deadline_ns = now - 1;
    cr_assert(eq(u32, kvr_send_deadline_left(&p, now), 1), "past: the least there is");
}

static void select_request(const char *reply, const char *id, bool book)
{
    uint32_t t[128];
    for (uint32_t i = 0; i < 128; i++)
        t[i] = 5000 + i;
    struct kvr_buf g = {0}, b = {0};
    cr_assert(eq(int, kvr_wire_encode_generate(&g, id, t, 128, 8, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_encode_select_request(&b, g.data, g.len, book), KVR_OK));
    kvr_intake_select(&rd, reply, b.data, b.len);
    kvr_buf_free(&g);
    kvr_buf_free(&b);
}

Test(routerd, a_select_has_a_key_only_when_booked_and_a_booking_expires)
{
    cfg.booking_ttl_ns = 5 * KVR_NS_PER_MS;
    heartbeat(1, 4096, NULL, 0, 1000);
    select_request("_INBOX.s", "look", false);
    const struct rec_sent *m = NULL;
    uint64_t wid, key = 1;
    uint32_t overlap, ncand, code;
    cr_assert(eq(int, rec_count("_INBOX.s", 0, &m), 1));
    cr_assert(eq(
        int, kvr_wire_decode_select_response(m->data, m->len, &wid, &overlap, &ncand, &code, &key),
        KVR_OK));
    cr_assert(eq(u64, key, 0), "nothing booked, no key");
    cr_assert(eq(u32, rd.pend.n, 0));
    size_t mark = rec_nsent;
    select_request("_INBOX.s", "book", true);
    cr_assert(eq(int, rec_count("_INBOX.s", mark, &m), 1));
    cr_assert(eq(
        int, kvr_wire_decode_select_response(m->data, m->len, &wid, &overlap, &ncand, &code, &key),
        KVR_OK));
    cr_assert(not(eq(u64, key, 0)));
    cr_assert(eq(int, decisions_since(mark), 1), "gossiped in the same call");
    heartbeat(1, 4096, NULL, 0, 1000); /* the worker does not hold it: still booked (TTL) */
    cr_assert(eq(u32, rd.pend.n, 1));
    kvr_sleep_ns(10 * KVR_NS_PER_MS);
    kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    cr_assert(eq(u32, rd.pend.n, 0), "never forwarded: dropped after its TTL");
    cr_assert(eq(u64, rd.n.bookings_expired, 1));
}

/* A booked select has no client to tell when its worker is lost (its client forwards it itself):
 * it goes without a word, and no generate counts it dropped for want of a reply subject (one did,
 * logged request_dropped). */
Test(routerd, a_booked_select_on_a_lost_worker_counts_no_generate_error)
{
    heartbeat(1, 4096, NULL, 0, 1);
    select_request("_INBOX.s", "booked", true);
    uint64_t key = kvr_pending_key("_INBOX.s", "booked");
    prefill_done(1, key); /* its client forwarded it: started */
    heartbeat(2, 4096, NULL, 0, 1000);
    kvr_sleep_ns(10 * KVR_NS_PER_MS); /* worker 1 is silent for 3.2 of its intervals */
    kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    cr_assert(eq(ptr, kvr_pending_find(&rd.pend, key), NULL), "forgotten");
    cr_assert(eq(u64, rd.generate.errors, 0));
    cr_assert(eq(u64, rd.generate.dropped, 0));
}

/*
 * A worker behind on its messages may take a request its heartbeats never listed, after its
 * origin judged that it never reached it and placed it again: that worker's events are then stale,
 * also while the request waits in the queue on no worker. Before, such a copy's prefill_done let
 * the request's bytes go (it could no longer be placed again), and its done dropped the request
 * while the core still held it queued: the client's resend was then refused as a duplicate.
 */
Test(routerd, events_of_the_worker_a_request_left_are_stale)
{
    busy_above_half();
    heartbeat(1, 8, NULL, 0, 10); /* 8 blocks: one 320-token request makes it busy */
    generate("_INBOX.k", "late", 1, 320);
    generate("_INBOX.j", "next", 2, 320); /* queued behind it */
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 1));
    uint64_t key = kvr_pending_key("_INBOX.k", "late"), other = key ^ 1;
    kvr_sleep_ns(25 * KVR_NS_PER_MS); /* past the grace of two 10 ms intervals */
    heartbeat(1, 8, &other, 1, 10);   /* a first strike */
    kvr_sleep_ns(15 * KVR_NS_PER_MS);
    heartbeat(1, 8, &other, 1, 10); /* the second: dropped; the queued one takes worker 1 */
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 2));
    struct kvr_pending *p = kvr_pending_find(&rd.pend, key);
    cr_assert(not(eq(ptr, p, NULL)));
    cr_assert(eq(u64, p->worker_id, 0), "waiting in the queue, on no worker");
    uint64_t stale = rd.n.stale_events;
    prefill_done(1, key); /* worker 1 found the first forward in its queue after all */
    worker_done(1, key);
    cr_assert(eq(u64, rd.n.stale_events, stale + 2));
    cr_assert(eq(ptr, kvr_pending_find(&rd.pend, key), p), "still the fleet's to place");
    cr_assert(not(eq(ptr, p->raw, NULL)), "its bytes kept: it has not started anywhere");
    size_t mark = rec_nsent;
    /* worker 1 still beats, holding the one queued behind (judged by a 10 ms interval, a slow
     * run, valgrind's, had it lost and that one placed on worker 2 too) */
    uint64_t next = kvr_pending_key("_INBOX.j", "next");
    heartbeat(1, 8, &next, 1, 10);
    heartbeat(2, 4096, NULL, 0, 1000); /* a worker with room: placed there */
    kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    cr_assert(eq(int, rec_count("kv.default.worker.2.generate", mark, NULL), 1));
    cr_assert(eq(u64, p->worker_id, 2));
    worker_done(1, key); /* late again */
    cr_assert(eq(ptr, kvr_pending_find(&rd.pend, key), p));
    mark = rec_nsent;
    generate("_INBOX.k", "late", 1, 320); /* its client's resend */
    cr_assert(eq(int, rec_count("_INBOX.k", mark, NULL), 0), "absorbed, not refused");
    worker_done(2, key);
    cr_assert(eq(ptr, kvr_pending_find(&rd.pend, key), NULL), "ended where it was served");
}

/*
 * A worker that says forwards wait in its queue may hold any request it does not list yet: none
 * is judged never to have reached it, however long that lasts, and a first strike is cleared;
 * once its queue is empty, two strikes drop one as before. (An overloaded machine: adapters
 * seconds behind on their messages had their requests placed elsewhere and served twice.)
 */
Test(routerd, a_worker_with_forwards_waiting_is_not_judged_to_miss_any)
{
    heartbeat(1, 4096, NULL, 0, 10);
    generate("_INBOX.w", "waits", 1, 128);
    uint64_t key = kvr_pending_key("_INBOX.w", "waits"), other = key ^ 1;
    kvr_sleep_ns(25 * KVR_NS_PER_MS);             /* past the grace of two 10 ms intervals */
    heartbeat_waiting(1, 4096, &other, 1, 10, 0); /* a first strike */
    for (int i = 0; i < 4; i++) {                 /* then seconds of backlog, at 10 ms */
        kvr_sleep_ns(15 * KVR_NS_PER_MS);
        heartbeat_waiting(1, 4096, &other, 1, 10, 3);
    }
    struct kvr_router_stats st;
    kvr_router_stats(rd.core, &st);
    cr_assert(eq(u64, st.reconciled, 0), "it may be in the worker's queue");
    cr_assert(eq(u64, rd.placed_again, 0));
    cr_assert(eq(u64, rd.fleet->reconcile_waits, 4));
    kvr_sleep_ns(15 * KVR_NS_PER_MS);
    /* the queue is empty: a first strike again, not a second */
    heartbeat_waiting(1, 4096, &other, 1, 10, 0);
    kvr_router_stats(rd.core, &st);
    cr_assert(eq(u64, st.reconciled, 0), "the strike before the backlog was cleared");
    kvr_sleep_ns(15 * KVR_NS_PER_MS);
    heartbeat_waiting(1, 4096, &other, 1, 10, 0);
    kvr_router_stats(rd.core, &st);
    cr_assert(eq(u64, st.reconciled, 1), "never reached it after all");
    cr_assert(eq(u64, rd.placed_again, 1));
    char *text = metrics_text();
    cr_assert(not(eq(ptr, strstr(text, "kvrouter_replication_reconcile_waits_total 4"), NULL)));
    free(text);
}

/*
 * A request its client cancelled while its forward was lost on its way (its worker, told to
 * stop, only remembers the cancel) is answered "cancelled" when the heartbeats show it never
 * reached its worker, not placed again: it was, on worker 2, which streamed all of it.
 */
Test(routerd, a_cancelled_request_that_never_reached_its_worker_is_not_placed_again)
{
    heartbeat(1, 4096, NULL, 0, 10);
    generate("_INBOX.x", "lost", 1, 128); /* its forward is lost on its way */
    uint64_t key = kvr_pending_key("_INBOX.x", "lost"), other = key ^ 1;
    cancel_request("_INBOX.x", "lost");
    cr_assert(eq(int, rec_count("kv.default.worker.1.cancel", 0, NULL), 1));
    heartbeat(2, 4096, NULL, 0, 1000);
    kvr_sleep_ns(25 * KVR_NS_PER_MS);  /* past the grace of two 10 ms intervals */
    heartbeat(1, 4096, &other, 1, 10); /* a first strike */
    kvr_sleep_ns(15 * KVR_NS_PER_MS);
    heartbeat(1, 4096, &other, 1, 10); /* the second: it never reached worker 1 */
    kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    cr_assert(eq(int, rec_count("kv.default.worker.2.generate", 0, NULL), 0), "not placed again");
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count("_INBOX.x", 0, &m), 1), "answered once");
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_CANCELLED));
    cr_assert(eq(ptr, kvr_pending_find(&rd.pend, key), NULL));
}

/* A heartbeat's interval judges a forward missing within the router's bounds, as it judges the
 * worker's silence: one of 1 ms (real, or forged) judged a forward still on its way missing 2 ms
 * after it was sent, and had it placed again (served twice). */
Test(routerd, a_forward_is_judged_missing_by_an_interval_within_bounds)
{
    cfg.heartbeat_min_ns = 200 * KVR_NS_PER_MS; /* room for a slow run (valgrind) */
    restart();
    heartbeat(1, 4096, NULL, 0, 1);
    generate("_INBOX.t", "on its way", 1, 128);
    uint64_t other = kvr_pending_key("_INBOX.t", "on its way") ^ 1;
    for (int i = 0; i < 3; i++) { /* 15 ms of heartbeats that do not list it yet */
        kvr_sleep_ns(5 * KVR_NS_PER_MS);
        heartbeat(1, 4096, &other, 1, 1);
    }
    struct kvr_router_stats st;
    kvr_router_stats(rd.core, &st);
    cr_assert(eq(u64, st.reconciled, 0), "within two bounded intervals (400 ms): not missing");
    cr_assert(eq(u64, rd.placed_again, 0));
    kvr_sleep_ns(410 * KVR_NS_PER_MS);
    heartbeat(1, 4096, &other, 1, 1); /* a first strike */
    kvr_sleep_ns(205 * KVR_NS_PER_MS);
    heartbeat(1, 4096, &other, 1, 1); /* the second, half the grace later */
    kvr_router_stats(rd.core, &st);
    cr_assert(eq(u64, st.reconciled, 1), "past them, two strikes drop it as before");
}

/* A heartbeat's held keys (sorted before the mutex) and the live select bookings are merged into
 * one sorted list for the reconcile: a booking the worker cannot hold yet is kept, a held request
 * too, and only the forwarded request the worker does not hold is dropped, at the second strike. */
Test(routerd, a_heartbeat_reconciles_held_keys_and_live_bookings_together)
{
    heartbeat(1, 4096, NULL, 0, 10);
    generate("_INBOX.g", "held", 1, 128);
    generate("_INBOX.x", "lost", 2, 128);
    select_request("_INBOX.s", "booked", true);
    uint64_t held = kvr_pending_key("_INBOX.g", "held"), lost = kvr_pending_key("_INBOX.x", "lost");
    uint64_t booked = kvr_pending_key("_INBOX.s", "booked");
    cr_assert(eq(u32, rd.pend.n, 3));
    uint64_t keys[3] = {held, held ^ 1, held ^ 2}; /* and two the router does not know */
    kvr_sleep_ns(25 * KVR_NS_PER_MS);              /* past the grace of two 10 ms intervals */
    heartbeat(1, 4096, keys, 3, 10);               /* a first strike */
    kvr_sleep_ns(15 * KVR_NS_PER_MS);
    heartbeat(1, 4096, keys, 3, 10); /* the second */
    struct kvr_router_stats st;
    kvr_router_stats(rd.core, &st);
    cr_assert(eq(u64, st.reconciled, 1), "one dropped: neither held nor booked");
    cr_assert(eq(u64, rd.placed_again, 1), "it was lost: its origin placed it again");
    struct kvr_pending *p = kvr_pending_find(&rd.pend, lost);
    cr_assert(not(eq(ptr, p, NULL)));
    cr_assert(eq(u32, p->attempts, 1));
    struct kvr_request_record rec;
    cr_assert(eq(int, kvr_router_export(rd.core, held, &rec), KVR_OK), "held: kept");
    cr_assert(eq(int, kvr_router_export(rd.core, booked, &rec), KVR_OK), "booked: kept");
    cr_assert(not(eq(ptr, kvr_pending_find(&rd.pend, booked), NULL)));
}

static kvr_status refuse_forwards(void *ctx, const struct kvr_outmsg *m)
{
    if (strstr(m->subject, ".worker.") && strstr(m->subject, ".generate")) {
        (void)rec_record(ctx, m);
        return KVR_ERR_TOO_LARGE;
    }
    return rec_record(ctx, m);
}

Test(routerd, a_forward_that_cannot_be_published_fails_at_once)
{
    rd.sink.publish = refuse_forwards;
    rd.forward_failed = kvr_place_forward_failed;
    heartbeat(1, 4096, NULL, 0, 1000);
    generate("_INBOX.f", "heavy", 1, 128);
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count("_INBOX.f", 0, &m), 1), "the client hears at once");
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_TOO_LARGE));
    cr_assert(eq(u32, rd.pend.n, 0));
    cr_assert(eq(u64, rd.n.forwards_failed, 1));
    uint32_t inflight = 9;
    kvr_router_worker_load(rd.core, 1, NULL, NULL, &inflight);
    cr_assert(eq(u32, inflight, 0), "its booking is freed");
}

Test(routerd, every_forward_of_a_batch_that_cannot_be_published_is_answered)
{
    /* 100 requests wait for a busy worker; a second one joins and takes them all in one batch,
     * whose forwards all fail: before, only the first 64 failures were reported, the other 36
     * were neither placed again nor answered */
    busy_above_half();
    heartbeat(1, 8, NULL, 0, 1000); /* 8 blocks of 64 tokens: busy above 4 */
    generate("_INBOX.a", "first", 1, 320);
    char reply[32];
    for (int i = 0; i < 100; i++) {
        snprintf(reply, sizeof reply, "_INBOX.q%d", i);
        generate(reply, "waits", (uint32_t)(2 + i), 64);
    }
    cr_assert(eq(u32, kvr_router_queue_len(rd.core), 100));
    rd.sink.publish = refuse_forwards;
    rd.forward_failed = kvr_place_forward_failed;
    heartbeat(2, 1 << 20, NULL, 0, 1000);
    kvr_timer_tick(&rd, kvr_now_ns(), true, false); /* the queue goes to the worker that joined */
    cr_assert(eq(int, rec_count("kv.default.worker.2.generate", 0, NULL), 100), "one batch");
    for (int i = 0; i < 100; i++) {
        snprintf(reply, sizeof reply, "_INBOX.q%d", i);
        const struct rec_sent *m = NULL;
        cr_assert(eq(int, rec_count(reply, 0, &m), 1), "request %d answered", i);
        cr_assert(eq(u32, rec_error_in(m), KVR_ERR_TOO_LARGE));
    }
    cr_assert(eq(u64, rd.n.forwards_failed, 100));
    cr_assert(eq(u64, atomic_load(&rd.sink.failed), 100), "each failed publish counted");
    cr_assert(eq(u32, rd.pend.n, 1), "the first, on worker 1, alone in flight");
}

Test(routerd, a_decision_for_a_request_that_ended_is_stopped)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    heartbeat(2, 4096, NULL, 0, 1000);
    generate("_INBOX.z", "served", 1, 128);
    uint64_t key = kvr_pending_key("_INBOX.z", "served");
    uint64_t wid = kvr_pending_find(&rd.pend, key)->worker_id, other = wid == 1 ? 2 : 1;
    worker_done(wid, key);
    /* a paused peer wakes up, finds the original in its socket and places it again */
    peer_decision("sleepy", 1, key, other, "_INBOX.z");
    char subject[64];
    snprintf(subject, sizeof subject, "kv.default.worker.%llu.cancel", (unsigned long long)other);
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count(subject, 0, &m), 1), "the copy is stopped");
    struct kvr_wire_worker_cancel c;
    cr_assert(eq(int, kvr_wire_decode_worker_cancel(m->data, m->len, &c), KVR_OK));
    cr_assert(c.silent);
    cr_assert(eq(u32, rd.pend.n, 0), "and not booked");
}

Test(routerd, a_copy_stopped_for_another_worker_has_not_ended)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    heartbeat(2, 4096, NULL, 0, 1000);
    generate("_INBOX.y", "raced", 1, 128);
    uint64_t key = kvr_pending_key("_INBOX.y", "raced");
    uint64_t mine = kvr_pending_find(&rd.pend, key)->worker_id, theirs = mine == 1 ? 2 : 1;
    /* the peer's decision stood and it stopped this router's copy before its gossip came here */
    worker_ended(mine, key, KVR_ERR_SUPERSEDED);
    size_t mark = rec_nsent;
    char subject[64];
    peer_decision("peer", 1, key, theirs, "_INBOX.y");
    snprintf(subject, sizeof subject, "kv.default.worker.%llu.cancel", (unsigned long long)theirs);
    cr_assert(eq(int, rec_count(subject, mark, NULL), 0), "the copy that stands is not stopped");
    cr_assert(eq(u32, rd.pend.n, 1), "it is in flight, on the peer's worker");
    generate("_INBOX.y", "raced", 1, 128);
    cr_assert(eq(u64, rd.fleet->resends, 1), "and a resend is absorbed");
}

static int io_failures; /* forwards still to fail with an i/o error */

static kvr_status flaky_forwards(void *ctx, const struct kvr_outmsg *m)
{
    kvr_status st = rec_record(ctx, m);
    if (strstr(m->subject, ".worker.") && strstr(m->subject, ".generate") && io_failures > 0) {
        io_failures--;
        return KVR_ERR_IO;
    }
    return st;
}

Test(routerd, a_forward_lost_to_the_connection_is_placed_again)
{
    rd.sink.publish = flaky_forwards;
    rd.forward_failed = kvr_place_forward_failed;
    io_failures = 1;
    heartbeat(1, 4096, NULL, 0, 1000);
    generate("_INBOX.g", "bumpy", 1, 128);
    /* not at once: nats.c has not seen the cut yet, the same socket would fail it again */
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 1), "sent once");
    heartbeat(1, 4096, NULL, 0, 1000); /* an event settles what waits, but not this one */
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 1), "still once");
    kvr_timer_tick(&rd, kvr_now_ns(), false, false); /* blind to the events: it goes anyway */
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 2), "sent again");
    cr_assert(eq(int, rec_count("_INBOX.g", 0, NULL), 0), "the client is told nothing");
    cr_assert(eq(u32, rd.pend.n, 1));
    cr_assert(eq(u64, rd.placed_again, 1));
    io_failures = 3; /* every placement fails: then the client hears */
    generate("_INBOX.g", "doomed", 2, 128);
    const struct rec_sent *m = NULL;
    for (int tick = 0; tick < KVR_PLACE_MAX_AGAIN; tick++) { /* placed again at each tick */
        cr_assert(eq(int, rec_count("_INBOX.g", 0, NULL), 0), "tick %d: not yet", tick);
        kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    }
    cr_assert(eq(int, rec_count("_INBOX.g", 0, &m), 1));
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_IO));
}

Test(routerd, a_router_that_was_stopped_does_not_blame_the_workers)
{
    heartbeat(1, 4096, NULL, 0, 100); /* gone after 320 ms of silence (slack for valgrind) */
    uint64_t t = kvr_now_ns();
    kvr_timer_tick(&rd, t, true, false);
    kvr_timer_tick(&rd, t + 2 * KVR_NS_PER_S, true, false); /* SIGSTOP for 2 s, then SIGCONT */
    cr_assert(eq(u64, rd.stalls, 1));
    cr_assert(eq(int, kvr_router_worker_load(rd.core, 1, NULL, NULL, NULL), KVR_OK),
              "its silence was the router's own");
    kvr_timer_tick(&rd, t + 2 * KVR_NS_PER_S + 500 * KVR_NS_PER_MS, true, false); /* not late */
    cr_assert(eq(int, kvr_router_worker_load(rd.core, 1, NULL, NULL, NULL), KVR_ERR_UNKNOWN_WORKER),
              "but a silence after it counts");
}

Test(routerd, workers_are_judged_by_the_events_applied_not_by_the_clock)
{
    heartbeat(1, 4096, NULL, 0, 100); /* gone after 320 ms of silence */
    uint64_t t = kvr_now_ns();
    struct kvr_timer_seen seen = {.events_up = true, .events_heard = t};
    /* its heartbeats wait in the queue behind 1.5 s of KV events: the clock runs on, and ticks
     * come on time, but what was applied stays at t */
    for (uint64_t ms = 20; ms <= 1500; ms += 20)
        kvr_timer_tick_seen(&rd, t + ms * KVR_NS_PER_MS, &seen);
    cr_assert(eq(u64, rd.stalls, 0), "no tick was late");
    cr_assert(eq(int, kvr_router_worker_load(rd.core, 1, NULL, NULL, NULL), KVR_OK),
              "a worker whose heartbeats may be queued stays");
    cr_assert(eq(u64, rd.events_behind_ns, 1500 * KVR_NS_PER_MS), "and how far behind is shown");
    cr_assert(rd.events_behind, "logged as behind");
    seen.events_heard = t + 1600 * KVR_NS_PER_MS; /* applied past its timeout: no heartbeat */
    kvr_timer_tick_seen(&rd, t + 1600 * KVR_NS_PER_MS, &seen);
    cr_assert(eq(int, kvr_router_worker_load(rd.core, 1, NULL, NULL, NULL), KVR_ERR_UNKNOWN_WORKER),
              "silent through what was applied: gone");
    cr_assert(not(rd.events_behind), "caught up");
}

Test(routerd, a_done_that_frees_load_judges_workers_at_what_was_applied)
{
    busy_above_half();
    heartbeat(1, 8, NULL, 0, 100); /* busy above 4 blocks; gone after 320 ms of silence */
    generate("_INBOX.a", "first", 1, 320);
    generate("_INBOX.b", "second", 2, 320); /* queued */
    cr_assert(eq(u32, kvr_router_queue_len(rd.core), 1));
    uint64_t t = kvr_now_ns();
    struct kvr_timer_seen seen = {.events_up = true, .events_heard = t};
    kvr_timer_tick_seen(&rd, t, &seen);
    kvr_sleep_ns(400 * KVR_NS_PER_MS); /* the clock passes its timeout; the queue holds its beats */
    worker_done(1, kvr_pending_key("_INBOX.a", "first")); /* frees load: the queue moves */
    cr_assert(eq(int, kvr_router_worker_load(rd.core, 1, NULL, NULL, NULL), KVR_OK),
              "judged at the last tick's applied time, not at the clock");
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 2), "second placed");
    cr_assert(eq(int, rec_count("_INBOX.b", 0, NULL), 0), "and not failed");
}

Test(routerd, a_backlog_tells_up_to_when_what_was_received_is_applied)
{
    static struct kvr_backlog b; /* 8 KiB of notes */
    static struct kvr_backlog a;
    kvr_backlog_start(&a, 50); /* subscribed at 50: nothing had come before */
    cr_assert(eq(u64, kvr_backlog_note(&a, 60, 2), 50), "2 received since, none done");
    kvr_backlog_done(&a);
    kvr_backlog_done(&a);
    cr_assert(eq(u64, kvr_backlog_note(&a, 70, 2), 70), "both done");
    cr_assert(eq(u64, kvr_backlog_note(&b, 100, 0), 100), "nothing received: heard up to now");
    cr_assert(eq(u64, kvr_backlog_note(&b, 200, 3), 100), "3 received, none done");
    kvr_backlog_done(&b);
    cr_assert(eq(u64, kvr_backlog_note(&b, 300, 5), 100), "1 of the 3 done");
    kvr_backlog_done(&b);
    kvr_backlog_done(&b);
    cr_assert(eq(u64, kvr_backlog_note(&b, 400, 6), 200), "what had come by 200 is done");
    kvr_backlog_done(&b);
    kvr_backlog_done(&b);
    kvr_backlog_done(&b);
    cr_assert(eq(u64, kvr_backlog_note(&b, 500, 6), 500), "caught up");
    /* a backlog longer than the notes: notes wait for room, heard never goes back */
    for (uint64_t i = 1; i <= 2 * KVR_BACKLOG_NOTES; i++)
        cr_assert(eq(u64, kvr_backlog_note(&b, 500 + i, 6 + i), 500));
    for (int i = 0; i < 10; i++)
        kvr_backlog_done(&b); /* the 10th message after 6 */
    uint64_t h = kvr_backlog_note(&b, 5000, 6 + 2 * KVR_BACKLOG_NOTES);
    cr_assert(eq(u64, h, 500 + 10), "the note of the 16th message (%llu)", (unsigned long long)h);
    for (int i = 0; i < 2 * KVR_BACKLOG_NOTES; i++)
        kvr_backlog_done(&b);
    cr_assert(eq(u64, kvr_backlog_note(&b, 6000, 6 + 2 * KVR_BACKLOG_NOTES), 6000));
}

Test(routerd, a_heartbeat_ends_requests_whose_done_was_lost)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    generate("_INBOX.l", "lost-done", 1, 128);
    uint64_t key = kvr_pending_key("_INBOX.l", "lost-done");
    struct kvr_wire_heartbeat h = {.info = {.id = 1, .block_size = 64, .capacity_blocks = 4096},
                                   .interval_ms = 1000,
                                   .ended = &key,
                                   .nended = 1};
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &h), KVR_OK));
    size_t mark = rec_nsent;
    kvr_events_on_message(&rd, "kv.default.ev.1.hb", b.data, b.len);
    kvr_buf_free(&b);
    cr_assert(eq(u32, rd.pend.n, 0), "ended, not taken for never reached");
    cr_assert(eq(int, rec_count("_INBOX.l", mark, NULL), 0), "and its client is told nothing");
    cr_assert(eq(u64, rd.n.ends_from_heartbeats, 1));
    generate("_INBOX.l", "lost-done", 1, 128);
    cr_assert(eq(u64, rd.n.resends_after_end, 1));
}

Test(routerd, a_decision_with_more_blocks_than_its_worker_is_refused)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    uint64_t hashes[2] = {11, 12};
    struct kvr_request_record rec = {99, 1, hashes, 2, 128, 0, true, UINT32_MAX, 0};
    struct kvr_buf b = {0};
    cr_assert(eq(
        int,
        kvr_wire_encode_gossip_decision(&b, "forger", 5, 1, &rec, "_INBOX.f", "f", "forger", 1, 0),
        KVR_OK));
    gossip_in(&rd, b.data, b.len); /* once a 2^32-step loop under the lock */
    kvr_buf_free(&b);
    cr_assert(eq(u32, rd.pend.n, 0));
    cr_assert(eq(u64, rd.fleet->bad, 1));
    uint64_t blocks = 9;
    kvr_router_worker_load(rd.core, 1, &blocks, NULL, NULL);
    cr_assert(eq(u64, blocks, 0), "no phantom blocks");
}

Test(routerd, names_from_the_wire_are_checked_before_they_become_subjects)
{
    bool good =
        kvr_subject_ok("_INBOX.abc.7", 64) && kvr_token_ok("r-1_x", 64) && kvr_id_ok("r-1", 64);
    bool bad = kvr_subject_ok("a..b", 64) || kvr_subject_ok("a.*", 64) ||
               kvr_subject_ok("a b", 64) || kvr_subject_ok(".a", 64) ||
               kvr_subject_ok("a\r\nPUB x", 64) || kvr_subject_ok("abcd", 3) ||
               kvr_id_ok("r.1", 64) || kvr_id_ok("", 64);
    cr_assert(good && !bad);
    heartbeat(1, 4096, NULL, 0, 1000);
    struct kvr_buf b = {0};
    /* a hello whose router id would write a PUB of its own into this router's connection */
    cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, "x 0\r\n\r\nPUB evil", 5, 9, true), KVR_OK));
    size_t mark = rec_nsent;
    gossip_in(&rd, b.data, b.len);
    cr_assert(eq(u32, rd.fleet->npeers, 0), "no peer by that name");
    cr_assert(eq(u64, rd.fleet->bad, 1));
    cr_assert(eq(sz, rec_nsent, mark), "nothing sent (a repair would have been asked of it)");
    /* a decision whose reply subject is no subject */
    peer_decision("peer", 1, 4343, 1, "_INBOX.x\r\nPUB evil 3\r\nabc");
    cr_assert(eq(u32, rd.pend.n, 0));
    cr_assert(eq(u64, rd.fleet->bad, 2));
    kvr_buf_free(&b);
}

Test(routerd, an_event_speaks_for_the_worker_of_its_subject_only)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    generate("_INBOX.w", "mine", 1, 128);
    uint64_t key = kvr_pending_key("_INBOX.w", "mine");
    struct kvr_buf b = {0};
    for (uint64_t wid = 0; wid <= 2; wid += 2) { /* no worker id, another worker's id */
        cr_assert(eq(int, kvr_wire_encode_done(&b, wid, key, KVR_OK, 8), KVR_OK));
        kvr_events_on_message(&rd, "kv.default.ev.1.done", b.data, b.len);
    }
    kvr_buf_free(&b);
    cr_assert(eq(u64, rd.ev_errors, 2), "both counted and dropped");
    cr_assert(eq(u32, rd.pend.n, 1), "the request is still in flight");
}

Test(routerd, a_heartbeat_interval_from_the_wire_is_bounded)
{
    cfg.heartbeat_min_ns = 50 * KVR_NS_PER_MS; /* the defaults */
    cfg.heartbeat_max_ns = 10 * KVR_NS_PER_S;
    heartbeat(7, 4096, NULL, 0, UINT32_MAX); /* a worker nobody runs, that would never time out */
    heartbeat(8, 4096, NULL, 0, 500);        /* a live worker ... */
    heartbeat(8, 4096, NULL, 0, 1);          /* ... and a forged beat that would drop it at once */
    uint64_t t = kvr_now_ns();
    kvr_timer_tick(&rd, t, true, false);
    kvr_timer_tick(&rd, t + 100 * KVR_NS_PER_MS, true, false);
    cr_assert(eq(int, kvr_router_worker_load(rd.core, 8, NULL, NULL, NULL), KVR_OK),
              "a known worker's timeout never shrinks");
    for (uint64_t ms = 500; ms <= 33000; ms += 500) /* ticks on time, no stall */
        kvr_timer_tick(&rd, t + ms * KVR_NS_PER_MS, true, false);
    cr_assert(eq(int, kvr_router_worker_load(rd.core, 7, NULL, NULL, NULL), KVR_ERR_UNKNOWN_WORKER),
              "gone after 3.2 times the longest interval taken (10 s)");
}

Test(routerd, made_up_router_ids_do_not_fill_the_peer_table_for_good)
{
    struct kvr_buf b = {0};
    for (uint32_t i = 0; i < KVR_FLEET_MAX_PEERS; i++) { /* 1,024 hellos under made-up ids */
        char id[32];
        snprintf(id, sizeof id, "fake-%u", i);
        cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, id, 5, 0, true), KVR_OK));
        gossip_in(&rd, b.data, b.len);
    }
    cr_assert(eq(u32, rd.fleet->npeers, KVR_FLEET_MAX_PEERS));
    kvr_sleep_ns(10 * KVR_NS_PER_MS); /* 3.5 hellos of 2 ms: they are all silent now */
    cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, "real-router", 7, 0, true), KVR_OK));
    gossip_in(&rd, b.data, b.len);
    kvr_buf_free(&b);
    cr_assert(eq(u64, rd.fleet->peers_evicted, 1));
    struct kvr_peer *p = NULL;
    HASH_FIND_STR(rd.fleet->peers, "real-router", p);
    cr_assert(not(eq(ptr, p, NULL)), "a router started later is heard");
}

/* Worker wid's RebindAsk for keys, published on the events subject of worker subj_wid. */
static void rebind_ask(uint64_t subj_wid, uint64_t wid, uint64_t *keys, uint32_t n)
{
    struct kvr_wire_rebind_ask a = {wid, keys, n};
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_rebind_ask(&b, &a), KVR_OK));
    event_in(subj_wid, "rebind", &b);
}

Test(routerd, a_worker_back_from_a_cut_is_rebound_to_its_own_clients_only)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    heartbeat(2, 4096, NULL, 0, 1000);
    generate("_INBOX.c1", "req-1", 1, 64);
    uint64_t key = kvr_pending_key("_INBOX.c1", "req-1");
    uint64_t w = rec_count("kv.default.worker.1.generate", 0, NULL) ? 1 : 2, o = 3 - w;
    char mine[64], other[64];
    snprintf(mine, sizeof mine, "kv.default.worker.%llu.rebind", (unsigned long long)w);
    snprintf(other, sizeof other, "kv.default.worker.%llu.rebind", (unsigned long long)o);
    uint64_t keys[2] = {key, 999};
    size_t mark = rec_nsent;
    rebind_ask(w, w, keys, 2);
    const struct rec_sent *rb = NULL;
    cr_assert(eq(int, rec_count(mine, mark, &rb), 1));
    cr_assert(eq(str, (char *)rb->reply, "_INBOX.c1"), "the client's reply: the server's grant");
    uint64_t got = 0;
    bool again = true;
    cr_assert(eq(int, kvr_wire_decode_worker_rebind(rb->data, rb->len, &got, &again), KVR_OK));
    cr_assert(eq(u64, got, key));
    cr_assert(not(again), "a rebind alone: the worker's own repeat follows");
    cr_assert(eq(u64, rd.n.rebinds_unknown, 1), "a key nobody booked is skipped");
    /* it ended just before the cut: its final may be repeated, so it is still rebound */
    worker_done(w, key);
    mark = rec_nsent;
    rebind_ask(w, w, keys, 1);
    cr_assert(eq(int, rec_count(mine, mark, &rb), 1));
    cr_assert(eq(str, (char *)rb->reply, "_INBOX.c1"));
    /* another worker asking for it gets nothing; nor does one speaking for another */
    mark = rec_nsent;
    rebind_ask(o, o, keys, 1);
    uint64_t errors = rd.ev_errors;
    rebind_ask(o, w, keys, 1);
    cr_assert(eq(int, rec_count(mine, mark, NULL), 0));
    cr_assert(eq(int, rec_count(other, mark, NULL), 0));
    cr_assert(eq(u64, rd.n.rebinds_unknown, 2));
    cr_assert(eq(u64, rd.ev_errors, errors + 1), "a payload for another worker is dropped");
    cr_assert(eq(u64, rd.n.rebinds_sent, 2));
}

Test(routerd, gossip_under_another_routers_id_than_its_subjects_is_dropped)
{
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, "victim", 5, 1, true), KVR_OK));
    kvr_fleet_on_gossip(&rd, "kv.default.router.gossip.forger", b.data, b.len);
    cr_assert(eq(u64, rd.fleet->bad, 1));
    cr_assert(eq(u32, rd.fleet->npeers, 0), "no peer made from it");
    kvr_fleet_on_gossip(&rd, "kv.default.router.gossip.victim", b.data, b.len);
    cr_assert(eq(u32, rd.fleet->npeers, 1));
    kvr_buf_free(&b);
}

Test(routerd, a_peer_is_judged_by_the_gossip_applied_not_by_the_clock)
{
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, "peer", 5, 1, true), KVR_OK));
    gossip_in(&rd, b.data, b.len);
    kvr_buf_free(&b);
    struct kvr_peer *p = NULL;
    HASH_FIND_STR(rd.fleet->peers, "peer", p);
    cr_assert(not(eq(ptr, p, NULL)));
    uint64_t t = p->heard_ns, later = t + 100 * cfg.hello_ns;
    cr_assert(not(kvr_fleet_peer_alive(&rd, p, later)), "silent for 100 hellos by the clock");
    struct kvr_timer_seen seen = {.events_up = true, .gossip_heard = t + cfg.hello_ns};
    kvr_timer_tick_seen(&rd, later, &seen); /* gossip applied only up to one hello after it */
    cr_assert(kvr_fleet_peer_alive(&rd, p, later), "its hellos may wait in the queue");
    seen.gossip_heard = later;
    kvr_timer_tick_seen(&rd, later, &seen);
    cr_assert(not(kvr_fleet_peer_alive(&rd, p, later)), "silent through what was applied");
}

Test(routerd, a_forged_newer_epoch_holds_only_while_its_forger_keeps_sending)
{
    /* the forger stays alive between two messages however slow the run (valgrind: a 2 ms hello
     * let it fall silent there once, and the test failed with its buffer unfreed) */
    cfg.hello_ns = 100 * KVR_NS_PER_MS;
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, "peer", 5, 1, true), KVR_OK));
    gossip_in(&rd, b.data, b.len);
    cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, "peer", 9, 1, true), KVR_OK));
    gossip_in(&rd, b.data, b.len); /* the forgery: a "restart" */
    cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, "peer", 5, 2, true), KVR_OK));
    gossip_in(&rd, b.data, b.len);
    cr_assert(eq(u64, rd.fleet->stale, 1), "while the newer epoch talks, the older is stale");
    kvr_sleep_ns(8 * cfg.hello_ns); /* the forger is silent past 3.5 hello intervals */
    gossip_in(&rd, b.data, b.len);
    cr_assert(eq(u64, rd.fleet->epochs_back, 1), "the real router is heard again");
    struct kvr_peer *p = NULL;
    HASH_FIND_STR(rd.fleet->peers, "peer", p);
    cr_assert(not(eq(ptr, p, NULL)));
    cr_assert(eq(u64, p->epoch, 5));
    kvr_buf_free(&b);
}

Test(routerd, a_reply_subject_inside_the_fleets_subjects_is_never_answered)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    const char *bad[] = {"kv.default.ev.1.done", "kv.other.router.gossip.r9", "$SRV.PING"};
    for (int i = 0; i < 3; i++) {
        size_t mark = rec_nsent;
        generate(bad[i], "evil", 1, 64);
        cr_assert(eq(sz, rec_nsent, mark), "nothing published for %s", bad[i]);
        select_request(bad[i], "evil", true);
        cr_assert(eq(sz, rec_nsent, mark), "nor for its select");
    }
    cr_assert(eq(u32, rd.pend.n, 0), "nothing booked");
    cr_assert(eq(u64, rd.generate.by_code[KVR_ERR_NO_REPLY], 3));
    cr_assert(eq(u64, rd.select.by_code[KVR_ERR_NO_REPLY], 3));
    generate("kvx.reply", "fine", 1, 64); /* only the prefix's own tokens are refused */
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 1));
}

/* Worker wid's KV event b (freed), as the events subscription brings it. */
static void kv_event_in(uint64_t wid, struct kvr_buf *b)
{
    event_in(wid, "kv", b);
}

/* Worker wid's KV event number seq (a Cleared one), as the events subscription brings it. */
static void kv_numbered(uint64_t wid, uint64_t seq)
{
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_cleared(&b, wid, seq), KVR_OK));
    kv_event_in(wid, &b);
}

/* Router "peer" says hello, serving. */
static void peer_hello(void)
{
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, "peer", 5, 0, true), KVR_OK));
    gossip_in(&rd, b.data, b.len);
    kvr_buf_free(&b);
}

/* Timer ticks every 100 ms from `from` to `to` (ns): time passing, not a stall. */
static void ticks(uint64_t from, uint64_t to)
{
    for (uint64_t t = from; t <= to; t += 100 * KVR_NS_PER_MS)
        kvr_timer_tick(&rd, t, true, false);
}

Test(routerd, kv_events_a_worker_numbered_but_never_came_call_for_a_snapshot)
{
    cfg.hello_ns = 500 * KVR_NS_PER_MS; /* a peer heard stays alive however slow the run */
    heartbeat(1, 4096, NULL, 0, 1000);
    heartbeat(2, 4096, NULL, 0, 1000);
    kv_numbered(1, 1);
    kv_numbered(1, 2);
    kv_numbered(2, 7); /* its first here: what came before is the snapshot's business */
    kv_numbered(9, 4); /* a worker nobody knows: not applied, not noted */
    kv_numbered(9, 9);
    cr_assert(eq(u64, rd.kvseq.gaps, 0));
    /* out of order (a worker's two threads publish so): 4 before 3, which closes the gap */
    kv_numbered(1, 4);
    cr_assert(eq(u64, rd.kvseq.gaps, 1));
    kv_numbered(1, 3);
    cr_assert(eq(u64, rd.kvseq.open, 0));
    cr_assert(eq(u64, rd.kvseq.late, 1));
    uint64_t now = kvr_now_ns();
    ticks(now, now + 500 * KVR_NS_PER_MS);
    cr_assert(eq(u64, rd.kv_resyncs, 0), "called off: nothing is missing");
    /* 5 to 7 lost, with nobody to take a snapshot from: counted, let go */
    kv_numbered(1, 8);
    cr_assert(eq(u64, rd.kvseq.missed, 4));
    cr_assert(eq(u64, rd.kvseq.open, 3));
    ticks(now + 600 * KVR_NS_PER_MS, now + 11 * KVR_NS_PER_S);
    cr_assert(eq(u64, rd.kv_resyncs, 0));
    cr_assert(not(rd.kv_gap));
    cr_assert(eq(u64, rd.kvseq.open, 0));
    /* a serving peer now: the next loss takes its snapshot, 250 ms later */
    peer_hello();
    heartbeat(2, 4096, NULL, 0, 1000); /* back: the ticks' clock ran 11 s past its beats */
    kv_numbered(2, 9);                 /* 8 lost */
    cr_assert(rd.kv_gap);
    size_t mark = rec_nsent;
    ticks(now + 11100 * KVR_NS_PER_MS, now + 21 * KVR_NS_PER_S);
    cr_assert(eq(u64, rd.kv_resyncs, 1), "one snapshot");
    const struct rec_sent *ask = NULL;
    cr_assert(eq(int, rec_count("kv.default.router.sync.peer", mark, &ask), 1),
              "asked of the peer");
    struct kvr_wire_sync q;
    cr_assert(eq(int, kvr_wire_decode_sync(ask->data, ask->len, &q), KVR_OK));
    cr_assert(q.full, "a snapshot, its index to replace this one's");
    kvr_wire_sync_free(&q);
    cr_assert(eq(u64, rd.kvseq.open, 0));
    cr_assert(eq(u64, rd.stalls, 0));
}

/* Worker wid's heartbeat saying its last KV event sent was number seq. */
static void heartbeat_numbered(uint64_t wid, uint64_t seq)
{
    heartbeat_as((struct kvr_wire_heartbeat){
        .info = {.id = wid}, .interval_ms = 1000, .last_event_seq = seq});
}

Test(routerd, kv_events_lost_at_the_end_show_in_the_next_heartbeat)
{
    cfg.hello_ns = 500 * KVR_NS_PER_MS;
    heartbeat_numbered(1, 0); /* known, nothing numbered yet */
    heartbeat_numbered(1, 7); /* not noted yet: what came before is a snapshot's business */
    cr_assert(eq(u64, rd.kvseq.gaps, 0));
    kv_numbered(1, 1);
    kv_numbered(1, 2);
    heartbeat_numbered(1, 2); /* all came */
    heartbeat_numbered(1, 1); /* an older beat, or a restarted worker: nothing new */
    cr_assert(eq(u64, rd.kvseq.gaps, 0));
    cr_assert(not(rd.kv_gap));
    /* the heartbeat overtook 3 and 4 (published by another thread): open until they come */
    heartbeat_numbered(1, 4);
    cr_assert(eq(u64, rd.kvseq.open, 2));
    cr_assert(rd.kv_gap);
    kv_numbered(1, 4);
    kv_numbered(1, 3);
    cr_assert(eq(u64, rd.kvseq.open, 0));
    cr_assert(eq(u64, rd.kvseq.late, 2));
    uint64_t now = kvr_now_ns();
    ticks(now, now + 500 * KVR_NS_PER_MS);
    cr_assert(eq(u64, rd.kv_resyncs, 0), "called off: nothing is missing");
    /* 5 and 6 sent last, then silence: lost for good, and only the heartbeat says so (past the
     * 10 s between two KV catch-ups, with a serving peer to ask) */
    ticks(now + 600 * KVR_NS_PER_MS, now + 11 * KVR_NS_PER_S);
    peer_hello();
    heartbeat_numbered(1, 6); /* back: the ticks' clock ran 11 s past its beats */
    cr_assert(eq(u64, rd.kvseq.missed, 4));
    cr_assert(eq(u64, rd.kvseq.open, 2));
    cr_assert(rd.kv_gap);
    size_t mark = rec_nsent;
    ticks(now + 11100 * KVR_NS_PER_MS, now + 12 * KVR_NS_PER_S);
    cr_assert(eq(u64, rd.kv_resyncs, 1), "one snapshot");
    cr_assert(eq(int, rec_count("kv.default.router.sync.peer", mark, NULL), 1));
    cr_assert(eq(u64, rd.kvseq.open, 0));
    /* an announced number that comes late, after a newer one: still counted once */
    heartbeat_numbered(1, 6); /* back again, nothing new */
    kv_numbered(1, 8);        /* 7 skipped */
    cr_assert(eq(u64, rd.kvseq.open, 1));
    heartbeat_numbered(1, 9);
    cr_assert(eq(u64, rd.kvseq.open, 2));
    kv_numbered(1, 10); /* 9 still open */
    kv_numbered(1, 9);
    kv_numbered(1, 7);
    cr_assert(eq(u64, rd.kvseq.open, 0));
    /* a heartbeat ahead of more events than are taken for late ones (a worker that queued
     * 2,000 at once): each closes one as it comes, none reads as a restart */
    heartbeat_numbered(1, 2010);
    cr_assert(eq(u64, rd.kvseq.open, 2000));
    for (uint64_t seq = 11; seq <= 2010; seq++)
        kv_numbered(1, seq);
    cr_assert(eq(u64, rd.kvseq.open, 0));
    uint64_t missed = rd.kvseq.missed;
    /* a number from the wire cannot wrap the counts */
    heartbeat_numbered(1, UINT64_MAX);
    cr_assert(eq(u64, rd.kvseq.open, UINT64_MAX - 2010));
    heartbeat_numbered(2, UINT64_MAX); /* not noted yet: its numbers are a snapshot's */
    cr_assert(eq(u64, rd.kvseq.missed, missed + UINT64_MAX - 2010));
    kv_numbered(1, 5000); /* one of them */
    kv_numbered(1, 1);    /* far below the highest received: the worker restarted */
    heartbeat_numbered(1, UINT64_MAX);
    cr_assert(eq(u64, rd.kvseq.missed, UINT64_MAX), "held at the top");
    cr_assert(eq(u64, rd.kvseq.open, UINT64_MAX));
}

/* The numbers each worker missed, one by one: a late number closes only its own worker's gap,
 * and a repeat or a number a snapshot covered closes none. */
/* The last number of each worker known missed: the highest open one, one a heartbeat named, the
 * floor of the window once numbers left it, nothing once a snapshot settled them. */
Test(routerd, kvseq_tells_the_last_number_a_worker_missed)
{
    struct kvr_kvseq q = {0};
    cr_assert(eq(u64, kvr_kvseq_last_missing(&q, 1), 0), "nobody noted");
    kvr_kvseq_note(&q, 1, 10);
    cr_assert(eq(u64, kvr_kvseq_last_missing(&q, 1), 0), "its first");
    kvr_kvseq_note(&q, 1, 13); /* 11 and 12 open */
    kvr_kvseq_note(&q, 1, 14);
    cr_assert(eq(u64, kvr_kvseq_last_missing(&q, 1), 12));
    kvr_kvseq_note(&q, 1, 12);
    cr_assert(eq(u64, kvr_kvseq_last_missing(&q, 1), 11), "12 came late");
    kvr_kvseq_announce(&q, 1, 20); /* 15 to 20 named, not come */
    cr_assert(eq(u64, kvr_kvseq_last_missing(&q, 1), 20));
    kvr_kvseq_settle(&q);
    cr_assert(eq(u64, kvr_kvseq_last_missing(&q, 1), 0), "settled by a snapshot");
    kvr_kvseq_note(&q, 1, 21);
    cr_assert(eq(u64, kvr_kvseq_last_missing(&q, 1), 0));
    kvr_kvseq_note(&q, 1, 21 + 2 * KVR_KVSEQ_REORDER); /* numbers left the window open */
    cr_assert(eq(u64, kvr_kvseq_last_missing(&q, 1), 21 + 2 * KVR_KVSEQ_REORDER - 1));
    kvr_kvseq_note(&q, 1, 21 + 2 * KVR_KVSEQ_REORDER - 1);
    cr_assert(eq(u64, kvr_kvseq_last_missing(&q, 1), 21 + 2 * KVR_KVSEQ_REORDER - 2));
    for (uint64_t n = 21 + KVR_KVSEQ_REORDER; n < 21 + 2 * KVR_KVSEQ_REORDER - 1; n++)
        kvr_kvseq_note(&q, 1, n); /* every one in the window came late */
    cr_assert(eq(u64, kvr_kvseq_last_missing(&q, 1), 21 + KVR_KVSEQ_REORDER),
              "below the window nothing is known: its floor");
    kvr_kvseq_free(&q);
}

Test(routerd, kvseq_closes_only_the_numbers_a_worker_missed)
{
    struct kvr_kvseq q = {0};
    cr_assert(eq(u64, kvr_kvseq_note(&q, 1, 1), 0));
    cr_assert(eq(u64, kvr_kvseq_note(&q, 2, 1), 0));
    cr_assert(eq(u64, kvr_kvseq_note(&q, 1, 3), 1)); /* worker 1: 2 open */
    cr_assert(eq(u64, kvr_kvseq_note(&q, 2, 3), 1)); /* worker 2: 2 open */
    cr_assert(eq(u64, kvr_kvseq_note(&q, 2, 2), 0));
    cr_assert(eq(u64, q.open, 1), "worker 2's late 2 closes its own gap only");
    cr_assert(eq(u64, kvr_kvseq_note(&q, 2, 2), 0));
    cr_assert(eq(u64, kvr_kvseq_note(&q, 2, 1), 0));
    cr_assert(eq(u64, q.open, 1), "repeats close nothing: worker 1's 2 is still missing");
    cr_assert(eq(u64, q.late, 1));
    /* a number of the window that was never skipped (it came) closes nothing either */
    cr_assert(eq(u64, kvr_kvseq_note(&q, 1, 3), 0));
    cr_assert(eq(u64, kvr_kvseq_note(&q, 1, 1), 0));
    cr_assert(eq(u64, q.open, 1));
    cr_assert(eq(u64, kvr_kvseq_note(&q, 1, 2), 0));
    cr_assert(eq(u64, q.open, 0));
    /* a snapshot covers what is open: the same numbers coming later close nothing new */
    cr_assert(eq(u64, kvr_kvseq_note(&q, 1, 6), 2));     /* 4, 5 open */
    cr_assert(eq(u64, kvr_kvseq_announce(&q, 2, 5), 2)); /* 4, 5 of worker 2 open */
    cr_assert(eq(u64, q.open, 4));
    kvr_kvseq_settle(&q);
    cr_assert(eq(u64, q.open, 0));
    cr_assert(eq(u64, kvr_kvseq_note(&q, 2, 9), 3)); /* 6 to 8: a new gap */
    cr_assert(eq(u64, kvr_kvseq_note(&q, 1, 4), 0));
    cr_assert(eq(u64, kvr_kvseq_note(&q, 2, 4), 0));
    cr_assert(eq(u64, kvr_kvseq_note(&q, 2, 5), 0));
    cr_assert(eq(u64, q.open, 3), "numbers the snapshot covered do not close the new gap");
    cr_assert(eq(u64, kvr_kvseq_note(&q, 2, 7), 0));
    cr_assert(eq(u64, q.open, 2));
    /* a skipped number that falls out of the window can no longer come late: it stays open */
    cr_assert(eq(u64, kvr_kvseq_note(&q, 2, 9 + KVR_KVSEQ_REORDER), KVR_KVSEQ_REORDER - 1));
    cr_assert(eq(u64, kvr_kvseq_note(&q, 2, 10 + KVR_KVSEQ_REORDER), 0));
    cr_assert(eq(u64, q.open, 2 + KVR_KVSEQ_REORDER - 1));
    cr_assert(eq(u64, kvr_kvseq_note(&q, 2, 10), 0)); /* in the window, open: closes */
    cr_assert(eq(u64, q.open, 2 + KVR_KVSEQ_REORDER - 2));
    cr_assert(eq(u64, kvr_kvseq_note(&q, 2, 6), 0)); /* far below: a restart, nothing closed */
    cr_assert(eq(u64, q.open, 2 + KVR_KVSEQ_REORDER - 2));
    kvr_kvseq_free(&q);
}

/* --- snapshots from an index with holes ------------------------------------------------------ */

/* Worker wid's KV event number seq: a chain of n blocks from the root, hashes and engine ids
 * from first on. */
static void kv_stored(uint64_t wid, uint64_t seq, uint64_t first, uint32_t n)
{
    struct kvr_kv_block blocks[16];
    cr_assert(le(u32, n, 16));
    for (uint32_t i = 0; i < n; i++)
        blocks[i] = (struct kvr_kv_block){first + i, first + i};
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_stored(&b, wid, seq, NULL, blocks, n), KVR_OK));
    kv_event_in(wid, &b);
}

static uint32_t index_entries(void)
{
    struct kvr_router_stats s;
    kvr_router_stats(rd.core, &s);
    return s.index_entries;
}

static uint32_t page_entries; /* entries seen by count_page_entry */
static void count_page_entry(void *ctx, const struct kvr_index_record *e)
{
    (void)ctx;
    (void)e;
    page_entries++;
}

/* Router `asker` asks this one for a snapshot: its one page's head (entries into page_entries). */
static struct kvr_wire_page_head snapshot_served(void)
{
    struct kvr_wire_sync q = {.router_id = "asker", .full = true, .token = 11};
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    size_t mark = rec_nsent;
    kvr_sync_on_request(&rd, "kv.default.router.pages.asker", b.data, b.len);
    kvr_buf_free(&b);
    const struct rec_sent *page = NULL;
    cr_assert(eq(int, rec_count("kv.default.router.pages.asker", mark, &page), 1));
    struct kvr_wire_page_head head;
    page_entries = 0;
    cr_assert(eq(int,
                 kvr_wire_decode_page(page->data, page->len, NULL, count_page_entry, NULL, &head),
                 KVR_OK));
    cr_assert(head.last);
    return head;
}

Test(routerd, a_snapshot_from_an_index_with_holes_says_so)
{
    cfg.hello_ns = 500 * KVR_NS_PER_MS;
    heartbeat(1, 4096, NULL, 0, 10000);
    kv_stored(1, 1, 100, 4);
    cr_assert(not(snapshot_served().index_partial), "every event applied: the index is whole");
    cr_assert(eq(u32, page_entries, 4));
    kv_stored(1, 3, 200, 2); /* 2 never comes */
    cr_assert(snapshot_served().index_partial, "an event missed");
    cr_assert(eq(u32, page_entries, 6), "still sent: an asker with no index at all takes them");
    uint64_t now = kvr_now_ns();
    kvr_timer_tick(&rd, now, true, false);
    cr_assert(snapshot_served().index_partial, "the catch-up due");
    ticks(now + 100 * KVR_NS_PER_MS, now + 600 * KVR_NS_PER_MS); /* no peer: the gap let go */
    cr_assert(not(snapshot_served().index_partial));
    kvr_timer_tick(&rd, now + 700 * KVR_NS_PER_MS, false, false);
    cr_assert(snapshot_served().index_partial, "the events connection down");
    kvr_timer_tick(&rd, now + 800 * KVR_NS_PER_MS, true, false);
    cr_assert(snapshot_served().index_partial, "back: the catch-up due");
    ticks(now + 900 * KVR_NS_PER_MS, now + 1500 * KVR_NS_PER_MS);
    cr_assert(not(snapshot_served().index_partial));
    rd.fleet->synced = false;
    cr_assert(snapshot_served().index_partial, "a router that never took its snapshot");
    cr_assert(eq(u64, rd.fleet->snapshots_served, 8));
    cr_assert(eq(u64, rd.fleet->snapshots_served_partial, 5));
}

/* A full sync request of router `asker` (token 11), as its subscription brings it. */
static void ask_full(const char *asker)
{
    struct kvr_wire_sync q = {.router_id = (char *)asker, .full = true, .token = 11};
    char reply[128];
    snprintf(reply, sizeof reply, "kv.default.router.pages.%s", asker);
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    kvr_sync_on_request(&rd, reply, b.data, b.len);
    kvr_buf_free(&b);
}

/* Router b's ask, on another thread (a full request on the lookup subject, which has a delivery
 * thread of its own), started while a's snapshot is between two slices. */
static atomic_bool second_started, second_done;

static void *ask_b(void *arg)
{
    (void)arg;
    ask_full("b");
    atomic_store(&second_done, true);
    return NULL;
}

static pthread_t second;

static kvr_status sink_starting_b(void *ctx, const struct kvr_outmsg *m)
{
    kvr_status st = rec_record(ctx, m);
    if (!strcmp(m->subject, "kv.default.router.pages.a") && !atomic_load(&second_started)) {
        atomic_store(&second_started, true);
        cr_assert(eq(int, pthread_create(&second, NULL, ask_b, NULL), 0));
        for (int i = 0; i < 100 && !atomic_load(&second_done); i++)
            kvr_sleep_ns(2 * KVR_NS_PER_MS); /* b's snapshot, served meanwhile or after a's */
    }
    return st;
}

/* The index entries of the snapshot sent to subject from rec_sent[from] on; *lasts: its pages
 * that said last. */
static uint32_t snapshot_entries(const char *subject, size_t from, int *lasts)
{
    uint32_t total = 0;
    *lasts = 0;
    for (size_t i = from; i < rec_nsent; i++) {
        struct kvr_wire_page_head head;
        if (strcmp(rec_sent[i].subject, subject))
            continue;
        page_entries = 0;
        cr_assert(eq(int,
                     kvr_wire_decode_page(rec_sent[i].data, rec_sent[i].len, NULL, count_page_entry,
                                          NULL, &head),
                     KVR_OK));
        total += page_entries;
        *lasts += head.last;
    }
    return total;
}

/* Two snapshots asked at once (one on the sync subject, one on the lookup subject: two delivery
 * threads) share the router's walks: the second waits for the first, and each has every entry. */
Test(routerd, two_snapshots_at_once_each_have_every_entry)
{
    heartbeat(1, 4096, NULL, 0, 10000);
    for (uint32_t i = 0; i < 80; i++) /* 1,280 entries: a snapshot of three slices */
        kv_stored(1, i + 1, 100000 + 16 * i, 16);
    uint32_t n = index_entries();
    cr_assert(eq(u32, n, 1280));
    size_t mark = rec_nsent;
    atomic_store(&second_started, false);
    atomic_store(&second_done, false);
    rd.sink.publish = sink_starting_b;
    ask_full("a");
    cr_assert(atomic_load(&second_started));
    pthread_join(second, NULL);
    int lasts;
    cr_assert(eq(u32, snapshot_entries("kv.default.router.pages.a", mark, &lasts), n));
    cr_assert(eq(int, lasts, 1));
    cr_assert(eq(u32, snapshot_entries("kv.default.router.pages.b", mark, &lasts), n));
    cr_assert(eq(int, lasts, 1));
    cr_assert(eq(u64, rd.fleet->snapshots_served, 2));
}

/* --- a snapshot whose walk is cut short ------------------------------------------------------ */

/* Router "b", asking router r1 (rd) for its snapshot: a second daemon state in this process. */
static struct kvr_rd_config asker_cfg;
static struct kvr_rd asker;

/* Start b: worker 1 known, router r1 heard serving, its own index entries from worker 1's
 * event storing blocks 900-903. */
static void asker_start(void)
{
    asker_cfg = cfg;
    strcpy(asker_cfg.id, "b");
    asker_cfg.kv_replay_ns = 0; /* what b applied before its ask is not applied again */
    cr_assert(eq(
        int, kvr_rd_init(&asker, &asker_cfg, (struct kvr_sink){.publish = rec_record, .ctx = NULL}),
        KVR_OK));
    cr_assert(eq(int, kvr_fleet_create(&asker), KVR_OK));
    asker.fleet->synced = true;
    asker.serving = true;
    struct rec_event e = rec_heartbeat(1, 4096, NULL, 0, 10000, 0);
    kvr_events_on_message(&asker, e.subject, e.b.data, e.b.len);
    struct kvr_kv_block blocks[4] = {{900, 900}, {901, 901}, {902, 902}, {903, 903}};
    cr_assert(eq(int, kvr_wire_encode_stored(&e.b, 1, 1, NULL, blocks, 4), KVR_OK));
    kvr_events_on_message(&asker, "kv.default.ev.1.kv", e.b.data, e.b.len);
    cr_assert(eq(int, kvr_wire_encode_gossip_hello(&e.b, "r1", rd.fleet->epoch, 0, true), KVR_OK));
    kvr_fleet_on_gossip(&asker, "kv.default.router.gossip.r1", e.b.data, e.b.len);
    kvr_buf_free(&e.b);
}

static void asker_stop(void)
{
    kvr_fleet_destroy(&asker);
    kvr_rd_free(&asker);
}

static uint32_t entries_of(struct kvr_rd *r)
{
    struct kvr_router_stats s;
    kvr_router_stats(r->core, &s);
    return s.index_entries;
}

/* While set, every page r1 publishes to b has r1's worker 1 store its 80 chains again (their
 * entries move to the end of the index's order, so the walk meets them again). */
static bool churning, in_churn;
static uint64_t churn_seq = 80; /* worker 1's KV events numbered on from its 80 chains */

static kvr_status sink_churning(void *ctx, const struct kvr_outmsg *m)
{
    kvr_status st = rec_record(ctx, m);
    if (churning && !in_churn && !strcmp(m->subject, "kv.default.router.pages.b")) {
        in_churn = true; /* the events' handler publishes through this sink too */
        for (uint32_t i = 0; i < 80; i++)
            kv_stored(1, ++churn_seq, 100000 + 16 * i, 16);
        in_churn = false;
    }
    return st;
}

/* b asks r1 (after the tick at `tick`, or at once when 0), r1 serves it, b takes the pages. The
 * pages' heads in *first and *last; how many. */
static int asked_and_served(uint64_t tick, struct kvr_wire_page_head *first,
                            struct kvr_wire_page_head *last)
{
    size_t mark = rec_nsent;
    pthread_mutex_lock(&asker.mu);
    if (tick)
        kvr_sync_tick(&asker, tick);
    else
        cr_assert(kvr_sync_resync(&asker, "a test"));
    pthread_mutex_unlock(&asker.mu);
    kvr_rd_flush(&asker);
    const struct rec_sent *ask = NULL;
    cr_assert(eq(int, rec_count("kv.default.router.sync.r1", mark, &ask), 1), "b asked r1");
    kvr_sync_on_request(&rd, "kv.default.router.pages.b", ask->data, ask->len);
    int n = 0;
    for (size_t i = mark; i < rec_nsent; i++) {
        if (strcmp(rec_sent[i].subject, "kv.default.router.pages.b"))
            continue;
        cr_assert(eq(int,
                     kvr_wire_decode_page(rec_sent[i].data, rec_sent[i].len, NULL, NULL, NULL,
                                          n ? last : first),
                     KVR_OK));
        if (!n++)
            *last = *first;
        kvr_sync_on_page(&asker, rec_sent[i].data, rec_sent[i].len);
    }
    return n;
}

/* A snapshot served while the state keeps changing under it stops its walk (at twice the items it
 * began with) before it has sent the whole index. Its last page said nothing of it: its asker took
 * it for the whole index and asked nobody again, its index short of entries until they were
 * stored again. The last page says the index has holes now; the asker keeps what came, and asks
 * again a second later. */
Test(routerd, a_snapshot_cut_short_says_so_and_its_asker_asks_again)
{
    cfg.hello_ns = 500 * KVR_NS_PER_MS;
    cfg.sync_timeout_ns = 60 * KVR_NS_PER_S;
    restart();
    heartbeat(1, 4096, NULL, 0, 10000);
    for (uint32_t i = 0; i < 80; i++) /* 1,280 entries: pages of 512 */
        kv_stored(1, i + 1, 100000 + 16 * i, 16);
    cr_assert(eq(u32, index_entries(), 1280));
    asker_start();
    cr_assert(eq(u32, entries_of(&asker), 4));
    rd.sink.publish = sink_churning;
    churning = true;
    struct kvr_wire_page_head first, last;
    int pages = asked_and_served(0, &first, &last);
    churning = false;
    uint32_t got = entries_of(&asker);
    cr_assert(lt(u32, got, 1280), "entries never sent");
    cr_assert(gt(int, pages, 1));
    cr_assert(not(first.index_partial), "r1's own index is whole");
    cr_assert(last.last && last.index_partial, "the last page says the index sent has holes");
    cr_assert(not(asker.fleet->syncing));
    cr_assert(not(eq(u64, asker.fleet->resync_retry_at, 0)), "b asks again");
    cr_assert(gt(u32, got, 4), "b took what came in place of its own (%u)", got);
    cr_assert(eq(u64, asker.fleet->snapshots_incomplete, 1));
    cr_assert(eq(u64, asker.fleet->resyncs_kept_index, 0));
    cr_assert(eq(u64, rd.fleet->snapshots_served_cut, 1), "the walk was cut");
    /* a second later, r1 not churning: the whole index */
    pages = asked_and_served(asker.fleet->resync_retry_at, &first, &last);
    cr_assert(not(last.index_partial));
    cr_assert(eq(u32, entries_of(&asker), 1280));
    cr_assert(eq(u64, asker.fleet->snapshots_incomplete, 1));
    cr_assert(eq(u64, asker.fleet->resync_retry_at, 0));
    cr_assert(eq(u64, rd.fleet->snapshots_served_cut, 1));
    cr_assert(eq(u64, rd.fleet->snapshots_served, 2));
    asker_stop();
}

/* Ticks of 100 ms from *t on until this router asks the peer for a snapshot: its token. */
static uint64_t tick_until_asked(uint64_t *t)
{
    size_t mark = rec_nsent;
    const struct rec_sent *ask = NULL;
    for (int i = 0; i < 40 && !rec_count("kv.default.router.sync.peer", mark, &ask); i++) {
        *t += 100 * KVR_NS_PER_MS;
        kvr_timer_tick(&rd, *t, true, false);
    }
    cr_assert(not(eq(ptr, (void *)ask, NULL)), "a snapshot asked of the peer");
    struct kvr_wire_sync q;
    cr_assert(eq(int, kvr_wire_decode_sync(ask->data, ask->len, &q), KVR_OK));
    cr_assert(q.full);
    uint64_t token = q.token;
    kvr_wire_sync_free(&q);
    return token;
}

/* The peer's one-page answer to token: index entries e[0..n), its index whole or not. */
static void answer_entries(uint64_t token, const struct kvr_index_record *e, uint32_t n,
                           bool partial)
{
    struct kvr_page p;
    kvr_page_init(&p);
    for (uint32_t i = 0; i < n; i++)
        cr_assert(eq(int, kvr_page_add_entry(&p, &e[i]), KVR_OK));
    p.index_partial = partial;
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_page_encode(&p, &b, true, token), KVR_OK));
    kvr_sync_on_page(&rd, b.data, b.len);
    kvr_buf_free(&b);
    kvr_page_free(&p);
    cr_assert(not(rd.fleet->syncing));
    cr_assert(not(rd.holding), "the KV events held meanwhile are applied");
}

/* The peer's one-page answer to token: n entries of worker 1, its index whole or not. */
static void answer(uint64_t token, uint32_t n, bool partial)
{
    struct kvr_index_record e[8];
    cr_assert(le(u32, n, 8));
    for (uint32_t i = 0; i < n; i++)
        e[i] = (struct kvr_index_record){1, 900 + i, false, 0, 60 * KVR_NS_PER_S};
    answer_entries(token, e, n, partial);
}

struct entries {
    struct kvr_index_record e[16];
    uint32_t n;
};

static void keep_entry(void *ctx, const struct kvr_index_record *e)
{
    struct entries *k = ctx;
    cr_assert(lt(u32, k->n, 16));
    k->e[k->n++] = *e;
}

Test(routerd, a_resync_answered_from_an_index_with_holes_keeps_its_own)
{
    cfg.hello_ns = 500 * KVR_NS_PER_MS;      /* a peer heard stays alive however slow the run */
    cfg.sync_timeout_ns = 60 * KVR_NS_PER_S; /* past the ticks' clock, which runs ahead */
    cfg.kv_replay_ns = 0; /* its events are seconds apart on the ticks' clock, not the log's */
    heartbeat(1, 4096, NULL, 0, 10000);
    peer_hello();
    kv_stored(1, 1, 100, 8);
    kv_stored(1, 3, 200, 2); /* 2 never comes */
    cr_assert(eq(u32, index_entries(), 10));
    uint64_t t = kvr_now_ns();
    for (int k = 1; k <= 3; k++) { /* the only peer's index has holes: asked three times */
        answer(tick_until_asked(&t), 3, true);
        cr_assert(eq(u32, index_entries(), 10), "its own index kept, not traded for 3 entries");
        cr_assert(eq(u64, rd.fleet->resyncs_kept_index, (uint64_t)k));
    }
    size_t mark = rec_nsent;
    ticks(t + 100 * KVR_NS_PER_MS, t + 3 * KVR_NS_PER_S);
    cr_assert(eq(int, rec_count("kv.default.router.sync.peer", mark, NULL), 0),
              "three in a row: given up");
    /* the next gap (after the 10 s between catch-ups) takes a whole index in place of its own */
    ticks(t + 3100 * KVR_NS_PER_MS, t + 11 * KVR_NS_PER_S);
    t += 11 * KVR_NS_PER_S;
    heartbeat(1, 4096, NULL, 0, 10000);
    peer_hello();
    kv_stored(1, 5, 300, 2); /* 4 never comes */
    cr_assert(eq(u32, index_entries(), 12));
    answer(tick_until_asked(&t), 3, false);
    cr_assert(eq(u32, index_entries(), 3), "replaced");
    cr_assert(eq(u64, rd.fleet->resyncs, 4));
    cr_assert(eq(u64, rd.fleet->resyncs_kept_index, 3));
}

/* The peer's answer to token in two pages whose walk was cut short: entries of worker 1 from
 * engine id `first` on, n1 in the first page (which says nothing of holes) and n2 in the last
 * (which says the index sent has holes). */
static void answer_cut(uint64_t token, uint64_t first, uint32_t n1, uint32_t n2)
{
    struct kvr_page p;
    kvr_page_init(&p);
    struct kvr_buf b = {0};
    for (uint32_t page = 0; page < 2; page++) {
        for (uint32_t i = 0; i < (page ? n2 : n1); i++) {
            struct kvr_index_record e = {1, first, true, first, 0};
            first++;
            cr_assert(eq(int, kvr_page_add_entry(&p, &e), KVR_OK));
        }
        p.index_partial = page == 1;
        cr_assert(eq(int, kvr_page_encode(&p, &b, page == 1, token), KVR_OK));
        kvr_sync_on_page(&rd, b.data, b.len);
    }
    kvr_buf_free(&b);
    kvr_page_free(&p);
}

/* The token of the snapshot asked of the peer (set by sink_noting_ask, which records too). */
static _Atomic uint64_t asked_token;

static kvr_status sink_noting_ask(void *ctx, const struct kvr_outmsg *m)
{
    kvr_status st = rec_record(ctx, m);
    struct kvr_wire_sync q;
    if (!strcmp(m->subject, "kv.default.router.sync.peer") &&
        kvr_wire_decode_sync(m->data, m->len, &q) == KVR_OK) {
        atomic_store(&asked_token, q.token);
        kvr_wire_sync_free(&q);
    }
    return st;
}

static void *sync_start(void *arg)
{
    (void)arg;
    kvr_sync_start(&rd); /* waits for its snapshot */
    return NULL;
}

/* A snapshot whose index has holes is taken as it came and a peer asked again a second later,
 * three such answers in a row at most: at start-up (which has no index of its own to keep: it
 * took such an answer and asked nobody again), and after, as a resync whose first page said
 * nothing of the cut its last page tells; a one-page answer that says so is one from an index
 * with holes (the resync keeps its own index). */
/* A router of worker 1 that has heard a serving peer ("peer"), asking it for snapshots. */
static void with_a_serving_peer(void)
{
    cfg.hello_ns = 500 * KVR_NS_PER_MS;
    cfg.sync_timeout_ns = 60 * KVR_NS_PER_S;
    cfg.kv_replay_ns = 0;
    restart();
    heartbeat(1, 4096, NULL, 0, 10000);
    peer_hello();
}

Test(routerd, a_snapshot_with_holes_is_taken_and_asked_again_three_times_at_most)
{
    with_a_serving_peer();
    rd.fleet->synced = false; /* starting */
    rd.sink.publish = sink_noting_ask;
    atomic_store(&asked_token, 0);
    pthread_t starting;
    cr_assert(eq(int, pthread_create(&starting, NULL, sync_start, NULL), 0));
    uint64_t token = 0;
    for (int i = 0; i < 5000 && !(token = atomic_load(&asked_token)); i++)
        kvr_sleep_ns(KVR_NS_PER_MS);
    cr_assert(not(eq(u64, token, 0)), "a snapshot asked at start-up");
    answer_cut(token, 900, 3, 2);
    pthread_join(starting, NULL);
    rd.sink.publish = rec_record;
    cr_assert(rd.fleet->synced);
    cr_assert(eq(u32, index_entries(), 5), "what came is taken");
    cr_assert(not(eq(u64, rd.fleet->resync_retry_at, 0)), "asked again");
    cr_assert(eq(u64, rd.fleet->snapshots_incomplete, 1));
    cr_assert(snapshot_served().index_partial, "meanwhile its own snapshots say it has holes");
    uint64_t t = kvr_now_ns();
    answer_cut(tick_until_asked(&t), 910, 3, 1); /* a resync: the first page replaced the index */
    cr_assert(eq(u32, index_entries(), 4));
    cr_assert(eq(u64, rd.fleet->snapshots_incomplete, 2));
    cr_assert(not(eq(u64, rd.fleet->resync_retry_at, 0)));
    answer(tick_until_asked(&t), 2, true); /* one page, with holes: its own index kept */
    cr_assert(eq(u32, index_entries(), 4));
    cr_assert(eq(u64, rd.fleet->resyncs_kept_index, 1));
    cr_assert(eq(u64, rd.fleet->resync_retry_at, 0), "three in a row: let go");
    size_t mark = rec_nsent;
    ticks(t + 100 * KVR_NS_PER_MS, t + 3 * KVR_NS_PER_S);
    cr_assert(eq(int, rec_count("kv.default.router.sync.peer", mark, NULL), 0));
    cr_assert(eq(u64, rd.fleet->resyncs, 2));
    cr_assert(not(snapshot_served().index_partial));
    char *text = metrics_text();
    cr_assert(strstr(text, "\nkvrouter_replication_snapshots_incomplete_total 2\n") != NULL);
    free(text);
}

/* A router that kept its own index because the peer's answer had holes asks again later, but its
 * index is as whole as before: its own snapshots say nothing of holes. Said to have them (the
 * retry due read as holes), three routers asking each other again after a server node's restart
 * each kept their own index and never traded (a clean-clone CI run: 127 entries against 21). */
Test(routerd, a_router_that_kept_its_index_over_a_peers_holes_serves_it_whole)
{
    with_a_serving_peer();
    size_t mark = rec_nsent;
    pthread_mutex_lock(&rd.mu);
    cr_assert(kvr_sync_resync(&rd, "a test"));
    pthread_mutex_unlock(&rd.mu);
    kvr_rd_flush(&rd);
    const struct rec_sent *ask = NULL;
    cr_assert(eq(int, rec_count("kv.default.router.sync.peer", mark, &ask), 1));
    struct kvr_wire_sync q;
    cr_assert(eq(int, kvr_wire_decode_sync(ask->data, ask->len, &q), KVR_OK));
    uint64_t token = q.token;
    kvr_wire_sync_free(&q);
    answer(token, 2, true); /* one page, with holes: its own index kept */
    cr_assert(eq(u64, rd.fleet->resyncs_kept_index, 1));
    cr_assert(not(eq(u64, rd.fleet->resync_retry_at, 0)), "asked again later");
    cr_assert(not(snapshot_served().index_partial), "its own index is as whole as before");
}

/* Worker 1's KV event number seq removing the block of engine id `gone`. */
static void kv_removed(uint64_t seq, uint64_t gone)
{
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_removed(&b, 1, seq, &gone, 1), KVR_OK));
    kv_event_in(1, &b);
}

/* This router's index entries into *k, the one of engine id `except` left out (0: none). */
static void index_now(struct entries *k, uint64_t except)
{
    struct entries all = {.n = 0};
    kvr_router_export_index(rd.core, keep_entry, &all, kvr_now_ns());
    k->n = 0;
    for (uint32_t i = 0; i < all.n; i++)
        if (!except || all.e[i].engine_id != except)
            k->e[k->n++] = all.e[i];
}

static bool index_has(uint64_t engine_id)
{
    struct entries now;
    index_now(&now, 0);
    for (uint32_t i = 0; i < now.n; i++)
        if (now.e[i].engine_id == engine_id)
            return true;
    return false;
}

/* Worker 1 and a serving peer, and worker 1's event 1 storing blocks 100-103 (a chain from the
 * root, engine ids as the hashes); the peer stays alive and its snapshots are waited for however
 * slow the run. */
static void worker_1_stores_100_to_103_and_a_peer_serves(void)
{
    cfg.hello_ns = 500 * KVR_NS_PER_MS;
    cfg.sync_timeout_ns = 60 * KVR_NS_PER_S;
    heartbeat(1, 4096, NULL, 0, 10000);
    peer_hello();
    kv_stored(1, 1, 100, 4);
}

/* The peer answers with the index as it was a moment ago: a store, a removal and a store this
 * router applied before it asked had not reached the peer yet. They are applied again after the
 * peer's index replaces this one's, or the removed block would stay and the stored ones be gone;
 * the event before the one this router missed is not (it could undo what it missed). */
Test(routerd, a_resync_applies_again_what_its_peer_had_not_applied_yet)
{
    worker_1_stores_100_to_103_and_a_peer_serves();
    struct entries peer; /* the peer's index: these four blocks (and whatever 2 was) */
    index_now(&peer, 0);
    cr_assert(eq(u32, peer.n, 4));
    kv_stored(1, 3, 150, 1); /* 2 never comes: a gap, so a resync */
    kv_removed(4, 103);
    kv_stored(1, 5, 200, 2);
    cr_assert(eq(u32, index_entries(), 6));
    uint64_t t = kvr_now_ns();
    uint64_t token = tick_until_asked(&t);
    kv_stored(1, 6, 300, 1); /* held until the answer is in */
    answer_entries(token, peer.e, peer.n, false);
    cr_assert(eq(u64, rd.fleet->kv_replayed, 3), "3, 4 and 5: those after the one missed");
    cr_assert(eq(u32, index_entries(), 7), "100-102, 150, 200-201 and 300");
    cr_assert(not(index_has(103)), "the removed block stayed removed");
    cr_assert(index_has(150) && index_has(201) && index_has(300));
    char *text = metrics_text();
    cr_assert(strstr(text, "\nkvrouter_replication_kv_events_replayed_total 3\n") != NULL);
    cr_assert(strstr(text, "\nkvrouter_replication_kv_log_dropped_total 0\n") != NULL);
    free(text);
    /* a resync answered from an index with holes keeps this one's: nothing to apply again */
    ticks(t + 100 * KVR_NS_PER_MS, t + 11 * KVR_NS_PER_S); /* the 10 s between catch-ups */
    t += 11 * KVR_NS_PER_S;
    heartbeat(1, 4096, NULL, 0, 10000);
    peer_hello();
    kv_stored(1, 8, 400, 1); /* 7 never comes */
    answer(tick_until_asked(&t), 3, true);
    cr_assert(eq(u64, rd.fleet->kv_replayed, 3));
    cr_assert(eq(u32, index_entries(), 8));
}

/* This router missed a removal the peer applied: its snapshot is right, and the store before the
 * removal, applied again, would bring the removed block back here for good. */
Test(routerd, a_resync_does_not_apply_again_what_came_before_an_event_it_missed)
{
    worker_1_stores_100_to_103_and_a_peer_serves();
    /* 2, the removal of 103, is lost on the way here; the peer applied it */
    kv_stored(1, 3, 300, 1);
    struct entries peer;
    index_now(&peer, 103);
    cr_assert(eq(u32, peer.n, 4));
    uint64_t t = kvr_now_ns();
    answer_entries(tick_until_asked(&t), peer.e, peer.n, false);
    cr_assert(eq(u64, rd.fleet->kv_replayed, 1), "3 only");
    cr_assert(not(index_has(103)), "the block the peer knows removed is not stored again");
    cr_assert(eq(u32, index_entries(), 4));
}

/* The events connection was cut and came back: what came before the cut is not applied again
 * over the snapshot (the events lost in the cut may have undone it). */
Test(routerd, a_resync_after_a_cut_applies_nothing_from_before_it)
{
    worker_1_stores_100_to_103_and_a_peer_serves();
    uint64_t t = kvr_now_ns();
    kvr_timer_tick(&rd, t + 100 * KVR_NS_PER_MS, false, false); /* cut */
    t += 200 * KVR_NS_PER_MS;
    kvr_timer_tick(&rd, t, true, false); /* back: a resync is due */
    peer_hello();
    struct entries peer;
    index_now(&peer, 103); /* the peer saw 103 removed meanwhile */
    answer_entries(tick_until_asked(&t), peer.e, peer.n, false);
    cr_assert(eq(u64, rd.fleet->kv_replayed, 0));
    cr_assert(not(index_has(103)));
}

/* A catch-up that finds no peer to ask (after a server node's restart each may be catching up
 * itself, not serving, or not heard again yet) is tried again rather than given up: a router
 * whose node restarted kept 1 index entry for good where its peers had 129 (clean-clone CI). */
Test(routerd, a_catch_up_with_no_peer_serving_yet_is_tried_again)
{
    worker_1_stores_100_to_103_and_a_peer_serves();
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, "peer", 6, 0, false), KVR_OK));
    gossip_in(&rd, b.data, b.len); /* the peer catches up itself: not serving */
    kvr_buf_free(&b);
    uint64_t t = kvr_now_ns();
    kvr_timer_tick(&rd, t + 100 * KVR_NS_PER_MS, false, false); /* cut */
    t += 200 * KVR_NS_PER_MS;
    kvr_timer_tick(&rd, t, true, false); /* back: a catch-up is due in 250 ms */
    size_t mark = rec_nsent;
    ticks(t + 100 * KVR_NS_PER_MS, t + 700 * KVR_NS_PER_MS);
    cr_assert(eq(int, rec_count("kv.default.router.sync.peer", mark, NULL), 0), "nobody to ask");
    t += 700 * KVR_NS_PER_MS;
    cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, "peer", 6, 0, true), KVR_OK));
    gossip_in(&rd, b.data, b.len); /* serving again */
    kvr_buf_free(&b);
    tick_until_asked(&t);
}

/* --- requests queued at a peer (Queued notices) --------------------------------------------- */

/* Of the Queued notices, the releases (or not); the last one kept in last (when not NULL). */
struct notices {
    bool released;
    struct kvr_wire_queued *last;
};

static bool a_notice(void *ctx, struct kvr_wire_gossip *g)
{
    struct notices *x = ctx;
    if (g->kind != KVR_WIRE_GOSSIP_QUEUED || g->q.released != x->released)
        return false;
    if (x->last) {
        free(x->last->reply);
        free(x->last->request_id);
        *x->last = g->q;
        g->q = (struct kvr_wire_queued){0};
    }
    return true;
}

/* Queued notices gossiped from rec_sent[from] on that were releases (or not); *last (when given):
 * the last one. */
static int queued_notices(size_t from, bool released, struct kvr_wire_queued *last)
{
    struct notices x = {released, last};
    return each_gossip(from, a_notice, &x);
}

/* Router `origin` says it holds (or released) the client's request id from reply, queued. */
static void queued_in(const char *origin, const char *reply, const char *id, uint32_t wait_ms,
                      bool released)
{
    struct kvr_wire_queued q = {(char *)reply, (char *)id, 1000,
                                wait_ms,       released,   released ? KVR_ERR_OVERLOADED : KVR_OK};
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_gossip_queued(&b, origin, 5, 0, &q), KVR_OK));
    gossip_in(&rd, b.data, b.len);
    kvr_buf_free(&b);
}

/*
 * A request that waits in this router's queue is told to the peers (so one that gets its
 * client's resend absorbs it), and released when it leaves the queue unplaced; once placed, its
 * decision replaces the notice.
 */
Test(routerd, a_request_queued_here_is_told_to_the_peers_until_it_is_answered)
{
    busy_above_half();
    heartbeat(1, 8, NULL, 0, 1000); /* 8 blocks: one 320-token request makes it busy */
    generate("_INBOX.a", "first", 1, 320);
    cr_assert(eq(int, queued_notices(0, false, NULL), 0), "placed at once: a decision only");
    generate("_INBOX.b", "waits", 2, 320);
    struct kvr_wire_queued q = {0};
    cr_assert(eq(int, queued_notices(0, false, &q), 1), "told while it waits");
    cr_assert(eq(str, q.reply, "_INBOX.b"));
    cr_assert(eq(str, q.request_id, "waits"));
    cr_assert(eq(u32, q.wait_ms, 5000), "the queue timeout");
    cr_assert(gt(u64, q.decided_ns, 0));
    generate("_INBOX.c", "cancelled", 3, 320);
    cancel_request("_INBOX.c", "cancelled");
    cr_assert(eq(int, queued_notices(0, true, &q), 1), "released once answered");
    cr_assert(eq(str, q.request_id, "cancelled"));
    free(q.reply);
    free(q.request_id);
    worker_done(1, kvr_pending_key("_INBOX.a", "first")); /* "waits" is placed */
    cr_assert(eq(int, decisions_since(0), 2));
    cr_assert(not(kvr_pending_find(&rd.pend, kvr_pending_key("_INBOX.b", "waits"))->queued_notice),
              "its decision replaced the notice: a later failure releases nothing");
    cr_assert(eq(int, queued_notices(0, true, NULL), 1), "a placed one is not released");
    cr_assert(eq(u64, rd.fleet->queued_sent, 3));
}

/*
 * A queued request that the queue timeout ends is released too, with its answer; a resend right
 * after that answer crossed it on its way (its client sent it before the answer came: under
 * overload its third resend, at ~6 s, meets a 5 s queue timeout) and is ignored, where it was
 * placed as a new attempt: an error, then a stream. Later, it is a new attempt.
 */
Test(routerd, a_request_the_queue_gives_up_on_is_released_and_a_crossing_resend_ignored)
{
    cfg.core.queue_timeout_ns = 1 * KVR_NS_PER_MS;
    cfg.crossing_ns = 300 * KVR_NS_PER_MS; /* the resend below comes well within it */
    busy_above_half();
    heartbeat(1, 8, NULL, 0, 1000);
    generate("_INBOX.a", "first", 1, 320);
    generate("_INBOX.b", "waits", 2, 320);
    cr_assert(eq(int, queued_notices(0, false, NULL), 1));
    kvr_sleep_ns(5 * KVR_NS_PER_MS);
    kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count("_INBOX.b", 0, &m), 1));
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_OVERLOADED));
    struct kvr_wire_queued q = {0};
    cr_assert(eq(int, queued_notices(0, true, &q), 1));
    cr_assert(eq(u32, q.error_code, KVR_ERR_OVERLOADED), "the peers learn the answer");
    free(q.reply);
    free(q.request_id);
    generate("_INBOX.b", "waits", 2, 320); /* its resend, sent before the answer came */
    cr_assert(eq(u64, rd.n.resends_after_error, 1));
    cr_assert(eq(int, queued_notices(0, false, NULL), 1), "not queued again");
    kvr_sleep_ns(310 * KVR_NS_PER_MS);
    generate("_INBOX.b", "waits", 2, 320); /* a new attempt */
    cr_assert(eq(int, queued_notices(0, false, NULL), 2), "taken, and waits again");
}

/* The queue's timeout runs while the router hears no worker (its events connection down): the
 * request waiting was answered only once the events came back, or never. */
Test(routerd, a_blind_router_still_times_out_its_queue)
{
    cfg.core.queue_timeout_ns = 1 * KVR_NS_PER_MS;
    busy_above_half();
    heartbeat(1, 8, NULL, 0, 1000);
    generate("_INBOX.a", "first", 1, 320);
    generate("_INBOX.b", "waits", 2, 320);
    cr_assert(eq(u32, kvr_router_queue_len(rd.core), 1));
    uint64_t t = kvr_now_ns();
    for (int i = 1; i <= 5; i++) /* a second, the events connection down */
        kvr_timer_tick(&rd, t + (uint64_t)i * 200 * KVR_NS_PER_MS, false, false);
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count("_INBOX.b", 0, &m), 1), "answered while blind");
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_OVERLOADED));
    cr_assert(eq(u32, kvr_router_queue_len(rd.core), 0));
    /* and no worker was judged by the silence */
    cr_assert(eq(int, kvr_router_worker_load(rd.core, 1, NULL, NULL, NULL), KVR_OK));
    cr_assert(eq(int, rec_count("_INBOX.a", 0, NULL), 0), "the placed one is still in flight");
}

/* A router that stops with requests still waiting for a worker after its drain answers them
 * ERR_SHUTDOWN: nobody else would (a single router), or only a peer ~9 s later. */
Test(routerd, requests_still_queued_at_the_stop_are_answered)
{
    busy_above_half();
    heartbeat(1, 8, NULL, 0, 1000);
    generate("_INBOX.a", "first", 1, 320);
    generate("_INBOX.b", "waits", 2, 320);
    generate("_INBOX.c", "waits too", 3, 320);
    cr_assert(eq(u32, kvr_router_queue_len(rd.core), 2));
    cr_assert(eq(int, queued_notices(0, false, NULL), 2), "the peers know they wait here");
    pthread_mutex_lock(&rd.mu);
    kvr_place_refuse_unplaced(&rd, KVR_ERR_SHUTDOWN);
    kvr_place_settle(&rd);
    kvr_rd_unlock_flush(&rd);
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count("_INBOX.b", 0, &m), 1));
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_SHUTDOWN));
    cr_assert(eq(int, rec_count("_INBOX.c", 0, &m), 1));
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_SHUTDOWN));
    cr_assert(eq(u32, kvr_router_queue_len(rd.core), 0));
    struct kvr_wire_queued q = {0};
    cr_assert(eq(int, queued_notices(0, true, &q), 2), "and learn they were answered: a peer "
                                                       "standing in would answer them again");
    cr_assert(eq(u32, q.error_code, KVR_ERR_SHUTDOWN));
    free(q.reply);
    free(q.request_id);
    cr_assert(eq(int, rec_count("_INBOX.a", 0, NULL), 0), "the one on its worker goes on");
    cr_assert(not(eq(ptr, kvr_pending_find(&rd.pend, kvr_pending_key("_INBOX.a", "first")), NULL)));
}

/* A worker's refusal reaches the client from the worker; a resend right after it crossed it and
 * is ignored, a later one is a new attempt (placed again). (A copy stopped for another worker's,
 * ERR_SUPERSEDED, answered nobody: a_copy_stopped_for_another_worker_has_not_ended.) */
Test(routerd, a_resend_crossing_a_workers_refusal_is_ignored)
{
    cfg.crossing_ns = 300 * KVR_NS_PER_MS;
    heartbeat(1, 4096, NULL, 0, 1000);
    generate("_INBOX.f", "full", 1, 128);
    uint64_t key = kvr_pending_key("_INBOX.f", "full");
    worker_ended(1, key, KVR_ERR_FULL); /* the worker told the client */
    generate("_INBOX.f", "full", 1, 128);
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 1), "crossed it");
    cr_assert(eq(u64, rd.n.resends_after_error, 1));
    kvr_sleep_ns(310 * KVR_NS_PER_MS);
    generate("_INBOX.f", "full", 1, 128); /* a new attempt */
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 2));
    generate("_INBOX.f", "full", 1, 128); /* and its own resend: absorbed */
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 2));
}

/* A router that reads its sockets late stretches the window by as much: a resend it reads 3 s
 * after the answer may have been sent before it (an overloaded run: loops 20-27 s behind, 115-135
 * requests answered, then streamed). */
Test(routerd, a_router_behind_its_sockets_takes_a_later_resend_for_a_crossing_one)
{
    cfg.crossing_ns = 300 * KVR_NS_PER_MS;
    heartbeat(1, 4096, NULL, 0, 1000);
    generate("_INBOX.b", "behind", 1, 128);
    worker_ended(1, kvr_pending_key("_INBOX.b", "behind"), KVR_ERR_FULL);
    rd.events_behind_ns = 400 * KVR_NS_PER_MS; /* as the last tick measured it */
    kvr_sleep_ns(400 * KVR_NS_PER_MS);         /* past the window, within window + lag */
    generate("_INBOX.b", "behind", 1, 128);
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 1), "crossed it");
    cr_assert(eq(u64, rd.n.resends_after_error, 1));
    kvr_sleep_ns(310 * KVR_NS_PER_MS); /* past both */
    generate("_INBOX.b", "behind", 1, 128);
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 2), "a new attempt");
}

/* A worker that dies fails its requests on every router; each remembers the answer, so a resend
 * that crossed it, through any router, is not placed as a new attempt. */
Test(routerd, a_resend_crossing_a_worker_lost_answer_is_ignored_by_every_router)
{
    cfg.hello_ns = 500 * KVR_NS_PER_MS; /* the peer stays alive however slow the run */
    heartbeat(1, 4096, NULL, 0, 1);
    heartbeat(2, 4096, NULL, 0, 1000);
    uint64_t key = kvr_pending_key("_INBOX.w", "lost");
    peer_decision_at("a-peer", 1, key, 1, "_INBOX.w", "lost", 1000, 0);
    kvr_sleep_ns(10 * KVR_NS_PER_MS); /* worker 1 is silent for 3.2 of its intervals */
    kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    cr_assert(eq(ptr, kvr_pending_find(&rd.pend, key), NULL), "its origin answers");
    generate("_INBOX.w", "lost", 1, 128); /* the client's resend, through this router */
    cr_assert(eq(int, rec_count("kv.default.worker.2.generate", 0, NULL), 0), "crossed it");
    cr_assert(eq(int, rec_count("_INBOX.w", 0, NULL), 0));
    cr_assert(eq(u64, rd.n.resends_after_error, 1));
}

/*
 * A worker written off (cut off from NATS for longer than its timeout) fails its started request
 * to the client with ERR_WORKER_LOST; a done it published during the cut comes late, when its
 * connection is back. That done must not turn the router's error into an end: the client's same
 * request, sent again past the crossing window, is a new attempt (docs/protocol.md, "Resending"),
 * and was ignored as a resend after the end, answered by nobody.
 */
Test(routerd, a_late_done_of_a_lost_worker_leaves_the_next_attempt_to_be_placed)
{
    cfg.crossing_ns = 300 * KVR_NS_PER_MS;
    heartbeat(1, 4096, NULL, 0, 1);
    generate("_INBOX.l", "late", 1, 128);
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 1));
    uint64_t key = kvr_pending_key("_INBOX.l", "late");
    prefill_done(1, key); /* it started: not placed again */
    heartbeat(2, 4096, NULL, 0, 1000);
    kvr_sleep_ns(10 * KVR_NS_PER_MS); /* worker 1 is silent for 3.2 of its intervals */
    kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count("_INBOX.l", 0, &m), 1));
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_WORKER_LOST));
    worker_done(1, key); /* published during its cut, flushed when it came back */
    kvr_sleep_ns(310 * KVR_NS_PER_MS);
    generate("_INBOX.l", "late", 1, 128); /* its client's new attempt */
    cr_assert(eq(int, rec_count("kv.default.worker.2.generate", 0, NULL), 1), "placed");
    cr_assert(eq(u64, rd.n.resends_after_end, 0));
}

/*
 * A resend of a request queued at a peer is absorbed here, not placed a second time (it was:
 * served here while the peer's copy timed out as overloaded, an error and a stream for one
 * request); the peer's decision, when it places it, books it here as any decision.
 */
Test(routerd, a_resend_of_a_request_queued_at_a_peer_is_absorbed_until_it_is_placed)
{
    heartbeat(1, 4096, NULL, 0, 1000);
    queued_in("peer", "_INBOX.q", "q", 5000, false);
    cr_assert(eq(u64, rd.fleet->queued_heard, 1));
    generate("_INBOX.q", "q", 1, 128); /* its client's resend, through this router */
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 0), "absorbed");
    cr_assert(eq(int, rec_count("_INBOX.q", 0, NULL), 0), "no error either");
    cr_assert(eq(int, decisions_since(0), 0));
    cr_assert(eq(u64, rd.fleet->resends, 1));
    uint64_t key = kvr_pending_key("_INBOX.q", "q");
    prefill_done(1, key); /* its worker's events may come before the peer's decision */
    cr_assert(eq(u64, rd.n.stale_events, 0));
    peer_decision_at("peer", 1, key, 1, "_INBOX.q", "q", 1000, 0);
    struct kvr_pending *p = kvr_pending_find(&rd.pend, key);
    cr_assert(not(eq(ptr, p, NULL)));
    cr_assert(eq(u64, p->worker_id, 1));
    cr_assert(eq(u32, rd.pend.nnotices, 0), "no longer held on a notice");
    struct kvr_request_record rec;
    cr_assert(eq(int, kvr_router_export(rd.core, key, &rec), KVR_OK), "booked here");
    cr_assert(eq(u64, rd.fleet->placed_anew, 0), "not a placement again");
    worker_done(1, key);
    cr_assert(eq(ptr, kvr_pending_find(&rd.pend, key), NULL));
    /* another router placed the resend it got before hearing the notice: that decision stands */
    queued_in("peer", "_INBOX.q2", "q2", 5000, false);
    cr_assert(eq(u32, rd.pend.nnotices, 1));
    uint64_t key2 = kvr_pending_key("_INBOX.q2", "q2");
    peer_decision_at("other", 1, key2, 1, "_INBOX.q2", "q2", 2000, 0);
    p = kvr_pending_find(&rd.pend, key2);
    cr_assert(not(eq(ptr, p, NULL)));
    cr_assert(eq(u64, p->worker_id, 1));
    cr_assert(eq(u32, rd.pend.nnotices, 0), "placed: no longer held on the notice");
    worker_done(1, key2);
    cr_assert(eq(u32, rd.pend.n, 0));
}

/*
 * A peer that releases its queued request (its client answered with an error) lets it go here:
 * a resend right after crossed the answer and is ignored, a later one is a new attempt. Only its
 * origin can release it.
 */
Test(routerd, a_peer_that_releases_its_queued_request_lets_a_resend_through)
{
    cfg.crossing_ns = 300 * KVR_NS_PER_MS; /* the resend below comes well within it */
    heartbeat(1, 4096, NULL, 0, 1000);
    queued_in("peer", "_INBOX.r", "r", 5000, false);
    queued_in("other", "_INBOX.r", "r", 0, true); /* not its origin */
    cr_assert(eq(u32, rd.pend.n, 1));
    queued_in("peer", "_INBOX.r", "r", 0, true);
    cr_assert(eq(u64, rd.fleet->queued_released, 1));
    cr_assert(eq(u32, rd.pend.n, 0));
    generate("_INBOX.r", "r", 1, 128); /* sent before its client had the answer */
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 0), "crossed it");
    cr_assert(eq(int, rec_count("_INBOX.r", 0, NULL), 0));
    cr_assert(eq(u64, rd.n.resends_after_error, 1));
    kvr_sleep_ns(310 * KVR_NS_PER_MS);
    generate("_INBOX.r", "r", 1, 128); /* a new attempt */
    cr_assert(eq(int, rec_count("kv.default.worker.1.generate", 0, NULL), 1), "placed here");
    queued_in("peer", "_INBOX.r", "r", 5000, false); /* late: this router placed it */
    cr_assert(eq(u64, rd.fleet->queued_heard, 1), "its own decision settles it");
}

/*
 * A peer's notice is believed for its wait and four hellos: then it is forgotten while its origin
 * lives (the origin answered), and answered "not delivered" by the stand-in when the origin fell
 * silent (nobody else has the request's bytes). Bad reply subjects are refused.
 */
Test(routerd, a_peers_queued_request_is_forgotten_after_its_wait)
{
    strcpy(cfg.id, "a-first");         /* the smallest id: this router stands in */
    cfg.hello_ns = 40 * KVR_NS_PER_MS; /* y-live stays alive from its hello to the tick below */
    queued_in("z-dead", "_INBOX.o", "o", 1, false);
    queued_in("y-live", "_INBOX.l", "l", 1, false);
    queued_in("y-live", "_INBOX.m", "m", 60000, false);
    cr_assert(eq(u32, rd.pend.n, 3));
    kvr_sleep_ns(200 * KVR_NS_PER_MS); /* 1 ms and four 40 ms hellos */
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, "y-live", 5, 0, true), KVR_OK));
    gossip_in(&rd, b.data, b.len);
    kvr_buf_free(&b);
    kvr_timer_tick(&rd, kvr_now_ns(), true, false);
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count("_INBOX.o", 0, &m), 1), "its origin is silent");
    cr_assert(eq(u32, rec_error_in(m), KVR_ERR_NOT_DELIVERED));
    cr_assert(eq(int, rec_count("_INBOX.l", 0, NULL), 0), "its origin lives and answers");
    cr_assert(eq(u32, rd.pend.n, 1), "only the one still within its wait");
    uint64_t bad = rd.fleet->bad;
    queued_in("y-live", "_INBOX.x y", "x", 1000, false);
    queued_in("y-live", "kv.default.worker.1.generate", "x", 1000, false); /* a fleet subject */
    cr_assert(eq(u64, rd.fleet->bad, bad + 2), "reply subjects checked before they are kept");
    cr_assert(eq(u32, rd.pend.n, 1));
}

static void rd_unlock(void *ctx)
{
    kvr_rd_unlock_flush(ctx);
}

/*
 * What the router's threads (the loop, the timer, the delivery threads) say under its mutex goes
 * out in that order, whichever thread publishes it: a forward before its cancel, gossip decisions
 * in sequence (before, a decision overtaken by the next one cost its peers a repair).
 */
Test(routerd, messages_go_out_in_the_order_they_were_made_across_threads)
{
    kvr_fleet_destroy(&rd);
    kvr_rd_free(&rd);
    cr_assert(eq(int,
                 kvr_rd_init(&rd, &cfg, (struct kvr_sink){.publish = rec_order_sink, .ctx = NULL}),
                 KVR_OK));
    cr_assert(eq(int, kvr_fleet_create(&rd), KVR_OK));
    rec_order_run(4, 3000, &rd.mu, &rd.out, rd_unlock, &rd);
    cr_assert(eq(u64, rec_order_next, 12000), "every message published");
    cr_assert(eq(u64, rec_order_wrong, 0), "%llu published out of the order they were made",
              (unsigned long long)rec_order_wrong);
}
