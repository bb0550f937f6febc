/*
 * The stand-in tests' rig.
 */
#define _GNU_SOURCE /* memmem */
#include "rig.h"

#include <criterion/criterion.h>
#include "../../criterion_gt.h"
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "clock.h"
#include "log.h"

void rig_config(struct kvr_se_config *cfg)
{
    kvr_se_config_default(cfg);
    snprintf(cfg->listen, sizeof cfg->listen, "127.0.0.1:0");
    cfg->engine.block_size = 4;
    cfg->engine.num_blocks = 1024;
    cfg->engine.speedup = 20; /* steps of a ms or two */
    cfg->max_model_len = 2048;
    cfg->log_level = KVR_LOG_ERROR;
}

struct kvr_standin *rig_start(const struct kvr_se_config *cfg)
{
    kvr_log_init("test_standin", (enum kvr_log_level)cfg->log_level);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    struct kvr_standin *s = NULL;
    char why[512] = "";
    kvr_status st = kvr_standin_create(cfg, &s, why, sizeof why);
    cr_assert(eq(int, st, KVR_OK), "kvr_standin_create: %s", why);
    cr_assert(ne(u16, kvr_standin_port(s), 0));
    return s;
}

uint64_t rig_now_ns(void)
{
    return kvr_now_ns();
}

void rig_sleep_ms(unsigned ms)
{
    kvr_sleep_ns(ms * KVR_NS_PER_MS);
}

void rig_resp_free(struct rig_resp *r)
{
    free(r->body);
    memset(r, 0, sizeof *r);
}

static size_t on_body(char *p, size_t size, size_t n, void *ctx)
{
    struct rig_resp *r = ctx;
    size_t k = size * n;
    char *nb = realloc(r->body, r->len + k + 1);
    cr_assert(ne(ptr, nb, NULL));
    memcpy(nb + r->len, p, k);
    r->body = nb;
    r->len += k;
    r->body[r->len] = 0;
    return k;
}

/* Keep the Content-Type and Allow headers. */
static size_t on_header(char *p, size_t size, size_t n, void *ctx)
{
    struct rig_resp *r = ctx;
    size_t k = size * n;
    static const struct {
        const char *name;
        size_t off, cap;
    } keep[] = {{"content-type:", offsetof(struct rig_resp, ctype), sizeof r->ctype},
                {"allow:", offsetof(struct rig_resp, allow), sizeof r->allow}};
    for (size_t i = 0; i < 2; i++) {
        size_t nl = strlen(keep[i].name);
        if (k > nl && !strncasecmp(p, keep[i].name, nl)) {
            char *dst = (char *)r + keep[i].off;
            snprintf(dst, keep[i].cap, "%.*s", (int)(k - nl), p + nl);
            size_t a = strspn(dst, " ");
            memmove(dst, dst + a, strlen(dst + a) + 1);
            dst[strcspn(dst, "\r\n")] = 0;
        }
    }
    return k;
}

static CURL *easy(uint16_t port, const char *method, const char *path, const char *body,
                  struct curl_slist *hl, void *hctx)
{
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", (unsigned)port, path);
    CURL *c = curl_easy_init();
    cr_assert(ne(ptr, c, NULL));
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 20000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, hctx);
    if (!strcmp(method, "HEAD"))
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    if (hl)
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    return c;
}

static struct curl_slist *header_list(const char *const *headers, bool json)
{
    struct curl_slist *hl = NULL;
    if (json)
        hl = curl_slist_append(hl, "Content-Type: application/json");
    for (size_t i = 0; headers && headers[i]; i++)
        hl = curl_slist_append(hl, headers[i]);
    return hl;
}

long rig_http(uint16_t port, const char *method, const char *path, const char *body,
              const char *const *headers, struct rig_resp *out)
{
    memset(out, 0, sizeof *out);
    struct curl_slist *hl = header_list(headers, body != NULL);
    CURL *c = easy(port, method, path, body, hl, out);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
    out->curl = (int)curl_easy_perform(c);
    if (out->curl == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->status);
    if (!out->body)
        out->body = calloc(1, 1);
    curl_easy_cleanup(c);
    curl_slist_free_all(hl);
    return out->status;
}

long rig_get(uint16_t port, const char *path, struct rig_resp *out)
{
    return rig_http(port, "GET", path, NULL, NULL, out);
}

long rig_post(uint16_t port, const char *path, const char *body, struct rig_resp *out)
{
    return rig_http(port, "POST", path, body, NULL, out);
}

json_t *rig_json(const struct rig_resp *r)
{
    json_error_t err;
    json_t *j = json_loadb(r->body, r->len, 0, &err);
    cr_assert(ne(ptr, j, NULL), "not JSON (%s): %s", err.text, r->body);
    return j;
}

