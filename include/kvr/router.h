/*
 * kvr_router: the routing core's decision pipeline (ROUTING.md sections 2-5).
 *
 * A router holds the worker registry, the prefix index, the predictive active-block map and the
 * policy state. For every request it hashes the prompt, walks the shared block table once to get
 * every worker's cached prefix (overlap) and in-flight prefix, computes each worker's potential
 * load and cost, selects a worker with the configured policy and books the request, all in one
 * call, so no other decision can interleave. Workers' lifecycle and KV events enter through the
 * event functions below; nothing here does I/O or reads a clock: time is passed in (ns, any
 * monotonic origin, never decreasing between calls).
 *
 * Threads: a router is not thread-safe. One thread (the state thread) makes every call; the
 * event callback runs on that thread, inside the call that caused it, and must not call back into
 * the router.
 *
 * Ownership: every pointer passed in is borrowed for the duration of the call. Pointers handed out
 * (decision candidates, block hashes) belong to the router and stay valid until the next call into
 * it; but a decision's block_hashes are the request's own seq_hashes when it came with them (valid
 * as long as the caller keeps those).
 */
#ifndef KVR_ROUTER_H
#define KVR_ROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr/policy.h"
#include "kvr/status.h"

struct kvr_router;

/* What a KV event says of one block: the engine's id for it and the local hash of its tokens. */
struct kvr_kv_block {
    uint64_t engine_id;  /* the engine's own block id (opaque, per worker) */
    uint64_t local_hash; /* kvr_hash_block of the block's tokens */
};

/* One event the router reports back to its owner, from inside the call that caused it. */
enum kvr_event_kind {
    KVR_EV_PLACED = 1,      /* a queued request found a worker: decision is set */
    KVR_EV_REJECTED = 2,    /* a queued request waited past its deadline: status says why */
    KVR_EV_FAILED = 3,      /* an in-flight request lost its worker: tell its client */
    KVR_EV_EXPIRED = 4,     /* an in-flight request was dropped as stale (TTL or anti-entropy) */
    KVR_EV_WORKER_LEFT = 5, /* a worker was removed (left, timed out) */
};

struct kvr_decision;

struct kvr_event {
    enum kvr_event_kind kind;
    uint64_t request_id;                 /* 0 for worker events */
    uint64_t worker_id;                  /* the worker concerned, or 0 */
    kvr_status status;                   /* the error to report, KVR_OK for PLACED */
    const struct kvr_decision *decision; /* PLACED only; valid during the callback */
};

typedef void (*kvr_event_fn)(void *ctx, const struct kvr_event *ev);

/*
 * The default timing model: the simulated engine's (ROUTING.md's polynomial fit) and its step's
 * token budget, which the router's time cost assumes unless configured otherwise. One
 * definition, for both.
 */
#define KVR_MODEL_PREFILL_MS                                                                       \
    {                                                                                              \
        16.50142, 1.518344e-2, 4.209989e-7                                                         \
    }
#define KVR_MODEL_DECODE_MS                                                                        \
    {                                                                                              \
        5.74, 54.01, -25.74                                                                        \
    }
#define KVR_MODEL_BATCH_TOKENS 8192u /* tokens an engine step takes */

/* The prefill_window_ns a router takes: 0, or 10 ms to one hour (a shorter one would move the
 * shares' epoch, a pass over every worker, at nearly every booking). */
#define KVR_PREFILL_WINDOW_MIN_NS 10000000ull
#define KVR_PREFILL_WINDOW_MAX_NS (3600ull * 1000000000ull)
/* The engine_speedup a router takes. */
#define KVR_ENGINE_SPEEDUP_MIN 1e-3
#define KVR_ENGINE_SPEEDUP_MAX 1e6

/* The kv policy's tie margin in kvrouter and kvsim run (kvr_router_config.tie_margin). */
#define KVR_TIE_MARGIN 0.1

/*
 * Called from kvr_router_tick (at most once per index_warn_ns) when entries the engines still
 * hold were pruned since the last call: pruned says how many, max_entries is the bound, from_fleet
 * whether index_max_entries is 0. Must not call into the router.
 */
typedef void (*kvr_index_warn_fn)(void *ctx, uint64_t pruned, uint32_t max_entries,
                                  bool from_fleet);

