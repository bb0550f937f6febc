/*
 * The worker's half of issue 10's attacks, and the bad inputs on the subjects a worker listens
 * to (kv.<ns>.worker.<id>.generate, .cancel, .hello, .rebind and its own kv.<ns>.ev.<id>.hb),
 * through its handlers with real protobuf bytes: requests its engine could never finish are
 * refused with ERR_FULL and the figures (a done event frees the routers' booking), bad forwards
 * are answered with their code, bad cancels counted (bad_cancels in $SRV.STATS). The engine runs
 * in virtual time, step by step.
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "codec.h"
#include "kvrouter.pb-c.h"
#include "log.h"
#include "rec.h"
#include "worker.h"

#define REPLY "_INBOX.client.1"
#define DONE  "kv.default.ev.3.done"

static struct kvr_wk_config cfg;
static struct kvr_worker w;
static uint32_t small[8192];
static uint32_t *prompt = small; /* the tokens of every prompt (1,048,577 in the large test) */

static void start(void)
{
    cr_assert(eq(int,
                 kvr_worker_init(&w, &cfg, (struct kvr_sink){.publish = rec_record, .ctx = NULL}),
                 KVR_OK));
}

/* The worker as kvworker runs it by default (16,384 blocks of 64 tokens), id 3. */
static void setup(void)
{
    rec_reset();
    kvr_log_init("test_hostile_worker", KVR_LOG_ERROR);
    kvr_wk_config_default(&cfg);
    cfg.id = 3;
    prompt = small;
    for (uint32_t i = 0; i < 8192; i++)
        prompt[i] = 7 + i;
    start();
}

static void teardown(void)
{
    kvr_worker_free(&w);
    rec_reset();
    if (prompt != small)
        free(prompt);
}

TestSuite(hostile_worker, .init = setup, .fini = teardown, .timeout = 60);

/* A small worker: 64 blocks of 16 tokens (a pool of 1,024 tokens), prompts up to 4,096. */
static void small_pool(void)
{
    kvr_worker_free(&w);
    cfg.engine.num_blocks = 64;
    cfg.engine.block_size = 16;
    cfg.max_prompt_tokens = 4096;
    cfg.max_output_tokens = 256;
    start();
}

static void pack(struct kvr_buf *b, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    cr_assert(eq(int, kvr_buf_reserve(b, n + 1), KVR_OK));
    b->len = protobuf_c_message_pack(m, b->data);
}

