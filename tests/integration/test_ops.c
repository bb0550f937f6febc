/*
 * What an operator watches, against real processes on 127.0.0.1 (issue 11): the Prometheus
 * exposition of a router serving requests passes Debian's `promtool check metrics` and its series
 * say what happened, and so does a worker's (kvworker --metrics-addr); /readyz turns 503 within 1 s
 * of the decision path stalling (--test-stall-ms) while /healthz stays 200, and comes back after;
 * Debian's real `prometheus` server scrapes three routers and its query API gives back the requests
 * sent.
 */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

#include "harness.h"
#include "settle.h"
#include "util.h"

#define GEN      H_GEN
#define PROMTOOL "promtool"   /* Debian's prometheus package (scripts/deps.sh) */
#define PROM     "prometheus" /* the same package's server */

static struct nats_srv srv;
static natsConnection *nc;
static char dir[256]; /* a test's scratch directory, removed at its end */

static void setup(void)
{
    h_setup(&srv, 1, &nc);
}

static void teardown(void)
{
    h_teardown(&nc);
    h_rmdir(dir);
    dir[0] = 0;
}

TestSuite(ops, .init = setup, .fini = teardown, .timeout = 60);

/* --- HTTP and the exposition ------------------------------------------------------------ */

static char body[1 << 18]; /* the last answer's body */

/* GET http://127.0.0.1:port<path>: its status (0: no answer within timeout_ms), body in body. */
static int get(int port, const char *path, int timeout_ms)
{
    char url[2100];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    return h_http(url, body, sizeof body, timeout_ms);
}

/* Poll /readyz until it answers 200; asserts within timeout_ms, with the last reason. */
static void until_ready(int port, int timeout_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;
    int st = 0;
    while (h_now_ms() < end) {
        st = get(port, "/readyz", 2000);
        if (st == 200)
            return;
        h_sleep_ms(50);
    }
    cr_fatal("port %d: /readyz never answered 200 within %d ms (last: %d %s)", port, timeout_ms, st,
             body);
}

/* GET /metrics (asserted 200) into a fresh copy, to free. */
static char *scrape(int port)
{
    int st = get(port, "/metrics", 5000);
    cr_assert(eq(int, st, 200), "port %d: /metrics answered %d: %s", port, st, body);
    return strdup(body);
}

/*
 * The value of the series exactly as written (name{labels}) in an exposition; asserts that it is
 * there once.
 */
static double value(const char *text, const char *series)
{
    size_t n = strlen(series);
    const char *found = NULL;
    for (const char *at = text; (at = strstr(at, series)); at += n) {
        if ((at == text || at[-1] == '\n') && at[n] == ' ') {
            cr_assert(found == NULL, "series %s appears twice", series);
            found = at;
        }
    }
    if (!found)
        cr_fatal("no series %s in the exposition:\n%s", series, text);
    char *end;
    double v = strtod(found + n + 1, &end);
    cr_assert(end != found + n + 1, "series %s has no number", series);
    return v;
}

/* Whether a line of the exposition starts with prefix. */
static bool has_line(const char *text, const char *prefix)
{
    size_t n = strlen(prefix);
    for (const char *at = text; (at = strstr(at, prefix)); at += n)
        if (at == text || at[-1] == '\n')
            return true;
    return false;
}