/* How the kv policy prices a worker (see docs/architecture.md). */
enum kvr_cost_model {
    KVR_COST_BLOCKS = 0, /* ROUTING.md section 4: overlap_weight * prefill / B + decode blocks */
    KVR_COST_TIME = 1,   /* predicted TTFT (ms) from the engine timing model, plus the cache a
                            recomputation costs (the default; docs/architecture.md) */
};

struct kvr_router_config {
    uint32_t block_size;            /* tokens per KV block, B; workers must announce the same */
    enum kvr_policy policy;         /* default policy */
    double overlap_weight;          /* blocks model: weight of prefill against decode blocks;
                                       time model: scales cache_weight */
    double temperature;             /* kv policy: 0 picks the minimum, > 0 samples softly */
    double tie_margin;              /* kv policy at temperature 0: each price is multiplied by a
                                       factor in [1, 1 + tie_margin), a hash of the request and the
                                       worker, before the minimum is taken, so routers sharing the
                                       requests do not all pick the same worker (0 to 1; 0: the
                                       exact minimum, the library's default; the programs run
                                       KVR_TIE_MARGIN) */
    enum kvr_cost_model cost_model; /* kv policy: how a worker is priced */
    double cache_weight;            /* time model: recomputed prefill is charged this many more
                                       times, scaled by how full the worker's cache is */
    double share_weight;            /* time model: weight of recomputing a prefix that n > 2
                                       in-flight requests are computing now, times (n-2)/n */
    double stall_weight;            /* time model: the delay our prefill's steps add to each
                                       request decoding on the worker is charged this many times */
    double decode_weight;           /* time model: the request's own decode, the output expected of
                                       its max_tokens (learn_output) in steps at the worker's
                                       decode step with it booked, charged this many times (0: not
                                       priced; docs/architecture.md, "The kv cost") */
    bool learn_output;              /* time model, decode_weight: price a request's output as its
                                       max_tokens times the share of it that requests with a like
                                       max_tokens generated here (false: its max_tokens) */
    uint64_t prefill_window_ns;     /* time model, decode_weight: a worker's decode step is
                                       stretched by the share of its time that the prefills booked
                                       there take, their rate measured over this window (0: not
                                       stretched; else KVR_PREFILL_WINDOW_MIN_NS to _MAX_NS) */
    double engine_speedup;          /* how many times faster than the timing model the engines
                                       run (a simulated fleet's --speedup): the router's clock
                                       reads as the model's time divided by it (1e-3 to 1e6) */
    double prefill_ms[3];           /* timing model: prefill(T) = [0] + [1] T + [2] T^2 ms */
    double decode_ms[3];            /* timing model: decode(u) = max(1, [0] + [1] u + [2] u^2) ms */
    uint32_t batch_tokens;          /* timing model: tokens an engine step takes */
    uint64_t seed;                  /* seeds every random choice */
    bool approximate;               /* no KV events: decisions feed the index, with a TTL */
    uint64_t index_ttl_ns;          /* approximate mode entry lifetime */
    uint32_t index_max_entries;     /* bound on worker-block entries in the index; 0: from the
                                       fleet (docs/architecture.md, "Index sizing") */
    uint32_t index_prune_pct;       /* prune down to this percentage when over the bound */
    double index_headroom;          /* from the fleet: entries per announced block (>= 1) */
    uint32_t index_min_entries;     /* from the fleet: the bound never goes below this */
    uint32_t index_ceiling;         /* from the fleet: the bound never goes above this */
    uint64_t index_worker_max;      /* from the fleet: a worker's announced capacity counts
                                       at most this many blocks (heartbeats are untrusted) */
    uint64_t index_warn_ns;         /* index_warn at most once per this long; 0: never */
    kvr_index_warn_fn index_warn;   /* pruned live entries are reported here; may be NULL */
    void *index_warn_ctx;           /* passed to index_warn */
    double busy_threshold;          /* busy above this fraction of capacity in blocks; 0: off */
    uint64_t busy_prefill_tokens;   /* busy above this many queued prefill tokens; 0: off */
    uint32_t max_prompt_tokens;     /* longer prompts are refused */
    uint32_t max_output_tokens;     /* bounds an imported request's output blocks */
    uint32_t max_inflight;          /* bound on requests in flight across all workers */
    uint32_t queue_max;             /* requests that may wait while every worker is busy; 0: none */
    uint64_t queue_timeout_ns;      /* how long a request may wait before "overloaded" */
    uint64_t request_ttl_ns;    /* an in-flight request with no event for this long is dropped */
    uint64_t worker_timeout_ns; /* a worker silent for this long is removed; 0: never */
    uint32_t max_workers;       /* bound on registered workers */
    /* baseline policies' knobs (ROUTING.md section 5) */
    uint32_t sglang_balance_abs;   /* sglang_cache_aware: imbalance if max - min load > this */
    double sglang_balance_rel;     /* ... and max > this * min */
    double sglang_cache_threshold; /* ... else the best match wins above this prefix fraction */
    double llmd_w_queue;           /* llmd_weighted weights */
    double llmd_w_kv;              /* */
    double llmd_w_prefix;          /* */
    uint32_t chwbl_vnodes;         /* chwbl: virtual nodes per worker */
    double chwbl_load_factor;      /* chwbl: walk on while load > this * mean */
    kvr_event_fn on_event;         /* may be NULL */
    void *event_ctx;               /* passed to on_event */
};

