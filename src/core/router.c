/*
 * kvr_router: the decision pipeline over the registry, the shared block table, the prefix index,
 * the active-block map and the policies. A decision is one call: hash, one walk over the prompt's
 * path for every worker's overlap and in-flight prefix, candidates with their kv cost, busy
 * exclusion, selection, booking. Per-worker scratch arrays are sized to the registry's slots and
 * per-prompt ones to the longest prompt seen, so a decision allocates only for new blocks.
 * Single-threaded (see include/kvr/router.h).
 */
#include "kvr/router.h"

#include <stdlib.h>
#include <string.h>

#include "active.h"
#include "blocktab.h"
#include "early.h"
#include "index.h"
#include "kvr/hash.h"
#include "registry.h"
#include "select.h"

#define BOOK_PREFETCH 12u /* blocks looked ahead when resolving a prompt's nodes */

struct queued {
    uint64_t id;             /* request id */
    uint64_t deadline;       /* ns after which it is rejected */
    uint64_t first_hash;     /* chwbl key */
    uint64_t *seq;           /* its sequence hashes, owned */
    uint32_t nblocks;        /* */
    uint32_t ntokens;        /* */
    struct kvr_overrides ov; /* */
    struct queued *next;     /* FIFO */
};

/* One prompt on its way through decide(). */
struct prompt {
    uint64_t id;
    const uint64_t *seq;
    uint32_t nblocks;
    uint32_t ntokens;
    uint64_t first_hash;
    const struct kvr_overrides *ov;
    bool explain;
};

struct kvr_router {
    struct kvr_router_config cfg;
    struct kvr_registry reg;
    struct kvr_blocktab tab;
    struct kvr_index ix;
    struct kvr_active act;
    struct kvr_select_state sel;
    struct kvr_early early;  /* events that came before their decision */
    uint64_t *export_hashes; /* scratch for kvr_router_export */
    uint32_t cap_export;     /* */
    struct kvr_walk walk_idx;
    struct kvr_walk walk_act;
    bool ring_dirty;             /* the chwbl ring misses a membership change */
    uint32_t nslots;             /* room in the per-slot scratch arrays */
    uint32_t *overlap;           /* per slot: cached prefix blocks of the current prompt */
    uint32_t *hits;              /* per slot: in-flight prefix blocks of the current prompt */
    uint32_t *slot_cand;         /* per slot: position in eligible, or KVR_NIL */
    struct kvr_candidate *cands; /* per live worker, registry order: the full view */
    double *costs;               /* per live worker: kv cost */
    uint64_t *cand_ids;          /* per live worker: id */
    uint32_t *cand_slot;         /* per live worker: slot */
    uint32_t *eligible;          /* candidates that are not busy */
    uint32_t cap_blocks;         /* room in seq and nodes */
    uint64_t *seq;               /* the current prompt's sequence hashes */
    uint32_t *nodes;             /* the current prompt's block table nodes */
    struct queued *qhead;        /* requests waiting for a worker that is not busy */
    struct queued *qtail;        /* */
    uint32_t qlen;               /* */
    struct kvr_router_stats st;  /* counters (gauges are filled in by kvr_router_stats) */
    uint64_t last_now;           /* the latest time a call brought (for calls without one) */
};

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
    static const double prefill[3] = KVR_MODEL_PREFILL_MS, decode[3] = KVR_MODEL_DECODE_MS;
    memcpy(c->prefill_ms, prefill, sizeof prefill);
    memcpy(c->decode_ms, decode, sizeof decode);
    c->batch_tokens = 8192;
    c->seed = 1;
    c->index_ttl_ns = 120ull * 1000000000ull;
    c->index_max_entries = 1u << 20;
    c->index_prune_pct = 80;
    c->busy_threshold = 0.95;
    c->busy_prefill_tokens = 0;
    c->max_prompt_tokens = 1u << 20;
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

static bool config_valid(const struct kvr_router_config *c)
{
    return c->block_size > 0 && c->block_size <= 65536 && (unsigned)c->policy < KVR_POLICY_COUNT &&
           c->overlap_weight >= 0 && c->cache_weight >= 0 && c->share_weight >= 0 &&
           c->temperature >= 0 && c->batch_tokens > 0 && c->busy_threshold >= 0 &&
           c->max_prompt_tokens > 0 && c->max_inflight > 0 && c->max_workers > 0 &&
           c->index_max_entries > 0 && c->chwbl_load_factor >= 1.0;
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
    kvr_select_init(&r->sel, cfg->seed);
    struct kvr_index_config icfg = {cfg->index_ttl_ns, cfg->index_max_entries,
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
    if (s != KVR_OK) {
        kvr_router_destroy(r);
        r = NULL;
    }
out:
    if (st)
        *st = s;
    return r;
}

static void free_queued(struct queued *q)
{
    free(q->seq);
    free(q);
}

void kvr_router_destroy(struct kvr_router *r)
{
    if (!r)
        return;
    while (r->qhead) {
        struct queued *q = r->qhead;
        r->qhead = q->next;
        free_queued(q);
    }
    kvr_active_free(&r->act);
    kvr_early_free(&r->early);
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
    free(r->cand_ids);
    free(r->cand_slot);
    free(r->eligible);
    free(r->seq);
    free(r->nodes);
    free(r);
}

static void emit(struct kvr_router *r, enum kvr_event_kind kind, uint64_t request_id,
                 uint64_t worker_id, kvr_status status, const struct kvr_decision *d)
{
    if (!r->cfg.on_event)
        return;
    struct kvr_event ev = {kind, request_id, worker_id, status, d};
    r->cfg.on_event(r->cfg.event_ctx, &ev);
}

static kvr_status grow_array(void **p, size_t n, size_t size)
{
    void *np = realloc(*p, n * size);
    if (!np)
        return KVR_ERR_NOMEM;
    *p = np;
    return KVR_OK;
}

/* Size every per-slot structure for the registry's slots. */
static kvr_status ensure_slots(struct kvr_router *r)
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
        st = grow_array((void **)&r->overlap, n, sizeof *r->overlap);
    if (st == KVR_OK)
        st = grow_array((void **)&r->hits, n, sizeof *r->hits);
    if (st == KVR_OK)
        st = grow_array((void **)&r->slot_cand, n, sizeof *r->slot_cand);
    if (st == KVR_OK)
        st = grow_array((void **)&r->cands, n, sizeof *r->cands);
    if (st == KVR_OK)
        st = grow_array((void **)&r->costs, n, sizeof *r->costs);
    if (st == KVR_OK)
        st = grow_array((void **)&r->cand_ids, n, sizeof *r->cand_ids);
    if (st == KVR_OK)
        st = grow_array((void **)&r->cand_slot, n, sizeof *r->cand_slot);
    if (st == KVR_OK)
        st = grow_array((void **)&r->eligible, n, sizeof *r->eligible);
    if (st == KVR_OK)
        r->nslots = n;
    return st;
}

