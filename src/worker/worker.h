/*
 * kvr_worker: a simulated inference worker's state and handlers, without NATS. It runs the
 * simulated engine (src/engine) in real time (step times divided by the speed-up), takes requests
 * (a WorkerGenerate from a router, or straight from a client), streams one GenerateResponse chunk
 * per token to each request's reply subject, and publishes what a real engine adapter publishes:
 * KV events, prefill done, output blocks, done, and a heartbeat listing the request keys it holds.
 * In null mode it answers every request at once (to measure the router's own overhead). Errors
 * reach clients through its kvr_reply, like the router's.
 *
 * Threads: the delivery thread calls kvr_worker_on_generate; the engine thread runs
 * kvr_worker_run_engine; the heartbeat thread calls kvr_worker_heartbeat. All state is behind
 * one mutex; messages made under it go out through the outbox and the sink after it is released.
 */
#ifndef KVR_WORKER_H
#define KVR_WORKER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uthash.h>

#include "buf.h"
#include "config.h"
#include "outbox.h"
#include "reply.h"

struct kvr_wreq {
    uint64_t key;      /* the router's key for the request: the engine's request id */
    char *reply;       /* the client's reply subject (owned) */
    char *request_id;  /* the client's id (owned) */
    uint32_t produced; /* tokens sent */
    UT_hash_handle hh; /* by key; the worker owns the item */
};

struct kvr_worker {
    const struct kvr_wk_config *cfg; /* borrowed, must outlive the worker */
    struct kvr_sink sink;            /* where flushed messages go */
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* work for the engine thread, or stop */
    struct kvr_engine *eng;    /* under mu */
    struct kvr_wreq *reqs;     /* uthash head, under mu */
    uint32_t nreqs;            /* */
    struct kvr_outbox out;     /* under mu */
    struct kvr_buf buf;        /* encoding scratch, under mu */
    struct kvr_reply generate; /* its answers and error counts, under mu */
    uint64_t event_seq;        /* KV event sequence number, under mu */
    uint64_t served;           /* requests finished, under mu */
    bool stopping;             /* threads exit, under mu */
    bool draining;             /* no new requests, under mu */
    char subj_kv[256], subj_tokens[256], subj_done[256], subj_hb[256], subj_gen[256];
};

/* Set up w for cfg (borrowed) publishing through sink. */
kvr_status kvr_worker_init(struct kvr_worker *w, const struct kvr_wk_config *cfg,
                           struct kvr_sink sink);
void kvr_worker_free(struct kvr_worker *w);

/* A request data[0..len) to answer at reply (takes mu; publishes). */
void kvr_worker_on_generate(struct kvr_worker *w, const char *reply, const void *data, size_t len);

/* The engine thread's loop: step the engine in real time until kvr_worker_stop. */
void kvr_worker_run_engine(struct kvr_worker *w);

/* Publish one heartbeat now (its load, the requests it holds, whether it drains). */
void kvr_worker_heartbeat(struct kvr_worker *w);

/* Take no new requests (the heartbeat says so). */
void kvr_worker_set_draining(struct kvr_worker *w);
/* Requests still held. */
uint32_t kvr_worker_held(struct kvr_worker *w);
/* Make the engine thread (and the heartbeat thread's waits) return. */
void kvr_worker_stop(struct kvr_worker *w);
bool kvr_worker_stopping(struct kvr_worker *w);

/* Publish what the outbox holds (takes and releases mu). */
void kvr_worker_flush(struct kvr_worker *w);

#endif