/* Fill c with the defaults documented in docs/architecture.md. */
void kvr_router_config_default(struct kvr_router_config *c);

/*
 * Salt the core's hash tables with a secret, once per process, before any router is created:
 * keys chosen by whoever can publish (block hashes, request keys) can then not be aimed at one
 * probe run. 0, the default, keeps simulations reproducible; the daemons pass a random salt.
 */
void kvr_router_set_salt(uint64_t salt);

/* Per-request overrides of the router's defaults; fields count only when their flag is set. */
enum kvr_override_flags {
    KVR_OV_POLICY = 1u << 0,
    KVR_OV_OVERLAP_WEIGHT = 1u << 1,
    KVR_OV_TEMPERATURE = 1u << 2,
};

struct kvr_overrides {
    uint32_t flags;         /* KVR_OV_* */
    enum kvr_policy policy; /* */
    double overlap_weight;  /* */
    double temperature;     /* */
};

struct kvr_request {
    uint64_t id;             /* unique among in-flight requests; 0 is invalid */
    const uint32_t *tokens;  /* prompt token ids, borrowed */
    uint32_t ntokens;        /* */
    uint32_t max_tokens;     /* generation limit; priced only with decode_weight (at most
                                max_output_tokens) */
    struct kvr_overrides ov; /* */
    bool explain;            /* fill decision.candidates with every worker's full view */
    uint64_t deadline;       /* 0: none; else, queued past this time (the core's clock) it is
                                rejected with KVR_ERR_DEADLINE rather than waiting on */
    uint64_t avoid_worker;   /* 0: none; else another eligible worker is chosen over this one (a
                                request placed again after it never reached it); not kept while
                                queued */
    /* NULL: the prompt is hashed in the call; else its sequence hashes at the router's block
     * size, ntokens / block_size of them (kvr_hash_prompt's seq_out), borrowed for the call: a
     * caller hashes before taking the lock it calls the router under */
    const uint64_t *seq_hashes;
};

/* One worker as the decision saw it. */
struct kvr_candidate {
    uint64_t worker_id;
    uint32_t overlap_blocks; /* consecutive prompt blocks it caches */
    uint32_t active_hits;    /* consecutive prompt blocks already in use by its requests */
    uint64_t decode_blocks;  /* its predicted active blocks if the request went there */
    uint64_t prefill_tokens; /* its predicted outstanding prefill tokens if it went there (the
                                prompt less the longer of overlap_blocks and active_hits) */
    uint32_t inflight;       /* requests the router has in flight on it */
    uint32_t cached_blocks;  /* entries it has in the index */
    uint32_t waiting;        /* its own queue length, from its last load report */
    double kv_usage;         /* its own KV utilisation, from its last load report */
    double cost;             /* kv cost (lower is better), computed for every policy */
    bool busy;               /* skipped: busy, or its announced capacity cannot hold the
                                request's prompt and max_tokens at once */
    bool too_small;          /* skipped for the latter (busy is set too) */
};

