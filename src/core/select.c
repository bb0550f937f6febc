/*
 * kvr_select implementation: one small function per policy. Candidates are visited in registry
 * order and ties are broken with a reservoir draw from the seeded generator, so equal seeds and
 * equal inputs give equal choices.
 */
#include "select.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "map.h"

void kvr_select_init(struct kvr_select_state *s, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    kvr_rng_seed(&s->rng, seed);
}

void kvr_select_free(struct kvr_select_state *s)
{
    free(s->ring);
    free(s->weights);
    memset(s, 0, sizeof *s);
}

static int cmp_point(const void *a, const void *b)
{
    const struct kvr_ring_point *x = a, *y = b;
    if (x->hash != y->hash)
        return x->hash < y->hash ? -1 : 1;
    return (x->slot > y->slot) - (x->slot < y->slot);
}

kvr_status kvr_select_ring(struct kvr_select_state *s, const uint64_t *ids, const uint32_t *slots,
                           uint32_t n, uint32_t vnodes)
{
    if (vnodes == 0)
        vnodes = 1;
    size_t np = (size_t)n * vnodes;
    struct kvr_ring_point *ring = np ? malloc(np * sizeof *ring) : NULL;
    if (np && !ring)
        return KVR_ERR_NOMEM;
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t v = 0; v < vnodes; v++) {
            ring[(size_t)i * vnodes + v].hash = kvr_mix64(ids[i] ^ kvr_mix64(v + 1));
            ring[(size_t)i * vnodes + v].slot = slots[i];
        }
    }
    qsort(ring, np, sizeof *ring, cmp_point);
    free(s->ring);
    s->ring = ring;
    s->nring = (uint32_t)np;
    return KVR_OK;
}

typedef double (*score_fn)(const struct kvr_candidate *c, const void *arg);

/* Position in eligible of the lowest score; ties random. */
static uint32_t argmin(struct kvr_select_state *s, const struct kvr_candidate *cands,
                       const uint32_t *eligible, uint32_t n, score_fn score, const void *arg)
{
    assert(n >= 1);
    uint32_t best = 0, ties = 1;
    double bs = score(&cands[eligible[0]], arg);
    for (uint32_t i = 1; i < n; i++) {
        double v = score(&cands[eligible[i]], arg);
        if (v < bs) {
            best = i;
            bs = v;
            ties = 1;
        } else if (v == bs && kvr_select_take_tie(s, &ties)) {
            best = i;
        }
    }
    return best;
}

static double score_inflight(const struct kvr_candidate *c, const void *arg)
{
    (void)arg;
    return c->inflight;
}

static double score_neg_overlap(const struct kvr_candidate *c, const void *arg)
{
    (void)arg;
    return -(double)c->overlap_blocks;
}

static uint32_t kv_min(struct kvr_select_state *s, double margin, uint64_t request,
                       const uint64_t *ids, const double *costs, const uint32_t *slots,
                       const uint32_t *cached, const uint32_t *eligible, uint32_t n)
{
    assert(n >= 1 && (margin <= 0 || ids));
    struct kvr_kv_choice b;
    kvr_kv_choice_init(&b);
    uint32_t best = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t e = eligible[i];
        double c = margin > 0 ? kvr_kv_key(margin, costs[e], request, ids[e]) : costs[e];
        if (c > b.cost)
            continue; /* the common case, before reading its cached blocks */
        if (kvr_kv_offer(s, &b, c, cached[slots[e]]))
            best = i;
    }
    return best;
}

uint32_t kvr_select_kv(struct kvr_select_state *s, double temperature, double margin,
                       uint64_t request, const uint64_t *ids, const double *costs,
                       const uint32_t *slots, const uint32_t *cached, const uint32_t *eligible,
                       uint32_t n)
{
    if (temperature <= 0 || n == 1)
        return kv_min(s, n == 1 ? 0 : margin, request, ids, costs, slots, cached, eligible, n);
    double lo = costs[eligible[0]], hi = lo;
    for (uint32_t i = 1; i < n; i++) {
        double c = costs[eligible[i]];
        lo = c < lo ? c : lo;
        hi = c > hi ? c : hi;
    }
    if (hi == lo)
        return (uint32_t)kvr_rng_below(&s->rng, n);
    if (!KVR_GROW(s->weights, s->nweights, n, 64))
        return kv_min(s, margin, request, ids, costs, slots, cached, eligible, n);
    double scale = (hi - lo) * temperature, total = 0;
    if (!(scale > 0)) /* underflowed (a denormal temperature): the cheapest weighs 0 / 0 */
        return kv_min(s, margin, request, ids, costs, slots, cached, eligible, n);
    for (uint32_t i = 0; i < n; i++) {
        s->weights[i] = exp(-(costs[eligible[i]] - lo) / scale);
        total += s->weights[i];
    }
    double x = kvr_rng_double(&s->rng) * total;
    for (uint32_t i = 0; i < n; i++) {
        x -= s->weights[i];
        if (x < 0)
            return i;
    }
    return n - 1;
}

static double score_cost(const struct kvr_candidate *c, const void *arg)
{
    (void)arg;
    return c->cost;
}

