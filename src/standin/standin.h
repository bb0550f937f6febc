/*
 * kvr_standin: kvengine, the engine stand-in, as one object: the simulated engine in real time
 * behind a real engine's two interfaces, the OpenAI-compatible HTTP API (src/standin/http.h)
 * and KV events as msgpack batches over ZeroMQ (src/kvevents), so that kvrouter's worker
 * adapter can be tested with real sockets and no GPU. Its parts: config (the options), wire
 * (the JSON), state (the engine thread, the requests, the KV events), blocks and batcher (what
 * KV events carry), metrics (/metrics), http (the server).
 *
 * Lifecycle, for the main and for tests in-process: create (binds and starts everything),
 * drain on SIGTERM, destroy. Threads: the engine's, the HTTP server's, the ZeroMQ publisher's;
 * the functions here are called from one thread (the main).
 */
#ifndef KVR_STANDIN_H
#define KVR_STANDIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "kvr/status.h"

struct kvr_standin;

/*
 * Start kvengine with cfg (copied): the engine thread, the KV-event publisher (with
 * cfg->kv_events) and the HTTP server; logs http_listening (addr, port) and, with KV events,
 * kv_events_listening (endpoint, replay). KVR_ERR_INVALID, KVR_ERR_IO, KVR_ERR_NOMEM with
 * why[0..len) filled and *out NULL.
 */
kvr_status kvr_standin_create(const struct kvr_se_config *cfg, struct kvr_standin **out, char *why,
                              size_t len);

/* The HTTP port (the one chosen when the address said port 0). */
uint16_t kvr_standin_port(const struct kvr_standin *s);

/* The KV-event endpoint bound (replay: the replay socket's), as kvr_kvpub_endpoint says;
 * KVR_ERR_INVALID without KV events (or without a replay socket). */
kvr_status kvr_standin_kv_endpoint(struct kvr_standin *s, bool replay, char *buf, size_t len);

/* The same for data-parallel rank rank (--dp-size; rank 0 is kvr_standin_kv_endpoint's): vLLM's
 * port + rank when --kv-events named a port, an ephemeral one of its own for port 0. */
kvr_status kvr_standin_kv_endpoint_rank(struct kvr_standin *s, uint32_t rank, bool replay,
                                        char *buf, size_t len);

/* SIGTERM: stop taking requests (503), let those running finish within the drain timeout,
 * abort the rest. Returns the requests aborted. */
uint32_t kvr_standin_drain(struct kvr_standin *s);

/* Close every connection, stop every thread, free. NULL is a no-op. */
void kvr_standin_destroy(struct kvr_standin *s);

/* The state inside (for tests: its counters, under its mutex): rank 0's. */
struct kvr_se_state *kvr_standin_state(struct kvr_standin *s);
/* Data-parallel rank rank's (NULL past --dp-size). */
struct kvr_se_state *kvr_standin_rank_state(struct kvr_standin *s, uint32_t rank);

#endif
