/* The simulated engine: prefix hits, eviction order, preemption, chunked prefill, step timing. */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <math.h>
#include <string.h>

#include "../../src/engine/engine.h"
#include "kvr/rng.h"

#define B  4
#define MS 1000000ull

struct log {
    uint64_t removed[256];
    int nremoved;
    uint64_t stored[256];
    uint64_t stored_parent[256]; /* parent of the run each stored block started, or 0 */
    int nstored;
    int prefill, outblk, gaps;
    struct kvr_engine_result done[64];
    int ndone;
};

static struct log lg;

static void on_stored(void *ctx, const uint64_t *parent, const struct kvr_kv_block *b, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++) {
        lg.stored_parent[lg.nstored] = i == 0 && parent ? *parent : (i ? b[i - 1].engine_id : 0);
        lg.stored[lg.nstored++] = b[i].engine_id;
    }
}

static void on_removed(void *ctx, const uint64_t *ids, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++)
        lg.removed[lg.nremoved++] = ids[i];
}

static void on_prefill(void *ctx, uint64_t id)
{
    (void)ctx;
    (void)id;
    lg.prefill++;
}

static void on_outblk(void *ctx, uint64_t id)
{
    (void)ctx;
    (void)id;
    lg.outblk++;
}

static void on_gap(void *ctx, double g)
{
    (void)ctx;
    (void)g;
    lg.gaps++;
}

static void on_done(void *ctx, const struct kvr_engine_result *r)
{
    (void)ctx;
    lg.done[lg.ndone++] = *r;
}

static const struct kvr_engine_sink sink = {NULL,      on_stored, on_removed, on_prefill,
                                            on_outblk, on_gap,    NULL,       on_done};

static struct kvr_engine *make(uint32_t blocks, uint32_t batch, double watermark)
{
    memset(&lg, 0, sizeof lg);
    struct kvr_engine_config c;
    kvr_engine_config_default(&c);
    c.num_blocks = blocks;
    c.block_size = B;
    c.max_batched_tokens = batch;
    c.watermark = watermark;
    kvr_status st;
    struct kvr_engine *e = kvr_engine_create(&c, &sink, &st);
    cr_assert(e != NULL);
    return e;
}

/* A prompt of n full blocks: seq hashes base+i (distinct per base). */
static kvr_status submit(struct kvr_engine *e, uint64_t id, uint64_t base, uint32_t nblocks,
                         uint32_t isl, uint32_t osl, uint64_t now)
{
    uint64_t seq[64], local[64];
    for (uint32_t i = 0; i < nblocks; i++) {
        seq[i] = base + i;
        local[i] = 1000 + base + i;
    }
    struct kvr_engine_request r = {id, seq, local, nblocks, isl, osl};
    return kvr_engine_submit(e, &r, now);
}

/* Run to idleness; returns the time reached. */
static uint64_t drain(struct kvr_engine *e, uint64_t now)
{
    for (int guard = 0; guard < 100000; guard++) {
        uint64_t d = kvr_engine_step_begin(e, now);
        if (!d)
            return now;
        now += d;
        kvr_engine_step_end(e, now);
    }
    cr_assert(false, "the engine never went idle");
    return now;
}

Test(engine, second_request_hits_the_cached_prefix)
{
    struct kvr_engine *e = make(64, 8192, 0.0);
    cr_assert(eq(int, submit(e, 1, 100, 4, 4 * B + 2, 3, 0), KVR_OK));
    uint64_t t = drain(e, 0);
    cr_assert(eq(int, lg.ndone, 1));
    cr_assert(eq(u32, lg.done[0].cached_tokens, 0));
    cr_assert(eq(int, lg.nstored, 4), "every full prompt block is published once");
    for (int i = 0; i < 4; i++)
        cr_assert(eq(u64, lg.stored[i], 100 + (uint64_t)i));
    cr_assert(eq(u64, lg.stored_parent[0], 0), "the first block has no parent");
    cr_assert(eq(int, lg.prefill, 1));
    cr_assert(eq(int, lg.gaps, 2), "3 tokens, 2 gaps");
    cr_assert(eq(int, submit(e, 2, 100, 3, 3 * B + 1, 1, t), KVR_OK)); /* shares 3 blocks */
    drain(e, t);
    cr_assert(eq(int, lg.ndone, 2));
    cr_assert(eq(u32, lg.done[1].cached_tokens, 3 * B));
    cr_assert(eq(int, lg.nstored, 4), "cached blocks are not published again");
    struct kvr_engine_stats s;
    kvr_engine_stats(e, &s);
    cr_assert(eq(u32, s.active_blocks, 0));
    cr_assert(eq(u32, s.cached_blocks, 4));
    kvr_engine_destroy(e);
}

