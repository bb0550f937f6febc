/*
 * kvr_se_http implementation. The listening socket is bound here (so a bind error says why) and
 * handed to libmicrohttpd, which closes it on stop.
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include "http.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "clock.h"
#include "log.h"
#include "wire.h"

#define HEADER_MEMORY (32u << 10) /* a connection's pool: request line, headers, answer's head */
#define STREAM_BLOCK  (16u << 10) /* bytes a stream hands libmicrohttpd at once, at most */
#define JSON_TYPE     "application/json"
#define SSE_TYPE      "text/event-stream; charset=utf-8"
#define PROM_TYPE     "text/plain; version=0.0.4; charset=utf-8"

struct kvr_se_http {
    struct MHD_Daemon *mhd;                    /* owned */
    struct kvr_se_state *st;                   /* borrowed: rank 0's (health, hooks, refusals) */
    struct kvr_se_state *ranks[KVR_SE_DP_MAX]; /* borrowed: every data-parallel rank's */
    uint32_t nranks;                           /* of them */
    const struct kvr_se_config *cfg;           /* borrowed */
    int stopfd;    /* eventfd written once at stop: every wait returns */
    uint16_t port; /* bound */
};

enum route {
    R_COMPLETIONS,
    R_MODELS,
    R_HEALTH,
    R_METRICS,
    R_SERVER_INFO,
    R_DROP,
    R_STALL,
    R_CLEAR,
};

static const struct {
    const char *path;
    bool post; /* POST (with a body); else GET and HEAD */
    bool hook; /* only with --test-hooks */
} routes[] = {
    [R_COMPLETIONS] = {"/v1/completions", true, false},
    [R_MODELS] = {"/v1/models", false, false},
    [R_HEALTH] = {"/health", false, false},
    [R_METRICS] = {"/metrics", false, false},
    [R_SERVER_INFO] = {"/get_server_info", false, false},
    [R_DROP] = {"/test/drop_batches", true, true},
    [R_STALL] = {"/test/stall", true, true},
    [R_CLEAR] = {"/test/clear", true, true},
};
#define NROUTES (sizeof routes / sizeof routes[0])

static int get_seen; /* a GET's *req_cls after its first call */

/* A request being read: its route and, for a POST, its body so far. */
struct conn {
    enum route route;    /* */
    struct kvr_buf body; /* at most max_body_bytes */
    bool too_large;      /* the body passed the bound: the rest is discarded, then 413 */
    uint64_t received;   /* body bytes so far, kept or not */
    bool answered;       /* the response was queued */
};

/* --- answers --------------------------------------------------------------------------------- */

/* Queue code with body[0..n) (copied) as type. */
static enum MHD_Result reply(struct MHD_Connection *conn, unsigned code, const char *type,
                             const void *body, size_t n, const char *allow)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(n, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    enum MHD_Result ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (ok == MHD_YES && allow)
        ok = MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (ok == MHD_YES)
        ok = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ok;
}

/* An error answer: why's status and body (counted by status). */
static enum MHD_Result refuse(struct kvr_se_http *h, struct MHD_Connection *conn,
                              const struct kvr_se_refusal *why, const char *allow)
{
    struct kvr_buf out = {0};
    kvr_se_count_refusal(h->st, why->status);
    enum MHD_Result ok = MHD_NO;
    if (kvr_se_wire_error(&out, h->cfg->error_shape, why) == KVR_OK)
        ok = reply(conn, why->status, JSON_TYPE, out.data, out.len, allow);
    kvr_buf_free(&out);
    return ok;
}

