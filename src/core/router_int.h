/*
 * The insides of kvr_router (include/kvr/router.h), shared by the files that implement it:
 *   router.c              the object: configuration, create and destroy, scratch, counters
 *   router_decision.c     the pipeline: validate, hash, walk, price every worker, select, book
 *   cost.h                the kv time model's price of one worker (static inline, for the above)
 *   router_queue.c        requests waiting for a worker that is not busy
 *   router_events.c       workers' and requests' lifecycle, KV events, housekeeping
 *   router_replication.c  what replicas exchange: import, export, reconcile, digest
 * Main invariant: every per-slot scratch array has room for nslots >= reg.nslots slots, and seq
 * and nodes have room for cap_blocks blocks. Only those files include this header; their
 * cross-file functions are named kvr__router_*. Single-threaded: the router's state thread.
 */
#ifndef KVR_ROUTER_INT_H
#define KVR_ROUTER_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "active.h"
#include "blocktab.h"
#include "early.h"
#include "index.h"
#include "kvr/router.h"
#include "outlen.h"
#include "pshare.h"
#include "registry.h"
#include "select.h"

/* One prompt on its way through the pipeline; its arrays are borrowed. */
struct prompt {
    uint64_t id;                    /* request id */
    const uint64_t *seq;            /* its sequence hashes, nblocks of them */
    uint32_t nblocks;               /* full blocks */
    uint32_t ntokens;               /* prompt tokens */
    uint64_t first_hash;            /* chwbl key */
    const struct kvr_overrides *ov; /* may be NULL */
    bool explain;                   /* fill every candidate's full view */
    uint64_t deadline;              /* the request's own (0: none) */
    uint64_t avoid;                 /* a worker not to choose when another is eligible (0: none) */
    uint32_t max_tokens;            /* its generation limit, at most max_output_tokens */
};

struct queued; /* a waiting request (router_queue.c) */

struct kvr_router {
    struct kvr_router_config cfg;
    struct kvr_registry reg;
    struct kvr_blocktab tab;
    struct kvr_index ix;
    struct kvr_active act;
    struct kvr_select_state sel;
    struct kvr_early early;   /* events that came before their decision */
    struct kvr_outlen outlen; /* output lengths of the requests that ended here */
    struct kvr_pshare psh;    /* per slot: the prefill booked there lately */
    uint64_t *export_hashes;  /* scratch for kvr_router_export */
    uint32_t cap_export;      /* */
    struct kvr_walk walk_idx;
    struct kvr_walk walk_act;
    bool ring_dirty;             /* the chwbl ring misses a membership change */
    uint32_t nslots;             /* room in the per-slot scratch arrays */
    uint32_t *overlap;           /* per slot: cached prefix blocks of the current prompt */
    uint32_t *hits;              /* per slot: in-flight prefix blocks of the current prompt */
    uint32_t *slot_cand;         /* per slot: position in eligible, or KVR_NIL */
    struct kvr_candidate *cands; /* per live worker, registry order: the full view (the live
                                    workers' slots and ids in that order: reg.order, order_ids) */
    double *costs;               /* per live worker: kv cost */
    uint32_t *eligible;          /* candidates that are not busy */
    uint32_t cap_blocks;         /* room in seq and nodes */
    uint64_t *seq;               /* the current prompt's sequence hashes */
    uint32_t *nodes;             /* the current prompt's block table nodes */
    double need;                 /* the current prompt's need_blocks (router_decision.c) */
    uint32_t small_free;         /* its decision: workers not busy but too small for it; on
                                    KVR_ERR_OVERLOADED, whether smaller requests could go now */
    struct queued *qhead;        /* requests waiting for a worker that is not busy */
    struct queued *qtail;        /* */
    uint32_t qlen;               /* */
    struct kvr_map qids;         /* the waiting requests' ids (values unused) */
    uint64_t qown_min;           /* no waiting request's own deadline is before this */
    uint32_t qsized;             /* waiting requests that hold up none behind them (sized) */
    struct kvr_router_stats st;  /* counters (gauges are filled in by kvr_router_stats) */
    uint64_t last_now;           /* the latest time a call brought (for calls without one) */
};

