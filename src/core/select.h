/*
 * kvr_select: the policies (ROUTING.md sections 4 and 5) as pure choices over a list of
 * candidates the router has already filled with overlaps, loads and kv costs. Every policy runs
 * on the same inputs, so comparisons between them measure the rule and nothing else. All
 * randomness comes from the caller's seeded kvr_rng. Single-threaded.
 */
#ifndef KVR_SELECT_H
#define KVR_SELECT_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvr/rng.h"
#include "kvr/router.h"

struct kvr_ring_point {
    uint64_t hash; /* position on the ring */
    uint32_t slot; /* worker slot */
};

struct kvr_select_state {
    struct kvr_rng rng;          /* every random choice */
    uint64_t rr_next;            /* round_robin cursor */
    struct kvr_ring_point *ring; /* chwbl ring, sorted by hash, owned */
    uint32_t nring;              /* points on the ring */
    double *weights;             /* scratch for temperature sampling, owned */
    uint32_t nweights;           /* room in weights */
};

/* What one selection needs besides the candidates. */
struct kvr_select_input {
    enum kvr_policy policy;
    uint32_t prompt_blocks;    /* full blocks of the prompt */
    uint64_t first_hash;       /* chwbl key: the prompt's first block (or whole-prompt) hash */
    const uint32_t *slot_cand; /* chwbl: worker slot -> index in eligible, or KVR_NIL */
    const uint32_t *slots;     /* worker slot of each candidate */
};

void kvr_select_init(struct kvr_select_state *s, uint64_t seed);
void kvr_select_free(struct kvr_select_state *s);

/* Rebuild the chwbl ring for workers ids[i] in slots[i], i < n. */
kvr_status kvr_select_ring(struct kvr_select_state *s, const uint64_t *ids, const uint32_t *slots,
                           uint32_t n, uint32_t vnodes);

/*
 * The kv policy over plain arrays (its hot path reads nothing else): the lowest key among
 * c = eligible[0..n) (n >= 1), the key being costs[c] (kvr_kv_key of request and ids[c] when
 * margin > 0); ties go to the fewest cached[slots[c]], then to a random draw; with temperature
 * > 0, c is drawn with probability proportional to exp(-(cost - min) / ((max - min) *
 * temperature)). ids may be NULL when margin is 0. Returns a position in eligible.
 */
uint32_t kvr_select_kv(struct kvr_select_state *s, double temperature, double margin,
                       uint64_t request, const uint64_t *ids, const double *costs,
                       const uint32_t *slots, const uint32_t *cached, const uint32_t *eligible,
                       uint32_t n);

/*
 * The key a kv candidate (worker id, cost >= 0) competes with for request: the cost itself, or
 * with a tie margin m > 0 the cost times 1 + m x u, u in [0, 1) a hash of the request and the
 * worker, so that among workers priced within about m of each other the choice is spread, the
 * cheaper the likelier. Routers that share a queue group decide different requests of the same
 * instant on the same state, each without the others' bookings of that instant: with the exact
 * minimum they would all send them to the same worker (docs/architecture.md, "Scoring and
 * selection"). Drawn from the request rather than a router's own random stream, the same request
 * decided by two routers on the same state (a client's resend reaching another router) still
 * goes to the same worker, which absorbs the copy. A key is at least its cost, so a floor under
 * the cost bounds it too.
 */
static inline double kvr_kv_key(double margin, double cost, uint64_t request, uint64_t worker)
{
    if (margin <= 0)
        return cost;
    double u = (double)(kvr_mix64(request ^ kvr_mix64(worker)) >> 11) * 0x1p-53;
    return cost * (1.0 + margin * u);
}

/* Reservoir tie-break: the k-th equal candidate replaces the choice with probability 1/k. */
static inline bool kvr_select_take_tie(struct kvr_select_state *s, uint32_t *ties)
{
    ++*ties;
    return kvr_rng_below(&s->rng, *ties) == 0;
}

/*
 * The kv policy's running choice, one candidate offered at a time (kvr_select_kv's rule: the
 * lowest cost, then the fewest cached blocks, then a reservoir draw among those still equal), for
 * a caller that visits only some of the workers.
 */
struct kvr_kv_choice {
    double cost;     /* the choice's cost; INFINITY before the first offer */
    uint32_t cached; /* its cached blocks */
    uint32_t ties;   /* candidates equal to it so far; 0 before the first offer */
};

static inline void kvr_kv_choice_init(struct kvr_kv_choice *b)
{
    b->cost = INFINITY;
    b->cached = UINT32_MAX;
    b->ties = 0;
}

/* Offer a candidate of cost and cached blocks; returns whether it is now the choice. */
static inline bool kvr_kv_offer(struct kvr_select_state *s, struct kvr_kv_choice *b, double cost,
                                uint32_t cached)
{
    if (cost > b->cost)
        return false;
    if (cost < b->cost || b->ties == 0 || cached < b->cached) {
        b->cost = cost;
        b->cached = cached;
        b->ties = 1;
        return true;
    }
    if (cached > b->cached)
        return false;
    return kvr_select_take_tie(s, &b->ties);
}

/*
 * The baseline policies: choose among cands[eligible[0..n)] (n >= 1); returns a position in
 * eligible. cfg supplies their knobs. (kv goes through kvr_select_kv.)
 */
uint32_t kvr_select(struct kvr_select_state *s, const struct kvr_router_config *cfg,
                    const struct kvr_select_input *in, const struct kvr_candidate *cands,
                    const uint32_t *eligible, uint32_t n);

#endif
