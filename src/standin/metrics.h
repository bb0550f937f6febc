/*
 * kvengine's /metrics: the load and capacity families under a real engine's names (vLLM's
 * vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc,
 * vllm:cache_config_info{block_size, num_gpu_blocks}, vllm:prefix_cache_queries_total,
 * vllm:prefix_cache_hits_total, ...; or SGLang's sglang:num_running_reqs, sglang:num_queue_reqs,
 * sglang:token_usage, sglang:cache_hit_rate), labelled model_name (and engine="<rank>" for vLLM),
 * then kvengine's own kvengine_* families (requests by outcome, refusals by status, KV events,
 * the publisher, the server side's time to first token). Written with src/base/prom.h; pure,
 * from a snapshot taken under the state's mutex.
 *
 * Engine names contain ':' (a real engine's do); promtool check metrics reports each of them as
 * "metric names should not contain ':'", exactly as it does for a real vLLM's /metrics.
 */
#ifndef KVR_SE_METRICS_H
#define KVR_SE_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "../engine/engine.h"
#include "buf.h"
#include "config.h"
#include "kvzmq.h"
#include "prom.h"

/* The HTTP statuses kvengine refuses with, in the order of kvr_se_counters.refused. */
#define KVR_SE_REFUSAL_CODES 9
extern const unsigned kvr_se_refusal_codes[KVR_SE_REFUSAL_CODES]; /* 400, ..., 503 */

/* What the state counts (under its mutex). */
struct kvr_se_counters {
    uint64_t requests;          /* completions accepted */
    uint64_t finished;          /* ended with all their tokens */
    uint64_t stopped;           /* ... of them, at --stop-after (finish_reason "stop") */
    uint64_t aborted;           /* cancelled in the engine: the client closed its connection */
    uint64_t shutdown;          /* aborted by the drain */
    uint64_t overflows;         /* aborted: the client did not read its stream */
    uint64_t prompt_tokens;     /* of the completions accepted */
    uint64_t generation_tokens; /* tokens produced */
    uint64_t prefix_queries;    /* prompt tokens looked up in the prefix cache (at prefill) */
    uint64_t prefix_hits;       /* of which found cached */
    uint64_t steps;             /* engine steps run */
    uint64_t stalls;            /* /test/stall calls */
    uint64_t drops;             /* batches /test/drop_batches asked to drop */
    uint64_t clears;            /* /test/clear calls that cleared */
    uint64_t oom;               /* chunks or events not made: out of memory */
    uint64_t engine_base[2];    /* preemptions and cancels of the engines a clear replaced */
    uint64_t refused[KVR_SE_REFUSAL_CODES]; /* answers >= 400 by status (kvr_se_status_index) */
    struct kvr_prom_hist ttft;              /* submission to first token, engine side */
};

/* What the exposition shows, taken at once. */
struct kvr_se_snapshot {
    const struct kvr_se_config *cfg; /* borrowed */
    struct kvr_engine_stats engine;  /* the engine's figures */
    struct kvr_se_counters c;        /* the state's */
    uint32_t held;                   /* requests the engine holds */
    uint32_t blocks;                 /* block table entries */
    uint32_t blocks_cached;          /* of which cached in the engine */
    uint64_t untracked;              /* kvr_se_blocks counters */
    uint64_t unknown_removed;        /* */
    uint64_t kv_batches, kv_events;  /* kvr_se_batcher counters */
    uint64_t kv_failed, kv_dropped;  /* */
    bool draining;                   /* */
    bool has_pub;                    /* KV events configured: pub is set */
    struct kvr_kvpub_stats pub;      /* the publisher's counters */
};

/* Append the exposition of s[0..n) to out, one snapshot per data-parallel rank (1..
 * KVR_SE_DP_MAX, in rank order): vLLM's families have a sample per rank, kvengine's own and
 * SGLang's are s[0]'s. KVR_OK, or the writer's error (out then partial). */
kvr_status kvr_se_metrics_write(const struct kvr_se_snapshot *s, uint32_t n, struct kvr_buf *out);

#endif
