/*
 * kvfeed: the engine's KV events made the routers' (kvfeed.h). A Stored block becomes kvrouter's
 * (engine id, hash of its tokens at the worker's block size) when kvrouter's hash can name it:
 * on the GPU, without a LoRA adapter, without extra_keys (vLLM mixes multimodal ids, the LoRA
 * name, cache_salt and prompt embeddings into a block's hash: a request of the same tokens
 * without them misses that block) and without SGLang's cache_salt (given once for a whole Stored,
 * whose blocks all sit in the salt's namespace). Blocks chain: in a Stored run, every block after
 * the first with extra_keys is left out with it, and a later event chained on a block left out
 * names a parent the routers never learnt (they drop it).
 *
 * KV cache groups: vLLM serving a hybrid model (full attention beside sliding-window or Mamba
 * layers) announces each group's blocks with its own Stored and Removed of the same hashes
 * (group_idx), and names a group's kind (kv_cache_spec_kind) on its Stored only. A sliding-window
 * group evicts its old blocks early, while the full-attention group still holds the prefix: the
 * feed follows one group, the lowest whose kind is full attention ("full_attention" and vLLM's
 * subclasses of it, "mla_attention", "sink_full_attention"), else group 0 (an engine that names
 * no kind, or a model without full attention). The other groups' blocks are skipped and counted.
 * Kinds are learnt from a whole batch before its events go on (vLLM stores every group of a
 * request in one step), so the first batch of a hybrid model already follows its full-attention
 * group; should the group followed change after blocks went on (a full-attention group named
 * later), the routers clear this worker: the old group's Removed are skipped from then on.
 * Under the worker's mutex.
 */
#include <inttypes.h>
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

/* The routers forget this worker's blocks (nothing announced is left to take back). */
static void routers_cleared(struct kvr_wk_kvfeed *f)
{
    kvr__worker_cleared(f->w);
    f->announced = false;
}

void kvr__wk_kvfeed_cleared(struct kvr_wk_kvfeed *f)
{
    routers_cleared(f);
    f->known_groups = f->full_groups = 0;
    f->followed = 0;
}

static bool on_gpu(const struct kvr_kvev_event *e)
{
    return !e->medium[0] || !strcmp(e->medium, "GPU") || !strcmp(e->medium, "gpu");
}

/* vLLM's FullAttentionSpec and its subclasses (MLAAttentionSpec, SinkFullAttentionSpec) keep
 * every token's KV: a prefix they hold is a prefix the engine can reuse. */
static bool full_attention(const char *kind)
{
    return !strcmp(kind, "full_attention") || !strcmp(kind, "mla_attention") ||
           !strcmp(kind, "sink_full_attention");
}

/* Learn the kind of group g from an event naming it (GPU events only: the view followed). */
static void learn_kind(struct kvr_wk_kvfeed *f, int64_t g, const char *kind)
{
    uint64_t bit = UINT64_C(1) << g;
    bool full = full_attention(kind);
    if ((f->known_groups & bit) && !(f->full_groups & bit) == !full)
        return;
    f->known_groups |= bit;
    f->full_groups = full ? f->full_groups | bit : f->full_groups & ~bit;
    uint64_t left;
    if (!kvr_log_gate_pass(&f->group_log, &left)) /* an engine changing kinds on every event */
        return;
    char safe[2 * KVR_KVEV_SPEC_CAP];
    kvr_log(KVR_LOG_INFO, "kv_group_kind",
            "group=%" PRId64 " kind=\"%s\" full_attention=%s suppressed=%" PRIu64, g,
            kvr_log_safe(safe, sizeof safe, kind), full ? "yes" : "no", left);
}

/* Before a batch's events go on: the kinds it names, then the group to follow, the lowest full
 * attention one (else 0). A change after blocks went on clears this worker in the routers. */
static void follow_groups(struct kvr_wk_kvfeed *f, const struct kvr_kvev_batch *b)
{
    for (uint32_t i = 0; i < b->nevents; i++) {
        const struct kvr_kvev_event *e = &b->events[i];
        if (e->has_group && e->spec_kind[0] && e->group_idx >= 0 &&
            e->group_idx < KVR_WK_KVFEED_GROUPS && on_gpu(e))
            learn_kind(f, e->group_idx, e->spec_kind);
    }
    int64_t g = 0;
    while (g < KVR_WK_KVFEED_GROUPS - 1 && f->full_groups && !(f->full_groups >> g & 1))
        g++;
    if (g == f->followed)
        return;
    uint64_t left;
    if (kvr_log_gate_pass(&f->group_log, &left))
        kvr_log(KVR_LOG_INFO, "kv_group_followed",
                "group=%" PRId64 " was=%" PRId64 " cleared=%s suppressed=%" PRIu64, g, f->followed,
                f->announced ? "yes" : "no", left);
    if (f->announced)
        routers_cleared(f);
    f->followed = g;
}

/* Whether an event's blocks are ones kvrouter can name: on the GPU, of the group followed,
 * without a LoRA adapter, without a cache_salt. */
static bool nameable(struct kvr_wk_kvfeed *f, const struct kvr_kvev_event *e)
{
    if (!on_gpu(e)) {
        f->s->kv_skipped_medium += e->nhashes;
        return false;
    }
    if (e->has_group && e->group_idx != f->followed) {
        f->s->kv_skipped_group += e->nhashes;
        return false;
    }
    if (e->kind == KVR_KVEV_STORED && e->has_lora) {
        f->s->kv_skipped_lora += e->nhashes;
        return false;
    }
    if (e->kind == KVR_KVEV_STORED && e->has_salt) { /* every block of it keyed by the salt */
        f->s->kv_skipped_salt += e->nhashes;
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
    f->announced = true;
}

void kvr__wk_kvfeed_batch(struct kvr_wk_kvfeed *f, const struct kvr_kvev_batch *b, uint64_t now)
{
    follow_groups(f, b);
    for (uint32_t i = 0; i < b->nevents; i++) {
        const struct kvr_kvev_event *e = &b->events[i];
        if (e->kind == KVR_KVEV_CLEARED) { /* the same engine: the groups' kinds hold */
            routers_cleared(f);
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
