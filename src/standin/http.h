/*
 * kvr_se_http: kvengine's HTTP API on libmicrohttpd (the only includer of <microhttpd.h> in
 * src/standin): POST /v1/completions (an event stream, or one JSON), GET /v1/models, /health
 * (200 with an empty body; 503 while draining), /metrics, and with --metrics-style sglang GET
 * /get_server_info; with --test-hooks POST /test/drop_batches?n=N (1..10^6),
 * /test/stall?ms=N[&rank=R] (1..600,000), /test/clear (409 while requests run). Unknown paths are
 * 404 and other methods 405 (Allow given), each with an error body in the configured shape; every
 * error status is counted (kvengine_http_refusals_total{code}).
 *
 * Threads: libmicrohttpd's listening thread and one thread per connection (at most
 * max_connections; more are closed at once). A connection's thread blocks while its request
 * waits for tokens: in poll() on the request's eventfd, on its client's socket (POLLRDHUP: the
 * client closing is seen at once, and its request is cancelled in the engine) and on the
 * server's stop eventfd. That is why one thread per connection: a suspended libmicrohttpd
 * connection is not watched, so a client that closes during a long prefill would be noticed
 * only at its first token. A client that half-closes its sending side counts as gone (as for
 * uvicorn). While a completion runs its connection has no idle timeout (a long queue or a stall
 * is not idleness); the timeout is back once the response is over.
 *
 * Bounds: max_connections, a request body of max_body_bytes (a larger Content-Length is
 * answered 413 before any of it is read; a chunked body past the bound is read on, discarded,
 * and answered 413, and past twice the bound its connection is closed unanswered), headers
 * within 32 KB, an idle connection closed after idle_timeout_ns.
 */
#ifndef KVR_SE_HTTP_H
#define KVR_SE_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "kvr/status.h"
#include "state.h"

struct kvr_se_http;

/*
 * Listen on cfg->listen and serve the data-parallel ranks ranks[0..nranks) (1..KVR_SE_DP_MAX,
 * in rank order; a completion runs on the rank its X-data-parallel-rank header names, else on
 * the one holding the fewest requests) with cfg (all borrowed: they must outlive the server).
 * KVR_ERR_INVALID (address), KVR_ERR_IO (cannot listen), KVR_ERR_NOMEM with why[0..len); *out
 * is the server (the caller stops it) or NULL.
 */
kvr_status kvr_se_http_start(struct kvr_se_state *const *ranks, uint32_t nranks,
                             const struct kvr_se_config *cfg, struct kvr_se_http **out, char *why,
                             size_t len);

/* The port it listens on (the one chosen for port 0). */
uint16_t kvr_se_http_port(const struct kvr_se_http *h);

/* Wake every connection's wait (they end their responses), close every connection, join the
 * threads, free h. NULL is a no-op. */
void kvr_se_http_stop(struct kvr_se_http *h);

#endif
