/*
 * kvr_se_state: kvengine's engine side. It runs the simulated engine (src/engine) in real time
 * on its own thread (step_begin, wait the step's duration, step_end), holds the completions in
 * flight, turns each token the engine produces into event-stream bytes in the request's own
 * buffer at once (no batching: the first token is written at the end of the request's prefill
 * step), and publishes every step's KV events as vLLM batches on the ZeroMQ publisher
 * (kvzmq.h), with the blocks' token ids from kvr_se_blocks.
 *
 * A request (struct kvr_se_req) is shared by two sides: the engine side holds it from
 * kvr_se_submit until it ends (finished, aborted by the drain, or cut for a client that does
 * not read), the HTTP side from kvr_se_submit until kvr_se_release; it is freed when both let
 * go. The HTTP side learns of new bytes and of the end through the request's eventfd (written
 * after every change, drained by kvr_se_read), so it can wait in poll() for data and for its
 * client's socket at once. kvr_se_release of a request the engine still holds is a client that
 * went away: the request is cancelled in the engine at once and counted (aborted).
 *
 * Threads: the engine thread (kvr_se_state_start .. stop), the HTTP server's connection
 * threads (submit, read, outcome, release, the test hooks, the metrics) and the main thread
 * (drain). Everything is under one mutex, never held across I/O but the publisher's
 * non-blocking kvr_kvpub_publish; the engine thread waits without it (so a cancel can reach the
 * engine in the middle of a step, and a stall does not block the HTTP side).
 *
 * Bounds: at most max_inflight requests; each stream's unread bytes at most
 * stream_buffer_bytes, plus its first chunk's when that echoes the prompt (beyond that the
 * request is aborted: a client that does not read cannot grow the server); the block table as
 * kvr_se_blocks says; a step's KV events as kvr_se_batcher says.
 */
#ifndef KVR_SE_STATE_H
#define KVR_SE_STATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batcher.h"
#include "blocks.h"
#include "buf.h"
#include "config.h"
#include "kvzmq.h"
#include "prom.h"
#include "metrics.h"
#include "wire.h"

/* How a request ended, as its HTTP side sees it. */
enum kvr_se_end {
    KVR_SE_RUNNING = 0, /* the engine holds it */
    KVR_SE_FINISHED,    /* all its tokens were produced (finish_reason "length") */
    KVR_SE_SHUTDOWN,    /* aborted by the drain: a stream got an error event and [DONE] */
    KVR_SE_OVERFLOW,    /* aborted: its client left stream_buffer_bytes unread */
    KVR_SE_CANCELLED,   /* its client went away (kvr_se_release while running) */
};

struct kvr_se_req; /* state.c */

struct kvr_se_state {
    const struct kvr_se_config *cfg; /* borrowed, must outlive the state */
    pthread_mutex_t mu;
    pthread_cond_t work;           /* the engine thread: a submission, a stall's change, stop */
    pthread_cond_t changed;        /* a request ended or was released (the drain waits on it) */
    struct kvr_engine *eng;        /* under mu */
    struct kvr_se_req *reqs;       /* held by the engine: uthash by id, under mu */
    uint32_t nreqs;                /* of them */
    uint32_t nlive;                /* requests not yet released by the HTTP side */
    uint64_t next_id;              /* the last engine request id given */
    uint64_t salt;                 /* random, per process: completion ids */
    uint64_t kv_salt;              /* block ids on the wire: --kv-hash-seed, or salt */
    struct kvr_se_blocks blocks;   /* tokens of known blocks (only with KV events) */
    struct kvr_se_batcher batcher; /* the step's KV events */
    struct kvr_kvpub *pub;         /* the ZeroMQ publisher; NULL: no KV events */
    uint64_t *cancels;             /* ids to cancel after the step (overflows), under mu */
    uint32_t ncancels, capcancels; /* */
    uint64_t *scratch;             /* a Stored run's hashes, under mu */
    uint32_t capscratch;           /* */
    const uint32_t **scratch_tok;  /* and their tokens */
    uint32_t capscratch_tok;       /* */
    uint64_t stall_until;          /* monotonic ns: no step before it; 0: none */
    bool draining;                 /* refuse new requests (503) */
    bool stopping;                 /* the engine thread returns */
    bool running;                  /* the engine thread was started */
    pthread_t thread;              /* */
    struct kvr_se_counters c;      /* under mu */
};