static enum MHD_Result refusef(struct kvr_se_http *h, struct MHD_Connection *conn, unsigned status,
                               const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static enum MHD_Result refusef(struct kvr_se_http *h, struct MHD_Connection *conn, unsigned status,
                               const char *fmt, ...)
{
    struct kvr_se_refusal why;
    va_list ap;
    va_start(ap, fmt);
    kvr_se_vrefuse(&why, status, NULL, fmt, ap);
    va_end(ap);
    return refuse(h, conn, &why, NULL);
}

/* Reply with out's contents (freed), or 500 when making them failed. */
static enum MHD_Result reply_made(struct kvr_se_http *h, struct MHD_Connection *conn,
                                  kvr_status made, struct kvr_buf *out, const char *type)
{
    enum MHD_Result ok = made == KVR_OK ? reply(conn, 200, type, out->data, out->len, NULL)
                                        : refusef(h, conn, 500, "%s", kvr_status_str(made));
    kvr_buf_free(out);
    return ok;
}

/* --- waiting --------------------------------------------------------------------------------- */

enum woke { WOKE_DATA, WOKE_GONE, WOKE_STOP };

/* Wait until r has news, its client's socket sock (-1: unknown) closes, or the server stops. */
static enum woke wait_req(const struct kvr_se_http *h, const struct kvr_se_req *r, int sock)
{
    struct pollfd p[3] = {{.fd = h->stopfd, .events = POLLIN},
                          {.fd = kvr_se_req_fd(r), .events = POLLIN},
                          {.fd = sock, .events = POLLRDHUP}};
    for (;;) {
        int n = poll(p, sock >= 0 ? 3 : 2, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 || p[0].revents)
            return WOKE_STOP;
        if (sock >= 0 && p[2].revents)
            return WOKE_GONE; /* RDHUP, HUP, ERR: the client will read nothing more */
        if (p[1].revents)
            return WOKE_DATA;
    }
}

static int socket_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* --- completions ----------------------------------------------------------------------------- */

/* A stream being sent: the response's reader state. */
struct stream {
    struct kvr_se_http *h;
    struct kvr_se_state *st; /* the rank that runs r */
    struct kvr_se_req *r;
    int sock;
};

static ssize_t read_stream(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct stream *s = cls;
    for (;;) {
        enum kvr_se_end end;
        size_t n = kvr_se_read(s->st, s->r, buf, max, &end);
        if (n)
            return (ssize_t)n;
        if (end == KVR_SE_FINISHED || end == KVR_SE_SHUTDOWN)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (end != KVR_SE_RUNNING || wait_req(s->h, s->r, s->sock) != WOKE_DATA)
            return MHD_CONTENT_READER_END_WITH_ERROR; /* cut: the client sees no clean end */
    }
}

/* The response is over (sent, or its connection closed): its request is let go, cancelled in
 * the engine if it still runs. */
static void end_stream(void *cls)
{
    struct stream *s = cls;
    kvr_se_release(s->st, s->r);
    free(s);
}

static enum MHD_Result start_stream(struct kvr_se_http *h, struct MHD_Connection *conn,
                                    struct kvr_se_state *st, struct kvr_se_req *r)
{
    struct stream *s = malloc(sizeof *s);
    if (!s) {
        kvr_se_release(st, r);
        return refusef(h, conn, 500, "out of memory");
    }
    *s = (struct stream){h, st, r, socket_of(conn)};
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK,
                                                                  read_stream, s, end_stream);
    if (!resp) {
        end_stream(s);
        return MHD_NO;
    }
    enum MHD_Result ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, SSE_TYPE);
    if (ok == MHD_YES)
        ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    if (ok == MHD_YES)
        ok = MHD_queue_response(conn, 200, resp);
    MHD_destroy_response(resp); /* end_stream runs when libmicrohttpd is done with it */
    return ok;
}

