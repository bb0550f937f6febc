/*
 * A small OpenAI-compatible test server on libmicrohttpd (127.0.0.1, an ephemeral port), for the
 * client's tests: POST /v1/completions streams what the request's prompt asks for (prompt[0] is
 * the scenario, the next ids its parameters; below), and GET answers documents the test set.
 * It behaves like vLLM where that matters: token_ids only when the request asked for
 * return_token_ids, usage on every chunk with continuous_usage_stats, the usage-only last chunk
 * with include_usage, then data: [DONE]. It notices a client that closes its connection (poll
 * on the socket between chunks, and libmicrohttpd's completion codes) and counts it.
 * Threads: libmicrohttpd's, one per connection; the counters are under a mutex.
 */
#ifndef KVR_TSRV_H
#define KVR_TSRV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum tsrv_scenario {
    TS_STREAM = 1,   /* p1 tokens, p2 finish (enum below), p3 us between chunks, p4 flags */
    TS_HTTP_ERROR,   /* p1 HTTP status, p2 body shape (0..5, see tsrv.c) */
    TS_STREAM_ERROR, /* one chunk, an error object (p2: 0 wrapped, 1 vLLM's), then [DONE] */
    TS_CUT,          /* p1 chunks, then the connection is cut */
    TS_SILENT,       /* headers, then nothing until the client closes (10 s at most) */
    TS_HOLD,         /* a chunk every p1 us until the client closes */
    TS_RAW,          /* the raw body set by tsrv_set_raw, p1 bytes per write (0: all);
                        p2: 1 answers Content-Type application/json instead; p3: 1 keeps
                        the connection open after it, silent, until the client closes */
    TS_BIG,          /* one event of p1 bytes of data */
    TS_NOBODY,       /* 200, text/event-stream, no body */
};

enum tsrv_finish { TF_LENGTH, TF_STOP, TF_ODD, TF_NONE }; /* TF_ODD: long, with control bytes */

#define TSF_NO_DONE    1u  /* no data: [DONE] (the connection ends after the finish) */
#define TSF_MULTI      2u  /* two tokens per chunk */
#define TSF_CRLF       4u  /* CRLF line ends */
#define TSF_CACHED     8u  /* prompt_tokens_details.cached_tokens in the final usage */
#define TSF_SPLIT_DATA 16u /* comments, other fields, and each chunk's JSON over two data lines */

struct tsrv;

struct tsrv *tsrv_start(void);
void tsrv_stop(struct tsrv *s);
const char *tsrv_url(const struct tsrv *s); /* "http://127.0.0.1:<port>" */

/* GET path answers status with body (copied); at most 16 paths. */
void tsrv_set_get(struct tsrv *s, const char *path, unsigned status, const char *type,
                  const char *body);
/* The body of TS_RAW (copied). */
void tsrv_set_raw(struct tsrv *s, const void *body, size_t len);

/* Completion requests received; and those whose client closed the connection early. */
unsigned tsrv_requests(struct tsrv *s);
unsigned tsrv_closed(struct tsrv *s);
/* Wait until at least n closes were seen, up to ms; whether they were. */
bool tsrv_wait_closed(struct tsrv *s, unsigned n, long ms);
/* A copy of the last completion request's body (free it). */
char *tsrv_last_body(struct tsrv *s);

#endif