/* `promtool check metrics` on text: asserts exit status 0 and no output (no lint complaint). */
static void promtool_clean(const char *text, const char *what)
{
    char path[512], cmd[700], out[8192] = "";
    snprintf(path, sizeof path, "%s/%s.prom", dir, what);
    FILE *f = fopen(path, "w");
    cr_assert(f != NULL, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, PROMTOOL " check metrics < '%s' 2>&1", path);
    FILE *p = popen(cmd, "r");
    cr_assert(p != NULL, "cannot run %s", cmd);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    bool ran = WIFEXITED(st) && WEXITSTATUS(st) != 127; /* scripts/deps.sh installs promtool */
    cr_assert(ran, "%s: promtool is not installed", cmd);
    cr_assert(st == 0 && n == 0, "promtool check metrics on %s (%s): status %d, said:\n%s", what,
              path, WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
    size_t lines = 0;
    for (const char *c = text; *c; c++)
        lines += *c == '\n';
    printf("promtool check metrics: %s, %zu lines, %zu bytes: clean\n", what, lines, strlen(text));
}

/* A router with its HTTP server on an ephemeral port (returned in *port). */
static pid_t router_http(const char *id, int *port, const char *const *extra)
{
    const char *args[16] = {"--metrics-addr", "127.0.0.1:0"};
    int n = 2;
    for (int i = 0; extra && extra[i] && n < 15; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    pid_t p = h_router(srv.url, id, args);
    *port = h_http_port(p, 10000);
    return p;
}

/* --- 1. the exposition ------------------------------------------------------------------ */

Test(ops, metrics_pass_promtool)
{
    h_tmpdir(dir, sizeof dir, "ops");
    int port;
    router_http("r1", &port, NULL);
    h_worker(srv.url, "1", 1, 200, NULL);
    until_ready(port, 15000);

    char *m = scrape(port); /* one worker, nothing served yet */
    promtool_clean(m, "router-idle");
    cr_assert(eq(dbl, value(m, "kvrouter_workers"), 1));
    cr_assert(eq(dbl, value(m, "kvrouter_requests_total{endpoint=\"generate\"}"), 0));
    cr_assert(eq(dbl, value(m, "kvrouter_worker_prefill_share_ratio{worker=\"1\"}"), 0),
              "no prefill booked yet");
    free(m);

    enum { N = 5 }; /* one after another, sharing a 256-token prefix (4 blocks) */
    for (int i = 0; i < N; i++) {
        char id[32];
        snprintf(id, sizeof id, "ops-%d", i);
        struct h_result r = h_ask(nc, GEN, id, 10 + (uint32_t)i, 256, 512, 4, 10000);
        cr_assert(r.final && r.error_code == 0, "request %d: error %u", i, r.error_code);
    }
    struct h_req q; /* one more, long (600 tokens out at real speed): scraped while it runs */
    cr_assert(h_send(nc, GEN, &q, "ops-long", 99, 256, 512, 600));
    cr_assert(eq(u64, h_first_worker(&q, 10000), 1), "the long request started on worker 1");
    m = scrape(port);
    promtool_clean(m, "router-busy");
    double active = value(m, "kvrouter_worker_active_blocks{worker=\"1\"}");
    double inflight = value(m, "kvrouter_worker_inflight_requests{worker=\"1\"}");
    printf("while one request runs: active_blocks{worker=1} %.0f, inflight_requests{worker=1} "
           "%.0f, kvrouter_inflight_requests %.0f\n",
           active, inflight, value(m, "kvrouter_inflight_requests"));
    cr_assert(ge(dbl, active, 8), "the request holds its 8 prompt blocks, at least");
    /* six prompts of 512 tokens (the first whole, the others less their 4 shared blocks), each
     * some 17-24 ms of the model's prefill, within the last seconds of a 10 s window */
    double share = value(m, "kvrouter_worker_prefill_share_ratio{worker=\"1\"}");
    printf("prefill_share_ratio{worker=1} %.5f\n", share);
    cr_assert(gt(dbl, share, 0.005), "the prefills booked on worker 1 take a share of its time");
    cr_assert(lt(dbl, share, 0.02));
    cr_assert(eq(dbl, inflight, 1));
    cr_assert(eq(dbl, value(m, "kvrouter_inflight_requests"), 1));
    free(m);
    cr_assert(h_collect(&q, 30000) && q.res.error_code == 0, "the long request: error %u",
              q.res.error_code);

    /* once its done event is in, the predicted load is back to nothing */
    uint64_t end = h_now_ms() + 5000;
    for (;;) {
        m = scrape(port);
        if (value(m, "kvrouter_worker_active_blocks{worker=\"1\"}") == 0 &&
            value(m, "kvrouter_worker_inflight_requests{worker=\"1\"}") == 0)
            break;
        cr_assert(lt(u64, h_now_ms(), end), "the finished request still counted:\n%s", m);
        free(m);
        h_sleep_ms(50);
    }
    promtool_clean(m, "router-after");
    const double sent = N + 1;
    double req = value(m, "kvrouter_requests_total{endpoint=\"generate\"}");
    double dec = value(m, "kvrouter_decision_seconds_count{endpoint=\"generate\"}");
    double inf = value(m, "kvrouter_decision_seconds_bucket{endpoint=\"generate\",le=\"+Inf\"}");
    double sum = value(m, "kvrouter_decision_seconds_sum{endpoint=\"generate\"}");
    double overlap = value(m, "kvrouter_routed_overlap_blocks_total");
    double cpu = value(m, "process_cpu_seconds_total");
    printf("after %.0f requests: requests_total %.0f, decisions_total %.0f, decision_seconds "
           "count %.0f sum %.6f, routed_blocks_total %.0f, routed_overlap_blocks_total %.0f, "
           "process_cpu_seconds_total %.3f\n",
           sent, req, value(m, "kvrouter_decisions_total"), dec, sum,
           value(m, "kvrouter_routed_blocks_total"), overlap, cpu);
    cr_assert(eq(dbl, req, sent));
    cr_assert(eq(dbl, dec, sent));
    cr_assert(eq(dbl, inf, sent));
    cr_assert(eq(dbl, value(m, "kvrouter_decisions_total"), sent));
    cr_assert(eq(dbl, value(m, "kvrouter_requests_total{endpoint=\"select\"}"), 0));
    cr_assert(gt(dbl, sum, 0), "decisions take some time");
    cr_assert(lt(dbl, sum, sent), "under a second each");
    cr_assert(eq(dbl, value(m, "kvrouter_routed_blocks_total"), sent * 8));
    cr_assert(ge(dbl, overlap, 4), "later requests found the shared prefix's 4 blocks cached");
    cr_assert(le(dbl, overlap, (sent - 1) * 4));
    cr_assert(eq(dbl, value(m, "kvrouter_workers"), 1));
    cr_assert(eq(dbl, value(m, "kvrouter_worker_capacity_blocks{worker=\"1\"}"), 16384));
    cr_assert(eq(dbl, value(m, "kvrouter_ready"), 1));
    cr_assert(eq(dbl, value(m, "kvrouter_queue_depth"), 0));
    bool errors = has_line(m, "kvrouter_errors_total{");
    cr_assert(eq(int, errors, 0), "no errors:\n%s", m);
    cr_assert(gt(dbl, cpu, 0));
    free(m);
    h_end();
}

/*
 * The worker's exposition (kvworker --metrics-addr, its families prefixed kvworker_): a test of its
 * own, so that the router's above stands whatever the worker's says.
 */
Test(ops, worker_metrics_pass_promtool)
{
    h_tmpdir(dir, sizeof dir, "ops");
    int rport;
    router_http("r1", &rport, NULL);
    pid_t w = h_worker(srv.url, "1", 1, 200, H_ARGS("--metrics-addr", "127.0.0.1:0"));
    int port = h_http_port(w, 10000);
    until_ready(port, 15000);
    until_ready(rport, 15000);
    cr_assert(eq(int, get(port, "/healthz", 2000), 200));

    char *m = scrape(port);
    promtool_clean(m, "worker-idle");
    cr_assert(eq(dbl, value(m, "kvworker_requests_total"), 0));
    free(m);

    enum { N = 4 };
    for (int i = 0; i < N; i++) {
        char id[32];
        snprintf(id, sizeof id, "wk-%d", i);
        struct h_result r = h_ask(nc, GEN, id, 20 + (uint32_t)i, 256, 512, 4, 10000);
        cr_assert(r.final && r.error_code == 0, "request %d: error %u", i, r.error_code);
    }
    struct h_req q; /* a long one, scraped while the engine runs it */
    cr_assert(h_send(nc, GEN, &q, "wk-long", 98, 256, 512, 600));
    cr_assert(eq(u64, h_first_worker(&q, 10000), 1));
    m = scrape(port);
    promtool_clean(m, "worker-busy");
    double held = value(m, "kvworker_held_requests");
    double running = value(m, "kvworker_engine_running_requests");
    double active = value(m, "kvworker_engine_active_blocks");
    printf("worker, while one request runs: held_requests %.0f, engine_running_requests %.0f, "
           "engine_active_blocks %.0f, engine_kv_usage_ratio %g\n",
           held, running, active, value(m, "kvworker_engine_kv_usage_ratio"));
    cr_assert(eq(dbl, held, 1));
    cr_assert(eq(dbl, running, 1));
    cr_assert(ge(dbl, active, 8), "its 8 prompt blocks, at least");
    free(m);
    cr_assert(h_collect(&q, 30000) && q.res.error_code == 0);

    uint64_t end = h_now_ms() + 5000;
    for (;;) {
        m = scrape(port);
        if (value(m, "kvworker_held_requests") == 0 &&
            value(m, "kvworker_engine_active_blocks") == 0)
            break;
        cr_assert(lt(u64, h_now_ms(), end), "the finished request still held:\n%s", m);
        free(m);
        h_sleep_ms(50);
    }
    promtool_clean(m, "worker-after");
    const double sent = N + 1;
    printf("worker, after %.0f requests: requests_total %.0f, served_total %.0f, "
           "request_seconds_count %.0f, engine_cached_blocks %.0f, engine_steps_total %.0f\n",
           sent, value(m, "kvworker_requests_total"), value(m, "kvworker_served_total"),
           value(m, "kvworker_request_seconds_count"), value(m, "kvworker_engine_cached_blocks"),
           value(m, "kvworker_engine_steps_total"));
    cr_assert(eq(dbl, value(m, "kvworker_requests_total"), sent));
    cr_assert(eq(dbl, value(m, "kvworker_served_total"), sent));
    cr_assert(eq(dbl, value(m, "kvworker_request_seconds_count"), sent));
    cr_assert(eq(dbl, value(m, "kvworker_engine_capacity_blocks"), 16384));
    cr_assert(ge(dbl, value(m, "kvworker_engine_cached_blocks"), 4), "the shared prefix stays");
    cr_assert(ge(dbl, value(m, "kvworker_engine_steps_total"), 600));
    bool errors = has_line(m, "kvworker_errors_total{");
    cr_assert(eq(int, errors, 0), "no errors:\n%s", m);
    free(m);
    h_end();
}

/* --- 2. readiness when the decision path stalls ------------------------------------------- */

Test(ops, readyz_false_within_1s_of_a_stall)
{
    enum { STALL_MS = 3000, EVERY_MS = 50, PROBE_MS = 2000 /* under the stall: a hang shows */ };
    int port;
    pid_t r = router_http("r1", &port, H_ARGS("--test-stall-ms", "3000"));
    h_worker(srv.url, "1", 50, 200, NULL);
    until_ready(port, 15000);
    cr_assert(eq(int, get(port, "/healthz", PROBE_MS), 200));
    struct h_result ok = h_ask(nc, GEN, "before", 1, 0, 128, 2, 10000);
    cr_assert(ok.final && ok.error_code == 0);

    uint64_t t0 = h_now_ms();
    cr_assert(eq(int, natsConnection_PublishString(nc, "kv.default.router.stall", ""), NATS_OK));
    cr_assert(eq(int, natsConnection_FlushTimeout(nc, 2000), NATS_OK));
    int64_t not_ready = -1, ready_again = -1;
    int probes = 0, metrics_during = 0;
    uint64_t slowest = 0;
    char reason[512] = "";
    while (ready_again < 0 && h_now_ms() - t0 < STALL_MS + 10000) {
        uint64_t a = h_now_ms();
        int st = get(port, "/readyz", PROBE_MS);
        uint64_t took = h_now_ms() - a;
        slowest = took > slowest ? took : slowest;
        probes++;
        cr_assert(st == 200 || st == 503,
                  "/readyz probe %d, %llu ms after the stall began: status %d after %llu ms "
                  "(0: no answer within %d ms)",
                  probes, (unsigned long long)(a - t0), st, (unsigned long long)took, PROBE_MS);
        if (st == 503)
            cr_assert(gt(sz, strlen(body), 1), "a 503 from /readyz gives a reason");
        if (st == 503 && not_ready < 0) {
            not_ready = (int64_t)(h_now_ms() - t0);
            snprintf(reason, sizeof reason, "%.*s", (int)sizeof reason - 1, body); /* its head */
            reason[strcspn(reason, "\n")] = 0;
            /* a scrape meanwhile answers too: 503, it cannot read the state */
            metrics_during = get(port, "/metrics", PROBE_MS);
        }
        if (st == 200 && not_ready >= 0)
            ready_again = (int64_t)(h_now_ms() - t0);
        int h = get(port, "/healthz", PROBE_MS);
        cr_assert(eq(int, h, 200), "/healthz %llu ms after the stall began: %d",
                  (unsigned long long)(h_now_ms() - t0), h);
        h_sleep_ms(EVERY_MS);
    }
    printf("stall of %d ms: /readyz 503 after %lld ms (\"%s\"), ready again after %lld ms; "
           "%d probes, the slowest answered in %llu ms; /metrics during the stall: %d\n",
           STALL_MS, (long long)not_ready, reason, (long long)ready_again, probes,
           (unsigned long long)slowest, metrics_during);
    cr_assert(h_log_has(r, "msg=test_stall"), "the router stalled");
    cr_assert(ge(i64, not_ready, 0), "/readyz never said not ready");
    cr_assert(le(i64, not_ready, 1000), "/readyz said not ready %lld ms after the stall began",
              (long long)not_ready);
    cr_assert(eq(int, metrics_during, 503), "/metrics while the state lock is held");
    cr_assert(ge(i64, ready_again, 0), "/readyz never said ready again after the stall");
    cr_assert(gt(i64, ready_again, STALL_MS - 500), "not ready while the stall lasted");
    struct h_result after = h_ask(nc, GEN, "after", 2, 0, 128, 2, 10000);
    cr_assert(after.final && after.error_code == 0, "served after the stall");
    h_end();
}

/* The events' handler held for 2 s (as a long burst of KV events would hold it) while the state
 * lock is free and the ticks come on time: the worker's heartbeats wait in the queue behind it,
 * and a worker heard late is not a worker gone. */
Test(ops, a_worker_whose_heartbeats_wait_in_the_queue_is_kept)
{
    enum { STALL_MS = 2000 };
    int port;
    pid_t r = router_http("r1", &port, H_ARGS("--test-stall-ms", "2000"));
    h_worker(srv.url, "1", 50, 100, NULL); /* judged lost after 320 ms of silence */
    until_ready(port, 15000);
    struct h_result ok = h_ask(nc, GEN, "before", 1, 0, 128, 2, 10000);
    cr_assert(ok.final && ok.error_code == 0);
    uint64_t t0 = h_now_ms();
    cr_assert(eq(int, natsConnection_PublishString(nc, "kv.default.ev.stall", ""), NATS_OK));
    cr_assert(eq(int, natsConnection_FlushTimeout(nc, 2000), NATS_OK));
    h_sleep_ms(STALL_MS / 2);
    uint64_t at = h_now_ms() - t0;
    char *m = scrape(port); /* the state lock is free: a scrape answers during the stall */
    double behind = value(m, "kvrouter_events_behind_seconds");
    double workers = value(m, "kvrouter_workers");
    free(m);
    h_sleep_ms(STALL_MS / 2 + 500);
    char v[32] = "";
    bool warned = h_log_value(r, "events_behind", "ms", v, sizeof v, 1000);
    cr_assert(h_log_has(r, "msg=test_stall_events"), "the events' handler was held");
    printf("events' handler held %d ms: %.3f s behind after %llu ms, events_behind ms=%s, "
           "workers %g during it\n",
           STALL_MS, behind, (unsigned long long)at, v, workers);
    cr_assert(ge(dbl, behind, 0.5), "/metrics showed the handler %.3f s behind", behind);
    cr_assert(eq(dbl, workers, 1), "the worker was kept during the stall");
    cr_assert(warned, "the router warned that it ran behind");
    cr_assert(not(h_log_has(r, "msg=worker_left")), "the worker was never dropped");
    struct h_result after = h_ask(nc, GEN, "after", 2, 0, 128, 2, 10000);
    cr_assert(after.final && after.error_code == 0, "served after (error %u)", after.error_code);
    cr_assert(h_log_has(r, "msg=events_caught_up"), "and it said it caught up");
    h_end();
}

/* --- 3. a real Prometheus ----------------------------------------------------------------- */

/* Percent-encode s (a PromQL query) for a URL query string. */
static void url_encode(const char *s, char *out, size_t len)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = 0;
    for (; *s && n + 4 < len; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            strchr("-_.~()", c)) {
            out[n++] = (char)c;
        } else {
            out[n++] = '%';
            out[n++] = hex[c >> 4];
            out[n++] = hex[c & 15];
        }
    }
    out[n] = 0;
}

