/*
 * kvr_client: kvbench's side of the wire. It sends requests (request i of batch b has its replies
 * come to "<inbox>.<b>.<i>", so a straggler of an earlier batch is never taken for this one's) and
 * records, per request, when it was sent, its first and last chunk, its tokens, which worker
 * served it and how it ended, plus every inter-token gap of the batch (and its request). In
 * closed loop each final answer sends the next unsent request.
 *
 * Every stream is checked against the client contract (docs/protocol.md). Tokens are kept by
 * position: a repeat adds only what it covers anew, a chunk above what is held is kept and its
 * hole waited for (a repeat fills it). A request is *decided* when its stream is complete (a
 * final chunk, and every position below its end held), or 2 s after its final chunk with
 * positions still missing (KVR_ERR_INTERRUPTED, the tokens counted as missing): that is the
 * answer a real client would take, and what the measurements use. The client keeps listening
 * after it for the rest of the batch and counts what else came: finals other than a repeat of
 * the first (one chunk from position 0 with the same worker, end and code), chunks of a second
 * worker (never added to the stream), new tokens after an error final (a "spurious" final), tokens
 * past the final's end, and for a request that finished a total other than max_tokens.
 *
 * Threads: the owner's thread sends and waits; nats.c's delivery thread runs the chunk callback,
 * which records under mu and, in closed loop, sends. Everything the callback writes (the records,
 * the counters, the gaps) is under mu; the encoder and its buffer are under send_mu, taken before
 * mu when both are. Invariant: ndone counts the requests decided since kvr_client_begin (a record
 * started afresh by kvr_client_publish may count again), so in a batch where every request is
 * sent once, ndone == n means every request is decided.
 */
#ifndef KVR_CLIENT_H
#define KVR_CLIENT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "buf.h"
#include "util.h"

/* Positions held above the complete prefix, in up to this many disjoint ranges. */
#define KVR_CLIENT_HOLES 4

/* One request as the client saw it. Times are kvr_now_ns() values. */
struct kvr_client_req {
    uint64_t t_send;                    /* sent */
    uint64_t t_first, t_last;           /* position 0 came (or a text-only stream's text); the last
                                           chunk with new tokens; until decided */
    uint64_t t_end;                     /* its first final chunk; 0: none yet */
    uint64_t t_final;                   /* decided */
    uint64_t t_cancel;                  /* a CancelRequest went out; 0: none */
    uint64_t t_resent;                  /* last resend; 0: none */
    uint64_t t_hole;                    /* since when positions below max_end are missing; 0 */
    uint32_t ntok;                      /* new tokens until decided (what the answer carried) */
    uint32_t have;                      /* positions [0, have) held, from the stream's worker */
    uint32_t held[KVR_CLIENT_HOLES][2]; /* ranges [a, b) held above have: sorted, apart */
    uint32_t nheld;                     /* */
    uint32_t max_end;                   /* the furthest position + tokens of its worker's chunks */
    uint32_t expect;                    /* max_tokens asked; 0: not checked */
    uint32_t cached;                    /* prompt tokens the worker had cached */
    uint64_t worker;                    /* the stream's worker: the first that sent a chunk */
    uint64_t worker2;                   /* another worker that sent chunks; 0: none */
    uint32_t tokens2;                   /* tokens from other workers than the stream's */
    uint32_t finals;                    /* final chunks received */
    uint32_t repeat_finals;             /* ... of them repeats of the first (from 0, same end) */
    uint64_t final_worker;              /* the first final's worker, its end and code */
    uint32_t final_end, final_code;     /* */
    uint32_t missing;                   /* missing at the answer: holes, or short of max_tokens */
    uint32_t after_cancel;              /* non-final chunks received after t_cancel */
    uint32_t error;                     /* the answer's kvr_status; 0: none */
    uint32_t late_error;                /* the code of the last final that was not a repeat */
    uint32_t resends;                   /* */
    bool sent, heard, done;             /* heard: some chunk came; done: decided */
    bool gap;                           /* a chunk came above the positions held */
    bool failed_final;                  /* an error final came (new tokens after it: spurious) */
    bool stopped;                       /* its first final ended OK with "stop" (the model's own
                                           end: an end of sequence), short of max_tokens */
    bool text_only;                     /* text came at position 0 without tokens: an engine that
                                           gives no ids, whose stream's total is 0 (protocol.md) */
    bool spurious;                      /* new tokens came after an error final */
    bool no_responders;                 /* NATS answered 503: no router listened */
};

/* Counts by error code are kept in KVR_CODE_SLOTS slots: a code from the wire (any uint32) is
 * counted in its own slot, or in the last one ("other") when it is at least that. */