static uint64_t done_ids[128];
static int ndone_ids;

static void on_done_id(void *ctx, const struct kvr_engine_result *r)
{
    (void)ctx;
    done_ids[ndone_ids++] = r->id;
}

Test(engine, the_waiting_queue_keeps_its_order_while_it_grows_around_its_end)
{
    struct kvr_engine_config c;
    kvr_engine_config_default(&c);
    c.num_blocks = 4096;
    c.block_size = B;
    c.max_batched_tokens = 8 * B; /* 8 one-block prompts a step */
    c.watermark = 0;
    struct kvr_engine_sink s = {.done = on_done_id};
    ndone_ids = 0;
    kvr_status st;
    struct kvr_engine *e = kvr_engine_create(&c, &s, &st);
    cr_assert(e != NULL);
    uint64_t id = 1, now = 0;
    for (; id <= 64; id++) /* the queue's first room, full */
        cr_assert(eq(int, submit(e, id, 100 * id, 1, B, 2, now), KVR_OK));
    now += kvr_engine_step_begin(e, now); /* 8 leave the head */
    kvr_engine_step_end(e, now);
    for (; id <= 73; id++) /* 8 wrap around to the front of the room, then it must grow */
        cr_assert(eq(int, submit(e, id, 100 * id, 1, B, 2, now), KVR_OK));
    drain(e, now);
    cr_assert(eq(int, ndone_ids, 73));
    for (int i = 0; i < ndone_ids; i++)
        cr_assert(eq(u64, done_ids[i], (uint64_t)i + 1), "FIFO: equal requests finish in order");
    kvr_engine_destroy(e);
}

Test(engine, a_fully_cached_prompt_still_computes_a_token)
{
    struct kvr_engine *e = make(64, 8192, 0.0);
    submit(e, 1, 7, 3, 3 * B, 1, 0);
    uint64_t t = drain(e, 0);
    submit(e, 2, 7, 3, 3 * B, 1, t);
    drain(e, t);
    cr_assert(eq(u32, lg.done[1].cached_tokens, 2 * B), "the last block is recomputed");
    kvr_engine_destroy(e);
}

Test(engine, eviction_takes_the_least_recent_tail_first)
{
    struct kvr_engine *e = make(8, 8192, 0.0);
    submit(e, 1, 100, 4, 4 * B, 1, 0); /* exactly 4 blocks: done after the prefill */
    uint64_t t = drain(e, 0);
    submit(e, 2, 200, 4, 4 * B, 1, t);
    t = drain(e, t);
    cr_assert(eq(int, lg.nremoved, 0), "8 blocks hold both prompts");
    submit(e, 3, 300, 2, 2 * B, 1, t);
    drain(e, t);
    cr_assert(eq(int, lg.nremoved, 2));
    cr_assert(eq(u64, lg.removed[0], 103), "the oldest request's last block goes first");
    cr_assert(eq(u64, lg.removed[1], 102));
    kvr_engine_destroy(e);
}

Test(engine, running_dry_preempts_and_everyone_finishes)
{
    struct kvr_engine *e = make(12, 8192, 0.0);
    submit(e, 1, 100, 4, 4 * B, 20, 0); /* each needs 4 + 5 blocks over its life */
    submit(e, 2, 200, 4, 4 * B, 20, 0);
    drain(e, 0);
    cr_assert(eq(int, lg.ndone, 2));
    struct kvr_engine_stats s;
    kvr_engine_stats(e, &s);
    cr_assert(gt(u64, s.preemptions, 0));
    cr_assert(eq(u32, lg.done[0].osl, 20));
    cr_assert(eq(u32, s.active_blocks, 0));
    kvr_engine_destroy(e);
}

