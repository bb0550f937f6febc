/*
 * A tiny HTTP server for operators: GET or HEAD /metrics (Prometheus text), /healthz (alive),
 * /readyz (ready to serve), on libmicrohttpd (the only includer of <microhttpd.h>).
 *
 * Threads: libmicrohttpd's own, a pool of KVR_HTTPD_THREADS polling threads (epoll) started by
 * kvr_httpd_start and joined by kvr_httpd_stop; two, so one slow callback (a scrape waiting for
 * the daemon's lock) does not hold a probe on another connection; and a reaper of ours (below).
 * Idle, they sleep in epoll_wait with no timeout and the reaper in a wait that only a new
 * connection ends: no CPU. The hooks are called on the pool's threads, possibly two at once.
 *
 * Bounds: at most max_connections connections (the next wait in the listen backlog until one
 * closes), each closed after timeout_s seconds without traffic (an unfinished request too: even
 * half-closed by its client, it stays until then); and each request must arrive whole within
 * timeout_s of its connection's start or of the previous request on it (its answer then has as
 * long to be read): the reaper cuts a slower client, however steadily it trickles its bytes
 * (libmicrohttpd's timeout counts idle time only), so slow clients keep no probe out for longer
 * than that. At most max_request_bytes of request line and headers (beyond that libmicrohttpd
 * answers 414 or 431 and closes). A body is never read: a request announcing one is answered at
 * once and its connection closed; others keep theirs (HTTP/1.1 keep-alive, as Prometheus scrapes).
 * Unknown paths are 404, other methods on the three paths 405 (Allow: GET, HEAD). libmicrohttpd's
 * errors are logged at most once a second.
 */
#ifndef KVR_HTTPD_H
#define KVR_HTTPD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "kvr/status.h"

#define KVR_HTTPD_THREADS         2     /* libmicrohttpd's polling threads */
#define KVR_HTTPD_MAX_CONNECTIONS 64    /* the default of max_connections */
#define KVR_HTTPD_TIMEOUT_S       10    /* the default of timeout_s */
#define KVR_HTTPD_REQUEST_BYTES   16384 /* the default of max_request_bytes */
#define KVR_HTTPD_ADDR_MAX        64    /* bytes in an address, "[v6]:port" included */
#define KVR_HTTPD_WHY_MAX         256   /* bytes readyz may write into why, its NUL included */

/*
 * What the daemon answers with; every hook is called on a server thread, possibly two at once,
 * must be thread-safe, must return promptly (well under a probe's timeout, e.g. by taking its
 * lock with a deadline and reporting failure when it cannot) and must not call kvr_httpd_stop.
 */
struct kvr_httpd_hooks {
    /* Append a Prometheus text exposition (format 0.0.4) to out (empty on entry; the server
     * frees it): KVR_OK -> 200 with it, anything else -> 503 "metrics unavailable: <status
     * text>". NULL: /metrics is 404. */
    kvr_status (*metrics)(void *ctx, struct kvr_buf *out);
    /* Whether the process is alive: true -> 200 "ok", false -> 503 "not alive". NULL: always
     * alive (the server answering is the proof). */
    bool (*healthz)(void *ctx);
    /* Whether it is ready to serve: true -> 200 "ready"; false -> 503 with why (len bytes,
     * zeroed on entry; "not ready" when left empty). NULL: always ready. */
    bool (*readyz)(void *ctx, char *why, size_t len);
    void *ctx; /* passed to every hook; must outlive the server */
};

struct kvr_httpd_config {
    const char *addr;         /* "HOST:PORT" (kvr_httpd_check_addr); borrowed for the call */
    unsigned max_connections; /* at once; 0: KVR_HTTPD_MAX_CONNECTIONS */
    unsigned timeout_s; /* idle this long, or a request this slow: closed; 0: KVR_HTTPD_TIMEOUT_S */
    size_t max_request_bytes; /* request line and headers; 0: KVR_HTTPD_REQUEST_BYTES */
};

struct kvr_httpd;

/*
 * Whether addr is an address the server can listen on: HOST:PORT, HOST an IPv4 address
 * (0.0.0.0 for all) or an IPv6 one in brackets ([::] for all, [::1]), PORT 0..65535 (0: any
 * free port, see kvr_httpd_port); names are not resolved. KVR_ERR_INVALID with a sentence in
 * why[0..len) saying what is wrong and what is expected (for the daemon's log or its --help
 * check), KVR_OK otherwise (why untouched). why may be NULL when len is 0.
 */
kvr_status kvr_httpd_check_addr(const char *addr, char *why, size_t len);

/*
 * Start serving on c->addr with hooks h (copied; h->ctx must outlive the server) and its threads
 * running. KVR_ERR_INVALID for a bad address or configuration, KVR_ERR_IO when it cannot listen
 * (in use, no permission), KVR_ERR_NOMEM; on failure why[0..len) says why (may be NULL when len
 * is 0) and *out is NULL. The caller owns *out: kvr_httpd_stop it.
 */
kvr_status kvr_httpd_start(const struct kvr_httpd_config *c, const struct kvr_httpd_hooks *h,
                           struct kvr_httpd **out, char *why, size_t len);

/* The port it listens on (the one chosen when the address said 0). */
uint16_t kvr_httpd_port(const struct kvr_httpd *s);

/* Close the listening socket and every connection, wait for hooks running to return, join the
 * threads, free s. NULL is a no-op. Not from a hook. */
void kvr_httpd_stop(struct kvr_httpd *s);

/* A daemon's --metrics-addr: nothing when addr is empty (*out NULL), else kvr_httpd_start with
 * the defaults, logged (http_listening with the port, or http_failed with why). */
kvr_status kvr_httpd_serve(const char *addr, const struct kvr_httpd_hooks *h,
                           struct kvr_httpd **out);

#endif
