/*
 * kvr_loop: libevent's loop on a thread of its own, with nats.c's libevent adapter (the header
 * defines the adapter's functions, so this is the only file that includes it).
 */
#include "loop.h"

#include <stdlib.h>
#include <string.h>

#include <nats/adapters/libevent.h>

#include "log.h"

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

static void *loop_main(void *arg)
{
    struct kvr_loop *lp = arg;
    while (!atomic_load_explicit(&lp->stop, memory_order_acquire)) {
        event_base_loop(lp->base, EVLOOP_ONCE);
        lp->after(lp->ctx);
    }
    nats_ReleaseThreadMemory();
    return NULL;
}

kvr_status kvr_loop_start(struct kvr_loop *lp, void (*after)(void *ctx), void *ctx)
{
    memset(lp, 0, sizeof *lp);
    pthread_once(&threads_once, use_threads);
    lp->after = after;
    lp->ctx = ctx;
    lp->base = event_base_new();
    if (lp->base)
        lp->tick = event_new(lp->base, -1, EV_PERSIST, on_tick, lp);
    struct timeval every = {0, KVR_LOOP_TICK_MS * 1000};
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
    if (lp->base)
        event_base_free(lp->base);
    memset(lp, 0, sizeof *lp);
}

natsStatus kvr__loop_options(natsOptions *o, struct kvr_loop *lp)
{
    if (!lp)
        return NATS_OK;
    return natsOptions_SetEventLoop(o, lp->base, natsLibevent_Attach, natsLibevent_Read,
                                    natsLibevent_Write, natsLibevent_Detach);
}
