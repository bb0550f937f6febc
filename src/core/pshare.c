/* The prefill share of each worker's time (pshare.h). */
#include "pshare.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void kvr_pshare_init(struct kvr_pshare *p, uint64_t window_ns, double speedup)
{
    memset(p, 0, sizeof *p);
    assert(speedup > 0);
    if (window_ns) {
        p->per_ns = speedup / (double)window_ns;
        p->inv_ms = 1e6 / (double)window_ns; /* the sums are the model's ms, as the window */
    }
}

void kvr_pshare_free(struct kvr_pshare *p)
{
    free(p->load);
    p->load = NULL;
    p->nslots = 0;
}

kvr_status kvr_pshare_reserve(struct kvr_pshare *p, uint32_t nslots)
{
    if (nslots <= p->nslots)
        return KVR_OK;
    double *load = realloc(p->load, (size_t)nslots * sizeof *load);
    if (!load)
        return KVR_ERR_NOMEM;
    for (uint32_t i = p->nslots; i < nslots; i++)
        load[i] = 0;
    p->load = load;
    p->nslots = nslots;
    return KVR_OK;
}

void kvr_pshare_clear(struct kvr_pshare *p, uint32_t slot)
{
    assert(slot < p->nslots);
    p->load[slot] = 0;
}

/* The exponent of the decay at now: (now - epoch) / window; 0 for a time before the epoch (a
 * caller's clock that stepped back reads as the epoch's). */
static double exponent(const struct kvr_pshare *p, uint64_t now)
{
    return now > p->epoch ? (double)(now - p->epoch) * p->per_ns : 0.0;
}

void kvr_pshare_add(struct kvr_pshare *p, uint32_t slot, double ms, uint64_t now)
{
    assert(slot < p->nslots && ms >= 0);
    if (p->per_ns <= 0)
        return;
    double x = exponent(p, now);
    if (x > KVR_PSHARE_REBASE) { /* move the epoch to now */
        double f = exp(-x);
        for (uint32_t i = 0; i < p->nslots; i++)
            p->load[i] *= f; /* underflows to 0 after ~700 windows: nothing left of them */
        p->epoch = now;
        x = 0;
    }
    p->load[slot] += ms * exp(x);
}

void kvr_pshare_sub(struct kvr_pshare *p, uint32_t slot, double ms, uint64_t at)
{
    assert(slot < p->nslots && ms >= 0);
    if (p->per_ns <= 0)
        return;
    /* its weight now: signed, as the epoch may have moved past it since (then it has faded) */
    double x =
        at >= p->epoch ? (double)(at - p->epoch) * p->per_ns : -(double)(p->epoch - at) * p->per_ns;
    double left = p->load[slot] - ms * exp(x > KVR_PSHARE_REBASE ? KVR_PSHARE_REBASE : x);
    p->load[slot] = left > 0 ? left : 0;
}

double kvr_pshare_scale(const struct kvr_pshare *p, uint64_t now)
{
    if (p->per_ns <= 0)
        return 0;
    return exp(-exponent(p, now)) * p->inv_ms;
}
