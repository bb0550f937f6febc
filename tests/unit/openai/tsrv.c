/*
 * The test server (tsrv.h). Each completion request gets a struct req: its upload is read,
 * its prompt picks the scenario, and a libmicrohttpd callback response produces the SSE bytes
 * one piece at a time, waiting between chunks in poll() on the connection's socket so that a
 * client closing it is seen at once.
 */
#define _GNU_SOURCE
#include "tsrv.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define MAX_GETS   16
#define MAX_UPLOAD (64u << 20)

struct doc {
    char *path, *type, *body;
    unsigned status;
};

struct tsrv {
    struct MHD_Daemon *mhd;
    char url[64];
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct doc gets[MAX_GETS];
    unsigned n_gets;
    char *raw;
    size_t raw_len;
    unsigned requests, closed;
    char *last_body;
};

struct req {
    struct tsrv *srv;
    char *up; /* the upload */
    size_t up_len;
    int fd;
    uint32_t p[6]; /* prompt[0..5]: scenario and parameters */
    bool ids, cont, usage;
    uint32_t i; /* chunks produced */
    int phase;  /* what comes next after the chunks */
    char *out;  /* bytes to send */
    size_t out_len, out_cap, out_pos;
    size_t raw_pos;
    uint64_t big_left;
    bool client_closed, cut;
};

/* ---- output ---- */

static void out_add(struct req *r, const char *s, size_t n)
{
    if (r->out_len + n > r->out_cap) {
        r->out_cap = (r->out_len + n) * 2;
        r->out = realloc(r->out, r->out_cap);
    }
    memcpy(r->out + r->out_len, s, n);
    r->out_len += n;
}

static void out_str(struct req *r, const char *s)
{
    out_add(r, s, strlen(s));
}

/* An SSE event carrying json (taken), in the request's framing. */
static void out_event(struct req *r, json_t *json)
{
    char *text = json_dumps(json, JSON_COMPACT);
    json_decref(json);
    const char *eol = r->p[4] & TSF_CRLF ? "\r\n" : "\n";
    if (r->p[4] & TSF_SPLIT_DATA) {
        /* a comment, an ignored field, and the JSON over two data lines (split after a comma) */
        out_str(r, ": keep-alive");
        out_str(r, eol);
        out_str(r, "event: message");
        out_str(r, eol);
        char *comma = strchr(text, ',');
        size_t k = comma ? (size_t)(comma - text) + 1 : strlen(text);
        out_str(r, "data:");
        out_add(r, text, k);
        out_str(r, eol);
        out_str(r, "data: ");
        out_str(r, text + k);
    } else {
        out_str(r, "data: ");
        out_str(r, text);
    }
    out_str(r, eol);
    out_str(r, eol);
    free(text);
}

static void out_done(struct req *r)
{
    out_str(r, r->p[4] & TSF_CRLF ? "data: [DONE]\r\n\r\n" : "data: [DONE]\n\n");
}

/* ---- waiting, and seeing the client go ---- */

/* Wait up to us microseconds; true when the client closed its connection. */
static bool wait_close(struct req *r, uint64_t us)
{
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        uint64_t spent = (uint64_t)(now.tv_sec - t0.tv_sec) * 1000000u +
                         (uint64_t)((now.tv_nsec - t0.tv_nsec) / 1000);
        uint64_t left = spent >= us ? 0 : us - spent;
        struct timespec ts = {(time_t)(left / 1000000u), (long)(left % 1000000u) * 1000};
        struct pollfd pfd = {r->fd, POLLIN | POLLRDHUP, 0};
        int n = ppoll(&pfd, 1, &ts, NULL);
        if (n > 0) {
            char c;
            if (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR) ||
                recv(r->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0) {
                r->client_closed = true;
                return true;
            }
            nanosleep(&ts, NULL); /* data from the client (not a close): just wait */
            return false;
        }
        if (n == 0 || left == 0)
            return false;
    }
}

/* ---- the scenarios ---- */

static const char *finish_word(uint32_t kind)
{
    switch (kind) {
    case TF_LENGTH:
        return "length";
    case TF_STOP:
        return "stop";
    case TF_ODD:
        return "odd\x01\x1b[31m reason, longer than the thirty-two bytes kept";
    default:
        return NULL;
    }
}

