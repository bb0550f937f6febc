/*
 * Workload generation and trace loading. Every token id is a pure function of (seed, what the
 * token belongs to, its position), so equal prefixes always give equal tokens and a run can be
 * reproduced from its seed alone.
 */
#include "workload.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "kvr/rng.h"

#define VOCAB           128000u
#define SEED_FAMILIES   10u
#define SEED_PREFIX     3500u
#define SEED_ISL        7000u
#define SEED_OSL        100u
#define BURST_GROUP     16u
#define BURST_PREFIX    4096u
#define BURST_SUFFIX    256u
#define BURST_OSL       128u
#define BURST_GAP_NS    1000000000ull /* mean gap between groups at load 1 */
#define BURST_SPREAD_NS 1000000ull    /* a group arrives within 1 ms */

static const struct {
    const char *name;
    enum kvr_workload_kind kind;
} known[] = {
    {"seed", KVR_WL_SEED},   {"seed-isl", KVR_WL_SEED_ISL},  {"seed-osl", KVR_WL_SEED_OSL},
    {"burst", KVR_WL_BURST}, {"conversation", KVR_WL_TRACE}, {"synthetic", KVR_WL_TRACE},
};

bool kvr_workload_known(const char *name, bool *is_trace)
{
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (!strcmp(name, known[i].name)) {
            if (is_trace)
                *is_trace = known[i].kind == KVR_WL_TRACE;
            return true;
        }
    }
    return false;
}

static uint32_t token_of(uint64_t seed, uint64_t owner, uint64_t pos)
{
    return (uint32_t)(kvr_mix64(kvr_mix64(seed ^ owner) + pos) % VOCAB);
}

/* Insertion sort by arrival, stable: arrivals are nearly sorted, each only a little late. */
static void sort_arrivals(struct kvr_workload *w)
{
    for (uint32_t i = 1; i < w->nreqs; i++) {
        struct kvr_wl_request x = w->reqs[i];
        uint32_t j = i;
        for (; j > 0 && w->reqs[j - 1].arrival_ns > x.arrival_ns; j--)
            w->reqs[j] = w->reqs[j - 1];
        w->reqs[j] = x;
    }
}

kvr_status kvr_workload_generate(struct kvr_workload *w, const char *name, uint32_t n,
                                 uint64_t seed)
{
    memset(w, 0, sizeof *w);
    bool is_trace;
    if (!kvr_workload_known(name, &is_trace) || is_trace)
        return KVR_ERR_INVALID;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(name, known[i].name))
            w->kind = known[i].kind;
    w->name = name;
    w->seed = seed;
    if (!n)
        n = w->kind == KVR_WL_BURST ? 100 * BURST_GROUP : 1000;
    w->reqs = calloc(n, sizeof *w->reqs);
    if (!w->reqs)
        return KVR_ERR_NOMEM;
    w->nreqs = n;
    struct kvr_rng rng;
    kvr_rng_seed(&rng, seed);
    uint64_t group_t = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct kvr_wl_request *r = &w->reqs[i];
        if (w->kind == KVR_WL_BURST) {
            if (i % BURST_GROUP == 0) /* exponential gaps: Poisson group arrivals */
                group_t += (uint64_t)(-log1p(-kvr_rng_double(&rng)) * BURST_GAP_NS);
            r->arrival_ns = group_t + kvr_rng_below(&rng, BURST_SPREAD_NS);
            r->family = i / BURST_GROUP;
            r->prefix = BURST_PREFIX;
            r->isl = BURST_PREFIX + BURST_SUFFIX;
            r->osl = BURST_OSL;
            continue;
        }
        r->arrival_ns = KVR_CLOSED_LOOP;
        r->family = (uint32_t)kvr_rng_below(&rng, SEED_FAMILIES);
        r->prefix = SEED_PREFIX;
        r->isl = SEED_ISL;
        r->osl = SEED_OSL;
        if (w->kind == KVR_WL_SEED_ISL)
            r->isl = SEED_PREFIX + (uint32_t)kvr_rng_below(&rng, 2 * (SEED_ISL - SEED_PREFIX) + 1);
        if (w->kind == KVR_WL_SEED_OSL)
            r->osl = 1 + (uint32_t)kvr_rng_below(&rng, 2 * SEED_OSL);
    }
    if (w->kind == KVR_WL_BURST) /* arrivals within a group are jittered: keep them sorted */
        sort_arrivals(w);
    return KVR_OK;
}

void kvr_workload_spread(struct kvr_workload *w, uint64_t spread_ns)
{
    if (!spread_ns || !w->nreqs || w->reqs[0].arrival_ns == KVR_CLOSED_LOOP)
        return;
    struct kvr_rng rng;
    kvr_rng_seed(&rng, w->seed ^ 0x737072656164ull); /* "spread" */
    for (uint32_t i = 0; i < w->nreqs; i++)
        w->reqs[i].arrival_ns += kvr_rng_below(&rng, spread_ns);
    sort_arrivals(w);
}

void kvr_workload_free(struct kvr_workload *w)
{
    free(w->reqs);
    free(w->ids);
    memset(w, 0, sizeof *w);
}

void kvr_workload_tokens(const struct kvr_workload *w, uint32_t i, uint32_t *out)
{
    const struct kvr_wl_request *r = &w->reqs[i];
    if (w->kind == KVR_WL_TRACE) {
        const uint32_t *ids = w->ids + r->family;
        for (uint32_t t = 0; t < r->isl; t++)
            out[t] =
                token_of(w->seed, (uint64_t)ids[t / KVR_TRACE_BLOCK] << 1, t % KVR_TRACE_BLOCK);
        return;
    }
    uint32_t prefix = r->prefix < r->isl ? r->prefix : r->isl;
    for (uint32_t t = 0; t < prefix; t++)
        out[t] = token_of(w->seed, ((uint64_t)r->family << 1) | 1, t);
    for (uint32_t t = prefix; t < r->isl; t++)
        out[t] = token_of(w->seed, ((uint64_t)i << 20) ^ 0x5eedull, t);
}