static uint32_t pick_p2c(struct kvr_select_state *s, const struct kvr_candidate *cands,
                         const uint32_t *eligible, uint32_t n)
{
    if (n == 1)
        return 0;
    uint32_t a = (uint32_t)kvr_rng_below(&s->rng, n);
    uint32_t b = (uint32_t)kvr_rng_below(&s->rng, n - 1);
    if (b >= a)
        b++;
    return cands[eligible[b]].inflight < cands[eligible[a]].inflight ? b : a;
}

static uint32_t pick_sglang(struct kvr_select_state *s, const struct kvr_router_config *cfg,
                            const struct kvr_select_input *in, const struct kvr_candidate *cands,
                            const uint32_t *eligible, uint32_t n)
{
    uint32_t lo = cands[eligible[0]].inflight, hi = lo;
    for (uint32_t i = 1; i < n; i++) {
        uint32_t l = cands[eligible[i]].inflight;
        lo = l < lo ? l : lo;
        hi = l > hi ? l : hi;
    }
    bool imbalanced = hi - lo > cfg->sglang_balance_abs && hi > cfg->sglang_balance_rel * lo;
    if (!imbalanced && in->prompt_blocks) {
        uint32_t best = argmin(s, cands, eligible, n, score_neg_overlap, NULL);
        double match = (double)cands[eligible[best]].overlap_blocks / in->prompt_blocks;
        if (match > cfg->sglang_cache_threshold)
            return best;
    }
    return argmin(s, cands, eligible, n, score_inflight, NULL);
}

struct llmd_arg {
    const struct kvr_router_config *cfg;
    uint32_t qmin, qmax, prompt_blocks;
};

static double score_llmd(const struct kvr_candidate *c, const void *arg)
{
    const struct llmd_arg *a = arg;
    double queue = a->qmax == a->qmin ? 1.0 : (double)(a->qmax - c->waiting) / (a->qmax - a->qmin);
    double kv_free = 1.0 - c->kv_usage;
    double prefix = a->prompt_blocks ? (double)c->overlap_blocks / a->prompt_blocks : 0.0;
    /* negated: argmin picks the highest score */
    return -(a->cfg->llmd_w_queue * queue + a->cfg->llmd_w_kv * kv_free +
             a->cfg->llmd_w_prefix * prefix);
}

static uint32_t pick_llmd(struct kvr_select_state *s, const struct kvr_router_config *cfg,
                          const struct kvr_select_input *in, const struct kvr_candidate *cands,
                          const uint32_t *eligible, uint32_t n)
{
    struct llmd_arg a = {cfg, cands[eligible[0]].waiting, cands[eligible[0]].waiting,
                         in->prompt_blocks};
    for (uint32_t i = 1; i < n; i++) {
        uint32_t q = cands[eligible[i]].waiting;
        a.qmin = q < a.qmin ? q : a.qmin;
        a.qmax = q > a.qmax ? q : a.qmax;
    }
    return argmin(s, cands, eligible, n, score_llmd, &a);
}

static uint32_t pick_chwbl(struct kvr_select_state *s, const struct kvr_router_config *cfg,
                           const struct kvr_select_input *in, const struct kvr_candidate *cands,
                           const uint32_t *eligible, uint32_t n)
{
    if (!s->nring || !in->slot_cand)
        return argmin(s, cands, eligible, n, score_inflight, NULL);
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        total += cands[eligible[i]].inflight;
    double bound = ceil(cfg->chwbl_load_factor * (double)(total + 1) / n);
    uint32_t lo = 0, hi = s->nring; /* first point with hash >= key */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (s->ring[mid].hash < in->first_hash)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (uint32_t k = 0; k < s->nring; k++) {
        uint32_t c = in->slot_cand[s->ring[(lo + k) % s->nring].slot];
        if (c != KVR_NIL && cands[eligible[c]].inflight + 1 <= bound)
            return c;
    }
    return argmin(s, cands, eligible, n, score_inflight, NULL);
}

uint32_t kvr_select(struct kvr_select_state *s, const struct kvr_router_config *cfg,
                    const struct kvr_select_input *in, const struct kvr_candidate *cands,
                    const uint32_t *eligible, uint32_t n)
{
    assert(n >= 1);
    switch (in->policy) {
    case KVR_POLICY_RANDOM:
        return (uint32_t)kvr_rng_below(&s->rng, n);
    case KVR_POLICY_ROUND_ROBIN:
        return (uint32_t)(s->rr_next++ % n);
    case KVR_POLICY_LEAST_LOADED:
        return argmin(s, cands, eligible, n, score_inflight, NULL);
    case KVR_POLICY_POWER_OF_TWO:
        return pick_p2c(s, cands, eligible, n);
    case KVR_POLICY_PREFIX_ONLY:
        return argmin(s, cands, eligible, n, score_neg_overlap, NULL);
    case KVR_POLICY_SGLANG:
        return pick_sglang(s, cfg, in, cands, eligible, n);
    case KVR_POLICY_LLMD:
        return pick_llmd(s, cfg, in, cands, eligible, n);
    case KVR_POLICY_CHWBL:
        return pick_chwbl(s, cfg, in, cands, eligible, n);
    case KVR_POLICY_KV: /* the router uses kvr_select_kv; this is only a fallback */
    case KVR_POLICY_COUNT:
        break;
    }
    return argmin(s, cands, eligible, n, score_cost, NULL);
}