/* A request's max_tokens as the router takes it: at most max_output_tokens. */
static inline uint32_t kvr__router_max_tokens(const struct kvr_router *r, uint32_t max_tokens)
{
    return max_tokens < r->cfg.max_output_tokens ? max_tokens : r->cfg.max_output_tokens;
}

/* router.c */

/* Tell the owner (cfg.on_event, when set) of an event; d may be NULL. */
void kvr__router_emit(struct kvr_router *r, enum kvr_event_kind kind, uint64_t request_id,
                      uint64_t worker_id, kvr_status status, const struct kvr_decision *d);

/* Size every per-slot structure for the registry's slots. */
kvr_status kvr__router_ensure_slots(struct kvr_router *r);

/* Room for n blocks in seq and nodes. */
kvr_status kvr__router_ensure_blocks(struct kvr_router *r, uint32_t n);

/* router_decision.c */

/*
 * Decide for p at now; with do_book, the chosen worker is booked. KVR_ERR_OVERLOADED when every
 * worker is busy; KVR_ERR_NO_WORKERS when there is none. Counts nothing.
 */
kvr_status kvr__router_decide(struct kvr_router *r, const struct prompt *p, uint64_t now,
                              bool do_book, struct kvr_decision *out);

/*
 * A prefill of ntokens less reuse blocks was booked on slot at now: its predicted time goes to the
 * worker's prefill share (kvr_pshare), which stretches the own decode's step there. False when
 * the model prices it at nothing (nothing counted).
 */
bool kvr__router_note_prefill(struct kvr_router *r, uint32_t slot, uint32_t ntokens, uint32_t reuse,
                              uint64_t now);

/* Booked request q is withdrawn: what kvr__router_note_prefill counted of it, if anything, is
 * taken back from its worker's share. */
void kvr__router_unnote_prefill(struct kvr_router *r, const struct kvr_active_req *q);

/*
 * Resolve the nodes of seq[from..n) into nodes (creating them; nodes[0..from) are resolved
 * already) and book request id on slot. On failure nothing is booked and no node is left empty.
 */
kvr_status kvr__router_book(struct kvr_router *r, uint64_t id, uint32_t slot, const uint64_t *seq,
                            uint32_t *nodes, uint32_t from, uint32_t n, uint32_t ntokens,
                            uint32_t overlap, uint64_t now);

/* router_queue.c */

/* Queue p until a worker is free or its deadline passes (sized: its decision found only workers
 * too small for it free). KVR_ERR_OVERLOADED when full. */
kvr_status kvr__router_enqueue(struct kvr_router *r, const struct prompt *p, uint64_t now,
                               bool sized);

/* Place or reject waiting requests, oldest first, until one finds every worker that could take it
 * busy (past those only larger workers could take, DRAIN_PAST_MAX at most). */
void kvr__router_drain(struct kvr_router *r, uint64_t now);

/* Whether request id is waiting. */
bool kvr__router_is_queued(const struct kvr_router *r, uint64_t id);
/* Take request id out of the queue (no event); false if it is not waiting. */
bool kvr__router_unqueue(struct kvr_router *r, uint64_t id);

/* Forget every waiting request (no events). */
void kvr__router_queue_free(struct kvr_router *r);

/* router_events.c */

/* How dropped in-flight requests are reported (kvr__router_on_drop's ctx). */
struct fail_ctx {
    struct kvr_router *r;
    uint64_t worker_id; /* 0: the request's own worker */
    enum kvr_event_kind kind;
    kvr_status status; /* what the client is told */
};

/* A kvr_active_drop_fn: count the dropped request and emit its event. */
void kvr__router_on_drop(void *ctx, uint64_t request_id, uint32_t slot);

#endif
