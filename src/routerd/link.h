/*
 * The router daemon's NATS link: its two connections (requests and forwards on one, the event
 * stream on the other: NATS-NOTES.md), every subscription from subscribe to destroy, the delivery
 * callbacks that turn a natsMsg into a call of a handler module (intake, events, fleet, sync,
 * api), the sink that publishes the outbox, and the timer thread. The only part of the router
 * daemon that includes <nats.h>; natsStatus becomes kvr_status here (kvr_nats_status).
 *
 * Both connections are read by one loop thread of the link's own (loop.h), which takes the
 * messages of the two hot subscriptions right after each read: the client's generates and the
 * workers' events. So a routed request's messages run on one thread, with no hand-off, and
 * often in one wake-up. A round reads at most KVR_LOOP_READS_MAX buffers per connection, then
 * handles them, so a burst of KV events holds a generate up for that much at most. How far the
 * events are applied is the loop's to say
 * (kvr_loop_heard). The other subscriptions (select, cancel, digest, $SRV; gossip and the
 * catch-up) keep nats.c's delivery threads.
 */
#ifndef KVR_RD_LINK_H
#define KVR_RD_LINK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include <nats/nats.h>

#include "loop.h"
#include "prom.h"
#include "service.h"
#include "backlog.h"
#include "state.h"

#define KVR_LINK_DEAD_MAX   1024       /* handled messages the loop destroys at once */
#define KVR_LINK_DEAD_BYTES (1u << 20) /* or sooner, once they hold this much payload */

struct kvr_settle;

struct kvr_link {
    struct kvr_rd *rd;              /* borrowed */
    struct kvr_service svc;         /* the $SRV description */
    natsConnection *nc_req, *nc_ev; /* */
    struct kvr_loop loop; /* reads both, takes the generates (sub_gen) and events (sub_ev) */
    _Atomic(natsSubscription *) gen_taken; /* sub_gen, once the loop thread may take from it */
    _Atomic(natsSubscription *) ev_taken;  /* sub_ev, the same */
    natsMsg *dead[KVR_LINK_DEAD_MAX];      /* the loop's messages handled, to destroy (link.c) */
    uint32_t ndead;                        /* */
    size_t dead_bytes;                     /* their payloads' bytes */
    uint64_t dead_since;                   /* when the first of them was handled */
    natsSubscription *sub_ev, *sub_gossip, *sub_pages, *sub_sync, *sub_lookup, *sub_digest;
    natsSubscription *sub_gen, *sub_sel, *sub_cancel, *sub_srv[3], *sub_stall;
    struct kvr_settle *settle; /* the asynchronous ones' completions, waited for by the close */
    struct kvr_backlog gossip_backlog; /* how far behind on_gossip runs (sub_gossip) */
    natsStatistics *stats;             /* timer thread only */
    uint64_t reconnects;               /* of the events connection, as last seen (timer thread) */
    pthread_t timer;                   /* */
    bool timer_running;                /* */
    volatile bool stopping;            /* under rd->mu */
    _Atomic bool live;                 /* connections and subscriptions made (metrics may read) */
    char name_req[300], name_ev[300];  /* connection names */
};

/* Connect both connections (retrying until the server answers); rd->sink becomes nc_req's. */
kvr_status kvr_link_connect(struct kvr_link *l, struct kvr_rd *rd);
/* Subscribe to the event stream and the replication subjects (before the warm-up), then ask every
 * worker to announce itself (kvr_timer_announce). */
kvr_status kvr_link_listen(struct kvr_link *l);
/* Join the request queue group and answer $SRV (after the warm-up and the snapshot). */
kvr_status kvr_link_serve(struct kvr_link *l);
/* Start and stop the timer thread. */
kvr_status kvr_link_start_timer(struct kvr_link *l);
void kvr_link_stop_timer(struct kvr_link *l);
/* Drain the request subscriptions (the queue group's other members take new requests). */
void kvr_link_drain_requests(struct kvr_link *l, int timeout_ms);
/* The connections' figures (reconnects, messages dropped as a slow consumer) into p. */
void kvr_link_metrics(struct kvr_link *l, struct kvr_prom *p);
/* Flush what is buffered, unsubscribe, wait out the handlers still running (kvr_settle), close
 * everything. False when a handler still ran after the wait: then nothing more was closed, and
 * what the handlers read must not be freed either. */
bool kvr_link_close(struct kvr_link *l);

#endif
