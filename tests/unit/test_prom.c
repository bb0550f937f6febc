/*
 * The Prometheus exposition writer (src/base/prom): exact text of small expositions, escaping of
 * label values and help, numbers, the histogram's cumulative buckets, sum and count, name checks
 * and the sticky error; and a realistic exposition checked by Debian's `promtool check metrics`
 * (the test fails when promtool is missing: scripts/deps.sh installs the prometheus package).
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prom.h"

static struct kvr_buf out;
static struct kvr_prom p;

static void setup(void)
{
    memset(&out, 0, sizeof out);
    kvr_prom_begin(&p, &out);
}

static void teardown(void)
{
    kvr_buf_free(&out);
}

TestSuite(prom, .init = setup, .fini = teardown);

static const char *text(void)
{
    return out.data ? (const char *)out.data : "";
}

#define L1(n, v) ((const struct kvr_prom_label[]){{(n), (v)}}), 1

/* --- exact text ------------------------------------------------------------------------------ */

Test(prom, counter_and_gauge)
{
    cr_assert(eq(int, kvr_prom_counter(&p, "kvr_decisions_total", "Decisions made.", 42), KVR_OK));
    cr_assert(eq(int, kvr_prom_gauge(&p, "kvr_queue_depth", "Requests queued.", 3), KVR_OK));
    cr_assert(eq(int, kvr_prom_end(&p), KVR_OK));
    cr_assert(eq(str, (char *)text(),
                 "# HELP kvr_decisions_total Decisions made.\n"
                 "# TYPE kvr_decisions_total counter\n"
                 "kvr_decisions_total 42\n"
                 "# HELP kvr_queue_depth Requests queued.\n"
                 "# TYPE kvr_queue_depth gauge\n"
                 "kvr_queue_depth 3\n"));
}

Test(prom, labelled_family)
{
    const struct kvr_prom_label ok[] = {{"endpoint", "generate"}, {"code", "ok"}};
    const struct kvr_prom_label bad[] = {{"endpoint", "generate"}, {"code", "no_workers"}};
    cr_assert(
        eq(int, kvr_prom_family(&p, "kvr_requests_total", KVR_PROM_COUNTER, "Requests."), KVR_OK));
    cr_assert(eq(int, kvr_prom_u64(&p, ok, 2, 10), KVR_OK));
    cr_assert(eq(int, kvr_prom_u64(&p, bad, 2, 2), KVR_OK));
    cr_assert(eq(str, (char *)text(),
                 "# HELP kvr_requests_total Requests.\n"
                 "# TYPE kvr_requests_total counter\n"
                 "kvr_requests_total{endpoint=\"generate\",code=\"ok\"} 10\n"
                 "kvr_requests_total{endpoint=\"generate\",code=\"no_workers\"} 2\n"));
}

Test(prom, appends_after_existing_contents)
{
    cr_assert(eq(int, kvr_buf_set(&out, "x 1\n", 4), KVR_OK));
    kvr_prom_begin(&p, &out);
    cr_assert(eq(int, kvr_prom_gauge(&p, "y", "Y.", 2), KVR_OK));
    cr_assert(eq(str, (char *)text(), "x 1\n# HELP y Y.\n# TYPE y gauge\ny 2\n"));
}

Test(prom, label_values_escaped)
{
    cr_assert(eq(int, kvr_prom_family(&p, "g", KVR_PROM_GAUGE, "G."), KVR_OK));
    cr_assert(eq(int, kvr_prom_u64(&p, L1("worker", "a\\b\"c\nd"), 1), KVR_OK));
    cr_assert(eq(int, kvr_prom_u64(&p, L1("worker", ""), 2), KVR_OK));
    cr_assert(eq(str, (char *)text(),
                 "# HELP g G.\n# TYPE g gauge\n"
                 "g{worker=\"a\\\\b\\\"c\\nd\"} 1\n"
                 "g{worker=\"\"} 2\n"));
}

Test(prom, help_escaped)
{
    cr_assert(eq(int, kvr_prom_gauge(&p, "g", "a \"quoted\" back\\slash\nnext line", 0), KVR_OK));
    cr_assert(eq(str, (char *)text(),
                 "# HELP g a \"quoted\" back\\\\slash\\nnext line\n# TYPE g gauge\ng 0\n"));
}

