/*
 * kvengine's KV events: the block table and the batcher on their own (lifetimes, limits, how
 * a step too large for one batch is cut, every wire form decoded back by kvevents), then
 * end to end through real ZeroMQ sockets on 127.0.0.1 with the kvevents subscriber: a prompt's
 * blocks arrive as BlockStored with its token ids and a parent chain, in each hash form and
 * layout; an eviction's BlockRemoved rides in the same batch as the Stored that caused it; a
 * reset is AllBlocksCleared; a step past the subscriber's limits arrives whole, in several
 * batches; a dropped batch is served by the replay socket.
 */
#include <criterion/criterion.h>
#include "../../criterion_gt.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>

#include "batcher.h"
#include "blocks.h"
#include "clock.h"
#include "kvevents.h"
#include "kvr/rng.h"
#include "kvr/hash.h"
#include "kvzmq.h"
#include "rig.h"
#include "state.h"

/* --- the block table ------------------------------------------------------------------------- */

Test(blocks, an_entry_lives_while_referenced_or_cached)
{
    struct kvr_se_blocks t;
    kvr_se_blocks_init(&t, 2);
    uint64_t seq[3] = {11, 12, 13};
    uint32_t tok[6] = {1, 2, 3, 4, 5, 6};
    cr_assert(eq(int, kvr_se_blocks_ref(&t, seq, tok, 3), KVR_OK));
    cr_assert(eq(int, kvr_se_blocks_ref(&t, seq, tok, 2), KVR_OK)); /* a second request */
    cr_assert(eq(u32, t.n, 3));
    const uint32_t *b = kvr_se_blocks_stored(&t, 12);
    cr_assert(ne(ptr, (void *)b, NULL));
    cr_assert(eq(u32, b[0], 3));
    cr_assert(eq(u32, b[1], 4));
    cr_assert(eq(ptr, (void *)kvr_se_blocks_stored(&t, 99), NULL));
    cr_assert(eq(u64, t.untracked, 1));
    cr_assert(eq(u32, t.ncached, 1));
    kvr_se_blocks_unref(&t, seq, 3);
    kvr_se_blocks_unref(&t, seq, 2);
    cr_assert(eq(u32, t.n, 1)); /* only the cached one is left */
    kvr_se_blocks_removed(&t, 12);
    cr_assert(eq(u32, t.n, 0));
    kvr_se_blocks_removed(&t, 12); /* twice: unknown */
    cr_assert(eq(u64, t.unknown_removed, 1));
    cr_assert(eq(int, kvr_se_blocks_ref(&t, seq, tok, 3), KVR_OK));
    kvr_se_blocks_stored(&t, 11);
    kvr_se_blocks_stored(&t, 13);
    kvr_se_blocks_cleared(&t);
    cr_assert(eq(u32, t.ncached, 0));
    cr_assert(eq(u32, t.n, 3)); /* still referenced */
    kvr_se_blocks_stored(&t, 13);
    kvr_se_blocks_unref(&t, seq, 3);
    cr_assert(eq(u32, t.n, 1));
    kvr_se_blocks_free(&t);
    cr_assert(eq(u32, t.n, 0));
}

/* --- the batcher, decoded back ---------------------------------------------------------------- */

static struct kvr_kvev_batch got[64];
static size_t ngot;

static kvr_status record(void *ctx, const void *payload, size_t len)
{
    const struct kvr_kvev_limits *lim = ctx;
    cr_assert(lt(sz, ngot, 64));
    kvr_status st = kvr_kvev_decode(payload, len, lim, &got[ngot]);
    cr_assert(eq(int, st, KVR_OK), "the batch does not decode: %s", kvr_status_str(st));
    ngot++;
    return KVR_OK;
}

static void free_got(void)
{
    for (size_t i = 0; i < ngot; i++)
        kvr_kvev_batch_free(&got[i]);
    ngot = 0;
}

TestSuite(batcher, .fini = free_got);

static const uint32_t *tokens_of(uint32_t *store, uint64_t h, uint32_t bs)
{
    for (uint32_t i = 0; i < bs; i++)
        store[i] = (uint32_t)(h * 10 + i);
    return store;
}

