/*
 * kvfeed: the engine's KV events made the routers' (kvfeed.h). A Stored block becomes kvrouter's
 * (engine id, hash of its tokens at the worker's block size) when kvrouter's hash can name it:
 * on the GPU, without a LoRA adapter, and without extra_keys (vLLM mixes multimodal ids, the
 * LoRA name, cache_salt and prompt embeddings into a block's hash: a request of the same tokens
 * without them misses that block). Blocks chain: in a Stored run, every block after the first
 * with extra_keys is left out with it, and a later event chained on a block left out names a
 * parent the routers never learnt (they drop it).
 *
 * Copies: vLLM (block_pool.py) keeps every block that becomes full in its cache, even when a
 * block of the same hash is there already (another request computed the same prefix at the same
 * time), announces each with a BlockStored and each eviction with a BlockRemoved of that hash.
 * The routers' index holds one entry per engine id (a repeated Stored refreshes it), so the
 * first Removed took out a block the engine still held. The feed counts the copies of each block
 * it announced (a Stored adds one, a Removed takes one) and passes a Removed on only for the last
 * copy, or for an id it does not count (never announced, or past the table's bound, as before).
 * The count is forgotten with the cache: an AllBlocksCleared, a reset, a restart. Under the
 * worker's mutex.
 */
#include <stdlib.h>
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
    free(f->gone);
    f->gone = NULL;
    f->capgone = 0;
    kvr_map_free(&f->copies);
    memset(&f->copies, 0, sizeof f->copies);
}

void kvr__wk_kvfeed_cleared(struct kvr_wk_kvfeed *f)
{
    kvr_map_free(&f->copies); /* its memory too: a table emptied keeps its size */
    memset(&f->copies, 0, sizeof f->copies);
    kvr__worker_cleared(f->w);
}

/* One more copy of an announced block; an id past the bound, or without memory, is not counted
 * (its first Removed goes on, as if it had one copy). */
static void copy_stored(struct kvr_wk_kvfeed *f, uint64_t id)
{
    if (!f->copies.groups && kvr_map_init(&f->copies, 64) != KVR_OK) {
        f->s->kv_copies_untracked++;
        return;
    }
    bool created = false;
    uint32_t *v = kvr_map_upsert(&f->copies, id, &created);
    if (!v) {
        f->s->kv_copies_untracked++;
    } else if (!created) {
        *v += *v < KVR_NIL - 1; /* an engine storing one hash 4 billion times stays counted */
    } else if (f->copies.count > KVR_WK_KV_COPIES_MAX) {
        kvr_map_del(&f->copies, id);
        f->s->kv_copies_untracked++;
    } else {
        *v = 1;
    }
}

/* A Removed: the ids whose last copy went (or that are not counted) go on to the routers. */
static void removed(struct kvr_wk_kvfeed *f, const struct kvr_kvev_event *e)
{
    if (!KVR_GROW(f->gone, f->capgone, e->nhashes, 64)) {
        f->w->c.dropped++;
        return;
    }
    uint32_t n = 0;
    for (uint32_t i = 0; i < e->nhashes; i++) {
        uint64_t id = e->hashes[i];
        uint32_t c = f->copies.groups ? kvr_map_get(&f->copies, id) : KVR_NIL;
        if (c != KVR_NIL && c > 1) {
            kvr_map_put(&f->copies, id, c - 1); /* found in place: cannot fail */
            f->s->kv_removed_copies++;
            continue;
        }
        if (c != KVR_NIL)
            kvr_map_del(&f->copies, id);
        f->gone[n++] = id;
    }
    if (n || !e->nhashes)
        kvr__worker_removed(f->w, f->gone, n);
    f->s->kv_removed_blocks += n;
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
    for (uint32_t i = 0; i < n; i++) {
        f->blk[i] =
            (struct kvr_kv_block){e->hashes[i], kvr_hash_block(e->tokens + (size_t)i * bs, bs)};
        copy_stored(f, e->hashes[i]);
    }
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
            removed(f, e);
        }
    }
}
