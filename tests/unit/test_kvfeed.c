/*
 * The adapter's KV feed (src/worker/kvfeed.c) without an engine: decoded batches, built here as
 * kvevents hands them over, go in under the worker's mutex; the KvEvents the routers would get
 * are read back from the recording sink: which blocks are announced, which are left out and
 * counted.
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <pthread.h>
#include <stdio.h>
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

/* --- SGLang's cache_salt ------------------------------------------------------------------- */

/* A Stored with a cache_salt (SGLang's BlockStoredWithMetadata) was announced as the plain tokens'
 * blocks: the routers sent unsalted prompts to a worker whose radix cache keeps those blocks in the
 * salt's namespace, a prefix they miss there. */
Test(kvfeed, a_salted_stored_is_not_announced)
{
    uint64_t ids[4];
    struct kvr_kvev_event ev = stored_ev(ids, 51, 2, 0);
    ev.has_salt = true;
    size_t mark = rec_nsent;
    feed(&ev, 1);
    struct kvr_wire_kv got[2];
    cr_assert(eq(int, kv_events(mark, got, 2), 0), "the salted blocks are not announced");
    cr_assert(eq(u64, s.kv_skipped_salt, 2));
    cr_assert(eq(u64, s.kv_stored_blocks, 0));
    /* the same blocks without the salt are */
    ev.has_salt = false;
    mark = rec_nsent;
    feed(&ev, 1);
    int n = kv_events(mark, got, 2);
    cr_assert(eq(int, n, 1));
    cr_assert(eq(u32, got[0].nblocks, 2));
    free_kv(got, n);
    cr_assert(eq(u64, s.kv_skipped_salt, 2));
    cr_assert(eq(u64, s.kv_stored_blocks, 2));
}

/* SGLang's batch as the decoder gives it (the fixture of make.py: salted, unsalted, metadata
 * without a salt, a salt ""): only the unsalted Stored go on. */
