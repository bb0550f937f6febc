/*
 * kvr_router, the object: its configuration and defaults, create and destroy, the scratch arrays
 * every decision reuses and the counters. Per-worker scratch arrays are sized to the registry's
 * slots and per-prompt ones to the longest prompt seen, so a decision allocates only for new
 * blocks. The pipeline itself is in router_decision.c (router_int.h lists the files). Invariant:
 * nslots < reg.nslots only between a registry growth and the kvr__router_ensure_slots that
 * follows it, or after a join that ran out of memory in it (its slot then holds no live worker),
 * until the next decision grows them. Single-threaded (see include/kvr/router.h).
 */
#include "kvr/router.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "router_int.h"

void kvr_router_set_salt(uint64_t salt)
{
    kvr_map_set_salt(salt);
}

void kvr_router_config_default(struct kvr_router_config *c)
{
    memset(c, 0, sizeof *c);
    c->block_size = 64;
    c->policy = KVR_POLICY_KV;
    c->overlap_weight = 1.0;
    c->temperature = 0.0;
    c->cost_model = KVR_COST_TIME;
    c->cache_weight = 4.0;
    c->share_weight = 16.0;
    c->stall_weight = 0.6;
    c->decode_weight = 0.5;
    c->learn_output = true;
    c->prefill_window_ns = 10ull * 1000000000ull;
    c->engine_speedup = 1.0;
    static const double prefill[3] = KVR_MODEL_PREFILL_MS, decode[3] = KVR_MODEL_DECODE_MS;
    memcpy(c->prefill_ms, prefill, sizeof prefill);
    memcpy(c->decode_ms, decode, sizeof decode);
    c->batch_tokens = KVR_MODEL_BATCH_TOKENS;
    c->seed = 1;
    c->index_ttl_ns = 120ull * 1000000000ull;
    c->index_max_entries = 0; /* from the fleet: docs/architecture.md, "Index sizing" */
    c->index_prune_pct = 80;
    c->index_headroom = 1.25;
    c->index_min_entries = 1u << 20;
    c->index_ceiling = 1u << 24;
    c->index_worker_max = 1u << 22;
    c->index_warn_ns = 60ull * 1000000000ull;
    c->busy_threshold = 0.95;
    c->busy_prefill_tokens = 0;
    c->max_prompt_tokens = 1u << 20;
    c->max_output_tokens = 1u << 16;
    c->max_inflight = 1u << 20;
    c->queue_max = 1024;
    c->queue_timeout_ns = 5ull * 1000000000ull;
    c->request_ttl_ns = 600ull * 1000000000ull;
    c->worker_timeout_ns = 0;
    c->max_workers = 65536;
    c->sglang_balance_abs = 64;
    c->sglang_balance_rel = 1.5;
    c->sglang_cache_threshold = 0.3;
    c->llmd_w_queue = 2.0;
    c->llmd_w_kv = 2.0;
    c->llmd_w_prefix = 3.0;
    c->chwbl_vnodes = 256;
    c->chwbl_load_factor = 1.25;
}

static bool index_config_valid(const struct kvr_router_config *c)
{
    return c->index_max_entries <= KVR_INDEX_MAX_ENTRIES && c->index_headroom >= 1.0 &&
           c->index_headroom <= 64.0 && c->index_min_entries > 0 && c->index_ceiling > 0 &&
           c->index_ceiling <= KVR_INDEX_MAX_ENTRIES;
}

static bool config_valid(const struct kvr_router_config *c)
{
    return c->block_size > 0 && c->block_size <= 65536 && (unsigned)c->policy < KVR_POLICY_COUNT &&
           c->overlap_weight >= 0 && c->cache_weight >= 0 && c->share_weight >= 0 &&
           c->stall_weight >= 0 && c->decode_weight >= 0 && isfinite(c->decode_weight) &&
           (c->prefill_window_ns == 0 || (c->prefill_window_ns >= KVR_PREFILL_WINDOW_MIN_NS &&
                                          c->prefill_window_ns <= KVR_PREFILL_WINDOW_MAX_NS)) &&
           c->engine_speedup >= KVR_ENGINE_SPEEDUP_MIN &&
           c->engine_speedup <= KVR_ENGINE_SPEEDUP_MAX && c->temperature >= 0 &&
           c->batch_tokens > 0 && c->tie_margin >= 0 && c->tie_margin <= 1 &&
           c->busy_threshold >= 0 && c->max_prompt_tokens > 0 && c->max_output_tokens > 0 &&
           c->max_inflight > 0 && c->max_workers > 0 && c->chwbl_load_factor >= 1.0 &&
           index_config_valid(c);
}

