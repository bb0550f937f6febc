/*
 * The prefix index's bound in the router daemon: --index-max-entries (0: from the fleet) parsed
 * from the option table, the bound and the pruning in /metrics, and the one rate-limited warning
 * when entries the engines still hold are pruned. Real daemon state (kvr_rd, a recording sink).
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buf.h"
#include "clock.h"
#include "config.h"
#include "kvr/rng.h"
#include "metrics.h"
#include "prom.h"
#include "rec.h"
#include "state.h"

static struct kvr_rd_config cfg;
static struct kvr_rd rd;
static bool rd_up;

static void init(void)
{
    rec_reset();
    kvr_rd_config_default(&cfg);
    strcpy(cfg.id, "r1");
    rd_up = false;
}

static void fini(void)
{
    if (rd_up)
        kvr_rd_free(&rd);
    rec_reset();
}

TestSuite(index_routerd, .init = init, .fini = fini, .timeout = 30);

/* argv (NULL-terminated, after the program's name) through kvrouter's option table. */
static enum kvr_opts_result parse(const char *const *args)
{
    struct kvr_opt t[KVR_RD_OPTIONS];
    size_t n = kvr_rd_config_options(&cfg, t);
    char *argv[16] = {"kvrouter"};
    int argc = 1;
    for (; args[argc - 1]; argc++)
        argv[argc] = (char *)args[argc - 1];
    return kvr_opts_parse(t, n, argc, argv, "kvrouter", "a test");
}

static void start(void)
{
    cr_assert(eq(int, kvr_rd_init(&rd, &cfg, (struct kvr_sink){.publish = rec_record, .ctx = NULL}),
                 KVR_OK));
    rd_up = true;
}

/* The /metrics text, NUL-terminated; free it. */
static char *scrape(void)
{
    struct kvr_buf b = {0};
    struct kvr_prom p;
    kvr_prom_begin(&p, &b);
    cr_assert(eq(int, kvr_rd_metrics(&rd, &p), KVR_OK));
    char *s = malloc(b.len + 1);
    memcpy(s, b.data, b.len);
    s[b.len] = 0;
    kvr_buf_free(&b);
    return s;
}

static void expect_line(const char *text, const char *line)
{
    char want[256];
    snprintf(want, sizeof want, "\n%s\n", line);
    cr_expect(strstr(text, want) != NULL, "no line '%s' in:\n%s", line, text);
}

/* Worker id announces capacity and stores n blocks of chain base. */
static void worker_stores(uint64_t id, uint64_t capacity, uint64_t base, uint32_t n)
{
    struct kvr_worker_info info = {
        .id = id, .block_size = cfg.core.block_size, .capacity_blocks = capacity};
    cr_assert(eq(int, kvr_router_worker_seen(rd.core, &info, kvr_now_ns()), KVR_OK));
    struct kvr_kv_block b[64];
    for (uint32_t i = 0; i < n; i++)
        b[i] = (struct kvr_kv_block){base + i, kvr_mix64(base + i)};
    cr_assert(eq(int, kvr_router_kv_stored(rd.core, id, NULL, b, n), KVR_OK));
}

Test(index_routerd, the_flag_defaults_to_the_fleet_and_takes_a_bound)
{
    cr_assert(eq(int, parse((const char *[]){NULL}), KVR_OPTS_GO));
    cr_assert(eq(u32, cfg.core.index_max_entries, 0), "0: from the fleet");
    cr_assert(eq(int, parse((const char *[]){"--index-max-entries", "5000", NULL}), KVR_OPTS_GO));
    cr_assert(eq(u32, cfg.core.index_max_entries, 5000));
    const char *bad[] = {"-1", "2147483649", "lots", "1.5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect(
            eq(int, parse((const char *[]){"--index-max-entries", bad[i], NULL}), KVR_OPTS_BAD),
            "%s", bad[i]);
}

Test(index_routerd, metrics_show_the_fleet_bound)
{
    start();
    worker_stores(1, 1u << 20, 1, 8);
    worker_stores(2, 1u << 20, 100, 8);
    char *m = scrape();
    expect_line(m, "kvrouter_index_max_entries 2621440"); /* 2 x 2^20 x 1.25 */
    expect_line(m, "kvrouter_index_pruned_total{kind=\"event\"} 0");
    expect_line(m, "kvrouter_index_pruned_total{kind=\"ttl\"} 0");
    expect_line(m, "kvrouter_kv_events_ignored_total 0");
    free(m);
}

/* stderr into a file for fn's duration; what was written, NUL-terminated (free it). */
static char *stderr_of(void (*fn)(void))
{
    char path[] = "/tmp/test_index_routerd_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    fn();
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    FILE *f = fdopen(fd, "r");
    rewind(f);
    char *s = calloc(1, 65536);
    size_t n = fread(s, 1, 65535, f);
    s[n] = 0;
    fclose(f);
    unlink(path);
    return s;
}

static uint64_t t0;

static void prune_and_tick(void)
{
    worker_stores(1, 1000, 1, 60); /* the bound is 50: 20 live entries pruned */
    kvr_router_tick(rd.core, t0);
    worker_stores(1, 1000, 500, 60); /* more, 10 s later: not said again */
    kvr_router_tick(rd.core, t0 + 10 * KVR_NS_PER_S);
}

static void tick_later(void)
{
    kvr_router_tick(rd.core, t0 + 61 * KVR_NS_PER_S);
}

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p++)
        n++;
    return n;
}

Test(index_routerd, live_pruning_is_counted_and_warned_once_a_minute)
{
    cfg.core.index_max_entries = 50;
    start();
    t0 = kvr_now_ns();
    char *log = stderr_of(prune_and_tick);
    cr_expect(eq(int, count(log, "msg=index_pruned_live"), 1), "one warning:\n%s", log);
    cr_expect(strstr(log, "level=warn") != NULL);
    cr_expect(strstr(log, "pruned=20 max_entries=50 from_fleet=false") != NULL, "%s", log);
    cr_expect(strstr(log, "raise --index-max-entries above 50") != NULL, "%s", log);
    free(log);
    char *m = scrape();
    expect_line(m, "kvrouter_index_max_entries 50");
    struct kvr_router_stats s;
    kvr_router_stats(rd.core, &s);
    char line[128];
    snprintf(line, sizeof line, "kvrouter_index_pruned_total{kind=\"event\"} %llu",
             (unsigned long long)s.index.pruned_live);
    cr_expect(gt(u64, s.index.pruned_live, 20));
    expect_line(m, line);
    expect_line(m, "kvrouter_index_pruned_total{kind=\"ttl\"} 0");
    free(m);
    log = stderr_of(tick_later);
    cr_expect(eq(int, count(log, "msg=index_pruned_live"), 1), "a minute later, again:\n%s", log);
    snprintf(line, sizeof line, "pruned=%llu ", (unsigned long long)(s.index.pruned_live - 20));
    cr_expect(strstr(log, line) != NULL, "what was pruned since: %s", log);
    free(log);
}

Test(index_routerd, an_approximate_router_counts_the_events_it_drops)
{
    cr_assert(eq(int, parse((const char *[]){"--approximate", NULL}), KVR_OPTS_GO));
    start();
    worker_stores(1, 1000, 1, 8);
    char *m = scrape();
    expect_line(m, "kvrouter_kv_events_ignored_total 1");
    expect_line(m, "kvrouter_index_entries 0");
    free(m);
}
