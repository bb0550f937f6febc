/*
 * The operators' HTTP server (src/net/httpd): a real server on 127.0.0.1 (an ephemeral port)
 * fetched over raw sockets: /metrics, /healthz, /readyz with GET and HEAD, 404 and 405, readiness
 * flipping with its reason, a failing metrics hook, bad addresses and configurations, a port in
 * use, oversized and malformed requests, the connection limit and idle timeout, a slow hook not
 * holding a probe, no CPU when idle, and stop then start again.
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "httpd.h"
#include "prom.h"

/* --- the daemon's side: hooks on shared state --------------------------------------------------
 */

static struct {
    pthread_mutex_t lock;
    bool alive;             /* healthz's answer */
    bool ready;             /* readyz's answer */
    char why[300];          /* readyz's reason when not ready */
    bool fill_why;          /* readyz fills all of why without a NUL */
    kvr_status metrics_st;  /* what the metrics hook returns */
    unsigned metrics_sleep; /* ms the metrics hook takes */
    unsigned calls;         /* hook calls */
} d = {.lock = PTHREAD_MUTEX_INITIALIZER};

static kvr_status metrics_hook(void *ctx, struct kvr_buf *out)
{
    cr_assert(eq(ptr, ctx, &d));
    pthread_mutex_lock(&d.lock);
    kvr_status st = d.metrics_st;
    unsigned ms = d.metrics_sleep;
    d.calls++;
    pthread_mutex_unlock(&d.lock);
    if (ms)
        nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000}, NULL);
    struct kvr_prom p;
    kvr_prom_begin(&p, out);
    kvr_prom_counter(&p, "kvr_test_requests_total", "Requests.", 7);
    kvr_prom_gauge(&p, "kvr_test_ready", "Readiness.", 1);
    return st != KVR_OK ? st : kvr_prom_end(&p); /* on failure out is partial: freed unserved */
}

static bool healthz_hook(void *ctx)
{
    pthread_mutex_lock(&d.lock);
    bool alive = d.alive;
    d.calls++;
    pthread_mutex_unlock(&d.lock);
    return alive;
}

static bool readyz_hook(void *ctx, char *why, size_t len)
{
    pthread_mutex_lock(&d.lock);
    bool ready = d.ready;
    if (!ready && d.fill_why)
        memset(why, 'x', len);
    else if (!ready)
        snprintf(why, len, "%s", d.why);
    d.calls++;
    pthread_mutex_unlock(&d.lock);
    return ready;
}

static const struct kvr_httpd_hooks hooks = {metrics_hook, healthz_hook, readyz_hook, &d};

static struct kvr_httpd *srv;
static uint16_t port;

static struct kvr_httpd *start(const struct kvr_httpd_config *c, const struct kvr_httpd_hooks *h)
{
    char why[512] = "";
    struct kvr_httpd *s = NULL;
    kvr_status st = kvr_httpd_start(c, h, &s, why, sizeof why);
    cr_assert(eq(int, st, KVR_OK), "%s", why);
    cr_assert(ne(ptr, s, NULL));
    cr_assert(ne(u16, kvr_httpd_port(s), 0));
    return s;
}

static void setup(void)
{
    d.alive = true;
    d.ready = true;
    d.why[0] = 0;
    d.fill_why = false;
    d.metrics_st = KVR_OK;
    d.metrics_sleep = 0;
    d.calls = 0;
    srv = start(&(struct kvr_httpd_config){.addr = "127.0.0.1:0"}, &hooks);
    port = kvr_httpd_port(srv);
}

static void teardown(void)
{
    kvr_httpd_stop(srv);
    srv = NULL;
}

TestSuite(httpd, .init = setup, .fini = teardown, .timeout = 60);

/* --- the client: raw sockets ----------------------------------------------------------------- */

