/*
 * kvr_outbox: messages prepared while a lock is held and published after it is released, in the
 * order they were added, so state changes stay atomic without holding a lock across I/O. Each
 * outbox belongs to one thread at a time (fill it under the state lock, swap it out, publish).
 * Publishing goes through a kvr_sink: NATS in the daemons (src/net), a recorder in unit tests and
 * fuzz targets, so the state machines above it never see the transport.
 */
#ifndef KVR_OUTBOX_H
#define KVR_OUTBOX_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr/status.h"

struct kvr_outmsg {
    char *subject;  /* in data's allocation */
    char *reply;    /* in data's allocation; NULL when none */
    uint8_t *data;  /* owned: one allocation holds the data, then subject and reply */
    size_t len;     /* */
    kvr_status err; /* published with the service error headers when not KVR_OK */
    uint64_t tag;   /* the sender's name for it (0: none): a failed publish is reported by it */
};

/* Where messages go: publish m (borrowed for the call); KVR_OK or why not. Every flush through
 * it counts the publishes that failed in failed (a connection cut past nats.c's reconnect
 * buffer, a payload over the server's limit, a closed connection): an operators' counter. */
struct kvr_sink {
    kvr_status (*publish)(void *ctx, const struct kvr_outmsg *m);
    void *ctx;
    _Atomic uint64_t failed; /* publishes that failed, whoever flushed */
};

struct kvr_outbox {
    struct kvr_outmsg *v; /* owned */
    uint32_t n, cap;      /* */
    uint64_t dropped;     /* messages lost to allocation failures (never silently) */
};

/* Queue a copy of subject and data (a NULL or empty subject adds nothing). */
void kvr_outbox_add(struct kvr_outbox *o, const char *subject, const void *data, size_t len,
                    kvr_status err);

/* The same, published with a reply subject (a forwarded request, a question). */
void kvr_outbox_add_request(struct kvr_outbox *o, const char *subject, const char *reply,
                            const void *data, size_t len);

/* The same, tagged: if publishing it fails, kvr_outbox_send_report names it by tag (not 0). */
void kvr_outbox_add_tagged(struct kvr_outbox *o, const char *subject, const char *reply,
                           const void *data, size_t len, uint64_t tag);

/* A tagged message that could not be published, and why. */
struct kvr_outbox_failure {
    uint64_t tag;
    kvr_status st;
};

/* The tagged messages of a flush that failed, every one (grown as they come). */
struct kvr_outbox_failures {
    struct kvr_outbox_failure *v; /* owned (kvr_outbox_failures_free) */
    uint32_t n, cap;              /* */
    uint64_t lost;                /* tagged failures not kept: memory ran short (counted in the
                                     sink's failed as well) */
};

void kvr_outbox_failures_free(struct kvr_outbox_failures *f);

/*
 * Publish everything through sink, in order, and empty the outbox; returns how many failed (also
 * added to sink->failed). The tagged failures are appended to failures (may be NULL).
 */
uint32_t kvr_outbox_flush(struct kvr_outbox *o, struct kvr_sink *sink,
                          struct kvr_outbox_failures *failures);

/*
 * Take what o holds under mu (o is filled under it), then publish it through sink after mu is
 * released: the one way the daemons publish their state machines' messages.
 */
void kvr_outbox_send(struct kvr_outbox *o, pthread_mutex_t *mu, struct kvr_sink *sink);

/* kvr_outbox_send that also appends the tagged messages that failed to failures; returns how
 * many publishes failed. */
uint32_t kvr_outbox_send_report(struct kvr_outbox *o, pthread_mutex_t *mu, struct kvr_sink *sink,
                                struct kvr_outbox_failures *failures);

/* Exchange the queued messages (to publish outside a lock); each keeps its dropped count. */
void kvr_outbox_swap(struct kvr_outbox *a, struct kvr_outbox *b);

void kvr_outbox_free(struct kvr_outbox *o);

/*
 * Publishing turns: batches taken from one state machine's outbox under its mutex go out in the
 * order they were taken, though each thread publishes its own after the mutex (no lock is held
 * across I/O; a thread waits only for the batches taken before its own). Without them two
 * threads that unlock one after the other can publish in either order: a worker's repeat for a
 * resend after its later chunks, a router's forward after its cancel, or its gossip decisions out
 * of sequence.
 */
struct kvr_turns {
    pthread_mutex_t mu; /* */
    pthread_cond_t cv;  /* */
    uint64_t next;      /* the next batch's turn (under the state machine's mutex) */
    uint64_t now;       /* the turn publishing now (under mu) */
};

void kvr_turns_init(struct kvr_turns *t);
void kvr_turns_destroy(struct kvr_turns *t);

/* Under the state machine's mutex, for a batch just taken from its outbox: the batch's turn.
 * Every turn taken must be published (kvr_turns_flush), or the later ones wait for good. */
static inline uint64_t kvr_turns_take(struct kvr_turns *t)
{
    return t->next++;
}

/* After the state machine's mutex: wait for turn, kvr_outbox_flush o, pass the turn on. */
uint32_t kvr_turns_flush(struct kvr_turns *t, uint64_t turn, struct kvr_outbox *o,
                         struct kvr_sink *sink, struct kvr_outbox_failures *failures);

#endif