/* /api/v1/query?query=promql on Prometheus at port: data.result (to json_decref), or NULL. */
static json_t *query(int port, const char *promql)
{
    char q[600], path[2000];
    url_encode(promql, q, sizeof q);
    snprintf(path, sizeof path, "/api/v1/query?query=%s", q);
    if (get(port, path, 5000) != 200)
        return NULL;
    json_t *o = json_loads(body, 0, NULL);
    const char *status = json_string_value(json_object_get(o, "status"));
    json_t *res = status && !strcmp(status, "success") ? h_json_at(o, "data.result") : NULL;
    json_incref(res);
    json_decref(o);
    return json_is_array(res) ? res : (json_decref(res), NULL);
}

/* A result sample's value ("value": [time, "v"]). */
static double sample(json_t *r)
{
    const char *v = json_string_value(json_array_get(json_object_get(r, "value"), 1));
    return v ? strtod(v, NULL) : -1;
}

Test(ops, a_real_prometheus_scrapes_three_routers)
{
    enum { ROUTERS = 3, N = 30, AT_ONCE = 10 };
    h_tmpdir(dir, sizeof dir, "prom");
    int port[ROUTERS];
    for (int i = 0; i < ROUTERS; i++) {
        char id[16];
        snprintf(id, sizeof id, "r%d", i + 1);
        router_http(id, &port[i], NULL);
    }
    h_worker(srv.url, "1", 50, 200, NULL);

    /* Prometheus, scraping the three every second */
    char conf[512], tsdb[512], listen[64];
    snprintf(conf, sizeof conf, "%s/prometheus.yml", dir);
    snprintf(tsdb, sizeof tsdb, "--storage.tsdb.path=%s/tsdb", dir);
    int pport = h_free_port();
    snprintf(listen, sizeof listen, "--web.listen-address=127.0.0.1:%d", pport);
    FILE *f = fopen(conf, "w");
    cr_assert(f != NULL, "cannot write %s", conf);
    fprintf(f, "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
               "  - job_name: kvrouter\n    static_configs:\n      - targets:\n");
    for (int i = 0; i < ROUTERS; i++)
        fprintf(f, "          - 127.0.0.1:%d\n", port[i]);
    fclose(f);
    char config_arg[600];
    snprintf(config_arg, sizeof config_arg, "--config.file=%s", conf);
    uint64_t t_prom = h_now_ms();
    pid_t prom = h_spawn_prog(PROM, "prometheus", H_ARGS(config_arg, tsdb, listen));
    cr_assert(gt(int, prom, 0), "cannot start %s", PROM);

    for (int i = 0; i < ROUTERS; i++)
        until_ready(port[i], 20000);
    static struct h_req q[N];
    for (int i = 0; i < N; i += AT_ONCE) {
        for (int k = i; k < i + AT_ONCE; k++) {
            char id[32];
            snprintf(id, sizeof id, "prom-%d", k);
            cr_assert(h_send(nc, GEN, &q[k], id, 100 + (uint32_t)k, 0, 256, 4));
        }
        for (int k = i; k < i + AT_ONCE; k++)
            cr_assert(h_collect(&q[k], 10000) && q[k].res.error_code == 0, "request %d: error %u",
                      k, q[k].res.error_code);
    }
    uint64_t t_sent = h_now_ms();
    double direct = 0; /* what the routers themselves say */
    printf("requests_total{endpoint=generate} by router:");
    for (int i = 0; i < ROUTERS; i++) {
        char *m = scrape(port[i]);
        double v = value(m, "kvrouter_requests_total{endpoint=\"generate\"}");
        printf(" r%d %.0f", i + 1, v);
        direct += v;
        free(m);
    }
    printf("\n");
    cr_assert(eq(dbl, direct, N), "the routers counted %.0f of %d requests", direct, N);

    const char *promql = "sum(kvrouter_requests_total{endpoint=\"generate\"})";
    double got = -1;
    while (h_now_ms() - t_sent < 30000 && got != N) {
        bool gone = h_exited(prom);
        cr_assert(eq(int, gone, 0), "prometheus exited");
        json_t *res = query(pport, promql);
        got = json_array_size(res) == 1 ? sample(json_array_get(res, 0)) : -1;
        json_decref(res);
        if (got != N)
            h_sleep_ms(250);
    }
    uint64_t t_seen = h_now_ms();
    if (got != N)
        h_print_tail(prom, 15);
    cr_assert(eq(dbl, got, N), "Prometheus: %s = %.0f, %d sent (last answer: %s)", promql, got, N,
              body);
    printf("Prometheus (started %llu ms before the requests were done): %s = %.0f, %llu ms after "
           "the last request\n",
           (unsigned long long)(t_sent - t_prom), promql, got,
           (unsigned long long)(t_seen - t_sent));

    json_t *up = query(pport, "up{job=\"kvrouter\"}");
    cr_assert(up != NULL, "Prometheus answered no up series: %s", body);
    cr_assert(eq(sz, json_array_size(up), ROUTERS), "up series: %s", body);
    size_t i;
    json_t *r;
    json_array_foreach(up, i, r)
    {
        const char *inst = json_string_value(h_json_at(r, "metric.instance"));
        printf("up{instance=\"%s\"} %.0f\n", inst ? inst : "?", sample(r));
        cr_assert(eq(dbl, sample(r), 1), "target %s is not up", inst ? inst : "?");
        bool ours = false;
        for (int k = 0; k < ROUTERS && inst; k++) {
            char want[32];
            snprintf(want, sizeof want, "127.0.0.1:%d", port[k]);
            ours |= !strcmp(inst, want);
        }
        cr_assert(ours, "an up series for %s, not one of the routers", inst ? inst : "?");
    }
    json_decref(up);

    h_signal(prom, SIGTERM);
    int st = h_wait(prom, 10000);
    cr_assert(eq(int, st, 0), "prometheus exit status on SIGTERM");
    h_end();
}

