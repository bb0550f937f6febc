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
#include <stdlib.h>
#include <string.h>

#include "kvr/hash.h"
#include "cost.h"
#include "router_int.h"

#define BOOK_PREFETCH 12u /* blocks looked ahead when resolving a prompt's nodes */

/* --- the price of a worker -------------------------------------------------------------------- */

static bool worker_busy(const struct kvr_router *r, uint32_t slot)
{
    const struct kvr_active_worker *aw = &r->act.w[slot];
    if (kvr_registry_busy_blocks(&r->reg, slot, aw->blocks)) /* draining, or its blocks */
        return true;
    return r->cfg.busy_prefill_tokens && aw->prefill > r->cfg.busy_prefill_tokens;
}

/*
 * Price every live worker for prompt p whose walk resolved `walked` nodes (r->overlap, r->hits
 * and r->nodes filled): costs in registry order (the order of reg.order and reg.order_ids), and
 * the workers that are not busy listed in eligible. ow is the overlap weight in force. Returns how
 * many are eligible. This loop is the O(workers) part of every decision, so it reads only compact
 * per-slot arrays (never the registry's worker records), and the time model's terms that depend
 * only on a worker's reuse are computed once per distinct reuse (reuse_terms).
 */
static uint32_t score(struct kvr_router *r, const struct prompt *p, double ow, uint32_t walked)
{
    uint32_t B = r->cfg.block_size;
    uint64_t req_blocks = p->nblocks + (p->ntokens % B ? 1 : 0);
    bool timed = r->cfg.cost_model == KVR_COST_TIME;
    struct fleet_prefix f = {0, 0, 0, 0};
    struct reuse_terms memo[REUSE_MEMO];
    if (timed) {
        fleet_prefix(r, walked, &f);
        reuse_memo_init(memo);
    }
    const uint32_t *order = r->reg.order;
    uint32_t neligible = 0;
    if (timed) { /* one loop per cost model: neither pays for the other's arithmetic */
        /* locals, not the router's fields: the stores below could alias those */
        struct cost_consts k;
        cost_consts_init(&k, r, ow);
        const uint32_t n = r->reg.nlive, ntokens = p->ntokens;
        const uint64_t busy_prefill = r->cfg.busy_prefill_tokens;
        const struct kvr_active_worker *aws = r->act.w;
        const struct kvr_worker_hot *hot = r->reg.hot;
        const uint32_t *overlap = r->overlap, *hits = r->hits, *counts = r->ix.counts;
        double *costs = r->costs;
        uint32_t *eligible = r->eligible;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t slot = order[i];
            const struct kvr_active_worker *aw = &aws[slot];
            uint32_t reuse = overlap[slot], hit = hits[slot];
            assert(reuse <= walked && hit <= walked); /* the walk stops where both do */
            if (hit > reuse)
                reuse = hit; /* an in-flight request there computes them first */
            uint64_t cached = (uint64_t)reuse * B;
            uint64_t prefill = aw->prefill + (cached < ntokens ? ntokens - cached : 0);
            uint64_t decode = aw->blocks + req_blocks - hit;
            costs[i] = time_cost(&k, aw, &hot[slot], &counts[slot], prefill, decode,
                                 reuse_terms(r, memo, reuse, ntokens, &f));
            eligible[neligible] = i;
            /* worker_busy(r, slot), from the locals */
            bool busy = (double)aw->blocks > hot[slot].busy_blocks ||
                        (busy_prefill && aw->prefill > busy_prefill);
            neligible += !busy;
        }
        return neligible;
    }
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
        neligible += !worker_busy(r, slot);
    }
    return neligible;
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
            kvr_blocktab_release(&r->tab, nodes[k]);
        return st;
    }
    if (r->cfg.approximate || r->reg.by_slot[slot].approximate)
        kvr_index_touch(&r->ix, slot, nodes, n, now); /* best effort: a miss costs only a hit */
    return KVR_OK;
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
        return kvr_select_kv(&r->sel, temp, r->costs, r->reg.order, r->ix.counts, r->eligible,
                             neligible);
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

kvr_status kvr__router_decide(struct kvr_router *r, const struct prompt *p, uint64_t now,
                              bool do_book, struct kvr_decision *out)
{
    if (r->reg.nlive == 0)
        return KVR_ERR_NO_WORKERS;
    kvr_status st = kvr__router_ensure_blocks(r, p->nblocks);
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
    uint32_t neligible = drop_avoided(r, p->avoid, score(r, p, ow, walked));
    if (neligible == 0)
        return KVR_ERR_OVERLOADED;
    bool full = p->explain || policy != KVR_POLICY_KV;
    if (full)
        fill_candidates(r, p);

    uint32_t pick = choose(r, p, policy, temp, neligible);
    assert(pick < neligible && neligible <= r->reg.nlive);
    pick = r->eligible[pick];
    uint32_t slot = r->reg.order[pick];
    if (do_book) {
        st = kvr__router_book(r, p->id, slot, p->seq, r->nodes, walked, p->nblocks, p->ntokens,
                              r->overlap[slot], now);
        if (st != KVR_OK)
            return st;
    }
    out->request_id = p->id;
    out->worker_id = r->reg.order_ids[pick];
    out->policy = policy;
    out->overlap_blocks = r->overlap[slot];
    out->prompt_blocks = p->nblocks;
    out->prompt_tokens = p->ntokens;
    out->cost = r->costs[pick];
    out->block_hashes = p->seq;
    out->ncandidates = r->reg.nlive;
    out->worker_ids = r->reg.order_ids;
    out->costs = r->costs;
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
    st = kvr__router_ensure_blocks(r, nblocks);
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
    p->deadline = req->deadline;
    p->avoid = req->avoid_worker;
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
    if (r->qhead) /* others are waiting already: keep their order */
        st = KVR_ERR_OVERLOADED;
    else if (kvr_active_count(&r->act) >= r->cfg.max_inflight)
        st = KVR_ERR_OVERLOADED;
    else
        st = kvr__router_decide(r, &p, now, true, out);
    if (st == KVR_ERR_OVERLOADED && r->cfg.queue_max) {
        st = kvr__router_enqueue(r, &p, now);
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