struct kvr_decision {
    uint64_t request_id;
    uint64_t worker_id;           /* the chosen worker */
    enum kvr_policy policy;       /* the policy that chose */
    uint32_t overlap_blocks;      /* the chosen worker's cached prefix, in blocks */
    uint32_t reuse_blocks;        /* the prefix it will not prefill: overlap_blocks, or the longer
                                     one a request in flight there computes first; a booking adds
                                     the rest of the prompt to its outstanding prefill */
    uint32_t prompt_blocks;       /* full blocks of the prompt */
    uint32_t prompt_tokens;       /* */
    double cost;                  /* the chosen worker's kv cost */
    const uint64_t *block_hashes; /* the prompt's sequence hashes, prompt_blocks of them */
    uint32_t ncandidates;         /* live workers, in registry order: */
    const uint64_t *worker_ids;   /* ... their ids */
    const double *costs;          /* ... their kv costs (before this booking); NULL when a
                                     routed kv decision under the time model priced only the
                                     workers that could win (explain asks for every price) */
    const struct kvr_candidate *candidates; /* ... their full view; NULL unless the request
                                                asked to explain or the policy is a baseline */
    bool booked;                            /* the request is now in flight on the worker */
    bool queued; /* every worker is busy: the request waits; its outcome comes later as a PLACED
                    or REJECTED event; nothing else in the decision is set (an outcome, not an
                    error: kvr_router_route returns KVR_OK) */
};

/* What a worker announces (on join and in every heartbeat). */
struct kvr_worker_info {
    uint64_t id;              /* unique, non-zero */
    uint32_t block_size;      /* must equal the router's */
    uint64_t capacity_blocks; /* KV pool size; 0: unknown, never busy by blocks */
    uint32_t waiting;         /* its own queue length (load report, for llmd_weighted) */
    double kv_usage;          /* its own KV utilisation in [0, 1] (load report) */
    uint64_t timeout_ns;      /* silence after which it is removed; 0: the router's default */
    bool draining;            /* shutting down: route nothing new to it */
    bool approximate;         /* its engine publishes no KV events: the router learns its cache
                                 from its own decisions (with the index TTL), as in approximate
                                 mode, for this worker alone */
};

struct kvr_index_counters {
    uint64_t stored_blocks;  /* blocks added by Stored events */
    uint64_t removed_blocks; /* blocks dropped by Removed events */
    uint64_t unknown_parent; /* Stored events rejected for an unknown parent */
    uint64_t unknown_block;  /* Removed ids that were not in the index */
    uint64_t reassigned;     /* engine ids reused for another block, or duplicate blocks */
    uint64_t pruned;         /* entries pruned to keep the bound (TTL and event entries) */
    uint64_t pruned_live;    /* ... of which event entries: blocks the engines still hold */
    uint64_t expired;        /* TTL entries expired */
    uint64_t cleared;        /* entries dropped by Cleared events or worker removal */
};

struct kvr_router_stats {
    uint64_t decisions;         /* requests routed and booked */
    uint64_t selects;           /* decisions returned without booking */
    uint64_t queued;            /* requests that had to wait */
    uint64_t rejected;          /* requests refused (any error) */
    uint64_t overloaded;        /* ... of which overloaded */
    uint64_t unknown_request;   /* events for requests not in flight */
    uint64_t unknown_worker;    /* events from workers not registered */
    uint64_t duplicate_request; /* requests whose id was already in flight */
    uint64_t bad_block_size;    /* workers refused for their block size */
    uint64_t expired_requests;  /* in-flight requests dropped as stale */
    uint64_t failed_requests;   /* in-flight requests failed by worker loss */
    uint64_t workers_joined;    /* */
    uint64_t workers_left;      /* */
    uint64_t late_decisions;    /* imported decisions refused: their done came first */
    uint64_t early_events;      /* events that came before their decision (kept a while) */
    uint64_t reconciled;        /* requests dropped because their worker did not hold them */
    uint64_t routed_blocks;     /* prompt blocks of the requests this router routed */
    uint64_t routed_overlap;    /* ... of which its decisions expected cached on their worker */
    uint64_t kv_ignored;        /* KV events dropped unapplied: the router is approximate */
    uint64_t completions;       /* requests held here (its decisions, peers') that completed
                                   saying their output: what learn_output learns from */
    uint64_t completion_tokens; /* ... the tokens they generated (each at most its max_tokens) */
    uint64_t completion_limit;  /* ... the sum of their max_tokens */
    struct kvr_index_counters index;
    uint32_t workers;       /* registered now */
    uint32_t inflight;      /* requests in flight now */
    uint32_t queue_len;     /* requests waiting now */
    uint32_t index_entries; /* worker-block entries in the index */
    uint32_t index_max;     /* the index's bound now, entries (set or from the fleet) */
    uint32_t nodes;         /* blocks in the shared block table */
    uint64_t active_blocks; /* sum over workers of predicted active blocks */
    size_t memory_bytes;    /* heap held by the router's structures */
};

