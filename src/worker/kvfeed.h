/*
 * kvfeed: the engine's KV events (decoded batches, src/kvevents) made the routers' KvEvents, for
 * the adapter (adapter.c). It decides which blocks kvrouter can name (its hash is of a block's
 * tokens alone: not a LoRA adapter's, not another medium's, not one with extra_keys) and counts
 * the others by why they were left out. Everything runs under the worker's mutex, on the
 * subscriber's thread; the feed holds no lock of its own.
 */
#ifndef KVR_WK_KVFEED_H
#define KVR_WK_KVFEED_H

#include <stdint.h>

#include "kvevents.h"
#include "worker.h"

struct kvr_wk_kvfeed {
    struct kvr_worker *w;           /* borrowed: must outlive the feed */
    struct kvr_wk_adapter_stats *s; /* borrowed: where its figures are counted */
    struct kvr_kv_block *blk;       /* a Stored event's blocks (owned) */
    uint32_t capblk;                /* */
    uint64_t warned_block_at;       /* the last kv_block_size_mismatch (monotonic ns) */
};

/* Start a feed for w, counting into s (both borrowed). */
void kvr__wk_kvfeed_init(struct kvr_wk_kvfeed *f, struct kvr_worker *w,
                         struct kvr_wk_adapter_stats *s);
/* Under mu: one decoded batch (borrowed), received at now (monotonic ns). */
void kvr__wk_kvfeed_batch(struct kvr_wk_kvfeed *f, const struct kvr_kvev_batch *b, uint64_t now);
/* Under mu: the engine's cache is gone (an AllBlocksCleared, a gap the replay could not fill, a
 * restart): the routers are told. */
void kvr__wk_kvfeed_cleared(struct kvr_wk_kvfeed *f);
void kvr__wk_kvfeed_free(struct kvr_wk_kvfeed *f);

#endif