struct kvr_router *kvr_router_create(const struct kvr_router_config *cfg, kvr_status *st)
{
    kvr_status s = KVR_OK;
    struct kvr_router *r = NULL;
    if (!cfg || !config_valid(cfg)) {
        s = KVR_ERR_INVALID;
        goto out;
    }
    r = calloc(1, sizeof *r);
    if (!r) {
        s = KVR_ERR_NOMEM;
        goto out;
    }
    r->cfg = *cfg;
    kvr_outlen_init(&r->outlen, cfg->learn_output);
    kvr_pshare_init(&r->psh, cfg->prefill_window_ns, cfg->engine_speedup);
    kvr_select_init(&r->sel, cfg->seed);
    struct kvr_index_config icfg = {cfg->index_ttl_ns, kvr_index_bound(cfg, 0),
                                    cfg->index_prune_pct};
    s = kvr_registry_init(&r->reg, cfg->max_workers);
    if (s == KVR_OK)
        s = kvr_blocktab_init(&r->tab, 1024);
    if (s == KVR_OK)
        s = kvr_index_init(&r->ix, &r->tab, &icfg);
    if (s == KVR_OK)
        s = kvr_active_init(&r->act, &r->tab, cfg->block_size, 256);
    if (s == KVR_OK)
        s = kvr_early_init(&r->early, 65536, 60ull * 1000000000ull);
    if (s == KVR_OK)
        s = kvr_map_init(&r->qids, 16);
    r->qown_min = UINT64_MAX;
    if (s != KVR_OK) {
        kvr_router_destroy(r);
        r = NULL;
    }
out:
    if (st)
        *st = s;
    return r;
}

void kvr_router_destroy(struct kvr_router *r)
{
    if (!r)
        return;
    kvr__router_queue_free(r);
    kvr_map_free(&r->qids);
    kvr_active_free(&r->act);
    kvr_early_free(&r->early);
    kvr_pshare_free(&r->psh);
    free(r->export_hashes);
    kvr_index_free(&r->ix);
    kvr_blocktab_free(&r->tab);
    kvr_select_free(&r->sel);
    kvr_registry_free(&r->reg);
    kvr_walk_free(&r->walk_idx);
    kvr_walk_free(&r->walk_act);
    free(r->overlap);
    free(r->hits);
    free(r->slot_cand);
    free(r->cands);
    free(r->costs);
    free(r->eligible);
    free(r->seq);
    free(r->nodes);
    free(r);
}

void kvr__router_emit(struct kvr_router *r, enum kvr_event_kind kind, uint64_t request_id,
                      uint64_t worker_id, kvr_status status, const struct kvr_decision *d)
{
    if (!r->cfg.on_event)
        return;
    struct kvr_event ev = {kind, request_id, worker_id, status, d};
    r->cfg.on_event(r->cfg.event_ctx, &ev);
}

/*
 * Room for n slots in one per-slot scratch array, which has room for r->nslots like all of them:
 * the capacity is a throwaway copy, since r->nslots is the one count they share.
 */
#define GROW_SLOTS(arr, n)                                                                         \
    kvr_grow((void **)&(arr), &(uint32_t){r->nslots}, (n), sizeof *(arr), (n))

kvr_status kvr__router_ensure_slots(struct kvr_router *r)
{
    uint32_t n = r->reg.nslots;
    if (n <= r->nslots)
        return KVR_OK;
    kvr_status st = kvr_index_reserve(&r->ix, n);
    if (st == KVR_OK)
        st = kvr_active_reserve(&r->act, n);
    if (st == KVR_OK)
        st = kvr_walk_reserve(&r->walk_idx, n);
    if (st == KVR_OK)
        st = kvr_walk_reserve(&r->walk_act, n);
    if (st == KVR_OK)
        st = kvr_pshare_reserve(&r->psh, n);
    if (st != KVR_OK)
        return st;
    if (!GROW_SLOTS(r->overlap, n) || !GROW_SLOTS(r->hits, n) || !GROW_SLOTS(r->slot_cand, n) ||
        !GROW_SLOTS(r->cands, n) || !GROW_SLOTS(r->costs, n) || !GROW_SLOTS(r->eligible, n))
        return KVR_ERR_NOMEM;
    r->nslots = n;
    return KVR_OK;
}