/* Create a router; cfg is copied. NULL when cfg is invalid or memory is short (*st says which). */
struct kvr_router *kvr_router_create(const struct kvr_router_config *cfg, kvr_status *st);
void kvr_router_destroy(struct kvr_router *r);

/*
 * Decide and book: choose a worker for req and book it in the active-block map (and, in
 * approximate mode, the index). On KVR_OK, *out describes the decision, or out->queued says
 * every worker is busy and the request waits (its outcome arrives later as a PLACED or REJECTED
 * event). Any other status refuses the request (nothing is booked).
 */
kvr_status kvr_router_route(struct kvr_router *r, const struct kvr_request *req, uint64_t now,
                            struct kvr_decision *out);

/* Decide without booking (for gateways that forward themselves). Never queues. */
kvr_status kvr_router_select(struct kvr_router *r, const struct kvr_request *req, uint64_t now,
                             struct kvr_decision *out);

/*
 * Book a decision made elsewhere (a peer's gossip, or a gateway that selected earlier): request id
 * on worker_id with the given sequence hashes, prompt length and the prefix it will not prefill
 * (a selected decision's reuse_blocks). Duplicate ids and unknown workers are refused and counted;
 * with max_inflight requests in flight already it is refused with KVR_ERR_FULL.
 */
kvr_status kvr_router_book(struct kvr_router *r, uint64_t request_id, uint64_t worker_id,
                           const uint64_t *block_hashes, uint32_t nblocks, uint32_t prompt_tokens,
                           uint32_t overlap_blocks, uint64_t now);

/*
 * Forget request_id, queued or booked, without an event (a client cancelled it, or it is placed
 * again): its predicted load is freed. KVR_ERR_UNKNOWN_REQUEST if absent. Its prefill still
 * counts in its worker's share, as on every replica (which cannot tell whether it ran).
 */
kvr_status kvr_router_cancel(struct kvr_router *r, uint64_t request_id);

/*
 * kvr_router_cancel of a decision that never stood: another router's decision for the request,
 * taken earlier, stands instead (and is imported in its place). The router whose decision stands
 * never counted this one, and every other that imported it withdraws it too; so its prefill is
 * taken back from its worker's share as well, and the replicas' shares stay alike.
 */
kvr_status kvr_router_withdraw(struct kvr_router *r, uint64_t request_id);

/* Request lifecycle events from the workers. Unknown ids are counted no-ops. */
kvr_status kvr_router_prefill_done(struct kvr_router *r, uint64_t request_id, uint64_t now);
kvr_status kvr_router_output_block(struct kvr_router *r, uint64_t request_id, uint64_t now);
kvr_status kvr_router_done(struct kvr_router *r, uint64_t request_id);
/* done at time now (a done for a request not booked yet is remembered until its decision). */
kvr_status kvr_router_done_at(struct kvr_router *r, uint64_t request_id, uint64_t now);
/* done_at for a request that completed having generated output_tokens: with learn_output, what
 * a request of its max_tokens is expected to generate is learned from it (any booking whose
 * max_tokens is known: this router's decisions, and peers' whose records carry it). */
kvr_status kvr_router_finished(struct kvr_router *r, uint64_t request_id, uint64_t now,
                               uint32_t output_tokens);
/* The output the router expects of a request with this max_tokens (what decode_weight prices;
 * max_tokens taken at most max_output_tokens). */
uint32_t kvr_router_expected_output(const struct kvr_router *r, uint32_t max_tokens);
/* The max_tokens of a request this router booked with kvr_router_book for a client of its own (a
 * booked select), so its completion teaches learn_output as a routed one's does; nothing when
 * request_id is not in flight. */
void kvr_router_note_max_tokens(struct kvr_router *r, uint64_t request_id, uint32_t max_tokens);

/*
 * A worker's heartbeat (or first announcement): registers it when new, refreshes its liveness,
 * capacity and load report. Refused with KVR_ERR_BLOCK_SIZE when its block size differs.
 */
kvr_status kvr_router_worker_seen(struct kvr_router *r, const struct kvr_worker_info *info,
                                  uint64_t now);

/* Remove a worker: its cache entries go, its in-flight requests fail (FAILED events). */
kvr_status kvr_router_worker_remove(struct kvr_router *r, uint64_t worker_id);

