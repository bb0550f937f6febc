/*
 * The decision pipeline: validate the request, hash its prompt, one walk over the prompt's path
 * for every worker's overlap and in-flight prefix, price every live worker (the kv cost: ROUTING.md
 * section 4's blocks formula, or the time model, predicted time to first token plus what
 * recomputation costs; see docs/architecture.md), exclude the busy ones, select with the policy in
 * force, book. kvr_router_route decides and books (or queues when every worker is busy),
 * kvr_router_select only decides. The pricing is in cost.h, static inline, so the compiler inlines
 * the per-worker loop into the decision (the same instructions per decision). Invariant: a decision
 * that returns KVR_OK with booked set has booked the request on the worker it names, and one that
 * fails has booked nothing and left no empty node in the block table; the per-candidate arrays hold
 * positions [0, reg.nlive) in registry order. Single-threaded: the router's state thread.
 */
#include "kvr/router.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/hash.h"
#include "cost.h"
#include "router_int.h"

#define BOOK_PREFETCH 12u /* blocks looked ahead when resolving a prompt's nodes */

/* --- the price of a worker -------------------------------------------------------------------- */

/*
 * The prompt blocks worker slot will not prefill for this request (walk done): the prefix it
 * caches, or the longer one an in-flight request there computes first (the engine reuses those
 * blocks once they are computed). The time model prices the worker's prefill with it, and a
 * booking adds the rest of the prompt to the worker's outstanding prefill, so the two agree.
 */
static inline uint32_t reuse_of(const struct kvr_router *r, uint32_t slot)
{
    return r->hits[slot] > r->overlap[slot] ? r->hits[slot] : r->overlap[slot];
}

/*
 * The KV blocks prompt p needs at once with its whole output, as a worker counts them before it
 * takes a request: a worker whose pool cannot hold them refuses it (ERR_FULL). On a fleet of
 * unequal workers such a request goes only to those whose announced capacity holds it; when none
 * that takes requests does (one that drains does not: the request would wait for its end, and
 * every request behind it), or none says so truly, the policy chooses as if it fitted and the
 * worker says, as before: 0, which every worker holds.
 */
static double need_blocks(struct kvr_router *r, const struct prompt *p)
{
    uint32_t B = r->cfg.block_size;
    double need = (double)(((uint64_t)p->ntokens + p->max_tokens + B - 1) / B);
    return need <= kvr_registry_largest(&r->reg) ? need : 0;
}

/* Whether a worker of inv_capacity (0: unknown, taken to hold anything) holds need blocks. */
static inline bool holds(double need, double inv_capacity)
{
    return need * inv_capacity <= 1.0 + 1e-9; /* need == capacity: 1, give or take a rounding */
}

/* Why a worker is not eligible for a request: 0 when it is. */
enum skip { SKIP_BUSY = 1, SKIP_SMALL = 2 /* not busy, but its pool cannot hold the request */ };

static bool worker_busy(const struct kvr_router *r, uint32_t slot)
{
    const struct kvr_active_worker *aw = &r->act.w[slot];
    if (kvr_registry_busy_blocks(&r->reg, slot, aw->blocks)) /* draining, or its blocks */
        return true;
    return r->cfg.busy_prefill_tokens && aw->prefill > r->cfg.busy_prefill_tokens;
}

/* Why the worker in slot is not eligible for the current prompt (r->need): the rule score and
 * price apply, for the paths that read the registry's records. */
static unsigned skip_of(const struct kvr_router *r, uint32_t slot)
{
    if (worker_busy(r, slot))
        return SKIP_BUSY;
    return holds(r->need, r->reg.hot[slot].inv_capacity) ? 0 : SKIP_SMALL;
}

/*
 * What pricing one worker under the time model reads, copied into locals once per decision: the
 * loops below then keep it in registers (their stores into the router's cost and eligible arrays
 * could alias the router's fields, so the compiler would reload those for every worker).
 */
struct pricer {
    struct cost_consts k;
    const struct kvr_active_worker *aws;
    const struct kvr_worker_hot *hot;
    const uint32_t *overlap, *hits, *counts;
    const double *pload; /* per slot: the prefill booked there lately (kvr_pshare) */
    uint64_t req_blocks, busy_prefill;
    double need; /* need_blocks: a worker that cannot hold it is not eligible */
    uint32_t ntokens;
    uint32_t block_size;
};

