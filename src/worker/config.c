/*
 * The simulated worker's settings.
 */
#define _DEFAULT_SOURCE
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
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
    struct kvr_wk_adapter_config *a = &c->adapter;
    snprintf(a->url, sizeof a->url, "http://127.0.0.1:8000");
    a->max_streams = 1024;
    a->idle_timeout_ns = 600 * KVR_NS_PER_S;
    a->metrics_ns = 1 * KVR_NS_PER_S;
    a->events_timeout_ns = 30 * KVR_NS_PER_S;
    a->token_ids = true;
    a->dp_rank = -1;
}

#define NUM(n, t, p, lo, hi, h)                                                                    \
    {                                                                                              \
        .name = n, .type = t, .ptr = p, .help = h, .min = lo, .max = hi                            \
    }

static const char *const engine_kinds[] = {"sim", "openai", NULL};

/* The adapter's options (a group: listed after the worker's own). */
static size_t adapter_options(struct kvr_wk_config *c, struct kvr_opt *out)
{
    struct kvr_wk_adapter_config *a = &c->adapter;
    const struct kvr_opt t[] = {
        {.name = "engine-url",
         .env = "KVR_ENGINE_URL",
         .type = KVR_OPT_STR,
         .ptr = a->url,
         .help = "--engine openai: the engine's OpenAI-compatible server, http://HOST:PORT",
         .urls = true},
        {.name = "engine-model",
         .env = "KVR_ENGINE_MODEL",
         .type = KVR_OPT_STR,
         .ptr = a->model,
         .help = "the model name to ask for (none: the first of the engine's /v1/models)"},
        {.name = "kv-events",
         .env = "KVR_KV_EVENTS",
         .type = KVR_OPT_STR,
         .ptr = a->kv_events,
         .help = "the engine's KV-event ZeroMQ PUB endpoint, tcp://HOST:PORT (none: it "
                 "publishes none, and routers learn its cache from their decisions)"},
        {.name = "kv-replay",
         .env = "KVR_KV_REPLAY",
         .type = KVR_OPT_STR,
         .ptr = a->kv_replay,
         .help = "the engine's KV-event replay ROUTER endpoint (none: gaps cannot be filled)"},
        {.name = "kv-topic",
         .env = "KVR_KV_TOPIC",
         .type = KVR_OPT_STR,
         .ptr = a->kv_topic,
         .help = "the topic of the engine's KV-event batches (none: any)"},
        NUM("engine-max-streams", KVR_OPT_U32, &a->max_streams, 1, 65536,
            "requests in flight to the engine at once"),
        NUM("engine-idle-timeout-ms", KVR_OPT_MS, &a->idle_timeout_ns, 0, 3.6e6,
            "a stream from the engine silent this long fails (0: never)"),
        NUM("engine-metrics-ms", KVR_OPT_MS, &a->metrics_ns, 50, 60000,
            "read the engine's /metrics (load, capacity, health) this often"),
        NUM("kv-events-timeout-ms", KVR_OPT_MS, &a->events_timeout_ns, 100, 3.6e6,
            "no KV batch this long while requests with full blocks are served: the engine "
            "publishes none"),
        {.name = "engine-dp-rank",
         .env = "KVR_ENGINE_DP_RANK",
         .type = KVR_OPT_STR,
         .ptr = a->dp_rank_text,
         .help = "the engine's data-parallel rank this worker is, 0..65535 (vLLM "
                 "--data-parallel-size behind one server): completions pinned to it "
                 "(X-data-parallel-rank), its /metrics series (engine=\"N\") and KV batches "
                 "only (none: the whole engine is one worker)"},
        {.name = "engine-token-ids",
         .env = "KVR_ENGINE_TOKEN_IDS",
         .type = KVR_OPT_BOOL,
         .ptr = &a->token_ids,
         .help = "ask the engine for the output's token ids (vLLM's return_token_ids)"},
    };
    memcpy(out, t, sizeof t);
    return sizeof t / sizeof t[0];
}

