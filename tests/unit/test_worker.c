/*
 * The simulated worker's state machine without NATS: stream positions and the cached prefix,
 * cancels (held, before the forward, silent), deadlines, duplicate absorption, the id clash rule
 * and the repeat after a cut, driven through the handlers with real protobuf bytes and observed
 * through a recording sink. The engine runs in virtual time, step by step, so nothing depends on
 * how fast the machine is.
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "codec.h"
#include "log.h"
#include "rec.h"
#include "recent.h"
#include "worker.h"

#define REPLY "_INBOX.client.1"
#define DONE  "kv.default.ev.3.done"
#define HB    "kv.default.ev.3.hb"

/* The chunks sent to the client since index from, decoded into out (at most max); their count. */
static int chunks(size_t from, struct kvr_wire_response *out, int max)
{
    int n = 0;
    for (size_t i = from; i < rec_nsent; i++) {
        if (strcmp(rec_sent[i].subject, REPLY))
            continue;
        cr_assert(lt(int, n, max));
        cr_assert(
            eq(int, kvr_wire_decode_response(rec_sent[i].data, rec_sent[i].len, &out[n]), KVR_OK));
        n++;
    }
    return n;
}

/* Keys listed by the RebindAsks published since index from, into keys; returns how many asks. */
static int rebind_asks(size_t from, uint64_t *keys, uint32_t max, uint32_t *nkeys)
{
    int n = 0;
    *nkeys = 0;
    for (size_t i = from; i < rec_nsent; i++) {
        struct kvr_wire_rebind_ask a;
        if (strcmp(rec_sent[i].subject, "kv.default.ev.3.rebind"))
            continue;
        cr_assert(
            eq(int, kvr_wire_decode_rebind_ask(rec_sent[i].data, rec_sent[i].len, &a), KVR_OK));
        cr_assert(eq(u64, a.worker_id, 3));
        for (uint32_t k = 0; k < a.nkeys && *nkeys < max; k++)
            keys[(*nkeys)++] = a.keys[k];
        kvr_wire_rebind_ask_free(&a);
        n++;
    }
    return n;
}

static void free_chunks(struct kvr_wire_response *c, int n)
{
    for (int i = 0; i < n; i++)
        kvr_wire_response_free(&c[i]);
}

/* The done events since index from, into out (at most max); their count. */
static int dones(size_t from, struct kvr_wire_done *out, int max)
{
    int n = 0;
    for (size_t i = from; i < rec_nsent; i++) {
        if (strcmp(rec_sent[i].subject, DONE))
            continue;
        cr_assert(lt(int, n, max));
        cr_assert(
            eq(int, kvr_wire_decode_done(rec_sent[i].data, rec_sent[i].len, &out[n]), KVR_OK));
        n++;
    }
    return n;
}

/* --- the worker under test ------------------------------------------------------------------- */

static struct kvr_wk_config cfg;
static struct kvr_worker w;
static uint64_t vt; /* the engine's virtual time */

static void setup(void)
{
    rec_reset();
    kvr_log_init("test_worker", KVR_LOG_ERROR);
    kvr_wk_config_default(&cfg);
    cfg.id = 3;
    cfg.engine.num_blocks = 256;
    cfg.engine.block_size = 16;
    cfg.max_prompt_tokens = 4096;
    cfg.max_output_tokens = 64;
    cr_assert(eq(int,
                 kvr_worker_init(&w, &cfg, (struct kvr_sink){.publish = rec_record, .ctx = NULL}),
                 KVR_OK));
    vt = kvr_now_ns();
}

static void teardown(void)
{
    kvr_worker_free(&w);
    rec_reset();
}

TestSuite(worker, .init = setup, .fini = teardown, .timeout = 30);