Test(engine, chunked_prefill_and_step_timing)
{
    struct kvr_engine *e = make(256, 100, 0.0);
    struct kvr_engine_config c;
    kvr_engine_config_default(&c);
    submit(e, 1, 1, 62, 250, 2, 0);
    uint64_t d1 = kvr_engine_step_begin(e, 0);
    double want = c.prefill_ms[0] + c.prefill_ms[1] * 100 + c.prefill_ms[2] * 100 * 100;
    cr_assert(eq(u64, d1, (uint64_t)llround(want * MS)), "a prefill-only step: prefill(100)");
    kvr_engine_step_end(e, d1);
    cr_assert(eq(int, lg.prefill, 0), "250 tokens take three chunks of at most 100");
    uint64_t d2 = kvr_engine_step_begin(e, d1);
    kvr_engine_step_end(e, d1 + d2);
    cr_assert(eq(int, lg.prefill, 0));
    uint64_t d3 = kvr_engine_step_begin(e, d1 + d2);
    double want3 = c.prefill_ms[0] + c.prefill_ms[1] * 50 + c.prefill_ms[2] * 50 * 50;
    cr_assert(eq(u64, d3, (uint64_t)llround(want3 * MS)));
    kvr_engine_step_end(e, d1 + d2 + d3);
    cr_assert(eq(int, lg.prefill, 1));
    uint64_t d4 = kvr_engine_step_begin(e, d1 + d2 + d3); /* one decode token */
    struct kvr_engine_stats s;
    kvr_engine_stats(e, &s);
    double u = (double)s.active_blocks / 256;
    double dec = c.decode_ms[0] + c.decode_ms[1] * u + c.decode_ms[2] * u * u;
    cr_assert(eq(u64, d4, (uint64_t)llround(dec * MS)), "a decode-only step: decode(u)");
    kvr_engine_step_end(e, d1 + d2 + d3 + d4);
    cr_assert(eq(int, lg.ndone, 1));
    cr_assert(eq(u64, lg.done[0].first_token, d1 + d2 + d3));
    cr_assert(eq(int, kvr_engine_step_begin(e, 0), 0), "idle");
    kvr_engine_destroy(e);
}

Test(engine, output_blocks_follow_the_sequence_length)
{
    struct kvr_engine *e = make(64, 8192, 0.0);
    submit(e, 1, 1, 2, 2 * B + 1, 1 + 3 + 4, 0); /* 9 prompt tokens, 8 output */
    drain(e, 0);
    /* kv tokens grow from 9 to 9 + 7: blocks from 3 to 4 (at 13) */
    cr_assert(eq(int, lg.outblk, 1));
    kvr_engine_destroy(e);
}

Test(engine, watermark_holds_back_admission)
{
    struct kvr_engine *e = make(100, 8192, 0.1);
    submit(e, 1, 1, 60, 60 * B, 1, 0);   /* 60 blocks of 100, leaving 40 >= 10: admitted */
    submit(e, 2, 500, 35, 35 * B, 1, 0); /* 35 more would leave 5 < 10: waits */
    uint64_t d = kvr_engine_step_begin(e, 0);
    struct kvr_engine_stats s;
    kvr_engine_stats(e, &s);
    cr_assert(eq(u32, s.running, 1));
    cr_assert(eq(u32, s.waiting, 1));
    kvr_engine_step_end(e, d);
    drain(e, d); /* the first frees its blocks (cached): the second then fits by eviction */
    cr_assert(eq(int, lg.ndone, 2));
    kvr_engine_destroy(e);
}

Test(engine, refuses_bad_requests)
{
    struct kvr_engine *e = make(16, 8192, 0.0);
    cr_assert(eq(int, submit(e, 1, 1, 0, 0, 1, 0), KVR_ERR_INVALID), "empty prompt");
    cr_assert(eq(int, submit(e, 1, 1, 0, 3, 0, 0), KVR_ERR_INVALID), "no output");
    cr_assert(eq(int, submit(e, 1, 1, 5, 3 * B, 1, 0), KVR_ERR_INVALID), "blocks beyond prompt");
    struct kvr_engine_config c;
    kvr_engine_config_default(&c);
    c.num_blocks = 1;
    kvr_status st;
    cr_assert(kvr_engine_create(&c, &sink, &st) == NULL);
    cr_assert(eq(int, st, KVR_ERR_INVALID));
    kvr_engine_destroy(e);
}

