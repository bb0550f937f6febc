/*
 * kvr_sim: the discrete-event simulator behind `kvsim run`. It runs the routing core and N
 * simulated engines in virtual time: requests arrive (open loop from the workload's times divided
 * by a rate scale, or closed loop with C clients), the router decides and books, the engine of the
 * chosen worker runs its steps, and everything the engine publishes (KV events, prefill done,
 * output blocks, done) reaches the router through the same entry points the NATS router uses,
 * after an event delay that models the network. In approximate mode (router.approximate) the
 * engines' KV events are withheld, as from engines that publish none: the router learns each
 * worker's cache from its own decisions (with the index TTL); lifecycle events still flow. Workers
 * heartbeat their load every heartbeat period; at each heartbeat the router's predicted active
 * blocks are compared with the blocks the engine really holds, so the prediction error is measured.
 * Deterministic for a seed. Pure: no I/O, no clock.
 *
 * Router replicas: with replicas > 1 the requests are shared among that many routers, each its own
 * kvr_router, as a NATS queue group shares them (a seeded random draw per request). Every replica
 * receives every engine event. With gossip, each booking a replica makes (a route, or a queued
 * request placed) is exported and imported by every other replica gossip_delay_ns later, as
 * kvrouter's gossip does; without it a replica knows only its own decisions. One replica is the
 * single router, whatever the gossip setting.
 */
#ifndef KVR_SIM_H
#define KVR_SIM_H

#include <stdbool.h>
#include <stdint.h>

#include "../engine/engine.h"
#include "kvr/router.h"
#include "stats.h"
#include "workload.h"

#define KVR_SIM_MAX_REPLICAS 64 /* bound on kvr_sim_config.replicas */

struct kvr_sim_config {
    uint32_t workers;                /* engines */
    struct kvr_engine_config engine; /* each engine's parameters */
    struct kvr_router_config router; /* the router's (policy, block size, ...) */
    uint64_t event_delay_ns;         /* engine -> router delivery delay */
    uint64_t heartbeat_ns;           /* load reports and prediction samples */
    double rate_scale;               /* open loop: arrival rate factor */
    uint32_t concurrency;            /* closed loop: clients */
    void (*progress)(void *ctx, uint32_t resolved, uint32_t total, uint64_t now_ns);
    void *progress_ctx;         /* */
    uint32_t replicas;          /* routers sharing the requests; 0 counts as 1 */
    bool gossip;                /* replicas import each other's decisions */
    uint64_t gossip_delay_ns;   /* a booking -> its import by the other replicas */
    bool per_request;           /* keep a kvr_sim_request per finished request in the result */
    uint32_t client_max_tokens; /* the max_tokens every client sends (outputs are cut to it);
                                   0: each request's own output length */
};

/* Fill c with kvsim run's defaults: 8 workers, the engine's and the router's defaults, event delay
 * 1 ms, heartbeat 100 ms, rate scale 1, 20 clients, one router, gossip on with a 1 ms delay. */
void kvr_sim_config_default(struct kvr_sim_config *c);

/* One finished request (kvr_sim_config.per_request; kvbench --per-request fills the same).
 * Times are ms from the run's start, virtual in kvsim; a figure kvbench cannot see is NaN (and
 * preemptions KVR_SIM_UNKNOWN). */
struct kvr_sim_request {
    uint32_t index;         /* in the workload, from 0 */
    uint64_t worker;        /* kvsim: the engine that served it, from 0; kvbench: its worker id */
    uint64_t group;         /* its prefix: generated workloads, the family; traces, the first hash
                               id (KVR_SIM_NO_GROUP: a trace record without one) */
    uint32_t isl, osl;      /* prompt and output tokens */
    uint32_t cached_tokens; /* prompt tokens the engine found cached at admission */
    uint32_t preemptions;   /* times the engine preempted it */
    double arrival_ms;      /* reached the router */
    double queue_ms;        /* arrival -> first scheduled by the engine */
    double ttft_ms;         /* arrival -> first token */
    double e2e_ms;          /* arrival -> last token */
    double itl_mean_ms;     /* its mean inter-token gap (0 with one output token) */
    double itl_max_ms;      /* its largest gap */
};

#define KVR_SIM_NO_GROUP UINT64_MAX
#define KVR_SIM_UNKNOWN  UINT32_MAX