/* A router's forward of a 64-token prompt (the same prompt for every key). */
static void forward(uint64_t key, const char *id, uint32_t max_tokens, uint32_t deadline_ms)
{
    uint32_t toks[64];
    for (uint32_t i = 0; i < 64; i++)
        toks[i] = 7 + i;
    struct kvr_buf g = {0}, b = {0};
    cr_assert(eq(int, kvr_wire_encode_generate(&g, id, toks, 64, max_tokens, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_encode_worker_generate(&b, g.data, g.len, key, 0, "r1", deadline_ms),
                 KVR_OK));
    kvr_worker_on_generate(&w, REPLY, b.data, b.len);
    kvr_buf_free(&g);
    kvr_buf_free(&b);
}

/* The same forward with the client's reply subject reply (NULL: none). */
static void forward_to(uint64_t key, const char *reply, uint32_t max_tokens)
{
    uint32_t toks[64];
    for (uint32_t i = 0; i < 64; i++)
        toks[i] = 7 + i;
    struct kvr_buf g = {0}, b = {0};
    cr_assert(eq(int, kvr_wire_encode_generate(&g, "copy", toks, 64, max_tokens, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_encode_worker_generate(&b, g.data, g.len, key, 0, "r1", 0), KVR_OK));
    kvr_worker_on_generate(&w, reply, b.data, b.len);
    kvr_buf_free(&g);
    kvr_buf_free(&b);
}

static void cancel(uint64_t key, kvr_status reason, bool silent)
{
    struct kvr_buf b = {0};
    struct kvr_wire_worker_cancel c = {.key = key, .reason = reason, .silent = silent};
    cr_assert(eq(int, kvr_wire_encode_worker_cancel(&b, &c, "r1"), KVR_OK));
    kvr_worker_on_cancel(&w, b.data, b.len);
    kvr_buf_free(&b);
}

/* One engine step in virtual time, as the engine thread runs it, then what it made published
 * (with flush, the lifecycle events held for a batch too); false when idle. */
static bool step_then(bool flush)
{
    pthread_mutex_lock(&w.mu);
    uint64_t d = kvr_engine_step_begin(w.eng, vt);
    if (d) {
        vt += d;
        kvr_engine_step_end(w.eng, vt);
    }
    if (flush)
        kvr__worker_seal(&w);
    kvr__worker_unlock(&w);
    return d != 0;
}

static bool step(void)
{
    return step_then(true);
}

static void run(void)
{
    for (int guard = 0; step(); guard++)
        cr_assert(lt(int, guard, 10000), "the engine never went idle");
}

/* Nothing left in the engine: every block back in the pool (cached or blank). */
static void assert_engine_empty(void)
{
    struct kvr_engine_stats s;
    kvr_engine_stats(w.eng, &s);
    cr_assert(eq(u32, s.active_blocks, 0));
    cr_assert(eq(u32, s.running + s.waiting, 0));
    cr_assert(eq(u32, w.nreqs, 0));
}

/* --- streams --------------------------------------------------------------------------------- */

Test(worker, positions_count_the_tokens_and_the_first_chunk_names_the_cache)
{
    forward(101, "a", 5, 0);
    run();
    struct kvr_wire_response c[16];
    int n = chunks(0, c, 16);
    cr_assert(eq(int, n, 6), "5 tokens, then the final");
    for (int i = 0; i < 5; i++) {
        cr_assert(eq(u32, c[i].position, (uint32_t)i));
        cr_assert(eq(u32, c[i].ntokens, 1));
        cr_assert(not(c[i].final));
        cr_assert(eq(u64, c[i].worker_id, 3));
    }
    cr_assert(c[5].final);
    cr_assert(eq(u32, c[5].position, 5), "the final's position is the total");
    cr_assert(eq(u32, c[5].error_code, KVR_OK));
    free_chunks(c, n);
    struct kvr_wire_done d[4];
    cr_assert(eq(int, dones(0, d, 4), 1));
    cr_assert(eq(u64, d[0].key, 101));
    cr_assert(eq(u32, d[0].status, KVR_OK));
    cr_assert(eq(u32, d[0].output_tokens, 5));

    size_t mark = rec_nsent;
    forward(102, "b", 3, 0); /* the same prompt: 3 of its 4 blocks are cached (one token is
                                always computed) */
    run();
    n = chunks(mark, c, 16);
    cr_assert(eq(int, n, 4));
    cr_assert(eq(u32, c[0].cached_tokens, 48), "on the first chunk");
    cr_assert(eq(u32, c[1].cached_tokens, 0));
    cr_assert(eq(u32, c[2].cached_tokens, 0));
    cr_assert(c[3].final);
    cr_assert(eq(u32, c[3].cached_tokens, 48), "and again on the final");
    cr_assert(eq(u32, c[3].position, 3));
    free_chunks(c, n);
    assert_engine_empty();
}

/* --- cancels --------------------------------------------------------------------------------- */

Test(worker, cancel_of_a_held_request_ends_its_stream_and_frees_its_blocks)
{
    forward(201, "a", 20, 0);
    step(); /* prefill: the first token */
    step(); /* one decode token */
    struct kvr_engine_stats s;
    kvr_engine_stats(w.eng, &s);
    cr_assert(gt(u32, s.active_blocks, 0));
    size_t mark = rec_nsent;
    cancel(201, KVR_ERR_CANCELLED, false);
    struct kvr_wire_response c[4];
    cr_assert(eq(int, chunks(mark, c, 4), 1));
    cr_assert(c[0].final);
    cr_assert(eq(u32, c[0].error_code, KVR_ERR_CANCELLED));
    cr_assert(eq(u32, c[0].position, 2), "the tokens it had sent");
    free_chunks(c, 1);
    struct kvr_wire_done d[4];
    cr_assert(eq(int, dones(mark, d, 4), 1));
    cr_assert(eq(u32, d[0].status, KVR_ERR_CANCELLED));
    cr_assert(eq(u32, d[0].output_tokens, 2));
    assert_engine_empty();
    cr_assert(eq(u64, w.c.cancelled, 1));

    mark = rec_nsent;
    run();
    cancel(201, KVR_ERR_CANCELLED, false); /* again: it has ended, nothing more */
    cr_assert(eq(int, chunks(mark, c, 4), 0), "no chunk after the final");
    cr_assert(eq(int, dones(mark, d, 4), 0));
    cr_assert(eq(u64, w.c.late_cancels, 1));
}

Test(worker, cancel_before_the_forward_ends_it_on_arrival)
{
    cancel(301, KVR_ERR_CANCELLED, false);
    cr_assert(eq(sz, rec_nsent, 0), "a cancel alone says nothing");
    cr_assert(eq(u64, w.c.early_cancels, 1));
    forward(301, "a", 20, 0);
    struct kvr_wire_response c[4];
    cr_assert(eq(int, chunks(0, c, 4), 1));
    cr_assert(c[0].final);
    cr_assert(eq(u32, c[0].error_code, KVR_ERR_CANCELLED));
    cr_assert(eq(u32, c[0].position, 0));
    free_chunks(c, 1);
    struct kvr_wire_done d[4];
    cr_assert(eq(int, dones(0, d, 4), 1), "the routers free their booking");
    cr_assert(eq(u32, d[0].status, KVR_ERR_CANCELLED));
    cr_assert(eq(u32, d[0].output_tokens, 0));
    assert_engine_empty();
    cr_assert(not(step()), "never generated");

    size_t mark = rec_nsent;
    forward(301, "a", 20, 0); /* a resend: it has ended */
    cr_assert(eq(sz, rec_nsent, mark));
    cr_assert(eq(u64, w.c.duplicates, 1));
}

Test(worker, a_silent_cancel_sends_no_chunk_but_the_done_event)
{
    forward(401, "a", 20, 0);
    step();
    size_t mark = rec_nsent;
    cancel(401, KVR_ERR_CANCELLED, true);
    struct kvr_wire_response c[4];
    cr_assert(eq(int, chunks(mark, c, 4), 0), "another worker serves the stream");
    struct kvr_wire_done d[4];
    cr_assert(eq(int, dones(mark, d, 4), 1));
    cr_assert(eq(u32, d[0].status, KVR_ERR_SUPERSEDED),
              "the request is the other worker's, not ended");
    cr_assert(eq(u32, d[0].output_tokens, 1));
    assert_engine_empty();

    mark = rec_nsent; /* the same, when the cancel comes first */
    cancel(402, KVR_ERR_CANCELLED, true);
    forward(402, "b", 20, 0);
    cr_assert(eq(int, chunks(mark, c, 4), 0));
    cr_assert(eq(int, dones(mark, d, 4), 1));
    cr_assert(eq(u64, d[0].key, 402));
    run();
    cr_assert(eq(int, chunks(mark, c, 4), 0));
}

/* --- deadlines ------------------------------------------------------------------------------- */

Test(worker, a_deadline_ends_the_request)
{
    forward(501, "a", 20, 60000);
    forward(502, "b", 2, 0);
    step();
    uint64_t now = kvr_now_ns();
    uint64_t next = kvr_worker_tick(&w, now);
    cr_assert(gt(u64, next, now), "a minute to go");
    size_t mark = rec_nsent;
    cr_assert(eq(u64, kvr_worker_tick(&w, next + 1), 0), "passed: none left");
    struct kvr_wire_response c[4];
    cr_assert(eq(int, chunks(mark, c, 4), 1));
    cr_assert(c[0].final);
    cr_assert(eq(u32, c[0].error_code, KVR_ERR_DEADLINE));
    cr_assert(eq(u32, c[0].position, 1));
    free_chunks(c, 1);
    struct kvr_wire_done d[4];
    cr_assert(eq(int, dones(mark, d, 4), 1));
    cr_assert(eq(u64, d[0].key, 501));
    cr_assert(eq(u32, d[0].status, KVR_ERR_DEADLINE));
    cr_assert(eq(u32, d[0].output_tokens, 1));
    cr_assert(eq(u64, w.c.deadlines, 1));
    run(); /* the other, without a deadline, finishes */
    cr_assert(eq(int, dones(mark, d, 4), 2));
    cr_assert(eq(u64, d[1].key, 502));
    cr_assert(eq(u32, d[1].status, KVR_OK));
    assert_engine_empty();
}

/* --- duplicates ------------------------------------------------------------------------------ */

Test(worker, duplicates_are_absorbed_without_a_chunk)
{
    forward(601, "a", 3, 0);
    size_t mark = rec_nsent;
    forward(601, "a", 3, 0); /* held */
    cr_assert(eq(sz, rec_nsent, mark), "nothing said");
    cr_assert(eq(u64, w.c.duplicates, 1));
    run();
    struct kvr_wire_response c[16];
    int n = chunks(0, c, 16);
    cr_assert(eq(int, n, 4), "one stream: 3 tokens and one final");
    for (int i = 0; i < n; i++)
        cr_assert(eq(int, c[i].final, i == 3));
    free_chunks(c, n);
    mark = rec_nsent;
    forward(601, "a", 3, 0); /* finished */
    cr_assert(eq(sz, rec_nsent, mark));
    cr_assert(eq(u64, w.c.duplicates, 2));
    cr_assert(not(step()), "not generated again");
    struct kvr_wire_done d[4];
    cr_assert(eq(int, dones(0, d, 4), 1));
}

/* --- the id clash ---------------------------------------------------------------------------- */

/* A copy of a forward held or ended here is absorbed whatever it says: one without a reply, or
 * one this worker would refuse, answered the client and told the routers the request was done
 * while its stream went on. A refused forward is remembered: its copy is absorbed too. */
Test(worker, a_copy_of_a_held_request_is_absorbed_even_when_it_would_be_refused)
{
    forward(301, "held", 10, 0);
    step();
    size_t mark = rec_nsent;
    forward_to(301, NULL, 10);         /* no reply */
    forward_to(301, "_INBOX.x", 1000); /* over max_output_tokens */
    struct kvr_wire_response c[16];
    struct kvr_wire_done d[2];
    cr_assert(eq(int, chunks(mark, c, 16), 0));
    cr_assert(eq(int, dones(mark, d, 2), 0), "no done while it streams");
    cr_assert(eq(u32, w.nreqs, 1));
    cr_assert(eq(u64, w.c.duplicates, 2));
    run();
    int n = chunks(mark, c, 16);
    cr_assert(gt(int, n, 0));
    cr_assert(c[n - 1].final && c[n - 1].error_code == 0, "it finished");
    free_chunks(c, n);
    cr_assert(eq(int, dones(mark, d, 2), 1));
    /* a refused forward, then its copy: one final, one done */
    mark = rec_nsent;
    forward_to(302, REPLY, 1000);
    forward_to(302, REPLY, 1000);
    cr_assert(eq(int, chunks(mark, c, 16), 1));
    cr_assert(eq(u32, c[0].error_code, (uint32_t)KVR_ERR_MAX_TOKENS_TOO_LARGE));
    free_chunks(c, 1);
    cr_assert(eq(int, dones(mark, d, 2), 1));
}

Test(worker, the_younger_instance_yields)
{
    cr_assert(kvr_worker_yields(2000, 1, 1000, 9), "started later: yields");
    cr_assert(not(kvr_worker_yields(1000, 9, 2000, 1)), "started first: stays");
    cr_assert(kvr_worker_yields(1000, 9, 1000, 4), "a tie: the larger instance yields");
    cr_assert(not(kvr_worker_yields(1000, 4, 1000, 9)));
}

static void heartbeat_from(uint64_t id, uint64_t instance, uint64_t started_ns)
{
    struct kvr_wire_heartbeat h = {.info = {.id = id, .block_size = 16, .capacity_blocks = 256},
                                   .interval_ms = 500,
                                   .instance = instance,
                                   .started_ns = started_ns};
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &h), KVR_OK));
    kvr_worker_on_heartbeat(&w, b.data, b.len);
    kvr_buf_free(&b);
}

