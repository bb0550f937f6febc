/*
 * kvr_loop: a thread that reads a NATS connection's socket itself and handles what it read, so a
 * message goes from the socket to its handler on one thread.
 *
 * By default nats.c reads each connection on a reader thread and hands every message to its
 * subscription's delivery thread, waking it through a condition variable: a context switch or
 * two per message, which on a router's hot path (the client's generate) cost more than routing
 * it (docs/benchmarks.md, "The floor under it"). nats.c can instead be driven by an external
 * event loop (natsOptions_SetEventLoop; here libevent, through nats.c's own adapter): the loop
 * thread reads the socket, and a synchronous subscription's messages wait in its queue, with no
 * thread to wake, until the loop thread takes them right after the read (`after`). Asynchronous
 * subscriptions on the same connection keep their delivery threads.
 *
 * Rules of this mode: nothing that waits for the server (a flush, a request) may run on the loop
 * thread, which is the one that would read the answer; the loop thread runs from before the
 * connection is made (kvr_connect_loop, util.h) until kvr_loop_stop, and the connection is
 * destroyed after it stops and before kvr_loop_free.
 */
#ifndef KVR_LOOP_H
#define KVR_LOOP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include <nats/nats.h>

#include "kvr/status.h"

#define KVR_LOOP_TICK_MS 100 /* the loop thread looks at `stop` at least this often */

struct kvr_loop {
    struct event_base *base;  /* owned */
    struct event *tick;       /* a persistent timer: the loop never sleeps longer than a tick */
    pthread_t thread;         /* */
    bool running;             /* the thread was started (and not yet joined) */
    _Atomic bool stop;        /* */
    void (*after)(void *ctx); /* on the loop thread, after each round of events */
    void *ctx;                /* */
};

/* Create the loop and start its thread; after(ctx) runs after each round of events. */
kvr_status kvr_loop_start(struct kvr_loop *lp, void (*after)(void *ctx), void *ctx);
/* Run after(ctx) soon on the loop thread (from any thread): a subscription was just made. */
void kvr_loop_wake(struct kvr_loop *lp);
/* Stop and join the thread (from any other thread); nothing is read meanwhile. */
void kvr_loop_stop(struct kvr_loop *lp);
/* Free the loop, once every connection attached to it is destroyed. */
void kvr_loop_free(struct kvr_loop *lp);

/* util.c's connect: hand the connection to lp (NULL: nats.c's own reader thread). */
natsStatus kvr__loop_options(natsOptions *o, struct kvr_loop *lp);

#endif
