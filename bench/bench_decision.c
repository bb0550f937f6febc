/*
 * Decision microbenchmark (BENCHMARKS.md "Router cost"): the time of one full decision (hash,
 * overlap walk, potential loads, select, book) plus its free, on one core, for prompts of 1k, 8k
 * and 32k tokens, B = 16 and 64, and 8, 64 and 1,024 workers, with about 1M worker-block entries
 * in the index and about 2,000 requests in flight.
 *
 * Set-up per case: 32 prompt families (shared prefixes of half the prompt); each worker caches
 * the prefixes of four families (reported through Stored events, as engines do) plus filler paths
 * until the index holds ~1M entries; 2,000 requests (a family prefix plus unique tokens) are
 * routed and left in flight. Then each measured iteration routes a new such prompt and frees it.
 * Prints one key=value line per case and the 1024/64-worker median ratio per prompt and block
 * size. median_ns and p99_ns time a decision with its free (what docs/benchmarks.md tabulates);
 * route_median_ns and route_p99_ns the decision alone, what a request waits for (its free comes
 * when it ends).
 * Usage: bench_decision [--quick | --group TOKENS BLOCK | --case TOKENS BLOCK WORKERS]
 * (--quick: fewer iterations and a 256k-entry index; --group: one prompt and block size;
 * --case: one case, for profiling). KVR_BENCH_CPUTIME=1 in the environment times each decision
 * with the thread's CPU clock instead of CLOCK_MONOTONIC (same output; on a shared, loaded
 * machine it leaves out the time a decision spent preempted). Every request has max_tokens 256,
 * priced with the library's decode_weight (0.5), or W with KVR_BENCH_DECODE_WEIGHT=W (0: not
 * priced). First prints how often the machine took this core away in one second of spinning
 * (stalls_per_s, and their mean and longest length), which sets the p99 on a shared machine.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvr/hash.h"
#include "kvr/rng.h"
#include "kvr/router.h"

#define FAMILIES 32
#define INFLIGHT 2000

static clockid_t bench_clock = CLOCK_MONOTONIC; /* or the thread's CPU clock (KVR_BENCH_CPUTIME) */
static double decode_weight = -1;               /* KVR_BENCH_DECODE_WEIGHT; < 0: the default */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

struct bench {
    uint32_t tokens, block, workers;
    uint64_t index_entries;
    struct kvr_router *r;
    uint32_t *family; /* FAMILIES x (tokens / 2) prefix tokens */
    uint32_t prefix;  /* prefix tokens per family */
    struct kvr_rng rng;
};

static void fill_prompt(struct bench *b, uint32_t *t, uint32_t fam)
{
    memcpy(t, b->family + (size_t)fam * b->prefix, (size_t)b->prefix * sizeof *t);
    for (uint32_t i = b->prefix; i < b->tokens; i++)
        t[i] = (uint32_t)kvr_rng_below(&b->rng, 128000);
}

static int store_families(struct bench *b, uint64_t *entries)
{
    uint32_t nb = b->prefix / b->block;
    uint64_t *local = malloc((size_t)nb * sizeof *local);
    struct kvr_kv_block *blocks = malloc((size_t)nb * sizeof *blocks);
    if (!local || !blocks)
        return -1;
    for (uint32_t w = 0; w < b->workers; w++) {
        for (uint32_t k = 0; k < 4; k++) {
            uint32_t fam = (w * 4 + k) % FAMILIES;
            kvr_hash_prompt(b->family + (size_t)fam * b->prefix, b->prefix, b->block, local, NULL);
            for (uint32_t i = 0; i < nb; i++)
                blocks[i] = (struct kvr_kv_block){((uint64_t)fam << 32) | i, local[i]};
            if (kvr_router_kv_stored(b->r, w + 1, NULL, blocks, nb) != KVR_OK)
                return -1;
            *entries += nb;
        }
    }
    free(local);
    free(blocks);
    return 0;
}

/* Filler: random 64-block paths spread over the workers until the index holds the target. */
static int store_filler(struct bench *b, uint64_t entries)
{
    struct kvr_kv_block blocks[64];
    uint64_t next_id = 1ull << 62;
    for (uint32_t w = 0; entries < b->index_entries; w = (w + 1) % b->workers) {
        for (int i = 0; i < 64; i++)
            blocks[i] = (struct kvr_kv_block){next_id++, kvr_rng_next(&b->rng)};
        if (kvr_router_kv_stored(b->r, w + 1, NULL, blocks, 64) != KVR_OK)
            return -1;
        entries += 64;
    }
    return 0;
}