Test(worker, a_clash_makes_the_younger_silent)
{
    w.instance = 5;
    w.started_ns = 1000;
    forward(701, "a", 20, 0);
    step();
    heartbeat_from(3, 5, 1000); /* its own */
    heartbeat_from(4, 9, 10);   /* another id */
    heartbeat_from(3, 7, 2000); /* a younger one: it yields, this one stays */
    heartbeat_from(3, 6, 1000); /* a tie with a larger instance: this one stays too */
    cr_assert(not(kvr_worker_clashed(&w)));
    size_t mark = rec_nsent;
    step();
    cr_assert(gt(sz, rec_nsent, mark), "still serving");

    heartbeat_from(3, 4, 1000); /* a tie with a smaller instance: this one yields */
    cr_assert(kvr_worker_clashed(&w));
    cr_assert(kvr_worker_stopping(&w));
    mark = rec_nsent;
    run();                                 /* what it holds runs on, unheard */
    cancel(701, KVR_ERR_CANCELLED, false); /* no chunk, no done event */
    forward(702, "b", 3, 0);               /* takes nothing */
    kvr_worker_heartbeat(&w);
    kvr_worker_on_hello(&w, "_INBOX.asker");
    kvr_worker_tick(&w, kvr_now_ns());
    cr_assert(eq(sz, rec_nsent, mark), "nothing at all after the yield");
}

Test(worker, hello_and_heartbeat_name_the_instance)
{
    cr_assert(ne(u64, w.instance, 0));
    cr_assert(gt(u64, w.started_ns, 0));
    forward(751, "a", 20, 0);
    kvr_worker_on_hello(&w, "_INBOX.asker");
    kvr_worker_heartbeat(&w);
    cr_assert(eq(sz, rec_nsent, 2));
    cr_assert(eq(str, rec_sent[0].subject, "_INBOX.asker"));
    cr_assert(eq(str, rec_sent[1].subject, HB));
    for (int i = 0; i < 2; i++) {
        struct kvr_wire_heartbeat h;
        cr_assert(
            eq(int, kvr_wire_decode_heartbeat(rec_sent[i].data, rec_sent[i].len, &h), KVR_OK));
        cr_assert(eq(u64, h.info.id, 3));
        cr_assert(eq(u64, h.instance, w.instance));
        cr_assert(eq(u64, h.started_ns, w.started_ns));
        cr_assert(eq(u32, h.interval_ms, 500), "the default period");
        cr_assert(eq(u32, h.ninflight, 1));
        cr_assert(eq(u64, h.inflight[0], 751));
        kvr_wire_heartbeat_free(&h);
    }
}

/* --- a cut of the outgoing connection -------------------------------------------------------- */

/* Cut and back; returns when the repeat is due. */
static uint64_t cut_and_back(void)
{
    kvr_worker_on_disconnected(&w);
    kvr_worker_on_reconnected(&w);
    uint64_t now = kvr_now_ns();
    uint64_t due = kvr_worker_tick(&w, now);
    cr_assert(gt(u64, due, now), "not at once: clients reconnect too");
    return due;
}

/* Every held stream is in the rebind asks after a cut, its first token still to come or not:
 * under allow_responses its chunks need the permission a rebind gives on the new connection
 * (one with no token yet was left out, and its whole stream refused by the server). */
Test(worker, after_a_cut_a_stream_with_no_token_yet_is_asked_a_rebind_too)
{
    forward(811, "queued", 10, 0); /* held, not one step yet */
    size_t mark = rec_nsent;
    kvr_worker_on_disconnected(&w);
    kvr_worker_on_reconnected(&w);
    uint64_t keys[4];
    uint32_t nkeys;
    cr_assert(eq(int, rebind_asks(mark, keys, 4, &nkeys), 1));
    cr_assert(eq(u32, nkeys, 1));
    cr_assert(eq(u64, keys[0], 811));
    mark = rec_nsent;
    uint64_t due = kvr_worker_tick(&w, kvr_now_ns());
    while (due)
        due = kvr_worker_tick(&w, due);
    struct kvr_wire_response c[16];
    cr_assert(eq(int, chunks(mark, c, 16), 0), "no token: nothing to repeat");
    run();
    int n = chunks(mark, c, 16);
    cr_assert(eq(int, n, 11), "its stream, whole");
    free_chunks(c, n);
}

Test(worker, after_a_cut_each_open_stream_is_repeated_from_position_0)
{
    forward(801, "a", 10, 0);
    for (int i = 0; i < 3; i++)
        step();
    kvr_worker_on_disconnected(&w);
    size_t mark = rec_nsent;
    step();
    step();
    struct kvr_wire_response c[16];
    cr_assert(eq(int, chunks(mark, c, 16), 2), "chunks go on (NATS buffers them)");
    free_chunks(c, 2);
    mark = rec_nsent;
    kvr_worker_on_reconnected(&w);
    uint64_t keys[4];
    uint32_t nkeys;
    cr_assert(eq(int, rebind_asks(mark, keys, 4, &nkeys), 1), "rebinds asked for at once");
    cr_assert(eq(u32, nkeys, 1));
    cr_assert(eq(u64, keys[0], 801));
    mark = rec_nsent;
    uint64_t due = kvr_worker_tick(&w, kvr_now_ns());
    cr_assert(gt(u64, due, 0));
    cr_assert(eq(sz, rec_nsent, mark), "the repeat waits");
    due = kvr_worker_tick(&w, due);
    cr_assert(eq(int, rebind_asks(mark, keys, 4, &nkeys), 1), "and asked again half-way");
    cr_assert(eq(int, chunks(mark, c, 16), 0), "the repeat still waits");
    cr_assert(gt(u64, due, 0));
    cr_assert(eq(u64, kvr_worker_tick(&w, due), 0), "nothing due after it");
    cr_assert(eq(int, chunks(mark, c, 16), 1));
    cr_assert(eq(u32, c[0].position, 0));
    cr_assert(eq(u32, c[0].ntokens, 5), "every token so far");
    cr_assert(not(c[0].final));
    free_chunks(c, 1);
    mark = rec_nsent;
    run();
    int n = chunks(mark, c, 16);
    cr_assert(eq(int, n, 6), "5 more tokens and the final");
    for (int i = 0; i < 5; i++)
        cr_assert(eq(u32, c[i].position, 5 + (uint32_t)i));
    cr_assert(c[5].final);
    cr_assert(eq(u32, c[5].position, 10));
    free_chunks(c, n);
    cr_assert(eq(u64, w.c.repeats, 1));
}