/* n stored blocks hashes 1..n, block i's tokens 10 i .. 10 i + bs - 1. */
static void store_run(struct kvr_se_batcher *b, const uint64_t *parent, uint32_t n, uint32_t bs)
{
    static uint64_t h[256];
    static uint32_t tok[256][8];
    static const uint32_t *tp[256];
    for (uint32_t i = 0; i < n; i++) {
        h[i] = i + 1;
        tp[i] = tokens_of(tok[i], h[i], bs);
    }
    kvr_se_batcher_stored(b, parent, h, tp, n);
}

Test(batcher, one_step_is_one_batch_in_order)
{
    struct kvr_kvev_encoding how = {KVR_KVEV_HASH_UINT, KVR_KVEV_LAYOUT_NEW, true};
    struct kvr_se_batcher b;
    cr_assert(eq(int, kvr_se_batcher_init(&b, &how, NULL, 2, record, NULL), KVR_OK));
    kvr_se_batcher_begin(&b, 1234.5);
    uint64_t gone[2] = {77, 78};
    kvr_se_batcher_removed(&b, gone, 2);
    store_run(&b, NULL, 3, 2);
    kvr_se_batcher_cleared(&b);
    kvr_se_batcher_flush(&b);
    kvr_se_batcher_flush(&b); /* nothing more: no empty batch */
    cr_assert(eq(sz, ngot, 1));
    struct kvr_kvev_batch *g = &got[0];
    cr_assert(eq(dbl, g->ts, 1234.5));
    cr_assert(g->has_dp_rank);
    cr_assert(eq(i64, g->dp_rank, 0));
    cr_assert(eq(u32, g->nevents, 3));
    cr_assert(eq(int, g->events[0].kind, KVR_KVEV_REMOVED));
    cr_assert(eq(u64, g->events[0].hashes[1], 78));
    cr_assert(eq(str, g->events[0].medium, "GPU"));
    struct kvr_kvev_event *s = &g->events[1];
    cr_assert(eq(int, s->kind, KVR_KVEV_STORED));
    cr_assert(not(s->has_parent));
    cr_assert(not(s->has_lora));
    cr_assert(eq(u32, s->block_size, 2));
    cr_assert(eq(u32, s->nhashes, 3));
    cr_assert(eq(u32, s->ntokens, 6));
    cr_assert(eq(u32, s->tokens[4], 30));
    cr_assert(eq(u32, s->tokens[5], 31));
    cr_assert(eq(str, s->medium, "GPU"));
    cr_assert(eq(int, g->events[2].kind, KVR_KVEV_CLEARED));
    cr_assert(eq(u64, b.batches, 1));
    cr_assert(eq(u64, b.events, 3));
    kvr_se_batcher_free(&b);
}

/* A hybrid engine (--kv-hybrid): each block stored by the sliding-window group 0 and the
 * full-attention group 1 (vLLM's map events, the kind on each Stored), then removed by group 0
 * at once; the engine's own evictions are group 1's. */
Test(batcher, a_hybrid_engine_stores_in_two_groups_and_the_window_evicts_at_once)
{
    struct kvr_kvev_encoding how = {KVR_KVEV_HASH_UINT, KVR_KVEV_LAYOUT_MAP, true};
    struct kvr_se_batcher b;
    cr_assert(eq(int, kvr_se_batcher_init(&b, &how, NULL, 2, record, NULL), KVR_OK));
    b.hybrid = true;
    kvr_se_batcher_begin(&b, 1);
    store_run(&b, NULL, 2, 2);
    uint64_t gone = 1;
    kvr_se_batcher_removed(&b, &gone, 1);
    kvr_se_batcher_cleared(&b);
    kvr_se_batcher_flush(&b);
    cr_assert(eq(sz, ngot, 1));
    const struct kvr_kvev_batch *g = &got[0];
    cr_assert(eq(u32, g->nevents, 5));
    static const struct {
        enum kvr_kvev_kind kind;
        int64_t group;
        const char *spec;
    } want[5] = {{KVR_KVEV_STORED, 0, "sliding_window"},
                 {KVR_KVEV_STORED, 1, "full_attention"},
                 {KVR_KVEV_REMOVED, 0, ""},
                 {KVR_KVEV_REMOVED, 1, ""},
                 {KVR_KVEV_CLEARED, -1, ""}};
    for (int i = 0; i < 5; i++) {
        const struct kvr_kvev_event *e = &g->events[i];
        cr_assert(eq(int, e->kind, want[i].kind), "event %d", i);
        cr_assert(eq(int, e->has_group, want[i].group >= 0), "event %d", i);
        cr_assert(eq(i64, e->group_idx, want[i].group >= 0 ? want[i].group : 0), "event %d", i);
        cr_assert(eq(str, (char *)e->spec_kind, (char *)want[i].spec), "event %d", i);
    }
    cr_assert(eq(u32, g->events[0].nhashes, 2));
    cr_assert(eq(u32, g->events[1].ntokens, 4));
    cr_assert(eq(u32, g->events[2].nhashes, 2), "the window keeps nothing");
    cr_assert(eq(u64, g->events[3].hashes[0], 1));
    kvr_se_batcher_free(&b);
}