/* Set up the pricing of prompt p (walk done, `walked` nodes) at now: pr, an empty memo, the
 * fleet's figures f. */
static void pricer_init(struct pricer *pr, struct reuse_terms *memo, struct fleet_prefix *f,
                        const struct kvr_router *r, const struct prompt *p, double ow,
                        uint32_t walked, uint64_t now)
{
    fleet_prefix(r, walked, f);
    reuse_memo_init(memo);
    cost_consts_init(&pr->k, r, ow, p->max_tokens, now);
    pr->pload = r->psh.load;
    pr->aws = r->act.w;
    pr->hot = r->reg.hot;
    pr->overlap = r->overlap;
    pr->hits = r->hits;
    pr->counts = r->ix.counts;
    pr->block_size = r->cfg.block_size;
    pr->req_blocks = p->nblocks + (p->ntokens % pr->block_size ? 1 : 0);
    pr->busy_prefill = r->cfg.busy_prefill_tokens;
    pr->need = r->need;
    pr->ntokens = p->ntokens;
}

/* The time model's price of the worker in slot (walk done: overlap and hits filled), and why it
 * is not eligible (*skip): busy (worker_busy, from the locals), or too small to hold the request.
 */
static inline __attribute__((always_inline)) double
price(const struct kvr_router *r, const struct pricer *pr, struct reuse_terms *memo,
      const struct fleet_prefix *f, uint32_t slot, unsigned *skip)
{
    const struct kvr_active_worker *aw = &pr->aws[slot];
    uint32_t reuse = reuse_of(r, slot), hit = pr->hits[slot];
    uint64_t cached = (uint64_t)reuse * pr->block_size;
    uint64_t prefill = aw->prefill + (cached < pr->ntokens ? pr->ntokens - cached : 0);
    uint64_t decode = aw->blocks + pr->req_blocks - hit;
    bool busy = (double)aw->blocks > pr->hot[slot].busy_blocks ||
                (pr->busy_prefill && aw->prefill > pr->busy_prefill);
    *skip = busy ? SKIP_BUSY : holds(pr->need, pr->hot[slot].inv_capacity) ? 0 : SKIP_SMALL;
    return time_cost(&pr->k, aw, &pr->hot[slot], &pr->counts[slot], prefill, decode,
                     reuse_terms(r, memo, reuse, pr->ntokens, f), pr->pload[slot]);
}

/*
 * Price every live worker for prompt p whose walk resolved `walked` nodes (r->overlap, r->hits
 * and r->nodes filled): costs in registry order (the order of reg.order and reg.order_ids), and
 * the workers that are neither busy nor too small for it listed in eligible. ow is the overlap
 * weight in force. Returns how many are eligible. This loop is the O(workers) part of a decision
 * that needs every price, so it reads only compact per-slot arrays (never the registry's worker
 * records), and the time model's terms that depend only on a worker's reuse are computed once per
 * distinct reuse (reuse_terms).
 */
static uint32_t score(struct kvr_router *r, const struct prompt *p, double ow, uint32_t walked,
                      uint64_t now)
{
    const uint32_t *order = r->reg.order;
    uint32_t neligible = 0;
    if (r->cfg.cost_model == KVR_COST_TIME) { /* one loop per model: neither pays for the other */
        struct fleet_prefix f;
        struct reuse_terms memo[REUSE_MEMO];
        struct pricer pr;
        pricer_init(&pr, memo, &f, r, p, ow, walked, now);
        const uint32_t n = r->reg.nlive;
        double *costs = r->costs;
        uint32_t *eligible = r->eligible, small = 0;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t slot = order[i];
            assert(r->overlap[slot] <= walked && r->hits[slot] <= walked); /* the walk stops
                                                                              where both do */
            unsigned skip;
            costs[i] = price(r, &pr, memo, &f, slot, &skip);
            eligible[neligible] = i;
            neligible += !skip;
            small += skip == SKIP_SMALL;
        }
        r->small_free = small;
        return neligible;
    }
    uint32_t B = r->cfg.block_size;
    uint64_t req_blocks = p->nblocks + (p->ntokens % B ? 1 : 0);
    r->small_free = 0;
    for (uint32_t i = 0; i < r->reg.nlive; i++) {
        uint32_t slot = order[i];
        const struct kvr_active_worker *aw = &r->act.w[slot];
        uint32_t reuse = r->overlap[slot];
        assert(reuse <= walked && r->hits[slot] <= walked);
        uint64_t cached = (uint64_t)reuse * B;
        uint64_t prefill = aw->prefill + (cached < p->ntokens ? p->ntokens - cached : 0);
        uint64_t decode = aw->blocks + req_blocks - r->hits[slot];
        r->costs[i] = ow / B * (double)prefill + (double)decode;
        r->eligible[neligible] = i;
        unsigned skip = skip_of(r, slot);
        neligible += !skip;
        r->small_free += skip == SKIP_SMALL;
    }
    return neligible;
}

