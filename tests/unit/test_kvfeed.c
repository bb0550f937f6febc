/*
 * The adapter's KV feed (src/worker/kvfeed.c) without an engine: decoded batches, built here as
 * kvevents hands them over, go in under the worker's mutex; the KvEvents the routers would get
 * are read back from the recording sink: which blocks are announced, which are left out and
 * counted.
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <pthread.h>
#include <string.h>

#include "clock.h"
#include "codec.h"
#include "kvfeed.h"
#include "kvr/hash.h"
#include "log.h"
#include "rec.h"
#include "worker.h"

#define BS 4 /* tokens a block */

static struct kvr_wk_config cfg;
static struct kvr_worker w;
static struct kvr_wk_adapter_stats s;
static struct kvr_wk_kvfeed f;

static void setup(void)
{
    rec_reset();
    kvr_log_init("test_kvfeed", KVR_LOG_ERROR);
    kvr_wk_config_default(&cfg);
    cfg.id = 3;
    cfg.engine.num_blocks = 256;
    cfg.engine.block_size = BS;
    cr_assert(eq(int,
                 kvr_worker_init(&w, &cfg, (struct kvr_sink){.publish = rec_record, .ctx = NULL}),
                 KVR_OK));
    memset(&s, 0, sizeof s);
    kvr__wk_kvfeed_init(&f, &w, &s);
}

static void teardown(void)
{
    kvr__wk_kvfeed_free(&f);
    kvr_worker_free(&w);
    rec_reset();
}

TestSuite(kvfeed, .init = setup, .fini = teardown, .timeout = 30);

static uint32_t tokens[64 * BS];

/* A Stored of n blocks, ids first.., parent (0: none), block i's tokens 1000 * id + j. */
static struct kvr_kvev_event stored_ev(uint64_t *ids, uint64_t first, uint32_t n, uint64_t parent)
{
    static uint32_t at;
    struct kvr_kvev_event e = {.kind = KVR_KVEV_STORED, .hashes = ids, .nhashes = n};
    uint32_t *t = tokens + at;
    at = (at + n * BS) % (32 * BS);
    for (uint32_t i = 0; i < n; i++) {
        ids[i] = first + i;
        for (uint32_t j = 0; j < BS; j++)
            t[i * BS + j] = (uint32_t)(1000 * ids[i] + j);
    }
    e.tokens = t;
    e.ntokens = n * BS;
    e.block_size = BS;
    e.has_parent = parent != 0;
    e.parent = parent;
    strcpy(e.medium, "GPU");
    return e;
}

/* One batch of n events through the feed, as the subscriber's hook does. */
static void feed(struct kvr_kvev_event *ev, uint32_t n)
{
    struct kvr_kvev_batch b = {.ts = 1.0, .events = ev, .nevents = n};
    pthread_mutex_lock(&w.mu);
    kvr__wk_kvfeed_batch(&f, &b, kvr_now_ns());
    pthread_mutex_unlock(&w.mu);
    kvr_worker_flush(&w);
}

/* The KvEvents published since mark, decoded into out (at most max); their count. */
static int kv_events(size_t mark, struct kvr_wire_kv *out, int max)
{
    int n = 0;
    for (size_t i = mark; i < rec_nsent; i++) {
        if (strcmp(rec_sent[i].subject, w.subj_kv))
            continue;
        cr_assert(lt(int, n, max));
        cr_assert(eq(int, kvr_wire_decode_kv(rec_sent[i].data, rec_sent[i].len, &out[n]), KVR_OK));
        n++;
    }
    return n;
}

static void free_kv(struct kvr_wire_kv *e, int n)
{
    for (int i = 0; i < n; i++)
        kvr_wire_kv_free(&e[i]);
}

/* --- extra_keys ------------------------------------------------------------------------------- */

/* A block with extra_keys (a cache_salt, multimodal ids, a LoRA name) was announced as the plain
 * tokens' block: the routers sent token-only prompts to a cache vLLM would miss. */
Test(kvfeed, a_block_with_extra_keys_and_those_after_it_are_not_announced)
{
    uint64_t ids[8];
    struct kvr_kvev_event ev[2];
    ev[0] = stored_ev(ids, 11, 3, 0);
    ev[0].has_extra = true; /* blocks 12 and 13 keyed: 11 alone is the tokens' */
    ev[0].nplain = 1;
    ev[1] = stored_ev(ids + 3, 21, 2, 0);
    ev[1].has_extra = true; /* [["tenant-a-salt"], ...]: none of it */
    ev[1].nplain = 0;
    size_t mark = rec_nsent;
    feed(ev, 2);
    struct kvr_wire_kv got[4];
    int n = kv_events(mark, got, 4);
    cr_assert(eq(int, n, 1), "the salted run announces nothing");
    cr_assert(eq(int, got[0].kind, KVR_WIRE_STORED));
    cr_assert(eq(u32, got[0].nblocks, 1));
    cr_assert(eq(u64, got[0].blocks[0].engine_id, 11));
    cr_assert(eq(u64, got[0].blocks[0].local_hash, kvr_hash_block(ev[0].tokens, BS)));
    free_kv(got, n);
    cr_assert(eq(u64, s.kv_skipped_extra, 4));
    cr_assert(eq(u64, s.kv_stored_blocks, 1));
    /* without extra_keys, the same blocks are announced */
    ev[1].has_extra = false;
    mark = rec_nsent;
    feed(&ev[1], 1);
    n = kv_events(mark, got, 4);
    cr_assert(eq(int, n, 1));
    cr_assert(eq(u32, got[0].nblocks, 2));
    free_kv(got, n);
}

/* --- removals ------------------------------------------------------------------------------- */

/* Every BlockRemoved goes on, whatever BlockStoreds came before it: one BlockStored is not always
 * one copy in vLLM (kv_cache_report_mode "full" announces prefix-cache hits again), so a count of
 * copies held the only Removed of a block back and the routers kept indexing it after the engine
 * evicted it. Two real copies then make the routers miss a block the worker still has. */
Test(kvfeed, every_removed_goes_on_after_a_block_announced_twice)
{
    uint64_t ids[4], gone = 31;
    struct kvr_kvev_event ev[2] = {stored_ev(ids, 31, 1, 0), stored_ev(ids + 2, 31, 1, 0)};
    feed(ev, 2);
    struct kvr_kvev_event rm = {.kind = KVR_KVEV_REMOVED, .hashes = &gone, .nhashes = 1};
    strcpy(rm.medium, "GPU");
    size_t mark = rec_nsent;
    feed(&rm, 1);
    struct kvr_wire_kv got[2];
    int n = kv_events(mark, got, 2);
    cr_assert(eq(int, n, 1), "the Removed reaches the routers");
    cr_assert(eq(int, got[0].kind, KVR_WIRE_REMOVED));
    cr_assert(eq(u32, got[0].nids, 1));
    cr_assert(eq(u64, got[0].ids[0], 31));
    free_kv(got, n);
    cr_assert(eq(u64, s.kv_removed_blocks, 1));
}
