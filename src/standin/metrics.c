/*
 * kvengine's /metrics implementation.
 */
#include "metrics.h"

#include <stdio.h>
#include <string.h>

#include "procstat.h"
#include "prom.h"

const unsigned kvr_se_refusal_codes[KVR_SE_REFUSAL_CODES] = {400, 404, 405, 409, 413,
                                                             429, 500, 503, 0};

static void gauge1(struct kvr_prom *p, const char *name, const char *help,
                   const struct kvr_prom_label *l, size_t nl, double v)
{
    kvr_prom_family(p, name, KVR_PROM_GAUGE, help);
    kvr_prom_f64(p, l, nl, v);
}

static void counter1(struct kvr_prom *p, const char *name, const char *help,
                     const struct kvr_prom_label *l, size_t nl, uint64_t v)
{
    kvr_prom_family(p, name, KVR_PROM_COUNTER, help);
    kvr_prom_u64(p, l, nl, v);
}

/* vLLM's families, one sample per data-parallel rank (labelled engine="<rank>", as vLLM's
 * PrometheusStatLogger does). */
enum vfig { V_RUNNING, V_WAITING, V_USAGE, V_QUERIES, V_HITS, V_PREEMPT, V_PROMPT, V_GEN };

static const struct {
    const char *name;
    bool counter;
    const char *help;
} vllm_families[] = {
    [V_RUNNING] = {"vllm:num_requests_running", false,
                   "Number of requests in model execution batches."},
    [V_WAITING] = {"vllm:num_requests_waiting", false,
                   "Number of requests waiting to be processed."},
    [V_USAGE] = {"vllm:kv_cache_usage_perc", false, "KV-cache usage. 1 means 100 percent usage."},
    [V_QUERIES] = {"vllm:prefix_cache_queries_total", true,
                   "Prefix cache queries, in terms of number of queried tokens."},
    [V_HITS] = {"vllm:prefix_cache_hits_total", true,
                "Prefix cache hits, in terms of number of cached tokens."},
    [V_PREEMPT] = {"vllm:num_preemptions_total", true,
                   "Cumulative number of preemption from the engine."},
    [V_PROMPT] = {"vllm:prompt_tokens_total", true, "Number of prefill tokens processed."},
    [V_GEN] = {"vllm:generation_tokens_total", true, "Number of generation tokens processed."},
};

static double vllm_figure(const struct kvr_se_snapshot *s, enum vfig f)
{
    switch (f) {
    case V_RUNNING:
        return s->engine.running;
    case V_WAITING:
        return s->engine.waiting;
    case V_USAGE:
        return s->engine.kv_usage;
    case V_QUERIES:
        return (double)s->c.prefix_queries;
    case V_HITS:
        return (double)s->c.prefix_hits;
    case V_PREEMPT:
        return (double)(s->c.engine_base[0] + s->engine.preemptions);
    case V_PROMPT:
        return (double)s->c.prompt_tokens;
    case V_GEN:
        return (double)s->c.generation_tokens;
    }
    return 0;
}