/* stream false: wait here (this connection's own thread) for the whole answer. */
static enum MHD_Result answer_whole(struct kvr_se_http *h, struct MHD_Connection *conn,
                                    struct kvr_se_state *st, struct kvr_se_req *r)
{
    int sock = socket_of(conn);
    struct kvr_buf out = {0};
    unsigned status = 0;
    while (kvr_se_outcome(st, r, &out, &status) == KVR_SE_RUNNING) {
        if (wait_req(h, r, sock) != WOKE_DATA) {
            kvr_se_release(st, r); /* cancelled in the engine */
            return MHD_NO;         /* closes the connection */
        }
    }
    kvr_se_release(st, r);
    if (status >= 400)
        kvr_se_count_refusal(h->st, status);
    enum MHD_Result ok = out.data ? reply(conn, status, JSON_TYPE, out.data, out.len, NULL)
                                  : refusef(h, conn, 500, "out of memory");
    kvr_buf_free(&out);
    return ok;
}

/*
 * The rank that runs a completion, as vLLM's API server picks it: its X-data-parallel-rank
 * header when that is an integer (out of range: 400, as vLLM says it), else the rank with the
 * fewest requests held (vLLM's balancer scores waiting and running; ties: the lowest rank).
 */
static struct kvr_se_state *pick_rank(struct kvr_se_http *h, struct MHD_Connection *conn,
                                      struct kvr_se_refusal *why)
{
    const char *v = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-data-parallel-rank");
    size_t n = v ? strspn(v, "0123456789") : 0;
    if (n && n < 10 && !v[n]) {
        unsigned long r = strtoul(v, NULL, 10);
        if (r < h->nranks)
            return h->ranks[r];
        why->status = 400;
        why->param = NULL;
        snprintf(why->message, sizeof why->message,
                 "data_parallel_rank %lu is out of range [0, %u).", r, h->nranks);
        return NULL;
    }
    struct kvr_se_state *best = h->ranks[0];
    uint32_t least = UINT32_MAX;
    for (uint32_t i = 0; i < h->nranks; i++) {
        pthread_mutex_lock(&h->ranks[i]->mu);
        uint32_t held = h->ranks[i]->nreqs;
        pthread_mutex_unlock(&h->ranks[i]->mu);
        if (held < least) {
            least = held;
            best = h->ranks[i];
        }
    }
    return best;
}

static enum MHD_Result completions(struct kvr_se_http *h, struct MHD_Connection *conn,
                                   const struct conn *c)
{
    const struct kvr_se_config *cfg = h->cfg;
    struct kvr_se_wire_limits lim =
        kvr_se_wire_limits_of(&cfg->engine, cfg->model, cfg->max_model_len);
    struct kvr_se_completion comp;
    struct kvr_se_refusal why;
    struct kvr_se_req *r = NULL;
    kvr_status st = kvr_se_wire_parse(c->body.data ? (const char *)c->body.data : "", c->body.len,
                                      &lim, &comp, &why);
    /* while it waits for tokens (a long queue, a stall) the connection is not idle: no timeout
     * until the request is over (completed() puts it back) */
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    struct kvr_se_state *rank = st == KVR_OK ? pick_rank(h, conn, &why) : NULL;
    if (st == KVR_OK && !rank)
        st = KVR_ERR_INVALID;
    if (st == KVR_OK)
        st = kvr_se_submit(rank, &comp, &r, &why);
    kvr_se_completion_free(&comp);
    if (st != KVR_OK)
        return refuse(h, conn, &why, NULL);
    return kvr_se_req_stream(r) ? start_stream(h, conn, rank, r) : answer_whole(h, conn, rank, r);
}

/* --- the other routes ------------------------------------------------------------------------ */

/* The test hooks' figure ?name=N, 1..max; false (answered 400) when absent or bad. */
static bool hook_arg(struct kvr_se_http *h, struct MHD_Connection *conn, const char *name,
                     uint32_t max, uint32_t *out, enum MHD_Result *ok)
{
    const char *v = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, name);
    size_t n = v ? strspn(v, "0123456789") : 0;
    unsigned long x = n && n < 10 && !v[n] ? strtoul(v, NULL, 10) : 0;
    if (x >= 1 && x <= max) {
        *out = (uint32_t)x;
        return true;
    }
    *ok = refusef(h, conn, 400, "`%s` must be an integer 1..%u", name, max);
    return false;
}

