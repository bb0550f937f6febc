/*
 * The simulated worker's NATS link: two connections (NATS-NOTES.md: heavy traffic in and out on
 * one connection locked it up). The outgoing one publishes the tokens, events and heartbeats and
 * receives the forwards and rebinds, since a server that lets workers answer clients by response
 * permission only (allow_responses) grants it to the connection that received the client's reply
 * subject; the other takes cancels, hellos, its own heartbeat subject (the id clash) and $SRV as
 * service "kvworker" (its generate endpoint's requests, errors by code and the worker's counters).
 * It runs the engine and heartbeat threads, and the drain. Before it takes a single request it
 * asks its hello subject whether another process has its id. The outgoing connection tells the
 * worker when it is cut and when it is back (the rebind asks and the streams' repeat). With
 * --metrics-addr it also runs the operators' HTTP server (src/net/httpd.h) from before it connects
 * until it closes: /metrics (the worker's families, metrics.h, then kvworker_ready, its NATS
 * connections' reconnects and dropped messages, process_*), /healthz, and /readyz (both
 * connections up, then kvr_wk_ready). The only part of the worker that includes <nats.h>.
 */
#ifndef KVR_WK_LINK_H
#define KVR_WK_LINK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include <nats/nats.h>

#include "httpd.h"
#include "service.h"
#include "util.h"
#include "worker.h"

#define KVR_WK_HELLO_TIMEOUT_MS 250 /* start-up: how long an answer to the hello may take */
/* The routers' ask that every worker announce itself (a router that starts, or whose events
 * connection comes back): answered with a heartbeat, at most one per this gap however often
 * asked (an ask within it is answered at its end). */
#define KVR_WK_ANNOUNCE_GAP_NS (100 * KVR_NS_PER_MS)

struct kvr_settle;

struct kvr_wk_link {
    struct kvr_worker *w;           /* borrowed; the outgoing connection's callbacks use it */
    struct kvr_service svc;         /* */
    natsConnection *nc_in, *nc_out; /* */
    natsSubscription *sub_gen, *sub_rebind, *sub_cancel, *sub_hello, *sub_hb, *sub_srv[3];
    natsSubscription *sub_announce;  /* the routers' ask to announce (kv.<ns>.worker.announce) */
    _Atomic bool announce_asked;     /* an ask came: the heartbeat thread answers it */
    _Atomic bool back;               /* a connection came back from a cut: beat once both are up */
    struct kvr_settle *settle;       /* their completions, waited for by the close */
    pthread_t engine, heartbeat;     /* */
    bool threads;                    /* started */
    char name_in[64], name_out[64];  /* connection names */
    struct kvr_conn_hooks hooks_out; /* the outgoing connection's (their ctx: this link) */
    struct kvr_conn_hooks hooks_in;  /* the incoming one's */
    struct kvr_httpd *http;          /* --metrics-addr; NULL: none */
    _Atomic bool live;               /* connections and subscriptions made: the HTTP server's
                                        threads may read them (until kvr_wk_link_close) */
};

/*
 * Start the HTTP server (--metrics-addr: KVR_ERR_IO when it cannot listen, KVR_ERR_INVALID for a
 * bad address, logged), connect, ask whether the id is free, subscribe, start the threads; w's
 * sink becomes the outgoing connection's. KVR_ERR_WORKER_ID_CLASH when another process answered for
 * the id (then nothing was subscribed). l must stay in place until kvr_wk_link_close.
 */
kvr_status kvr_wk_link_start(struct kvr_wk_link *l, struct kvr_worker *w);
/* SIGTERM: stop taking requests, finish those held (at most the drain timeout). */
void kvr_wk_link_drain(struct kvr_wk_link *l);
/* Stop the HTTP server first, then the threads; unsubscribe and wait out the handlers still
 * running (kvr_settle); then close the engine, flush, close. False when a handler still ran
 * after the wait: then nothing more was closed, and the worker must not be freed either. */
bool kvr_wk_link_close(struct kvr_wk_link *l);

#endif
