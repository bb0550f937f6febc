/*
 * The kv policy's time model (docs/architecture.md, "The kv cost"): the price of one worker for
 * one prompt, from the engine timing model and the router's predicted state. Static inline so
 * the per-worker loop of a decision (score() in router_decision.c, its only user) compiles into
 * one tight loop. Pure: reads the router, changes nothing. Single-threaded: the state thread.
 */
#ifndef KVR_COST_H
#define KVR_COST_H

#include <assert.h>
#include <stdbool.h>
#include <stdint.h>

#include "router_int.h"

static inline double poly(const double *c, double x)
{
    return c[0] + c[1] * x + c[2] * x * x;
}

/*
 * Predicted time to first token on a worker, ms: its queued prefill and ours go through steps of
 * batch_tokens, each also running the worker's decodes at its KV utilisation u.
 */
static inline double predicted_ttft(const struct kvr_router_config *c, uint64_t prefill, double u,
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
    double busy;    /* the fraction of live workers with a request in flight, 0 to 1 */
};

static inline void fleet_prefix(const struct kvr_router *r, uint32_t walked, struct fleet_prefix *f)
{
    f->omax = r->walk_idx.deepest; /* the walks' longest prefixes: no pass over the workers */
    f->hmax = r->walk_act.deepest; /* (sets hold live workers' slots only) */
    f->share_w = 0;
    f->busy = r->reg.nlive ? (double)r->act.nworking / r->reg.nlive : 0;
    if (f->hmax <= f->omax || f->hmax > walked)
        return;
    /* n requests in flight compute a prefix no cache holds yet (a burst of agents sharing a
     * prompt): the third and later ones should join them rather than compute it again */
    uint32_t n = 0, slot, refs;
    struct kvr_hset_iter it;
    kvr_hset_iter_init(&it, &kvr_blocktab_node(&r->tab, r->nodes[f->hmax - 1])->act);
    while (kvr_hset_next(&it, &slot, &refs))
        n += refs;
    assert(n > 0); /* some worker's in-flight prefix reaches that block */
    f->share_w = n > 2 ? f->busy * r->cfg.share_weight * (double)(n - 2) / n : 0;
}

/* The time steps of batch_tokens take to prefill `tokens`, ms (0 for none). */
static inline double prefill_time(const struct kvr_router_config *c, uint64_t tokens)
{
    if (!tokens)
        return 0;
    if (tokens <= c->batch_tokens)
        return poly(c->prefill_ms, (double)tokens);
    uint64_t steps = (tokens + c->batch_tokens - 1) / c->batch_tokens;
    double last = (double)(tokens - (steps - 1) * c->batch_tokens);
    return (double)(steps - 1) * poly(c->prefill_ms, c->batch_tokens) + poly(c->prefill_ms, last);
}

/*
 * The time model's price of worker slot: predicted TTFT, plus what the choice costs others. The
 * requests decoding there wait for our prefill's steps: each of them is delayed by its time,
 * charged stall_weight times. The prefill this request adds evicts as many blocks from a full
 * cache, so it is charged again, cache_weight times, in proportion to how full the worker's cache
 * is; and blocks that in-flight requests are computing right now are charged f->share_w times.
 */
static inline double time_cost(const struct kvr_router *r, uint32_t slot, uint32_t reuse,
                               uint64_t prefill, uint64_t decode, double ow,
                               const struct fleet_prefix *f)
{
    const struct kvr_router_config *c = &r->cfg;
    const struct kvr_active_worker *aw = &r->act.w[slot];
    double inv = r->reg.by_slot[slot].inv_capacity; /* 0 when the capacity is unknown */
    double u = (double)decode * inv;
    double fill = inv > 0 ? (double)r->ix.counts[slot] * inv : 1.0;
    uint64_t own = prefill - aw->prefill;
    /* blocks other in-flight requests use are hot: a copy of them here is worth what it evicts */
    uint64_t hot = f->hmax > reuse ? (uint64_t)(f->hmax - reuse) * c->block_size : 0;
    uint64_t cold = own > hot ? own - hot : 0;
    double cost = predicted_ttft(c, prefill, u, aw->nreqs > 0) +
                  c->stall_weight * (double)aw->nreqs * prefill_time(c, own) +
                  ow * c->cache_weight * (fill > 1.0 ? 1.0 : fill) *
                      (poly(c->prefill_ms, (double)cold) - c->prefill_ms[0]);
    uint32_t base = reuse > f->omax ? reuse : f->omax;
    if (f->share_w > 0 && f->hmax > base) {
        double dup = (double)(f->hmax - base) * r->cfg.block_size;
        cost += f->share_w * (poly(c->prefill_ms, dup) - c->prefill_ms[0]);
    }
    return cost;
}

#endif