static kvr_status ensure_blocks(struct kvr_router *r, uint32_t n)
{
    if (n <= r->cap_blocks)
        return KVR_OK;
    uint32_t cap = r->cap_blocks ? r->cap_blocks : 64;
    while (cap < n)
        cap *= 2;
    kvr_status st = grow_array((void **)&r->seq, cap, sizeof *r->seq);
    if (st == KVR_OK)
        st = grow_array((void **)&r->nodes, cap, sizeof *r->nodes);
    if (st == KVR_OK)
        r->cap_blocks = cap;
    return st;
}

static bool worker_busy(const struct kvr_router *r, uint32_t slot)
{
    const struct kvr_worker *w = &r->reg.by_slot[slot];
    const struct kvr_active_worker *aw = &r->act.w[slot];
    if (w->draining)
        return true;
    if (r->cfg.busy_threshold > 0 && w->capacity_blocks &&
        (double)aw->blocks > r->cfg.busy_threshold * (double)w->capacity_blocks)
        return true;
    return r->cfg.busy_prefill_tokens && aw->prefill > r->cfg.busy_prefill_tokens;
}

/*
 * Score every live worker: its kv cost if the request went there, and whether it is busy. This
 * loop is the O(workers) part of every decision, so it reads only compact per-slot arrays and
 * writes three. Returns how many workers are eligible (not busy); they are listed in r->eligible.
 */
static double poly(const double *c, double x)
{
    return c[0] + c[1] * x + c[2] * x * x;
}

/*
 * Predicted time to first token on a worker, ms: its queued prefill and ours go through steps of
 * batch_tokens, each also running the worker's decodes at its KV utilisation u.
 */
static double predicted_ttft(const struct kvr_router_config *c, uint64_t prefill, double u,
                             bool decoding)
{
    double ms;
    uint64_t steps = 1;
    if (prefill <= c->batch_tokens) { /* the common case: one step */
        ms = poly(c->prefill_ms, (double)prefill);
    } else {
        steps = (prefill + c->batch_tokens - 1) / c->batch_tokens;
        double last = (double)(prefill - (steps - 1) * c->batch_tokens);
        ms = (double)(steps - 1) * poly(c->prefill_ms, c->batch_tokens) + poly(c->prefill_ms, last);
    }
    if (decoding) {
        double d = poly(c->decode_ms, u);
        ms += (double)steps * (d < 1.0 ? 1.0 : d);
    }
    return ms;
}

/* What the time model needs to know about the prompt's prefix across the fleet. */
struct fleet_prefix {
    uint32_t omax;  /* the longest prefix any worker caches, blocks */
    uint32_t hmax;  /* the longest prefix any in-flight request uses, blocks */
    double share_w; /* weight of recomputing blocks in flight but cached nowhere */
};

static void fleet_prefix(const struct kvr_router *r, uint32_t walked, struct fleet_prefix *f)
{
    f->omax = f->hmax = 0;
    f->share_w = 0;
    for (uint32_t i = 0; i < r->reg.nlive; i++) {
        uint32_t slot = r->reg.order[i];
        f->omax = r->overlap[slot] > f->omax ? r->overlap[slot] : f->omax;
        f->hmax = r->hits[slot] > f->hmax ? r->hits[slot] : f->hmax;
    }
    if (f->hmax <= f->omax || f->hmax > walked)
        return;
    /* n requests in flight compute a prefix no cache holds yet (a burst of agents sharing a
     * prompt): the third and later ones should join them rather than compute it again */
    uint32_t n = 0, slot, refs;
    struct kvr_hset_iter it;
    kvr_hset_iter_init(&it, &kvr_blocktab_node(&r->tab, r->nodes[f->hmax - 1])->act);
    while (kvr_hset_next(&it, &slot, &refs))
        n += refs;
    f->share_w = n > 2 ? r->cfg.share_weight * (double)(n - 2) / n : 0;
}

/*
 * The time model's price of worker slot: predicted TTFT, plus what recomputing costs others. The
 * prefill this request adds evicts as many blocks from a full cache, so it is charged again,
 * cache_w times, in proportion to how full the worker's cache is; and blocks that in-flight
 * requests are computing right now are charged share_w times.
 */