/* The Stored pieces across every batch received: hashes 1..n in order, each piece's parent the
 * block before it. */
static void check_chain(uint32_t n, uint32_t bs, const uint64_t *parent)
{
    uint32_t next = 1;
    for (size_t i = 0; i < ngot; i++) {
        for (uint32_t e = 0; e < got[i].nevents; e++) {
            struct kvr_kvev_event *ev = &got[i].events[e];
            cr_assert(eq(int, ev->kind, KVR_KVEV_STORED));
            if (next == 1 && parent) {
                cr_assert(ev->has_parent);
                cr_assert(eq(u64, ev->parent, *parent));
            } else if (next == 1) {
                cr_assert(not(ev->has_parent));
            } else {
                cr_assert(ev->has_parent);
                cr_assert(eq(u64, ev->parent, next - 1));
            }
            for (uint32_t k = 0; k < ev->nhashes; k++, next++) {
                cr_assert(eq(u64, ev->hashes[k], next));
                cr_assert(eq(u32, ev->tokens[k * bs], next * 10));
            }
        }
    }
    cr_assert(eq(u32, next, n + 1));
}

Test(batcher, a_step_over_the_hash_limit_is_cut_and_chained)
{
    struct kvr_kvev_encoding how = {KVR_KVEV_HASH_INT, KVR_KVEV_LAYOUT_NEW, false};
    struct kvr_se_batch_limits lim = {.max_hashes = 4};
    struct kvr_kvev_limits dl = {.max_hashes = 4};
    struct kvr_se_batcher b;
    cr_assert(eq(int, kvr_se_batcher_init(&b, &how, &lim, 2, record, &dl), KVR_OK));
    uint64_t parent = 999;
    kvr_se_batcher_begin(&b, 1);
    store_run(&b, &parent, 10, 2);
    kvr_se_batcher_flush(&b);
    cr_assert(eq(sz, ngot, 3)); /* 4 + 4 + 2 */
    cr_assert(eq(u32, got[2].events[0].nhashes, 2));
    check_chain(10, 2, &parent);
    kvr_se_batcher_free(&b);
}

Test(batcher, a_step_over_the_token_limit_is_cut)
{
    struct kvr_kvev_encoding how = {KVR_KVEV_HASH_UINT, KVR_KVEV_LAYOUT_OLD, false};
    struct kvr_se_batch_limits lim = {.max_tokens = 17};
    struct kvr_kvev_limits dl = {.max_tokens = 17};
    struct kvr_se_batcher b;
    cr_assert(eq(int, kvr_se_batcher_init(&b, &how, &lim, 8, record, &dl), KVR_OK));
    kvr_se_batcher_begin(&b, 1);
    store_run(&b, NULL, 5, 8);
    kvr_se_batcher_flush(&b);
    cr_assert(eq(sz, ngot, 3)); /* two blocks of 8 per batch */
    check_chain(5, 8, NULL);
    cr_assert(eq(u32, got[0].events[0].block_size, 8)); /* from num_toks_per_block */
    kvr_se_batcher_free(&b);
    /* a block larger than a batch could never go out */
    cr_assert(eq(int, kvr_se_batcher_init(&b, &how, &lim, 18, record, &dl), KVR_ERR_INVALID));
    kvr_se_batcher_free(&b);
}

