/*
 * kvr_settle: waiting out the message handlers of a link's asynchronous subscriptions before the
 * state they read is freed.
 *
 * nats.c delivers an asynchronous subscription's messages on a detached thread of its own, and
 * natsSubscription_Unsubscribe does not wait for a handler that is running: a handler can still
 * run, or start one last time, after the unsubscribe returns, and would then read a freed link,
 * worker or router. nats.c calls a subscription's completion callback
 * (natsSubscription_SetOnCompleteCB) once its handler has returned for the last time, after an
 * unsubscribe, a drain or the connection's close. A link tracks each of its asynchronous
 * subscriptions here as it makes it, and its teardown unsubscribes them all and waits for every
 * completion before it destroys its connections and frees what the handlers read.
 *
 * The record is on the heap: when the wait gives up (a handler stuck past the timeout) it is left
 * to the last completion to free, so a late one never touches freed memory. Thread-safe.
 */
#ifndef KVR_SETTLE_H
#define KVR_SETTLE_H

#include <nats/nats.h>
#include <stdbool.h>

#include "kvr/status.h"

struct kvr_settle;

/* A new record, no subscription tracked; NULL when out of memory. */
struct kvr_settle *kvr_settle_new(void);

/* Track sub (asynchronous, just made, not closed): its completion is waited for. */
kvr_status kvr_settle_track(struct kvr_settle *s, natsSubscription *sub);

/* Subscribe cb (closure) to subject on nc, in queue group queue unless NULL, and track it. */
natsStatus kvr_settle_subscribe(struct kvr_settle *s, natsSubscription **sub, natsConnection *nc,
                                const char *subject, const char *queue, natsMsgHandler cb,
                                void *closure);

/*
 * A link's close: unsubscribe subs[0..n) (NULL ones skipped), wait KVR_SETTLE_MS for their
 * handlers (kvr_settle_wait_free). False, logged as handlers_still_running, when one still runs:
 * then nothing it reads may be freed, nor the connections destroyed.
 */
#define KVR_SETTLE_MS 2000
bool kvr_settle_close(struct kvr_settle *s, natsSubscription *const *subs, size_t n);

/*
 * Wait up to timeout_ms for the completion of every tracked subscription (the caller has
 * unsubscribed them), then free s. Returns false when time ran out: s is then freed by the last
 * completion. NULL is a no-op (true).
 */
bool kvr_settle_wait_free(struct kvr_settle *s, int timeout_ms);

#endif