static double time_cost(const struct kvr_router *r, uint32_t slot, uint32_t reuse, uint64_t prefill,
                        uint64_t decode, double cache_w, const struct fleet_prefix *f)
{
    const struct kvr_router_config *c = &r->cfg;
    const struct kvr_active_worker *aw = &r->act.w[slot];
    double inv = r->reg.by_slot[slot].inv_capacity; /* 0 when the capacity is unknown */
    double u = (double)decode * inv;
    double fill = inv > 0 ? (double)r->ix.counts[slot] * inv : 1.0;
    double own = (double)(prefill - aw->prefill);
    double cost =
        predicted_ttft(c, prefill, u, aw->nreqs > 0) +
        cache_w * (fill > 1.0 ? 1.0 : fill) * (poly(c->prefill_ms, own) - c->prefill_ms[0]);
    uint32_t base = reuse > f->omax ? reuse : f->omax;
    if (f->share_w > 0 && f->hmax > base) {
        double dup = (double)(f->hmax - base) * r->cfg.block_size;
        cost += f->share_w * (poly(c->prefill_ms, dup) - c->prefill_ms[0]);
    }
    return cost;
}

static uint32_t score_workers(struct kvr_router *r, const struct prompt *p, double ow,
                              uint32_t walked)
{
    uint32_t B = r->cfg.block_size;
    uint64_t req_blocks = p->nblocks + (p->ntokens % B ? 1 : 0);
    bool timed = r->cfg.cost_model == KVR_COST_TIME;
    struct fleet_prefix f = {0, 0, 0};
    if (timed)
        fleet_prefix(r, walked, &f);
    uint32_t neligible = 0;
    for (uint32_t i = 0; i < r->reg.nlive; i++) {
        uint32_t slot = r->reg.order[i];
        const struct kvr_active_worker *aw = &r->act.w[slot];
        uint32_t reuse = r->overlap[slot];
        if (timed && r->hits[slot] > reuse)
            reuse = r->hits[slot]; /* an in-flight request there computes them first */
        uint64_t cached = (uint64_t)reuse * B;
        uint64_t prefill = aw->prefill + (cached < p->ntokens ? p->ntokens - cached : 0);
        uint64_t decode = aw->blocks + req_blocks - r->hits[slot];
        r->costs[i] = timed
                          ? time_cost(r, slot, reuse, prefill, decode, ow * r->cfg.cache_weight, &f)
                          : ow / B * (double)prefill + (double)decode;
        r->cand_ids[i] = r->reg.by_slot[slot].id;
        r->cand_slot[i] = slot;
        r->eligible[neligible] = i;
        neligible += !worker_busy(r, slot);
    }
    return neligible;
}

/* The full view of every live worker, for explanations and the baseline policies. */
static void fill_candidates(struct kvr_router *r, const struct prompt *p)
{
    uint32_t B = r->cfg.block_size;
    uint64_t req_blocks = p->nblocks + (p->ntokens % B ? 1 : 0);
    for (uint32_t i = 0; i < r->reg.nlive; i++) {
        uint32_t slot = r->cand_slot[i];
        const struct kvr_worker *w = &r->reg.by_slot[slot];
        const struct kvr_active_worker *aw = &r->act.w[slot];
        struct kvr_candidate *c = &r->cands[i];
        uint64_t cached = (uint64_t)r->overlap[slot] * B;
        c->worker_id = w->id;
        c->overlap_blocks = r->overlap[slot];
        c->active_hits = r->hits[slot];
        c->decode_blocks = aw->blocks + req_blocks - r->hits[slot];
        c->prefill_tokens = aw->prefill + (cached < p->ntokens ? p->ntokens - cached : 0);
        c->inflight = aw->nreqs;
        c->cached_blocks = kvr_index_worker_blocks(&r->ix, slot);
        c->waiting = w->waiting;
        c->kv_usage = w->kv_usage;
        c->cost = r->costs[i];
        c->busy = worker_busy(r, slot);
    }
}

static kvr_status refresh_ring(struct kvr_router *r)
{
    if (!r->ring_dirty)
        return KVR_OK;
    uint64_t *ids = malloc(((size_t)r->reg.nlive + 1) * sizeof *ids);
    if (!ids)
        return KVR_ERR_NOMEM;
    for (uint32_t i = 0; i < r->reg.nlive; i++)
        ids[i] = r->reg.by_slot[r->reg.order[i]].id;
    kvr_status st = kvr_select_ring(&r->sel, ids, r->reg.order, r->reg.nlive, r->cfg.chwbl_vnodes);
    free(ids);
    if (st == KVR_OK)
        r->ring_dirty = false;
    return st;
}

/* Resolve the nodes of seq[from..n) into nodes (creating them) and book the request. */
static kvr_status book(struct kvr_router *r, uint64_t id, uint32_t slot, const uint64_t *seq,
                       uint32_t *nodes, uint32_t from, uint32_t n, uint32_t ntokens,
                       uint32_t overlap, uint64_t now)
{
    kvr_status st = KVR_OK;
    uint32_t d = from;
    for (uint32_t k = from; k < n && k < from + BOOK_PREFETCH; k++)
        kvr_map_prefetch(&r->tab.map, seq[k]);
    for (; d < n; d++) {
        if (d + BOOK_PREFETCH < n)
            kvr_map_prefetch(&r->tab.map, seq[d + BOOK_PREFETCH]);
        st = kvr_blocktab_get(&r->tab, seq[d], &nodes[d]);
        if (st != KVR_OK)
            break;
    }
    if (st == KVR_OK)
        st = kvr_active_add(&r->act, id, slot, nodes, n, ntokens, overlap, now);
    if (st != KVR_OK) {
        for (uint32_t k = from; k < d; k++) /* nodes this call resolved; frees only empty ones */
            kvr_blocktab_release(&r->tab, nodes[k]);
        return st;
    }
    if (r->cfg.approximate)
        kvr_index_touch(&r->ix, slot, nodes, n, now); /* best effort: a miss costs only a hit */
    return KVR_OK;
}

