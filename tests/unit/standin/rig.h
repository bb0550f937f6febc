/*
 * The stand-in tests' rig: kvengine started in-process on 127.0.0.1 (ephemeral ports), a real
 * HTTP client (libcurl) for plain requests and for event streams (parsed as they arrive, with the
 * time of the first event), raw sockets for requests left hanging, metric samples read back from
 * /metrics, and waits with deadlines. Each Criterion test runs in its own process.
 */
#ifndef RIG_H
#define RIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "standin.h"

#define RIG_MAX_EVENTS 4096

/* kvengine's settings for a test: 127.0.0.1:0, errors only in the log, a small fast engine. */
void rig_config(struct kvr_se_config *cfg);
/* Start it (asserts success). */
struct kvr_standin *rig_start(const struct kvr_se_config *cfg);

struct rig_resp {
    long status;     /* HTTP status; 0 when the transfer failed */
    int curl;        /* the CURLcode */
    char *body;      /* NUL-terminated (owned) */
    size_t len;      /* */
    char ctype[128]; /* Content-Type */
    char allow[64];  /* Allow */
};
void rig_resp_free(struct rig_resp *r);

/* method path (body NULL: none; headers NULL-terminated extra lines or NULL) on port. */
long rig_http(uint16_t port, const char *method, const char *path, const char *body,
              const char *const *headers, struct rig_resp *out);
long rig_get(uint16_t port, const char *path, struct rig_resp *out);
long rig_post(uint16_t port, const char *path, const char *body, struct rig_resp *out);
/* The body's JSON (asserts it parses); the caller decrefs. */
json_t *rig_json(const struct rig_resp *r);

/* An event stream read to its end, or cut by the client after abort_after events (0: never). */
struct rig_stream {
    struct rig_resp resp;       /* status, curl code, content type; body unused */
    json_t *ev[RIG_MAX_EVENTS]; /* the data events' JSON, in order */
    size_t n;                   /* */
    bool done;                  /* "data: [DONE]" came */
    bool bad;                   /* an event that was not JSON, or data after [DONE] */
    size_t abort_after;         /* */
    uint64_t sent_ns, first_ns; /* when the request went out, the first event came */
    char *pending;              /* bytes of an event not complete yet (owned) */
    size_t npending;            /* */
};
void rig_stream(uint16_t port, const char *body, size_t abort_after, struct rig_stream *out);
void rig_stream_free(struct rig_stream *s);

/* A prompt of n token ids base, base + 1, ... as JSON text: "[b,b+1,...]" (owned). */
char *rig_prompt(uint32_t n, uint32_t base);

/* The value of the first /metrics sample line that starts with sample (a name, or a name and
 * "{labels}"); NAN when none. */
double rig_metric(uint16_t port, const char *sample);
/* Wait until that value equals want, at most timeout_ms; the last value seen. */
double rig_wait_metric(uint16_t port, const char *sample, double want, unsigned timeout_ms);

/* A raw connection to port that sent text (a whole request, or ""); its fd. rcvbuf > 0 sets
 * the socket's receive buffer first (a client that reads nothing holds little). */
int rig_send_raw(uint16_t port, const char *text);
int rig_send_raw_buf(uint16_t port, const char *text, int rcvbuf);
/* A POST of body to path as raw request text (owned). */
char *rig_raw_post(const char *path, const char *body);

uint64_t rig_now_ns(void);
void rig_sleep_ms(unsigned ms);

#endif