static enum MHD_Result hook(struct kvr_se_http *h, struct MHD_Connection *conn, enum route r)
{
    static const char done[] = "{\"status\":\"ok\"}";
    enum MHD_Result ok = MHD_NO;
    uint32_t n;
    struct kvr_se_refusal why;
    if (r == R_DROP && hook_arg(h, conn, "n", 1000000, &n, &ok)) {
        if (!kvr_se_drop_batches(h->st, n))
            return refusef(h, conn, 409, "no KV events: kvengine runs without --kv-events");
        kvr_log(KVR_LOG_INFO, "test_drop_batches", "n=%u", n);
    } else if (r == R_STALL && hook_arg(h, conn, "ms", 600000, &n, &ok)) {
        /* &rank=R (--dp-size): that rank's engine alone; absent: rank 0's */
        const char *v = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "rank");
        uint32_t rank = v && v[0] >= '0' && v[0] <= '9' && !v[1] ? (uint32_t)(v[0] - '0') : 0;
        if (v && (rank >= h->nranks || !(v[0] >= '0' && v[0] <= '9' && !v[1])))
            return refusef(h, conn, 400, "`rank` must be 0..%u", h->nranks - 1);
        kvr_se_stall(h->ranks[rank], n);
        kvr_log(KVR_LOG_INFO, "test_stall", "ms=%u rank=%u", n, rank);
    } else if (r == R_CLEAR) {
        if (kvr_se_clear(h->st, &why) != KVR_OK)
            return refuse(h, conn, &why, NULL);
        kvr_log(KVR_LOG_INFO, "test_clear", "cleared=1");
    } else {
        return ok; /* the argument was refused */
    }
    return reply(conn, 200, JSON_TYPE, done, sizeof done - 1, NULL);
}

/* Every rank's figures, rank 0's first. */
static kvr_status metrics(struct kvr_se_http *h, struct kvr_buf *out)
{
    struct kvr_se_snapshot snap[KVR_SE_DP_MAX];
    for (uint32_t i = 0; i < h->nranks; i++)
        kvr_se_snapshot_take(h->ranks[i], &snap[i]);
    return kvr_se_metrics_write(snap, h->nranks, out);
}

static enum MHD_Result answer_get(struct kvr_se_http *h, struct MHD_Connection *conn, enum route r)
{
    const struct kvr_se_config *cfg = h->cfg;
    struct kvr_buf out = {0};
    switch (r) {
    case R_HEALTH:
        if (kvr_se_draining(h->st))
            return refusef(h, conn, 503, "kvengine is shutting down");
        return reply(conn, 200, "text/plain; charset=utf-8", "", 0, NULL);
    case R_METRICS:
        return reply_made(h, conn, metrics(h, &out), &out, PROM_TYPE);
    case R_MODELS:
        return reply_made(h, conn,
                          kvr_se_wire_models(&out, cfg->model, kvr_realtime_ns() / KVR_NS_PER_S,
                                             cfg->max_model_len),
                          &out, JSON_TYPE);
    default: /* R_SERVER_INFO */
        return reply_made(
            h, conn,
            kvr_se_wire_server_info(&out, cfg->model, cfg->engine.block_size,
                                    (uint64_t)cfg->engine.num_blocks * cfg->engine.block_size,
                                    cfg->max_model_len),
            &out, JSON_TYPE);
    }
}

/* --- libmicrohttpd's handler ----------------------------------------------------------------- */

static bool route_of(const struct kvr_se_http *h, const char *url, enum route *out)
{
    for (size_t i = 0; i < NROUTES; i++) {
        if (strcmp(url, routes[i].path))
            continue;
        if ((routes[i].hook && !h->cfg->test_hooks) ||
            (i == R_SERVER_INFO && h->cfg->metrics_style != KVR_SE_STYLE_SGLANG))
            return false;
        *out = (enum route)i;
        return true;
    }
    return false;
}