/*
 * Set up st for cfg (borrowed; must outlive st): the engine, and with cfg->kv_events the
 * publisher bound there (and at kv_replay). KVR_ERR_INVALID / KVR_ERR_IO / KVR_ERR_NOMEM with
 * why[0..len) filled. On failure st is left freed.
 */
kvr_status kvr_se_state_init(struct kvr_se_state *st, const struct kvr_se_config *cfg, char *why,
                             size_t len);
/* Start the engine thread. */
kvr_status kvr_se_state_start(struct kvr_se_state *st);
/* Stop and join the engine thread (what it holds stays held). */
void kvr_se_state_stop(struct kvr_se_state *st);
/* Free everything; the engine thread stopped and no HTTP side holding a request. */
void kvr_se_state_free(struct kvr_se_state *st);

/*
 * Hand c (borrowed) to the engine: *out is the request, held by both sides, KVR_OK. Otherwise
 * *why says why: 503 while draining, 429 past max_inflight, 500 out of memory.
 */
kvr_status kvr_se_submit(struct kvr_se_state *st, const struct kvr_se_completion *c,
                         struct kvr_se_req **out, struct kvr_se_refusal *why);

/* The eventfd of r: readable when r's bytes grew or it ended. */
int kvr_se_req_fd(const struct kvr_se_req *r);
/* Whether r asked for a stream. */
bool kvr_se_req_stream(const struct kvr_se_req *r);

/*
 * Copy up to max of r's unread stream bytes to buf (drains its eventfd first): the count; 0
 * with *end set to how r ended when nothing is left (KVR_SE_RUNNING: wait for more).
 */
size_t kvr_se_read(struct kvr_se_state *st, struct kvr_se_req *r, char *buf, size_t max,
                   enum kvr_se_end *end);

/* A request that does not stream, once ended: its whole answer into out (the completion, or
 * the error body of a drain) with its HTTP status; KVR_SE_RUNNING while it runs (out untouched).
 */
enum kvr_se_end kvr_se_outcome(struct kvr_se_state *st, struct kvr_se_req *r, struct kvr_buf *out,
                               unsigned *status);

/* The HTTP side lets r go (the response is over or the client left); r is not used after. */
void kvr_se_release(struct kvr_se_state *st, struct kvr_se_req *r);

/*
 * Drain: refuse new requests (503), let those held finish until timeout_ns from now, abort the
 * rest (a stream gets an error event and [DONE]), and wait up to a second more for their HTTP
 * sides to let go. Returns the requests aborted.
 */
uint32_t kvr_se_drain(struct kvr_se_state *st, uint64_t timeout_ns);
bool kvr_se_draining(struct kvr_se_state *st);

/* --- test hooks ----------------------------------------------------------------------------- */

/* The next n KV batches get their seq and enter the replay ring, unpublished. false: no KV
 * events configured. */
bool kvr_se_drop_batches(struct kvr_se_state *st, uint32_t n);
/* No engine step for the next ms milliseconds (the step in progress is held too). */
void kvr_se_stall(struct kvr_se_state *st, uint32_t ms);
/* An engine reset: the prefix cache dropped and AllBlocksCleared published. Refused (409 in
 * *why) while requests are held, as vLLM's reset refuses while requests run. */
kvr_status kvr_se_clear(struct kvr_se_state *st, struct kvr_se_refusal *why);

/* Count an answer with HTTP status (>= 400) in refused. Takes mu. */
void kvr_se_count_refusal(struct kvr_se_state *st, unsigned status);

/* What /metrics shows of st (kvr_se_metrics_write), taken at once. Takes mu briefly. */
void kvr_se_snapshot_take(struct kvr_se_state *st, struct kvr_se_snapshot *out);

#endif
