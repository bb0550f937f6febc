/*
 * The router's Prometheus metrics and its readiness, for the HTTP server (src/net/httpd.h) the
 * link runs when --metrics-addr is given. Both run on the server's threads and never wait on the
 * state mutex for long: a router whose decision path is stuck behind it answers "not ready"
 * (within KVR_RD_READY_STALL_NS) instead of hanging its probes. docs/operations.md lists every
 * metric.
 */
#ifndef KVR_RD_METRICS_H
#define KVR_RD_METRICS_H

#include <stdbool.h>
#include <stddef.h>

#include "prom.h"
#include "state.h"

#define KVR_RD_READY_STALL_NS (500ull * 1000000ull) /* the decision path silent this long */
#define KVR_RD_LOCK_WAIT_NS   (250ull * 1000000ull) /* a scrape waits this long for the state */

/* The state's families into p (takes mu, waiting at most KVR_RD_LOCK_WAIT_NS: KVR_ERR_TIMEOUT). */
kvr_status kvr_rd_metrics(struct kvr_rd *rd, struct kvr_prom *p);

/* Ready: the decision path ticked within KVR_RD_READY_STALL_NS, the state mutex answers, it
 * serves, has its snapshot and knows a worker. Else false with why. Takes mu (briefly, bounded). */
bool kvr_rd_ready(struct kvr_rd *rd, char *why, size_t len);

#endif