/*
 * The decision itself. With do_book, the chosen worker is booked. KVR_ERR_OVERLOADED when every
 * worker is busy; KVR_ERR_NO_WORKERS when there is none.
 */
static kvr_status decide(struct kvr_router *r, const struct prompt *p, uint64_t now, bool do_book,
                         struct kvr_decision *out)
{
    if (r->reg.nlive == 0)
        return KVR_ERR_NO_WORKERS;
    kvr_status st = ensure_blocks(r, p->nblocks);
    if (st != KVR_OK)
        return st;
    const struct kvr_overrides *ov = p->ov;
    enum kvr_policy policy = ov && (ov->flags & KVR_OV_POLICY) ? ov->policy : r->cfg.policy;
    double ow =
        ov && (ov->flags & KVR_OV_OVERLAP_WEIGHT) ? ov->overlap_weight : r->cfg.overlap_weight;
    double temp = ov && (ov->flags & KVR_OV_TEMPERATURE) ? ov->temperature : r->cfg.temperature;

    memset(r->overlap, 0, (size_t)r->nslots * sizeof *r->overlap);
    memset(r->hits, 0, (size_t)r->nslots * sizeof *r->hits);
    uint32_t walked = kvr_blocktab_walk(&r->tab, p->seq, p->nblocks, &r->walk_idx, r->overlap,
                                        &r->walk_act, r->hits, r->nodes);
    uint32_t neligible = score_workers(r, p, ow, walked);
    if (neligible == 0)
        return KVR_ERR_OVERLOADED;
    bool full = p->explain || policy != KVR_POLICY_KV;
    if (full)
        fill_candidates(r, p);

    uint32_t pick;
    if (policy == KVR_POLICY_KV) {
        pick = kvr_select_kv(&r->sel, temp, r->costs, r->cand_slot, r->ix.counts, r->eligible,
                             neligible);
    } else {
        struct kvr_select_input in = {policy, p->nblocks, p->first_hash, NULL, r->cand_slot};
        if (policy == KVR_POLICY_CHWBL && refresh_ring(r) == KVR_OK) {
            for (uint32_t i = 0; i < r->nslots; i++)
                r->slot_cand[i] = KVR_NIL;
            for (uint32_t e = 0; e < neligible; e++)
                r->slot_cand[r->cand_slot[r->eligible[e]]] = e;
            in.slot_cand = r->slot_cand;
        }
        pick = kvr_select(&r->sel, &r->cfg, &in, r->cands, r->eligible, neligible);
    }
    pick = r->eligible[pick];
    uint32_t slot = r->cand_slot[pick];
    if (do_book) {
        st = book(r, p->id, slot, p->seq, r->nodes, walked, p->nblocks, p->ntokens,
                  r->overlap[slot], now);
        if (st != KVR_OK)
            return st;
    }
    out->request_id = p->id;
    out->worker_id = r->cand_ids[pick];
    out->policy = policy;
    out->overlap_blocks = r->overlap[slot];
    out->prompt_blocks = p->nblocks;
    out->prompt_tokens = p->ntokens;
    out->cost = r->costs[pick];
    out->block_hashes = p->seq;
    out->ncandidates = r->reg.nlive;
    out->worker_ids = r->cand_ids;
    out->costs = r->costs;
    out->candidates = full ? r->cands : NULL;
    out->booked = do_book;
    return KVR_OK;
}

static bool queued_id(const struct kvr_router *r, uint64_t id)
{
    for (const struct queued *q = r->qhead; q; q = q->next)
        if (q->id == id)
            return true;
    return false;
}

/* Place or reject waiting requests, oldest first, until one finds every worker busy. */
static void drain_queue(struct kvr_router *r, uint64_t now)
{
    while (r->qhead) {
        struct queued *q = r->qhead;
        struct kvr_overrides ov = q->ov;
        struct prompt p = {q->id, q->seq, q->nblocks, q->ntokens, q->first_hash, &ov, false};
        struct kvr_decision d;
        kvr_status st = KVR_ERR_OVERLOADED;
        if (q->deadline > now && kvr_active_count(&r->act) < r->cfg.max_inflight)
            st = decide(r, &p, now, true, &d);
        if (st == KVR_ERR_OVERLOADED || st == KVR_ERR_NO_WORKERS) {
            if (q->deadline > now)
                return;
            r->st.rejected++;
            r->st.overloaded += st == KVR_ERR_OVERLOADED;
        }
        r->qhead = q->next;
        if (!r->qhead)
            r->qtail = NULL;
        r->qlen--;
        if (st == KVR_OK) {
            r->st.decisions++;
            emit(r, KVR_EV_PLACED, q->id, d.worker_id, KVR_OK, &d);
        } else {
            emit(r, KVR_EV_REJECTED, q->id, 0, st, NULL);
        }
        free_queued(q);
    }
}

static kvr_status enqueue(struct kvr_router *r, const struct prompt *p, uint64_t now)
{
    if (r->qlen >= r->cfg.queue_max)
        return KVR_ERR_OVERLOADED;
    struct queued *q = calloc(1, sizeof *q);
    if (!q)
        return KVR_ERR_NOMEM;
    if (p->nblocks) {
        q->seq = malloc((size_t)p->nblocks * sizeof *q->seq);
        if (!q->seq) {
            free(q);
            return KVR_ERR_NOMEM;
        }
        memcpy(q->seq, p->seq, (size_t)p->nblocks * sizeof *q->seq);
    }
    q->id = p->id;
    q->deadline = now + r->cfg.queue_timeout_ns;
    q->first_hash = p->first_hash;
    q->nblocks = p->nblocks;
    q->ntokens = p->ntokens;
    if (p->ov)
        q->ov = *p->ov;
    if (r->qtail)
        r->qtail->next = q;
    else
        r->qhead = q;
    r->qtail = q;
    r->qlen++;
    r->st.queued++;
    return KVR_OK;
}