static int setup(struct bench *b)
{
    struct kvr_router_config cfg;
    kvr_router_config_default(&cfg);
    cfg.block_size = b->block;
    cfg.index_max_entries = (uint32_t)(b->index_entries * 2);
    cfg.max_prompt_tokens = b->tokens;
    if (decode_weight >= 0)
        cfg.decode_weight = decode_weight;
    kvr_status st;
    b->r = kvr_router_create(&cfg, &st);
    if (!b->r)
        return -1;
    kvr_rng_seed(&b->rng, 1000 + b->tokens + b->block + b->workers);
    b->prefix = b->tokens / 2 / b->block * b->block;
    b->family = malloc((size_t)FAMILIES * b->prefix * sizeof *b->family);
    if (!b->family)
        return -1;
    for (size_t i = 0; i < (size_t)FAMILIES * b->prefix; i++)
        b->family[i] = (uint32_t)kvr_rng_below(&b->rng, 128000);
    for (uint32_t w = 1; w <= b->workers; w++) {
        struct kvr_worker_info info = {
            .id = w, .block_size = b->block, .capacity_blocks = 0, .waiting = 0, .kv_usage = 0.0};
        if (kvr_router_worker_seen(b->r, &info, 0) != KVR_OK)
            return -1;
    }
    uint64_t entries = 0;
    if (store_families(b, &entries) || store_filler(b, entries))
        return -1;
    uint32_t *t = malloc((size_t)b->tokens * sizeof *t);
    if (!t)
        return -1;
    for (uint64_t id = 1; id <= INFLIGHT; id++) {
        fill_prompt(b, t, (uint32_t)kvr_rng_below(&b->rng, FAMILIES));
        struct kvr_request q = {.id = id, .tokens = t, .ntokens = b->tokens, .max_tokens = 256};
        struct kvr_decision d;
        if (kvr_router_route(b->r, &q, 0, &d) != KVR_OK || d.queued) {
            free(t);
            return -1;
        }
        kvr_router_prefill_done(b->r, id, 0);
    }
    free(t);
    return 0;
}

struct result {
    uint64_t *ns;    /* samples: a decision and its free */
    uint64_t *route; /* the same samples' decisions alone */
    uint32_t n;      /* samples taken */
    uint64_t total;  /* sum of ns */
};

/* One timed decision and its free on b (*dt; *route: the decision alone); returns 0, or -1 when
 * the router refused. */
static int one_decision(struct bench *b, uint32_t *t, uint64_t id, uint64_t *dt, uint64_t *route)
{
    fill_prompt(b, t, (uint32_t)kvr_rng_below(&b->rng, FAMILIES));
    struct kvr_request q = {.id = id, .tokens = t, .ntokens = b->tokens, .max_tokens = 256};
    struct kvr_decision d;
    uint64_t t0 = now_ns();
    kvr_status st = kvr_router_route(b->r, &q, 0, &d);
    uint64_t t1 = now_ns();
    kvr_router_done(b->r, id);
    *dt = now_ns() - t0;
    *route = t1 - t0;
    if (st != KVR_OK || d.queued) { /* a queued request measures no decision */
        fprintf(stderr, "bench_decision: route failed: %s\n",
                st == KVR_OK ? "queued" : kvr_status_str(st));
        return -1;
    }
    return 0;
}

static void report(const struct bench *b, struct result *res)
{
    struct kvr_router_stats s;
    kvr_router_stats(b->r, &s);
    qsort(res->ns, res->n, sizeof *res->ns, cmp_u64);
    qsort(res->route, res->n, sizeof *res->route, cmp_u64);
    size_t p99 = (size_t)res->n * 99 / 100;
    printf("tokens=%u block=%u workers=%u median_ns=%" PRIu64 " p99_ns=%" PRIu64
           " per_sec=%.0f index_entries=%u inflight=%u nodes=%u memory_mb=%.1f"
           " route_median_ns=%" PRIu64 " route_p99_ns=%" PRIu64 "\n",
           b->tokens, b->block, b->workers, res->ns[res->n / 2], res->ns[p99],
           1e9 * res->n / (double)res->total, s.index_entries, s.inflight, s.nodes,
           s.memory_bytes / 1048576.0, res->route[res->n / 2], res->route[p99]);
    fflush(stdout);
}

/*
 * How often something else takes this core (the kernel's ticks, a hypervisor, a neighbour), and
 * for how long: spin on the clock for `ms` and count the gaps of more than 5 us between two
 * readings. A decision that meets such a gap takes it whole, so once stalls_per_s times a
 * decision's time passes 1 %, the p99 is the median plus a stall (docs/benchmarks.md).
 */
static void report_stalls(uint32_t ms)
{
    uint64_t start = now_ns(), prev = start, n = 0, total = 0, longest = 0;
    while (prev - start < (uint64_t)ms * 1000000u) {
        uint64_t t = now_ns(), gap = t - prev;
        if (gap > 5000) {
            n++;
            total += gap;
            longest = gap > longest ? gap : longest;
        }
        prev = t;
    }
    printf("stalls_per_s=%.0f stall_us_mean=%.1f stall_us_max=%.1f\n", n * 1000.0 / ms,
           n ? total / 1000.0 / (double)n : 0.0, longest / 1000.0);
    fflush(stdout);
}

