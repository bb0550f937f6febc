/*
 * kvfeed: the engine's KV events made the routers' (kvfeed.h). A Stored block becomes kvrouter's
 * (engine id, hash of its tokens at the worker's block size) when kvrouter's hash can name it:
 * on the GPU, without a LoRA adapter, and without extra_keys (vLLM mixes multimodal ids, the
 * LoRA name, cache_salt and prompt embeddings into a block's hash: a request of the same tokens
 * without them misses that block). Blocks chain: in a Stored run, every block after the first
 * with extra_keys is left out with it, and a later event chained on a block left out names a
 * parent the routers never learnt (they drop it). Under the worker's mutex.
 */
#include <string.h>

#include "kvfeed.h"

#include "clock.h"
#include "grow.h"
#include "kvr/hash.h"
#include "log.h"

#define WARN_EVERY_NS (10 * KVR_NS_PER_S) /* a repeated warning, at most this often */

void kvr__wk_kvfeed_init(struct kvr_wk_kvfeed *f, struct kvr_worker *w,
                         struct kvr_wk_adapter_stats *s)
{
    memset(f, 0, sizeof *f);
    f->w = w;
    f->s = s;
}

void kvr__wk_kvfeed_free(struct kvr_wk_kvfeed *f)
{
    free(f->blk);
    f->blk = NULL;
    f->capblk = 0;
}

void kvr__wk_kvfeed_cleared(struct kvr_wk_kvfeed *f)
{
    kvr__worker_cleared(f->w);
}

/* Whether an event's blocks are ones kvrouter can name: on the GPU, without a LoRA adapter. */
static bool nameable(struct kvr_wk_kvfeed *f, const struct kvr_kvev_event *e)
{
    if (e->medium[0] && strcmp(e->medium, "GPU") && strcmp(e->medium, "gpu")) {
        f->s->kv_skipped_medium += e->nhashes;
        return false;
    }
    if (e->kind == KVR_KVEV_STORED && e->has_lora) {
        f->s->kv_skipped_lora += e->nhashes;
        return false;
    }
    return true;
}

static void stored(struct kvr_wk_kvfeed *f, const struct kvr_kvev_event *e, uint64_t now)
{
    struct kvr_worker *w = f->w;
    uint32_t bs = w->cfg->engine.block_size;
    if (e->block_size != bs || (uint64_t)e->nhashes * bs != e->ntokens) {
        f->s->kv_bad_block_size += e->nhashes;
        if (now - f->warned_block_at >= WARN_EVERY_NS || !f->warned_block_at) {
            f->warned_block_at = now;
            kvr_log(KVR_LOG_ERROR, "kv_block_size_mismatch",
                    "engine_block_size=%u block_size=%u blocks=%u hint=\"start the engine and "
                    "the fleet with one block size\"",
                    e->block_size, bs, e->nhashes);
        }
        return;
    }
    /* the first block with extra_keys, and every one chained after it, is not kvrouter's */
    uint32_t n = e->has_extra && e->nplain < e->nhashes ? e->nplain : e->nhashes;
    f->s->kv_skipped_extra += e->nhashes - n;
    if (n == 0)
        return;
    if (!KVR_GROW(f->blk, f->capblk, n, 64)) {
        w->c.dropped++;
        return;
    }
    for (uint32_t i = 0; i < n; i++)
        f->blk[i] =
            (struct kvr_kv_block){e->hashes[i], kvr_hash_block(e->tokens + (size_t)i * bs, bs)};
    kvr__worker_stored(w, e->has_parent ? &e->parent : NULL, f->blk, n);
    f->s->kv_stored_blocks += n;
}

void kvr__wk_kvfeed_batch(struct kvr_wk_kvfeed *f, const struct kvr_kvev_batch *b, uint64_t now)
{
    for (uint32_t i = 0; i < b->nevents; i++) {
        const struct kvr_kvev_event *e = &b->events[i];
        if (e->kind == KVR_KVEV_CLEARED) {
            kvr__wk_kvfeed_cleared(f);
            f->s->kv_cleared++;
        } else if (!nameable(f, e)) {
            continue;
        } else if (e->kind == KVR_KVEV_STORED) {
            stored(f, e, now);
        } else {
            kvr__worker_removed(f->w, e->hashes, e->nhashes);
            f->s->kv_removed_blocks += e->nhashes;
        }
    }
}