/* --- kvbench --mode hop prints the router's own CPU per routed request --------------------- */

Test(ops, hop_prints_the_routers_cpu_per_request)
{
    h_worker(srv.url, "1", 1, 200, H_ARGS("--null"));
    h_router(srv.url, "r1", H_ARGS("--gossip=false"));
    h_until_served(nc, GEN, 1, 15000);
    const char *bench[] = {"--nats",      srv.url,         "--mode", "hop",          "--requests",
                           "100",         "--hop-seconds", "1",      "--hop-window", "16",
                           "--log-level", "error",         NULL};
    pid_t b = h_spawn("kvbench", bench);
    cr_assert(eq(int, h_wait(b, 30000), 0), "kvbench --mode hop failed");
    cr_assert(h_log_has(b, " router_cpu_us_per_request="), "no router CPU in the summary line");
    cr_assert(eq(int, h_log_has(b, "router_cpu_us_per_request=na"), 0), "no router CPU read");
    cr_assert(h_log_has(b, "routers (max-rate phase): 1 answered"));
    h_end();
}

/* kvbench --per-request: requests.csv in out_dir, a line per request answered of its three runs of
 * 40 requests on workers 1 and 2, with what a client sees (no queue time: an empty field). */
static void check_requests_csv(const char *out_dir)
{
    char path[512], line[512];
    snprintf(path, sizeof path, "%s/requests.csv", out_dir);
    FILE *f = fopen(path, "r");
    cr_assert(f != NULL, "no %s", path);
    cr_assert(fgets(line, sizeof line, f) != NULL);
    cr_assert(eq(str, line,
                 "run,load,request,group,worker,arrival_ms,isl,osl,cached_tokens,preemptions,"
                 "queue_ms,ttft_ms,e2e_ms,itl_mean_ms,itl_max_ms\n"));
    int lines = 0, kv = 0;
    while (fgets(line, sizeof line, f)) {
        char run[32], rest[256];
        unsigned request, isl, osl, cached;
        unsigned long long group, worker;
        double load, arrival, ttft, e2e;
        int n = sscanf(line, "%31[^,],%lf,%u,%llu,%llu,%lf,%u,%u,%u,,,%lf,%lf,%255s", run, &load,
                       &request, &group, &worker, &arrival, &isl, &osl, &cached, &ttft, &e2e, rest);
        cr_assert(eq(int, n, 12), "a line of requests.csv: %s", line);
        cr_assert(worker == 1 || worker == 2, "worker %llu", worker);
        cr_assert(lt(u32, request, 40));
        cr_assert(eq(u32, osl, 4), "--max-tokens 4");
        cr_assert(gt(dbl, ttft, 0));
        cr_assert(le(dbl, ttft, e2e));
        kv += !strcmp(run, "kv");
        lines++;
    }
    fclose(f);
    cr_assert(eq(int, lines, 120), "three runs of 40 requests answered");
    cr_assert(eq(int, kv, 40));
}