#define BATCH 500 /* decisions in a row on one router before moving to the next */

/*
 * Measure the cases of one prompt and block size side by side: their routers are built first,
 * then the measured decisions alternate between them in small batches, so a noisy neighbour
 * slows every case alike and the ratios between them hold. Returns the medians in med[].
 */
static int run_group(uint32_t tokens, uint32_t block, const uint32_t *workers, int ncases,
                     uint32_t iters, uint64_t index_entries, uint64_t *med)
{
    struct bench b[3];
    struct result res[3];
    uint32_t *t = malloc((size_t)tokens * sizeof *t);
    int rc = t ? 0 : -1;
    memset(b, 0, sizeof b);
    memset(res, 0, sizeof res);
    for (int c = 0; c < ncases && rc == 0; c++) {
        b[c] = (struct bench){tokens, block, workers[c], index_entries, NULL, NULL, 0, {{0}}};
        res[c].ns = malloc((size_t)iters * sizeof *res[c].ns);
        res[c].route = malloc((size_t)iters * sizeof *res[c].route);
        if (!res[c].ns || !res[c].route || setup(&b[c])) {
            fprintf(stderr, "bench_decision: set-up failed for tokens=%u block=%u workers=%u\n",
                    tokens, block, workers[c]);
            rc = -1;
        }
    }
    uint32_t warm = iters / 10;
    uint64_t id = 1000000;
    for (uint32_t done = 0; done < warm + iters && rc == 0; done += BATCH) {
        for (int c = 0; c < ncases && rc == 0; c++) {
            for (uint32_t k = 0; k < BATCH && done + k < warm + iters && rc == 0; k++) {
                uint64_t dt, route;
                rc = one_decision(&b[c], t, id++, &dt, &route);
                if (done + k >= warm) {
                    res[c].route[res[c].n] = route;
                    res[c].ns[res[c].n++] = dt;
                    res[c].total += dt;
                }
            }
        }
    }
    for (int c = 0; c < ncases; c++) {
        if (rc == 0) {
            report(&b[c], &res[c]);
            med[c] = res[c].ns[res[c].n / 2];
        }
        kvr_router_destroy(b[c].r);
        free(b[c].family);
        free(res[c].ns);
        free(res[c].route);
    }
    free(t);
    return rc;
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    const char *cpu = getenv("KVR_BENCH_CPUTIME");
    if (cpu && !strcmp(cpu, "1"))
        bench_clock = CLOCK_THREAD_CPUTIME_ID;
    const char *dw = getenv("KVR_BENCH_DECODE_WEIGHT");
    if (dw && !((decode_weight = atof(dw)) >= 0))
        return 2;
    static const uint32_t tokens[] = {1024, 8192, 32768};
    static const uint32_t blocks[] = {16, 64};
    static const uint32_t workers[] = {8, 64, 1024};
    uint64_t med[3];
    report_stalls(1000);
    if ((argc == 5 || argc == 6) && !strcmp(argv[1], "--case")) { /* one case, for profiling */
        uint32_t t = (uint32_t)atoi(argv[2]), bs = (uint32_t)atoi(argv[3]);
        uint32_t w = (uint32_t)atoi(argv[4]);
        uint32_t iters = argc == 6 ? (uint32_t)atoi(argv[5]) : 0;
        if (!t || !bs || !w)
            return 2;
        if (!iters)
            iters = t >= 32768 ? 2000 : t >= 8192 ? 5000 : 20000;
        return run_group(t, bs, &w, 1, iters, 1u << 20, med) ? 1 : 0;
    }
    if (argc == 4 && !strcmp(argv[1], "--group")) { /* one prompt and block size, 3 fleets */
        uint32_t t = (uint32_t)atoi(argv[2]), bs = (uint32_t)atoi(argv[3]);
        if (!t || !bs)
            return 2;
        uint32_t iters = t >= 32768 ? 2000 : t >= 8192 ? 5000 : 20000;
        if (run_group(t, bs, workers, 3, iters, 1u << 20, med))
            return 1;
        printf("tokens=%u block=%u scale_1024_over_64=%.3f\n", t, bs,
               (double)med[2] / (double)med[1]);
        return 0;
    }
    uint64_t index_entries = quick ? 1u << 18 : 1u << 20;
    for (size_t ti = 0; ti < 3; ti++) {
        for (size_t bi = 0; bi < 2; bi++) {
            uint32_t iters = tokens[ti] >= 32768 ? 2000 : tokens[ti] >= 8192 ? 5000 : 20000;
            if (quick)
                iters /= 10;
            if (run_group(tokens[ti], blocks[bi], workers, 3, iters, index_entries, med))
                return 1;
            printf("tokens=%u block=%u scale_1024_over_64=%.3f\n", tokens[ti], blocks[bi],
                   (double)med[2] / (double)med[1]);
            fflush(stdout);
        }
    }
    return 0;
}
