/*
 * The router daemon's settings.
 */
#define _DEFAULT_SOURCE
#include "config.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "codec.h"
#include "httpd.h"
#include "kvr/policy.h"
#include "log.h"
#include "subject.h"

#define POLICY_NAME(e, name, desc) name,
static const char *const policy_names[] = {KVR_POLICY_LIST(POLICY_NAME) NULL};
#undef POLICY_NAME
static const char *const cost_names[] = {"blocks", "time", NULL}; /* enum kvr_cost_model */

/*
 * The core's report that the prefix index pruned entries the engines still hold (lost cache
 * hits), at most once per index_warn_ns (60 s): what, and how to raise the bound.
 */
static void index_warn(void *ctx, uint64_t pruned, uint32_t max_entries, bool from_fleet)
{
    (void)ctx;
    kvr_log(KVR_LOG_WARN, "index_pruned_live",
            "pruned=%llu max_entries=%u from_fleet=%s hint=\"the prefix index is full: raise "
            "--index-max-entries above %u (0: sized from the workers' announced capacity)\"",
            (unsigned long long)pruned, max_entries, from_fleet ? "true" : "false", max_entries);
}

void kvr_rd_config_default(struct kvr_rd_config *c)
{
    memset(c, 0, sizeof *c);
    kvr_nats_config_default(&c->net, KVR_LOG_INFO);
    kvr_router_config_default(&c->core);
    c->core.seed = 0; /* a daemon draws its seed from the clock; a simulation is reproducible */
    c->core.tie_margin = KVR_TIE_MARGIN; /* routers share the requests: see router.h */
    /* a worker that announces no heartbeat interval is dropped after this much silence (one that
     * does: after 3.2 of its intervals); the simulator never drops a worker */
    c->core.worker_timeout_ns = 3200 * KVR_NS_PER_MS;
    c->core.index_warn = index_warn; /* the simulator reports its pruning instead */
    c->max_output_tokens = 1u << 16;
    c->tick_ns = 20 * KVR_NS_PER_MS;
    c->warmup_ns = 2 * KVR_NS_PER_S;
    c->hello_ns = 1 * KVR_NS_PER_S;
    c->sync_timeout_ns = 1 * KVR_NS_PER_S;
    c->kv_replay_ns = 1 * KVR_NS_PER_S; /* longer than a peer should take to apply what we have */
    c->drain_timeout_ns = c->core.queue_timeout_ns + KVR_NS_PER_S;
    c->booking_ttl_ns = 10 * KVR_NS_PER_S;
    c->crossing_ns = 3 * KVR_NS_PER_S;
    /* an interval from the wire neither keeps a phantom worker for good nor drops a live one at
     * once (a worker is lost after 3.2 intervals; a known one's timeout never shrinks) */
    c->heartbeat_min_ns = 50 * KVR_NS_PER_MS;
    c->heartbeat_max_ns = 10 * KVR_NS_PER_S;
    c->gossip = true;
}

#define STR(n, e, p, h)                                                                            \
    {                                                                                              \
        .name = n, .env = e, .type = KVR_OPT_STR, .ptr = p, .help = h                              \
    }
#define NUM(n, t, p, lo, hi, h)                                                                    \
    {                                                                                              \
        .name = n, .type = t, .ptr = p, .help = h, .min = lo, .max = hi                            \
    }
#define ENV_NUM(n, e, t, p, lo, hi, h)                                                             \
    {                                                                                              \
        .name = n, .env = e, .type = t, .ptr = p, .help = h, .min = lo, .max = hi                  \
    }
#define FLAG(n, e, p, h)                                                                           \
    {                                                                                              \
        .name = n, .env = e, .type = KVR_OPT_BOOL, .ptr = p, .help = h                             \
    }

#define KVR_CORE_OPTIONS 17

