/*
 * Intake: the client endpoints. kv.<ns>.generate (queue group "kvrouter"): decode, decide and book
 * in one critical section, remember the request (pending), forward it to the chosen worker and
 * gossip the decision; a resend (same reply subject and id) of a request the fleet has in flight
 * is absorbed, one of a request that ended in the last minute ignored, one whose cancel came
 * first answered "cancelled". kv.<ns>.select: a decision without forwarding, booked on request
 * (a booking no worker starts is dropped after the booking TTL). kv.<ns>.cancel (every router):
 * the router that holds a request queued answers it "cancelled"; every router that knows its
 * worker tells that worker to stop; a cancel for a request nobody has yet is remembered. Every
 * refusal reaches the client through the endpoint's kvr_reply (docs/protocol.md).
 */
#ifndef KVR_RD_INTAKE_H
#define KVR_RD_INTAKE_H

#include <stddef.h>

#include "state.h"

/* A GenerateRequest data[0..len) with reply subject reply (may be NULL) (takes mu; publishes). */
void kvr_intake_generate(struct kvr_rd *rd, const char *reply, const void *data, size_t len);

/* A SelectRequest (takes mu; publishes). */
void kvr_intake_select(struct kvr_rd *rd, const char *reply, const void *data, size_t len);

/* A CancelRequest (takes mu; publishes). */
void kvr_intake_cancel(struct kvr_rd *rd, const void *data, size_t len);

/* Under mu, from the timer: drop the bookings whose TTL passed at now. */
void kvr_intake_expire_bookings(struct kvr_rd *rd, uint64_t now);

#endif
