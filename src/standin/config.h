/*
 * kvengine's settings: one struct, its defaults set once in kvr_se_config_default (the engine's
 * own from kvr_engine_config_default, as kvworker's), its option table (file < environment <
 * flag, --help, --print-config) and its check. Start-up only.
 */
#ifndef KVR_SE_CONFIG_H
#define KVR_SE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/engine_opts.h"
#include "kvr/status.h"
#include "opts.h"

/* How block hashes go on the wire (--kv-hash). */
enum kvr_se_kv_hash { KVR_SE_HASH_INT, KVR_SE_HASH_UINT, KVR_SE_HASH_BYTES };
/* The event shape (--kv-layout): kvevents.h's KVR_KVEV_LAYOUT_NEW, _OLD, _MAP. */
enum kvr_se_kv_layout { KVR_SE_LAYOUT_NEW, KVR_SE_LAYOUT_OLD, KVR_SE_LAYOUT_MAP };
/* Which engine /metrics plays (--metrics-style). */
enum kvr_se_style { KVR_SE_STYLE_VLLM, KVR_SE_STYLE_SGLANG };
/* The error body (--error-shape): vLLM's older flat one, or {"error": {...}} (vLLM >= 0.10). */
enum kvr_se_error_shape { KVR_SE_ERROR_FLAT, KVR_SE_ERROR_NESTED };

#define KVR_SE_MODEL_MAX 128 /* bytes of --model, NUL included */
#define KVR_SE_DP_MAX    8   /* --dp-size, at most */

struct kvr_se_config {
    char listen[KVR_OPT_STR_MAX];    /* HOST:PORT of the HTTP API; port 0: ephemeral */
    char model[KVR_OPT_STR_MAX];     /* the served model name (printable, < KVR_SE_MODEL_MAX) */
    struct kvr_engine_config engine; /* the simulated engine */
    uint32_t max_model_len;          /* prompt + max_tokens, at most, tokens */
    uint32_t stop_after;             /* a completion asking for more ends after this many tokens
                                        with finish_reason "stop" (an end of sequence); 0: never */
    char kv_events[KVR_OPT_STR_MAX]; /* ZeroMQ PUB endpoint to bind; "": no KV events */
    char kv_replay[KVR_OPT_STR_MAX]; /* ZeroMQ ROUTER endpoint for replays; "": none */
    char kv_topic[KVR_OPT_STR_MAX];  /* the topic frame */
    uint32_t kv_replay_batches;      /* batches the replay ring keeps */
    int kv_hash;                     /* enum kvr_se_kv_hash */
    uint64_t kv_hash_seed;           /* block ids on the wire are mixed with it; 0: a random
                                        one per process (as vLLM's hashes change with a restart) */
    int kv_layout;                   /* enum kvr_se_kv_layout */
    bool kv_hybrid;                  /* KV events of a hybrid model's two groups (batcher.h) */
    int metrics_style;               /* enum kvr_se_style */
    int error_shape;                 /* enum kvr_se_error_shape */
    bool test_hooks;                 /* serve POST /test/... */
    uint32_t max_connections;        /* HTTP connections at once (one thread each) */
    uint32_t max_inflight;           /* completions held at once; more: 503 */
    uint32_t max_body_bytes;         /* a request body, at most; more: 413 */
    uint32_t stream_buffer_bytes;    /* SSE bytes a stream may hold unread; more: aborted */
    uint64_t idle_timeout_ns;        /* an idle HTTP connection is closed after this */
    uint64_t drain_timeout_ns;       /* on SIGTERM, finish what runs within this, then abort */
    int log_level;                   /* enum kvr_log_level */
    uint32_t dp_size;                /* data-parallel ranks, each an engine (pool, KV events) of
                                        its own behind the one HTTP server, as vLLM's
                                        --data-parallel-size with its internal balancer */
    uint32_t dp_rank;                /* not an option: the rank a state plays (kvr_standin sets
                                        it in each rank's copy) */
};

void kvr_se_config_default(struct kvr_se_config *c);

#define KVR_SE_OPTIONS 32
/* The option table over c (which must outlive it) into out[KVR_SE_OPTIONS]; returns its size. */
size_t kvr_se_config_options(struct kvr_se_config *c, struct kvr_opt *out);

/* What the table cannot check; KVR_ERR_INVALID with a sentence in why[0..len). */
kvr_status kvr_se_config_check(const struct kvr_se_config *c, char *why, size_t len);

#endif