/* --- kvbench --mode load ends with the lines a newcomer reads ---------------------------- */

/* The first len - 1 bytes of the file at path into text, a string. */
static void read_head(const char *path, char *text, size_t len)
{
    FILE *f = fopen(path, "r");
    cr_assert(f != NULL, "no %s", path);
    size_t n = fread(text, 1, len - 1, f);
    fclose(f);
    text[n] = 0;
}

Test(ops, load_ends_with_a_verdict_and_the_hit_ceiling)
{
    char out_dir[256], path[512], want[1024];
    h_tmpdir(out_dir, sizeof out_dir, "verdict");
    h_worker(srv.url, "1", 50, 200, NULL);
    h_worker(srv.url, "2", 50, 200, NULL);
    h_router(srv.url, "r1", NULL);
    h_until_served(nc, GEN, 1, 15000);
    const char *bench[] = {
        "--nats",        srv.url,
        "--workload",    "conversation",
        "--trace",       KVR_SOURCE_ROOT "/tests/fixtures/conversation_head.jsonl",
        "--requests",    "40",
        "--rate-scale",  "200",
        "--max-tokens",  "4",
        "--policies",    "kv,round_robin,random",
        "--out",         out_dir,
        "--log-level",   "error",
        "--per-request", NULL};
    pid_t b = h_spawn("kvbench", bench);
    cr_assert(eq(int, h_wait(b, 60000), 0), "kvbench --mode load failed");
    check_requests_csv(out_dir);
    cr_assert(h_log_has(b, "\nIn short: on 2 workers, 40 requests of conversation (3 runs, "));
    cr_assert(h_log_has(b, " s), kv's p90 time to first token was "));
    cr_assert(h_log_has(b, " ms against round_robin's "));
    cr_assert(h_log_has(b, "Why: the workers' caches served "));
    cr_assert(h_log_has(b, "; against random, the best of the others, p90 "));
    cr_assert(h_log_has(b, "% of ceiling 0."), "each row's hit rate against the ceiling");
    snprintf(want, sizeof want, "Report and plots: %s/report.md, %s/*.png\n", out_dir, out_dir);
    cr_assert(h_log_has(b, want), "the report's place");
    char text[4096];
    snprintf(path, sizeof path, "%s/report.json", out_dir);
    read_head(path, text, sizeof text);
    cr_assert(strstr(text, "\"hit_ceiling\": 0.") != NULL, "report.json's ceiling: %s", text);
    const char *key = "\"itl_per_request_ms\": {\"mean\": ";
    const char *itl = strstr(text, key);
    double itl_ms = 0;
    cr_assert(itl != NULL, "report.json's per-request ITL: %s", text);
    cr_assert(eq(int, sscanf(itl + strlen(key), "%lf", &itl_ms), 1));
    cr_assert(gt(dbl, itl_ms, 0), "every request had 4 tokens: its gaps have a mean");
    snprintf(path, sizeof path, "%s/report.md", out_dir);
    read_head(path, text, sizeof text);
    cr_assert(strstr(text, "| ITL/request mean ms |") != NULL, "report.md's per-request ITL: %s",
              text);
    h_rmdir(out_dir);
    h_end();
}