static bool announces_body(struct MHD_Connection *conn)
{
    const char *cl =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    return (cl && strspn(cl, "0") != strlen(cl)) ||
           MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
}

/* The first call for a request: its route and method checked, a POST's reading set up. */
static enum MHD_Result first(struct kvr_se_http *h, struct MHD_Connection *conn, const char *url,
                             const char *method, void **req_cls)
{
    enum route r;
    if (!route_of(h, url, &r)) {
        char shown[80];
        return refusef(h, conn, 404, "Not Found: %s", kvr_log_safe(shown, sizeof shown, url));
    }
    bool post = !strcmp(method, MHD_HTTP_METHOD_POST);
    bool get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
    if (routes[r].post ? !post : !get) {
        struct kvr_se_refusal why;
        kvr_se_refuse(&why, 405, NULL, "Method Not Allowed");
        return refuse(h, conn, &why, routes[r].post ? "POST" : "GET, HEAD");
    }
    if (!post) {
        if (announces_body(conn)) /* answered before it is read; the connection then closes */
            return answer_get(h, conn, r);
        *req_cls = &get_seen;
        return MHD_YES;
    }
    const char *cl =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > h->cfg->max_body_bytes)
        return refusef(h, conn, 413, "the request body is over %u bytes (--max-body-bytes)",
                       h->cfg->max_body_bytes);
    struct conn *c = calloc(1, sizeof *c);
    if (!c)
        return MHD_NO;
    c->route = r;
    *req_cls = c;
    return MHD_YES;
}

/*
 * A piece of a POST's body, kept within the bound. Past it the rest is read and discarded, to be
 * answered 413 at the end (libmicrohttpd takes no answer in the middle of a body); past twice
 * the bound the connection is closed unanswered, so an endless body ends too.
 */
static enum MHD_Result upload(struct kvr_se_http *h, struct conn *c, const char *data, size_t n)
{
    uint64_t max = h->cfg->max_body_bytes;
    c->received += n;
    if (!c->too_large && c->received > max) {
        c->too_large = true;
        kvr_buf_free(&c->body);
    }
    if (c->too_large)
        return c->received > 2 * max ? MHD_NO : MHD_YES;
    if (kvr_buf_reserve(&c->body, c->body.len + n) != KVR_OK)
        return MHD_NO;
    memcpy(c->body.data + c->body.len, data, n);
    c->body.len += n;
    return MHD_YES;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_size, void **req_cls)
{
    struct kvr_se_http *h = cls;
    if (!*req_cls)
        return first(h, conn, url ? url : "", method, req_cls);
    enum route r;
    if (!route_of(h, url ? url : "", &r))
        return MHD_NO; /* cannot be: first() routed it */
    if (!routes[r].post)
        return answer_get(h, conn, r);
    struct conn *c = *req_cls;
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        return upload(h, c, upload_data, n);
    }
    if (c->answered)
        return MHD_YES;
    c->answered = true;
    if (c->too_large)
        return refusef(h, conn, 413, "the request body is over %u bytes (--max-body-bytes)",
                       h->cfg->max_body_bytes);
    return r == R_COMPLETIONS ? completions(h, conn, c) : hook(h, conn, r);
}

/* A request is over: a POST's reading state is freed, the idle timeout back in force. */
static void completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                      enum MHD_RequestTerminationCode toe)
{
    const struct kvr_se_http *h = cls;
    struct conn *c = *req_cls;
    *req_cls = NULL;
    if (!c || (void *)c == &get_seen)
        return;
    if (c->route == R_COMPLETIONS)
        MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT,
                                  (unsigned)(h->cfg->idle_timeout_ns / KVR_NS_PER_S));
    kvr_buf_free(&c->body);
    free(c);
}