static kvr_status check_request(struct kvr_router *r, const struct kvr_request *req)
{
    if (!req || req->id == 0 || (req->ntokens && !req->tokens))
        return KVR_ERR_INVALID;
    if (req->ntokens == 0)
        return KVR_ERR_EMPTY_PROMPT;
    if (req->ntokens > r->cfg.max_prompt_tokens)
        return KVR_ERR_PROMPT_TOO_LONG;
    if ((req->ov.flags & KVR_OV_POLICY) && (unsigned)req->ov.policy >= KVR_POLICY_COUNT)
        return KVR_ERR_UNKNOWN_POLICY;
    if (((req->ov.flags & KVR_OV_OVERLAP_WEIGHT) && !(req->ov.overlap_weight >= 0)) ||
        ((req->ov.flags & KVR_OV_TEMPERATURE) && !(req->ov.temperature >= 0)))
        return KVR_ERR_INVALID;
    return KVR_OK;
}

/* Validate and hash req into r->seq; fills *p. */
static kvr_status prepare(struct kvr_router *r, const struct kvr_request *req, struct prompt *p)
{
    kvr_status st = check_request(r, req);
    if (st != KVR_OK)
        return st;
    uint32_t nblocks = req->ntokens / r->cfg.block_size;
    st = ensure_blocks(r, nblocks);
    if (st != KVR_OK)
        return st;
    kvr_hash_prompt(req->tokens, req->ntokens, r->cfg.block_size, NULL, r->seq);
    p->id = req->id;
    p->seq = r->seq;
    p->nblocks = nblocks;
    p->ntokens = req->ntokens;
    p->first_hash = nblocks ? r->seq[0] : kvr_hash_bytes(req->tokens, req->ntokens * 4ull);
    p->ov = &req->ov;
    p->explain = req->explain;
    return KVR_OK;
}

static kvr_status refuse(struct kvr_router *r, kvr_status st)
{
    r->st.rejected++;
    r->st.overloaded += st == KVR_ERR_OVERLOADED;
    r->st.duplicate_request += st == KVR_ERR_DUPLICATE;
    return st;
}

kvr_status kvr_router_route(struct kvr_router *r, const struct kvr_request *req, uint64_t now,
                            struct kvr_decision *out)
{
    if (r->qhead)
        drain_queue(r, now);
    struct prompt p;
    kvr_status st = prepare(r, req, &p);
    if (st != KVR_OK)
        return refuse(r, st);
    if (kvr_active_find(&r->act, req->id) || queued_id(r, req->id))
        return refuse(r, KVR_ERR_DUPLICATE);
    if (r->reg.nlive == 0)
        return refuse(r, KVR_ERR_NO_WORKERS);
    if (r->qhead) /* others are waiting already: keep their order */
        st = KVR_ERR_OVERLOADED;
    else if (kvr_active_count(&r->act) >= r->cfg.max_inflight)
        st = KVR_ERR_OVERLOADED;
    else
        st = decide(r, &p, now, true, out);
    if (st == KVR_ERR_OVERLOADED && r->cfg.queue_max) {
        st = enqueue(r, &p, now);
        if (st == KVR_OK) {
            memset(out, 0, sizeof *out);
            out->request_id = req->id;
            out->queued = true;
            return KVR_OK;
        }
    }
    if (st != KVR_OK)
        return refuse(r, st);
    out->queued = false;
    r->st.decisions++;
    return KVR_OK;
}

kvr_status kvr_router_select(struct kvr_router *r, const struct kvr_request *req, uint64_t now,
                             struct kvr_decision *out)
{
    struct prompt p;
    kvr_status st = prepare(r, req, &p);
    if (st == KVR_OK)
        st = decide(r, &p, now, false, out);
    if (st != KVR_OK)
        return refuse(r, st);
    r->st.selects++;
    return KVR_OK;
}

static kvr_status request_event(struct kvr_router *r, kvr_status st)
{
    if (st == KVR_ERR_UNKNOWN_REQUEST)
        r->st.unknown_request++;
    return st;
}

/* An event for a request this router has not booked (yet): keep it for its decision. */
static kvr_status early_event(struct kvr_router *r, kvr_status st, uint64_t request_id,
                              enum kvr_early_kind kind, uint64_t now)
{
    if (st == KVR_ERR_UNKNOWN_REQUEST && request_id) {
        kvr_early_note(&r->early, request_id, kind, now);
        r->st.early_events++;
    }
    return request_event(r, st);
}

kvr_status kvr_router_prefill_done(struct kvr_router *r, uint64_t request_id, uint64_t now)
{
    return early_event(r, kvr_active_prefill_done(&r->act, request_id, now), request_id,
                       KVR_EARLY_PREFILL, now);
}

kvr_status kvr_router_output_block(struct kvr_router *r, uint64_t request_id, uint64_t now)
{
    return early_event(r, kvr_active_output_block(&r->act, request_id, now), request_id,
                       KVR_EARLY_OUTBLOCK, now);
}

kvr_status kvr_router_done_at(struct kvr_router *r, uint64_t request_id, uint64_t now)
{
    return early_event(r, kvr_active_remove(&r->act, request_id), request_id, KVR_EARLY_DONE, now);
}

kvr_status kvr_router_done(struct kvr_router *r, uint64_t request_id)
{
    return kvr_router_done_at(r, request_id, r->last_now);
}