/* --- the stop signals reach no thread but the one that waits for them ------------------------ */

/* How many of pid's threads but its first block both SIGTERM and SIGINT, of *nthreads (the first,
 * main, waits for them: sigtimedwait unblocks them while it waits). */
static int threads_blocking_stop(pid_t pid, int *nthreads)
{
    char cmd[160], line[256];
    snprintf(cmd, sizeof cmd,
             "for t in /proc/%d/task/*; do [ ${t##*/} = %d ] || grep -h '^SigBlk:' $t/status; done",
             (int)pid, (int)pid);
    FILE *f = popen(cmd, "r");
    cr_assert(f != NULL);
    int blocking = 0;
    *nthreads = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long mask = strtoull(line + 7, NULL, 16);
        unsigned long long stop = (1ull << (SIGTERM - 1)) | (1ull << (SIGINT - 1));
        (*nthreads)++;
        blocking += (mask & stop) == stop;
    }
    pclose(f);
    return blocking;
}

Test(ops, every_thread_of_a_daemon_blocks_the_stop_signals)
{
    /* a stop signal run as a handler lands on any thread, nats.c's reader among them: its read
     * fails with EINTR and nats.c drops the connection as the drain begins. Blocked in every
     * thread, the signal is taken by the one that waits for it (and the drain still runs: h_end
     * stops each daemon with SIGTERM and wants exit status 0) */
    pid_t w = h_worker(srv.url, "1", 50, 200, NULL);
    pid_t r = h_router(srv.url, "r1", H_ARGS("--metrics-addr", "127.0.0.1:0"));
    h_until_served(nc, GEN, 1, 15000);
    pid_t daemons[] = {w, r};
    for (int i = 0; i < 2; i++) {
        int n = 0, blocking = threads_blocking_stop(daemons[i], &n);
        cr_assert(gt(int, n, 2), "pid %d: %d threads", (int)daemons[i], n);
        cr_expect(eq(int, blocking, n), "pid %d: %d of its other %d threads block SIGTERM, SIGINT",
                  (int)daemons[i], blocking, n);
    }
    h_end();
}