static void vllm(struct kvr_prom *p, const struct kvr_se_snapshot *s, uint32_t n)
{
    const struct kvr_se_config *cfg = s->cfg;
    char rank[KVR_SE_DP_MAX][12], bs[16], nb[16];
    for (uint32_t r = 0; r < n; r++)
        snprintf(rank[r], sizeof rank[r], "%u", s[r].cfg->dp_rank);
    for (size_t f = 0; f < sizeof vllm_families / sizeof vllm_families[0]; f++) {
        kvr_prom_family(p, vllm_families[f].name,
                        vllm_families[f].counter ? KVR_PROM_COUNTER : KVR_PROM_GAUGE,
                        vllm_families[f].help);
        for (uint32_t r = 0; r < n; r++) {
            const struct kvr_prom_label l[] = {{"model_name", cfg->model}, {"engine", rank[r]}};
            kvr_prom_f64(p, l, 2, vllm_figure(&s[r], (enum vfig)f));
        }
    }
    snprintf(bs, sizeof bs, "%u", cfg->engine.block_size);
    snprintf(nb, sizeof nb, "%u", cfg->engine.num_blocks);
    kvr_prom_family(p, "vllm:cache_config_info", KVR_PROM_GAUGE,
                    "Information of the LLMEngine CacheConfig.");
    for (uint32_t r = 0; r < n; r++) {
        const struct kvr_prom_label info[] = {{"engine", rank[r]},
                                              {"block_size", bs},
                                              {"num_gpu_blocks", nb},
                                              {"enable_prefix_caching", "True"},
                                              {"cache_dtype", "auto"}};
        kvr_prom_f64(p, info, 5, 1);
    }
    kvr_prom_family(p, "vllm:request_success_total", KVR_PROM_COUNTER,
                    "Count of successfully processed requests.");
    for (uint32_t r = 0; r < n; r++) {
        const struct kvr_prom_label len[] = {
            {"model_name", cfg->model}, {"engine", rank[r]}, {"finished_reason", "length"}};
        const struct kvr_prom_label stop[] = {
            {"model_name", cfg->model}, {"engine", rank[r]}, {"finished_reason", "stop"}};
        kvr_prom_u64(p, len, 3, s[r].c.finished - s[r].c.stopped);
        kvr_prom_u64(p, stop, 3, s[r].c.stopped);
    }
}

static void sglang(struct kvr_prom *p, const struct kvr_se_snapshot *s)
{
    const struct kvr_prom_label l[] = {{"model_name", s->cfg->model}};
    gauge1(p, "sglang:num_running_reqs", "The number of running requests.", l, 1,
           s->engine.running);
    gauge1(p, "sglang:num_queue_reqs", "The number of requests in the waiting queue.", l, 1,
           s->engine.waiting);
    gauge1(p, "sglang:token_usage", "The token usage.", l, 1, s->engine.kv_usage);
    double rate = s->c.prefix_queries ? (double)s->c.prefix_hits / s->c.prefix_queries : 0;
    gauge1(p, "sglang:cache_hit_rate", "The prefix cache hit rate.", l, 1, rate);
    counter1(p, "sglang:prompt_tokens_total", "Number of prefill tokens processed.", l, 1,
             s->c.prompt_tokens);
    counter1(p, "sglang:generation_tokens_total", "Number of generation tokens processed.", l, 1,
             s->c.generation_tokens);
}

static void requests(struct kvr_prom *p, const struct kvr_se_snapshot *s)
{
    const struct kvr_se_counters *c = &s->c;
    kvr_prom_counter(p, "kvengine_requests_total", "Completions accepted.", c->requests);
    kvr_prom_counter(p, "kvengine_requests_finished_total",
                     "Completions that produced all their tokens.", c->finished);
    kvr_prom_counter(p, "kvengine_requests_aborted_total",
                     "Completions cancelled in the engine because their client closed the "
                     "connection.",
                     c->aborted);
    kvr_prom_counter(p, "kvengine_requests_shutdown_total",
                     "Completions aborted by the drain on SIGTERM.", c->shutdown);
    kvr_prom_counter(p, "kvengine_stream_overflows_total",
                     "Streams aborted because their client left too much unread.", c->overflows);
    kvr_prom_gauge(p, "kvengine_requests_held", "Completions the engine holds now.", s->held);
    kvr_prom_family(p, "kvengine_http_refusals_total", KVR_PROM_COUNTER,
                    "Answers with an HTTP error status, by status (other: 0).");
    for (size_t i = 0; i < KVR_SE_REFUSAL_CODES; i++) {
        char code[8];
        snprintf(code, sizeof code, "%u", kvr_se_refusal_codes[i]);
        kvr_prom_u64(p, &(struct kvr_prom_label){"code", code}, 1, c->refused[i]);
    }
    kvr_prom_counter(p, "kvengine_engine_steps_total", "Engine steps run.", c->steps);
    kvr_prom_counter(p, "kvengine_engine_cancels_total",
                     "Requests the engine ended early (client gone, overflow, drain).",
                     c->engine_base[1] + s->engine.cancelled);
    kvr_prom_gauge(p, "kvengine_engine_cached_blocks",
                   "Unreferenced KV blocks holding a prefix in the engine.",
                   s->engine.cached_blocks);
    kvr_prom_family(p, "kvengine_time_to_first_token_seconds", KVR_PROM_HISTOGRAM,
                    "From a completion's submission to its first token, engine side.");
    kvr_prom_histogram(p, NULL, 0, &c->ttft);
    kvr_prom_counter(p, "kvengine_oom_total", "Stream events or KV events not made: no memory.",
                     c->oom);
    kvr_prom_counter(p, "kvengine_test_stalls_total", "Stalls asked through /test/stall.",
                     c->stalls);
    kvr_prom_counter(p, "kvengine_test_clears_total", "Cache resets through /test/clear.",
                     c->clears);
    kvr_prom_gauge(p, "kvengine_draining", "1 while the server drains (SIGTERM).", s->draining);
}