/* The unsigned number after "key": in line; false when absent or malformed. */
/* The number after key in line (at least 0, at most 1.8e19). */
static bool json_num(const char *line, const char *key, double *out)
{
    const char *p = strstr(line, key);
    if (!p)
        return false;
    p += strlen(key);
    while (*p == ' ' || *p == '"' || *p == ':')
        p++;
    if (*p < '0' || *p > '9')
        return false;
    char *end;
    errno = 0;
    double v = strtod(p, &end);
    if (errno || end == p || !(v >= 0 && v <= 1.8e19))
        return false;
    *out = v;
    return true;
}

/* The same, a whole number (a length: 1583.5 tokens is no length). */
static bool json_uint(const char *line, const char *key, uint64_t *out)
{
    double v;
    if (!json_num(line, key, &v) || v != floor(v))
        return false;
    *out = (uint64_t)v;
    return true;
}

/* Append the ints of "hash_ids": [...] to the pool; returns how many, or -1. */
static long json_ids(const char *line, uint32_t **pool, uint64_t *npool, uint32_t *cap)
{
    const char *p = strstr(line, "\"hash_ids\"");
    if (!p || !(p = strchr(p, '[')))
        return -1;
    p++;
    long n = 0;
    for (;;) {
        while (*p == ' ')
            p++;
        if (*p == ']')
            return n;
        char *end;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || errno || v > UINT32_MAX || *p == '-')
            return -1;
        if (*npool >= UINT32_MAX || !KVR_GROW(*pool, *cap, (uint32_t)*npool + 1, 1u << 16))
            return -1;
        (*pool)[(*npool)++] = (uint32_t)v;
        n++;
        p = end;
        while (*p == ' ')
            p++;
        if (*p == ',')
            p++;
        else if (*p != ']')
            return -1;
    }
}

/* Arrivals relative to the earliest, so the run starts with the first request, not with the
 * trace's epoch (Unix-time timestamps would leave decades of empty time before it). */
static void start_at_zero(struct kvr_workload *w)
{
    uint64_t first = UINT64_MAX;
    for (uint32_t i = 0; i < w->nreqs; i++)
        if (w->reqs[i].arrival_ns < first)
            first = w->reqs[i].arrival_ns;
    for (uint32_t i = 0; i < w->nreqs; i++)
        w->reqs[i].arrival_ns -= first;
}

kvr_status kvr_workload_load_trace(struct kvr_workload *w, const char *name, const char *path,
                                   uint32_t n, uint64_t seed, uint64_t *bad_line)
{
    memset(w, 0, sizeof *w);
    w->kind = KVR_WL_TRACE;
    w->name = name;
    w->seed = seed;
    FILE *f = fopen(path, "r");
    if (!f)
        return KVR_ERR_IO;
    kvr_status st = KVR_OK;
    uint32_t cap = 0, idcap = 0;
    uint64_t lineno = 0;
    char *line = NULL;
    size_t linecap = 0;
    while ((!n || w->nreqs < n) && getline(&line, &linecap, f) > 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == strlen(line))
            continue;
        double ts; /* milliseconds, a fraction kept */
        uint64_t isl, osl;
        uint64_t first = w->nids;
        long nids;
        if (!json_num(line, "\"timestamp\"", &ts) || !json_uint(line, "\"input_length\"", &isl) ||
            !json_uint(line, "\"output_length\"", &osl) ||
            (nids = json_ids(line, &w->ids, &w->nids, &idcap)) < 0 || isl == 0 ||
            isl > UINT32_MAX || osl == 0 || osl > UINT32_MAX ||
            ts >= (double)(UINT64_MAX / 1000000ull) || /* ms that would wrap in nanoseconds */
            (uint64_t)nids != (isl + KVR_TRACE_BLOCK - 1) / KVR_TRACE_BLOCK || first > UINT32_MAX) {
            st = KVR_ERR_MALFORMED;
            if (bad_line)
                *bad_line = lineno;
            break;
        }
        if (osl > KVR_WL_MAX_OUTPUT) {
            st = KVR_ERR_MAX_TOKENS_TOO_LARGE;
            if (bad_line)
                *bad_line = lineno;
            break;
        }
        if (w->nreqs == UINT32_MAX || !KVR_GROW(w->reqs, cap, w->nreqs + 1, 1024)) {
            st = KVR_ERR_NOMEM;
            break;
        }
        struct kvr_wl_request *r = &w->reqs[w->nreqs++];
        r->arrival_ns = (uint64_t)(ts * 1e6 + 0.5); /* under 2^64: checked above */
        r->isl = (uint32_t)isl;
        r->osl = (uint32_t)osl;
        r->family = (uint32_t)first;
        r->nids = (uint32_t)nids;
        r->prefix = 0;
    }
    free(line);
    fclose(f);
    if (st == KVR_OK && w->nreqs == 0)
        st = KVR_ERR_MALFORMED;
    if (st == KVR_OK)
        start_at_zero(w);
    if (st != KVR_OK)
        kvr_workload_free(w);
    return st;
}

uint64_t kvr_workload_group(const struct kvr_workload *w, uint32_t i)
{
    const struct kvr_wl_request *r = &w->reqs[i];
    if (w->kind != KVR_WL_TRACE)
        return r->family;
    return r->nids ? w->ids[r->family] : UINT64_MAX;
}