/* Random traffic twice: identical results, and nothing is left behind. */
static void random_traffic(struct kvr_engine_result *out, int *n)
{
    struct kvr_engine *e = make(200, 256, 0.01);
    struct kvr_rng rng;
    kvr_rng_seed(&rng, 9);
    uint64_t t = 0;
    for (uint64_t id = 1; id <= 40; id++) {
        uint32_t nb = 1 + (uint32_t)kvr_rng_below(&rng, 20);
        submit(e, id, 1000 * kvr_rng_below(&rng, 4), nb, nb * B + 1,
               1 + (uint32_t)kvr_rng_below(&rng, 30), t);
        for (int k = 0; k < 3; k++) {
            uint64_t d = kvr_engine_step_begin(e, t);
            t += d ? d : MS;
            if (d)
                kvr_engine_step_end(e, t);
        }
    }
    drain(e, t);
    struct kvr_engine_stats s;
    kvr_engine_stats(e, &s);
    cr_assert(eq(u32, s.active_blocks, 0));
    cr_assert(eq(u32, s.running + s.waiting, 0));
    memcpy(out, lg.done, sizeof lg.done);
    *n = lg.ndone;
    kvr_engine_destroy(e);
}

Test(engine, deterministic)
{
    static struct kvr_engine_result a[64], b[64];
    int na, nb;
    random_traffic(a, &na);
    random_traffic(b, &nb);
    cr_assert(eq(int, na, 40));
    cr_assert(eq(int, nb, 40));
    cr_assert(eq(int, memcmp(a, b, sizeof a), 0));
}

/* Every block back in the pool: none referenced, the cached ones as expected, none lost. */
static void assert_pool(struct kvr_engine *e, uint32_t cached)
{
    struct kvr_engine_stats s;
    kvr_engine_stats(e, &s);
    cr_assert(eq(u32, s.active_blocks, 0), "no block is still held");
    cr_assert(eq(u32, s.cached_blocks, cached));
    cr_assert(eq(u32, s.running + s.waiting, 0));
    cr_assert(eq(u64, s.cancelled, 1));
}

Test(engine, cancel_of_a_running_request_frees_its_blocks)
{
    struct kvr_engine *e = make(64, 8192, 0.0);
    cr_assert(eq(int, submit(e, 1, 100, 4, 4 * B + 2, 10, 0), KVR_OK));
    uint64_t t = kvr_engine_step_begin(e, 0);
    kvr_engine_step_end(e, t);
    cr_assert(eq(int, lg.prefill, 1));
    struct kvr_engine_progress p;
    cr_assert(kvr_engine_progress(e, 1, &p));
    cr_assert(p.running);
    cr_assert(eq(u32, p.generated, 1));
    struct kvr_engine_stats s;
    kvr_engine_stats(e, &s);
    cr_assert(eq(u32, s.active_blocks, 5), "4 prompt blocks and the partial fifth");
    cr_assert(eq(int, kvr_engine_cancel(e, 1), KVR_OK));
    assert_pool(e, 4); /* its computed prompt blocks stay cached, the partial one goes blank */
    cr_assert(not(kvr_engine_progress(e, 1, &p)));
    cr_assert(eq(int, kvr_engine_cancel(e, 1), KVR_ERR_UNKNOWN_REQUEST), "once");
    drain(e, t);
    cr_assert(eq(int, lg.ndone, 0), "a cancelled request never reports done");
    cr_assert(eq(int, lg.gaps, 0), "nor another token");
    cr_assert(eq(int, submit(e, 2, 100, 4, 4 * B + 2, 1, t), KVR_OK));
    drain(e, t);
    cr_assert(eq(u32, lg.done[0].cached_tokens, 4 * B), "what it computed is a cache hit");
    kvr_engine_destroy(e);
}

