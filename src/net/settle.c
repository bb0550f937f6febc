/*
 * kvr_settle implementation. Invariant: open counts the tracked subscriptions whose completion
 * has not come; once abandoned is set (the waiter gave up), the completion that brings open to 0
 * frees the record, and nothing else touches it.
 */
#include "settle.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "clock.h"
#include "log.h"
#include "util.h"

struct kvr_settle {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled when open reaches 0 */
    uint32_t open;     /* tracked subscriptions not complete yet */
    bool abandoned;    /* the waiter gave up: the last completion frees */
};

static void settle_free(struct kvr_settle *s)
{
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

struct kvr_settle *kvr_settle_new(void)
{
    struct kvr_settle *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    pthread_mutex_init(&s->mu, NULL);
    kvr_cond_init_monotonic(&s->cv);
    return s;
}

/* nats.c's completion callback: the subscription's handler will not run again. */
static void on_complete(void *closure)
{
    struct kvr_settle *s = closure;
    pthread_mutex_lock(&s->mu);
    bool last = --s->open == 0;
    bool gone = last && s->abandoned;
    if (last)
        pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (gone)
        settle_free(s);
}

kvr_status kvr_settle_track(struct kvr_settle *s, natsSubscription *sub)
{
    pthread_mutex_lock(&s->mu);
    s->open++; /* before nats.c can call on_complete */
    pthread_mutex_unlock(&s->mu);
    natsStatus st = natsSubscription_SetOnCompleteCB(sub, on_complete, s);
    if (st != NATS_OK) {
        pthread_mutex_lock(&s->mu);
        s->open--; /* never to complete through us */
        pthread_mutex_unlock(&s->mu);
    }
    return kvr_nats_status(st);
}

bool kvr_settle_wait_free(struct kvr_settle *s, int timeout_ms)
{
    if (!s)
        return true;
    struct timespec until = kvr_deadline_ms(timeout_ms > 0 ? (uint32_t)timeout_ms : 0);
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    while (s->open && rc == 0)
        rc = pthread_cond_timedwait(&s->cv, &s->mu, &until);
    bool settled = s->open == 0;
    s->abandoned = !settled;
    pthread_mutex_unlock(&s->mu);
    if (settled)
        settle_free(s);
    return settled;
}

natsStatus kvr_settle_subscribe(struct kvr_settle *s, natsSubscription **sub, natsConnection *nc,
                                const char *subject, const char *queue, natsMsgHandler cb,
                                void *closure)
{
    natsStatus st = queue ? natsConnection_QueueSubscribe(sub, nc, subject, queue, cb, closure)
                          : natsConnection_Subscribe(sub, nc, subject, cb, closure);
    if (st == NATS_OK && kvr_settle_track(s, *sub) != KVR_OK)
        st = NATS_ERR;
    return st;
}

bool kvr_settle_close(struct kvr_settle *s, natsSubscription *const *subs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (subs[i])
            natsSubscription_Unsubscribe(subs[i]);
    if (kvr_settle_wait_free(s, KVR_SETTLE_MS))
        return true;
    /* one still runs: freeing what it reads would be worse than leaving it all to the exit */
    kvr_log(KVR_LOG_WARN, "handlers_still_running", "waited_ms=%d action=leave_unfreed",
            KVR_SETTLE_MS);
    return false;
}
