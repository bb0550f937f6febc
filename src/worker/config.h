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

#include "../engine/engine.h"
#include "kvr/status.h"
#include "natscfg.h"
#include "opts.h"

struct kvr_wk_config {
    struct kvr_nats_config net;         /* where to connect, the subjects, logs */
    uint64_t id;                        /* worker id, non-zero; 0 until checked: random */
    struct kvr_engine_config engine;    /* the simulated engine */
    uint32_t max_prompt_tokens;         /* longer prompts refused */
    uint32_t max_output_tokens;         /* larger max_tokens refused */
    uint64_t heartbeat_ns;              /* heartbeat period */
    uint64_t drain_timeout_ns;          /* on SIGTERM, wait this long for the requests held */
    bool null_mode;                     /* answer every request at once */
    char metrics_addr[KVR_OPT_STR_MAX]; /* HOST:PORT of /metrics, /healthz, /readyz ("": none) */
};

void kvr_wk_config_default(struct kvr_wk_config *c);

#define KVR_WK_OPTIONS 20
size_t kvr_wk_config_options(struct kvr_wk_config *c, struct kvr_opt *out);

/* What the table cannot check (a default id is drawn); KVR_ERR_INVALID with why filled. */
kvr_status kvr_wk_config_check(struct kvr_wk_config *c, char *why, size_t len);

#endif
