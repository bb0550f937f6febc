/*
 * libcurl glue (http.h).
 */
#include "http.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "openai.h"

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static bool curl_ok;

static void curl_init_once(void)
{
    curl_ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
}

bool kvr_oai_curl_init(void)
{
    pthread_once(&curl_once, curl_init_once);
    return curl_ok;
}

void kvr_oai_curl_defaults(CURL *e, long connect_ms, long total_ms)
{
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROXY, ""); /* never a proxy from the environment */
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    if (connect_ms > 0)
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
    if (total_ms > 0)
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, total_ms);
}

kvr_status kvr_oai_curl_status(CURLcode rc)
{
    switch (rc) {
    case CURLE_OK:
        return KVR_OK;
    case CURLE_COULDNT_CONNECT:
    case CURLE_GOT_NOTHING:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
        return KVR_ERR_WORKER_LOST;
    case CURLE_OPERATION_TIMEDOUT:
        return KVR_ERR_TIMEOUT;
    case CURLE_OUT_OF_MEMORY:
        return KVR_ERR_NOMEM;
    default:
        return KVR_ERR_IO;
    }
}

bool kvr_oai_base_url(const char *url, char *out, size_t len)
{
    if (!url)
        return false;
    size_t n = strlen(url);
    size_t scheme = strncmp(url, "http://", 7) == 0 ? 7 : strncmp(url, "https://", 8) == 0 ? 8 : 0;
    while (n > scheme && url[n - 1] == '/')
        n--;
    /* room for the longest path appended ("/v1/completions") */
    if (!scheme || n == scheme || n + 32 >= len || n + 32 >= KVR_OAI_URL_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)url[i];
        if (c <= 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>')
            return false;
    }
    memcpy(out, url, n);
    out[n] = 0;
    return true;
}

struct get_sink {
    struct kvr_buf *body;
    size_t max;
    bool too_large;
};

static size_t get_write(char *ptr, size_t size, size_t nmemb, void *ud)
{
    struct get_sink *k = ud;
    size_t n = size * nmemb;
    if (n > k->max - k->body->len) {
        k->too_large = true;
        return CURL_WRITEFUNC_ERROR;
    }
    if (kvr_buf_reserve(k->body, k->body->len + n + 1) != KVR_OK)
        return CURL_WRITEFUNC_ERROR;
    memcpy(k->body->data + k->body->len, ptr, n);
    k->body->len += n;
    return n;
}

kvr_status kvr_oai_http_get(const char *base, const char *path, long timeout_ms, size_t max,
                            struct kvr_buf *body, long *code)
{
    char url[KVR_OAI_URL_MAX];
    *code = 0;
    body->len = 0;
    if (!kvr_oai_base_url(base, url, sizeof url) || strlen(url) + strlen(path) >= sizeof url)
        return KVR_ERR_INVALID;
    strcat(url, path);
    if (!kvr_oai_curl_init())
        return KVR_ERR_IO;
    if (kvr_buf_reserve(body, 1) != KVR_OK)
        return KVR_ERR_NOMEM;
    CURL *e = curl_easy_init();
    if (!e)
        return KVR_ERR_NOMEM;
    long ms = timeout_ms > 0 ? timeout_ms : KVR_OAI_GET_TIMEOUT_MS;
    struct get_sink sink = {body, max, false};
    kvr_oai_curl_defaults(e, ms, ms);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, get_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &sink);
    CURLcode rc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, code);
    curl_easy_cleanup(e);
    body->data[body->len] = 0;
    if (sink.too_large)
        return KVR_ERR_TOO_LARGE;
    return rc == CURLE_WRITE_ERROR ? KVR_ERR_NOMEM : kvr_oai_curl_status(rc);
}

kvr_status kvr_oai_http_headers(bool pin, uint32_t rank, struct curl_slist **out)
{
    char pinned[64];
    snprintf(pinned, sizeof pinned, "X-data-parallel-rank: %" PRIu32, rank);
    const char *lines[] = {"Content-Type: application/json", "Accept: text/event-stream",
                           "Expect:", pinned};
    struct curl_slist *h = NULL, *t;
    for (size_t i = 0; i < (pin ? 4u : 3u); i++) {
        t = curl_slist_append(h, lines[i]);
        if (!t) {
            curl_slist_free_all(h);
            *out = NULL;
            return KVR_ERR_NOMEM;
        }
        h = t;
    }
    *out = h;
    return KVR_OK;
}
