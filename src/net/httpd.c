/*
 * The operators' HTTP server on libmicrohttpd. No request body is ever read (see handle); the
 * server's own state is set before its threads start and read-only after, except what its error
 * log keeps and its connections' clocks, under its mutex.
 */
#include "httpd.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "clock.h"
#include "log.h"

/*
 * An open connection's clock (its libmicrohttpd socket context), in the server's list from
 * libmicrohttpd's notice that it started to the one that it closed, which comes before its socket
 * is closed: under the server's mutex, the reaper never shuts a socket number down that another
 * connection took since.
 */
struct conn_clock {
    int fd;                         /* its socket */
    uint64_t since_ns;              /* accepted, or its last request handled (kvr_now_ns) */
    struct conn_clock *prev, *next; /* in kvr_httpd.conns */
};

struct kvr_httpd {
    struct MHD_Daemon *mhd;       /* owned; its threads call the hooks */
    struct kvr_httpd_hooks hooks; /* a copy of the daemon's */
    uint16_t port;                /* the bound port */
    uint64_t timeout_ns;          /* a request arrives whole within this, or is cut */
    pthread_t reaper;             /* cuts the connections past it (reap) */
    pthread_cond_t reap_cv;       /* wakes the reaper: a connection came, or the stop */
    pthread_mutex_t lock;         /* guards the fields below */
    bool starting;                /* MHD_start_daemon is running: keep its first error */
    char start_err[160];          /* the first error libmicrohttpd logged while starting */
    uint64_t logged_ns;           /* when its last error was logged (kvr_now_ns), 0: never */
    uint64_t log_skipped;         /* errors not logged since */
    struct conn_clock *conns;     /* the open connections */
    bool stopping;                /* the reaper ends */
};

/* --- addresses ------------------------------------------------------------------------------- */

struct addr {
    struct sockaddr_storage ss; /* a sockaddr_in or sockaddr_in6 with the port */
    bool v6;                    /* ss is a sockaddr_in6 */
    uint16_t port;              /* host order */
};

static kvr_status bad_addr(const char *addr, const char *reason, char *why, size_t len)
{
    char shown[KVR_HTTPD_ADDR_MAX + 8];
    kvr_log_safe(shown, sizeof shown, addr ? addr : "");
    if (len)
        snprintf(why, len,
                 "http address \"%s\": %s (want HOST:PORT, HOST an IPv4 address or an IPv6 one "
                 "in brackets, PORT 0..65535: e.g. 0.0.0.0:9464, 127.0.0.1:0, [::1]:9464)",
                 shown, reason);
    return KVR_ERR_INVALID;
}

/* The port in s: 1 to 5 digits, at most 65535. */
static bool parse_port(const char *s, uint16_t *out)
{
    size_t n = strspn(s, "0123456789");
    if (n == 0 || n > 5 || s[n])
        return false;
    unsigned long v = strtoul(s, NULL, 10);
    if (v > 65535)
        return false;
    *out = (uint16_t)v;
    return true;
}

/* host[0..n) into dst NUL-terminated (n < KVR_HTTPD_ADDR_MAX + 1: it is part of the address). */
static void copy_host(char *dst, const char *host, size_t n)
{
    memcpy(dst, host, n);
    dst[n] = 0;
}

static kvr_status parse_addr(const char *addr, struct addr *a, char *why, size_t len)
{
    memset(a, 0, sizeof *a);
    if (!addr || !*addr)
        return bad_addr(addr, "empty", why, len);
    if (strlen(addr) > KVR_HTTPD_ADDR_MAX)
        return bad_addr(addr, "too long", why, len);
    char host[KVR_HTTPD_ADDR_MAX + 1];
    const char *port;
    if (addr[0] == '[') {
        const char *end = strchr(addr, ']');
        if (!end || end[1] != ':')
            return bad_addr(addr, "an IPv6 address needs ']' then ':' and the port", why, len);
        copy_host(host, addr + 1, (size_t)(end - addr - 1));
        port = end + 2;
        a->v6 = true;
    } else {
        const char *colon = strrchr(addr, ':');
        if (!colon)
            return bad_addr(addr, "no port", why, len);
        copy_host(host, addr, (size_t)(colon - addr));
        if (strchr(host, ':'))
            return bad_addr(addr, "an IPv6 address goes in brackets", why, len);
        port = colon + 1;
    }
    if (!parse_port(port, &a->port))
        return bad_addr(addr, "the port is not a number 0..65535", why, len);
    if (a->v6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&a->ss;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons(a->port);
        if (inet_pton(AF_INET6, host, &s6->sin6_addr) != 1)
            return bad_addr(addr, "not an IPv6 address", why, len);
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&a->ss;
        s4->sin_family = AF_INET;
        s4->sin_port = htons(a->port);
        if (inet_pton(AF_INET, host, &s4->sin_addr) != 1)
            return bad_addr(addr, *host ? "not an IPv4 address" : "no host", why, len);
    }
    return KVR_OK;
}

