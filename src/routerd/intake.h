/*
 * Intake: the two request endpoints. kv.<ns>.generate (queue group "kvrouter"): decode, decide
 * and book in one critical section, remember the request (pending), forward it to the chosen
 * worker and gossip the decision; a resend of a request the fleet already has in flight (same
 * reply subject and id) is absorbed. kv.<ns>.select: a decision without forwarding, booked on
 * request. Every refusal reaches the client through the endpoint's kvr_reply.
 */
#ifndef KVR_RD_INTAKE_H
#define KVR_RD_INTAKE_H

#include <stddef.h>

#include "state.h"

/* A GenerateRequest data[0..len) with reply subject reply (may be NULL) (takes mu; publishes). */
void kvr_intake_generate(struct kvr_rd *rd, const char *reply, const void *data, size_t len);

/* A SelectRequest (takes mu; publishes). */
void kvr_intake_select(struct kvr_rd *rd, const char *reply, const void *data, size_t len);

#endif