Test(batcher, a_step_over_the_event_limit_is_cut)
{
    struct kvr_kvev_encoding how = {KVR_KVEV_HASH_BYTES32, KVR_KVEV_LAYOUT_MAP, true};
    struct kvr_se_batch_limits lim = {.max_events = 2};
    struct kvr_kvev_limits dl = {.max_events = 2};
    struct kvr_se_batcher b;
    cr_assert(eq(int, kvr_se_batcher_init(&b, &how, &lim, 1, record, &dl), KVR_OK));
    kvr_se_batcher_begin(&b, 1);
    for (uint64_t i = 1; i <= 5; i++)
        kvr_se_batcher_removed(&b, &i, 1);
    kvr_se_batcher_flush(&b);
    cr_assert(eq(sz, ngot, 3));
    uint64_t want = 1;
    for (size_t i = 0; i < ngot; i++)
        for (uint32_t e = 0; e < got[i].nevents; e++, want++)
            cr_assert(eq(u64, got[i].events[e].hashes[0], kvr_kvev_id_of_digest(want)));
    cr_assert(eq(u64, want, 6));
    kvr_se_batcher_free(&b);
}

static kvr_status refuse_emit(void *ctx, const void *payload, size_t len)
{
    return KVR_ERR_SHUTDOWN;
}

Test(batcher, a_failed_publish_is_counted)
{
    struct kvr_kvev_encoding how = {KVR_KVEV_HASH_UINT, KVR_KVEV_LAYOUT_NEW, true};
    struct kvr_se_batcher b;
    kvr_se_batcher_init(&b, &how, NULL, 4, refuse_emit, NULL);
    kvr_se_batcher_cleared(&b);
    kvr_se_batcher_flush(&b);
    cr_assert(eq(u64, b.failed, 1));
    cr_assert(eq(u64, b.batches, 0));
    kvr_se_batcher_free(&b);
}

/* --- end to end ------------------------------------------------------------------------------ */

#define CAP 512

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct kvr_kvev_batch b[CAP];
    uint64_t seq[CAP];
    bool replayed[CAP];
    size_t n;
    uint32_t resets;
} cap = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void on_batch(void *ctx, uint64_t seq, struct kvr_kvev_batch *b, bool replayed)
{
    pthread_mutex_lock(&cap.mu);
    if (cap.n < CAP) {
        cap.b[cap.n] = *b;
        *b = (struct kvr_kvev_batch){0}; /* taken */
        cap.seq[cap.n] = seq;
        cap.replayed[cap.n++] = replayed;
    }
    pthread_cond_broadcast(&cap.cv);
    pthread_mutex_unlock(&cap.mu);
}

static void on_reset(void *ctx, const char *why)
{
    pthread_mutex_lock(&cap.mu);
    cap.resets++;
    pthread_mutex_unlock(&cap.mu);
}

#define KV_SEED 0x5eedull /* --kv-hash-seed */

static struct kvr_se_config cfg;
static struct kvr_standin *srv;
static struct kvr_kvsub *sub;
static uint16_t port;

static void setup(void)
{
    rig_config(&cfg);
    snprintf(cfg.kv_events, sizeof cfg.kv_events, "tcp://127.0.0.1:*");
    snprintf(cfg.kv_replay, sizeof cfg.kv_replay, "tcp://127.0.0.1:*");
    cfg.kv_hash_seed = KV_SEED;
    cfg.test_hooks = true;
}

static void teardown(void)
{
    kvr_kvsub_close(sub);
    sub = NULL;
    kvr_standin_destroy(srv);
    srv = NULL;
    for (size_t i = 0; i < cap.n; i++)
        kvr_kvev_batch_free(&cap.b[i]);
    cap.n = 0;
    cap.resets = 0;
    curl_global_cleanup();
}

TestSuite(kv, .init = setup, .fini = teardown, .timeout = 60);