kvr_status kvr__router_ensure_blocks(struct kvr_router *r, uint32_t n)
{
    if (n <= r->cap_blocks) /* every decision asks: the answer is nearly always yes */
        return KVR_OK;
    uint32_t cap_seq = r->cap_blocks, cap_nodes = r->cap_blocks;
    if (!KVR_GROW(r->seq, cap_seq, n, 64) || !KVR_GROW(r->nodes, cap_nodes, n, 64))
        return KVR_ERR_NOMEM;
    assert(cap_seq == cap_nodes); /* the same growth from the same room */
    r->cap_blocks = cap_seq;
    return KVR_OK;
}

uint32_t kvr_router_queue_len(const struct kvr_router *r)
{
    return r->qlen;
}

/* The per-worker figures add up to the totals (a debug check: O(workers)). */
static inline __attribute__((unused)) bool loads_agree(const struct kvr_router *r)
{
    uint64_t reqs = 0;
    for (uint32_t i = 0; i < r->reg.nlive; i++)
        reqs += r->act.w[r->reg.order[i]].nreqs;
    return reqs == kvr_active_count(&r->act) && r->reg.nlive <= r->nslots;
}

void kvr_router_stats(const struct kvr_router *r, struct kvr_router_stats *out)
{
    assert(loads_agree(r));
    *out = r->st;
    out->index = r->ix.cnt;
    out->workers = r->reg.nlive;
    out->inflight = kvr_active_count(&r->act);
    out->queue_len = r->qlen;
    out->index_entries = kvr_index_entries(&r->ix);
    out->index_max = r->ix.cfg.max_entries;
    out->nodes = kvr_blocktab_count(&r->tab);
    out->active_blocks = 0;
    for (uint32_t i = 0; i < r->reg.nlive; i++)
        out->active_blocks += r->act.w[r->reg.order[i]].blocks;
    out->memory_bytes = sizeof *r + kvr_blocktab_bytes(&r->tab) + kvr_index_bytes(&r->ix) +
                        kvr_active_bytes(&r->act) +
                        (size_t)r->nslots * (3 * sizeof(uint32_t) + sizeof(struct kvr_candidate) +
                                             sizeof(uint32_t) + 2 * 8) +
                        (size_t)r->reg.nslots * (sizeof(struct kvr_worker_hot) + sizeof(uint64_t)) +
                        (size_t)r->psh.nslots * sizeof(double) +
                        (size_t)r->cap_blocks * (sizeof(uint64_t) + sizeof(uint32_t));
}

kvr_status kvr_router_worker_load(const struct kvr_router *r, uint64_t worker_id,
                                  uint64_t *active_blocks, uint64_t *prefill_tokens,
                                  uint32_t *inflight)
{
    const struct kvr_worker *w = kvr_registry_find(&r->reg, worker_id);
    if (!w)
        return KVR_ERR_UNKNOWN_WORKER;
    const struct kvr_active_worker *aw = &r->act.w[kvr_registry_slot(&r->reg, w)];
    if (active_blocks)
        *active_blocks = aw->blocks;
    if (prefill_tokens)
        *prefill_tokens = aw->prefill;
    if (inflight)
        *inflight = aw->nreqs;
    return KVR_OK;
}

bool kvr_router_worker_approximate(const struct kvr_router *r, uint64_t worker_id)
{
    const struct kvr_worker *w = kvr_registry_find(&r->reg, worker_id);
    return w && w->approximate;
}

uint32_t kvr_router_workers(const struct kvr_router *r, struct kvr_worker_view *out, uint32_t max)
{
    double scale = kvr_pshare_scale(&r->psh, r->last_now);
    for (uint32_t i = 0; i < r->reg.nlive && i < max; i++) {
        uint32_t slot = r->reg.order[i];
        const struct kvr_worker *w = &r->reg.by_slot[slot];
        const struct kvr_active_worker *aw = &r->act.w[slot];
        out[i] = (struct kvr_worker_view){.id = w->id,
                                          .capacity_blocks = w->capacity_blocks,
                                          .active_blocks = aw->blocks,
                                          .prefill_tokens = aw->prefill,
                                          .inflight = aw->nreqs,
                                          .waiting = w->waiting,
                                          .kv_usage = w->kv_usage,
                                          .prefill_share = r->psh.load[slot] * scale,
                                          .draining = w->draining,
                                          .approximate = w->approximate};
    }
    return r->reg.nlive;
}
