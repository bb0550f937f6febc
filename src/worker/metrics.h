/*
 * The simulated worker's Prometheus metrics and its readiness, for the HTTP server
 * (src/net/httpd.h) the link runs when --metrics-addr is given: the generate endpoint's requests,
 * errors by code and latency, the worker's counters, and its engine's figures (kvr_engine_stats).
 * The NATS figures and the connections' part of readiness are the link's (link.c, the only includer
 * of <nats.h>). Both run on the server's threads and never wait on the worker's mutex for long: a
 * worker whose lock is held answers 503 (metrics) or "not ready" within KVR_WK_LOCK_WAIT_NS instead
 * of hanging its probes. docs/operations.md lists every metric.
 */
#ifndef KVR_WK_METRICS_H
#define KVR_WK_METRICS_H

#include <stdbool.h>
#include <stddef.h>

#include "prom.h"
#include "worker.h"

#define KVR_WK_LOCK_WAIT_NS    (250ull * 1000000ull)  /* a scrape waits this long for the mutex */
#define KVR_WK_ENGINE_STALL_NS (1000ull * 1000000ull) /* the engine loop silent this long */

/* The worker's families into p: its figures are copied under mu (waited for at most
 * KVR_WK_LOCK_WAIT_NS: KVR_ERR_TIMEOUT, nothing written) and written after it. Returns
 * kvr_prom_end(p) otherwise. */
kvr_status kvr_wk_metrics(struct kvr_worker *w, struct kvr_prom *p);

/*
 * Ready, as far as the worker's state says (the link checks its connections first): the engine
 * thread turned within KVR_WK_ENGINE_STALL_NS, the mutex answers, the link took its
 * subscriptions after the hello (serving), it did not yield its id (clashed), it is not draining.
 * Else false with why (len bytes). Takes mu (bounded, briefly).
 */
bool kvr_wk_ready(struct kvr_worker *w, char *why, size_t len);

#endif