/*
 * Whether the kv pick may skip workers (pick_pruned): a routed decision under the time model at
 * temperature 0 that explains nothing (a select or an explained decision reports every price),
 * with a model whose terms are never negative and never shrink as the prefill grows (every
 * weight is at least 0 by kvr_router_create; the prefill polynomial is checked here).
 */
static bool may_prune(const struct kvr_router *r, const struct prompt *p, enum kvr_policy policy,
                      double temp, bool do_book)
{
    const double *c = r->cfg.prefill_ms;
    return do_book && policy == KVR_POLICY_KV && temp <= 0 && !p->explain &&
           r->cfg.cost_model == KVR_COST_TIME && c[0] >= 0 && c[1] >= 0 && c[2] >= 0;
}

/* The pick so far of pick_pruned. */
struct pruned {
    struct kvr_kv_choice best; /* by key (kvr_kv_key) */
    uint32_t chosen;           /* its slot, KVR_NIL for none */
    double chosen_cost;        /* its price */
    uint32_t avoided;          /* the eligible worker to avoid, KVR_NIL when not seen */
    double avoided_cost;       /* its price */
    uint32_t small_free;       /* workers offered that were only too small (SKIP_SMALL) */
};

/* Price the worker in slot and offer it to the pick. */
static inline __attribute__((always_inline)) void
offer(struct kvr_router *r, const struct prompt *p, const struct pricer *pr,
      struct reuse_terms *memo, const struct fleet_prefix *f, uint32_t slot, struct pruned *pk)
{
    unsigned skip;
    double c = price(r, pr, memo, f, slot, &skip);
    if (skip) {
        pk->small_free += skip == SKIP_SMALL;
        return;
    }
    if (p->avoid && r->reg.by_slot[slot].id == p->avoid) {
        pk->avoided = slot;
        pk->avoided_cost = c;
        return;
    }
    double key = kvr_kv_key(r->cfg.tie_margin, c, p->id, r->reg.by_slot[slot].id);
    if (kvr_kv_offer(&r->sel, &pk->best, key, pr->counts[slot])) {
        pk->chosen = slot;
        pk->chosen_cost = c;
    }
}

/* Offer every member of set s, but those with an overlap when skip_cached (the members of the
 * first block's index set have one, and were offered). r->eligible is the scratch. */
static void offer_members(struct kvr_router *r, const struct prompt *p, const struct pricer *pr,
                          struct reuse_terms *memo, const struct fleet_prefix *f,
                          const struct kvr_hset *s, bool skip_cached, struct pruned *pk)
{
    assert(s->n <= r->nslots); /* a set holds live slots only */
    uint32_t n = kvr_hset_slots(s, r->eligible);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t slot = r->eligible[i];
        if (!skip_cached || pr->overlap[slot] == 0)
            offer(r, p, pr, memo, f, slot, pk);
    }
}

/* The least full cache of the fleet, min(1, index entries / capacity): one pass over compact
 * arrays. */
static double least_fill(const struct kvr_router *r, const struct pricer *pr)
{
    double fill = 1.0;
    for (uint32_t i = 0; i < r->reg.nlive; i++) {
        uint32_t slot = r->reg.order[i];
        double inv = pr->hot[slot].inv_capacity;
        double x = inv > 0 ? (double)pr->counts[slot] * inv : 1.0;
        fill = x < fill ? x : fill;
    }
    return fill;
}

/*
 * The least decode step a live worker would take with the request's blocks booked and none of them
 * in use there: max(1, decode_ms(u)) for u = (its blocks + the request's) / its capacity, the least
 * of a quadratic over the interval those u span (its ends, and its vertex when inside). Every
 * worker the walk did not meet has such a u, so its own decode costs at least this a step. One
 * pass over compact arrays, as least_fill.
 */
