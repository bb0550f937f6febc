/*
 * kvr_loop: libevent's loop on a thread of its own, with nats.c's libevent adapter (the header
 * defines the adapter's functions, so this is the only file that includes it).
 */
#include "loop.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include <nats/adapters/libevent.h>

#include "clock.h"

static pthread_once_t threads_once = PTHREAD_ONCE_INIT;

static void use_threads(void)
{
    natsLibevent_Init(); /* libevent's locks: nats.c attaches and writes from other threads */
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg; /* nothing to do: the round ends, `after` runs and `stop` is seen */
}

/* After a round: whether the sockets have nothing to read (poll skips those not attached yet). */
static bool drained(const struct kvr_loop *lp)
{
    struct pollfd p[KVR_LOOP_CONNS];
    for (int i = 0; i < KVR_LOOP_CONNS; i++)
        p[i] = (struct pollfd){.fd = atomic_load_explicit(&lp->fd[i], memory_order_relaxed),
                               .events = POLLIN};
    return poll(p, KVR_LOOP_CONNS, 0) == 0;
}

static void *loop_main(void *arg)
{
    struct kvr_loop *lp = arg;
    while (!atomic_load_explicit(&lp->stop, memory_order_acquire)) {
        event_base_loop(lp->base, EVLOOP_ONCE);
        lp->after(lp->ctx);
        uint64_t now = kvr_now_ns(); /* read before the socket is: what came later is not owed */
        if (drained(lp))
            atomic_store_explicit(&lp->heard_ns, now, memory_order_release);
    }
    nats_ReleaseThreadMemory();
    return NULL;
}

kvr_status kvr_loop_start(struct kvr_loop *lp, uint64_t tick_ns, void (*after)(void *ctx),
                          void *ctx)
{
    memset(lp, 0, sizeof *lp);
    pthread_once(&threads_once, use_threads);
    lp->after = after;
    lp->ctx = ctx;
    for (int i = 0; i < KVR_LOOP_CONNS; i++)
        atomic_store(&lp->fd[i], -1);
    pthread_mutex_init(&lp->attach_mu, NULL);
    atomic_store(&lp->heard_ns, kvr_now_ns());
    lp->base = event_base_new();
    if (lp->base)
        lp->tick = event_new(lp->base, -1, EV_PERSIST, on_tick, lp);
    tick_ns = tick_ns ? tick_ns : KVR_NS_PER_MS;
    struct timeval every = {(time_t)(tick_ns / KVR_NS_PER_S),
                            (suseconds_t)(tick_ns % KVR_NS_PER_S / 1000u)};
    if (!lp->tick || event_add(lp->tick, &every) != 0 ||
        pthread_create(&lp->thread, NULL, loop_main, lp)) {
        kvr_loop_free(lp);
        return KVR_ERR_NOMEM;
    }
    lp->running = true;
    return KVR_OK;
}

void kvr_loop_wake(struct kvr_loop *lp)
{
    if (lp->tick)
        event_active(lp->tick, EV_TIMEOUT, 0);
}

void kvr_loop_stop(struct kvr_loop *lp)
{
    if (!lp->running)
        return;
    atomic_store_explicit(&lp->stop, true, memory_order_release);
    kvr_loop_wake(lp);
    pthread_join(lp->thread, NULL);
    lp->running = false;
}

void kvr_loop_free(struct kvr_loop *lp)
{
    kvr_loop_stop(lp);
    if (lp->tick)
        event_free(lp->tick);
    if (lp->base) {
        event_base_free(lp->base);
        pthread_mutex_destroy(&lp->attach_mu);
    }
    memset(lp, 0, sizeof *lp);
}

uint64_t kvr_loop_heard(const struct kvr_loop *lp)
{
    return atomic_load_explicit(&lp->heard_ns, memory_order_acquire);
}

/* nats.c's attach (first connect and every reconnect, on its thread): the adapter's, with the
 * socket noted for drained(). The loop nats.c hands back is ours, so the adapter gets its base. */
static natsStatus attach(void **adapter, void *loop, natsConnection *nc, natsSock sock)
{
    struct kvr_loop *lp = loop;
    pthread_mutex_lock(&lp->attach_mu);
    int i = 0;
    while (i < KVR_LOOP_CONNS && lp->nc[i] && lp->nc[i] != nc)
        i++;
    if (i < KVR_LOOP_CONNS) { /* its slot, or the first free one */
        lp->nc[i] = nc;
        atomic_store_explicit(&lp->fd[i], (int)sock, memory_order_relaxed);
    }
    pthread_mutex_unlock(&lp->attach_mu);
    if (i == KVR_LOOP_CONNS)
        return NATS_ERR; /* more connections than a loop reads */
    return natsLibevent_Attach(adapter, lp->base, nc, sock);
}

natsStatus kvr__loop_options(natsOptions *o, struct kvr_loop *lp)
{
    if (!lp)
        return NATS_OK;
    return natsOptions_SetEventLoop(o, lp, attach, natsLibevent_Read, natsLibevent_Write,
                                    natsLibevent_Detach);
}