static void kv(struct kvr_prom *p, const struct kvr_se_snapshot *s)
{
    kvr_prom_gauge(p, "kvengine_kv_events_enabled", "1 when KV events are published.", s->has_pub);
    if (!s->has_pub)
        return;
    kvr_prom_gauge(p, "kvengine_kv_blocks_tracked", "Blocks whose tokens are kept.", s->blocks);
    kvr_prom_gauge(p, "kvengine_kv_blocks_cached", "Of which stored in the engine and not removed.",
                   s->blocks_cached);
    kvr_prom_counter(p, "kvengine_kv_untracked_blocks_total",
                     "Stored blocks whose tokens were unknown (not published).", s->untracked);
    kvr_prom_counter(p, "kvengine_kv_unknown_removed_total",
                     "Removed blocks that were not known as cached.", s->unknown_removed);
    kvr_prom_counter(p, "kvengine_kv_batches_total", "KV event batches made.", s->kv_batches);
    kvr_prom_counter(p, "kvengine_kv_events_total", "KV events in them.", s->kv_events);
    kvr_prom_counter(p, "kvengine_kv_batches_failed_total",
                     "Batches lost: encoding or publishing failed.", s->kv_failed);
    kvr_prom_counter(p, "kvengine_kv_blocks_dropped_total", "Blocks left out of events: no memory.",
                     s->kv_dropped);
    kvr_prom_counter(p, "kvengine_kv_batches_sent_total", "Batches sent on the PUB socket.",
                     s->pub.sent);
    kvr_prom_counter(p, "kvengine_kv_batches_withheld_total",
                     "Batches kept for replay but not sent (/test/drop_batches).", s->pub.dropped);
    kvr_prom_counter(p, "kvengine_kv_replay_requests_total", "Replay requests served.",
                     s->pub.replay_requests);
    kvr_prom_counter(p, "kvengine_kv_replay_bad_total", "Malformed replay requests.",
                     s->pub.replay_bad);
    kvr_prom_counter(p, "kvengine_kv_replayed_batches_total", "Batches sent on the replay socket.",
                     s->pub.replayed);
    kvr_prom_gauge(p, "kvengine_kv_next_seq", "The seq the next batch gets.",
                   (double)s->pub.next_seq);
    kvr_prom_gauge(p, "kvengine_kv_subscribers", "Subscriptions the PUB socket has.",
                   s->pub.subscribers);
}

kvr_status kvr_se_metrics_write(const struct kvr_se_snapshot *s, uint32_t n, struct kvr_buf *out)
{
    struct kvr_prom p;
    kvr_prom_begin(&p, out);
    bool sg = s->cfg->metrics_style == KVR_SE_STYLE_SGLANG;
    if (sg)
        sglang(&p, s);
    else
        vllm(&p, s, n < 1 ? 1 : n > KVR_SE_DP_MAX ? KVR_SE_DP_MAX : n);
    requests(&p, s);
    kv(&p, s);
    struct kvr_procstat ps; /* process_start_time_seconds: how an adapter tells a restart */
    kvr_procstat_read(&ps);
    kvr_prom_process(&p, &ps);
    return kvr_prom_end(&p);
}