Test(prom, utf8_kept_and_invalid_replaced)
{
    cr_assert(eq(int, kvr_prom_family(&p, "g", KVR_PROM_GAUGE, "G."), KVR_OK));
    /* é, 日, an emoji: kept; a lone continuation byte, a truncated sequence, an overlong '/',
     * a surrogate and a byte that is never UTF-8: one U+FFFD for each bad byte */
    cr_assert(
        eq(int, kvr_prom_u64(&p, L1("v", "\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80"), 1), KVR_OK));
    cr_assert(eq(int, kvr_prom_u64(&p, L1("v", "a\x80z"), 2), KVR_OK));
    cr_assert(eq(int, kvr_prom_u64(&p, L1("v", "\xe6\x97"), 3), KVR_OK));
    cr_assert(eq(int, kvr_prom_u64(&p, L1("v", "\xc0\xaf"), 4), KVR_OK));
    cr_assert(eq(int, kvr_prom_u64(&p, L1("v", "\xed\xa0\x80"), 5), KVR_OK));
    cr_assert(eq(int, kvr_prom_u64(&p, L1("v", "\xff"), 6), KVR_OK));
#define R "\xef\xbf\xbd"
    cr_assert(eq(str, (char *)text(),
                 "# HELP g G.\n# TYPE g gauge\n"
                 "g{v=\"\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80\"} 1\n"
                 "g{v=\"a" R "z\"} 2\n"
                 "g{v=\"" R R "\"} 3\n"
                 "g{v=\"" R R "\"} 4\n"
                 "g{v=\"" R R R "\"} 5\n"
                 "g{v=\"" R "\"} 6\n"));
#undef R
}