#define KVR_CODE_SLOTS 64u
static inline unsigned kvr_code_slot(uint32_t code)
{
    return code < KVR_CODE_SLOTS - 1 ? code : KVR_CODE_SLOTS - 1;
}

/* What a set of requests broke of the contract, beyond failing (each a count of requests). */
struct kvr_contract {
    uint32_t requests;        /* sent */
    uint32_t finished;        /* decided without an error */
    uint32_t unanswered;      /* sent, never decided */
    uint32_t double_finals;   /* a final other than the first and its repeats */
    uint32_t extra_finals;    /* those finals (a count of chunks) */
    uint32_t repeat_finals;   /* a repeat of the final (allowed: a worker's cut connection) */
    uint32_t gaps_filled;     /* a hole in the positions, filled in time (allowed) */
    uint32_t second_streams;  /* tokens from a second worker */
    uint64_t second_tokens;   /* ... those tokens */
    uint32_t two_workers;     /* chunks from two workers (with tokens or not) */
    uint32_t spurious_finals; /* an error final, then new tokens */
    uint32_t missing_tokens;  /* holes left, or finished short of max_tokens */
    uint32_t extra_tokens;    /* tokens past the final's end or max_tokens */
    uint32_t no_responders;   /* NATS's 503 */
    uint64_t malformed;       /* answers of the batch that did not decode (kvr_client_contract) */
    uint64_t dropped;         /* messages on the inbox nats.c dropped during the batch: its
                                 pending bound was full (kvr_client_contract) */
    uint32_t errors[KVR_CODE_SLOTS]; /* requests decided with each error code (kvr_code_slot) */
    uint32_t late[KVR_CODE_SLOTS];   /* a final after their answer, by its code (0: ok) */
};

/* Add request q to k. */
void kvr_contract_add(struct kvr_contract *k, const struct kvr_client_req *q);
/* The requests that broke the contract in one of the ways above (a request counts once). */
bool kvr_contract_broken(const struct kvr_client_req *q);
/* k as one line of key=value pairs into buf; returns buf. */
const char *kvr_contract_format(const struct kvr_contract *k, char *buf, size_t len);
/* A count by code, "17 (worker lost) x2, 28 (stream interrupted) x1" (k->errors, k->late), into
 * buf ("none"); returns buf. */
const char *kvr_contract_codes(const uint32_t by_code[KVR_CODE_SLOTS], char *buf, size_t len);

/*
 * Request i's bytes into out, and the max_tokens it asks for into *max_tokens; called with
 * send_mu held on whichever thread sends (so the encoder may use scratch memory of its own).
 * false: nothing is sent.
 */
typedef bool (*kvr_client_encode_fn)(void *ctx, uint32_t i, struct kvr_buf *out,
                                     uint32_t *max_tokens);

struct kvr_client {
    natsConnection *nc_pub;      /* requests go out here */
    natsConnection *nc_sub;      /* the inbox subscription's connection */
    natsSubscription *sub;       /* <inbox>.> */
    natsSubscription *ask_hold;  /* <ask_prefix>.>, dropped: holds the asks' interest (below) */
    char inbox[160];             /* unique to this client: <inbox prefix or _KVB>.<nuid> */
    char ask_prefix[160];        /* asks' inboxes: <ask_prefix>.<nuid>; <--inbox-prefix or
                                  * _INBOX>.<nuid> */
    char subj_gen[256];          /* the routers' generate subject */
    char subj_cancel[256];       /* the routers' cancel subject */
    pthread_mutex_t send_mu;     /* the encoder and buf */
    struct kvr_buf buf;          /* under send_mu */
    kvr_client_encode_fn encode; /* set by kvr_client_begin, may be NULL */
    void *encode_ctx;            /* */
    pthread_mutex_t mu;          /* what follows */
    pthread_cond_t cv;           /* signalled when a request is decided or reaches wake_tokens */
    struct kvr_client_req *reqs; /* n records */
    uint32_t n, cap;             /* records in use, allocated */
    uint32_t batch;              /* this batch's number, in its requests' reply subjects */
    uint32_t next;               /* closed loop: the next request to send */
    uint32_t ndone;              /* records decided */
    uint32_t wake_tokens;        /* also signal cv when a stream reaches this many; 0: never */
    bool closed;                 /* closed loop */
    double *gaps;                /* every inter-token gap of the batch, ms */
    uint32_t *gap_req;           /* ... the request of each (capgap_req of them) */
    uint32_t ngaps, capgaps;     /* */
    uint32_t capgap_req;         /* */
    uint64_t gaps_dropped;       /* gaps not recorded: memory was short */
    uint64_t bad_chunks;         /* answers of the batch that did not decode */
    uint64_t dropped_before;     /* the inbox's messages nats.c dropped before this batch */
};