kvr_status kvr_router_worker_seen(struct kvr_router *r, const struct kvr_worker_info *info,
                                  uint64_t now)
{
    if (!info || info->id == 0)
        return KVR_ERR_INVALID;
    if (info->block_size != r->cfg.block_size) {
        r->st.bad_block_size++;
        return KVR_ERR_BLOCK_SIZE;
    }
    struct kvr_worker *w = kvr_registry_find(&r->reg, info->id);
    if (!w) {
        uint32_t slot;
        kvr_status st = kvr_registry_add(&r->reg, info->id, &slot);
        if (st != KVR_OK)
            return st;
        st = ensure_slots(r);
        if (st != KVR_OK) {
            kvr_registry_remove(&r->reg, slot);
            return st;
        }
        w = &r->reg.by_slot[slot];
        w->block_size = info->block_size;
        r->ring_dirty = true;
        r->st.workers_joined++;
    }
    w->capacity_blocks = info->capacity_blocks;
    w->inv_capacity = info->capacity_blocks ? 1.0 / (double)info->capacity_blocks : 0.0;
    w->waiting = info->waiting;
    w->kv_usage = info->kv_usage;
    w->timeout_ns = info->timeout_ns;
    w->draining = info->draining;
    if (now > w->last_seen)
        w->last_seen = now;
    return KVR_OK;
}

struct fail_ctx {
    struct kvr_router *r;
    uint64_t worker_id;
    enum kvr_event_kind kind;
    kvr_status status; /* what the client is told */
};

static void on_drop(void *ctx, uint64_t request_id, uint32_t slot)
{
    struct fail_ctx *f = ctx;
    uint64_t wid = f->worker_id;
    if (!wid && slot < f->r->reg.nslots)
        wid = f->r->reg.by_slot[slot].id;
    if (f->kind == KVR_EV_FAILED)
        f->r->st.failed_requests++;
    else
        f->r->st.expired_requests++;
    emit(f->r, f->kind, request_id, wid, f->status, NULL);
}

static void remove_worker(struct kvr_router *r, uint32_t slot)
{
    uint64_t id = r->reg.by_slot[slot].id;
    struct fail_ctx f = {r, id, KVR_EV_FAILED, KVR_ERR_WORKER_LOST};
    kvr_index_clear_worker(&r->ix, slot);
    kvr_active_drop_worker(&r->act, slot, on_drop, &f);
    kvr_registry_remove(&r->reg, slot);
    r->ring_dirty = true;
    r->st.workers_left++;
    emit(r, KVR_EV_WORKER_LEFT, 0, id, KVR_ERR_WORKER_LOST, NULL);
}

kvr_status kvr_router_worker_remove(struct kvr_router *r, uint64_t worker_id)
{
    struct kvr_worker *w = kvr_registry_find(&r->reg, worker_id);
    if (!w) {
        r->st.unknown_worker++;
        return KVR_ERR_UNKNOWN_WORKER;
    }
    remove_worker(r, kvr_registry_slot(&r->reg, w));
    return KVR_OK;
}

static struct kvr_worker *event_worker(struct kvr_router *r, uint64_t worker_id)
{
    struct kvr_worker *w = kvr_registry_find(&r->reg, worker_id);
    if (!w)
        r->st.unknown_worker++;
    return w;
}

kvr_status kvr_router_kv_stored(struct kvr_router *r, uint64_t worker_id, const uint64_t *parent,
                                const struct kvr_kv_block *blocks, size_t n)
{
    struct kvr_worker *w = event_worker(r, worker_id);
    return w ? kvr_index_stored(&r->ix, kvr_registry_slot(&r->reg, w), parent, blocks, n)
             : KVR_ERR_UNKNOWN_WORKER;
}

kvr_status kvr_router_kv_removed(struct kvr_router *r, uint64_t worker_id,
                                 const uint64_t *engine_ids, size_t n)
{
    struct kvr_worker *w = event_worker(r, worker_id);
    return w ? kvr_index_removed(&r->ix, kvr_registry_slot(&r->reg, w), engine_ids, n)
             : KVR_ERR_UNKNOWN_WORKER;
}

kvr_status kvr_router_kv_cleared(struct kvr_router *r, uint64_t worker_id)
{
    struct kvr_worker *w = event_worker(r, worker_id);
    if (!w)
        return KVR_ERR_UNKNOWN_WORKER;
    kvr_index_clear_worker(&r->ix, kvr_registry_slot(&r->reg, w));
    return KVR_OK;
}

void kvr_router_tick(struct kvr_router *r, uint64_t now)
{
    r->last_now = now;
    kvr_index_expire(&r->ix, now);
    kvr_early_expire(&r->early, now);
    if (r->cfg.request_ttl_ns && now >= r->cfg.request_ttl_ns) {
        struct fail_ctx f = {r, 0, KVR_EV_EXPIRED, KVR_ERR_TIMEOUT};
        kvr_active_expire(&r->act, now - r->cfg.request_ttl_ns, on_drop, &f);
    }
    for (uint32_t i = 0; i < r->reg.nlive;) {
        uint32_t slot = r->reg.order[i];
        const struct kvr_worker *w = &r->reg.by_slot[slot];
        uint64_t timeout = w->timeout_ns ? w->timeout_ns : r->cfg.worker_timeout_ns;
        if (timeout && w->last_seen + timeout <= now)
            remove_worker(r, slot); /* the next worker moves into position i */
        else
            i++;
    }
    drain_queue(r, now);
}

void kvr_router_excuse_silence(struct kvr_router *r, uint64_t now)
{
    for (uint32_t i = 0; i < r->reg.nlive; i++) {
        struct kvr_worker *w = &r->reg.by_slot[r->reg.order[i]];
        if (w->last_seen < now)
            w->last_seen = now;
    }
}