static void out_chunk(struct req *r, uint32_t i, uint32_t per, bool last)
{
    json_t *choice = json_object();
    char text[32];
    snprintf(text, sizeof text, "t%u ", i);
    json_object_set_new(choice, "index", json_integer(0));
    json_object_set_new(choice, "text", json_string(text));
    json_object_set_new(choice, "logprobs", json_null());
    const char *fin = last ? finish_word(r->p[2]) : NULL;
    json_object_set_new(choice, "finish_reason", fin ? json_string(fin) : json_null());
    if (r->ids) {
        json_t *ids = json_array();
        for (uint32_t k = 0; k < per; k++)
            json_array_append_new(ids, json_integer(1000 + i * per + k));
        json_object_set_new(choice, "token_ids", ids);
    } else {
        json_object_set_new(choice, "token_ids", json_null());
    }
    json_t *root = json_pack("{s:s, s:s, s:i, s:s, s:[o]}", "id", "cmpl-test", "object",
                             "text_completion", "created", 1, "model", "m", "choices", choice);
    if (r->cont)
        json_object_set_new(root, "usage",
                            json_pack("{s:i, s:i, s:i}", "prompt_tokens", 6, "completion_tokens",
                                      (i + 1) * per, "total_tokens", 6 + (i + 1) * per));
    else
        json_object_set_new(root, "usage", json_null());
    out_event(r, root);
}

static void out_usage(struct req *r, uint32_t completion)
{
    json_t *usage = json_pack("{s:i, s:i, s:i}", "prompt_tokens", 6, "completion_tokens",
                              completion, "total_tokens", 6 + completion);
    if (r->p[4] & TSF_CACHED)
        json_object_set_new(usage, "prompt_tokens_details", json_pack("{s:i}", "cached_tokens", 4));
    out_event(r, json_pack("{s:s, s:s, s:[], s:o}", "id", "cmpl-test", "object", "text_completion",
                           "choices", "usage", usage));
}

/* More bytes of a streaming scenario: 0 some, 1 the end, -1 cut (or the client went). */
static int produce(struct req *r)
{
    uint32_t per = r->p[4] & TSF_MULTI ? 2 : 1;
    switch (r->p[0]) {
    case TS_STREAM:
        if (r->i < r->p[1]) {
            if (r->p[3] && wait_close(r, r->p[3]))
                return -1;
            out_chunk(r, r->i, per, r->i + 1 == r->p[1]);
            r->i++;
            return 0;
        }
        if (r->phase++ == 0) {
            if (r->usage)
                out_usage(r, r->p[1] * per);
            if (!(r->p[4] & TSF_NO_DONE))
                out_done(r);
            return r->out_len ? 0 : 1;
        }
        return 1;
    case TS_HOLD:
        if (wait_close(r, r->p[1]))
            return -1;
        out_chunk(r, r->i++, 1, false);
        return 0;
    case TS_CUT:
        if (r->i < r->p[1]) {
            out_chunk(r, r->i++, 1, false);
            return 0;
        }
        r->cut = !wait_close(r, 20000); /* let the chunks go out first */
        return -1;
    case TS_SILENT:
        r->cut = !wait_close(r, 10000000);
        return -1;
    case TS_STREAM_ERROR:
        if (r->phase == 0) {
            out_chunk(r, 0, 1, false);
        } else if (r->phase == 1) {
            json_t *err = json_pack("{s:s, s:s, s:i}", "message", "engine broke\nbadly", "type",
                                    "InternalServerError", "code", 500);
            if (r->p[2] == 1) {
                json_object_set_new(err, "object", json_string("error"));
                out_event(r, err);
            } else {
                out_event(r, json_pack("{s:o}", "error", err));
            }
        } else if (r->phase == 2) {
            out_done(r);
        } else {
            return 1;
        }
        r->phase++;
        return 0;
    case TS_RAW: {
        struct tsrv *s = r->srv;
        if (r->raw_pos >= s->raw_len && r->p[3] == 1) { /* then silent until the client goes */
            r->cut = !wait_close(r, 10000000);
            return -1;
        }
        if (r->raw_pos >= s->raw_len)
            return 1;
        size_t n = r->p[1] ? r->p[1] : s->raw_len;
        if (n > s->raw_len - r->raw_pos)
            n = s->raw_len - r->raw_pos;
        out_add(r, s->raw + r->raw_pos, n);
        r->raw_pos += n;
        return 0;
    }
    case TS_BIG: {
        if (r->phase == 0) {
            out_str(r, "data: ");
            r->big_left = r->p[1];
            r->phase = 1;
            return 0;
        }
        if (r->big_left == 0) {
            if (r->phase++ == 1) {
                out_str(r, "\n\ndata: [DONE]\n\n");
                return 0;
            }
            return 1;
        }
        char block[65536];
        size_t n = r->big_left < sizeof block ? (size_t)r->big_left : sizeof block;
        memset(block, 'x', n);
        out_add(r, block, n);
        r->big_left -= n;
        return 0;
    }
    default:
        return 1;
    }
}