/* --- a link's close and its running handlers (kvr_settle) ------------------------------------ */

struct slow {
    atomic_int started, finished;
    int sleep_ms;
};

static void slow_handler(natsConnection *c, natsSubscription *sub, natsMsg *m, void *ctx)
{
    (void)c;
    (void)sub;
    struct slow *s = ctx;
    atomic_store(&s->started, 1);
    usleep((useconds_t)s->sleep_ms * 1000);
    atomic_store(&s->finished, 1);
    natsMsg_Destroy(m);
}

/* A tracked subscription (s's handler), unsubscribed while its handler runs: the record. */
static struct kvr_settle *unsubscribed_running(struct slow *s, natsSubscription **sub)
{
    struct kvr_settle *st = kvr_settle_new();
    cr_assert(st != NULL);
    cr_assert(
        eq(int, kvr_settle_subscribe(st, sub, nc, "test.slow", NULL, slow_handler, s), NATS_OK));
    cr_assert(eq(int, natsConnection_PublishString(nc, "test.slow", "x"), NATS_OK));
    cr_assert(eq(int, natsConnection_Flush(nc), NATS_OK));
    for (int i = 0; i < 400 && !atomic_load(&s->started); i++)
        usleep(5000);
    cr_assert(atomic_load(&s->started));
    cr_assert(eq(int, natsSubscription_Unsubscribe(*sub), NATS_OK));
    return st;
}