Test(worker, a_stream_that_ended_around_the_cut_is_repeated_with_its_final)
{
    forward(851, "a", 4, 0);  /* finishes just before the cut */
    forward(852, "b", 20, 0); /* cancelled during it */
    forward(853, "c", 20, 0); /* cancelled silently: nothing was due to its client */
    forward(854, "d", 20, 0); /* cancelled before its first token */
    cancel(854, KVR_ERR_CANCELLED, false);
    for (int i = 0; i < 4; i++)
        step();
    kvr_worker_on_disconnected(&w);
    cancel(852, KVR_ERR_CANCELLED, false);
    cancel(853, KVR_ERR_CANCELLED, true);
    kvr_worker_on_reconnected(&w);
    size_t mark = rec_nsent;
    kvr_worker_tick(&w, kvr_now_ns() + KVR_WK_REPEAT_DELAY_NS);
    struct kvr_wire_response c[16];
    int n = chunks(mark, c, 16);
    cr_assert(eq(int, n, 3), "one repeat per stream its client heard of, in the order they ended");
    cr_assert(eq(str, c[0].request_id, "d"));
    cr_assert(c[0].final);
    cr_assert(eq(u32, c[0].position, 0));
    cr_assert(eq(u32, c[0].ntokens, 0));
    cr_assert(eq(u32, c[0].error_code, KVR_ERR_CANCELLED));
    cr_assert(eq(str, c[1].request_id, "a"));
    cr_assert(c[1].final);
    cr_assert(eq(u32, c[1].position, 0));
    cr_assert(eq(u32, c[1].ntokens, 4), "the whole stream: position + tokens is the total");
    cr_assert(eq(u32, c[1].error_code, KVR_OK));
    cr_assert(eq(str, c[2].request_id, "b"));
    cr_assert(c[2].final);
    cr_assert(eq(u32, c[2].ntokens, 4));
    cr_assert(eq(u32, c[2].error_code, KVR_ERR_CANCELLED), "its code again");
    free_chunks(c, n);
    uint64_t errors = w.generate.errors;
    cut_and_back();
    mark = rec_nsent;
    kvr_worker_tick(&w, kvr_now_ns() + KVR_WK_REPEAT_DELAY_NS);
    cr_assert(eq(int, chunks(mark, c, 16), 3), "a second cut: repeated again");
    free_chunks(c, 3);
    cr_assert(eq(u64, w.generate.errors, errors), "a repeat is no new error");

    kvr_worker_tick(&w, kvr_now_ns() + KVR_WK_KEPT_NS + KVR_WK_REPEAT_DELAY_NS);
    cr_assert(eq(u32, w.nkept, 3), "kept on, for a resend");
    uint64_t due = cut_and_back();
    mark = rec_nsent;
    kvr_worker_tick(&w, due);
    cr_assert(eq(int, chunks(mark, c, 16), 0), "ended long before this cut: not repeated");
    kvr_worker_tick(&w, kvr_now_ns() + KVR_WK_RESEND_KEPT_NS + KVR_WK_REPEAT_DELAY_NS);
    cr_assert(eq(u32, w.nkept, 0), "kept for a while only");
}

/* A router's WorkerRebind of key with repeat (a client's resend). */
static void resend_rebind(uint64_t key)
{
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_worker_rebind(&b, key, "r1", true), KVR_OK));
    kvr_worker_on_rebind(&w, b.data, b.len);
    kvr_buf_free(&b);
}

Test(worker, a_resend_repeats_the_stream_once_a_second_at_most)
{
    forward(861, "e", 4, 0);
    run();
    size_t mark = rec_nsent;
    resend_rebind(861);
    struct kvr_wire_response c[16];
    cr_assert(eq(int, chunks(mark, c, 16), 1), "the whole stream again, in one chunk");
    cr_assert(eq(str, c[0].request_id, "e"));
    cr_assert(eq(u32, c[0].position, 0));
    cr_assert(eq(u32, c[0].ntokens, 4));
    cr_assert(c[0].final, "with its final: the client can end it");
    free_chunks(c, 1);
    mark = rec_nsent;
    resend_rebind(861); /* a client resending in a loop */
    resend_rebind(862); /* a stream not here */
    cr_assert(eq(sz, rec_nsent, mark), "refused: nothing sent");
    cr_assert(eq(u64, w.c.resend_repeats, 1));
    cr_assert(eq(u64, w.c.resend_refused, 2));
    cr_assert(eq(u64, w.c.repeats, 0), "no cut repeat");

    forward(863, "f", 10, 0); /* still generating (its done was forged at the routers) */
    resend_rebind(863);
    cr_assert(eq(u64, w.c.resend_refused, 3), "no token yet: nothing to repeat");
    for (int i = 0; i < 4; i++)
        step();
    mark = rec_nsent;
    resend_rebind(863);
    int n = chunks(mark, c, 16);
    cr_assert(eq(int, n, 1));
    cr_assert(eq(u32, c[0].position, 0));
    cr_assert(gt(u32, c[0].ntokens, 0), "the tokens so far");
    cr_assert(not(c[0].final), "and it goes on");
    free_chunks(c, n);
    run();
    kvr_worker_tick(&w, kvr_now_ns() + KVR_WK_RESEND_KEPT_NS + 1);
    mark = rec_nsent;
    resend_rebind(861);
    cr_assert(eq(sz, rec_nsent, mark), "no longer kept: refused");
    cr_assert(eq(u64, w.c.resend_refused, 4));
}

/* The stream kept under key (NULL: none). */
static struct kvr_wreq *kept_stream(uint64_t key)
{
    struct kvr_wreq *r;
    HASH_FIND(hk, w.kept_by, &key, sizeof key, r);
    return r;
}

Test(worker, a_resend_repeats_a_stream_a_few_times_in_all)
{
    forward(865, "g", 4, 0);
    run();
    struct kvr_wreq *r = kept_stream(865);
    cr_assert(not(eq(ptr, r, NULL)));
    for (unsigned i = 0; i < KVR_WK_RESEND_MAX + 2; i++) {
        r->resent_at = 1; /* as if the last repeat were long ago */
        resend_rebind(865);
    }
    cr_assert(eq(u64, w.c.resend_repeats, KVR_WK_RESEND_MAX), "a client resending in a loop");
    cr_assert(eq(u64, w.c.resend_refused, 2), "gets no more than this many copies");
}

Test(worker, a_key_that_ended_here_twice_keeps_its_newer_stream)
{
    forward(867, "old", 3, 0);
    run();
    kvr_recent_expire(&w.recent, kvr_now_ns() + 3600 * KVR_NS_PER_S); /* recent lost the key */
    forward(867, "new", 5, 0);
    run();
    cr_assert(eq(u32, w.nkept, 2), "both in the budget until pruned in turn");
    cr_assert(eq(str, kept_stream(867)->request_id, "new"));
    size_t mark = rec_nsent;
    resend_rebind(867);
    struct kvr_wire_response c[4];
    cr_assert(eq(int, chunks(mark, c, 4), 1), "one repeat: the newer stream's");
    cr_assert(eq(str, c[0].request_id, "new"));
    cr_assert(eq(u32, c[0].ntokens, 5));
    free_chunks(c, 1);
    mark = rec_nsent;
    cut_and_back();
    kvr_worker_tick(&w, kvr_now_ns() + KVR_WK_REPEAT_DELAY_NS);
    cr_assert(eq(int, chunks(mark, c, 4), 1), "a cut repeats the newer stream only");
    cr_assert(eq(str, c[0].request_id, "new"));
    free_chunks(c, 1);
    kvr_worker_tick(&w, kvr_now_ns() + KVR_WK_RESEND_KEPT_NS + KVR_WK_REPEAT_DELAY_NS);
    cr_assert(eq(u32, w.nkept, 0), "both freed");
    cr_assert(eq(ptr, kept_stream(867), NULL));
}