struct resp {
    int code;         /* the status line's code; 0 when the server closed without one */
    char head[8192];  /* status line and headers */
    char body[65536]; /* the body, NUL-terminated */
    size_t body_len;  /* its length */
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* A connection to the server, reads timing out after 8 s. */
static int dial(uint16_t to)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(ge(int, fd, 0));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(to)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert(eq(int, connect(fd, (struct sockaddr *)&a, sizeof a), 0));
    struct timeval tv = {8, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Read fd to its end into r (split at the blank line), and close it. */
static void read_resp(int fd, struct resp *r)
{
    static char raw[sizeof r->head + sizeof r->body];
    size_t at = 0;
    ssize_t n;
    while (at < sizeof raw - 1 && (n = recv(fd, raw + at, sizeof raw - 1 - at, 0)) > 0)
        at += (size_t)n;
    raw[at] = 0;
    close(fd);
    memset(r, 0, sizeof *r);
    char *end = strstr(raw, "\r\n\r\n");
    size_t head = end ? (size_t)(end - raw) : at;
    cr_assert(lt(sz, head, sizeof r->head));
    memcpy(r->head, raw, head);
    if (end) {
        r->body_len = at - head - 4;
        memcpy(r->body, end + 4, r->body_len);
    }
    sscanf(r->head, "HTTP/1.%*d %d", &r->code);
}

/* Send request[0..n) on a new connection; the answer in r. */
static void exchange(uint16_t to, const char *request, size_t n, struct resp *r)
{
    int fd = dial(to);
    cr_assert(eq(sz, (size_t)send(fd, request, n, MSG_NOSIGNAL), n));
    read_resp(fd, r);
}

static void fetch_on(uint16_t to, const char *method, const char *path, struct resp *r)
{
    char req[1024];
    int n =
        snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                 method, path);
    exchange(to, req, (size_t)n, r);
}

static void fetch(const char *method, const char *path, struct resp *r)
{
    fetch_on(port, method, path, r);
}

/* The value of header name in r ("" when absent), in a static buffer. */
static const char *header(const struct resp *r, const char *name)
{
    static char value[512];
    value[0] = 0;
    size_t n = strlen(name);
    for (const char *line = strstr(r->head, "\r\n"); line; line = strstr(line, "\r\n")) {
        line += 2;
        if (!strncasecmp(line, name, n) && line[n] == ':') {
            const char *v = line + n + 1 + strspn(line + n + 1, " ");
            snprintf(value, sizeof value, "%.*s", (int)strcspn(v, "\r\n"), v);
            break;
        }
    }
    return value;
}

static struct resp r;

/* --- the three paths ------------------------------------------------------------------------- */

static const char exposition[] = "# HELP kvr_test_requests_total Requests.\n"
                                 "# TYPE kvr_test_requests_total counter\n"
                                 "kvr_test_requests_total 7\n"
                                 "# HELP kvr_test_ready Readiness.\n"
                                 "# TYPE kvr_test_ready gauge\n"
                                 "kvr_test_ready 1\n";

Test(httpd, serves_the_three_paths)
{
    fetch("GET", "/metrics", &r);
    cr_assert(eq(int, r.code, 200), "%s", r.head);
    cr_assert(
        eq(str, (char *)header(&r, "Content-Type"), "text/plain; version=0.0.4; charset=utf-8"));
    cr_assert(eq(str, r.body, (char *)exposition));
    fetch("GET", "/healthz", &r);
    cr_assert(eq(int, r.code, 200));
    cr_assert(eq(str, r.body, "ok\n"));
    cr_assert(eq(str, (char *)header(&r, "Content-Type"), "text/plain; charset=utf-8"));
    fetch("GET", "/readyz", &r);
    cr_assert(eq(int, r.code, 200));
    cr_assert(eq(str, r.body, "ready\n"));
    fetch("GET", "/readyz?verbose=1", &r); /* the query is not part of the path */
    cr_assert(eq(int, r.code, 200));
    cr_assert(eq(u32, d.calls, 4));
}

Test(httpd, head_has_headers_no_body)
{
    fetch("HEAD", "/metrics", &r);
    cr_assert(eq(int, r.code, 200));
    cr_assert(eq(sz, r.body_len, 0));
    char len[32];
    snprintf(len, sizeof len, "%zu", sizeof exposition - 1);
    cr_assert(eq(str, (char *)header(&r, "Content-Length"), len));
    fetch("HEAD", "/readyz", &r);
    cr_assert(eq(int, r.code, 200));
    cr_assert(eq(sz, r.body_len, 0));
}

Test(httpd, keep_alive_serves_several)
{
    const char req[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                       "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"
                       "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    exchange(port, req, sizeof req - 1, &r);
    cr_assert(eq(int, r.code, 200));
    cr_assert(ne(ptr, strstr(r.body, "ready\n"), NULL), "%s", r.body);
    cr_assert(ne(ptr, strstr(r.body, "kvr_test_ready 1\n"), NULL), "%s", r.body);
    /* a GET with a body is answered at once, the body left unread and the connection closed */
    const char with_body[] = "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nab";
    double t0 = now_s();
    exchange(port, with_body, sizeof with_body - 1, &r);
    cr_assert(eq(int, r.code, 200));
    cr_assert(eq(str, r.body, "ok\n"));
    cr_assert(lt(dbl, now_s() - t0, 2.0));
}

Test(httpd, unknown_paths_are_404)
{
    const char *paths[] = {"/", "/metrics/", "/nope", "/healthz/x", "/READYZ", "*", "/%00"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        fetch("GET", paths[i], &r);
        cr_assert(eq(int, r.code, 404), "%s: %s", paths[i], r.head);
    }
    fetch("POST", "/nope", &r);
    cr_assert(eq(int, r.code, 404));
    cr_assert(eq(u32, d.calls, 0));
}

Test(httpd, other_methods_are_405)
{
    const char *methods[] = {"POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "BREW"};
    const char *paths[] = {"/metrics", "/healthz", "/readyz"};
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        fetch(methods[i], paths[i % 3], &r);
        cr_assert(eq(int, r.code, 405), "%s %s: %s", methods[i], paths[i % 3], r.head);
        cr_assert(eq(str, (char *)header(&r, "Allow"), "GET, HEAD"));
    }
    const char body[] = "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                        "Connection: close\r\n\r\nhello";
    exchange(port, body, sizeof body - 1, &r);
    cr_assert(eq(int, r.code, 405));
    cr_assert(eq(u32, d.calls, 0));
}

Test(httpd, metrics_hook_absent_is_404)
{
    struct kvr_httpd_hooks h = hooks;
    h.metrics = NULL;
    h.healthz = NULL;
    h.readyz = NULL;
    struct kvr_httpd *s = start(&(struct kvr_httpd_config){.addr = "127.0.0.1:0"}, &h);
    fetch_on(kvr_httpd_port(s), "GET", "/metrics", &r);
    cr_assert(eq(int, r.code, 404));
    fetch_on(kvr_httpd_port(s), "GET", "/healthz", &r);
    cr_assert(eq(int, r.code, 200));
    fetch_on(kvr_httpd_port(s), "GET", "/readyz", &r);
    cr_assert(eq(int, r.code, 200));
    kvr_httpd_stop(s);
}

/* --- failures the daemon reports ------------------------------------------------------------- */

static void set(bool *field, bool v)
{
    pthread_mutex_lock(&d.lock);
    *field = v;
    pthread_mutex_unlock(&d.lock);
}

Test(httpd, readyz_flips_with_its_reason)
{
    pthread_mutex_lock(&d.lock);
    snprintf(d.why, sizeof d.why, "no worker seen yet");
    pthread_mutex_unlock(&d.lock);
    set(&d.ready, false);
    fetch("GET", "/readyz", &r);
    cr_assert(eq(int, r.code, 503));
    cr_assert(eq(str, r.body, "no worker seen yet\n"));
    fetch("HEAD", "/readyz", &r);
    cr_assert(eq(int, r.code, 503));
    pthread_mutex_lock(&d.lock);
    d.why[0] = 0;
    pthread_mutex_unlock(&d.lock);
    fetch("GET", "/readyz", &r);
    cr_assert(eq(int, r.code, 503));
    cr_assert(eq(str, r.body, "not ready\n"));
    set(&d.fill_why, true); /* all of why, no NUL: cut, never overrun */
    fetch("GET", "/readyz", &r);
    cr_assert(eq(int, r.code, 503));
    cr_assert(eq(sz, r.body_len, KVR_HTTPD_WHY_MAX));
    cr_assert(eq(int, r.body[KVR_HTTPD_WHY_MAX - 1], '\n'));
    set(&d.ready, true);
    fetch("GET", "/readyz", &r);
    cr_assert(eq(int, r.code, 200));
    cr_assert(eq(str, r.body, "ready\n"));
    fetch("GET", "/healthz", &r); /* readiness is not liveness */
    cr_assert(eq(int, r.code, 200));
}

Test(httpd, healthz_false_is_503)
{
    set(&d.alive, false);
    fetch("GET", "/healthz", &r);
    cr_assert(eq(int, r.code, 503));
    cr_assert(eq(str, r.body, "not alive\n"));
}

Test(httpd, metrics_failure_is_503)
{
    pthread_mutex_lock(&d.lock);
    d.metrics_st = KVR_ERR_TIMEOUT;
    pthread_mutex_unlock(&d.lock);
    fetch("GET", "/metrics", &r);
    cr_assert(eq(int, r.code, 503));
    cr_assert(eq(str, r.body, "metrics unavailable: timed out\n"));
    cr_assert(eq(str, (char *)header(&r, "Content-Type"), "text/plain; charset=utf-8"));
    pthread_mutex_lock(&d.lock);
    d.metrics_st = KVR_OK;
    pthread_mutex_unlock(&d.lock);
    fetch("GET", "/metrics", &r);
    cr_assert(eq(int, r.code, 200));
}

/* --- addresses and configuration ------------------------------------------------------------- */

Test(httpd, bad_addresses_refused)
{
    char long_addr[128];
    memset(long_addr, '1', sizeof long_addr - 1);
    long_addr[sizeof long_addr - 1] = 0;
    const char *bad[] = {
        "",
        "127.0.0.1",
        "127.0.0.1:",
        ":9464",
        "localhost:9464",
        "1.2.3:80",
        "256.0.0.1:1",
        "127.0.0.1:65536",
        "127.0.0.1:-1",
        "127.0.0.1:+80",
        "127.0.0.1:80x",
        " 127.0.0.1:80",
        "127.0.0.1:123456",
        "::1:80",
        "[::1]",
        "[::1]80",
        "[::1:80",
        "[zz]:80",
        "[127.0.0.1]:80",
        "[fe80::1%lo]:80",
        "127.0.0.1:\n80",
        long_addr,
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char why[512] = "";
        cr_assert(eq(int, kvr_httpd_check_addr(bad[i], why, sizeof why), KVR_ERR_INVALID), "%s",
                  bad[i]);
        cr_assert(eq(int, strncmp(why, "http address \"", 14), 0), "%s", why);
        cr_assert(eq(ptr, strchr(why, '\n'), NULL), "one line: %s", why);
        struct kvr_httpd *s = (struct kvr_httpd *)&r; /* set to NULL on failure */
        why[0] = 0;
        cr_assert(eq(int,
                     kvr_httpd_start(&(struct kvr_httpd_config){.addr = bad[i]}, &hooks, &s, why,
                                     sizeof why),
                     KVR_ERR_INVALID));
        cr_assert(eq(ptr, s, NULL));
        cr_assert(ne(sz, strlen(why), 0));
    }
    cr_assert(eq(int, kvr_httpd_check_addr(NULL, NULL, 0), KVR_ERR_INVALID));
    char why[512] = "";
    kvr_httpd_check_addr("127.0.0.1:80x", why, sizeof why);
    cr_assert(eq(str, why,
                 "http address \"127.0.0.1:80x\": the port is not a number 0..65535 (want "
                 "HOST:PORT, HOST an IPv4 address or an IPv6 one in brackets, PORT 0..65535: "
                 "e.g. 0.0.0.0:9464, 127.0.0.1:0, [::1]:9464)"));
    const char *good[] = {"127.0.0.1:0", "0.0.0.0:9464", "127.0.0.1:65535",
                          "[::1]:0",     "[::]:9464",    "[::ffff:127.0.0.1]:80"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        cr_assert(eq(int, kvr_httpd_check_addr(good[i], NULL, 0), KVR_OK), "%s", good[i]);
}

Test(httpd, bad_configuration_refused)
{
    const struct kvr_httpd_config bad[] = {
        {.addr = "127.0.0.1:0", .max_connections = 1},
        {.addr = "127.0.0.1:0", .max_connections = 70000},
        {.addr = "127.0.0.1:0", .timeout_s = 100000},
        {.addr = "127.0.0.1:0", .max_request_bytes = 100},
        {.addr = "127.0.0.1:0", .max_request_bytes = (size_t)1 << 30},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char why[256] = "";
        struct kvr_httpd *s = NULL;
        cr_assert(eq(int, kvr_httpd_start(&bad[i], &hooks, &s, why, sizeof why), KVR_ERR_INVALID),
                  "%zu", i);
        cr_assert(eq(ptr, s, NULL));
        cr_assert(eq(int, strncmp(why, "http server: ", 13), 0), "%s", why);
    }
    struct kvr_httpd *s = NULL;
    cr_assert(eq(int, kvr_httpd_start(NULL, &hooks, &s, NULL, 0), KVR_ERR_INVALID));
    cr_assert(eq(int, kvr_httpd_start(&bad[0], NULL, &s, NULL, 0), KVR_ERR_INVALID));
}

Test(httpd, port_in_use_is_io)
{
    char addr[32], why[512] = "";
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    struct kvr_httpd *s = NULL;
    cr_assert(eq(
        int, kvr_httpd_start(&(struct kvr_httpd_config){.addr = addr}, &hooks, &s, why, sizeof why),
        KVR_ERR_IO));
    cr_assert(eq(ptr, s, NULL));
    cr_assert(ne(ptr, strstr(why, "cannot listen on 127.0.0.1:"), NULL), "%s", why);
    cr_assert(ne(ptr, strstr(why, "in use"), NULL), "%s", why);
    fetch("GET", "/healthz", &r); /* the first is unharmed */
    cr_assert(eq(int, r.code, 200));
}

Test(httpd, stop_then_start_again)
{
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    fetch("GET", "/healthz", &r);
    cr_assert(eq(int, r.code, 200));
    kvr_httpd_stop(srv);
    srv = NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert(ne(int, connect(fd, (struct sockaddr *)&a, sizeof a), 0)); /* nobody listens */
    close(fd);
    for (int i = 0; i < 3; i++) { /* the same port again, at once */
        srv = start(&(struct kvr_httpd_config){.addr = addr}, &hooks);
        cr_assert(eq(u16, kvr_httpd_port(srv), port));
        fetch("GET", "/metrics", &r);
        cr_assert(eq(int, r.code, 200));
        kvr_httpd_stop(srv);
        srv = NULL;
    }
    kvr_httpd_stop(NULL);
    srv = start(&(struct kvr_httpd_config){.addr = addr}, &hooks);
}

/* --- hostile clients ------------------------------------------------------------------------- */

Test(httpd, oversized_request_refused)
{
    static char req[40000];
    int n = snprintf(req, sizeof req, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(req + n, 'a', 32768);
    n += 32768;
    n += snprintf(req + n, sizeof req - (size_t)n, "\r\nConnection: close\r\n\r\n");
    exchange(port, req, (size_t)n, &r);
    cr_assert(eq(int, r.code, 431), "%s", r.head);
    n = snprintf(req, sizeof req, "GET /");
    memset(req + n, 'a', 32768);
    n += 32768;
    n += snprintf(req + n, sizeof req - (size_t)n, " HTTP/1.1\r\nHost: x\r\n\r\n");
    exchange(port, req, (size_t)n, &r);
    cr_assert(eq(int, r.code, 414), "%s", r.head);
    cr_assert(eq(u32, d.calls, 0));
    fetch("GET", "/healthz", &r);
    cr_assert(eq(int, r.code, 200));
}

Test(httpd, malformed_requests_survived)
{
    const char *bad[] = {
        "\x00\x01\x02garbage\r\n\r\n",
        "GET\r\n\r\n",
        "GET /healthz HTTP/9.9\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nNo colon here\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "GET /metrics HTTP/1.1\r\n", /* cut short: the client closes its side */
    };
    size_t lens[] = {14, 0, 0, 0, 0, 0, 0};
    /* an unfinished request is dropped on the idle timeout (libmicrohttpd 0.9.75 does not see
     * the client's half-close): 1 s here */
    kvr_httpd_stop(srv);
    srv = start(&(struct kvr_httpd_config){.addr = "127.0.0.1:0", .timeout_s = 1}, &hooks);
    port = kvr_httpd_port(srv);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t n = lens[i] ? lens[i] : strlen(bad[i]);
        int fd = dial(port);
        cr_assert(eq(sz, (size_t)send(fd, bad[i], n, MSG_NOSIGNAL), n));
        shutdown(fd, SHUT_WR);
        double t0 = now_s();
        read_resp(fd, &r);
        double took = now_s() - t0;
        cr_assert(r.code == 0 || (r.code >= 200 && r.code < 600), "%zu: %s", i, r.head);
        cr_assert(lt(dbl, took, 4.0), "%zu: open %.3f s", i, took); /* the idle timeout at most */
    }
    fetch("GET", "/healthz", &r);
    cr_assert(eq(int, r.code, 200));
}

Test(httpd, connection_limit_and_idle_timeout)
{
    kvr_httpd_stop(srv);
    srv = start(
        &(struct kvr_httpd_config){.addr = "127.0.0.1:0", .max_connections = 2, .timeout_s = 1},
        &hooks);
    port = kvr_httpd_port(srv);
    int idle[2] = {dial(port), dial(port)}; /* connected, silent: both slots taken */
    nanosleep(&(struct timespec){0, 200000000}, NULL);
    double t0 = now_s();
    fetch("GET", "/healthz", &r); /* waits in the backlog until an idle one is closed */
    double waited = now_s() - t0;
    cr_assert(eq(int, r.code, 200));
    cr_assert(ge(dbl, waited, 0.5), "answered after %.3f s despite the limit", waited);
    cr_assert(le(dbl, waited, 5.0), "answered after %.3f s", waited);
    for (int i = 0; i < 2; i++) {
        char c;
        cr_assert(eq(sz, (size_t)recv(idle[i], &c, 1, 0), 0)); /* closed by the server */
        close(idle[i]);
    }
    cr_assert(le(dbl, now_s() - t0, 5.0));
}

/* Sends one byte of an endless request every 300 ms, for 9 s at most or until the server cuts
 * it (the idle timeout never sees it idle). */
static void *trickle(void *arg)
{
    int fd = dial(*(uint16_t *)arg);
    const char req[] = "GET /healthz HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    for (size_t i = 0; i < 30 && send(fd, req + i, 1, MSG_NOSIGNAL) == 1; i++)
        nanosleep(&(struct timespec){0, 300000000}, NULL);
    close(fd);
    return NULL;
}

/* A client that sends its request a byte at a time, each within the idle timeout, held its
 * connection as long as it went on: two such clients kept the probes of a 2-connection server out
 * for as long as they trickled (9 s here; 64 of them, one byte every 9 s, would keep a daemon's
 * liveness probe out for good). A request must now arrive whole within the timeout. */
Test(httpd, a_client_trickling_its_request_is_cut_at_the_timeout)
{
    kvr_httpd_stop(srv);
    srv = start(
        &(struct kvr_httpd_config){.addr = "127.0.0.1:0", .max_connections = 2, .timeout_s = 1},
        &hooks);
    port = kvr_httpd_port(srv);
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        cr_assert(eq(int, pthread_create(&t[i], NULL, trickle, &port), 0));
    nanosleep(&(struct timespec){0, 300000000}, NULL); /* both slots taken */
    double t0 = now_s();
    fetch("GET", "/healthz", &r);
    double waited = now_s() - t0;
    cr_assert(eq(int, r.code, 200), "no answer after %.3f s", waited);
    cr_assert(lt(dbl, waited, 3.0), "a probe waited %.3f s behind trickling clients", waited);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
}

/* --- threads and CPU ------------------------------------------------------------------------- */

static void *slow_scrape(void *arg)
{
    fetch("GET", "/metrics", arg);
    return NULL;
}

Test(httpd, slow_metrics_do_not_hold_probes)
{
    pthread_mutex_lock(&d.lock);
    d.metrics_sleep = 1500;
    pthread_mutex_unlock(&d.lock);
    static struct resp slow;
    pthread_t t;
    cr_assert(eq(int, pthread_create(&t, NULL, slow_scrape, &slow), 0));
    nanosleep(&(struct timespec){0, 300000000}, NULL);
    double t0 = now_s();
    static struct resp probe;
    fetch("GET", "/readyz", &probe);
    double took = now_s() - t0;
    cr_assert(eq(int, probe.code, 200));
    cr_assert(lt(dbl, took, 1.0), "a probe took %.3f s behind a slow scrape", took);
    pthread_join(t, NULL);
    cr_assert(eq(int, slow.code, 200));
    cr_assert(eq(str, slow.body, (char *)exposition));
}

Test(httpd, idle_costs_no_cpu)
{
    struct timespec a, b;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
    nanosleep(&(struct timespec){1, 0}, NULL);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    double used = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    cr_assert(lt(dbl, used, 0.02), "%.4f s of CPU in 1 s idle", used);
}