/*
 * KV events from a worker's engine. A router configured approximate counts Stored and Removed
 * (kv_ignored) and drops them: its index holds its own decisions' guesses alone. Cleared, which
 * only forgets, is applied in both modes.
 */
kvr_status kvr_router_kv_stored(struct kvr_router *r, uint64_t worker_id, const uint64_t *parent,
                                const struct kvr_kv_block *blocks, size_t n);
kvr_status kvr_router_kv_removed(struct kvr_router *r, uint64_t worker_id,
                                 const uint64_t *engine_ids, size_t n);
kvr_status kvr_router_kv_cleared(struct kvr_router *r, uint64_t worker_id);

/*
 * Housekeeping at time now: expire index TTL entries, stale requests and silent workers, place or
 * reject queued requests. Call it periodically (every few ms to a second) and after events that
 * free load.
 */
void kvr_router_tick(struct kvr_router *r, uint64_t now);
/*
 * kvr_router_tick, with the workers' silence judged at heard (at most now) instead: the caller
 * has applied every event that had reached it by heard, and later ones may still wait in its
 * queue (a heartbeat stuck there behind a burst of KV events says nothing of its worker).
 */
void kvr_router_tick_heard(struct kvr_router *r, uint64_t now, uint64_t heard);
/*
 * The queue's part of kvr_router_tick alone: place or reject queued requests at now, judging
 * nothing else (for a caller that hears no worker for a while: their silence is its own).
 */
void kvr_router_tick_queue(struct kvr_router *r, uint64_t now);

void kvr_router_stats(const struct kvr_router *r, struct kvr_router_stats *out);

/* --- replication: what router replicas exchange (docs/architecture.md, "A fleet of routers") ---
 */

/* One in-flight request as a replica holds it. */
struct kvr_request_record {
    uint64_t request_id;          /* */
    uint64_t worker_id;           /* */
    const uint64_t *block_hashes; /* its prompt's sequence hashes, nblocks of them */
    uint32_t nblocks;             /* */
    uint32_t prompt_tokens;       /* */
    uint32_t overlap_blocks;      /* the prefix not to prefill, at booking (a decision's
                                     reuse_blocks) */
    bool prefill_done;            /* its first token is out */
    uint32_t output_blocks;       /* blocks it took while decoding */
    uint32_t max_tokens;          /* its client's generation limit (0: not known) */
};

/* The record of request_id (block_hashes point into router scratch, valid until the next call). */
kvr_status kvr_router_export(struct kvr_router *r, uint64_t request_id,
                             struct kvr_request_record *out);

/* Call fn for every in-flight request (fn must not call into the router). */
void kvr_router_export_requests(struct kvr_router *r,
                                void (*fn)(void *ctx, const struct kvr_request_record *rec),
                                void *ctx);

/*
 * The same walks in slices, for a snapshot served without holding the router for its whole
 * length: kvr_router_export_begin starts a walk over the requests in flight and one over the
 * index; each _some call then visits at most max more items of its walk (calls fn for them, but
 * for index entries already expired) and returns how many it visited, fewer than max once that
 * walk is over. The router may change between the calls (decisions, events, expiry): an item
 * there throughout is visited once, one added meanwhile is visited or not (a request or entry
 * made active again may be visited twice: imports of a duplicate are refused or merged), one gone
 * before its turn is not. One such walk at a time.
 */
void kvr_router_export_begin(struct kvr_router *r);
uint32_t kvr_router_export_requests_some(struct kvr_router *r,
                                         void (*fn)(void *ctx,
                                                    const struct kvr_request_record *rec),
                                         void *ctx, uint32_t max);

/*
 * Book a request another replica decided (gossip, a snapshot, a repair). Events that arrived before
 * it are applied; if its done already arrived, it is refused with KVR_ERR_DUPLICATE (a
 * tombstone) and counted as a late decision. With max_inflight requests in flight already it is
 * refused with KVR_ERR_FULL.
 */
kvr_status kvr_router_import(struct kvr_router *r, const struct kvr_request_record *rec,
                             uint64_t now);

/* Whether kvr_router_import could book rec at all: KVR_ERR_UNKNOWN_WORKER or KVR_ERR_INVALID as
 * it would refuse it (not counted), else KVR_OK (it may still find it a duplicate). Lets a caller
 * check a record before it undoes what the record would replace. */
kvr_status kvr_router_import_check(struct kvr_router *r, const struct kvr_request_record *rec);

