/*
 * The libcurl glue of src/openai: the one curl_global_init (once, thread-safe through
 * pthread_once; libcurl >= 7.84 makes it so itself), the options every handle gets (no proxy,
 * no signals, http and https only, no redirects), the one CURLcode -> kvr_status conversion,
 * base URL checks, and a bounded blocking GET for the engine's small documents. Thread-safe.
 */
#ifndef KVR_OAI_HTTP_H
#define KVR_OAI_HTTP_H

#include <curl/curl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "kvr/status.h"

#define KVR_OAI_GET_TIMEOUT_MS 5000 /* the default of a blocking GET's timeout */

/* curl_global_init, once per process; false when it failed. */
bool kvr_oai_curl_init(void);

/* The options of every easy handle (see above); connect_ms and total_ms 0: curl's defaults. */
void kvr_oai_curl_defaults(CURL *e, long connect_ms, long total_ms);

/* A transfer's failure as a status: refused, reset, cut -> KVR_ERR_WORKER_LOST; timeouts ->
 * KVR_ERR_TIMEOUT; out of memory; anything else KVR_ERR_IO. CURLE_OK -> KVR_OK. */
kvr_status kvr_oai_curl_status(CURLcode rc);

/*
 * Whether url is a usable base URL: "http://" or "https://", a host, no spaces, quotes or
 * control characters, shorter than KVR_OAI_URL_MAX with a path appended. Its copy into out
 * (len bytes) drops trailing slashes.
 */
bool kvr_oai_base_url(const char *url, char *out, size_t len);

/*
 * GET base + path into body (replaced; NUL-terminated at body->len), at most max bytes, within
 * timeout_ms (0: KVR_OAI_GET_TIMEOUT_MS); *code gets the HTTP status (0 when none). KVR_OK with
 * any status (the caller judges it), KVR_ERR_TOO_LARGE, KVR_ERR_INVALID (bad base URL), or
 * kvr_oai_curl_status's.
 */
kvr_status kvr_oai_http_get(const char *base, const char *path, long timeout_ms, size_t max,
                            struct kvr_buf *body, long *code);

/*
 * The request headers of every completion into *out (the caller frees it with
 * curl_slist_free_all): JSON in, an event stream out, no "Expect: 100-continue"; with pin,
 * "X-data-parallel-rank: rank" too (vLLM's, and SGLang's, pin of a request to one data-parallel
 * rank). KVR_OK or KVR_ERR_NOMEM (*out NULL).
 */
kvr_status kvr_oai_http_headers(bool pin, uint32_t rank, struct curl_slist **out);

#endif