/* The routing core's options (policy, weights, bounds) into out (KVR_CORE_OPTIONS entries). */
static size_t core_options(struct kvr_router_config *k, struct kvr_opt *out)
{
    const struct kvr_opt t[] = {
        {.name = "block-size",
         .env = "KVR_BLOCK_SIZE",
         .type = KVR_OPT_U32,
         .ptr = &k->block_size,
         .help = "tokens per KV block",
         .min = 1,
         .max = 65536},
        {.name = "policy",
         .env = "KVR_POLICY",
         .type = KVR_OPT_ENUM,
         .ptr = &k->policy,
         .help = "default policy",
         .choices = policy_names},
        {.name = "kv-cost",
         .type = KVR_OPT_ENUM,
         .ptr = &k->cost_model,
         .help = "how kv prices a worker",
         .choices = cost_names},
        NUM("overlap-weight", KVR_OPT_DOUBLE, &k->overlap_weight, 0, 1e6, "kv: weight of reuse"),
        NUM("cache-weight", KVR_OPT_DOUBLE, &k->cache_weight, 0, 1e6, "kv: recompute charge"),
        NUM("stall-weight", KVR_OPT_DOUBLE, &k->stall_weight, 0, 1e6, "kv: decode stall charge"),
        NUM("decode-weight", KVR_OPT_DOUBLE, &k->decode_weight, 0, 1e6,
            "kv, time: own decode (the output expected of max_tokens)"),
        FLAG("learn-output", NULL, &k->learn_output,
             "kv, time: price max_tokens at the share of it that like requests generated"),
        NUM("prefill-window-s", KVR_OPT_SEC, &k->prefill_window_ns, 0, 3600,
            "kv, time: a worker's decode is slowed by the share of its time its prefills took "
            "over about this long (0: not priced; else at least 0.01)"),
        NUM("engine-speedup", KVR_OPT_DOUBLE, &k->engine_speedup, KVR_ENGINE_SPEEDUP_MIN,
            KVR_ENGINE_SPEEDUP_MAX,
            "the engines run this many times faster than the timing model (simulated workers' "
            "--speedup)"),
        NUM("share-weight", KVR_OPT_DOUBLE, &k->share_weight, 0, 1e6, "kv: shared recompute"),
        NUM("temperature", KVR_OPT_DOUBLE, &k->temperature, 0, 1e6, "kv: 0 cheapest, > 0 samples"),
        NUM("tie-margin", KVR_OPT_DOUBLE, &k->tie_margin, 0, 1, "kv: pick among near-least"),
        NUM("busy-threshold", KVR_OPT_DOUBLE, &k->busy_threshold, 0, 1e6,
            "skip workers above this fraction of their KV capacity (0: off)"),
        FLAG("approximate", "KVR_APPROXIMATE", &k->approximate,
             "workers publish no KV events: learn from decisions"),
        ENV_NUM("index-max-entries", "KVR_INDEX_MAX_ENTRIES", KVR_OPT_U32, &k->index_max_entries, 0,
                2147483648.0,
                "bound on prefix-index entries (0: the workers' announced capacity x 1.25, at "
                "least 1048576, at most 16777216)"),
        NUM("max-prompt-tokens", KVR_OPT_U32, &k->max_prompt_tokens, 1, 1 << 24,
            "longer prompts refused"),
    };
    _Static_assert(sizeof t / sizeof t[0] == KVR_CORE_OPTIONS, "KVR_CORE_OPTIONS");
    memcpy(out, t, sizeof t);
    return sizeof t / sizeof t[0];
}