/* One index entry as a replica holds it. */
struct kvr_index_record {
    uint64_t worker_id;   /* */
    uint64_t seq;         /* the block's sequence hash */
    bool has_engine;      /* an event entry (else a TTL entry) */
    uint64_t engine_id;   /* event entries: the engine's id for the block */
    uint64_t ttl_left_ns; /* TTL entries: time left */
};

void kvr_router_export_index(struct kvr_router *r,
                             void (*fn)(void *ctx, const struct kvr_index_record *rec), void *ctx,
                             uint64_t now);
uint32_t kvr_router_export_index_some(struct kvr_router *r,
                                      void (*fn)(void *ctx, const struct kvr_index_record *rec),
                                      void *ctx, uint64_t now, uint32_t max);
kvr_status kvr_router_import_index(struct kvr_router *r, const struct kvr_index_record *rec,
                                   uint64_t now);

/*
 * Anti-entropy from a worker's heartbeat received at now, which lists every request it holds
 * (keys[0..n)). A request booked on it more than grace ago that it does not hold is marked; one
 * still missing at a heartbeat at least grace/2 later is dropped (EXPIRED events with status
 * KVR_ERR_NOT_DELIVERED: the worker never got it or lost it). Two strikes, so a burst of stale
 * heartbeats (buffered during a disconnection) drops nothing. A request within its grace loses
 * its mark, so a grace of now or more judges none and clears every mark: how a caller suspends
 * judgement while the worker may still hold requests it has not listed. Keys the router does not
 * know are written to unknown (at most max) so the caller can ask its peers. Returns how many were
 * dropped. keys may come in any order; sorted ascending, they are not copied and sorted here.
 */
uint32_t kvr_router_reconcile(struct kvr_router *r, uint64_t worker_id, const uint64_t *keys,
                              uint32_t n, uint64_t now, uint64_t grace, uint64_t *unknown,
                              uint32_t *nunknown, uint32_t max);

/*
 * This router could not hear the workers until now (its own connection was down): their silence
 * says nothing, so every worker's liveness clock restarts at now.
 */
void kvr_router_excuse_silence(struct kvr_router *r, uint64_t now);

/* Forget every index entry (before applying a peer's snapshot of the index). */
void kvr_router_index_clear(struct kvr_router *r);

/* A digest of a replica's state: equal state, equal digest (XORs of per-item hashes). */
struct kvr_digest {
    uint64_t workers;  /* over live worker ids */
    uint64_t requests; /* over (request id, worker id) in flight */
    uint64_t index;    /* over (worker id, block) entries */
    uint64_t combined; /* all three mixed */
    uint32_t nworkers, nrequests, nentries;
};
void kvr_router_digest(struct kvr_router *r, struct kvr_digest *out);

/* Requests waiting for a worker that is not busy (cheap; for deciding when to tick). */
uint32_t kvr_router_queue_len(const struct kvr_router *r);

/* One registered worker as the router sees it: what it announced and what is predicted. */
struct kvr_worker_view {
    uint64_t id;
    uint64_t capacity_blocks; /* announced; 0: unknown */
    uint64_t active_blocks;   /* predicted: the blocks its in-flight requests hold */
    uint64_t prefill_tokens;  /* predicted: prompt tokens still to prefill */
    uint32_t inflight;        /* requests booked on it */
    uint32_t waiting;         /* its own queue length (reported) */
    double kv_usage;          /* its own KV utilisation in [0, 1] (reported) */
    double prefill_share;     /* predicted: the share of its time the prefills booked on it take,
                                 their rate over prefill_window at the last tick (the price reads
                                 it as at most KVR_PSHARE_MAX, 0.8); 0 when the window is 0 */
    bool draining;            /* */
    bool approximate;         /* its engine publishes no KV events: learnt from decisions */
};
/* The registered workers, in join order, into out (at most max); returns how many there are. */
uint32_t kvr_router_workers(const struct kvr_router *r, struct kvr_worker_view *out, uint32_t max);

/* Whether worker_id is known and announced that its engine publishes no KV events. */
bool kvr_router_worker_approximate(const struct kvr_router *r, uint64_t worker_id);

/* Predicted load of one worker (for reports and tests). KVR_ERR_UNKNOWN_WORKER if absent. */
kvr_status kvr_router_worker_load(const struct kvr_router *r, uint64_t worker_id,
                                  uint64_t *active_blocks, uint64_t *prefill_tokens,
                                  uint32_t *inflight);

#endif