static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct req *r = cls;
    while (r->out_pos == r->out_len) {
        r->out_pos = r->out_len = 0;
        int rc = produce(r);
        if (rc > 0)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (rc < 0)
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = r->out_len - r->out_pos < max ? r->out_len - r->out_pos : max;
    memcpy(buf, r->out + r->out_pos, n);
    r->out_pos += n;
    return (ssize_t)n;
}

/* ---- requests ---- */

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *type,
                             const char *body)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ok = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static const char *const error_bodies[] = {
    "{\"error\":{\"message\":\"bad things happened\",\"type\":\"BadRequestError\",\"code\":400}}",
    "{\"object\":\"error\",\"message\":\"The model `x` does not exist.\",\"type\":"
    "\"NotFoundError\",\"param\":null,\"code\":404}",
    "Internal Server Error",
    "{\"object\":\"error\",\"message\":\"This model's maximum context length is 4096 tokens. "
    "However, you requested 5000 tokens.\",\"type\":\"BadRequestError\",\"param\":null,"
    "\"code\":400}",
    "{\"error\":{\"message\":\"line1\\nline2\\u0001\\u001b[31m\",\"type\":\"x\",\"code\":"
    "\"rate_limit\"}}",
    "{\"error\":{\"message\":\"'max_tokens' is too large: 5000. This model's maximum context "
    "length is 4096 tokens and your request has 10 input tokens (5000 > 4096 - 10).\","
    "\"type\":\"BadRequestError\",\"code\":400}}",
};

/* Read the request's JSON: prompt ids and what it asked for; false when it is not JSON. */
static bool read_request(struct req *r)
{
    json_t *root = json_loadb(r->up ? r->up : "", r->up_len, 0, NULL);
    json_t *prompt = json_object_get(root, "prompt");
    for (size_t i = 0; i < 6 && i < json_array_size(prompt); i++)
        r->p[i] = (uint32_t)json_integer_value(json_array_get(prompt, i));
    json_t *opts = json_object_get(root, "stream_options");
    r->ids = json_is_true(json_object_get(root, "return_token_ids"));
    r->cont = json_is_true(json_object_get(opts, "continuous_usage_stats"));
    r->usage = json_is_true(json_object_get(opts, "include_usage"));
    bool ok = json_is_array(prompt);
    json_decref(root);
    return ok;
}