/* Start kvengine and a subscriber on its sockets; wait until the PUB sees the subscription. */
static void up(const char *topic)
{
    if (topic)
        snprintf(cfg.kv_topic, sizeof cfg.kv_topic, "%s", topic);
    srv = rig_start(&cfg);
    port = kvr_standin_port(srv);
    char ep[KVR_KVZMQ_ENDPOINT_MAX], rep[KVR_KVZMQ_ENDPOINT_MAX];
    cr_assert(eq(int, kvr_standin_kv_endpoint(srv, false, ep, sizeof ep), KVR_OK));
    cr_assert(eq(int, kvr_standin_kv_endpoint(srv, true, rep, sizeof rep), KVR_OK));
    struct kvr_kvsub_config sc = {.endpoint = ep, .replay_endpoint = rep, .topic = topic};
    struct kvr_kvsub_hooks h = {.ctx = NULL, .batch = on_batch, .reset = on_reset};
    kvr_status st;
    sub = kvr_kvsub_open(&sc, &h, &st);
    cr_assert(ne(ptr, sub, NULL), "kvr_kvsub_open: %s", kvr_status_str(st));
    cr_assert(kvr_kvpub_wait_subscribers(kvr_standin_state(srv)->pub, 1, 5000));
}

/* Wait until the subscriber has n batches (5 s at most). */
static void wait_batches(size_t n)
{
    uint64_t deadline = kvr_realtime_ns() + 5 * KVR_NS_PER_S;
    struct timespec ts = {(time_t)(deadline / KVR_NS_PER_S), (long)(deadline % KVR_NS_PER_S)};
    pthread_mutex_lock(&cap.mu);
    while (cap.n < n && pthread_cond_timedwait(&cap.cv, &cap.mu, &ts) == 0)
        ;
    size_t have = cap.n;
    pthread_mutex_unlock(&cap.mu);
    cr_assert(ge(sz, have, n), "%zu batches of %zu", have, n);
}

/* A completion of prompt[0..n) for one token, run to its end. */
static void complete(const uint32_t *prompt, uint32_t n)
{
    size_t len = (size_t)n * 12 + 64;
    char *b = malloc(len), *p = b;
    if (!b)
        abort();
    p += sprintf(p, "{\"max_tokens\":1,\"prompt\":[");
    for (uint32_t i = 0; i < n; i++)
        p += sprintf(p, i ? ",%u" : "%u", prompt[i]);
    sprintf(p, "]}");
    struct rig_resp r;
    cr_assert(eq(long, rig_post(port, "/v1/completions", b, &r), 200), "%s", r.body);
    rig_resp_free(&r);
    free(b);
}

/* A block's hash on the wire: kvengine's own (the sequence hash) mixed with --kv-hash-seed (the
 * tests' KV_SEED), then in the wire's form. */
static uint64_t wire_id(uint64_t seq)
{
    uint64_t id = kvr_mix64(seq ^ KV_SEED);
    return cfg.kv_hash == KVR_SE_HASH_BYTES ? kvr_kvev_id_of_digest(id) : id;
}

/* Batch i holds one Stored event: hashes = seq[from..from+k) of prompt, its tokens, parent. */
static void check_stored(size_t i, const uint32_t *prompt, uint32_t from, uint32_t k)
{
    uint32_t bs = cfg.engine.block_size;
    uint64_t seq[64];
    kvr_hash_prompt(prompt, (from + k) * bs, bs, NULL, seq);
    struct kvr_kvev_batch *b = &cap.b[i];
    cr_assert(eq(u32, b->nevents, 1));
    struct kvr_kvev_event *e = &b->events[0];
    cr_assert(eq(int, e->kind, KVR_KVEV_STORED));
    cr_assert(eq(u32, e->nhashes, k));
    cr_assert(eq(u32, e->block_size, bs));
    cr_assert(eq(u32, e->ntokens, k * bs));
    for (uint32_t j = 0; j < k; j++)
        cr_assert(eq(u64, e->hashes[j], wire_id(seq[from + j])), "block %u", from + j);
    for (uint32_t j = 0; j < k * bs; j++)
        cr_assert(eq(u32, e->tokens[j], prompt[from * bs + j]));
    if (from == 0) {
        cr_assert(not(e->has_parent));
    } else {
        cr_assert(e->has_parent);
        cr_assert(eq(u64, e->parent, wire_id(seq[from - 1])));
    }
    cr_assert(not(e->has_lora));
    if (cfg.kv_layout != KVR_SE_LAYOUT_OLD)
        cr_assert(eq(str, e->medium, "GPU"));
}

