/*
 * kvengine's settings.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "httpd.h"
#include "log.h"

void kvr_se_config_default(struct kvr_se_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->listen, sizeof c->listen, "127.0.0.1:8000"); /* vLLM's port */
    snprintf(c->model, sizeof c->model, "kvengine");
    kvr_engine_config_default(&c->engine);
    c->max_model_len = 32768;
    c->kv_replay_batches = 10000; /* vLLM's buffer_steps */
    c->kv_hash = KVR_SE_HASH_UINT;
    c->kv_layout = KVR_SE_LAYOUT_NEW;
    c->max_connections = 128;
    c->max_inflight = 256;
    c->max_body_bytes = 8u << 20;
    c->stream_buffer_bytes = 512u << 10; /* ~2,000 chunks a client may fall behind */
    c->idle_timeout_ns = 60 * KVR_NS_PER_S;
    c->drain_timeout_ns = 5 * KVR_NS_PER_S;
    c->log_level = KVR_LOG_INFO;
    c->dp_size = 1;
}

static const char *const hash_names[] = {"int", "uint", "bytes", NULL};
static const char *const layout_names[] = {"new", "old", "map", NULL};
static const char *const style_names[] = {"vllm", "sglang", NULL};
static const char *const shape_names[] = {"flat", "nested", NULL};

#define NUM(n, t, p, lo, hi, h)                                                                    \
    {                                                                                              \
        .name = n, .type = t, .ptr = p, .help = h, .min = lo, .max = hi                            \
    }
#define CHOICE(n, p, names, h)                                                                     \
    {                                                                                              \
        .name = n, .type = KVR_OPT_ENUM, .ptr = p, .help = h, .choices = names                     \
    }
#define STR(n, e, p, h)                                                                            \
    {                                                                                              \
        .name = n, .env = e, .type = KVR_OPT_STR, .ptr = p, .help = h                              \
    }

