/*
 * Summary statistics.
 */
#include "stats.h"

#include <stdlib.h>

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

void kvr_sort_doubles(double *v, size_t n)
{
    if (n > 1)
        qsort(v, n, sizeof *v, cmp_double);
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a > b) - (a < b);
}

void kvr_sort_u64(uint64_t *v, size_t n)
{
    if (n > 1)
        qsort(v, n, sizeof *v, cmp_u64);
}

double kvr_quantile_sorted(const double *v, size_t n, double q)
{
    if (!n)
        return 0;
    q = q < 0 ? 0 : q > 1 ? 1 : q;
    return v[(size_t)(q * (double)(n - 1))];
}

struct kvr_stat kvr_stat_of(double *v, size_t n)
{
    struct kvr_stat s = {0, 0, 0, 0, 0};
    if (!n)
        return s;
    kvr_sort_doubles(v, n);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    s.mean = sum / (double)n;
    s.p50 = kvr_quantile_sorted(v, n, 0.50);
    s.p90 = kvr_quantile_sorted(v, n, 0.90);
    s.p99 = kvr_quantile_sorted(v, n, 0.99);
    s.max = v[n - 1];
    return s;
}