/*
 * Connect as net says (servers, credentials, TLS) and subscribe to a new inbox; requests go to
 * <prefix>.<ns>.generate, cancels to <prefix>.<ns>.cancel. NULL on failure, with *st saying why.
 * net is read during the call only.
 */
struct kvr_client *kvr_client_create(const struct kvr_nats_config *net, kvr_status *st);
/* Unsubscribe, close the connections, free everything; c may be NULL. */
void kvr_client_destroy(struct kvr_client *c);

/* A fresh inbox for a request-reply on the client's connections, under its inbox prefix. */
bool kvr_client_ask_inbox(const struct kvr_client *c, char *buf, size_t len);
/* Release nats.c's library state: after the last client is destroyed. */
void kvr_client_shutdown(void);
/*
 * Drain and destroy an asynchronous subscription of this module's callers (NULL: nothing): when
 * it returns, its callback is not running and will not run again (within a second's drain; past
 * it the subscription is closed with what it still held).
 */
void kvr_client_unsubscribe(natsSubscription *sub);

/*
 * Start a batch of n requests with cleared records and a new batch number: closed loop or not,
 * the encoder that kvr_client_send and resends use (ctx borrowed until the next begin), and room
 * for about gaps_hint gaps (more grow). KVR_ERR_NOMEM leaves the client with no records.
 */
kvr_status kvr_client_begin(struct kvr_client *c, uint32_t n, bool closed,
                            kvr_client_encode_fn encode, void *ctx, uint64_t gaps_hint);
/*
 * End the batch: the encoder is dropped (so its context may change or go) and later answers are
 * ignored. Read the records before.
 */
void kvr_client_end(struct kvr_client *c);
/* Request i's reply subject in this batch into buf; returns buf. */
const char *kvr_client_reply(struct kvr_client *c, uint32_t i, char *buf, size_t len);
/*
 * The fleet's key for request i of this batch with request_id: the hash (kvr_hash_bytes) of its
 * reply subject, a NUL and the id, as docs/protocol.md names a request (0 reads as 1).
 */
uint64_t kvr_client_key(struct kvr_client *c, uint32_t i, const char *request_id);
/* Encode request i and send it to the routers. */
void kvr_client_send(struct kvr_client *c, uint32_t i);
/* Request i again: the same bytes, reply subject and id; its record is kept (resends counted). */
void kvr_client_resend(struct kvr_client *c, uint32_t i);
/* Cancel request i (request_id: the id it was sent with); its record notes when. */
void kvr_client_cancel(struct kvr_client *c, uint32_t i, const char *request_id);
/* Closed loop: send the first `clients` requests (at most n); completions send the rest. */
void kvr_client_start_closed(struct kvr_client *c, uint32_t clients);
/* Send data to subject as request i asking for max_tokens: its record starts afresh (sent now). */
void kvr_client_publish(struct kvr_client *c, uint32_t i, const char *subject, const void *data,
                        size_t len, uint32_t max_tokens);
/*
 * Wait until every request is decided or deadline_ns passes; a sent request that heard nothing
 * for resend_ns (0: never) is sent again, at most 3 times, as a fleet's client should. Returns the
 * resends made.
 */
uint32_t kvr_client_wait_all(struct kvr_client *c, uint64_t deadline_ns, uint64_t resend_ns);
/* Wait until request i is decided or deadline_ns passes; its round trip in ns, 0 if it failed. */
uint64_t kvr_client_wait_one(struct kvr_client *c, uint32_t i, uint64_t deadline_ns);
/* Also signal the waiters when a stream reaches tokens (0: only when decided), for this batch. */
void kvr_client_wake_at(struct kvr_client *c, uint32_t tokens);
/* Wait until request i is decided, has wake_tokens tokens, or deadline_ns passes; its record. */
struct kvr_client_req kvr_client_wait_tokens(struct kvr_client *c, uint32_t i,
                                             uint64_t deadline_ns);
/* A copy of request i's record (zeroed past the batch); a stream whose final chunk is 2 s old
 * with positions missing is decided interrupted first. */
struct kvr_client_req kvr_client_get(struct kvr_client *c, uint32_t i);
/* Requests decided so far. */
uint32_t kvr_client_done(struct kvr_client *c);
/* Records [from, to) of the batch counted against the contract. */
void kvr_client_contract(struct kvr_client *c, uint32_t from, uint32_t to, struct kvr_contract *k);

/* A fresh prompt: n tokens (under 32,000) drawn from seed, the same for the same seed. */
void kvr_client_prompt(uint32_t *tok, uint32_t n, uint64_t seed);

#endif