size_t kvr_se_config_options(struct kvr_se_config *c, struct kvr_opt *out)
{
    const struct kvr_opt t[] = {
        STR("listen", "KVR_ENGINE_LISTEN", c->listen,
            "serve the HTTP API on HOST:PORT (IPv4 or [IPv6]; port 0: any free one)"),
        STR("model", "KVR_ENGINE_MODEL", c->model, "the model name served"),
        NUM("max-model-len", KVR_OPT_U32, &c->max_model_len, 2, 1 << 24,
            "prompt plus max_tokens, at most (tokens)"),
        NUM("stop-after", KVR_OPT_U32, &c->stop_after, 0, 1 << 24,
            "end a completion asking for more after this many tokens with finish_reason \"stop\", "
            "as a model reaching its end of sequence (0: never: every one runs to max_tokens)"),
        STR("kv-events", "KVR_ENGINE_KV_EVENTS", c->kv_events,
            "bind the KV-event PUB socket here (e.g. tcp://127.0.0.1:5557; empty: no KV events)"),
        STR("kv-replay", "KVR_ENGINE_KV_REPLAY", c->kv_replay,
            "bind the KV-event replay ROUTER socket here (empty: none)"),
        STR("kv-topic", NULL, c->kv_topic, "the topic frame of every KV-event message"),
        NUM("kv-replay-batches", KVR_OPT_U32, &c->kv_replay_batches, 1, 1 << 24,
            "batches the replay socket keeps"),
        CHOICE("kv-hash", &c->kv_hash, hash_names,
               "block hashes on the wire: signed or unsigned integers, or 32-byte strings"),
        NUM("kv-hash-seed", KVR_OPT_U64, &c->kv_hash_seed, 0, 1.8e19,
            "block hashes on the wire are the engine's own mixed with it (0: a random one per "
            "process, so they change with a restart, as vLLM's do)"),
        CHOICE("kv-layout", &c->kv_layout, layout_names,
               "KV event shape: arrays with medium (new), without (old), or maps"),
        {.name = "kv-hybrid",
         .type = KVR_OPT_BOOL,
         .ptr = &c->kv_hybrid,
         .help = "KV events as vLLM serving a hybrid model sends them: each block stored by a "
                 "sliding-window group 0, which removes it at once, and a full-attention group 1 "
                 "(needs --kv-layout map)"},
        CHOICE("metrics-style", &c->metrics_style, style_names,
               "which engine /metrics names follow (sglang adds /get_server_info)"),
        CHOICE("error-shape", &c->error_shape, shape_names,
               "error bodies: {\"object\":\"error\",...} (flat) or {\"error\":{...}} (nested)"),
        {.name = "test-hooks",
         .type = KVR_OPT_BOOL,
         .ptr = &c->test_hooks,
         .help = "serve POST /test/drop_batches, /test/stall, /test/clear"},
        NUM("max-connections", KVR_OPT_U32, &c->max_connections, 2, 4096,
            "HTTP connections at once (one thread each)"),
        NUM("max-inflight", KVR_OPT_U32, &c->max_inflight, 1, 1 << 16,
            "completions held at once (more are answered 429)"),
        NUM("max-body-bytes", KVR_OPT_U32, &c->max_body_bytes, 1024, 1 << 28,
            "a request body, at most (more: 413)"),
        NUM("stream-buffer-bytes", KVR_OPT_U32, &c->stream_buffer_bytes, 4096, 1 << 28,
            "event-stream bytes a client may leave unread before its request is aborted"),
        NUM("idle-timeout-ms", KVR_OPT_MS, &c->idle_timeout_ns, 1000, 3.6e6,
            "an idle HTTP connection is closed after this"),
        NUM("drain-timeout-ms", KVR_OPT_MS, &c->drain_timeout_ns, 0, 3.6e6,
            "on SIGTERM, let requests finish this long, then abort them"),
        NUM("dp-size", KVR_OPT_U32, &c->dp_size, 1, KVR_SE_DP_MAX,
            "data-parallel ranks (vLLM's --data-parallel-size, internal balancing): each its own "
            "engine and KV pool, its KV events on --kv-events' port + rank, its /metrics series "
            "labelled engine=\"rank\"; a request's X-data-parallel-rank picks one"),
        {.name = "log-level",
         .env = "KVR_LOG_LEVEL",
         .type = KVR_OPT_ENUM,
         .ptr = &c->log_level,
         .help = "least severe level logged",
         .choices = kvr_log_level_names},
    };
    _Static_assert(KVR_ENGINE_OPTIONS + sizeof t / sizeof t[0] <= KVR_SE_OPTIONS,
                   "KVR_SE_OPTIONS too small");
    size_t n = kvr_engine_options(&c->engine, out);
    memcpy(out + n, t, sizeof t);
    return n + sizeof t / sizeof t[0];
}

static bool printable(const char *s)
{
    for (; *s; s++)
        if (*s < 0x20 || *s > 0x7e)
            return false;
    return true;
}

kvr_status kvr_se_config_check(const struct kvr_se_config *c, char *why, size_t len)
{
    const char *bad = NULL;
    if (!c->model[0] || strlen(c->model) >= KVR_SE_MODEL_MAX || !printable(c->model))
        bad = "--model must be 1..127 printable ASCII characters";
    else if (c->kv_replay[0] && !c->kv_events[0])
        bad = "--kv-replay needs --kv-events";
    else if (c->kv_topic[0] && !c->kv_events[0])
        bad = "--kv-topic needs --kv-events";
    else if (c->kv_hybrid && c->kv_layout != KVR_SE_LAYOUT_MAP)
        bad = "--kv-hybrid needs --kv-layout map (vLLM's KV cache groups in map events)";
    else if (c->dp_size < 1 || c->dp_size > KVR_SE_DP_MAX)
        bad = "--dp-size must be 1..8";
    else if (c->dp_size > 1 && c->metrics_style != KVR_SE_STYLE_VLLM)
        bad = "--dp-size plays vLLM's data parallelism: it needs --metrics-style vllm";
    if (bad) {
        snprintf(why, len, "%s", bad);
        return KVR_ERR_INVALID;
    }
    return kvr_httpd_check_addr(c->listen, why, len);
}