/* A router's forward of n prompt tokens, max_tokens out, under key (as bytes into b). */
static void forward_bytes(struct kvr_buf *b, uint64_t key, uint32_t n, uint32_t max_tokens)
{
    struct kvr_buf g = {0};
    cr_assert(eq(int, kvr_wire_encode_generate(&g, "req", prompt, n, max_tokens, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_encode_worker_generate(b, g.data, g.len, key, 0, "r1", 0), KVR_OK));
    kvr_buf_free(&g);
}

/* data on the worker's generate subject: the one final chunk (error code into *code, text into
 * text), and whether a done event went to the routers. Asserts exactly one chunk. */
static bool refused(const char *row, const char *reply, const void *data, size_t len,
                    uint32_t *code, char *text, size_t tlen)
{
    size_t mark = rec_nsent;
    kvr_worker_on_generate(&w, reply, data, len);
    int chunks = 0, dones = 0;
    for (size_t i = mark; i < rec_nsent; i++) {
        if (!strcmp(rec_sent[i].subject, DONE)) {
            dones++;
            continue;
        }
        cr_assert(eq(str, rec_sent[i].subject, (char *)reply), "%s: to the client only", row);
        struct kvr_wire_response r;
        cr_assert(eq(int, kvr_wire_decode_response(rec_sent[i].data, rec_sent[i].len, &r), KVR_OK));
        cr_assert(r.final, "%s: a final chunk", row);
        *code = r.error_code;
        snprintf(text, tlen, "%s", r.error);
        kvr_wire_response_free(&r);
        chunks++;
    }
    cr_assert(eq(int, chunks, 1), "%s: one chunk", row);
    return dones == 1;
}

static bool idle(void)
{
    struct kvr_engine_stats s;
    kvr_engine_stats(w.eng, &s);
    return s.running + s.waiting == 0 && s.active_blocks == 0 && w.nreqs == 0;
}

Test(hostile_worker, unfinishable_the_issues_request_is_refused_with_the_figures)
{
    prompt = malloc(((1u << 20) + 1) * sizeof *prompt);
    for (uint32_t i = 0; i <= 1u << 20; i++)
        prompt[i] = 7 + i % 50000;
    struct kvr_buf b = {0};
    uint32_t code = 0;
    char text[256];
    forward_bytes(&b, 901, 990000, 65536); /* fits one NATS message and the routers' limits */
    bool done = refused("990,000 + 65,536 tokens", REPLY, b.data, b.len, &code, text, sizeof text);
    cr_assert(eq(u32, code, KVR_ERR_FULL));
    cr_assert(not(eq(ptr, strstr(text, "16493 KV blocks needed"), NULL)), "%s", text);
    cr_assert(not(eq(ptr, strstr(text, "the limit is 16221"), NULL)), "%s", text);
    cr_assert(done, "the routers free its booking at once");
    forward_bytes(&b, 902, 1u << 20, 1); /* the whole pool for the prompt, one token more */
    refused("1,048,576 + 1 tokens", REPLY, b.data, b.len, &code, text, sizeof text);
    cr_assert(eq(u32, code, KVR_ERR_FULL), "%s", text);
    cr_assert(idle(), "the engine never saw either");
    cr_assert(eq(u64, w.generate.by_code[KVR_ERR_FULL], 2));
    kvr_buf_free(&b);
}

/* Run the engine in virtual time until idle; the steps it took. */
static int run(void)
{
    uint64_t vt = kvr_now_ns();
    int steps = 0;
    for (;;) {
        pthread_mutex_lock(&w.mu);
        uint64_t d = kvr_engine_step_begin(w.eng, vt);
        if (d) {
            vt += d;
            kvr_engine_step_end(w.eng, vt);
        }
        pthread_mutex_unlock(&w.mu);
        kvr_worker_flush(&w);
        if (!d)
            return steps;
        cr_assert(lt(int, ++steps, 5000), "the engine never went idle");
    }
}

Test(hostile_worker, unfinishable_a_prompt_or_prompt_and_output_over_the_pool_is_refused)
{
    small_pool();
    struct kvr_buf b = {0};
    uint32_t code = 0;
    char text[256];
    forward_bytes(&b, 11, 1100, 1); /* the prompt alone: 69 blocks, the pool has 64 */
    refused("prompt over the pool", REPLY, b.data, b.len, &code, text, sizeof text);
    cr_assert(eq(u32, code, KVR_ERR_FULL), "%s", text);
    cr_assert(not(eq(ptr, strstr(text, "69 KV blocks needed"), NULL)), "%s", text);
    forward_bytes(&b, 12, 1000, 64); /* 1,064 tokens: 67 blocks */
    refused("prompt + output over the pool", REPLY, b.data, b.len, &code, text, sizeof text);
    cr_assert(eq(u32, code, KVR_ERR_FULL), "%s", text);
    cr_assert(idle());
    size_t mark = rec_nsent;
    forward_bytes(&b, 13, 960, 64); /* 1,024 tokens: exactly the pool */
    kvr_worker_on_generate(&w, REPLY, b.data, b.len);
    int steps = run();
    cr_assert(eq(u64, w.c.served, 1), "what fits finishes");
    cr_assert(gt(sz, rec_nsent, mark + 64), "its 64 tokens streamed");
    cr_assert(idle());
    cr_log_info("a request of exactly the pool: done in %d engine steps", steps);
    kvr_buf_free(&b);
}

/* data (from reply) on generate is refused with code; whether a done event named it. */
static bool refused_with(const char *row, const char *reply, const void *data, size_t len,
                         kvr_status code)
{
    uint32_t got = 0;
    char text[256];
    bool done = refused(row, reply, data, len, &got, text, sizeof text);
    cr_assert(eq(u32, got, code), "%s: %s", row, text);
    return done;
}

Test(hostile_worker, forwards_that_are_bad_are_answered_with_their_code)
{
    small_pool();
    struct kvr_buf b = {0}, g = {0};
    uint8_t junk[32];
    memset(junk, 0xff, sizeof junk);
    cr_assert(not(refused_with("junk", REPLY, junk, sizeof junk, KVR_ERR_MALFORMED)),
              "no key: no done");
    cr_assert(eq(int, kvr_wire_encode_generate(&g, "k0", prompt, 64, 8, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_encode_worker_generate(&b, g.data, g.len, 0, 0, "r1", 0), KVR_OK));
    refused_with("request key 0", REPLY, b.data, b.len, KVR_ERR_INVALID);
    Kvrouter__V1__WorkerGenerate wg = KVROUTER__V1__WORKER_GENERATE__INIT;
    wg.request_key = 21; /* and no request in it */
    pack(&b, &wg.base);
    cr_assert(refused_with("no request inside", REPLY, b.data, b.len, KVR_ERR_MALFORMED));
    char big[300];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    cr_assert(eq(int, kvr_wire_encode_worker_generate(&b, g.data, g.len, 22, 0, big, 0), KVR_OK));
    refused_with("router id 299 bytes", REPLY, b.data, b.len, KVR_ERR_TOO_LARGE);
    forward_bytes(&b, 23, 4097, 8);
    refused_with("prompt over the worker's limit", REPLY, b.data, b.len, KVR_ERR_PROMPT_TOO_LONG);
    forward_bytes(&b, 24, 64, 257);
    refused_with("max_tokens over its limit", REPLY, b.data, b.len, KVR_ERR_MAX_TOKENS_TOO_LARGE);
    forward_bytes(&b, 25, 64, 0);
    refused_with("max_tokens 0", REPLY, b.data, b.len, KVR_ERR_MAX_TOKENS_ZERO);
    uint8_t *huge = calloc(1, kvr_wire_request_cap(&(struct kvr_wire_limits){4096, 256}) + 1);
    refused_with("bytes over its cap", REPLY, huge,
                 kvr_wire_request_cap(&(struct kvr_wire_limits){4096, 256}) + 1, KVR_ERR_TOO_LARGE);
    free(huge);
    size_t mark = rec_nsent;
    forward_bytes(&b, 26, 64, 8);
    kvr_worker_on_generate(&w, NULL, b.data, b.len); /* no reply subject */
    forward_bytes(&b, 27, 64, 8);
    kvr_worker_on_generate(&w, "kv.default.ev.3.kv", b.data, b.len); /* the fleet's own */
    forward_bytes(&b, 28, 64, 8);
    kvr_worker_on_generate(&w, "$SYS.REQ.SERVER.PING", b.data, b.len); /* a system subject */
    cr_assert(eq(sz, rec_nsent, mark + 3), "only their done events");
    for (size_t i = mark; i < rec_nsent; i++)
        cr_assert(eq(str, rec_sent[i].subject, DONE));
    cr_assert(eq(u64, w.generate.dropped, 3));
    cr_assert(eq(u64, w.generate.by_code[KVR_ERR_NO_REPLY], 3));
    cr_assert(idle(), "none of them reached the engine");
    kvr_buf_free(&b);
    kvr_buf_free(&g);
}

Test(hostile_worker, forwards_that_are_odd_are_absorbed_or_served)
{
    small_pool();
    struct kvr_buf b = {0}, g = {0};
    forward_bytes(&b, 31, 64, 4);
    kvr_worker_on_generate(&w, REPLY, b.data, b.len);
    size_t mark = rec_nsent;
    kvr_worker_on_generate(&w, REPLY, b.data, b.len); /* the same forward again */
    cr_assert(eq(sz, rec_nsent, mark), "absorbed: no second stream");
    cr_assert(eq(u64, w.c.duplicates, 1));
    cr_assert(eq(int, kvr_wire_encode_generate(&g, "late", prompt, 64, 4, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_encode_worker_generate(&b, g.data, g.len, 32, 0, "r1", UINT32_MAX),
                 KVR_OK)); /* a deadline of 49 days: in nanoseconds, no wrap */
    kvr_worker_on_generate(&w, REPLY, b.data, b.len);
    run();
    cr_assert(eq(u64, w.c.served, 2));
    cr_assert(eq(u64, w.c.deadlines, 0), "not taken for passed");
    kvr_worker_set_draining(&w, true);
    forward_bytes(&b, 33, 64, 4);
    refused_with("while draining", REPLY, b.data, b.len, KVR_ERR_SHUTDOWN);
    kvr_buf_free(&b);
    kvr_buf_free(&g);
}

static void cancel_raw(uint64_t key, uint32_t reason)
{
    Kvrouter__V1__WorkerCancel c = KVROUTER__V1__WORKER_CANCEL__INIT;
    c.request_key = key;
    c.reason = (Kvrouter__V1__ErrorCode)reason;
    struct kvr_buf b = {0};
    pack(&b, &c.base);
    kvr_worker_on_cancel(&w, b.data, b.len);
    kvr_buf_free(&b);
}

Test(hostile_worker, cancels_that_are_bad_are_counted_and_change_nothing)
{
    small_pool();
    struct kvr_buf b = {0};
    forward_bytes(&b, 41, 64, 8);
    kvr_worker_on_generate(&w, REPLY, b.data, b.len);
    uint8_t junk[16];
    memset(junk, 0xff, sizeof junk);
    size_t mark = rec_nsent;
    kvr_worker_on_cancel(&w, junk, sizeof junk);
    cancel_raw(0, KVR_ERR_CANCELLED);
    cancel_raw(41, KVR_OK);
    cancel_raw(41, KVR_ERR_WORKER_LOST);
    cancel_raw(41, 9999);
    cr_assert(eq(u64, w.c.bad_cancels, 5), "junk, key 0, and reasons other than the two");
    cr_assert(eq(sz, rec_nsent, mark), "nothing said");
    cr_assert(eq(u32, w.nreqs, 1), "the request goes on");
    cancel_raw(4242, KVR_ERR_CANCELLED); /* a key not here: remembered for its forward */
    cr_assert(eq(u64, w.c.early_cancels, 1));
    cancel_raw(41, KVR_ERR_CANCELLED); /* the real one */
    cr_assert(eq(u64, w.c.cancelled, 1));
    kvr_buf_free(&b);
}

Test(hostile_worker, a_flood_of_early_cancels_is_bounded_by_the_recent_table)
{
    small_pool();
    for (uint64_t k = 1; k <= KVR_RECENT_MAX + 100; k++)
        cancel_raw(1000000 + k, KVR_ERR_CANCELLED);
    cr_assert(eq(u64, w.c.early_cancels, KVR_RECENT_MAX + 100));
    cr_assert(le(u32, w.recent.n, KVR_RECENT_MAX), "at most 65,536 remembered");
    cr_assert(eq(u64, w.recent.evicted, 100), "the oldest forgotten");
}

static void heartbeat_from(uint64_t id, uint64_t instance, uint64_t started_ns)
{
    struct kvr_wire_heartbeat h = {.info = {.id = id, .block_size = 64, .capacity_blocks = 64},
                                   .interval_ms = 500,
                                   .instance = instance,
                                   .started_ns = started_ns};
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &h), KVR_OK));
    kvr_worker_on_heartbeat(&w, b.data, b.len);
    kvr_buf_free(&b);
}