/* nats.c's unsubscribe returns while the handler runs; the close's wait returns after it. */
Test(ops, a_close_waits_out_a_handler_that_is_running)
{
    struct slow s = {.sleep_ms = 300};
    natsSubscription *sub = NULL;
    struct kvr_settle *st = unsubscribed_running(&s, &sub);
    cr_assert(not(atomic_load(&s.finished)), "the unsubscribe did not wait for the handler");
    cr_assert(kvr_settle_wait_free(st, 5000));
    cr_assert(atomic_load(&s.finished), "the wait did");
    natsSubscription_Destroy(sub);
    h_end();
}

/* A wait that gives up says so, and the record stays for the late completion (which frees it:
 * the sanitizer and valgrind stages see neither a leak nor a use after free). */
Test(ops, a_close_that_gives_up_on_a_handler_leaves_it_safe)
{
    struct slow s = {.sleep_ms = 400};
    natsSubscription *sub = NULL;
    struct kvr_settle *st = unsubscribed_running(&s, &sub);
    cr_assert(not(kvr_settle_wait_free(st, 20)), "the handler still runs");
    for (int i = 0; i < 400 && !atomic_load(&s.finished); i++)
        usleep(5000);
    cr_assert(atomic_load(&s.finished));
    usleep(100 * 1000); /* its completion comes right after */
    natsSubscription_Destroy(sub);
    h_end();
}

/* --- a connection's close and its running callbacks (kvr_conn_destroy) ---------------------- */

struct cut_hook {
    atomic_int started, finished;
};

static void slow_cut(void *ctx)
{
    struct cut_hook *h = ctx;
    atomic_store(&h->started, 1);
    usleep(300 * 1000);
    atomic_store(&h->finished, 1);
}

/* A hook of the connection running when its owner closes it (its server went away a moment
 * before): the close returns only after the hook, so the owner may free what the hook reads
 * (nats.c's natsConnection_Destroy returns at once). */
Test(ops, a_connection_close_waits_out_its_running_callback)
{
    struct nats_srv lone = {0};
    cr_assert(h_nats_start(&lone, 0));
    struct kvr_nats_config c;
    kvr_nats_config_default(&c, KVR_LOG_ERROR);
    snprintf(c.urls, sizeof c.urls, "%s", lone.url);
    struct cut_hook *h = calloc(1, sizeof *h);
    cr_assert(h != NULL);
    struct kvr_conn_hooks hooks = {"test-cut", slow_cut, NULL, h};
    natsConnection *conn = NULL;
    cr_assert(eq(int, kvr_connect_hooked(&c, &hooks, &conn), KVR_OK));
    h_nats_stop(&lone); /* the disconnected callback runs the hook */
    for (int i = 0; i < 400 && !atomic_load(&h->started); i++)
        usleep(5000);
    cr_assert(atomic_load(&h->started), "the cut hook ran");
    kvr_conn_destroy(conn);
    cr_assert(atomic_load(&h->finished), "the close waited for the running hook");
    free(h); /* what it read: safe now (ASan and valgrind would see a late hook) */
    h_end();
}
