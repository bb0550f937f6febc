/*
 * kvr_pshare: the share of each worker's time that the prefills booked on it lately take. Every
 * engine step that carries a prefill also carries the decodes of the requests running there, so a
 * request decoding on a worker that keeps receiving prefills gets a token per step of
 * prefill(T) + decode(u), not of decode(u): at a prefill share s of the worker's time, its decode
 * takes 1 / (1 - s) times what the decode steps alone would (docs/architecture.md, "The kv cost").
 *
 * Per worker slot, the prefill time (the timing model's ms) of every request booked there, each
 * decayed by exp(-age / window), is summed; that sum over the window is the share of the worker's
 * time its prefills take at their recent rate. The decay is kept against one epoch for all slots:
 * a slot holds sum(ms_i * exp((t_i - epoch) / window)), so pricing any number of workers at one
 * time takes one exp (kvr_pshare_scale), and a multiply and a division per worker. The epoch moves
 * up (every slot rescaled) when a booking's exponent would pass KVR_PSHARE_REBASE. Times are the
 * router's clock (ns); speedup says how many times faster than the timing model the engines run (a
 * simulated fleet's --speedup), so the window is measured in the model's time. Pure, no I/O;
 * single-threaded: the router's state thread.
 */
#ifndef KVR_PSHARE_H
#define KVR_PSHARE_H

#include <stdint.h>

#include "kvr/status.h"

#define KVR_PSHARE_MAX    0.8  /* a share is read as at most this (a decode at most 5x slower) */
#define KVR_PSHARE_REBASE 32.0 /* the epoch moves when an exponent would pass this */

struct kvr_pshare {
    double *load;    /* per slot: sum of ms_i * exp((t_i - epoch) / window) */
    uint32_t nslots; /* room in load */
    uint64_t epoch;  /* ns, the router's clock */
    double per_ns;   /* speedup / window_ns: the decay's rate on the router's clock; 0: off */
    double inv_ms;   /* 1 / the window, ms (the model's, like the sums) */
};

/* Start empty, off when window_ns is 0; speedup > 0. */
void kvr_pshare_init(struct kvr_pshare *p, uint64_t window_ns, double speedup);
void kvr_pshare_free(struct kvr_pshare *p);

/* Room for nslots slots (new ones empty). KVR_ERR_NOMEM on failure (the old room kept). */
kvr_status kvr_pshare_reserve(struct kvr_pshare *p, uint32_t nslots);

/* A worker takes slot: nothing booked there yet. */
void kvr_pshare_clear(struct kvr_pshare *p, uint32_t slot);

/* A prefill of ms (the timing model's) was booked on slot at now. Nothing when off. */
void kvr_pshare_add(struct kvr_pshare *p, uint32_t slot, double ms, uint64_t now);

/* A prefill of ms booked on slot at `at` (kvr_pshare_add's arguments then) is withdrawn: what is
 * left of it is taken back (the load never goes below 0). Nothing when off. */
void kvr_pshare_sub(struct kvr_pshare *p, uint32_t slot, double ms, uint64_t at);

/* What a slot's load is multiplied by to give its share at now (0 when off): one exp. */
double kvr_pshare_scale(const struct kvr_pshare *p, uint64_t now);

/* The divisor of a decode step on a slot of this load at kvr_pshare_scale's scale:
 * 1 - min(share, KVR_PSHARE_MAX); exactly 1 when off or when nothing was booked there. */
static inline double kvr_pshare_left(double load, double scale)
{
    double s = load * scale;
    return 1.0 - (s < KVR_PSHARE_MAX ? s : KVR_PSHARE_MAX);
}

#endif
