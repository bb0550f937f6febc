/*
 * kvr_loop: a thread that reads NATS connections' sockets itself and handles what it read, so a
 * message goes from the socket to its handler on one thread.
 *
 * By default nats.c reads each connection on a reader thread and hands every message to its
 * subscription's delivery thread, waking it through a condition variable: a context switch or
 * two per message, which on a router's hot path (the client's generate) cost more than routing
 * it (docs/benchmarks.md, "The floor under it"). nats.c can instead be driven by an external
 * event loop (natsOptions_SetEventLoop, here on libevent): the loop thread reads the socket, and a
 * synchronous subscription's messages wait in its queue, with no thread to wake, until the loop
 * thread takes them right after the read (`after`). Asynchronous subscriptions on the same
 * connection keep their delivery threads.
 *
 * The adapter is ours, not nats.c's libevent.h: there, the read callback runs nats.c's read inside
 * libevent's callback, which takes the connection's lock, while a reconnect frees that event
 * under the same lock, and libevent's event_free waits for a running callback: a reconnect can
 * deadlock (the likely cause of a router that went silent after its server node restarted,
 * once in CI). Here libevent's callbacks only note that a socket is ready; the loop thread reads
 * and writes after the round, outside them.
 *
 * What waits for the loop waits in the sockets, not in a queue nats.c counts, so the loop says
 * itself how far it has come: each round reads the sockets until they are empty (nats.c reads
 * one buffer per read event), then handles what it read, so every message that had reached them
 * when the round began is handled (kvr_loop_heard). A loop further behind than
 * KVR_LOOP_READS_MAX buffers stops advancing that time; an idle one advances it every tick.
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
#include <stdint.h>

#include <nats/nats.h>

#include "kvr/status.h"

#define KVR_LOOP_CONNS     2  /* connections one loop reads at most */
#define KVR_LOOP_READS_MAX 16 /* buffers read from one connection in a round, at most */

struct kvr_loop {
    struct event_base *base; /* owned */
    struct event *tick;      /* a persistent timer: the loop never sleeps longer than one */
    pthread_t thread;        /* */
    bool running;            /* the thread was started (and not yet joined) */
    _Atomic bool stop;       /* */
    struct kvr_loop_conn {
        struct kvr_loop *lp;             /* */
        _Atomic(natsConnection *) nc;    /* attached to the loop (NULL: a free slot) */
        _Atomic int fd;                  /* its socket while nats.c polls it; -1: none */
        struct event *read, *write;      /* on fd (replaced on a reconnect) */
        _Atomic bool readable, writable; /* what libevent saw this round */
    } conn[KVR_LOOP_CONNS];
    pthread_mutex_t attach_mu; /* attaches of different connections can overlap */
    _Atomic uint64_t heard_ns; /* every message that reached the socket by then is handled */
    void (*after)(void *ctx);  /* on the loop thread, after each round of events */
    void *ctx;                 /* */
};

/* Create the loop and start its thread, which wakes at least every tick_ns; after(ctx) runs
 * after each round of events. At most KVR_LOOP_CONNS connections may be attached to it. */
kvr_status kvr_loop_start(struct kvr_loop *lp, uint64_t tick_ns, void (*after)(void *ctx),
                          void *ctx);
/* Up to when every message that reached its connections is handled (monotonic ns; any thread). */
uint64_t kvr_loop_heard(const struct kvr_loop *lp);
/* Run after(ctx) soon on the loop thread (from any thread): a subscription was just made. */
void kvr_loop_wake(struct kvr_loop *lp);
/* Stop and join the thread (from any other thread); nothing is read meanwhile. */
void kvr_loop_stop(struct kvr_loop *lp);
/* Free the loop, once every connection attached to it is destroyed. */
void kvr_loop_free(struct kvr_loop *lp);

/* util.c's connect: hand the connection to lp (NULL: nats.c's own reader thread). */
natsStatus kvr__loop_options(natsOptions *o, struct kvr_loop *lp);

#endif