size_t kvr_wk_config_options(struct kvr_wk_config *c, struct kvr_opt *out)
{
    const struct kvr_opt t[] = {
        {.name = "id",
         .env = "KVR_WORKER_ID",
         .type = KVR_OPT_U64,
         .ptr = &c->id,
         .help = "worker id (non-zero; 0: random)"},
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
        NUM("event-batch-ms", KVR_OPT_MS, &c->event_batch_ns, 0, 20,
            "hold the requests' lifecycle events this long and send them as one EventBatch "
            "(fewer messages for the routers; every router must know EventBatch; 0: each alone)"),
        {.name = "engine",
         .env = "KVR_ENGINE",
         .type = KVR_OPT_ENUM,
         .ptr = &c->engine_kind,
         .choices = engine_kinds,
         .help = "the engine: sim (simulated, in this process) or openai (the adapter: a real "
                 "engine at --engine-url)"},
        {.name = "metrics-addr",
         .env = "KVR_METRICS_ADDR",
         .type = KVR_OPT_STR,
         .ptr = c->metrics_addr,
         .help = "serve /metrics, /healthz, /readyz on HOST:PORT (IPv4 or [IPv6]; none: off)"},
    };
    _Static_assert(KVR_NATS_OPTIONS + KVR_ENGINE_OPTIONS + sizeof t / sizeof t[0] + 11 <=
                       KVR_WK_OPTIONS,
                   "KVR_WK_OPTIONS too small");
    size_t n = kvr_nats_config_options(&c->net, out);
    n += kvr_engine_options(&c->engine, out + n);
    memcpy(out + n, t, sizeof t);
    n += sizeof t / sizeof t[0];
    return n + adapter_options(c, out + n);
}

/* --engine-dp-rank: "" (none, -1) or a decimal 0..65535 (vLLM names an engine core by 2
 * bytes). */
static kvr_status check_dp_rank(struct kvr_wk_config *c, char *why, size_t len)
{
    struct kvr_wk_adapter_config *a = &c->adapter;
    const char *t = a->dp_rank_text;
    size_t n = strspn(t, "0123456789");
    a->dp_rank = -1;
    if (!t[0])
        return KVR_OK;
    if (c->engine_kind != KVR_WK_ENGINE_OPENAI) {
        snprintf(why, len, "--engine-dp-rank is for --engine openai");
        return KVR_ERR_INVALID;
    }
    if (n == 0 || n > 5 || t[n] || strtol(t, NULL, 10) > 65535) {
        snprintf(why, len, "--engine-dp-rank must be a data-parallel rank, 0..65535");
        return KVR_ERR_INVALID;
    }
    a->dp_rank = (int32_t)strtol(t, NULL, 10);
    return KVR_OK;
}

kvr_status kvr_wk_config_check(struct kvr_wk_config *c, char *why, size_t len)
{
    if (check_dp_rank(c, why, len) != KVR_OK)
        return KVR_ERR_INVALID;
    if (!c->id)
        c->id = ((uint64_t)getpid() << 20) ^ (kvr_realtime_ns() & 0xfffff) ^ 1;
    if (c->id > 0x7fffffffffffffffull) { /* it names subjects and travels as a JSON integer */
        snprintf(why, len, "--id must be below 2^63");
        return KVR_ERR_INVALID;
    }
    if (c->metrics_addr[0] && kvr_httpd_check_addr(c->metrics_addr, why, len) != KVR_OK)
        return KVR_ERR_INVALID;
    const struct kvr_wk_adapter_config *a = &c->adapter;
    if (c->engine_kind == KVR_WK_ENGINE_OPENAI) {
        if (strncmp(a->url, "http://", 7) && strncmp(a->url, "https://", 8)) {
            snprintf(why, len, "--engine-url must be http://HOST:PORT or https://HOST:PORT");
            return KVR_ERR_INVALID;
        }
        if (c->null_mode) {
            snprintf(why, len, "--null is for the simulated engine, not --engine openai");
            return KVR_ERR_INVALID;
        }
        const char *ep[] = {a->kv_events, a->kv_replay};
        for (int i = 0; i < 2; i++)
            if (ep[i][0] && strncmp(ep[i], "tcp://", 6) && strncmp(ep[i], "ipc://", 6)) {
                snprintf(why, len, "--%s must be tcp://HOST:PORT or ipc://PATH",
                         i ? "kv-replay" : "kv-events");
                return KVR_ERR_INVALID;
            }
    }
    return kvr_nats_config_check(&c->net, why, len);
}
