/*
 * What the router sends to workers: the forward of a decided request to its worker
 * (<prefix>.<ns>.worker.<id>.generate: the client's bytes wrapped with the router's key, the
 * expected overlap, the router's id and what is left of the client's deadline, the client's reply
 * subject kept), and a WorkerCancel (<prefix>.<ns>.worker.<id>.cancel). Queued into the state's
 * outbox, under the state mutex.
 */
#ifndef KVR_RD_SEND_H
#define KVR_RD_SEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "state.h"

/* Queue the forward of p (its bytes raw[0..len)) to worker_id, expecting overlap blocks, with
 * what is left of its deadline; tagged with its key, so a failed publish comes back to
 * kvr_place_forward_failed (place.h). */
void kvr_send_forward(struct kvr_rd *rd, const struct kvr_pending *p, const void *raw, size_t len,
                      uint64_t worker_id, uint32_t overlap);

/* Queue a WorkerCancel of key to worker_id: reason KVR_ERR_CANCELLED or KVR_ERR_DEADLINE; silent:
 * the worker ends it without a chunk (another worker serves it). */
void kvr_send_cancel(struct kvr_rd *rd, uint64_t key, uint64_t worker_id, kvr_status reason,
                     bool silent);

/* The deadline of p (monotonic ns, 0: none) as the milliseconds left at now (at least 1). */
uint32_t kvr_send_deadline_left(const struct kvr_pending *p, uint64_t now);

#endif
