/*
 * How far behind a subscription's handler runs (the gossip's; the worker events are read by the
 * link's loop, which says it itself: kvr_loop_heard). Core NATS queues a subscription's messages
 * for one thread, so under load a message can wait there for seconds behind a burst, and judging
 * its sender by the clock then drops one that spoke. Every tick, the timer
 * notes how many messages had reached the subscription (delivered and pending); once the handler
 * has finished that many, everything that had reached the subscription's queue by the time of the
 * note is applied: the router has heard the fleet up to then, and judges silence there (bytes
 * still in the socket or in nats.c's reader are not counted: a router starved of CPU is caught by
 * the timer's own stall check instead).
 */
#ifndef KVR_RD_BACKLOG_H
#define KVR_RD_BACKLOG_H

#include <stdint.h>

#define KVR_BACKLOG_NOTES 512 /* 10 s of 20 ms ticks; when full, new notes wait for room */

struct kvr_backlog {
    _Atomic uint64_t done; /* messages the handler finished (its thread writes) */
    struct {
        uint64_t t, received;
    } note[KVR_BACKLOG_NOTES]; /* the timer thread's, oldest first from head */
    uint32_t head, n;          /* */
    uint64_t heard;            /* every message received by then is applied (timer thread) */
};

/* Before subscribing, at now: nothing received yet, so all is applied up to now. */
void kvr_backlog_start(struct kvr_backlog *b, uint64_t now);

/* The handler finished one message (any thread, once per message, after applying it). */
void kvr_backlog_done(struct kvr_backlog *b);

/*
 * Timer thread, at now: received messages had reached the subscription (read before this call).
 * Returns the time up to which everything received is applied: now when the handler has caught
 * up, an earlier note's time while it works through a backlog (never later than now, never
 * earlier than a value returned before).
 */
uint64_t kvr_backlog_note(struct kvr_backlog *b, uint64_t now, uint64_t received);

#endif
