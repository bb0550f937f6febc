/*
 * kvr_client: kvbench's side of the wire. It sends requests (request i's replies come to
 * "<inbox>.<i>") and records, per request, when it was sent, its first and last chunk, its tokens,
 * which worker served it and how it ended, plus every inter-token gap of the batch. In closed
 * loop each final answer sends the next unsent request.
 *
 * Threads: the owner's thread sends and waits; nats.c's delivery thread runs the chunk callback,
 * which records under mu and, in closed loop, sends. Everything the callback writes (the records,
 * the counters, the gaps) is under mu; the encoder and its buffer are under send_mu, taken before
 * mu when both are. Invariant: ndone counts the final answers recorded since kvr_client_begin
 * (each request's first; a record started afresh by kvr_client_publish may count again), so in
 * a batch where every request is sent once, ndone == n means every request is done.
 */
#ifndef KVR_CLIENT_H
#define KVR_CLIENT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "buf.h"
#include "util.h"

/* One request as the client saw it. Times are kvr_now_ns() values. */
struct kvr_client_req {
    uint64_t t_send, t_first, t_last; /* sent; first and last chunk with tokens */
    uint32_t ntok;                    /* tokens received */
    uint32_t cached;                  /* prompt tokens the worker had cached */
    uint64_t worker;                  /* who served it; 0: not said */
    uint32_t error;                   /* the final answer's kvr_status; 0: none */
    uint64_t t_resent;                /* last resend; 0: none */
    uint32_t resends;                 /* */
    bool sent, heard, done;           /* heard: some chunk came; done: the final one */
};

/*
 * Request i's bytes into out, called with send_mu held on whichever thread sends (so the
 * encoder may use scratch memory of its own); false: nothing is sent.
 */
typedef bool (*kvr_client_encode_fn)(void *ctx, uint32_t i, struct kvr_buf *out);

struct kvr_client {
    natsConnection *nc_pub;      /* requests go out here */
    natsConnection *nc_sub;      /* the inbox subscription's connection */
    natsSubscription *sub;       /* <inbox>.* */
    char inbox[128];             /* unique to this client */
    char subj_gen[256];          /* the routers' generate subject */
    pthread_mutex_t send_mu;     /* the encoder and buf */
    struct kvr_buf buf;          /* under send_mu */
    kvr_client_encode_fn encode; /* set by kvr_client_begin, may be NULL */
    void *encode_ctx;            /* */
    pthread_mutex_t mu;          /* what follows */
    pthread_cond_t cv;           /* signalled on every final answer */
    struct kvr_client_req *reqs; /* n records */
    uint32_t n, cap;             /* records in use, allocated */
    uint32_t next;               /* closed loop: the next request to send */
    uint32_t ndone;              /* records done */
    bool closed;                 /* closed loop */
    double *gaps;                /* every inter-token gap of the batch, ms */
    uint32_t ngaps, capgaps;     /* */
    uint64_t gaps_dropped;       /* gaps not recorded: memory was short */
};

/*
 * Connect to urls (comma-separated) and subscribe to a new inbox; requests go to
 * <prefix>.<ns>.generate. NULL on failure, with *st saying why. Strings are copied.
 */
struct kvr_client *kvr_client_create(const char *urls, const char *prefix, const char *ns,
                                     kvr_status *st);
/* Unsubscribe, close the connections, free everything; c may be NULL. */
void kvr_client_destroy(struct kvr_client *c);
/* Release nats.c's library state: after the last client is destroyed. */
void kvr_client_shutdown(void);
/*
 * Drain and destroy an asynchronous subscription of this module's callers (NULL: nothing): when
 * it returns, its callback is not running and will not run again (within a second's drain; past
 * it the subscription is closed with what it still held).
 */
void kvr_client_unsubscribe(natsSubscription *sub);

/*
 * Start a batch of n requests with cleared records: closed loop or not, the encoder that
 * kvr_client_send and resends use (ctx borrowed until the next begin), and room for about
 * gaps_hint gaps (more grow). KVR_ERR_NOMEM leaves the client with no records.
 */
kvr_status kvr_client_begin(struct kvr_client *c, uint32_t n, bool closed,
                            kvr_client_encode_fn encode, void *ctx, uint64_t gaps_hint);
/*
 * End the batch: the encoder is dropped (so its context may change or go) and later answers are
 * ignored. Read the records before.
 */
void kvr_client_end(struct kvr_client *c);
/* Encode request i and send it to the routers. */
void kvr_client_send(struct kvr_client *c, uint32_t i);
/* Closed loop: send the first `clients` requests (at most n); completions send the rest. */
void kvr_client_start_closed(struct kvr_client *c, uint32_t clients);
/* Send data to subject as request i: its record starts afresh (sent now). */
void kvr_client_publish(struct kvr_client *c, uint32_t i, const char *subject, const void *data,
                        size_t len);
/*
 * Wait until every request is done or deadline_ns passes; a sent request that heard nothing for
 * resend_ns (0: never) is sent again, at most 3 times, as a fleet's client should. Returns the
 * resends made.
 */
uint32_t kvr_client_wait_all(struct kvr_client *c, uint64_t deadline_ns, uint64_t resend_ns);
/* Wait until request i is done or deadline_ns passes; its round trip in ns, 0 if it failed. */
uint64_t kvr_client_wait_one(struct kvr_client *c, uint32_t i, uint64_t deadline_ns);
/* Requests done so far. */
uint32_t kvr_client_done(struct kvr_client *c);

#endif