/* Still open: a worker yields to an older instance with its id on that instance's word alone.
 * One forged heartbeat on its own hb subject silences a live worker for good. */
Test(hostile_worker, still_open_one_forged_heartbeat_silences_a_live_worker)
{
    uint8_t junk[16];
    memset(junk, 0xff, sizeof junk);
    kvr_worker_on_heartbeat(&w, junk, sizeof junk); /* junk: dropped, counted */
    cr_assert(eq(u64, w.c.bad_heartbeats, 1));
    heartbeat_from(4, 1, 1); /* another worker's: nothing */
    cr_assert(not(kvr_worker_clashed(&w)));
    heartbeat_from(3, w.instance ^ 1, 1); /* forged: "worker 3, started in 1970" */
    cr_assert(kvr_worker_clashed(&w), "it yields");
    size_t mark = rec_nsent;
    struct kvr_buf b = {0};
    forward_bytes(&b, 51, 64, 8);
    kvr_worker_on_generate(&w, REPLY, b.data, b.len);
    kvr_worker_heartbeat(&w);
    cr_assert(eq(sz, rec_nsent, mark), "and says nothing more: no chunk, no heartbeat");
    kvr_buf_free(&b);
}

Test(hostile_worker, hellos_and_rebinds_that_name_nothing_change_nothing)
{
    size_t mark = rec_nsent;
    kvr_worker_on_hello(&w, NULL); /* no reply subject: nobody to answer */
    kvr_worker_on_hello(&w, "");
    cr_assert(eq(sz, rec_nsent, mark));
    kvr_worker_on_hello(&w, "_INBOX.anyone"); /* anyone may ask: its heartbeat */
    cr_assert(eq(sz, rec_nsent, mark + 1));
    cr_assert(eq(str, rec_sent[mark].subject, "_INBOX.anyone"));
    uint8_t junk[16];
    memset(junk, 0xff, sizeof junk);
    kvr_worker_on_rebind(&w, junk, sizeof junk);
    Kvrouter__V1__WorkerRebind r = KVROUTER__V1__WORKER_REBIND__INIT;
    r.request_key = 777; /* a stream not here */
    struct kvr_buf b = {0};
    pack(&b, &r.base);
    kvr_worker_on_rebind(&w, b.data, b.len);
    kvr_buf_free(&b);
    cr_assert(eq(u64, w.c.rebinds_bad, 2), "counted (rebinds_bad)");
    cr_assert(eq(sz, rec_nsent, mark + 1), "nothing said");
}

/* A worker's cancel subject is its routers' to publish on (anyone's without NATS permissions):
 * each cancel that did not decode was a warning line, 1,001 for 1,001. */
static void bad_cancel(void *ctx)
{
    kvr_worker_on_cancel(ctx, rec_junk, sizeof rec_junk);
}

Test(hostile_worker, a_flood_of_bad_cancels_is_logged_in_few_lines)
{
    rec_log_flood(bad_cancel, &w, "test_hostile_worker", "msg=cancel_dropped");
    cr_assert(eq(u64, w.c.bad_cancels, 1001), "every one counted");
}
