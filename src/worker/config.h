/*
 * The simulated worker's settings: one struct, its defaults set once in kvr_wk_config_default
 * (the engine's own from kvr_engine_config_default), its option table and its validation.
 * Start-up only.
 */
#ifndef KVR_WK_CONFIG_H
#define KVR_WK_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/engine_opts.h"
#include "kvr/status.h"
#include "natscfg.h"
#include "opts.h"

enum kvr_wk_engine_kind {
    KVR_WK_ENGINE_SIM = 0,    /* the simulated engine, in this process */
    KVR_WK_ENGINE_OPENAI = 1, /* the adapter: a real engine behind its OpenAI-compatible API */
};

/* The adapter's settings (--engine openai): the engine's addresses and how it is read. */
struct kvr_wk_adapter_config {
    char url[KVR_OPT_STR_MAX];       /* the engine's base URL, http://host:port */
    char model[KVR_OPT_STR_MAX];     /* the model name; "": the first of its /v1/models */
    char kv_events[KVR_OPT_STR_MAX]; /* its KV-event PUB endpoint; "": it publishes none */
    char kv_replay[KVR_OPT_STR_MAX]; /* its replay ROUTER endpoint; "": none */
    char kv_topic[KVR_OPT_STR_MAX];  /* the topic its batches carry ("": any) */
    uint32_t max_streams;            /* requests in flight to the engine at once */
    uint64_t idle_timeout_ns;        /* a stream silent this long fails (0: never) */
    uint64_t metrics_ns;             /* its /metrics read this often (load, capacity, health) */
    uint64_t events_timeout_ns;      /* requests with full blocks served but no KV batch for this
                                        long: the engine publishes none (say so, learn from
                                        decisions) */
    bool token_ids;                  /* ask for the output's token ids (vLLM's return_token_ids) */
    char dp_rank_text[KVR_OPT_STR_MAX]; /* --engine-dp-rank as given ("": none) */
    int32_t dp_rank; /* from it once checked: the engine's data-parallel rank this worker is
                        (completions pinned to it, its metrics and KV events only); -1: none */
};

struct kvr_wk_config {
    struct kvr_nats_config net;           /* where to connect, the subjects, logs */
    uint64_t id;                          /* worker id, non-zero; 0 until checked: random */
    struct kvr_engine_config engine;      /* the simulated engine (block size: the adapter's too) */
    int engine_kind;                      /* enum kvr_wk_engine_kind */
    struct kvr_wk_adapter_config adapter; /* --engine openai */
    uint32_t max_prompt_tokens;           /* longer prompts refused */
    uint32_t max_output_tokens;           /* larger max_tokens refused */
    uint64_t heartbeat_ns;                /* heartbeat period */
    uint64_t drain_timeout_ns;            /* on SIGTERM, wait this long for the requests held */
    uint64_t event_batch_ns;              /* lifecycle events held this long for one message (0:
                                             each alone) */
    bool null_mode;                       /* answer every request at once */
    char metrics_addr[KVR_OPT_STR_MAX];   /* HOST:PORT of /metrics, /healthz, /readyz ("": none) */
};

void kvr_wk_config_default(struct kvr_wk_config *c);

#define KVR_WK_OPTIONS 32
size_t kvr_wk_config_options(struct kvr_wk_config *c, struct kvr_opt *out);

/* What the table cannot check (a default id is drawn); KVR_ERR_INVALID with why filled. */
kvr_status kvr_wk_config_check(struct kvr_wk_config *c, char *why, size_t len);

#endif