Test(engine, cancel_of_a_waiting_request)
{
    struct kvr_engine *e = make(100, 8192, 0.1);
    submit(e, 1, 1, 60, 60 * B, 1, 0);
    submit(e, 2, 500, 35, 35 * B, 1, 0); /* held back by the watermark */
    submit(e, 3, 900, 1, B, 1, 0);       /* behind it */
    uint64_t d = kvr_engine_step_begin(e, 0);
    struct kvr_engine_progress p;
    cr_assert(kvr_engine_progress(e, 2, &p));
    cr_assert(not(p.running));
    cr_assert(eq(int, kvr_engine_cancel(e, 2), KVR_OK));
    struct kvr_engine_stats s;
    kvr_engine_stats(e, &s);
    cr_assert(eq(u32, s.waiting, 1));
    kvr_engine_step_end(e, d);
    drain(e, d);
    cr_assert(eq(int, lg.ndone, 2));
    cr_assert(eq(u64, lg.done[0].id, 1));
    cr_assert(eq(u64, lg.done[1].id, 3), "the queue closes up behind the cancelled one");
    cr_assert(eq(int, kvr_engine_cancel(e, 42), KVR_ERR_UNKNOWN_REQUEST));
    kvr_engine_destroy(e);
}

Test(engine, cancel_between_a_steps_begin_and_end)
{
    struct kvr_engine *e = make(64, 8192, 0.0);
    submit(e, 1, 100, 3, 3 * B, 5, 0); /* its first decode step takes a fourth block */
    uint64_t t = kvr_engine_step_begin(e, 0);
    kvr_engine_step_end(e, t);
    uint64_t d = kvr_engine_step_begin(e, t);
    cr_assert(gt(u64, d, 0));
    cr_assert(eq(int, kvr_engine_cancel(e, 1), KVR_OK));
    kvr_engine_step_end(e, t + d);
    cr_assert(eq(int, lg.outblk, 0), "the block it took in that step is not announced");
    cr_assert(eq(int, lg.gaps, 0), "nor the step's token");
    cr_assert(eq(int, lg.ndone, 0));
    assert_pool(e, 3);
    cr_assert(eq(u64, kvr_engine_step_begin(e, t + d), 0), "idle");
    kvr_engine_destroy(e);
}

static uint32_t tokens_of_2; /* tokens request 2 produced after its first */

static void on_token_2(void *ctx, uint64_t id)
{
    (void)ctx;
    tokens_of_2 += id == 2;
}

/*
 * A request recomputed after a preemption computes its prompt and every token it had generated:
 * the step that completes that prefill yields its next token, as a decode step would (vLLM
 * samples at the end of the recomputation), rather than leaving it to one more step.
 */
Test(engine, a_recomputed_request_yields_a_token_at_the_end_of_its_recomputation)
{
    struct kvr_engine_config c;
    kvr_engine_config_default(&c);
    c.num_blocks = 10;
    c.block_size = B;
    c.watermark = 0;
    struct kvr_engine_sink s = {.prefill_done = on_prefill, .token = on_token_2};
    memset(&lg, 0, sizeof lg);
    tokens_of_2 = 0;
    kvr_status st;
    struct kvr_engine *e = kvr_engine_create(&c, &s, &st);
    cr_assert(e != NULL);
    submit(e, 1, 100, 4, 4 * B, 12, 0); /* 4 + 4 prompt blocks, then one output block each ... */
    submit(e, 2, 200, 4, 4 * B, 12, 0); /* ... and the next one preempts 2 (10 blocks) */
    uint64_t t = 0;
    bool preempted = false, checked = false;
    for (int guard = 0; guard < 1000 && !checked; guard++) {
        struct kvr_engine_progress p;
        bool before = kvr_engine_progress(e, 2, &p) && p.running;
        uint32_t generated = p.generated;
        uint64_t d = kvr_engine_step_begin(e, t);
        cr_assert(gt(u64, d, 0), "request 2 is recomputed before the engine goes idle");
        bool after = kvr_engine_progress(e, 2, &p) && p.running;
        preempted |= before && !after;
        t += d;
        uint32_t was = tokens_of_2;
        kvr_engine_step_end(e, t);
        if (preempted && !before && after) { /* readmitted: this step recomputes it whole */
            cr_assert(eq(u32, tokens_of_2, was + 1), "its recomputation yields a token");
            cr_assert(kvr_engine_progress(e, 2, &p));
            cr_assert(eq(u32, p.generated, generated + 1));
            checked = true;
        }
    }
    cr_assert(preempted && checked);
    drain(e, t);
    cr_assert(eq(u32, tokens_of_2, 11), "12 output tokens, no more");
    cr_assert(eq(int, lg.prefill, 2), "one first token each, none again after a recomputation");
    kvr_engine_destroy(e);
}
