/*
 * kvengine's /metrics: the load and capacity families under a real engine's names (vLLM's
 * vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc,
 * vllm:cache_config_info{block_size, num_gpu_blocks}, vllm:prefix_cache_queries_total,
 * vllm:prefix_cache_hits_total, ...; or SGLang's sglang:num_running_reqs, sglang:num_queue_reqs,
 * sglang:token_usage, sglang:cache_hit_rate), labelled model_name (and engine="0" for vLLM),
 * then kvengine's own kvengine_* families (requests by outcome, refusals by status, KV events,
 * the publisher, the server side's time to first token). Written with src/base/prom.h; pure,
 * from a snapshot taken under the state's mutex.
 *
 * Engine names contain ':' (a real engine's do), which kvr_prom refuses in a name: the engine
 * families are written under an '_' and that one character is put back afterwards (their lines
 * are ours, so the rewrite is exact). promtool check metrics reports each of them as "metric
 * names should not contain ':'", exactly as it does for a real vLLM's /metrics.
 */
#ifndef KVR_SE_METRICS_H
#define KVR_SE_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "../engine/engine.h"
#include "buf.h"
#include "config.h"
#include "kvzmq.h"
#include "state.h"

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

/* Append the exposition of s to out. KVR_OK, or the writer's error (out then partial). */
kvr_status kvr_se_metrics_write(const struct kvr_se_snapshot *s, struct kvr_buf *out);

#endif
