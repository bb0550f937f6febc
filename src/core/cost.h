/*
 * The kv policy's time model (docs/architecture.md, "The kv cost"): the price of one worker for
 * one prompt, from the engine timing model and the router's predicted state. Static inline so
 * the per-worker loop of a decision (score() in router_decision.c, its only user) compiles into
 * one tight loop. Pure: reads the router, changes nothing (but a decision's local memo of the terms
 * shared by workers of equal reuse). Single-threaded: the state thread.
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
 * The prefill part of the predicted time to first token, ms: the worker's queued prefill and ours
 * go through steps of batch_tokens; *steps receives how many.
 */
static inline double prefill_steps(const struct kvr_router_config *c, uint64_t prefill,
                                   uint64_t *steps)
{
    if (prefill <= c->batch_tokens) { /* the common case: one step */
        *steps = 1;
        return poly(c->prefill_ms, (double)prefill);
    }
    *steps = (prefill + c->batch_tokens - 1) / c->batch_tokens;
    double last = (double)(prefill - (*steps - 1) * c->batch_tokens);
    return (double)(*steps - 1) * poly(c->prefill_ms, c->batch_tokens) + poly(c->prefill_ms, last);
}

/* Predicted time to first token, ms, from its prefill part ms over `steps`: each step also runs
 * the worker's decodes at its KV utilisation u (decode_ms: the config's polynomial). */