kvr_status kvr_httpd_check_addr(const char *addr, char *why, size_t len)
{
    struct addr a;
    return parse_addr(addr, &a, why, len);
}

/* --- answers --------------------------------------------------------------------------------- */

#define TEXT_PLAIN         "text/plain; charset=utf-8"
#define PROM_CONTENT       "text/plain; version=0.0.4; charset=utf-8"
#define METHOD_NOT_ALLOWED "method not allowed\n"

/* Queue code with body[0..n): copied, or taken (freed by libmicrohttpd) when owned. */
static enum MHD_Result reply(struct MHD_Connection *conn, unsigned code, const char *type,
                             void *body, size_t n, bool owned, const char *allow)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        n, body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_MUST_COPY);
    if (!r) {
        if (owned)
            free(body);
        return MHD_NO;
    }
    enum MHD_Result ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (ok == MHD_YES)
        ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (ok == MHD_YES && allow)
        ok = MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (ok == MHD_YES)
        ok = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result reply_text(struct MHD_Connection *conn, unsigned code, const char *text)
{
    return reply(conn, code, TEXT_PLAIN, (void *)text, strlen(text), false, NULL);
}

static enum MHD_Result answer_metrics(const struct kvr_httpd *s, struct MHD_Connection *conn)
{
    struct kvr_buf out = {0};
    kvr_status st = s->hooks.metrics(s->hooks.ctx, &out);
    if (st != KVR_OK) {
        kvr_buf_free(&out);
        char text[128];
        snprintf(text, sizeof text, "metrics unavailable: %s\n", kvr_status_str(st));
        return reply_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, text);
    }
    if (!out.data)
        return reply(conn, MHD_HTTP_OK, PROM_CONTENT, "", 0, false, NULL);
    return reply(conn, MHD_HTTP_OK, PROM_CONTENT, out.data, out.len, true, NULL);
}

static enum MHD_Result answer_readyz(const struct kvr_httpd *s, struct MHD_Connection *conn)
{
    char why[KVR_HTTPD_WHY_MAX] = "";
    if (!s->hooks.readyz || s->hooks.readyz(s->hooks.ctx, why, sizeof why))
        return reply_text(conn, MHD_HTTP_OK, "ready\n");
    why[sizeof why - 1] = 0;
    char text[KVR_HTTPD_WHY_MAX + 2];
    snprintf(text, sizeof text, "%s\n", *why ? why : "not ready");
    return reply_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, text);
}

enum route { ROUTE_NONE, ROUTE_METRICS, ROUTE_HEALTHZ, ROUTE_READYZ };

static enum route route_of(const struct kvr_httpd *s, const char *url)
{
    if (!strcmp(url, "/metrics"))
        return s->hooks.metrics ? ROUTE_METRICS : ROUTE_NONE;
    if (!strcmp(url, "/healthz"))
        return ROUTE_HEALTHZ;
    if (!strcmp(url, "/readyz"))
        return ROUTE_READYZ;
    return ROUTE_NONE;
}

/* Whether the request announces a body (libmicrohttpd would read it before a second call). */
static bool has_body(struct MHD_Connection *conn)
{
    const char *cl =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    return (cl && strspn(cl, "0") != strlen(cl)) ||
           MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
}

static enum MHD_Result answer(const struct kvr_httpd *s, struct MHD_Connection *conn, enum route r)
{
    switch (r) {
    case ROUTE_METRICS:
        return answer_metrics(s, conn);
    case ROUTE_HEALTHZ:
        if (s->hooks.healthz && !s->hooks.healthz(s->hooks.ctx))
            return reply_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "not alive\n");
        return reply_text(conn, MHD_HTTP_OK, "ok\n");
    default:
        return answer_readyz(s, conn);
    }
}

/* --- connections that take too long ---------------------------------------------------------- */