/* --- the server ------------------------------------------------------------------------------ */

__attribute__((format(printf, 2, 0))) static void mhd_log(void *cls, const char *fm, va_list ap)
{
    if (!kvr_log_enabled(KVR_LOG_DEBUG))
        return; /* mostly a client's doing (a bad request, a reset): not worth a line */
    char msg[200], shown[240];
    vsnprintf(msg, sizeof msg, fm, ap);
    msg[strcspn(msg, "\r\n")] = 0;
    kvr_log(KVR_LOG_DEBUG, "http_error", "error=\"%s\"", kvr_log_safe(shown, sizeof shown, msg));
}

/* A listening socket on cfg->listen (checked: HOST:PORT, IPv4 or [IPv6]); -1 with why. */
static int listen_on(const char *addr, unsigned backlog, char *why, size_t len)
{
    char host[KVR_OPT_STR_MAX];
    const char *colon = strrchr(addr, ':');
    size_t hn = (size_t)(colon - addr);
    if (addr[0] == '[') /* "[v6]:port" */
        memcpy(host, addr + 1, hn -= 2);
    else
        memcpy(host, addr, hn);
    host[hn] = 0;
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE,
                             .ai_socktype = SOCK_STREAM},
                    *ai = NULL;
    int rc = getaddrinfo(host, colon + 1, &hints, &ai), fd = -1;
    if (rc) {
        snprintf(why, len, "cannot listen on %s: %s", addr, gai_strerror(rc));
        return -1;
    }
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, (int)backlog)) {
        snprintf(why, len, "cannot listen on %s: %s", addr, strerror(errno));
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd;
}

static uint16_t port_of(int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl))
        return 0;
    return ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                          : ((struct sockaddr_in *)&ss)->sin_port);
}

kvr_status kvr_se_http_start(struct kvr_se_state *const *ranks, uint32_t nranks,
                             const struct kvr_se_config *cfg, struct kvr_se_http **out, char *why,
                             size_t len)
{
    *out = NULL;
    struct kvr_se_http *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(why, len, "out of memory");
        return KVR_ERR_NOMEM;
    }
    h->nranks = nranks < 1 ? 1 : nranks > KVR_SE_DP_MAX ? KVR_SE_DP_MAX : nranks;
    for (uint32_t i = 0; i < h->nranks; i++)
        h->ranks[i] = ranks[i];
    h->st = ranks[0];
    h->cfg = cfg;
    h->stopfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    int fd = h->stopfd >= 0 ? listen_on(cfg->listen, cfg->max_connections, why, len) : -1;
    if (fd < 0) {
        if (h->stopfd < 0)
            snprintf(why, len, "eventfd: %s", strerror(errno));
        else
            close(h->stopfd);
        free(h);
        return KVR_ERR_IO;
    }
    h->port = port_of(fd);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    h->mhd = MHD_start_daemon(
        flags, 0, NULL, NULL, handle, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h,
        MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_NOTIFY_COMPLETED, completed, h,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)(cfg->idle_timeout_ns / KVR_NS_PER_S), MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)HEADER_MEMORY, MHD_OPTION_END);
    if (!h->mhd) {
        snprintf(why, len, "cannot serve on %s: libmicrohttpd refused to start", cfg->listen);
        close(fd);
        close(h->stopfd);
        free(h);
        return KVR_ERR_IO;
    }
    *out = h;
    return KVR_OK;
}

uint16_t kvr_se_http_port(const struct kvr_se_http *h)
{
    return h->port;
}

void kvr_se_http_stop(struct kvr_se_http *h)
{
    if (!h)
        return;
    uint64_t one = 1;
    if (write(h->stopfd, &one, sizeof one) < 0)
        kvr_log(KVR_LOG_WARN, "eventfd_write_failed", "error=\"%s\"", strerror(errno));
    MHD_stop_daemon(h->mhd);
    close(h->stopfd);
    free(h);
}
