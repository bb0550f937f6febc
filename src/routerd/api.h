/*
 * The router's operator API: the NATS service API as service "kvrouter" ($SRV.PING, INFO, STATS:
 * per endpoint the requests, errors by code and processing time; in the generate endpoint's data
 * the core's figures and the replication counters with the state digest), and
 * kv.<ns>.router.digest, which every router answers with its id, digest and replication counters.
 * Answers are built under the state mutex and published after it.
 */
#ifndef KVR_RD_API_H
#define KVR_RD_API_H

#include "service.h"
#include "state.h"

#define KVR_RD_SERVICE_NAME    "kvrouter"
#define KVR_RD_SERVICE_VERSION "0.2.0"

/* The service description of rd (endpoints: generate, select), into s. */
void kvr_api_init(struct kvr_service *s, struct kvr_rd *rd);

/* A message on one of the $SRV subjects (takes mu; publishes the answer to reply). */
void kvr_api_on_srv(struct kvr_rd *rd, const struct kvr_service *s, const char *subject,
                    const char *reply);

/* A message on kv.<ns>.router.digest (takes mu; publishes the answer to reply). */
void kvr_api_on_digest(struct kvr_rd *rd, const char *reply);

#endif