static inline double ttft_decode(const double *decode_ms, double ms, uint64_t steps, double u,
                                 bool decoding)
{
    if (decoding) {
        double d = poly(decode_ms, u);
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
 * What the time model charges a worker that reuses `reuse` blocks of the prompt, apart from the
 * worker's own load: equal for every worker with that reuse, so a decision computes it once per
 * distinct reuse (the same expressions on the same values: the same doubles). A small
 * direct-mapped table, local to one decision; reuse UINT32_MAX marks an empty entry.
 */
struct reuse_terms {
    uint32_t reuse;    /* the key */
    bool share;        /* the share term applies */
    uint64_t steps0;   /* prefill steps of the request alone (a worker with no queued prefill) */
    double ttft0;      /* their time, ms */
    double stall_time; /* the time of the prefill this request adds, ms */
    double cache_time; /* poly(cold) - prefill_ms[0]: what recomputing its cold blocks costs */
    double share_cost; /* share_w x the recomputation of the in-flight prefix no cache holds */
};

#define REUSE_MEMO 16u /* entries, a power of 2 */

static inline void reuse_memo_init(struct reuse_terms *memo)
{
    for (uint32_t i = 0; i < REUSE_MEMO; i++)
        memo[i].reuse = UINT32_MAX;
}

/*
 * Compute the terms for `reuse` blocks of a prompt of ntokens into t: a memo miss, out of line so
 * the per-worker loop keeps its registers. The prefill this request adds evicts as many blocks
 * from a full cache, so it is charged again, cache_weight times, in proportion to how full the
 * worker's cache is (time_cost); blocks that other in-flight requests use are hot (a copy of them
 * here is worth what it evicts), and blocks that in-flight requests are computing right now and
 * no cache holds are charged f->share_w times.
 */
__attribute__((noinline, unused)) static void reuse_terms_fill(const struct kvr_router *r,
                                                               struct reuse_terms *t,
                                                               uint32_t reuse, uint32_t ntokens,
                                                               const struct fleet_prefix *f)
{
    const struct kvr_router_config *c = &r->cfg;
    uint64_t cached = (uint64_t)reuse * c->block_size;
    uint64_t own = cached < ntokens ? ntokens - cached : 0;
    uint64_t hot = f->hmax > reuse ? (uint64_t)(f->hmax - reuse) * c->block_size : 0;
    uint64_t cold = own > hot ? own - hot : 0;
    uint32_t base = reuse > f->omax ? reuse : f->omax;
    t->reuse = reuse;
    t->ttft0 = prefill_steps(c, own, &t->steps0);
    t->stall_time = prefill_time(c, own);
    t->cache_time = poly(c->prefill_ms, (double)cold) - c->prefill_ms[0];
    t->share = f->share_w > 0 && f->hmax > base;
    t->share_cost = 0;
    if (t->share) {
        double dup = (double)(f->hmax - base) * c->block_size;
        t->share_cost = f->share_w * (poly(c->prefill_ms, dup) - c->prefill_ms[0]);
    }
}

/* The terms for `reuse`, from memo or computed into it. */
static inline const struct reuse_terms *reuse_terms(const struct kvr_router *r,
                                                    struct reuse_terms *memo, uint32_t reuse,
                                                    uint32_t ntokens, const struct fleet_prefix *f)
{
    /* top bits of a multiplicative hash: reuse values are often multiples of a power of 2 */
    struct reuse_terms *t = &memo[(uint32_t)(reuse * 0x9E3779B1u) >> 28];
    if (__builtin_expect(t->reuse != reuse, 0))
        reuse_terms_fill(r, t, reuse, ntokens, f);
    return t;
}

/*
 * The figures of the time model that stay constant through one decision, copied once: the
 * per-worker loop then keeps them in registers (its stores into the router's cost and eligible
 * arrays could alias the configuration, so the compiler would reload it for every worker).
 */
struct cost_consts {
    const struct kvr_router_config *c; /* for the rare prefill of several steps */
    double decode_ms[3];               /* c->decode_ms */
    double stall_weight;               /* c->stall_weight */
    double ow_cache;                   /* ow x c->cache_weight */
    double own_decode;                 /* c->decode_weight x the output predicted of max_tokens */
    double pshare_scale;               /* a worker's prefill load to its share (kvr_pshare_scale) */
};

static inline void cost_consts_init(struct cost_consts *k, const struct kvr_router *r, double ow,
                                    uint32_t max_tokens, uint64_t now)
{
    k->c = &r->cfg;
    for (int i = 0; i < 3; i++)
        k->decode_ms[i] = r->cfg.decode_ms[i];
    k->stall_weight = r->cfg.stall_weight;
    k->ow_cache = ow * r->cfg.cache_weight;
    k->own_decode = r->cfg.decode_weight > 0
                        ? r->cfg.decode_weight * kvr_outlen_predict(&r->outlen, max_tokens)
                        : 0;
    k->pshare_scale = k->own_decode > 0 ? kvr_pshare_scale(&r->psh, now) : 0;
}

/*
 * The time model's price of a worker with the in-flight figures aw, the hot entry h and `count`
 * entries in the index, for prefill tokens (its queue and ours) and decode blocks, t the terms of
 * its reuse: predicted TTFT, plus what the choice costs others. The requests decoding there wait
 * for our prefill's steps: each of them is delayed by its time, charged stall_weight times; then
 * the cache and share terms (reuse_terms); and, with decode_weight, the request's own decode: the
 * output expected of its max_tokens (kvr_outlen_predict), a step each at the worker's decode step
 * with its blocks booked (a long generation is slowed by every block the worker holds, a short
 * one hardly), stretched by the share of the worker's time its prefills take (pload: the slot's
 * kvr_pshare load; the prefills that keep arriving there run in its decode's steps too). Reads
 * only the compact per-slot arrays.
 */
static inline double time_cost(const struct cost_consts *k, const struct kvr_active_worker *aw,
                               const struct kvr_worker_hot *h, const uint32_t *count,
                               uint64_t prefill, uint64_t decode, const struct reuse_terms *t,
                               double pload)
{
    static_assert(REUSE_MEMO == 16u, "reuse_terms indexes with the top 4 bits");
    double inv = h->inv_capacity; /* 0 when the capacity is unknown */
    double u = (double)decode * inv;
    double fill = inv > 0 ? (double)*count * inv : 1.0;
    uint64_t steps = t->steps0;
    double ms = aw->prefill ? prefill_steps(k->c, prefill, &steps) : t->ttft0;
    double cost = ttft_decode(k->decode_ms, ms, steps, u, aw->nreqs > 0) +
                  k->stall_weight * (double)aw->nreqs * t->stall_time +
                  k->ow_cache * (fill > 1.0 ? 1.0 : fill) * t->cache_time;
    if (t->share)
        cost += t->share_cost;
    if (k->own_decode > 0) {
        double d = poly(k->decode_ms, u);
        cost += k->own_decode * (d < 1.0 ? 1.0 : d) / kvr_pshare_left(pload, k->pshare_scale);
    }
    return cost;
}

#endif