Test(kvfeed, an_sglang_batch_announces_its_unsalted_blocks_only)
{
    FILE *fp = fopen(KVR_SOURCE_ROOT "/tests/fixtures/kvevents/sglang_salt_array.msgpack", "rb");
    cr_assert(fp != NULL);
    static uint8_t data[4096];
    size_t len = fread(data, 1, sizeof data, fp);
    fclose(fp);
    struct kvr_kvev_batch b;
    cr_assert(eq(int, kvr_kvev_decode(data, len, NULL, &b), KVR_OK));
    size_t mark = rec_nsent;
    pthread_mutex_lock(&w.mu);
    kvr__wk_kvfeed_batch(&f, &b, kvr_now_ns());
    pthread_mutex_unlock(&w.mu);
    kvr_worker_flush(&w);
    kvr_kvev_batch_free(&b);
    struct kvr_wire_kv got[8];
    int n = kv_events(mark, got, 8);
    static const uint64_t want[] = {33, 35, 36, 37, 39};
    uint64_t seen[8];
    int k = 0;
    for (int i = 0; i < n; i++)
        for (uint32_t j = 0; j < got[i].nblocks && k < 8; j++)
            seen[k++] = got[i].blocks[j].engine_id;
    free_kv(got, n);
    cr_assert(eq(int, k, 5));
    for (int i = 0; i < 5; i++)
        cr_assert(eq(u64, seen[i], want[i]), "block %d", i);
    cr_assert(eq(u64, s.kv_skipped_salt, 4), "31, 32, 34 and 38 are salted");
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

/* --- KV cache groups (hybrid models) ---------------------------------------------------------- */

/* ev as a block of KV cache group g, its kind as vLLM names it on a Stored ("" none). */
static struct kvr_kvev_event in_group(struct kvr_kvev_event ev, int64_t g, const char *kind)
{
    ev.has_group = true;
    ev.group_idx = g;
    snprintf(ev.spec_kind, sizeof ev.spec_kind, "%s", kind);
    return ev;
}

static struct kvr_kvev_event removed_ev(uint64_t *ids, uint32_t n)
{
    struct kvr_kvev_event e = {.kind = KVR_KVEV_REMOVED, .hashes = ids, .nhashes = n};
    strcpy(e.medium, "GPU");
    return e;
}

/* The kinds of the KvEvents published since mark ("S3 R1 C": a Stored of 3 blocks, a Removed of
 * one, a Cleared), and the engine ids they name in ids (at most 16). */
static void published(size_t mark, char *kinds, size_t len, uint64_t *ids)
{
    struct kvr_wire_kv got[8];
    int n = kv_events(mark, got, 8), at = 0;
    kinds[0] = '\0';
    for (int i = 0; i < n; i++) {
        size_t used = strlen(kinds);
        const char *sep = i ? " " : "";
        if (got[i].kind == KVR_WIRE_STORED) {
            snprintf(kinds + used, len - used, "%sS%u", sep, got[i].nblocks);
            for (uint32_t k = 0; k < got[i].nblocks && at < 16; k++)
                ids[at++] = got[i].blocks[k].engine_id;
        } else if (got[i].kind == KVR_WIRE_REMOVED) {
            snprintf(kinds + used, len - used, "%sR%u", sep, got[i].nids);
            for (uint32_t k = 0; k < got[i].nids && at < 16; k++)
                ids[at++] = got[i].ids[k];
        } else {
            snprintf(kinds + used, len - used, "%sC", sep);
        }
    }
    free_kv(got, n);
}

/* n events through the feed as one batch; what reached the routers, as published() says. */
static void feed_seen(struct kvr_kvev_event *ev, uint32_t n, char kinds[64], uint64_t ids[16])
{
    size_t mark = rec_nsent;
    feed(ev, n);
    published(mark, kinds, 64, ids);
}

/* A hybrid model (gpt-oss: sliding-window layers in group 0, full attention in group 1) stores a
 * prompt's blocks in both groups; the window then evicts the old blocks of group 0 while group 1
 * still holds them. The first group's Removed took them out of the routers' index: a prefix the
 * engine could reuse was priced as not cached. */
Test(kvfeed, a_sliding_window_groups_early_removed_keeps_the_full_attention_prefix)
{
    uint64_t ids[8], early[2] = {41, 42}, later = 41;
    struct kvr_kvev_event ev[2] = {in_group(stored_ev(ids, 41, 3, 0), 0, "sliding_window"),
                                   in_group(stored_ev(ids + 4, 41, 3, 0), 1, "full_attention")};
    char kinds[64];
    uint64_t got[16];
    feed_seen(ev, 2, kinds, got);
    cr_assert(eq(str, kinds, "S3"), "group 1's blocks alone, once");
    cr_assert(eq(u64, got[0], 41));
    cr_assert(eq(u64, s.kv_skipped_group, 3));

    struct kvr_kvev_event rm = in_group(removed_ev(early, 2), 0, ""); /* vLLM: no kind */
    feed_seen(&rm, 1, kinds, got);
    cr_assert(eq(str, kinds, ""), "the window's eviction leaves the prefix indexed");
    cr_assert(eq(u64, s.kv_skipped_group, 5));
    cr_assert(eq(u64, s.kv_removed_blocks, 0));

    rm = in_group(removed_ev(&later, 1), 1, ""); /* the full-attention group evicts it */
    feed_seen(&rm, 1, kinds, got);
    cr_assert(eq(str, kinds, "R1"));
    cr_assert(eq(u64, got[0], 41));
}

/* vLLM's subclasses of full attention count as full attention; the lowest full group is
 * followed; an untrusted kind that only starts like one (the decoder makes a NUL '?') does not;
 * a group past the 64 learnt is never followed. */
Test(kvfeed, the_lowest_full_attention_group_is_followed)
{
    uint64_t ids[16];
    struct kvr_kvev_event ev[5] = {
        in_group(stored_ev(ids, 51, 1, 0), 0, "mamba"),
        in_group(stored_ev(ids + 2, 52, 1, 0), 1, "full_attention???junk"),
        in_group(stored_ev(ids + 4, 53, 1, 0), 2, "sink_full_attention"),
        in_group(stored_ev(ids + 6, 54, 1, 0), 3, "mla_attention"),
        in_group(stored_ev(ids + 8, 55, 1, 0), 64, "full_attention"),
    };
    char kinds[64];
    uint64_t got[16];
    feed_seen(ev, 5, kinds, got);
    cr_assert(eq(str, kinds, "S1"));
    cr_assert(eq(u64, got[0], 53), "group 2, the lowest of full attention");
    cr_assert(eq(u64, s.kv_skipped_group, 4));
    cr_assert(eq(int, f.followed, 2));
}

/* group_idx without a kind (vLLM from March to April 2026, or a model of one group): group 0 is
 * followed, so its Stored and Removed pair up; events without group_idx go on as before. */
Test(kvfeed, without_kinds_group_zero_is_followed)
{
    uint64_t ids[8], gone[2] = {61, 71};
    struct kvr_kvev_event ev[3] = {in_group(stored_ev(ids, 61, 2, 0), 0, ""),
                                   in_group(stored_ev(ids + 2, 61, 2, 0), 1, ""),
                                   stored_ev(ids + 4, 71, 1, 0)};
    char kinds[64];
    uint64_t got[16];
    feed_seen(ev, 3, kinds, got);
    cr_assert(eq(str, kinds, "S2 S1"));
    cr_assert(eq(u64, got[0], 61));
    cr_assert(eq(u64, got[2], 71));
    struct kvr_kvev_event rm[3] = {in_group(removed_ev(gone, 1), 1, ""),
                                   in_group(removed_ev(gone, 1), 0, ""), removed_ev(gone + 1, 1)};
    feed_seen(rm, 3, kinds, got);
    cr_assert(eq(str, kinds, "R1 R1"), "group 1's skipped, group 0's and the groupless go on");
    cr_assert(eq(u64, s.kv_skipped_group, 3));
}

/* A full-attention group named after group 0's blocks went on (its first Stored came in a later
 * batch): group 0's Removed will be skipped from now on, so what it announced is cleared in the
 * routers before group 2's blocks go on. AllBlocksCleared keeps the kinds (the same engine); an
 * engine gone (restart, gap) has them learnt again. */
Test(kvfeed, a_full_attention_group_named_later_clears_what_group_zero_announced)
{
    uint64_t ids[8];
    struct kvr_kvev_event a = in_group(stored_ev(ids, 81, 2, 0), 0, "sliding_window");
    char kinds[64];
    uint64_t got[16];
    feed_seen(&a, 1, kinds, got);
    cr_assert(eq(str, kinds, "S2"), "no full attention group known yet: group 0");

    struct kvr_kvev_event b = in_group(stored_ev(ids + 2, 91, 1, 0), 2, "full_attention");
    feed_seen(&b, 1, kinds, got);
    cr_assert(eq(str, kinds, "C S1"));
    cr_assert(eq(u64, got[0], 91));

    struct kvr_kvev_event c[2] = {{.kind = KVR_KVEV_CLEARED},
                                  in_group(stored_ev(ids + 4, 95, 1, 0), 0, "")};
    feed_seen(c, 2, kinds, got);
    cr_assert(eq(str, kinds, "C"), "after AllBlocksCleared group 2 is still the one followed");

    pthread_mutex_lock(&w.mu);
    kvr__wk_kvfeed_cleared(&f); /* the engine restarted: another model may be served */
    pthread_mutex_unlock(&w.mu);
    kvr_worker_flush(&w); /* its Cleared */
    feed_seen(&c[1], 1, kinds, got);
    cr_assert(eq(str, kinds, "S1"));
    cr_assert(eq(u64, got[0], 95));
}
