/*
 * The simulated worker's NATS link: two connections (requests in; tokens, events and heartbeats
 * out: NATS-NOTES.md), the request subscription, the $SRV service "kvworker" (its generate
 * endpoint's requests and errors by code), the engine and heartbeat threads, and the drain. The
 * only part of the worker that includes <nats.h>.
 */
#ifndef KVR_WK_LINK_H
#define KVR_WK_LINK_H

#include <pthread.h>
#include <stdbool.h>

#include <nats/nats.h>

#include "service.h"
#include "worker.h"

struct kvr_wk_link {
    struct kvr_worker *w;           /* borrowed */
    struct kvr_service svc;         /* */
    natsConnection *nc_in, *nc_out; /* */
    natsSubscription *sub, *sub_srv[3];
    pthread_t engine, heartbeat;    /* */
    bool threads;                   /* started */
    char name_in[64], name_out[64]; /* connection names (they outlive the connections) */
};

/* Connect, subscribe, start the threads; w's sink becomes the outgoing connection's. */
kvr_status kvr_wk_link_start(struct kvr_wk_link *l, struct kvr_worker *w);
/* SIGTERM: stop taking requests, finish those held (at most the drain timeout). */
void kvr_wk_link_drain(struct kvr_wk_link *l);
/* Stop the threads, flush, close. */
void kvr_wk_link_close(struct kvr_wk_link *l);

#endif