static enum MHD_Result answer_completion(struct tsrv *s, struct MHD_Connection *conn, struct req *r)
{
    pthread_mutex_lock(&s->lock);
    s->requests++;
    free(s->last_body);
    s->last_body = strndup(r->up ? r->up : "", r->up_len);
    pthread_mutex_unlock(&s->lock);
    if (!read_request(r))
        return reply(conn, 400, "application/json", error_bodies[0]);
    if (r->p[0] == TS_HTTP_ERROR) {
        uint32_t shape = r->p[2] < 6 ? r->p[2] : 0;
        return reply(conn, r->p[1], shape == 2 ? "text/plain" : "application/json",
                     error_bodies[shape]);
    }
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    r->fd = ci ? ci->connect_fd : -1;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 65536, reader, r, NULL);
    bool json = r->p[0] == TS_RAW && r->p[2] == 1;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                            json ? "application/json" : "text/event-stream");
    enum MHD_Result ok = MHD_queue_response(conn, 200, resp);
    MHD_destroy_response(resp);
    return ok;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
    struct tsrv *s = cls;
    struct req *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        r->srv = s;
        r->fd = -1;
        *con_cls = r;
        return MHD_YES;
    }
    if (*upload_size) {
        if (r->up_len + *upload_size <= MAX_UPLOAD) {
            r->up = realloc(r->up, r->up_len + *upload_size + 1);
            memcpy(r->up + r->up_len, upload, *upload_size);
            r->up_len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (strcmp(method, "POST") == 0 && strcmp(url, "/v1/completions") == 0)
        return answer_completion(s, conn, r);
    pthread_mutex_lock(&s->lock);
    for (unsigned i = 0; i < s->n_gets; i++) {
        if (strcmp(s->gets[i].path, url) == 0) {
            struct doc d = s->gets[i];
            enum MHD_Result ok = reply(conn, d.status, d.type, d.body);
            pthread_mutex_unlock(&s->lock);
            return ok;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return reply(conn, 404, "text/plain", "not found");
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    struct tsrv *s = cls;
    struct req *r = *con_cls;
    if (!r)
        return;
    bool early = r->client_closed || (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !r->cut &&
                                      toe != MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN);
    if (r->p[0] && early) {
        pthread_mutex_lock(&s->lock);
        s->closed++;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->lock);
    }
    free(r->up);
    free(r->out);
    free(r);
    *con_cls = NULL;
}

struct tsrv *tsrv_start(void)
{
    struct tsrv *s = calloc(1, sizeof *s);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    s->mhd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD, 0,
                              NULL, NULL, handle, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                              MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                              MHD_OPTION_CONNECTION_TIMEOUT, 30u, MHD_OPTION_END);
    if (!s->mhd) {
        free(s);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    snprintf(s->url, sizeof s->url, "http://127.0.0.1:%u", di ? di->port : 0);
    return s;
}

void tsrv_stop(struct tsrv *s)
{
    if (!s)
        return;
    MHD_stop_daemon(s->mhd);
    for (unsigned i = 0; i < s->n_gets; i++) {
        free(s->gets[i].path);
        free(s->gets[i].type);
        free(s->gets[i].body);
    }
    free(s->raw);
    free(s->last_body);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

const char *tsrv_url(const struct tsrv *s)
{
    return s->url;
}

void tsrv_set_get(struct tsrv *s, const char *path, unsigned status, const char *type,
                  const char *body)
{
    pthread_mutex_lock(&s->lock);
    struct doc *d = NULL;
    for (unsigned i = 0; i < s->n_gets && !d; i++)
        d = strcmp(s->gets[i].path, path) == 0 ? &s->gets[i] : NULL;
    if (!d && s->n_gets < MAX_GETS) {
        d = &s->gets[s->n_gets++];
        d->path = strdup(path);
    } else if (d) {
        free(d->type);
        free(d->body);
    }
    if (d) {
        d->status = status;
        d->type = strdup(type);
        d->body = strdup(body);
    }
    pthread_mutex_unlock(&s->lock);
}

void tsrv_set_raw(struct tsrv *s, const void *body, size_t len)
{
    pthread_mutex_lock(&s->lock);
    free(s->raw);
    s->raw = malloc(len ? len : 1);
    memcpy(s->raw, body, len);
    s->raw_len = len;
    pthread_mutex_unlock(&s->lock);
}

unsigned tsrv_requests(struct tsrv *s)
{
    pthread_mutex_lock(&s->lock);
    unsigned n = s->requests;
    pthread_mutex_unlock(&s->lock);
    return n;
}

unsigned tsrv_closed(struct tsrv *s)
{
    pthread_mutex_lock(&s->lock);
    unsigned n = s->closed;
    pthread_mutex_unlock(&s->lock);
    return n;
}

bool tsrv_wait_closed(struct tsrv *s, unsigned n, long ms)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += ms / 1000;
    dl.tv_nsec += (ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L)
        dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&s->lock);
    while (s->closed < n && pthread_cond_timedwait(&s->cond, &s->lock, &dl) == 0)
        ;
    bool ok = s->closed >= n;
    pthread_mutex_unlock(&s->lock);
    return ok;
}

char *tsrv_last_body(struct tsrv *s)
{
    pthread_mutex_lock(&s->lock);
    char *b = s->last_body ? strdup(s->last_body) : NULL;
    pthread_mutex_unlock(&s->lock);
    return b;
}