size_t kvr_rd_config_options(struct kvr_rd_config *c, struct kvr_opt *out)
{
    struct kvr_router_config *k = &c->core;
    const struct kvr_opt t[] = {
        STR("id", "KVR_ROUTER_ID", c->id, "router id (none: host-pid)"),
        NUM("max-output-tokens", KVR_OPT_U32, &c->max_output_tokens, 1, 1 << 24,
            "larger max_tokens refused"),
        NUM("queue-max", KVR_OPT_U32, &k->queue_max, 0, 1 << 24,
            "requests that may wait for a worker"),
        NUM("queue-timeout-ms", KVR_OPT_MS, &k->queue_timeout_ns, 0, 3.6e6,
            "then they get 'overloaded'"),
        NUM("worker-timeout-ms", KVR_OPT_MS, &k->worker_timeout_ns, 0, 3.6e6,
            "a silent worker that announced no interval is removed after this"),
        NUM("request-ttl-s", KVR_OPT_SEC, &k->request_ttl_ns, 1, 864000,
            "stale in-flight requests dropped"),
        NUM("seed", KVR_OPT_U64, &k->seed, 0, 0, "seeds random choices (0: from the clock)"),
        NUM("tick-ms", KVR_OPT_MS, &c->tick_ns, 1, 60000, "housekeeping period"),
        NUM("warmup-ms", KVR_OPT_MS, &c->warmup_ns, 0, 3.6e6,
            "at start, listen this long (at most) for workers before taking requests"),
        FLAG("gossip", "KVR_GOSSIP", &c->gossip,
             "share decisions with the other routers (--gossip=false: on its own)"),
        NUM("hello-ms", KVR_OPT_MS, &c->hello_ns, 1, 3.6e6, "period of the hello to the peers"),
        NUM("sync-timeout-ms", KVR_OPT_MS, &c->sync_timeout_ns, 1, 3.6e6,
            "at start, wait this long (twice at most) for a peer's snapshot"),
        NUM("drain-timeout-ms", KVR_OPT_MS, &c->drain_timeout_ns, 0, 3.6e6,
            "on SIGTERM, settle queued requests for at most this long"),
        NUM("heartbeat-min-ms", KVR_OPT_MS, &c->heartbeat_min_ns, 1, 3.6e6,
            "a worker announcing a shorter heartbeat interval is judged by this one"),
        NUM("heartbeat-max-ms", KVR_OPT_MS, &c->heartbeat_max_ns, 1, 3.6e6,
            "... and one announcing a longer interval by this one"),
        NUM("booking-ttl-ms", KVR_OPT_MS, &c->booking_ttl_ns, 1, 3.6e6,
            "a booked select that no worker starts is dropped after this"),
        NUM("test-drop-gossip", KVR_OPT_U64, &c->test_drop_gossip, 0, 0,
            "tests only: do not send every Nth decision (0: send all)"),
        NUM("test-stall-ms", KVR_OPT_MS, &c->test_stall_ns, 0, 60000,
            "tests only: a message on <prefix>.<ns>.router.stall holds the state lock this long, "
            "one on <prefix>.<ns>.ev.stall the events' handler"),
        {.name = "metrics-addr",
         .env = "KVR_METRICS_ADDR",
         .type = KVR_OPT_STR,
         .ptr = c->metrics_addr,
         .help = "serve /metrics, /healthz, /readyz on HOST:PORT (IPv4 or [IPv6]; none: off)"},
    };
    _Static_assert(KVR_NATS_OPTIONS + KVR_CORE_OPTIONS + sizeof t / sizeof t[0] <= KVR_RD_OPTIONS,
                   "KVR_RD_OPTIONS too small");
    size_t n = kvr_nats_config_options(&c->net, out);
    out[n++] = t[0]; /* the id, then the core's options, then the daemon's */
    n += core_options(&c->core, out + n);
    memcpy(out + n, t + 1, sizeof t - sizeof t[0]);
    return n + sizeof t / sizeof t[0] - 1;
}

static bool id_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '-' || ch == '_';
}

kvr_status kvr_rd_config_check(struct kvr_rd_config *c, char *why, size_t len)
{
    if (!c->id[0]) {
        char host[64] = "host";
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = 0;
        snprintf(c->id, KVR_RD_ID_MAX, "%.40s-%d", host, (int)getpid());
        for (char *p = c->id; *p; p++)
            *p = id_char(*p) ? *p : '_';
    }
    if (!kvr_id_ok(c->id, KVR_RD_ID_MAX - 1)) {
        snprintf(why, len, "--id takes 1 to %d letters, digits, '-' and '_'", KVR_RD_ID_MAX - 1);
        return KVR_ERR_INVALID;
    }
    if (c->metrics_addr[0] && kvr_httpd_check_addr(c->metrics_addr, why, len) != KVR_OK)
        return KVR_ERR_INVALID;
    /* a decision carries a hash per prompt block, and peers decode KVR_WIRE_DECISION_BLOCKS_MAX
     * at most: a longer prompt's decision, gossiped or in a snapshot page, every peer refuses */
    uint64_t blocks = c->core.block_size ? c->core.max_prompt_tokens / c->core.block_size : 0;
    if (blocks > KVR_WIRE_DECISION_BLOCKS_MAX) {
        snprintf(why, len,
                 "--max-prompt-tokens %u is %llu blocks of --block-size %u, more than the %u a "
                 "decision carries to the other routers: at most %llu tokens",
                 c->core.max_prompt_tokens, (unsigned long long)blocks, c->core.block_size,
                 KVR_WIRE_DECISION_BLOCKS_MAX,
                 (unsigned long long)KVR_WIRE_DECISION_BLOCKS_MAX * c->core.block_size +
                     c->core.block_size - 1);
        return KVR_ERR_INVALID;
    }
    if (c->heartbeat_min_ns > c->heartbeat_max_ns) { /* the clamp would take max alone */
        snprintf(why, len, "--heartbeat-min-ms (%.0f) is above --heartbeat-max-ms (%.0f)",
                 (double)c->heartbeat_min_ns / KVR_NS_PER_MS,
                 (double)c->heartbeat_max_ns / KVR_NS_PER_MS);
        return KVR_ERR_INVALID;
    }
    return kvr_nats_config_check(&c->net, why, len);
}
