/*
 * The NATS glue the three NATS programs share: subject names, connections set up the way
 * NATS-NOTES.md says (SendAsap, reconnect forever, named), publishing with the NATS service error
 * headers, and the one conversion of natsStatus into kvr_status. Thread-safe.
 */
#ifndef KVR_UTIL_H
#define KVR_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nats/nats.h>

#include "clock.h"
#include "kvr/status.h"
#include "log.h"
#include "natscfg.h"
#include "outbox.h"
#include "subject.h"

/*
 * The one place a natsStatus becomes a kvr_status (nothing above the NATS glue sees natsStatus):
 * out of memory, timeouts, bad arguments and oversized payloads keep their meaning; every other
 * failure of the connection is KVR_ERR_IO.
 */
kvr_status kvr_nats_status(natsStatus s);

/*
 * The daemons' subscriptions hold any number of messages but at most this many bytes waiting for
 * their handler (nats.c drops past it, as a slow consumer, counted): their traffic is anyone's to
 * publish, and an unbounded queue let a flood of large forwards or requests grow a process until
 * it ran out of memory.
 */
#define KVR_PENDING_BYTES (512 << 20)

/* sub's pending limits: KVR_PENDING_BYTES, and no bound on the number of messages. */
natsStatus kvr_pending_bound(natsSubscription *sub);

/* --- connections ----------------------------------------------------------------------------- */

/*
 * Connect to c->urls (comma-separated, tried in order: the first is the preferred node) as name,
 * with c's credentials and TLS: SendAsap, reconnect forever every 250 ms (with jitter), and log
 * disconnects and reconnects. The first connect is retried every 250 ms for at most
 * c->connect_timeout_ns (0: until a stop signal): each failed attempt is logged at warn with
 * nats.c's reason, a stop signal (kvr_signals_catch) ends the wait with KVR_ERR_SHUTDOWN, the
 * timeout with the last failure's status. URLs are logged with their user:password part
 * redacted. c and name are read during the call only (the name is copied, up to 319 bytes).
 * Destroy the connection with kvr_conn_destroy.
 */
kvr_status kvr_connect(const struct kvr_nats_config *c, const char *name, natsConnection **out);

/*
 * Close and destroy a connection made by kvr_connect*: returns once nats.c's last callback of it
 * has run (its closed callback; up to 2 s, then logged as nats_close_unconfirmed), so no hook of it
 * runs after this returns. NULL is ignored; a connection made otherwise is only destroyed.
 */
void kvr_conn_destroy(natsConnection *nc);

/* What a connection's owner wants to hear besides the logs: its connection was cut (not closed
 * by its owner), and it is back. Called on nats.c's callback thread. */
struct kvr_conn_hooks {
    const char *name;        /* the connection's name */
    void (*cut)(void *ctx);  /* may be NULL */
    void (*back)(void *ctx); /* may be NULL */
    void *ctx;               /* */
};

/* kvr_connect as h->name, calling h's hooks too; h is copied, and its ctx must stay valid until
 * kvr_conn_destroy of the connection returns. */
kvr_status kvr_connect_hooked(const struct kvr_nats_config *c, const struct kvr_conn_hooks *h,
                              natsConnection **out);

/* kvr_connect, with the connection read by lp's thread (loop.h) instead of nats.c's reader. */
struct kvr_loop;
kvr_status kvr_connect_loop(const struct kvr_nats_config *c, const char *name, struct kvr_loop *lp,
                            natsConnection **out);

/*
 * Publish data to subject; when err is not KVR_OK, add the NATS service error headers
 * (Nats-Service-Error, Nats-Service-Error-Code). subject may be NULL (nothing is sent).
 */
kvr_status kvr_publish(natsConnection *nc, const char *subject, const void *data, size_t len,
                       kvr_status err);

/* At exit, after every connection is destroyed: release the NATS library and wait (up to 5 s)
 * for its threads to end. nats_Close alone returns with them still running; one that ends
 * while exit() runs the atexit handlers locks a freed mutex (a SIGSEGV seen at exit). */
void kvr_net_shutdown(void);

/* Flush nc, so the subscriptions just made are on the server before the caller goes on. NATS_OK
 * too when the connection is cut meanwhile but reconnecting (logged): the library makes every
 * subscription again on the reconnect, so a server that goes while a process starts does not stop
 * it. */
natsStatus kvr_flush_subscribed(natsConnection *nc);

/* Reconnects of nc so far (0 for NULL). */
uint64_t kvr_nats_reconnects(natsConnection *nc);
/* Messages the library dropped over subs[0..n) (NULL entries skipped): slow consumers. */
uint64_t kvr_nats_dropped(natsSubscription *const *subs, size_t n);

/* The sink that publishes on nc (with the service error headers where m->err is set). */
struct kvr_sink kvr_nats_sink(natsConnection *nc);

#endif