Test(prom, numbers)
{
    cr_assert(eq(int, kvr_prom_family(&p, "g", KVR_PROM_GAUGE, "G."), KVR_OK));
    const double v[] = {0.1, 1.5, -2, 1e-7, 123456789012.0, 1.0 / 3, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        cr_assert(eq(int, kvr_prom_f64(&p, NULL, 0, v[i]), KVR_OK));
    cr_assert(eq(int, kvr_prom_u64(&p, NULL, 0, UINT64_MAX), KVR_OK));
    cr_assert(eq(str, (char *)text(),
                 "# HELP g G.\n# TYPE g gauge\n"
                 "g 0.1\ng 1.5\ng -2\ng 1e-07\ng 123456789012\ng 0.3333333333333333\n"
                 "g NaN\ng +Inf\ng -Inf\ng 18446744073709551615\n"));
}

/* --- histogram ------------------------------------------------------------------------------- */

Test(prom, histogram_buckets)
{
    struct kvr_prom_hist h = {0};
    kvr_prom_hist_observe(&h, 0);
    kvr_prom_hist_observe(&h, 5000); /* on a bound: in it */
    kvr_prom_hist_observe(&h, 5001);
    kvr_prom_hist_observe(&h, 1000000000ull);
    kvr_prom_hist_observe(&h, 1000000001ull); /* above the last: +Inf only */
    cr_assert(eq(u64, h.bucket[0], 2));
    cr_assert(eq(u64, h.bucket[1], 1));
    cr_assert(eq(u64, h.bucket[KVR_PROM_HIST_BUCKETS - 1], 1));
    cr_assert(eq(u64, h.bucket[KVR_PROM_HIST_BUCKETS], 1));
    cr_assert(eq(u64, kvr_prom_hist_count(&h), 5));
    cr_assert(eq(u64, h.sum_ns, 2000010002ull));
    for (size_t i = 1; i < KVR_PROM_HIST_BUCKETS; i++)
        cr_assert(lt(u64, kvr_prom_hist_le_ns[i - 1], kvr_prom_hist_le_ns[i]));
    cr_assert(eq(u64, kvr_prom_hist_le_ns[0], 5000));
    cr_assert(eq(u64, kvr_prom_hist_le_ns[KVR_PROM_HIST_BUCKETS - 1], 1000000000ull));
}

Test(prom, histogram_text_cumulative)
{
    struct kvr_prom_hist h = {0};
    kvr_prom_hist_observe(&h, 40000);     /* 40 us */
    kvr_prom_hist_observe(&h, 300000);    /* 300 us */
    kvr_prom_hist_observe(&h, 300000);    /* 300 us */
    kvr_prom_hist_observe(&h, 2000000);   /* 2 ms */
    kvr_prom_hist_observe(&h, 700000000); /* 700 ms */
    cr_assert(eq(int, kvr_prom_family(&p, "d_seconds", KVR_PROM_HISTOGRAM, "D."), KVR_OK));
    cr_assert(eq(int, kvr_prom_histogram(&p, L1("policy", "kv"), &h), KVR_OK));
    cr_assert(eq(str, (char *)text(),
                 "# HELP d_seconds D.\n# TYPE d_seconds histogram\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"5e-06\"} 0\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"1e-05\"} 0\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"2.5e-05\"} 0\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"5e-05\"} 1\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"0.0001\"} 1\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"0.00025\"} 1\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"0.0005\"} 3\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"0.001\"} 3\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"0.0025\"} 4\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"0.005\"} 4\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"0.01\"} 4\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"0.025\"} 4\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"0.05\"} 4\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"0.1\"} 4\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"0.25\"} 4\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"0.5\"} 4\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"1\"} 5\n"
                 "d_seconds_bucket{policy=\"kv\",le=\"+Inf\"} 5\n"
                 "d_seconds_sum{policy=\"kv\"} 0.70264\n"
                 "d_seconds_count{policy=\"kv\"} 5\n"));
}

Test(prom, histogram_le_text_matches_bounds)
{
    struct kvr_prom_hist h = {0};
    cr_assert(eq(int, kvr_prom_family(&p, "d_seconds", KVR_PROM_HISTOGRAM, "D."), KVR_OK));
    cr_assert(eq(int, kvr_prom_histogram(&p, NULL, 0, &h), KVR_OK));
    const char *s = text();
    for (size_t i = 0; i < KVR_PROM_HIST_BUCKETS; i++) {
        s = strstr(s, "le=\"");
        cr_assert(s != NULL);
        s += 4;
        double le = strtod(s, NULL);
        cr_assert(eq(dbl, le, (double)kvr_prom_hist_le_ns[i] / 1e9), "bucket %zu", i);
    }
    cr_assert(strstr(text(), "d_seconds_bucket{le=\"+Inf\"} 0\nd_seconds_sum 0\n"
                             "d_seconds_count 0\n") != NULL);
}

Test(prom, histogram_merge_and_saturation)
{
    struct kvr_prom_hist a = {0}, b = {0};
    kvr_prom_hist_observe(&a, 1000);
    kvr_prom_hist_observe(&b, 1000000);
    kvr_prom_hist_observe(&b, 20000000000ull);
    struct kvr_prom_hist c = a; /* a copy is an assignment */
    kvr_prom_hist_merge(&c, &b);
    cr_assert(eq(u64, kvr_prom_hist_count(&c), 3));
    cr_assert(eq(u64, c.sum_ns, 20001001000ull));
    cr_assert(eq(u64, c.bucket[0], 1));
    cr_assert(eq(u64, c.bucket[7], 1)); /* 1 ms */
    cr_assert(eq(u64, c.bucket[KVR_PROM_HIST_BUCKETS], 1));
    cr_assert(eq(u64, kvr_prom_hist_count(&a), 1));
    kvr_prom_hist_observe(&c, UINT64_MAX);
    cr_assert(eq(u64, c.sum_ns, UINT64_MAX));
    kvr_prom_hist_merge(&c, &b);
    cr_assert(eq(u64, c.sum_ns, UINT64_MAX));
    cr_assert(eq(u64, kvr_prom_hist_count(&c), 6));
}

/* --- names and misuse ------------------------------------------------------------------------ */

/* name as a family of type on a fresh writer: its status, and nothing written when refused. */
static kvr_status family_on_fresh(const char *name, enum kvr_prom_type type)
{
    struct kvr_buf b = {0};
    struct kvr_prom w;
    kvr_prom_begin(&w, &b);
    kvr_status st = kvr_prom_family(&w, name, type, "help");
    if (st != KVR_OK)
        cr_assert(eq(sz, b.len, 0), "%s left %zu bytes", name, b.len);
    kvr_buf_free(&b);
    return st;
}

Test(prom, metric_names)
{
    char long_name[KVR_PROM_NAME_MAX + 2];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = 0;
    const char *bad[] = {"",        "1abc", "a-b",     "a:b-c", "a b",  "x_bucket",     "x_sum",
                         "x_count", "é",    long_name, "a\nb",  "a{b}", "kvr.decisions"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert(eq(int, family_on_fresh(bad[i], KVR_PROM_GAUGE), KVR_ERR_INVALID), "%s", bad[i]);
    cr_assert(eq(int, family_on_fresh(NULL, KVR_PROM_GAUGE), KVR_ERR_INVALID));
    cr_assert(eq(int, family_on_fresh("requests", KVR_PROM_COUNTER), KVR_ERR_INVALID));
    cr_assert(eq(int, family_on_fresh("requests_total_x", KVR_PROM_COUNTER), KVR_ERR_INVALID));
    cr_assert(eq(int, family_on_fresh("g", (enum kvr_prom_type)7), KVR_ERR_INVALID));
    long_name[KVR_PROM_NAME_MAX] = 0; /* exactly the maximum */
    const char *good[] = {
        "_x", "a1", "A_b", "kvr_router_queue_depth", long_name, "vllm:num_requests_running",
        ":x"}; /* an engine's colon */
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        cr_assert(eq(int, family_on_fresh(good[i], KVR_PROM_GAUGE), KVR_OK), "%s", good[i]);
    cr_assert(eq(int, family_on_fresh("requests_total", KVR_PROM_COUNTER), KVR_OK));
    cr_assert(eq(int, family_on_fresh("d_seconds", KVR_PROM_HISTOGRAM), KVR_OK));
}

/* One sample with one label named name on a fresh writer's gauge. */
static kvr_status label_on_fresh(const char *name, const char *value)
{
    struct kvr_buf b = {0};
    struct kvr_prom w;
    kvr_prom_begin(&w, &b);
    cr_assert(eq(int, kvr_prom_family(&w, "g", KVR_PROM_GAUGE, "G."), KVR_OK));
    size_t len = b.len;
    kvr_status st = kvr_prom_u64(&w, L1(name, value), 1);
    if (st != KVR_OK)
        cr_assert(eq(sz, b.len, len));
    kvr_buf_free(&b);
    return st;
}

Test(prom, label_names)
{
    const char *bad[] = {"", "le", "quantile", "__name__", "__x", "1a", "a-b", "a:b", "a b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert(eq(int, label_on_fresh(bad[i], "v"), KVR_ERR_INVALID), "%s", bad[i]);
    cr_assert(eq(int, label_on_fresh(NULL, "v"), KVR_ERR_INVALID));
    cr_assert(eq(int, label_on_fresh("a", NULL), KVR_ERR_INVALID));
    const char *good[] = {"_a", "a", "worker_id", "Code", "le_x", "x9"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        cr_assert(eq(int, label_on_fresh(good[i], "v"), KVR_OK), "%s", good[i]);
    cr_assert(eq(int, kvr_prom_family(&p, "g", KVR_PROM_GAUGE, "G."), KVR_OK));
    const struct kvr_prom_label twice[] = {{"a", "1"}, {"b", "2"}, {"a", "3"}};
    cr_assert(eq(int, kvr_prom_u64(&p, twice, 3, 1), KVR_ERR_INVALID));
    cr_assert(eq(int, kvr_prom_u64(&p, NULL, 1, 1), KVR_ERR_INVALID));
}

Test(prom, misuse_is_invalid)
{
    struct kvr_prom_hist h = {0};
    cr_assert(eq(int, kvr_prom_u64(&p, NULL, 0, 1), KVR_ERR_INVALID)); /* no family open */
    setup();
    cr_assert(eq(int, kvr_prom_family(&p, "h_seconds", KVR_PROM_HISTOGRAM, "H."), KVR_OK));
    cr_assert(eq(int, kvr_prom_f64(&p, NULL, 0, 1), KVR_ERR_INVALID)); /* a histogram's sample */
    teardown();
    setup();
    cr_assert(eq(int, kvr_prom_family(&p, "g", KVR_PROM_GAUGE, "G."), KVR_OK));
    cr_assert(eq(int, kvr_prom_histogram(&p, NULL, 0, &h), KVR_ERR_INVALID));
    teardown();
    setup();
    cr_assert(eq(int, kvr_prom_family(&p, "h_seconds", KVR_PROM_HISTOGRAM, "H."), KVR_OK));
    cr_assert(eq(int, kvr_prom_histogram(&p, NULL, 0, NULL), KVR_ERR_INVALID));
    teardown();
    setup();
    cr_assert(eq(int, kvr_prom_family(&p, "c_total", KVR_PROM_COUNTER, "C."), KVR_OK));
    cr_assert(eq(int, kvr_prom_f64(&p, NULL, 0, -1), KVR_ERR_INVALID)); /* a counter goes up */
    teardown();
    setup();
    cr_assert(eq(int, kvr_prom_family(&p, "g", KVR_PROM_GAUGE, ""), KVR_ERR_INVALID));
    teardown();
    setup();
    cr_assert(eq(int, kvr_prom_family(&p, "g", KVR_PROM_GAUGE, NULL), KVR_ERR_INVALID));
}

Test(prom, family_once)
{
    cr_assert(eq(int, kvr_prom_gauge(&p, "a_b", "A.", 1), KVR_OK));
    cr_assert(eq(int, kvr_prom_gauge(&p, "a", "A.", 1), KVR_OK)); /* a prefix of a_b: another */
    cr_assert(eq(int, kvr_prom_gauge(&p, "b", "B.", 1), KVR_OK));
    cr_assert(eq(int, kvr_prom_gauge(&p, "a_b", "A again.", 1), KVR_ERR_INVALID));
    /* a new writer on the same buffer starts a new exposition */
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_buf_set(&b, out.data, out.len), KVR_OK));
    struct kvr_prom w;
    kvr_prom_begin(&w, &b);
    cr_assert(eq(int, kvr_prom_gauge(&w, "a_b", "A.", 1), KVR_OK));
    kvr_buf_free(&b);
}

Test(prom, first_error_sticks)
{
    cr_assert(eq(int, kvr_prom_gauge(&p, "g", "G.", 1), KVR_OK));
    size_t len = out.len;
    cr_assert(eq(int, kvr_prom_family(&p, "bad-name", KVR_PROM_GAUGE, "B."), KVR_ERR_INVALID));
    cr_assert(eq(int, kvr_prom_gauge(&p, "h", "H.", 1), KVR_ERR_INVALID));
    cr_assert(eq(int, kvr_prom_u64(&p, NULL, 0, 1), KVR_ERR_INVALID));
    cr_assert(eq(int, kvr_prom_end(&p), KVR_ERR_INVALID));
    cr_assert(eq(sz, out.len, len));
}

/* --- promtool -------------------------------------------------------------------------------- */

/* promtool's path: the first on PATH, else /usr/bin/promtool; NULL when neither exists. */
static const char *find_promtool(char *buf, size_t len)
{
    const char *path = getenv("PATH");
    while (path && *path) {
        size_t n = strcspn(path, ":");
        if (n > 0 && (size_t)snprintf(buf, len, "%.*s/promtool", (int)n, path) < len &&
            access(buf, X_OK) == 0)
            return buf;
        path += n + (path[n] == ':');
    }
    return access("/usr/bin/promtool", X_OK) == 0 ? "/usr/bin/promtool" : NULL;
}

/*
 * Under meson test --setup=valgrind (KVR_VALGRIND=1) promtool is not run: valgrind follows
 * children, and in a Go program it reports thousands of errors of Go's runtime. The exposition
 * is still written (valgrind checks that), promtool must still exist, and the plain and ASan runs
 * give its verdict.
 */
static bool under_valgrind(void)
{
    if (!getenv("KVR_VALGRIND"))
        return false;
    cr_log_info("under valgrind: promtool not run (the plain and ASan runs run it)");
    return true;
}

/* Run `promtool check metrics < file`: its exit status, and its output (stdout and stderr). */
static int promtool_check(const char *promtool, const char *file, char *output, size_t len)
{
    int fds[2];
    cr_assert(eq(int, pipe(fds), 0));
    pid_t pid = fork();
    cr_assert(ge(int, pid, 0));
    if (pid == 0) {
        int in = open(file, O_RDONLY);
        if (in < 0 || dup2(in, 0) < 0 || dup2(fds[1], 1) < 0 || dup2(fds[1], 2) < 0)
            _exit(126);
        close(fds[0]);
        execl(promtool, "promtool", "check", "metrics", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    size_t at = 0;
    ssize_t n;
    while ((n = read(fds[0], output + at, len - 1 - at)) > 0)
        at += (size_t)n;
    output[at] = 0;
    close(fds[0]);
    int status;
    cr_assert(eq(int, waitpid(pid, &status, 0), pid));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* What a router might expose: counters, gauges, a labelled family with hostile worker ids, and
 * histograms with and without labels. */
static void realistic(struct kvr_prom *w)
{
    kvr_prom_counter(w, "kvr_router_decisions_total", "Routing decisions made.", 123456);
    kvr_prom_family(w, "kvr_router_requests_total", KVR_PROM_COUNTER,
                    "Requests answered, by endpoint and result code.");
    const char *codes[] = {"ok", "no_workers", "overloaded"};
    for (size_t i = 0; i < 3; i++) {
        const struct kvr_prom_label l[] = {{"endpoint", "generate"}, {"code", codes[i]}};
        kvr_prom_u64(w, l, 2, 1000 >> i);
    }
    kvr_prom_gauge(w, "kvr_router_queue_depth", "Requests waiting for a worker.", 7);
    kvr_prom_family(w, "kvr_router_worker_active_blocks", KVR_PROM_GAUGE,
                    "Predicted KV blocks held by in-flight requests, by worker.");
    const char *ids[] = {"w-1", "w\"2\\", "w\n3", "\xff\xfe", "\xe6\x97\xa5"};
    for (size_t i = 0; i < 5; i++)
        kvr_prom_u64(w, L1("worker", ids[i]), 100 * i);
    kvr_prom_family(w, "kvr_router_worker_kv_usage_ratio", KVR_PROM_GAUGE,
                    "KV cache usage the worker reported (0..1), NaN before its first heartbeat.");
    kvr_prom_f64(w, L1("worker", "w-1"), 0.25);
    kvr_prom_f64(w, L1("worker", "w-2"), NAN);
    kvr_prom_family(w, "kvr_process_cpu_seconds_total", KVR_PROM_COUNTER, "CPU time used.");
    kvr_prom_f64(w, NULL, 0, 12.375);
    struct kvr_prom_hist h[2] = {0};
    for (uint64_t i = 0; i < 1000; i++) {
        kvr_prom_hist_observe(&h[0], 20000 + i * 997);
        kvr_prom_hist_observe(&h[1], i * i * 40000);
    }
    kvr_prom_family(w, "kvr_router_decision_duration_seconds", KVR_PROM_HISTOGRAM,
                    "Time from a request's arrival to its routing decision.");
    kvr_prom_histogram(w, L1("policy", "kv"), &h[0]);
    kvr_prom_histogram(w, L1("policy", "round_robin"), &h[1]);
    kvr_prom_family(w, "kvr_router_flush_duration_seconds", KVR_PROM_HISTOGRAM,
                    "Time to publish one outbox.");
    kvr_prom_histogram(w, NULL, 0, &h[1]);
    kvr_prom_gauge(w, "kvr_router_ready", "1 when the router answers /readyz with 200.", 1);
}

Test(prom, promtool_check_metrics_is_clean)
{
    char where[4096];
    const char *promtool = find_promtool(where, sizeof where);
    if (!promtool)
        cr_fatal("promtool not found on PATH nor as /usr/bin/promtool: install Debian's "
                 "prometheus package (bash scripts/deps.sh does)");
    realistic(&p);
    cr_assert(eq(int, kvr_prom_end(&p), KVR_OK));
    if (under_valgrind())
        return;
    char file[] = "/tmp/kvr_prom_XXXXXX";
    int fd = mkstemp(file);
    cr_assert(ge(int, fd, 0));
    cr_assert(eq(sz, (size_t)write(fd, out.data, out.len), out.len));
    close(fd);
    static char output[65536];
    int rc = promtool_check(promtool, file, output, sizeof output);
    unlink(file);
    cr_assert(eq(int, rc, 0), "promtool check metrics exited %d:\n%s\non:\n%s", rc, output, text());
    cr_assert(eq(str, output, ""), "promtool check metrics said:\n%s", output);
}

/* The same check catches what it should: a counter without _total, written by hand. */
Test(prom, promtool_sees_a_bad_exposition)
{
    char where[4096];
    const char *promtool = find_promtool(where, sizeof where);
    if (!promtool)
        cr_fatal("promtool not found on PATH nor as /usr/bin/promtool: install Debian's "
                 "prometheus package (bash scripts/deps.sh does)");
    if (under_valgrind())
        return;
    char file[] = "/tmp/kvr_prom_XXXXXX";
    int fd = mkstemp(file);
    cr_assert(ge(int, fd, 0));
    const char bad[] = "# HELP requests Requests.\n# TYPE requests counter\nrequests 1\n";
    cr_assert(eq(sz, (size_t)write(fd, bad, sizeof bad - 1), sizeof bad - 1));
    close(fd);
    static char output[65536];
    int rc = promtool_check(promtool, file, output, sizeof output);
    unlink(file);
    cr_assert(ne(int, rc, 0));
    cr_assert(strstr(output, "_total") != NULL, "%s", output);
}