static double least_step(const struct kvr_router *r, const struct pricer *pr)
{
    double lo = INFINITY, hi = -INFINITY;
    for (uint32_t i = 0; i < r->reg.nlive; i++) {
        uint32_t slot = r->reg.order[i];
        double u = (double)(pr->aws[slot].blocks + pr->req_blocks) * pr->hot[slot].inv_capacity;
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
    }
    const double *d = pr->k.decode_ms;
    double least = poly(d, lo), at = poly(d, hi);
    least = at < least ? at : least;
    if (d[2] > 0) {
        double v = -d[1] / (2 * d[2]);
        if (v > lo && v < hi && (at = poly(d, v)) < least)
            least = at;
    }
    return least > 1.0 ? least : 1.0;
}

/*
 * The kv pick without pricing every worker. The workers the walk met (they cache the prompt's
 * first block or run a request that uses it: the members of its node's sets) are priced one by
 * one. Every other worker reuses nothing, so its price (time_cost) differs from another's only
 * through its own figures, and each term of it is at least: the prompt's whole prefill queued
 * behind nothing, its decodes at their cheapest (max(1, decode_ms[0]) a step, when that
 * polynomial cannot fall), the stall over its nreqs, the cache term at the least full cache of
 * the fleet, the share term, and the own decode at the least step of the fleet (least_step). That
 * floor depends only on nreqs and grows with it, and adds its terms in time_cost's order, so its
 * floating-point sum is at most the price but for rounding (a prefill of several steps sums them
 * otherwise: an ulp or so), which a relative margin of 1e-9 covers. So those workers are visited
 * in order of load (by_load) and the visit stops at the first whose floor is above the best price
 * by more than the margin: neither it nor any after it can cost less or tie. The choice follows
 * kvr_select_kv's rule (kvr_kv_offer, on each price's kvr_kv_key); the worker to avoid is taken
 * only when no other is eligible. Returns the chosen slot and its price in *cost; KVR_NIL when
 * none is eligible.
 */
static uint32_t pick_pruned(struct kvr_router *r, const struct prompt *p, double ow,
                            uint32_t walked, uint64_t now, double *cost)
{
    struct fleet_prefix f;
    struct reuse_terms memo[REUSE_MEMO];
    struct pricer pr;
    pricer_init(&pr, memo, &f, r, p, ow, walked, now);
    struct pruned pk = {.chosen = KVR_NIL, .avoided = KVR_NIL, .avoided_cost = 0};
    kvr_kv_choice_init(&pk.best);
    if (walked) {
        const struct kvr_node *first = kvr_blocktab_node(&r->tab, r->nodes[0]);
        offer_members(r, p, &pr, memo, &f, &first->idx, false, &pk);
        offer_members(r, p, &pr, memo, &f, &first->act, true, &pk);
    }
    /* the floor of a worker that reuses nothing (reuse_terms(0): copied, as the memo is
     * direct-mapped and a later fill may take its entry) */
    const struct reuse_terms t0 = *reuse_terms(r, memo, 0, p->ntokens, &f);
    const double *d = r->cfg.decode_ms;
    double step = d[1] >= 0 && d[2] >= 0 && d[0] > 1.0 ? d[0] : 1.0;
    double base[2] = {t0.ttft0, t0.ttft0 + (double)t0.steps0 * step};
    double own = pr.k.own_decode > 0 ? pr.k.own_decode * least_step(r, &pr) : 0;
    double cache = 0, share = t0.share ? t0.share_cost : 0;
    bool filled = false; /* cache: 0 until a floor without it fails to stop the visit */
    const double sw = pr.k.stall_weight, stall = t0.stall_time;
    const uint32_t *by_load = r->act.by_load;
    assert(r->act.nlisted == r->reg.nlive); /* the router lists every live worker, only them */
    for (uint32_t q = 0; q < r->act.nlisted; q++) {
        uint32_t slot = by_load[q];
        if (pr.overlap[slot] || pr.hits[slot])
            continue; /* met by the walk: offered */
        uint32_t n = pr.aws[slot].nreqs;
        /* the best key (a key is at least its price, so no worker whose floor is above it can
         * win), with a margin for rounding */
        double bound = pk.best.cost * (1.0 + 1e-9);
        double lower = base[n > 0] + sw * (double)n * stall;
        if (!filled && lower + cache + share + own <= bound) {
            cache = pr.k.ow_cache * least_fill(r, &pr) * t0.cache_time;
            filled = true;
        }
        if (lower + cache + share + own > bound)
            break;
        offer(r, p, &pr, memo, &f, slot, &pk);
    }
    r->small_free = pk.small_free; /* none chosen: every worker was offered */
    if (pk.chosen == KVR_NIL && pk.avoided != KVR_NIL) {
        *cost = pk.avoided_cost;
        return pk.avoided;
    }
    *cost = pk.chosen_cost;
    return pk.chosen;
}