/*
 * libmicrohttpd's timeout counts idle time only: a client sending its request a byte at a time,
 * each within it, held its connection for as long as it went on, and max_connections such clients
 * kept every probe out. So each connection has a clock, set when it is accepted and when one of
 * its requests has arrived whole (handle), and the reaper shuts down the socket of one whose clock
 * is timeout_s old: libmicrohttpd reads its end and closes it. A slow reader of an answer is cut
 * the same way, timeout_s after its request.
 */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct kvr_httpd *s = cls;
    struct conn_clock *c = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *i =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!i || !(c = calloc(1, sizeof *c)))
            return; /* untracked: the idle timeout alone bounds it */
        c->fd = i->connect_fd;
        c->since_ns = kvr_now_ns();
        pthread_mutex_lock(&s->lock);
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        pthread_cond_signal(&s->reap_cv);
        pthread_mutex_unlock(&s->lock);
        *socket_context = c;
    } else if (c) { /* closed: its socket is closed after this returns */
        pthread_mutex_lock(&s->lock);
        if (c->prev)
            c->prev->next = c->next;
        else
            s->conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
        pthread_mutex_unlock(&s->lock);
        free(c);
        *socket_context = NULL;
    }
}

/* A request of conn arrived whole: its clock starts again. */
static void heard(struct kvr_httpd *s, struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *i =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct conn_clock *c = i ? i->socket_context : NULL;
    if (!c)
        return;
    pthread_mutex_lock(&s->lock);
    c->since_ns = kvr_now_ns();
    pthread_mutex_unlock(&s->lock);
}

/* The reaper's thread: asleep while there is no connection, else awake every 100 ms. */
static void *reap(void *arg)
{
    struct kvr_httpd *s = arg;
    pthread_mutex_lock(&s->lock);
    while (!s->stopping) {
        struct timespec until = kvr_deadline_ms(100);
        if (s->conns)
            pthread_cond_timedwait(&s->reap_cv, &s->lock, &until);
        else
            pthread_cond_wait(&s->reap_cv, &s->lock);
        uint64_t now = kvr_now_ns();
        for (struct conn_clock *c = s->conns; c; c = c->next)
            if (now - c->since_ns >= s->timeout_ns) {
                shutdown(c->fd, SHUT_RDWR);
                c->since_ns = now; /* once: libmicrohttpd closes it soon */
            }
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static void reaper_stop(struct kvr_httpd *s)
{
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_cond_signal(&s->reap_cv);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->reaper, NULL);
}

static void server_free(struct kvr_httpd *s)
{
    pthread_cond_destroy(&s->reap_cv);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/*
 * libmicrohttpd's access handler. Refusals (404, 405) and requests with a body are answered on
 * the first call, with the headers: libmicrohttpd then closes the connection without reading
 * the body. A GET or HEAD without one is answered on the second call, once the request is
 * complete, so the connection can stay open for the next scrape.
 */
static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_size, void **req_cls)
{
    static int seen; /* *req_cls after the first call */
    struct kvr_httpd *s = cls;
    heard(s, conn);
    enum route r = route_of(s, url ? url : "");
    if (r == ROUTE_NONE)
        return reply_text(conn, MHD_HTTP_NOT_FOUND, "not found\n");
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, TEXT_PLAIN, METHOD_NOT_ALLOWED,
                     sizeof METHOD_NOT_ALLOWED - 1, false, "GET, HEAD");
    if (!*req_cls && !has_body(conn)) {
        *req_cls = &seen;
        return MHD_YES;
    }
    *upload_size = 0; /* never more than what was announced as absent */
    return answer(s, conn, r);
}

/* --- the server ------------------------------------------------------------------------------ */

/*
 * libmicrohttpd's errors (mostly about bad requests: a client can cause one per request): at most
 * one line a second, counting the ones left out; the first while starting goes to the caller.
 */
__attribute__((format(printf, 2, 0))) static void mhd_log(void *cls, const char *fm, va_list ap)
{
    struct kvr_httpd *s = cls;
    char msg[160];
    vsnprintf(msg, sizeof msg, fm, ap);
    msg[strcspn(msg, "\r\n")] = 0;
    uint64_t now = kvr_now_ns(), skipped = 0;
    pthread_mutex_lock(&s->lock);
    bool show = false;
    if (s->starting && !s->start_err[0]) {
        memcpy(s->start_err, msg, sizeof msg);
    } else if (s->logged_ns && now - s->logged_ns < KVR_NS_PER_S) {
        s->log_skipped++;
    } else {
        show = true;
        skipped = s->log_skipped;
        s->log_skipped = 0;
        s->logged_ns = now;
    }
    pthread_mutex_unlock(&s->lock);
    if (!show)
        return;
    char shown[200];
    kvr_log(KVR_LOG_WARN, "http_error", "error=\"%s\" suppressed=%llu",
            kvr_log_safe(shown, sizeof shown, msg), (unsigned long long)skipped);
}

