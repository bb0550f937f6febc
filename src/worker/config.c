/*
 * The simulated worker's settings.
 */
#define _DEFAULT_SOURCE
#include "config.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "httpd.h"
#include "log.h"

void kvr_wk_config_default(struct kvr_wk_config *c)
{
    memset(c, 0, sizeof *c);
    kvr_nats_config_default(&c->net, KVR_LOG_INFO);
    kvr_engine_config_default(&c->engine);
    c->max_prompt_tokens = 1u << 20;
    c->max_output_tokens = 1u << 16;
    c->heartbeat_ns = 500 * KVR_NS_PER_MS; /* routers lose a worker after 3.2 periods: 1.6 s */
    c->drain_timeout_ns = 60 * KVR_NS_PER_S;
}

#define NUM(n, t, p, lo, hi, h)                                                                    \
    {                                                                                              \
        .name = n, .type = t, .ptr = p, .help = h, .min = lo, .max = hi                            \
    }

size_t kvr_wk_config_options(struct kvr_wk_config *c, struct kvr_opt *out)
{
    struct kvr_engine_config *e = &c->engine;
    const struct kvr_opt t[] = {
        {.name = "id",
         .env = "KVR_WORKER_ID",
         .type = KVR_OPT_U64,
         .ptr = &c->id,
         .help = "worker id (non-zero; 0: random)"},
        {.name = "block-size",
         .env = "KVR_BLOCK_SIZE",
         .type = KVR_OPT_U32,
         .ptr = &e->block_size,
         .help = "tokens per KV block",
         .min = 1,
         .max = 65536},
        {.name = "num-blocks",
         .env = "KVR_NUM_BLOCKS",
         .type = KVR_OPT_U32,
         .ptr = &e->num_blocks,
         .help = "KV pool size, blocks",
         .min = 16,
         .max = 1 << 30},
        NUM("max-batched-tokens", KVR_OPT_U32, &e->max_batched_tokens, 1, 1 << 24,
            "tokens per step"),
        NUM("max-seqs", KVR_OPT_U32, &e->max_seqs, 1, 1 << 20, "sequences per step"),
        {.name = "speedup",
         .env = "KVR_SPEEDUP",
         .type = KVR_OPT_DOUBLE,
         .ptr = &e->speedup,
         .help = "engine time is divided by this",
         .min = 1e-3,
         .max = 1e6},
        {.name = "null",
         .env = "KVR_NULL",
         .type = KVR_OPT_BOOL,
         .ptr = &c->null_mode,
         .help = "answer every request at once"},
        NUM("heartbeat-ms", KVR_OPT_MS, &c->heartbeat_ns, 1, 3.6e6,
            "heartbeat period (routers declare the worker lost after 3.2 of them)"),
        NUM("max-prompt-tokens", KVR_OPT_U32, &c->max_prompt_tokens, 1, 1 << 24,
            "longer prompts refused"),
        NUM("max-output-tokens", KVR_OPT_U32, &c->max_output_tokens, 1, 1 << 24,
            "larger max_tokens refused"),
        NUM("drain-timeout-ms", KVR_OPT_MS, &c->drain_timeout_ns, 0, 3.6e6,
            "on SIGTERM, wait this long for the requests held"),
        {.name = "metrics-addr",
         .env = "KVR_METRICS_ADDR",
         .type = KVR_OPT_STR,
         .ptr = c->metrics_addr,
         .help = "serve /metrics, /healthz, /readyz on HOST:PORT (IPv4 or [IPv6]; none: off)"},
    };
    _Static_assert(KVR_NATS_OPTIONS + sizeof t / sizeof t[0] <= KVR_WK_OPTIONS,
                   "KVR_WK_OPTIONS too small");
    size_t n = kvr_nats_config_options(&c->net, out);
    memcpy(out + n, t, sizeof t);
    return n + sizeof t / sizeof t[0];
}

kvr_status kvr_wk_config_check(struct kvr_wk_config *c, char *why, size_t len)
{
    if (!c->id)
        c->id = ((uint64_t)getpid() << 20) ^ (kvr_realtime_ns() & 0xfffff) ^ 1;
    if (c->id > 0x7fffffffffffffffull) { /* it names subjects and travels as a JSON integer */
        snprintf(why, len, "--id must be below 2^63");
        return KVR_ERR_INVALID;
    }
    if (c->metrics_addr[0] && kvr_httpd_check_addr(c->metrics_addr, why, len) != KVR_OK)
        return KVR_ERR_INVALID;
    return kvr_nats_config_check(&c->net, why, len);
}
