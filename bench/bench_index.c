/*
 * Prefix-index memory benchmark (docs/benchmarks.md "Index memory"): the bytes one worker-block
 * entry costs, to size --index-max-entries and the fleet-derived bound (ROUTING.md section 2).
 *
 * Each case fills a router's index with N entries across W workers through Stored events, as
 * engines report them: chains of 64 blocks, each chain held by S workers (S = 1: every entry its
 * own block, the worst case; S = 4: blocks shared, as prefixes are). It prints the bytes per entry
 * from the core's own accounting (kvr_router_stats' memory_bytes, which sums the structures'
 * bytes: entries, jump tables, block-table nodes, idx sets) and from the process's resident set
 * (/proc/self/statm, measured around the fill, so malloc's overhead counts). Each case runs in
 * its own child process, so one case's freed heap does not hide the next one's growth.
 *
 * The churn case measures what engines' KV events cost a router at steady state: an index of N
 * entries over W workers, then rounds in which one worker stores a new chain of 64 blocks (a
 * Stored event) and evicts its oldest chain (a Removed event of 64 engine ids), as a full cache
 * does. It prints the nanoseconds per stored and per removed block.
 * Usage: bench_index [--quick | --case ENTRIES WORKERS SHARING | --churn ENTRIES WORKERS].
 */
#define _DEFAULT_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvr/rng.h"
#include "kvr/router.h"

#define CHAIN 64 /* blocks per Stored event */

/* Resident bytes of this process. */
static uint64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &res) != 2)
            res = 0;
        fclose(f);
    }
    return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Chain c's blocks: local hashes unique per chain; engine ids unique per chain on any worker. */
static void chain(uint64_t c, struct kvr_kv_block *b)
{
    for (uint32_t i = 0; i < CHAIN; i++)
        b[i] = (struct kvr_kv_block){c * CHAIN + i + 1, kvr_mix64(c * CHAIN + i + 1)};
}

/* A router whose index holds entries (and `sharing` chains more) unpruned; workers 1..workers. */
static struct kvr_router *router_for(uint64_t entries, uint32_t workers, uint32_t sharing)
{
    struct kvr_router_config cfg;
    kvr_router_config_default(&cfg);
    cfg.block_size = 16;
    cfg.index_max_entries = (uint32_t)(entries + entries / 4 + CHAIN * sharing); /* no pruning */
    kvr_status st;
    struct kvr_router *r = kvr_router_create(&cfg, &st);
    if (!r) {
        fprintf(stderr, "bench_index: %s\n", kvr_status_str(st));
        return NULL;
    }
    for (uint32_t w = 1; w <= workers; w++) {
        struct kvr_worker_info info = {.id = w, .block_size = 16, .capacity_blocks = 0};
        kvr_router_worker_seen(r, &info, 0);
    }
    return r;
}

static int run_case(uint64_t entries, uint32_t workers, uint32_t sharing)
{
    uint64_t rss0 = rss_bytes();
    struct kvr_router *r = router_for(entries, workers, sharing);
    if (!r)
        return 1;
    struct kvr_router_stats s0, s;
    kvr_router_stats(r, &s0);
    struct kvr_kv_block b[CHAIN];
    double t0 = now_s();
    uint64_t chains = entries / ((uint64_t)CHAIN * sharing);
    for (uint64_t c = 0; c < chains; c++) {
        chain(c, b);
        for (uint32_t k = 0; k < sharing; k++) {
            uint64_t w = (c + k) % workers + 1;
            if (kvr_router_kv_stored(r, w, NULL, b, CHAIN) != KVR_OK)
                return fprintf(stderr, "bench_index: a Stored event failed\n"), 1;
        }
    }
    double dt = now_s() - t0;
    kvr_router_stats(r, &s);
    uint64_t rss1 = rss_bytes();
    double n = (double)s.index_entries;
    printf("entries=%u workers=%u sharing=%u nodes=%u pruned=%" PRIu64 " memory_mb=%.1f "
           "bytes_per_entry_accounted=%.1f bytes_per_entry_rss=%.1f insert_ns_per_entry=%.0f\n",
           s.index_entries, workers, sharing, s.nodes, s.index.pruned, s.memory_bytes / 1048576.0,
           (double)(s.memory_bytes - s0.memory_bytes) / n, (double)(rss1 - rss0) / n, dt * 1e9 / n);
    fflush(stdout);
    kvr_router_destroy(r);
    return s.index.pruned != 0;
}