static kvr_status check_config(const struct kvr_httpd_config *c, struct kvr_httpd_config *eff,
                               char *why, size_t len)
{
    *eff = *c;
    if (!eff->max_connections)
        eff->max_connections = KVR_HTTPD_MAX_CONNECTIONS;
    if (!eff->timeout_s)
        eff->timeout_s = KVR_HTTPD_TIMEOUT_S;
    if (!eff->max_request_bytes)
        eff->max_request_bytes = KVR_HTTPD_REQUEST_BYTES;
    const char *bad = NULL;
    if (eff->max_connections < KVR_HTTPD_THREADS || eff->max_connections > 65536)
        bad = "max_connections must be 2..65536";
    else if (eff->timeout_s > 86400)
        bad = "timeout_s must be at most 86400";
    else if (eff->max_request_bytes < 1024 || eff->max_request_bytes > (1u << 24))
        bad = "max_request_bytes must be 1024..16777216";
    if (bad && len)
        snprintf(why, len, "http server: %s", bad);
    return bad ? KVR_ERR_INVALID : KVR_OK;
}

/* Start libmicrohttpd on a for s; false when it refuses. */
static bool start_mhd(struct kvr_httpd *s, const struct addr *a, const struct kvr_httpd_config *c)
{
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | (a->v6 ? MHD_USE_IPv6 : 0);
    /* the pool holds the request and the answer's headers: room for the latter on top */
    size_t memory = c->max_request_bytes + 4096;
    s->mhd = MHD_start_daemon(
        flags, a->port, NULL, NULL, handle, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
        MHD_OPTION_SOCK_ADDR, (const struct sockaddr *)&a->ss, MHD_OPTION_THREAD_POOL_SIZE,
        (unsigned)KVR_HTTPD_THREADS, MHD_OPTION_CONNECTION_LIMIT, c->max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, c->timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, memory,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, c->max_connections, MHD_OPTION_NOTIFY_CONNECTION,
        on_connection, s, MHD_OPTION_END);
    return s->mhd != NULL;
}

kvr_status kvr_httpd_start(const struct kvr_httpd_config *c, const struct kvr_httpd_hooks *h,
                           struct kvr_httpd **out, char *why, size_t len)
{
    *out = NULL;
    struct kvr_httpd_config eff;
    struct addr a;
    kvr_status st = c && h ? check_config(c, &eff, why, len) : KVR_ERR_INVALID;
    if (st == KVR_OK)
        st = parse_addr(c->addr, &a, why, len);
    if (st != KVR_OK)
        return st;
    struct kvr_httpd *s = calloc(1, sizeof *s);
    if (!s || pthread_mutex_init(&s->lock, NULL)) {
        free(s);
        if (len)
            snprintf(why, len, "http server: out of memory");
        return KVR_ERR_NOMEM;
    }
    kvr_cond_init_monotonic(&s->reap_cv);
    s->timeout_ns = (uint64_t)eff.timeout_s * KVR_NS_PER_S;
    if (pthread_create(&s->reaper, NULL, reap, s)) {
        server_free(s);
        if (len)
            snprintf(why, len, "http server: no thread");
        return KVR_ERR_NOMEM;
    }
    s->hooks = *h;
    s->starting = true;
    bool started = start_mhd(s, &a, &eff);
    pthread_mutex_lock(&s->lock);
    s->starting = false;
    pthread_mutex_unlock(&s->lock);
    if (!started) {
        char shown[KVR_HTTPD_ADDR_MAX + 8];
        if (len)
            snprintf(why, len, "http server: cannot listen on %s: %s",
                     kvr_log_safe(shown, sizeof shown, c->addr),
                     s->start_err[0] ? s->start_err : "libmicrohttpd refused to start");
        reaper_stop(s);
        server_free(s);
        return KVR_ERR_IO;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info && info->port ? info->port : a.port;
    *out = s;
    return KVR_OK;
}

uint16_t kvr_httpd_port(const struct kvr_httpd *s)
{
    return s->port;
}

void kvr_httpd_stop(struct kvr_httpd *s)
{
    if (!s)
        return;
    MHD_stop_daemon(s->mhd); /* every connection closed: the reaper's list is empty */
    reaper_stop(s);
    server_free(s);
}

kvr_status kvr_httpd_serve(const char *addr, const struct kvr_httpd_hooks *h,
                           struct kvr_httpd **out)
{
    *out = NULL;
    if (!addr || !addr[0])
        return KVR_OK;
    struct kvr_httpd_config c = {.addr = addr};
    char why[256];
    kvr_status st = kvr_httpd_start(&c, h, out, why, sizeof why);
    if (st != KVR_OK)
        kvr_log(KVR_LOG_ERROR, "http_failed", "addr=%s error=\"%s\"", addr, why);
    else
        kvr_log(KVR_LOG_INFO, "http_listening", "addr=%s port=%u", addr,
                (unsigned)kvr_httpd_port(*out));
    return st;
}