/* The full view of every live worker in r->cands, after score(). */
static void fill_candidates(struct kvr_router *r, const struct prompt *p)
{
    uint32_t B = r->cfg.block_size;
    uint64_t req_blocks = p->nblocks + (p->ntokens % B ? 1 : 0);
    for (uint32_t i = 0; i < r->reg.nlive; i++) {
        uint32_t slot = r->reg.order[i];
        const struct kvr_worker *w = &r->reg.by_slot[slot];
        const struct kvr_active_worker *aw = &r->act.w[slot];
        struct kvr_candidate *c = &r->cands[i];
        uint64_t cached = (uint64_t)reuse_of(r, slot) * B;
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
        /* skipped: busy, or its pool cannot hold the request (score's rule, the view says why
         * the cheapest may not be chosen) */
        unsigned skip = skip_of(r, slot);
        c->busy = skip != 0;
        c->too_small = skip == SKIP_SMALL;
    }
}

/* --- the pipeline ---------------------------------------------------------------------------- */

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

kvr_status kvr__router_book(struct kvr_router *r, uint64_t id, uint32_t slot, const uint64_t *seq,
                            uint32_t *nodes, uint32_t from, uint32_t n, uint32_t ntokens,
                            uint32_t overlap, uint64_t now)
{
    assert(from <= n && n <= r->cap_blocks && slot < r->nslots);
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
            if (kvr_blocktab_live(&r->tab, nodes[k])) /* a record may name a block twice */
                kvr_blocktab_release(&r->tab, nodes[k]);
        return st;
    }
    if (r->cfg.approximate || r->reg.by_slot[slot].approximate)
        kvr_index_touch(&r->ix, slot, nodes, n, now); /* best effort: a miss costs only a hit */
    return KVR_OK;
}

/* The predicted time of a prefill of ntokens less reuse blocks, ms; 0 for a model that prices
 * it at 0 or less (library callers with negative coefficients), or NaN. */
static double booked_prefill_ms(const struct kvr_router *r, uint32_t ntokens, uint32_t reuse)
{
    uint64_t cached = (uint64_t)reuse * r->cfg.block_size;
    double ms = prefill_time(&r->cfg, cached < ntokens ? ntokens - cached : 0);
    return ms > 0 ? ms : 0;
}

bool kvr__router_note_prefill(struct kvr_router *r, uint32_t slot, uint32_t ntokens, uint32_t reuse,
                              uint64_t now)
{
    double ms = booked_prefill_ms(r, ntokens, reuse);
    if (ms > 0)
        kvr_pshare_add(&r->psh, slot, ms, now);
    return ms > 0;
}

void kvr__router_unnote_prefill(struct kvr_router *r, const struct kvr_active_req *q)
{
    if (q->noted)
        kvr_pshare_sub(&r->psh, q->slot, booked_prefill_ms(r, q->prompt_tokens, q->overlap),
                       q->booked_ns);
}

/* r->eligible[0..n) without the worker avoid when another is left; the new count. */
static uint32_t drop_avoided(struct kvr_router *r, uint64_t avoid, uint32_t n)
{
    for (uint32_t e = 0; avoid && n > 1 && e < n; e++)
        if (r->reg.order_ids[r->eligible[e]] == avoid) {
            memmove(&r->eligible[e], &r->eligible[e + 1],
                    (size_t)(n - e - 1) * sizeof *r->eligible);
            return n - 1;
        }
    return n;
}

/* The position in r->eligible[0..neligible) the policy in force chooses. */
static uint32_t choose(struct kvr_router *r, const struct prompt *p, enum kvr_policy policy,
                       double temp, uint32_t neligible)
{
    if (policy == KVR_POLICY_KV)
        return kvr_select_kv(&r->sel, temp, r->cfg.tie_margin, p->id, r->reg.order_ids, r->costs,
                             r->reg.order, r->ix.counts, r->eligible, neligible);
    struct kvr_select_input in = {policy, p->nblocks, p->first_hash, NULL, r->reg.order};
    if (policy == KVR_POLICY_CHWBL && refresh_ring(r) == KVR_OK) {
        for (uint32_t i = 0; i < r->nslots; i++)
            r->slot_cand[i] = KVR_NIL;
        for (uint32_t e = 0; e < neligible; e++)
            r->slot_cand[r->reg.order[r->eligible[e]]] = e;
        in.slot_cand = r->slot_cand;
    }
    return kvr_select(&r->sel, &r->cfg, &in, r->cands, r->eligible, neligible);
}

