/*
 * kvfeed: the engine's KV events (decoded batches, src/kvevents) made the routers' KvEvents, for
 * the adapter (adapter.c). It decides which blocks kvrouter can name (its hash is of a block's
 * tokens alone: not a LoRA adapter's, not another medium's, not one with extra_keys or a
 * cache_salt) and, for an engine that tags its blocks with a KV cache group (vLLM serving a hybrid
 * model), follows one group: the lowest whose kind is full attention, else group 0. It counts the
 * blocks left out by why. Everything runs under the worker's mutex, on the subscriber's thread;
 * the feed holds no lock of its own.
 */
#ifndef KVR_WK_KVFEED_H
#define KVR_WK_KVFEED_H

#include <stdint.h>

#include "kvevents.h"
#include "worker.h"

#define KVR_WK_KVFEED_GROUPS 64 /* KV cache groups whose kind a feed learns: group_idx 0..63 */

struct kvr_wk_kvfeed {
    struct kvr_worker *w;           /* borrowed: must outlive the feed */
    struct kvr_wk_adapter_stats *s; /* borrowed: where its figures are counted */
    struct kvr_kv_block *blk;       /* a Stored event's blocks (owned) */
    uint32_t capblk;                /* */
    uint64_t warned_block_at;       /* the last kv_block_size_mismatch (monotonic ns) */
    uint64_t known_groups;          /* bit g: the engine named group g's kind */
    uint64_t full_groups;           /* bit g: ... and it is full attention */
    int64_t followed;               /* the group whose blocks go on: the lowest of full_groups,
                                       else 0 (events without group_idx all go on) */
    bool announced;                 /* blocks went on since the routers last cleared this worker */
    struct kvr_log_gate group_log;  /* kv_group_kind and kv_group_followed lines */
};

/* Start a feed for w, counting into s (both borrowed). */
void kvr__wk_kvfeed_init(struct kvr_wk_kvfeed *f, struct kvr_worker *w,
                         struct kvr_wk_adapter_stats *s);
/* Under mu: one decoded batch (borrowed), received at now (monotonic ns). */
void kvr__wk_kvfeed_batch(struct kvr_wk_kvfeed *f, const struct kvr_kvev_batch *b, uint64_t now);
/* Under mu: the engine's cache is gone (a gap the replay could not fill, a restart, an engine
 * that stopped answering): the routers are told, and the groups' kinds are learnt again (another
 * model may be served now). */
void kvr__wk_kvfeed_cleared(struct kvr_wk_kvfeed *f);
void kvr__wk_kvfeed_free(struct kvr_wk_kvfeed *f);

#endif
