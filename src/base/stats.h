/*
 * Summary statistics of a sample, with one definition of a quantile for every report of the
 * project (kvsim, kvbench): the q-quantile of n sorted values is v[floor(q * (n - 1))], the
 * nearest rank below. Pure; no state.
 */
#ifndef KVR_STATS_H
#define KVR_STATS_H

#include <stddef.h>
#include <stdint.h>

struct kvr_stat {
    double mean, p50, p90, p99, max; /* in the sample's unit; all 0 for an empty sample */
};

/* The q-quantile (0 <= q <= 1) of v[0..n) sorted ascending; 0 when n is 0. */
double kvr_quantile_sorted(const double *v, size_t n, double q);

/* Sort v[0..n) in place and summarise it. */
struct kvr_stat kvr_stat_of(double *v, size_t n);

/* Sort v[0..n) ascending in place. */
void kvr_sort_doubles(double *v, size_t n);

/* The same for 64-bit keys (request keys, worker ids). */
void kvr_sort_u64(uint64_t *v, size_t n);

#endif