/*
 * The pick of the full loop: every live worker priced (r->costs), then the policy in force. The
 * chosen slot and its price in *slot and *cost; *full when the candidates' full view was built.
 */
static kvr_status pick_full(struct kvr_router *r, const struct prompt *p, enum kvr_policy policy,
                            double ow, double temp, uint32_t walked, uint64_t now, uint32_t *slot,
                            double *cost, bool *full)
{
    uint32_t neligible = drop_avoided(r, p->avoid, score(r, p, ow, walked, now));
    if (neligible == 0)
        return KVR_ERR_OVERLOADED;
    *full = p->explain || policy != KVR_POLICY_KV;
    if (*full)
        fill_candidates(r, p);
    uint32_t pick = choose(r, p, policy, temp, neligible);
    assert(pick < neligible && neligible <= r->reg.nlive);
    pick = r->eligible[pick];
    *slot = r->reg.order[pick];
    *cost = r->costs[pick];
    return KVR_OK;
}

kvr_status kvr__router_decide(struct kvr_router *r, const struct prompt *p, uint64_t now,
                              bool do_book, struct kvr_decision *out)
{
    if (r->reg.nlive == 0)
        return KVR_ERR_NO_WORKERS;
    kvr_status st = kvr__router_ensure_blocks(r, p->nblocks);
    if (st == KVR_OK) /* a join that ran out of memory there grew the registry alone */
        st = kvr__router_ensure_slots(r);
    if (st != KVR_OK)
        return st;
    assert(r->nslots >= r->reg.nslots); /* every slot has its scratch */
    const struct kvr_overrides *ov = p->ov;
    enum kvr_policy policy = ov && (ov->flags & KVR_OV_POLICY) ? ov->policy : r->cfg.policy;
    double ow =
        ov && (ov->flags & KVR_OV_OVERLAP_WEIGHT) ? ov->overlap_weight : r->cfg.overlap_weight;
    double temp = ov && (ov->flags & KVR_OV_TEMPERATURE) ? ov->temperature : r->cfg.temperature;

    memset(r->overlap, 0, (size_t)r->nslots * sizeof *r->overlap);
    memset(r->hits, 0, (size_t)r->nslots * sizeof *r->hits);
    uint32_t walked = kvr_blocktab_walk(&r->tab, p->seq, p->nblocks, &r->walk_idx, r->overlap,
                                        &r->walk_act, r->hits, r->nodes);
    assert(walked <= p->nblocks);
    bool pruned = may_prune(r, p, policy, temp, do_book), full = false;
    r->need = need_blocks(r, p);
    uint32_t slot = KVR_NIL;
    double cost = 0;
    if (pruned) {
        slot = pick_pruned(r, p, ow, walked, now, &cost);
        st = slot == KVR_NIL ? KVR_ERR_OVERLOADED : KVR_OK;
    } else {
        st = pick_full(r, p, policy, ow, temp, walked, now, &slot, &cost, &full);
    }
    uint32_t reuse = st == KVR_OK ? reuse_of(r, slot) : 0;
    if (st == KVR_OK && do_book)
        st = kvr__router_book(r, p->id, slot, p->seq, r->nodes, walked, p->nblocks, p->ntokens,
                              reuse, now);
    if (st == KVR_OK && do_book) {
        bool noted = kvr__router_note_prefill(r, slot, p->ntokens, reuse, now);
        kvr_active_set_booked(&r->act, p->id, p->max_tokens, noted);
    }
    if (st != KVR_OK)
        return st;
    out->request_id = p->id;
    out->worker_id = r->reg.by_slot[slot].id;
    out->policy = policy;
    out->overlap_blocks = r->overlap[slot];
    out->reuse_blocks = reuse;
    out->prompt_blocks = p->nblocks;
    out->prompt_tokens = p->ntokens;
    out->cost = cost;
    out->block_hashes = p->seq;
    out->ncandidates = r->reg.nlive;
    out->worker_ids = r->reg.order_ids;
    out->costs = pruned ? NULL : r->costs; /* pruned: not every worker was priced */
    out->candidates = full ? r->cands : NULL;
    out->booked = do_book;
    out->queued = false;
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
    /* finite: an infinite weight would price every worker NaN (infinity times 0) */
    if (((req->ov.flags & KVR_OV_OVERLAP_WEIGHT) &&
         !(req->ov.overlap_weight >= 0 && isfinite(req->ov.overlap_weight))) ||
        ((req->ov.flags & KVR_OV_TEMPERATURE) &&
         !(req->ov.temperature >= 0 && isfinite(req->ov.temperature))))
        return KVR_ERR_INVALID;
    return KVR_OK;
}