static int run_churn(uint64_t entries, uint32_t workers, uint32_t rounds)
{
    struct kvr_router *r = router_for(entries, workers, 1);
    if (!r)
        return 1;
    uint64_t chains = entries / CHAIN, next = 0;
    struct kvr_kv_block b[CHAIN];
    uint64_t ids[CHAIN];
    for (; next < chains; next++) { /* chain c on worker c % workers + 1 */
        chain(next, b);
        if (kvr_router_kv_stored(r, next % workers + 1, NULL, b, CHAIN) != KVR_OK)
            return fprintf(stderr, "bench_index: a Stored event failed\n"), 1;
    }
    double t_store = 0, t_remove = 0;
    for (uint32_t k = 0; k < rounds; k++, next++) {
        uint64_t w = next % workers + 1, old = next - chains; /* the oldest chain, same worker */
        chain(next, b);
        double t0 = now_s();
        kvr_status st = kvr_router_kv_stored(r, w, NULL, b, CHAIN);
        double t1 = now_s();
        chain(old, b);
        for (uint32_t i = 0; i < CHAIN; i++)
            ids[i] = b[i].engine_id;
        double t2 = now_s();
        st = st == KVR_OK ? kvr_router_kv_removed(r, w, ids, CHAIN) : st;
        t_remove += now_s() - t2;
        t_store += t1 - t0;
        if (st != KVR_OK)
            return fprintf(stderr, "bench_index: %s\n", kvr_status_str(st)), 1;
    }
    struct kvr_router_stats s;
    kvr_router_stats(r, &s);
    double blocks = (double)rounds * CHAIN;
    printf("churn entries=%u workers=%u rounds=%u store_ns_per_block=%.0f "
           "remove_ns_per_block=%.0f pruned=%" PRIu64 "\n",
           s.index_entries, workers, rounds, t_store * 1e9 / blocks, t_remove * 1e9 / blocks,
           s.index.pruned);
    fflush(stdout);
    kvr_router_destroy(r);
    return s.index_entries != chains * CHAIN || s.index.pruned != 0;
}

/* One case in a child process; its exit status. */
static int in_child(uint64_t entries, uint32_t workers, uint32_t sharing)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return run_case(entries, workers, sharing);
    if (pid == 0)
        _exit(run_case(entries, workers, sharing));
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return 1;
    return WEXITSTATUS(status);
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--churn"))
        return run_churn(strtoull(argv[2], NULL, 10), (uint32_t)strtoul(argv[3], NULL, 10), 20000);
    if (argc == 5 && !strcmp(argv[1], "--case"))
        return run_case(strtoull(argv[2], NULL, 10), (uint32_t)strtoul(argv[3], NULL, 10),
                        (uint32_t)strtoul(argv[4], NULL, 10));
    bool quick = argc == 2 && !strcmp(argv[1], "--quick");
    if (argc > 1 && !quick) {
        fprintf(stderr, "usage: bench_index [--quick | --case ENTRIES WORKERS SHARING | --churn "
                        "ENTRIES WORKERS]\n");
        return 2;
    }
    static const struct {
        uint64_t entries;
        uint32_t workers, sharing;
    } cases[] = {
        {1u << 20, 8, 1},  {1u << 20, 8, 4},  {1u << 21, 32, 1},
        {1u << 21, 32, 4}, {1u << 22, 64, 1}, {1u << 22, 64, 4},
    };
    int rc = 0;
    for (size_t i = 0; i < (quick ? 2 : sizeof cases / sizeof cases[0]); i++)
        rc |= in_child(quick ? cases[i].entries / 16 : cases[i].entries, cases[i].workers,
                       cases[i].sharing);
    fflush(stdout);
    rc |= quick ? run_churn(1u << 16, 8, 2000) : run_churn(1u << 20, 8, 20000);
    return rc;
}