/* --- streams --------------------------------------------------------------------------------- */

/* One complete event (text[0..n), "data: ..."). */
static void on_event(struct rig_stream *s, const char *text, size_t n)
{
    if (s->n == 0 && !s->done)
        s->first_ns = rig_now_ns();
    if (n < 6 || strncmp(text, "data: ", 6) || s->done) {
        s->bad = true;
        return;
    }
    if (n - 6 == 6 && !strncmp(text + 6, "[DONE]", 6)) {
        s->done = true;
        return;
    }
    json_t *j = json_loadb(text + 6, n - 6, 0, NULL);
    if (!j || s->n == RIG_MAX_EVENTS) {
        s->bad = true;
        json_decref(j);
        return;
    }
    s->ev[s->n++] = j;
}

static size_t on_stream(char *p, size_t size, size_t n, void *ctx)
{
    struct rig_stream *s = ctx;
    size_t k = size * n;
    char *nb = realloc(s->pending, s->npending + k);
    cr_assert(ne(ptr, nb, NULL));
    memcpy(nb + s->npending, p, k);
    s->pending = nb;
    s->npending += k;
    size_t at = 0;
    for (;;) {
        char *end = memmem(s->pending + at, s->npending - at, "\n\n", 2);
        if (!end)
            break;
        on_event(s, s->pending + at, (size_t)(end - (s->pending + at)));
        at = (size_t)(end - s->pending) + 2;
    }
    memmove(s->pending, s->pending + at, s->npending - at);
    s->npending -= at;
    if (s->abort_after && s->n >= s->abort_after)
        return 0; /* the client goes away: curl closes the connection */
    return k;
}

void rig_stream(uint16_t port, const char *body, size_t abort_after, struct rig_stream *out)
{
    memset(out, 0, sizeof *out);
    out->abort_after = abort_after;
    struct curl_slist *hl = header_list(NULL, true);
    CURL *c = easy(port, "POST", "/v1/completions", body, hl, &out->resp);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_stream);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
    out->sent_ns = rig_now_ns();
    out->resp.curl = (int)curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->resp.status);
    curl_easy_cleanup(c);
    curl_slist_free_all(hl);
}

void rig_stream_free(struct rig_stream *s)
{
    for (size_t i = 0; i < s->n; i++)
        json_decref(s->ev[i]);
    free(s->pending);
    rig_resp_free(&s->resp);
    memset(s, 0, sizeof *s);
}

char *rig_prompt(uint32_t n, uint32_t base)
{
    char *s = malloc((size_t)n * 12 + 3), *p = s;
    cr_assert(ne(ptr, s, NULL));
    *p++ = '[';
    for (uint32_t i = 0; i < n; i++)
        p += sprintf(p, i ? ",%u" : "%u", base + i);
    *p++ = ']';
    *p = 0;
    return s;
}

/* --- metrics --------------------------------------------------------------------------------- */

double rig_metric(uint16_t port, const char *sample)
{
    struct rig_resp r;
    rig_get(port, "/metrics", &r);
    double v = NAN;
    size_t n = strlen(sample);
    for (char *line = r.body; r.status == 200 && line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        if (!strncmp(line, sample, n) && (line[n] == ' ' || line[n] == '{')) {
            char *sp = strrchr(line, ' ');
            if (sp) {
                v = strtod(sp + 1, NULL);
                break;
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    rig_resp_free(&r);
    return v;
}

double rig_wait_metric(uint16_t port, const char *sample, double want, unsigned timeout_ms)
{
    uint64_t deadline = rig_now_ns() + timeout_ms * KVR_NS_PER_MS;
    double v;
    while ((v = rig_metric(port, sample)) != want && rig_now_ns() < deadline)
        rig_sleep_ms(5);
    return v;
}

/* --- raw sockets ----------------------------------------------------------------------------- */

int rig_send_raw(uint16_t port, const char *text)
{
    return rig_send_raw_buf(port, text, 0);
}

int rig_send_raw_buf(uint16_t port, const char *text, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(ge(int, fd, 0));
    if (rcvbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert(eq(int, connect(fd, (struct sockaddr *)&a, sizeof a), 0));
    size_t n = strlen(text);
    cr_assert(eq(i64, (int64_t)send(fd, text, n, MSG_NOSIGNAL), (int64_t)n));
    return fd;
}

char *rig_raw_post(const char *path, const char *body)
{
    size_t n = strlen(body) + strlen(path) + 200;
    char *s = malloc(n);
    cr_assert(ne(ptr, s, NULL));
    snprintf(s, n,
             "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n%s",
             path, strlen(body), body);
    return s;
}