/* A prompt's blocks as Stored with their tokens; a second prompt sharing two of its blocks
 * announces only its own, parented on the shared prefix. */
static void stored_chain(void)
{
    up(NULL);
    uint32_t a[14], b[16];
    for (uint32_t i = 0; i < 16; i++) {
        if (i < 14)
            a[i] = 1000 + i;
        b[i] = i < 8 ? 1000 + i : 5000 + i;
    }
    complete(a, 14);
    wait_batches(1);
    check_stored(0, a, 0, 3);
    complete(b, 16);
    wait_batches(2);
    check_stored(1, b, 2, 2);
    cr_assert(eq(u64, cap.seq[1], cap.seq[0] + 1));
    cr_assert(not(cap.replayed[1]));
    cr_assert(eq(dbl, rig_metric(port, "kvengine_kv_blocks_cached"), 5));
    cr_assert(eq(dbl, rig_metric(port, "kvengine_kv_untracked_blocks_total"), 0));
}

Test(kv, stored_blocks_carry_tokens_and_parent_uint)
{
    cfg.kv_hash = KVR_SE_HASH_UINT;
    stored_chain();
}

Test(kv, stored_blocks_carry_tokens_and_parent_int)
{
    cfg.kv_hash = KVR_SE_HASH_INT;
    stored_chain();
}

Test(kv, stored_blocks_carry_tokens_and_parent_bytes)
{
    cfg.kv_hash = KVR_SE_HASH_BYTES;
    stored_chain();
}

Test(kv, stored_blocks_old_layout)
{
    cfg.kv_layout = KVR_SE_LAYOUT_OLD;
    stored_chain();
    cr_assert(not(cap.b[0].has_dp_rank));
}