void kvr_router_index_clear(struct kvr_router *r)
{
    for (uint32_t i = 0; i < r->reg.nlive; i++)
        kvr_index_clear_worker(&r->ix, r->reg.order[i]);
}

uint32_t kvr_router_queue_len(const struct kvr_router *r)
{
    return r->qlen;
}

void kvr_router_stats(const struct kvr_router *r, struct kvr_router_stats *out)
{
    *out = r->st;
    out->index = r->ix.cnt;
    out->workers = r->reg.nlive;
    out->inflight = kvr_active_count(&r->act);
    out->queue_len = r->qlen;
    out->index_entries = kvr_index_entries(&r->ix);
    out->nodes = kvr_blocktab_count(&r->tab);
    out->active_blocks = 0;
    for (uint32_t i = 0; i < r->reg.nlive; i++)
        out->active_blocks += r->act.w[r->reg.order[i]].blocks;
    out->memory_bytes = sizeof *r + kvr_blocktab_bytes(&r->tab) + kvr_index_bytes(&r->ix) +
                        kvr_active_bytes(&r->act) +
                        (size_t)r->nslots * (3 * sizeof(uint32_t) + sizeof(struct kvr_candidate) +
                                             2 * sizeof(uint32_t) + 3 * 8) +
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

/* --- replication ------------------------------------------------------------------------ */

kvr_status kvr_router_import(struct kvr_router *r, const struct kvr_request_record *rec,
                             uint64_t now)
{
    if (!rec || rec->request_id == 0 || (rec->nblocks && !rec->block_hashes) ||
        rec->overlap_blocks > rec->nblocks)
        return KVR_ERR_INVALID;
    struct kvr_worker *w = kvr_registry_find(&r->reg, rec->worker_id);
    if (!w) {
        r->st.unknown_worker++;
        return KVR_ERR_UNKNOWN_WORKER;
    }
    if (kvr_active_find(&r->act, rec->request_id)) {
        r->st.duplicate_request++;
        return KVR_ERR_DUPLICATE;
    }
    struct kvr_early_rec early;
    bool had_early = kvr_early_take(&r->early, rec->request_id, &early);
    if (had_early && early.done) { /* its done overtook it: it is over */
        /* keep the tombstone: the same decision may come again (gossip, then a snapshot) */
        kvr_early_note(&r->early, rec->request_id, KVR_EARLY_DONE, now);
        r->st.late_decisions++;
        return KVR_ERR_DUPLICATE;
    }
    kvr_status st = ensure_blocks(r, rec->nblocks);
    if (st != KVR_OK)
        return st;
    st = book(r, rec->request_id, kvr_registry_slot(&r->reg, w), rec->block_hashes, r->nodes, 0,
              rec->nblocks, rec->prompt_tokens, rec->overlap_blocks, now);
    if (st != KVR_OK)
        return st;
    r->st.decisions++;
    if (rec->prefill_done || (had_early && early.prefill_done))
        kvr_active_prefill_done(&r->act, rec->request_id, now);
    /* the record and the early events may both count the same blocks (a snapshot taken after
     * events this replica also saw): the larger count, never the sum */
    uint32_t out = rec->output_blocks;
    if (had_early && early.outblocks > out)
        out = early.outblocks;
    for (uint32_t i = 0; i < out; i++)
        kvr_active_output_block(&r->act, rec->request_id, now);
    return KVR_OK;
}

kvr_status kvr_router_book(struct kvr_router *r, uint64_t request_id, uint64_t worker_id,
                           const uint64_t *block_hashes, uint32_t nblocks, uint32_t prompt_tokens,
                           uint32_t overlap_blocks, uint64_t now)
{
    struct kvr_request_record rec = {request_id,    worker_id,      block_hashes, nblocks,
                                     prompt_tokens, overlap_blocks, false,        0};
    return kvr_router_import(r, &rec, now);
}

static void fill_record(struct kvr_router *r, const struct kvr_active_req *q,
                        struct kvr_request_record *out)
{
    if (q->nnodes > r->cap_export) {
        uint64_t *h = realloc(r->export_hashes, (size_t)q->nnodes * sizeof *h);
        if (h) {
            r->export_hashes = h;
            r->cap_export = q->nnodes;
        }
    }
    uint32_t n = q->nnodes <= r->cap_export ? q->nnodes : 0;
    for (uint32_t i = 0; i < n; i++)
        r->export_hashes[i] = kvr_blocktab_node(&r->tab, q->nodes[i])->seq;
    uint32_t partial = q->prompt_tokens % r->cfg.block_size ? 1 : 0;
    out->request_id = q->id;
    out->worker_id = r->reg.by_slot[q->slot].id;
    out->block_hashes = r->export_hashes;
    out->nblocks = n;
    out->prompt_tokens = q->prompt_tokens;
    out->overlap_blocks = q->overlap < n ? q->overlap : n;
    out->prefill_done = q->prefill == 0;
    out->output_blocks = q->extra > partial ? q->extra - partial : 0;
}

kvr_status kvr_router_export(struct kvr_router *r, uint64_t request_id,
                             struct kvr_request_record *out)
{
    const struct kvr_active_req *q = kvr_active_find(&r->act, request_id);
    if (!q)
        return KVR_ERR_UNKNOWN_REQUEST;
    fill_record(r, q, out);
    return KVR_OK;
}

struct export_ctx {
    struct kvr_router *r;
    void (*fn)(void *, const struct kvr_request_record *);
    void *ctx;
};

static void export_one(void *ctx, const struct kvr_active_req *q)
{
    struct export_ctx *x = ctx;
    struct kvr_request_record rec;
    fill_record(x->r, q, &rec);
    x->fn(x->ctx, &rec);
}

void kvr_router_export_requests(struct kvr_router *r,
                                void (*fn)(void *ctx, const struct kvr_request_record *rec),
                                void *ctx)
{
    struct export_ctx x = {r, fn, ctx};
    kvr_active_each(&r->act, export_one, &x);
}

struct index_export_ctx {
    struct kvr_router *r;
    void (*fn)(void *, const struct kvr_index_record *);
    void *ctx;
    uint64_t now;
};

static void export_entry(void *ctx, uint32_t slot, uint64_t seq, bool has_engine,
                         uint64_t engine_id, uint64_t expires)
{
    struct index_export_ctx *x = ctx;
    struct kvr_index_record rec = {x->r->reg.by_slot[slot].id, seq, has_engine, engine_id,
                                   !has_engine && expires > x->now ? expires - x->now : 0};
    if (has_engine || rec.ttl_left_ns)
        x->fn(x->ctx, &rec);
}

void kvr_router_export_index(struct kvr_router *r,
                             void (*fn)(void *ctx, const struct kvr_index_record *rec), void *ctx,
                             uint64_t now)
{
    struct index_export_ctx x = {r, fn, ctx, now};
    kvr_index_each(&r->ix, export_entry, &x);
}

kvr_status kvr_router_import_index(struct kvr_router *r, const struct kvr_index_record *rec,
                                   uint64_t now)
{
    struct kvr_worker *w = kvr_registry_find(&r->reg, rec->worker_id);
    if (!w) {
        r->st.unknown_worker++;
        return KVR_ERR_UNKNOWN_WORKER;
    }
    return kvr_index_import(&r->ix, kvr_registry_slot(&r->reg, w), rec->seq, rec->has_engine,
                            rec->engine_id, now + rec->ttl_left_ns);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static bool holds(const uint64_t *sorted, uint32_t n, uint64_t key)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (sorted[mid] < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && sorted[lo] == key;
}

uint32_t kvr_router_reconcile(struct kvr_router *r, uint64_t worker_id, const uint64_t *keys,
                              uint32_t n, uint64_t now, uint64_t grace, uint64_t *unknown,
                              uint32_t *nunknown, uint32_t max)
{
    *nunknown = 0;
    struct kvr_worker *w = kvr_registry_find(&r->reg, worker_id);
    uint64_t *sorted = n ? malloc((size_t)n * sizeof *sorted) : NULL;
    if (!w || (n && !sorted)) {
        free(sorted);
        return 0;
    }
    if (n) {
        memcpy(sorted, keys, (size_t)n * sizeof *sorted);
        qsort(sorted, n, sizeof *sorted, cmp_u64);
    }
    uint32_t slot = kvr_registry_slot(&r->reg, w), dropped = 0;
    /* collect first: dropping while walking the worker's list would unlink under our feet */
    uint32_t cap = r->act.w[slot].nreqs, nvictims = 0;
    uint64_t *victims = cap ? malloc((size_t)cap * sizeof *victims) : NULL;
    for (uint32_t h = r->act.w[slot].reqs.head; victims && h != KVR_NIL;) {
        struct kvr_active_req *q = kvr_pool_get(&r->act.reqs, h);
        h = q->wl.next;
        if (holds(sorted, n, q->id) || q->booked_ns + grace >= now)
            q->missed_ns = 0;
        else if (!q->missed_ns)
            q->missed_ns = now; /* first strike */
        else if (now - q->missed_ns >= grace / 2)
            victims[nvictims++] = q->id;
    }
    struct fail_ctx f = {r, worker_id, KVR_EV_EXPIRED, KVR_ERR_NOT_DELIVERED};
    for (uint32_t i = 0; i < nvictims; i++)
        dropped += kvr_active_drop(&r->act, victims[i], on_drop, &f) == KVR_OK;
    r->st.reconciled += dropped;
    for (uint32_t i = 0; i < n && *nunknown < max; i++)
        if (!kvr_active_find(&r->act, keys[i]) && kvr_map_get(&r->early.ids, keys[i]) == KVR_NIL)
            unknown[(*nunknown)++] = keys[i];
    free(victims);
    free(sorted);
    return dropped;
}

struct digest_ctx {
    struct kvr_router *r;
    struct kvr_digest *d;
};

static void digest_request(void *ctx, const struct kvr_active_req *q)
{
    struct digest_ctx *x = ctx;
    x->d->requests ^= kvr_mix64(q->id ^ kvr_mix64(x->r->reg.by_slot[q->slot].id));
    x->d->nrequests++;
}

static void digest_entry(void *ctx, uint32_t slot, uint64_t seq, bool has_engine,
                         uint64_t engine_id, uint64_t expires)
{
    (void)has_engine;
    (void)engine_id;
    (void)expires;
    struct digest_ctx *x = ctx;
    x->d->index ^= kvr_mix64(seq ^ kvr_mix64(x->r->reg.by_slot[slot].id + 1));
    x->d->nentries++;
}

void kvr_router_digest(struct kvr_router *r, struct kvr_digest *out)
{
    memset(out, 0, sizeof *out);
    for (uint32_t i = 0; i < r->reg.nlive; i++)
        out->workers ^= kvr_mix64(r->reg.by_slot[r->reg.order[i]].id);
    out->nworkers = r->reg.nlive;
    struct digest_ctx x = {r, out};
    kvr_active_each(&r->act, digest_request, &x);
    kvr_index_each(&r->ix, digest_entry, &x);
    out->combined = kvr_mix64(out->workers ^ kvr_mix64(out->requests ^ kvr_mix64(out->index)));
}
