/*
 * The insides of kvr_sim (sim.h), shared by the files that implement it:
 *   sim.c          the event loop: the event heap, engines, routing, delivery, set-up, the run
 *   sim_gossip.c   router replicas: each booking exported and sent to the others as gossip
 *   sim_metrics.c  what a run measures, and the result it returns
 * (sim_ceiling.c, the hit-rate ceilings, is the fourth file of kvr_sim and needs none of this.)
 * Main invariant: the heap pops events in (time, insertion) order, so events at equal times keep
 * their order and a run is a pure function of its inputs. Only those files include this header
 * (and it does not include sim.h, so the two stay one module each); their cross-file functions
 * are named kvr__sim_*. Single-threaded: one run, one thread.
 */
#ifndef KVR_SIM_INT_H
#define KVR_SIM_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "../engine/engine.h"
#include "heap.h"
#include "kvr/rng.h"
#include "kvr/router.h"
#include "workload.h"

struct kvr_sim_config; /* sim.h, which the files that read them include */
struct kvr_sim_result;
struct kvr_sim_request;

enum ev_kind {
    EV_ARRIVAL,   /* arg: request index */
    EV_STEP_END,  /* worker */
    EV_STORED,    /* worker, payload: struct stored_msg */
    EV_REMOVED,   /* worker, payload: struct removed_msg */
    EV_PREFILL,   /* worker, arg: request id */
    EV_OUTBLK,    /* worker, arg: request id */
    EV_DONE,      /* worker, arg: request id */
    EV_HEARTBEAT, /* */
    EV_GOSSIP,    /* worker: the replica that booked, payload: struct gossip_msg */
    EV_REFUSED,   /* worker, arg: request id (refused before its engine, as a done event) */
};

struct ev {
    uint64_t t;      /* virtual time, ns */
    uint64_t seq;    /* insertion order: the tie-break at equal times */
    uint64_t arg;    /* see enum ev_kind */
    void *payload;   /* malloc'ed, owned by the event; NULL when none */
    uint32_t kind;   /* enum ev_kind */
    uint32_t worker; /* see enum ev_kind */
};

static inline bool ev_before(const struct ev *a, const struct ev *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

KVR_HEAP_DEFINE(ev_heap, struct ev, ev_before)

struct stored_msg {
    bool has_parent;
    uint64_t parent;
    uint32_t n;
    struct kvr_kv_block blocks[];
};

struct removed_msg {
    uint32_t n;
    uint64_t ids[];
};

/* One booking on its way to the other replicas (rec.block_hashes points at hashes). */
struct gossip_msg {
    struct kvr_request_record rec;
    uint64_t hashes[];
};

/* A request's prompt hashes while it waits in the router's queue. */
struct pending {
    uint64_t *hashes; /* nblocks local, then nblocks seq */
    uint32_t nblocks;
};

struct sim;

struct wctx {
    struct sim *s;
    uint32_t w;
};

/* One router replica and what the simulation keeps of it. */
struct replica {
    struct sim *s;
    uint32_t i;
    struct kvr_router *router;
    uint64_t *booked; /* requests it booked in the current call, to gossip once it returns */
    uint32_t nbooked, cap_booked;
    uint64_t sent;                /* gossip messages it sent (their seq) */
    double pred_abs, pred_actual; /* its prediction error, as the sim's totals */
};

struct sim {
    const struct kvr_workload *wl;
    const struct kvr_sim_config *cfg;
    struct replica *rep;
    uint32_t nrep;
    bool gossip;         /* more than one replica, and gossip on */
    struct kvr_rng pick; /* which replica a request reaches */
    struct kvr_engine **engines;
    struct wctx *wctx;
    bool *busy;
    uint32_t *per_worker; /* requests routed to each */
    struct ev_heap heap;  /* events to come */
    uint64_t next_seq;
    uint64_t now;
    kvr_status err; /* first failure, ends the run */
    /* requests */
    uint64_t *arrival; /* per request: when it reached the router */
    struct pending *pending;
    uint32_t next_issue; /* closed loop: next request to issue */
    uint32_t resolved;   /* finished + rejected */
    uint32_t *scratch_tok;
    uint32_t cap_tok;
    uint64_t *scratch_hash;
    uint32_t cap_hash;
    /* metrics */
    double *ttft, *e2e, *queue;
    struct kvr_sim_request *per_request; /* when asked: one per finished request, as ttft */
    uint32_t nfinished, rejected, failed;
    uint64_t failed_blocks; /* the largest need of a failed request, blocks */
    uint64_t cached_tokens, prompt_tokens, output_tokens;
    uint64_t first_arrival, last_finish;
    double *itl;            /* every inter-token gap, ms (8 bytes per output token) */
    uint32_t nitl, cap_itl; /* */
    double *itl_req;        /* per finished request of two tokens or more: its mean gap, ms */
    uint32_t nitl_req;      /* */
    double pred_abs, pred_actual;
    uint64_t pred_n;
    uint64_t index_max, memory_max;
    uint64_t decisions, gossip_msgs, gossip_bytes, gossip_imports;
};

/* sim.c */

/* Remember the run's first failure; it ends the run. */
void kvr__sim_fail(struct sim *s, kvr_status st);

/* Schedule an event; payload (may be NULL) is taken, and freed if the heap cannot grow. */
void kvr__sim_push(struct sim *s, uint64_t t, enum ev_kind kind, uint32_t worker, uint64_t arg,
                   void *payload);

/* sim_gossip.c */

/* rp booked request id: it goes out as gossip once the call into rp returns. */
void kvr__sim_booked(struct replica *rp, uint64_t id);

/* Export what rp booked during its last call and send it to the other replicas. */
void kvr__sim_gossip_out(struct replica *rp);

/* sim_metrics.c */

/* An engine's inter-token gap of gap_ms (a kvr_engine_sink token_gap; ctx is a struct wctx). */
void kvr__sim_token_gap(void *ctx, double gap_ms);

/* Request res finished: its own mean inter-token gap joins the per-request sample. */
void kvr__sim_request_itl(struct sim *s, const struct kvr_engine_result *res);

/* Summarise a finished run into out (takes the sorted TTFTs). */
void kvr__sim_collect(struct sim *s, struct kvr_sim_result *out);

#endif