struct kvr_sim_result {
    enum kvr_policy policy;
    double load;             /* the rate scale or the concurrency */
    uint32_t requests;       /* issued */
    uint32_t finished;       /* completed */
    uint32_t rejected;       /* refused by the router */
    uint32_t failed;         /* refused by their worker before its engine saw them: prompt and
                                output can never be in one engine's KV pool at once (kvworker
                                refuses them so, ERR_FULL; sim.c) */
    uint64_t failed_blocks;  /* the most KV blocks one of them needed (0: none failed) */
    struct kvr_stat ttft_ms; /* arrival at the router -> first token */
    struct kvr_stat itl_ms;  /* every inter-token gap, pooled: a long output weighs more */
    struct kvr_stat itl_request_ms; /* each request's mean inter-token gap (requests of two output
                                       tokens or more): the per-request ITL */
    struct kvr_stat e2e_ms;         /* arrival -> last token */
    struct kvr_stat queue_ms;       /* arrival -> first scheduled by the engine */
    double *ttft_sorted;            /* finished TTFTs, ascending (for distributions), owned */
    double hit_rate;                /* cached prompt tokens / prompt tokens, at the engines */
    double throughput_tok_s;        /* output tokens / makespan */
    double makespan_s;              /* first arrival -> last completion */
    double imbalance;               /* max / mean of requests per worker */
    uint64_t preemptions;           /* across engines */
    uint64_t evictions;             /* cached blocks evicted, across engines */
    double pred_err_blocks;         /* mean |predicted - actual| active blocks per worker sample */
    double pred_err_rel;            /* the same over the mean actual active blocks */
    uint64_t router_unknown;        /* events the routers did not recognise (should stay 0; with
                                       replicas, early events are counted apart) */
    uint64_t index_entries_max;     /* largest index seen (at heartbeats) */
    uint64_t router_memory_max;     /* largest router memory seen, bytes */
    uint32_t index_bound;       /* the index's bound at the end (set or from the fleet), entries */
    uint64_t index_pruned;      /* index entries pruned to keep the bound, over the replicas */
    uint64_t index_pruned_live; /* ... of which event entries: blocks the engines still held */
    uint64_t kv_applied;        /* KV event blocks the routers applied (stored + removed) */
    uint64_t kv_ignored;        /* KV events the routers dropped (approximate; should stay 0:
                                   the simulator withholds them) */
    /* router replicas (the gossip counters stay zero with one router) */
    uint32_t replicas;         /* routers that shared the requests */
    bool gossip;               /* they imported each other's decisions */
    uint64_t decisions;        /* bookings (each request once, by the replica that routed it) */
    uint64_t gossip_msgs;      /* decisions published to the other replicas */
    uint64_t gossip_bytes;     /* their wire size as kvrouter's Gossip message (sim.c) */
    uint64_t gossip_imports;   /* decisions a replica imported */
    uint64_t early_events;     /* events a replica got before (or without) their decision */
    uint64_t late_decisions;   /* imports refused: the request's done came first */
    double pred_err_rel_worst; /* pred_err_rel of the replica that predicted worst */
    struct kvr_sim_request *per_request; /* finished requests (as many as finished): kvsim's in
                                            the order they finished, kvbench's in the workload's;
                                            NULL unless asked; owned */
};

/*
 * Run one simulation. out is filled (free it with kvr_sim_result_free). KVR_ERR_TIMEOUT when the
 * run stopped with requests unresolved, nothing left to happen (no event due, no router queue: the
 * engines holding them will never run them); out then has only requests, finished, rejected and
 * failed, how far it got (nothing to free).
 */
kvr_status kvr_sim_run(const struct kvr_workload *w, const struct kvr_sim_config *cfg,
                       struct kvr_sim_result *out);
void kvr_sim_result_free(struct kvr_sim_result *r);

/*
 * Prefix-cache hit rate (cached prompt tokens / prompt tokens) of the workload's prompts replayed
 * in order through one LRU cache of capacity_blocks blocks (0: unbounded), at block size B: the
 * ceiling no router can beat (unbounded), or what one engine holding every worker's capacity would
 * reach. KVR_ERR_FULL past 2^32 - 2 distinct blocks, KVR_ERR_PROMPT_TOO_LONG for a prompt of
 * 2^32 - 1 blocks (their counts are 32-bit), KVR_ERR_NOMEM.
 */
kvr_status kvr_sim_hit_ceiling(const struct kvr_workload *w, uint32_t block_size,
                               uint64_t capacity_blocks, double *out);

#endif