/* Validate req and hash it into r->seq (unless its hashes come with it); fills *p. */
static kvr_status prepare(struct kvr_router *r, const struct kvr_request *req, struct prompt *p)
{
    kvr_status st = check_request(r, req);
    if (st != KVR_OK)
        return st;
    uint32_t nblocks = req->ntokens / r->cfg.block_size;
    st = kvr__router_ensure_blocks(r, nblocks); /* the booking's nodes, whoever hashed */
    if (st != KVR_OK)
        return st;
    p->seq = req->seq_hashes;
    if (!p->seq) {
        kvr_hash_prompt(req->tokens, req->ntokens, r->cfg.block_size, NULL, r->seq);
        p->seq = r->seq;
    }
    p->id = req->id;
    p->nblocks = nblocks;
    p->ntokens = req->ntokens;
    p->first_hash = nblocks ? p->seq[0] : kvr_hash_bytes(req->tokens, req->ntokens * 4ull);
    p->ov = &req->ov;
    p->explain = req->explain;
    p->deadline = req->deadline;
    p->avoid = req->avoid_worker;
    p->max_tokens = kvr__router_max_tokens(r, req->max_tokens);
    return KVR_OK;
}

static kvr_status refuse(struct kvr_router *r, kvr_status st)
{
    r->st.rejected++;
    r->st.overloaded += st == KVR_ERR_OVERLOADED;
    r->st.duplicate_request += st == KVR_ERR_DUPLICATE;
    return st;
}

/* The outcome "it waits": nothing else of a decision is known yet. */
static void queued_decision(struct kvr_decision *out, uint64_t id)
{
    memset(out, 0, sizeof *out);
    out->request_id = id;
    out->queued = true;
}

kvr_status kvr_router_route(struct kvr_router *r, const struct kvr_request *req, uint64_t now,
                            struct kvr_decision *out)
{
    if (r->qhead)
        kvr__router_drain(r, now);
    struct prompt p;
    kvr_status st = prepare(r, req, &p);
    if (st != KVR_OK)
        return refuse(r, st);
    if (kvr_active_find(&r->act, req->id) || (r->qhead && kvr__router_is_queued(r, req->id)))
        return refuse(r, KVR_ERR_DUPLICATE);
    if (r->reg.nlive == 0)
        return refuse(r, KVR_ERR_NO_WORKERS);
    bool sized = false;
    if (r->qhead && r->qsized < r->qlen) /* others wait for any worker: keep their order */
        st = KVR_ERR_OVERLOADED;
    else if (kvr_active_count(&r->act) >= r->cfg.max_inflight)
        st = KVR_ERR_OVERLOADED;
    else if ((st = kvr__router_decide(r, &p, now, true, out)) == KVR_ERR_OVERLOADED)
        sized = r->small_free > 0; /* it waits for a larger worker, holding up no other */
    if (st == KVR_ERR_OVERLOADED && r->cfg.queue_max) {
        st = kvr__router_enqueue(r, &p, now, sized);
        if (st == KVR_OK) {
            queued_decision(out, req->id);
            return KVR_OK;
        }
    }
    if (st != KVR_OK)
        return refuse(r, st);
    r->st.decisions++;
    r->st.routed_blocks += out->prompt_blocks;
    r->st.routed_overlap += out->overlap_blocks;
    return KVR_OK;
}

kvr_status kvr_router_select(struct kvr_router *r, const struct kvr_request *req, uint64_t now,
                             struct kvr_decision *out)
{
    struct prompt p;
    kvr_status st = prepare(r, req, &p);
    if (st == KVR_OK)
        st = kvr__router_decide(r, &p, now, false, out);
    if (st != KVR_OK)
        return refuse(r, st);
    r->st.selects++;
    return KVR_OK;
}