Test(kv, stored_blocks_map_layout_with_a_topic)
{
    cfg.kv_layout = KVR_SE_LAYOUT_MAP;
    cfg.engine.block_size = 4;
    up("kv-events");
    uint32_t a[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    complete(a, 9);
    wait_batches(1);
    check_stored(0, a, 0, 2);
    cr_assert(cap.b[0].seen & KVR_KVEV_SEEN_MAP_EVENTS);
}

Test(kv, eviction_removed_rides_with_the_stored_that_caused_it)
{
    cfg.engine.num_blocks = 16; /* 64 tokens */
    cfg.max_model_len = 64;
    up(NULL);
    uint32_t a[40], b[40];
    for (uint32_t i = 0; i < 40; i++) {
        a[i] = 100 + i;
        b[i] = 900 + i;
    }
    complete(a, 40);
    wait_batches(1);
    complete(b, 40);
    wait_batches(2);
    uint64_t seq_a[10];
    kvr_hash_prompt(a, 40, 4, NULL, seq_a);
    struct kvr_kvev_batch *g = &cap.b[1];
    cr_assert(eq(u32, g->nevents, 2));
    cr_assert(eq(int, g->events[0].kind, KVR_KVEV_REMOVED));
    cr_assert(eq(u32, g->events[0].nhashes, 4)); /* 6 blank blocks, then 4 of a's evicted */
    for (uint32_t i = 0; i < 4; i++) {
        bool of_a = false;
        for (uint32_t k = 6; k < 10; k++) /* a's tail goes first */
            of_a |= g->events[0].hashes[i] == wire_id(seq_a[k]);
        cr_assert(of_a, "removed %016llx is not one of a's last blocks",
                  (unsigned long long)g->events[0].hashes[i]);
    }
    cr_assert(eq(int, g->events[1].kind, KVR_KVEV_STORED));
    cr_assert(eq(u32, g->events[1].nhashes, 10));
    cr_assert(eq(dbl, rig_metric(port, "kvengine_kv_blocks_tracked"), 16));
    cr_assert(eq(dbl, rig_metric(port, "kvengine_kv_unknown_removed_total"), 0));
}

Test(kv, clear_is_all_blocks_cleared)
{
    up(NULL);
    uint32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    complete(a, 8);
    wait_batches(1);
    struct rig_resp r;
    cr_assert(eq(long, rig_post(port, "/test/clear", "", &r), 200));
    rig_resp_free(&r);
    wait_batches(2);
    cr_assert(eq(u32, cap.b[1].nevents, 1));
    cr_assert(eq(int, cap.b[1].events[0].kind, KVR_KVEV_CLEARED));
    cr_assert(eq(dbl, rig_metric(port, "kvengine_kv_blocks_tracked"), 0));
    complete(a, 8); /* stored again: the cache was empty */
    wait_batches(3);
    check_stored(2, a, 0, 2);
}

Test(kv, a_step_past_the_subscriber_limits_arrives_in_several_batches)
{
    uint32_t n = KVR_KVEV_MAX_HASHES + 4000;
    cfg.engine.block_size = 1;
    cfg.engine.num_blocks = n + n / 50;     /* above the admission watermark (1 %) */
    cfg.engine.max_batched_tokens = n + 16; /* the whole prompt in one step */
    cfg.engine.speedup = 1000;
    cfg.max_model_len = n + 16;
    up(NULL);
    uint32_t *p = malloc(n * sizeof *p);
    for (uint32_t i = 0; i < n; i++)
        p[i] = i;
    complete(p, n);
    wait_batches(2);
    rig_sleep_ms(50);
    cr_assert(eq(sz, cap.n, 2));
    struct kvr_kvev_event *e0 = &cap.b[0].events[0], *e1 = &cap.b[1].events[0];
    cr_assert(eq(u32, e0->nhashes + e1->nhashes, n));
    cr_assert(eq(u32, e0->nhashes, KVR_KVEV_MAX_HASHES));
    cr_assert(e1->has_parent);
    cr_assert(eq(u64, e1->parent, e0->hashes[e0->nhashes - 1]));
    cr_assert(eq(u32, e1->tokens[0], KVR_KVEV_MAX_HASHES));
    struct kvr_kvsub_stats ss;
    kvr_kvsub_stats(sub, &ss);
    cr_assert(eq(u64, ss.bad, 0));
    free(p);
}

Test(kv, a_dropped_batch_is_served_by_the_replay_socket)
{
    up(NULL);
    uint32_t p[3][8];
    for (uint32_t k = 0; k < 3; k++)
        for (uint32_t i = 0; i < 8; i++)
            p[k][i] = 100 * k + i;
    complete(p[0], 8); /* seq 0: the subscriber's first */
    wait_batches(1);
    struct rig_resp r;
    cr_assert(eq(long, rig_post(port, "/test/drop_batches?n=1", "", &r), 200));
    rig_resp_free(&r);
    complete(p[1], 8); /* seq 1: kept for replay, not sent */
    cr_assert(eq(dbl, rig_wait_metric(port, "kvengine_kv_batches_withheld_total", 1, 5000), 1));
    complete(p[2], 8); /* seq 2: the gap is seen, seq 1 replayed, then 2 */
    wait_batches(3);
    cr_assert(eq(u64, cap.seq[1], 1));
    cr_assert(cap.replayed[1]);
    check_stored(1, p[1], 0, 2);
    cr_assert(eq(u64, cap.seq[2], 2));
    check_stored(2, p[2], 0, 2);
    struct kvr_kvsub_stats ss;
    uint64_t deadline = rig_now_ns() + 5 * KVR_NS_PER_S; /* counted just after the delivery */
    do
        kvr_kvsub_stats(sub, &ss);
    while (ss.gaps_filled < 1 && rig_now_ns() < deadline && (rig_sleep_ms(2), true));
    cr_assert(eq(u64, ss.gaps, 1));
    cr_assert(eq(u64, ss.gaps_filled, 1));
    cr_assert(eq(u32, cap.resets, 0));
    cr_assert(eq(dbl, rig_metric(port, "kvengine_kv_replay_requests_total"), 1));
}