Test(worker, a_heartbeat_lists_the_requests_that_just_ended)
{
    forward(801, "a", 3, 0);
    forward(802, "b", 3, 0);
    cancel(802, KVR_ERR_CANCELLED, true); /* silent: another worker's, not ended in the fleet */
    run();
    size_t mark = rec_nsent;
    kvr_worker_heartbeat(&w);
    cr_assert(eq(sz, rec_nsent, mark + 1));
    struct kvr_wire_heartbeat h;
    cr_assert(
        eq(int, kvr_wire_decode_heartbeat(rec_sent[mark].data, rec_sent[mark].len, &h), KVR_OK));
    cr_assert(eq(u32, h.ninflight, 0));
    cr_assert(eq(u32, h.nended, 1), "the finished one, not the one stopped silently");
    cr_assert(eq(u64, h.ended[0], 801));
    kvr_wire_heartbeat_free(&h);
}

static uint32_t three_queued(void *ctx)
{
    (void)ctx;
    return 3;
}

/* Its heartbeat counts the forwards not taken yet: those in the link's queue (w.queued) and any in
 * hand; a forward taken (listed) or answered counts no more. */
Test(worker, a_heartbeat_counts_the_forwards_waiting)
{
    forward(811, "a", 3, 0);
    size_t mark = rec_nsent;
    kvr_worker_heartbeat(&w);
    struct kvr_wire_heartbeat h;
    cr_assert(
        eq(int, kvr_wire_decode_heartbeat(rec_sent[mark].data, rec_sent[mark].len, &h), KVR_OK));
    cr_assert(eq(u32, h.ninflight, 1));
    cr_assert(eq(u32, h.forwards_waiting, 0), "taken: listed, not waiting");
    kvr_wire_heartbeat_free(&h);
    pthread_mutex_lock(&w.mu);
    w.queued = three_queued;
    pthread_mutex_unlock(&w.mu);
    mark = rec_nsent;
    kvr_worker_heartbeat(&w);
    cr_assert(
        eq(int, kvr_wire_decode_heartbeat(rec_sent[mark].data, rec_sent[mark].len, &h), KVR_OK));
    cr_assert(eq(u32, h.forwards_waiting, 3));
    kvr_wire_heartbeat_free(&h);
}

Test(worker, a_request_its_pool_cannot_hold_is_refused_with_the_figures)
{
    cfg.max_output_tokens = 8192;
    forward(901, "huge", 5000, 0); /* 64 + 5000 tokens: 317 blocks of 16, the pool has 256 */
    struct kvr_wire_response c[4];
    cr_assert(eq(int, chunks(0, c, 4), 1));
    cr_assert(c[0].final);
    cr_assert(eq(u32, c[0].error_code, KVR_ERR_FULL));
    cr_assert(not(eq(ptr, strstr(c[0].error, "317 KV blocks needed"), NULL)), "%s", c[0].error);
    cr_assert(not(eq(ptr, strstr(c[0].error, "the limit is 254"), NULL)), "%s", c[0].error);
    free_chunks(c, 1);
    struct kvr_wire_done d[4];
    cr_assert(eq(int, dones(0, d, 4), 1), "the routers free its booking at once");
    cr_assert(eq(u32, d[0].status, KVR_ERR_FULL));
    cr_assert(not(step()), "nothing for the engine");
}

Test(worker, a_prompt_the_engine_could_never_admit_is_refused)
{
    /* 4,080 tokens and 1 output: 256 blocks, the whole pool; but the engine admits a chunk only
     * while its 1 % watermark (2 blocks) stays free: never. In chunks of 2,048 tokens its first
     * chunk (128 blocks) would leave it free, and the check once took it for that; with its prompt
     * cached (a preemption, or the same prompt again) it then waited for ever */
    cfg.engine.max_batched_tokens = 2048; /* as the worker's checks read it */
    cfg.max_prompt_tokens = 8192;
    static uint32_t toks[4080];
    for (uint32_t i = 0; i < 4080; i++)
        toks[i] = 7 + i;
    struct kvr_buf g = {0}, b = {0};
    cr_assert(eq(int, kvr_wire_encode_generate(&g, "wm", toks, 4080, 1, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_encode_worker_generate(&b, g.data, g.len, 903, 0, "r1", 0), KVR_OK));
    kvr_worker_on_generate(&w, REPLY, b.data, b.len);
    kvr_buf_free(&g);
    kvr_buf_free(&b);
    struct kvr_wire_response c[4];
    cr_assert(eq(int, chunks(0, c, 4), 1));
    cr_assert(eq(u32, c[0].error_code, KVR_ERR_FULL));
    cr_assert(not(eq(ptr, strstr(c[0].error, "256 KV blocks needed"), NULL)), "%s", c[0].error);
    cr_assert(not(eq(ptr, strstr(c[0].error, "the limit is 254"), NULL)), "%s", c[0].error);
    free_chunks(c, 1);
    cr_assert(not(step()), "nothing for the engine");
}

/* The ended keys of the last heartbeat published since index from (0 when none). */
static uint32_t last_heartbeat_ended(size_t from, uint64_t *keys, uint32_t max)
{
    uint32_t n = 0;
    for (size_t i = from; i < rec_nsent; i++) {
        struct kvr_wire_heartbeat h;
        if (strcmp(rec_sent[i].subject, HB))
            continue;
        cr_assert(
            eq(int, kvr_wire_decode_heartbeat(rec_sent[i].data, rec_sent[i].len, &h), KVR_OK));
        for (n = 0; n < h.nended && n < max; n++)
            keys[n] = h.ended[n];
        kvr_wire_heartbeat_free(&h);
    }
    return n;
}

Test(worker, after_a_cut_heartbeats_list_what_ended_during_it)
{
    kvr_worker_free(&w);
    cfg.heartbeat_ns = 5 * KVR_NS_PER_MS;
    cr_assert(eq(int,
                 kvr_worker_init(&w, &cfg, (struct kvr_sink){.publish = rec_record, .ctx = NULL}),
                 KVR_OK));
    uint64_t keys[8];
    forward(901, "a", 2, 0);
    run();
    kvr_sleep_ns(4 * cfg.heartbeat_ns);
    size_t mark = rec_nsent;
    kvr_worker_heartbeat(&w);
    cr_assert(eq(u32, last_heartbeat_ended(mark, keys, 8), 0), "two intervals ago: not listed");
    forward(902, "b", 2, 0);
    kvr_worker_on_disconnected(&w);
    run(); /* its done event goes into the cut */
    kvr_sleep_ns(4 * cfg.heartbeat_ns);
    kvr_worker_on_reconnected(&w);
    mark = rec_nsent;
    kvr_worker_heartbeat(&w);
    cr_assert(eq(u32, last_heartbeat_ended(mark, keys, 8), 1), "ended during the cut: listed");
    cr_assert(eq(u64, keys[0], 902));
}

Test(worker, a_rebind_is_counted_for_a_stream_here_only)
{
    forward(911, "a", 20, 0);
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_worker_rebind(&b, 911, "r1", false), KVR_OK));
    kvr_worker_on_rebind(&w, b.data, b.len);
    cr_assert(eq(int, kvr_wire_encode_worker_rebind(&b, 912, "r1", false), KVR_OK));
    kvr_worker_on_rebind(&w, b.data, b.len);
    kvr_worker_on_rebind(&w, "\xff\xff", 2);
    cr_assert(eq(u64, w.c.rebinds, 1));
    cr_assert(eq(u64, w.c.rebinds_bad, 2));
    kvr_buf_free(&b);
}

