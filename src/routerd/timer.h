/*
 * The router's housekeeping, every tick (--tick-ms): the core's timeouts and queue, requests to
 * place again, replication's hellos, orphans and resync timeouts, and catching up after the
 * events connection was cut (core NATS drops what a router misses meanwhile: once its
 * subscriptions have had time to reach the whole cluster again, it takes a snapshot from a peer),
 * and likewise after the router itself was stopped for a while (a tick far later than due).
 * Called by the timer thread (link.c) with what it saw of the events connection.
 */
#ifndef KVR_RD_TIMER_H
#define KVR_RD_TIMER_H

#include <stdbool.h>
#include <stdint.h>

#include "state.h"

#define KVR_TIMER_CATCH_UP_NS    250000000ull /* interest propagation across a cluster, a margin */
#define KVR_TIMER_CATCH_UP_TRIES 40u          /* with no peer to ask, tried again for 10 s */
#define KVR_TIMER_KV_RESYNC_NS                                                                     \
    10000000000ull /* catch-ups for missed KV events: at most one per 10 s */
/* A tick this late after the one before: the router itself was stopped (SIGSTOP, a frozen VM,
 * starved of CPU), so the workers' silence meanwhile was its own. */
#define KVR_TIMER_STALL_NS 1000000000ull

/* The handlers' queues fall this far behind: logged (events_behind, then events_caught_up once
 * less than half of it). */
#define KVR_TIMER_BEHIND_NS 1000000000ull
/* Judged at most this far behind the clock: a handler stuck for good does not keep a dead worker
 * forever (its detection is late by this much at most). */
#define KVR_TIMER_BEHIND_MAX_NS 30000000000ull

/* A router asks every worker to announce itself (kv.<ns>.worker.announce) when it starts and when
 * its events connection comes back: this many times, this far apart (the second reaches the
 * workers on other nodes of a cluster once its interest in their events has spread). */
#define KVR_TIMER_ANNOUNCES       2u
#define KVR_TIMER_ANNOUNCE_GAP_NS 1000000000ull

/* Under mu: ask every worker to announce itself now, and once more KVR_TIMER_ANNOUNCE_GAP_NS later
 * (the timer sends that one); published at the next flush. */
void kvr_timer_announce(struct kvr_rd *rd, uint64_t now);

/* What the timer thread saw at a tick. */
struct kvr_timer_seen {
    bool events_up;        /* the events connection is connected */
    bool events_cut;       /* it reconnected since the last tick */
    uint64_t events_heard; /* the worker events received by then are applied (0: by now) */
    uint64_t gossip_heard; /* the same for the peers' gossip (backlog.h) */
};

/* One tick at now. Takes mu; publishes. */
void kvr_timer_tick_seen(struct kvr_rd *rd, uint64_t now, const struct kvr_timer_seen *seen);
/* The same with both queues caught up. */
void kvr_timer_tick(struct kvr_rd *rd, uint64_t now, bool events_up, bool events_cut);

#endif