Test(worker, a_reply_subject_inside_the_fleets_subjects_is_never_answered)
{
    uint32_t toks[64];
    for (uint32_t i = 0; i < 64; i++)
        toks[i] = 7 + i;
    struct kvr_buf g = {0}, b = {0};
    cr_assert(eq(int, kvr_wire_encode_generate(&g, "evil", toks, 64, 4, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_encode_worker_generate(&b, g.data, g.len, 931, 0, "r1", 0), KVR_OK));
    kvr_worker_on_generate(&w, "kv.default.ev.2.done", b.data, b.len); /* another worker's */
    run();
    for (size_t i = 0; i < rec_nsent; i++)
        cr_assert(not(eq(str, rec_sent[i].subject, "kv.default.ev.2.done")));
    cr_assert(eq(u32, w.nreqs, 0), "not taken");
    cr_assert(eq(u64, w.generate.by_code[KVR_ERR_NO_REPLY], 1));
    kvr_buf_free(&g);
    kvr_buf_free(&b);
}

/* --- an engine that gives text (the adapter's path through the worker) ----------------------- */

Test(worker, text_streams_with_its_tokens_and_is_repeated_after_a_cut)
{
    forward(901, "t", 10, 0);
    pthread_mutex_lock(&w.mu);
    struct kvr_wreq *r = kvr__worker_find(&w, 901);
    cr_assert(ne(ptr, r, NULL));
    kvr_engine_cancel(w.eng, 901); /* the test speaks for the engine from here on */
    uint32_t a[2] = {11, 12}, b[1] = {13};
    kvr__worker_prefill(&w, 901);
    kvr__worker_tokens(&w, r, a, 2, "he\xc3\xa9", 4);
    kvr__worker_tokens(&w, r, b, 1, " llo", 4);
    pthread_mutex_unlock(&w.mu);
    kvr_worker_flush(&w);
    struct kvr_wire_response c[8];
    cr_assert(eq(int, chunks(0, c, 8), 2));
    cr_assert(eq(u32, c[0].ntokens, 2));
    cr_assert(eq(u32, c[0].ntext, 4));
    cr_assert(eq(int, memcmp(c[0].text, "he\xc3\xa9", 4), 0));
    cr_assert(eq(u32, c[1].position, 2));
    cr_assert(eq(str, c[1].text, " llo"));
    free_chunks(c, 2);
    /* a cut: the repeat carries every token and the text, from position 0 */
    kvr_worker_on_disconnected(&w);
    kvr_worker_on_reconnected(&w);
    size_t mark = rec_nsent;
    uint64_t due = kvr_worker_tick(&w, kvr_now_ns());
    while (due)
        due = kvr_worker_tick(&w, due);
    cr_assert(eq(int, chunks(mark, c, 8), 1));
    cr_assert(eq(u32, c[0].position, 0));
    cr_assert(eq(u32, c[0].ntokens, 3));
    cr_assert(eq(str, c[0].text, "he\xc3\xa9 llo"));
    free_chunks(c, 1);
    /* the engine finishes with its own reason */
    mark = rec_nsent;
    pthread_mutex_lock(&w.mu);
    kvr__worker_finished(&w, 901, "stop");
    pthread_mutex_unlock(&w.mu);
    kvr_worker_flush(&w);
    cr_assert(eq(int, chunks(mark, c, 8), 1));
    cr_assert(c[0].final);
    cr_assert(eq(u32, c[0].position, 3));
    cr_assert(eq(str, c[0].finish_reason, "stop"));
    free_chunks(c, 1);
}

/* The budget of ended streams kept for a repeat (KVR_WK_KEPT_TOKENS, 16 MB) holds their text too:
 * an engine may give one token with KVR_WIRE_TEXT_MAX bytes of text (1 MB), and counted by its
 * tokens alone 65,536 such streams (64 GB) were kept, each up to KVR_WK_TEXT_MAX (16 MB). */
Test(worker, the_streams_kept_for_a_repeat_count_their_text_in_the_budget)
{
    char *text = malloc(KVR_WIRE_TEXT_MAX);
    cr_assert(ne(ptr, text, NULL));
    memset(text, 'a', KVR_WIRE_TEXT_MAX);
    for (uint64_t key = 1001; key < 1025; key++) {
        forward(key, "big", 4, 0);
        pthread_mutex_lock(&w.mu);
        struct kvr_wreq *r = kvr__worker_find(&w, key);
        cr_assert(ne(ptr, r, NULL));
        kvr_engine_cancel(w.eng, key); /* the test speaks for the engine */
        uint32_t tok = 5;
        kvr__worker_tokens(&w, r, &tok, 1, text, KVR_WIRE_TEXT_MAX);
        kvr__worker_finished(&w, key, "stop");
        pthread_mutex_unlock(&w.mu);
        kvr_worker_flush(&w);
        rec_reset(); /* 1 MB a chunk: the recording is not what is measured */
    }
    free(text);
    uint64_t kept = 0;
    for (struct kvr_wreq *r = w.kept; r; r = r->next)
        kept += r->ntext;
    cr_assert(le(u64, kept, (uint64_t)KVR_WK_KEPT_TOKENS * 4), "%u streams keep %" PRIu64 " bytes",
              w.nkept, kept);
    cr_assert(gt(u32, w.nkept, 0), "the newest still kept");
}

Test(worker, an_engine_failure_ends_the_stream_with_its_error_and_a_done)
{
    forward(902, "f", 10, 0);
    pthread_mutex_lock(&w.mu);
    struct kvr_wreq *r = kvr__worker_find(&w, 902);
    kvr_engine_cancel(w.eng, 902);
    kvr__worker_failed(&w, r, KVR_ERR_WORKER_LOST, "connection reset");
    pthread_mutex_unlock(&w.mu);
    kvr_worker_flush(&w);
    struct kvr_wire_response c[4];
    cr_assert(eq(int, chunks(0, c, 4), 1));
    cr_assert(c[0].final);
    cr_assert(eq(u32, c[0].error_code, (uint32_t)KVR_ERR_WORKER_LOST));
    cr_assert(ne(ptr, strstr(c[0].error, "connection reset"), NULL), "error: %s", c[0].error);
    free_chunks(c, 1);
    struct kvr_wire_done d[2];
    cr_assert(eq(int, dones(0, d, 2), 1));
    cr_assert(eq(u32, d[0].status, (uint32_t)KVR_ERR_WORKER_LOST));
    cr_assert(eq(u32, w.nreqs, 0));
    cr_assert(eq(u64, w.c.engine_errors, 1));
}

/* --- lifecycle events in batches (--event-batch-ms) ------------------------------------------ */

#define BATCH  "kv.default.ev.3.batch"
#define TOKENS "kv.default.ev.3.tokens"

/* One engine step, publishing what it made but the events held for a batch. */
static bool step_held(void)
{
    return step_then(false);
}

/* Messages published on subject since index from. */
static int count_on(size_t from, const char *subject)
{
    int n = 0;
    for (size_t i = from; i < rec_nsent; i++)
        n += !strcmp(rec_sent[i].subject, subject);
    return n;
}

/* The index of the first message on subject since from (rec_nsent: none). */
static size_t first_on(size_t from, const char *subject)
{
    for (size_t i = from; i < rec_nsent; i++)
        if (!strcmp(rec_sent[i].subject, subject))
            return i;
    return rec_nsent;
}

/* Each of keys[0..n) has its events in the batch b in the order a router must apply them: its
 * prefill first, its output blocks, its done last (with its output tokens). */
static void assert_lifecycles(const struct kvr_wire_batch *b, const uint64_t *keys, int n,
                              uint32_t output_tokens)
{
    for (int k = 0; k < n; k++) {
        int seen = 0;
        bool done = false;
        for (uint32_t i = 0; i < b->n; i++) {
            const struct kvr_wire_event *e = &b->ev[i];
            uint64_t key = e->kind == KVR_WIRE_EV_DONE ? e->u.done.key : e->u.tokens.key;
            if (key != keys[k])
                continue;
            cr_assert(not(done), "nothing of %" PRIu64 " after its done", keys[k]);
            if (seen++ == 0)
                cr_assert(e->kind == KVR_WIRE_EV_TOKENS &&
                              e->u.tokens.kind == KVR_WIRE_PREFILL_DONE,
                          "%" PRIu64 " starts with its prefill", keys[k]);
            if (e->kind == KVR_WIRE_EV_DONE) {
                done = true;
                cr_assert(eq(u32, e->u.done.output_tokens, output_tokens));
                cr_assert(eq(u64, e->u.done.worker_id, 3));
            }
        }
        cr_assert(done, "%" PRIu64 " ended in the batch", keys[k]);
    }
}

Test(worker, lifecycle_events_wait_for_one_batch_and_go_before_the_next_heartbeat)
{
    cfg.event_batch_ns = 5 * KVR_NS_PER_MS; /* w borrows cfg */
    uint64_t t0 = kvr_now_ns();
    forward(901, "a", 5, 0);
    forward(902, "b", 5, 0);
    for (int guard = 0; step_held(); guard++)
        cr_assert(lt(int, guard, 10000));
    struct kvr_wire_response c[16];
    int nc = chunks(0, c, 16);
    free_chunks(c, nc);
    cr_assert(eq(int, nc, 12), "streams go at once");
    cr_assert(eq(int, count_on(0, DONE) + count_on(0, TOKENS) + count_on(0, BATCH), 0),
              "the events wait");
    cr_assert(ge(u64, w.batch_due, t0 + cfg.event_batch_ns), "due a window after the first");
    size_t mark = rec_nsent;
    kvr_worker_tick(&w, w.batch_due - 1);
    cr_assert(eq(int, count_on(mark, BATCH), 0), "not before they are due");
    kvr_worker_tick(&w, w.batch_due);
    cr_assert(eq(int, count_on(mark, BATCH), 1), "one message for both requests");
    size_t at = first_on(mark, BATCH);
    struct kvr_wire_batch b;
    cr_assert(eq(int, kvr_wire_decode_batch(rec_sent[at].data, rec_sent[at].len, &b), KVR_OK));
    cr_assert(eq(u64, b.worker_id, 3));
    cr_assert(ge(u32, b.n, 4), "two prefills and two dones at least");
    assert_lifecycles(&b, (uint64_t[]){901, 902}, 2, 5);
    kvr_wire_batch_free(&b);
    cr_assert(eq(u64, w.c.batches, 1));

    /* held events go before a heartbeat, so no router hears a request left the list before it
     * hears the request ended */
    mark = rec_nsent;
    forward(903, "c", 5, 0);
    for (int guard = 0; step_held(); guard++)
        cr_assert(lt(int, guard, 10000));
    cr_assert(eq(int, count_on(mark, BATCH), 0));
    kvr_worker_heartbeat(&w);
    size_t batch_at = first_on(mark, BATCH), hb_at = first_on(mark, HB);
    cr_assert(lt(sz, batch_at, hb_at), "the batch, then the heartbeat");
    cr_assert(lt(sz, hb_at, rec_nsent));

    /* one event held alone goes as it would unbatched: a router of any version reads it */
    mark = rec_nsent;
    forward(904, "d", 5, 0);
    step_held(); /* its prefill */
    cr_assert(eq(u32, w.nbatch, 1));
    kvr_worker_tick(&w, w.batch_due);
    cr_assert(eq(int, count_on(mark, BATCH), 0));
    size_t t = first_on(mark, TOKENS);
    cr_assert(lt(sz, t, rec_nsent), "a plain TokensEvent");
    struct kvr_wire_tokens tk;
    cr_assert(eq(int, kvr_wire_decode_tokens(rec_sent[t].data, rec_sent[t].len, &tk), KVR_OK));
    cr_assert(eq(u64, tk.key, 904));
    cr_assert(eq(int, tk.kind, KVR_WIRE_PREFILL_DONE));

    /* a flush (the drain, the close) sends what is held */
    for (int guard = 0; step_held(); guard++)
        cr_assert(lt(int, guard, 10000));
    cr_assert(gt(u32, w.nbatch, 0));
    mark = rec_nsent;
    kvr_worker_flush(&w);
    cr_assert(eq(u32, w.nbatch, 0));
    cr_assert(eq(int, count_on(mark, DONE) + count_on(mark, BATCH), 1));
    assert_engine_empty();
}

Test(worker, a_full_batch_goes_at_once)
{
    cfg.event_batch_ns = 20 * KVR_NS_PER_MS;
    pthread_mutex_lock(&w.mu);
    for (uint32_t i = 0; i < KVR_WIRE_BATCH_MAX + 3; i++)
        kvr__worker_prefill(&w, 5000 + i);
    kvr__worker_unlock(&w);
    cr_assert(eq(int, count_on(0, BATCH), 1), "the full one went without waiting");
    cr_assert(eq(u32, w.nbatch, 3), "the rest waits");
    struct kvr_wire_batch b;
    cr_assert(eq(int, kvr_wire_decode_batch(rec_sent[0].data, rec_sent[0].len, &b), KVR_OK));
    cr_assert(eq(u32, b.n, KVR_WIRE_BATCH_MAX));
    for (uint32_t i = 0; i < b.n; i++)
        cr_assert(eq(u64, b.ev[i].u.tokens.key, 5000 + i), "in the order made");
    kvr_wire_batch_free(&b);
    kvr_worker_flush(&w);
    cr_assert(eq(int, count_on(0, BATCH), 2));
}

/* A prompt no other forward of these tests shares: its blocks are stored (KV events). */
static void forward_fresh(uint64_t key, const char *id, uint32_t base)
{
    uint32_t toks[64];
    for (uint32_t i = 0; i < 64; i++)
        toks[i] = base + i;
    struct kvr_buf g = {0}, b = {0};
    cr_assert(eq(int, kvr_wire_encode_generate(&g, id, toks, 64, 5, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_encode_worker_generate(&b, g.data, g.len, key, 0, "r1", 0), KVR_OK));
    kvr_worker_on_generate(&w, REPLY, b.data, b.len);
    kvr_buf_free(&g);
    kvr_buf_free(&b);
}

Test(worker, kv_events_do_not_cut_a_batch_short_and_rebind_asks_wait_for_it)
{
    cfg.event_batch_ns = 5 * KVR_NS_PER_MS;
    forward_fresh(951, "a", 1000);
    forward_fresh(952, "b", 2000);
    for (int guard = 0; step_held(); guard++)
        cr_assert(lt(int, guard, 10000));
    cr_assert(gt(int, count_on(0, "kv.default.ev.3.kv"), 0), "their blocks were stored");
    cr_assert(eq(int, count_on(0, TOKENS) + count_on(0, DONE) + count_on(0, BATCH), 0),
              "every lifecycle event still held: KV events go on their own");
    size_t mark = rec_nsent;
    kvr_worker_tick(&w, w.batch_due);
    cr_assert(eq(int, count_on(mark, BATCH), 1));
    struct kvr_wire_batch b;
    size_t at = first_on(mark, BATCH);
    cr_assert(eq(int, kvr_wire_decode_batch(rec_sent[at].data, rec_sent[at].len, &b), KVR_OK));
    assert_lifecycles(&b, (uint64_t[]){951, 952}, 2, 5);
    kvr_wire_batch_free(&b);

    /* a stream open across a cut: the rebind ask lists it, after the events held before it */
    forward_fresh(953, "c", 3000);
    step_held(); /* its prefill, held */
    cr_assert(eq(u32, w.nbatch, 1));
    kvr_worker_on_disconnected(&w);
    mark = rec_nsent;
    kvr_worker_on_reconnected(&w);
    size_t ask = first_on(mark, "kv.default.ev.3.rebind"), prefill = first_on(mark, TOKENS);
    cr_assert(lt(sz, ask, rec_nsent), "the ask went");
    cr_assert(lt(sz, prefill, ask), "after the prefill held before it");
    cr_assert(eq(u32, w.nbatch, 0));
}

/* The stop announces draining first while forwards are still served (those routers sent before
 * they heard it were dropped with the subscription, placed again only by a reconcile), then
 * refuses them. */
Test(worker, a_stopping_worker_says_so_before_it_refuses_forwards)
{
    kvr_worker_set_draining(&w, false);
    size_t mark = rec_nsent;
    kvr_worker_heartbeat(&w);
    const struct rec_sent *m = NULL;
    cr_assert(eq(int, rec_count(HB, mark, &m), 1));
    struct kvr_wire_heartbeat h;
    cr_assert(eq(int, kvr_wire_decode_heartbeat(m->data, m->len, &h), KVR_OK));
    cr_assert(h.draining, "routers hear it is leaving");
    kvr_wire_heartbeat_free(&h);
    forward(901, "still served", 4, 0);
    cr_assert(eq(u32, w.nreqs, 1), "taken");
    kvr_worker_set_draining(&w, true);
    mark = rec_nsent;
    forward(902, "refused", 4, 0);
    struct kvr_wire_response c[4];
    cr_assert(eq(int, chunks(mark, c, 4), 1));
    cr_assert(eq(u32, c[0].error_code, (uint32_t)KVR_ERR_SHUTDOWN));
    free_chunks(c, 1);
    run();
}

/* A drain that ran out of time ends what is still held: each client gets its final chunk
 * (ERR_SHUTDOWN, at the tokens it had), the routers a done each, and the engine lets them go.
 * Before, the worker left with them, its clients told nothing (a client forwarding after a
 * select heard nothing until its own deadline). */
Test(worker, a_drain_out_of_time_ends_what_it_holds_told)
{
    forward(861, "streaming", 40, 0);
    step(); /* its first token */
    forward(862, "waiting", 40, 0);
    kvr_worker_set_draining(&w, true);
    size_t mark = rec_nsent;
    kvr_worker_cut_held(&w);
    struct kvr_wire_response c[4];
    cr_assert(eq(int, chunks(mark, c, 4), 2));
    for (int i = 0; i < 2; i++) {
        cr_assert(c[i].final);
        cr_assert(eq(u32, c[i].error_code, (uint32_t)KVR_ERR_SHUTDOWN));
    }
    free_chunks(c, 2);
    struct kvr_wire_done d[4];
    cr_assert(eq(int, dones(mark, d, 4), 2));
    cr_assert(eq(u32, d[0].status, (uint32_t)KVR_ERR_SHUTDOWN));
    cr_assert(eq(u32, d[1].status, (uint32_t)KVR_ERR_SHUTDOWN));
    assert_engine_empty();
    cr_assert(eq(u64, w.c.drain_cut, 2));
    cr_assert(eq(u64, w.c.cancelled, 0), "not cancels");
    cr_assert(eq(u32, kvr_worker_held(&w), 0));
}

Test(worker, a_stopping_worker_holds_nothing)
{
    cfg.event_batch_ns = 5 * KVR_NS_PER_MS;
    kvr_worker_stop(&w); /* its engine thread is gone: nothing would seal a batch */
    pthread_mutex_lock(&w.mu);
    kvr__worker_done(&w, 77, KVR_OK, 3);
    kvr__worker_unlock(&w);
    cr_assert(eq(u32, w.nbatch, 0));
    cr_assert(eq(int, count_on(0, DONE), 1), "sent at once");
}

/* Events held for a batch when the stop came go before the next one, which the stop sends alone:
 * a cancel after the stop (the drain timed out) sent the request's done ahead of its prefill,
 * held until the last flush, and routers applied the prefill of a request already ended. */
Test(worker, events_held_at_the_stop_go_before_the_next_one)
{
    cfg.event_batch_ns = 5 * KVR_NS_PER_MS;
    forward(881, "a", 20, 0);
    step_held(); /* its prefill, held */
    cr_assert(eq(u32, w.nbatch, 1));
    kvr_worker_stop(&w);
    size_t mark = rec_nsent;
    cancel(881, KVR_ERR_CANCELLED, false);
    size_t prefill = first_on(mark, TOKENS), done = first_on(mark, DONE);
    cr_assert(lt(sz, done, rec_nsent), "the done went at once");
    cr_assert(lt(sz, prefill, done), "after the prefill held before it");
    cr_assert(eq(u32, w.nbatch, 0));
}

/* A drain waits on kvr_worker_held: a stream that ends during a cut of the outgoing connection
 * holds nothing more, but its final may be lost in the cut, and only the repeat ~1 s after the
 * connection is back brings it again. A drain that stopped at "nothing held" left before it (a
 * node's NATS server and its workers stopped together): the client's stream was lost for good. */
Test(worker, a_drain_waits_for_the_repeat_after_a_cut)
{
    forward(871, "a", 4, 0);
    step();
    kvr_worker_on_disconnected(&w);
    run(); /* it ends during the cut */
    cr_assert(eq(u32, w.nreqs, 0));
    cr_assert(eq(u32, kvr_worker_held(&w), 1), "cut: its final may be lost");
    kvr_worker_on_reconnected(&w);
    cr_assert(eq(u32, kvr_worker_held(&w), 1), "back: the repeat is still to come");
    size_t mark = rec_nsent;
    kvr_worker_tick(&w, kvr_now_ns() + KVR_WK_REPEAT_DELAY_NS);
    struct kvr_wire_response c[4];
    cr_assert(eq(int, chunks(mark, c, 4), 1));
    cr_assert(c[0].final, "the stream again, with its final");
    cr_assert(eq(u32, c[0].ntokens, 4));
    free_chunks(c, 1);
    cr_assert(eq(u32, kvr_worker_held(&w), 0), "then the drain may end");
}

/* kvr_wk_link_close's order: the threads stopped, the engine closed, then the last flush. A beat
 * the heartbeat thread asked for as the stop came (it gives up once stopping) is left wanted; the
 * flush must not encode it with the engine gone (a SIGSEGV at the end of a drain). */
Test(worker, a_beat_left_wanted_at_the_stop_is_not_sent_after_the_engine_closed)
{
    kvr_worker_stop(&w);
    kvr_worker_beat(&w); /* stopping: returns at once, the beat still wanted */
    cr_assert(atomic_load(&w.beat_wanted));
    kvr_worker_close_engine(&w);
    size_t mark = rec_nsent;
    kvr_worker_flush(&w);
    cr_assert(eq(int, count_on(mark, HB), 0), "no heartbeat without an engine");
    kvr_worker_on_hello(&w, REPLY); /* a delivery before the link unsubscribes: no answer either */
    cr_assert(eq(sz, rec_nsent, mark));
}

/* A router's cancel of a request still held (the drain timed out), delivered between the engine's
 * close and the link's unsubscribe: its client and the routers are told, without the engine. */
Test(worker, a_cancel_after_the_engine_closed_ends_the_request_without_it)
{
    forward(301, "a", 20, 0);
    step();
    cr_assert(eq(u32, w.nreqs, 1));
    kvr_worker_stop(&w);
    kvr_worker_close_engine(&w);
    size_t mark = rec_nsent;
    cancel(301, KVR_ERR_CANCELLED, false);
    cr_assert(eq(u32, w.nreqs, 0));
    struct kvr_wire_response c[4];
    cr_assert(eq(int, chunks(mark, c, 4), 1));
    cr_assert(eq(u32, c[0].error_code, KVR_ERR_CANCELLED));
    free_chunks(c, 1);
    cr_assert(eq(int, count_on(mark, DONE), 1));
}

/* --- publishing order ------------------------------------------------------------------------- */

static void worker_unlock(void *ctx)
{
    kvr__worker_unlock(ctx);
}

/*
 * What threads say under the worker's mutex goes out in that order, whichever thread publishes
 * it: a repeat made on a delivery thread once went out after the engine thread's later chunks,
 * leaving a client that keeps positions in order with a gap (CI, under ASan: 67 of 300 tokens).
 */
Test(worker, messages_go_out_in_the_order_they_were_made_across_threads)
{
    kvr_worker_free(&w);
    cr_assert(eq(
        int, kvr_worker_init(&w, &cfg, (struct kvr_sink){.publish = rec_order_sink, .ctx = NULL}),
        KVR_OK));
    rec_order_run(4, 3000, &w.mu, &w.out, worker_unlock, &w);
    cr_assert(eq(u64, rec_order_next, 12000), "every message published");
    cr_assert(eq(u64, rec_order_wrong, 0), "%llu published out of the order they were made",
              (unsigned long long)rec_order_wrong);
}
