/*
 * The engine's load and capacity, health and model (openai.h, the blocking part): its
 * Prometheus text read through promtext.h into struct kvr_engine_metrics (ENGINES.md §3), and
 * SGLang's /get_server_info. Every value is checked before it counts (finite, in range); a
 * sample that fails is counted in bad_lines and left out, the rest still counts.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chunk.h"
#include "http.h"
#include "kvr/hash.h"
#include "kvr/rng.h"
#include "openai.h"
#include "promtext.h"

#define COUNT_MAX 9007199254740992.0 /* 2^53: counts beyond are not counts */
#define SEEN_MAX  256 /* series told apart; past them, none is refused as named twice */

/* Sums over label sets while the text is read. */
struct acc {
    struct kvr_engine_metrics *m;
    double running, waiting, hits, queries;
    double usage_sum[2]; /* [0] kv_cache_usage_perc / token_usage, [1] gpu_cache_usage_perc */
    uint32_t usage_n[2];
    double hit_rate_sum;
    uint32_t hit_rate_n;
    bool have_hits, have_queries;
    uint64_t seen[SEEN_MAX]; /* the series taken so far (series_id), to refuse one twice */
    uint32_t nseen;          /* */
    bool by_rank;            /* only the series of one data-parallel rank */
    char rank[12];           /* that rank in decimal, as vLLM's engine label writes it */
    size_t rank_len;         /* */
};

enum metric {
    M_RUNNING,
    M_WAITING,
    M_USAGE,
    M_USAGE_OLD,
    M_CACHE_INFO,
    M_HITS,
    M_QUERIES,
    M_HIT_RATE,
    M_START,
};

static const struct {
    const char *name;
    enum metric what;
    enum kvr_engine_kind kind;
} metric_names[] = {
    {"vllm:num_requests_running", M_RUNNING, KVR_ENGINE_VLLM},
    {"vllm:num_requests_waiting", M_WAITING, KVR_ENGINE_VLLM},
    {"vllm:kv_cache_usage_perc", M_USAGE, KVR_ENGINE_VLLM},
    {"vllm:gpu_cache_usage_perc", M_USAGE_OLD, KVR_ENGINE_VLLM},
    {"vllm:cache_config_info", M_CACHE_INFO, KVR_ENGINE_VLLM},
    {"vllm:prefix_cache_hits_total", M_HITS, KVR_ENGINE_VLLM},
    {"vllm:prefix_cache_queries_total", M_QUERIES, KVR_ENGINE_VLLM},
    {"vllm:gpu_prefix_cache_hit_rate", M_HIT_RATE, KVR_ENGINE_VLLM},
    {"sglang:num_running_reqs", M_RUNNING, KVR_ENGINE_SGLANG},
    {"sglang:num_queue_reqs", M_WAITING, KVR_ENGINE_SGLANG},
    {"sglang:token_usage", M_USAGE, KVR_ENGINE_SGLANG},
    {"sglang:cache_hit_rate", M_HIT_RATE, KVR_ENGINE_SGLANG},
    {"process_start_time_seconds", M_START, KVR_ENGINE_UNKNOWN},
};

static bool name_is(const struct kvr_promtext_sample *s, const char *name)
{
    return strlen(name) == s->name_len && memcmp(s->name, name, s->name_len) == 0;
}

static bool prefix_is(const struct kvr_promtext_sample *s, const char *prefix)
{
    size_t n = strlen(prefix);
    return s->name_len > n && memcmp(s->name, prefix, n) == 0;
}

/* A label's value as a decimal integer in 1..max; false for anything else ("None" too). */
static bool label_uint(const struct kvr_promtext_sample *s, const char *label, uint64_t max,
                       uint64_t *out)
{
    for (uint32_t i = 0; i < s->n_labels; i++) {
        const struct kvr_promtext_label *l = &s->labels[i];
        if (!kvr_promtext_label_is(l, label))
            continue;
        if (l->value_len == 0 || l->value_len > 19)
            return false;
        uint64_t v = 0;
        for (size_t k = 0; k < l->value_len; k++) {
            if (l->value[k] < '0' || l->value[k] > '9')
                return false;
            v = v * 10 + (uint64_t)(l->value[k] - '0');
        }
        if (v == 0 || v > max)
            return false;
        *out = v;
        return true;
    }
    return false;
}

static bool cache_info(struct acc *a, const struct kvr_promtext_sample *s)
{
    struct kvr_engine_metrics *m = a->m;
    uint64_t bs = 0, blocks = 0;
    if (label_uint(s, "block_size", 1u << 20, &bs)) {
        if (!m->have_block_size) {
            m->block_size = (uint32_t)bs;
            m->have_block_size = true;
        } else if (m->block_size != bs) {
            m->block_size_conflict = true;
        }
    }
    if (label_uint(s, "num_gpu_blocks", 1ull << 40, &blocks)) {
        m->num_blocks += blocks;
        m->have_num_blocks = true;
    }
    return true;
}

static bool is_count(double v)
{
    return isfinite(v) && v >= 0 && v <= COUNT_MAX;
}

static bool is_fraction(double v)
{
    return isfinite(v) && v >= 0 && v <= 1;
}

static bool add_count(double v, double *sum, bool *have)
{
    if (!is_count(v))
        return false;
    *sum += v;
    *have = true;
    return true;
}

static bool add_fraction(double v, double *sum, uint32_t *n)
{
    if (!is_fraction(v))
        return false;
    *sum += v;
    (*n)++;
    return true;
}

/* One sample into the sums; false when its value is out of range. */
static bool take_sample(struct acc *a, enum metric what, const struct kvr_promtext_sample *s)
{
    double v = s->value;
    switch (what) {
    case M_RUNNING:
        return add_count(v, &a->running, &a->m->have_running);
    case M_WAITING:
        return add_count(v, &a->waiting, &a->m->have_waiting);
    case M_USAGE:
        return add_fraction(v, &a->usage_sum[0], &a->usage_n[0]);
    case M_USAGE_OLD:
        return add_fraction(v, &a->usage_sum[1], &a->usage_n[1]);
    case M_CACHE_INFO:
        return cache_info(a, s);
    case M_HITS:
        return add_count(v, &a->hits, &a->have_hits);
    case M_QUERIES:
        return add_count(v, &a->queries, &a->have_queries);
    case M_HIT_RATE:
        return add_fraction(v, &a->hit_rate_sum, &a->hit_rate_n);
    case M_START: /* the latest, should several processes be listed */
        if (!(v > 0 && v < 1e11))
            return false;
        if (!a->m->have_start_time || v > a->m->start_time)
            a->m->start_time = v;
        a->m->have_start_time = true;
        return true;
    }
    return false;
}

/* A series' identity: its name and its labels, in any order (a sum over them). */
static uint64_t series_id(const struct kvr_promtext_sample *s)
{
    uint64_t id = kvr_hash_bytes(s->name, s->name_len);
    for (uint32_t i = 0; i < s->n_labels; i++) {
        const struct kvr_promtext_label *l = &s->labels[i];
        id += kvr_mix64(kvr_hash_bytes(l->name, l->name_len) ^
                        kvr_mix64(kvr_hash_bytes(l->value, l->value_len)));
    }
    return id;
}

/* Whether series id was taken already (an exposition names a series once: a second line of it
 * would be counted twice, the capacity of a duplicated cache_config_info doubled). */
static bool taken(const struct acc *a, uint64_t id)
{
    for (uint32_t i = 0; i < a->nseen; i++)
        if (a->seen[i] == id)
            return true;
    return false;
}

/* Whether s is of the rank asked for: no engine label, or one naming it (its value is the
 * engine's text: compared as bytes, never formatted). */
static bool of_rank(struct acc *a, const struct kvr_promtext_sample *s)
{
    if (!a->by_rank)
        return true;
    for (uint32_t i = 0; i < s->n_labels; i++) {
        const struct kvr_promtext_label *l = &s->labels[i];
        if (!kvr_promtext_label_is(l, "engine"))
            continue;
        a->m->rank_labelled = true;
        if (l->value_len == a->rank_len && memcmp(l->value, a->rank, a->rank_len) == 0) {
            a->m->rank_seen = true;
            return true;
        }
        a->m->other_ranks++;
        return false;
    }
    return true;
}

static void on_sample(void *ctx, const struct kvr_promtext_sample *s)
{
    struct acc *a = ctx;
    if (a->m->kind == KVR_ENGINE_UNKNOWN)
        a->m->kind = prefix_is(s, "vllm:")     ? KVR_ENGINE_VLLM
                     : prefix_is(s, "sglang:") ? KVR_ENGINE_SGLANG
                                               : KVR_ENGINE_UNKNOWN;
    for (size_t i = 0; i < sizeof metric_names / sizeof metric_names[0]; i++) {
        if (name_is(s, metric_names[i].name)) {
            if (!of_rank(a, s))
                return;
            uint64_t id = series_id(s);
            if (taken(a, id) || !take_sample(a, metric_names[i].what, s))
                a->m->bad_lines++;
            else if (a->nseen < SEEN_MAX)
                a->seen[a->nseen++] = id;
            return;
        }
    }
}

static uint64_t to_count(double v)
{
    return v > COUNT_MAX ? (uint64_t)COUNT_MAX : (uint64_t)llround(v);
}

kvr_status kvr_oai_metrics_parse(const char *text, size_t len, struct kvr_engine_metrics *out)
{
    return kvr_oai_metrics_parse_rank(text, len, -1, out);
}

kvr_status kvr_oai_metrics_parse_rank(const char *text, size_t len, int32_t rank,
                                      struct kvr_engine_metrics *out)
{
    memset(out, 0, sizeof *out);
    struct acc a = {.m = out, .by_rank = rank >= 0};
    if (rank > KVR_OAI_DP_RANK_MAX)
        return KVR_ERR_INVALID;
    if (a.by_rank)
        a.rank_len = (size_t)snprintf(a.rank, sizeof a.rank, "%d", (int)rank);
    uint32_t bad = 0;
    kvr_status st = kvr_promtext_parse(text, len, on_sample, &a, &out->samples, &bad);
    if (st != KVR_OK)
        return st;
    out->bad_lines += bad;
    out->running = to_count(a.running);
    out->waiting = to_count(a.waiting);
    int k = a.usage_n[0] ? 0 : 1; /* the current name wins over the old one */
    if (a.usage_n[k]) {
        out->have_kv_usage = true;
        out->kv_usage = a.usage_sum[k] / a.usage_n[k];
    }
    if (a.have_hits && a.have_queries) {
        out->have_prefix_cache = true;
        out->prefix_cache_hits = a.hits;
        out->prefix_cache_queries = a.queries;
    }
    if (a.hit_rate_n) {
        out->have_cache_hit_rate = true;
        out->cache_hit_rate = a.hit_rate_sum / a.hit_rate_n;
    }
    if (out->have_num_blocks && out->have_block_size) {
        out->have_capacity_tokens = true;
        out->capacity_tokens = out->block_size && out->num_blocks > UINT64_MAX / out->block_size
                                   ? UINT64_MAX
                                   : out->num_blocks * out->block_size;
    }
    return out->samples ? KVR_OK : KVR_ERR_MALFORMED;
}

/* A JSON integer in lo..hi. */
static bool json_uint(const json_t *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    uint64_t x = (uint64_t)json_integer_value(v);
    if (x < lo || x > hi)
        return false;
    *out = x;
    return true;
}

/* max_total_num_tokens at the top (older SGLang) or summed over internal_states (dp ranks). */
static bool server_tokens(const json_t *root, uint64_t *out)
{
    const uint64_t max = 1ull << 48;
    if (json_uint(json_object_get(root, "max_total_num_tokens"), 1, max, out))
        return true;
    const json_t *states = json_object_get(root, "internal_states");
    size_t n = json_array_size(states);
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t v;
        if (!json_uint(json_object_get(json_array_get(states, i), "max_total_num_tokens"), 1, max,
                       &v) ||
            v > max - sum) /* the sum is a count as each rank's is, never wrapped */
            return false;
        sum += v;
    }
    *out = sum;
    return n > 0;
}

kvr_status kvr_oai_server_info_parse(const char *json, size_t len, struct kvr_engine_metrics *out)
{
    json_t *root = json_loadb(json, len, 0, NULL);
    uint64_t tokens = 0, page = 1;
    bool ok = json_is_object(root) && server_tokens(root, &tokens);
    const json_t *pv = json_object_get(root, "page_size");
    if (ok && pv && !json_is_null(pv))
        ok = json_uint(pv, 1, 1u << 20, &page);
    json_decref(root);
    if (!ok)
        return KVR_ERR_MALFORMED;
    if (!out->have_block_size) {
        out->have_block_size = true;
        out->block_size = (uint32_t)page;
    }
    if (!out->have_capacity_tokens) {
        out->have_capacity_tokens = true;
        out->capacity_tokens = tokens;
    }
    if (!out->have_num_blocks) {
        out->have_num_blocks = true;
        out->num_blocks = tokens / out->block_size;
    }
    return KVR_OK;
}

kvr_status kvr_oai_engine_metrics(const char *base_url, long timeout_ms,
                                  struct kvr_engine_metrics *out)
{
    return kvr_oai_engine_metrics_rank(base_url, timeout_ms, -1, out);
}

kvr_status kvr_oai_engine_metrics_rank(const char *base_url, long timeout_ms, int32_t rank,
                                       struct kvr_engine_metrics *out)
{
    memset(out, 0, sizeof *out);
    struct kvr_buf body = {0};
    long code = 0;
    kvr_status st =
        kvr_oai_http_get(base_url, "/metrics", timeout_ms, KVR_OAI_METRICS_MAX_BYTES, &body, &code);
    if (st == KVR_OK && code != 200)
        st = KVR_ERR_IO;
    if (st == KVR_OK)
        st = kvr_oai_metrics_parse_rank((const char *)body.data, body.len, rank, out);
    if (st == KVR_OK && out->kind == KVR_ENGINE_SGLANG && !out->have_num_blocks) {
        /* capacity is not in SGLang's /metrics; without /get_server_info it stays unknown */
        if (kvr_oai_http_get(base_url, "/get_server_info", timeout_ms, KVR_OAI_METRICS_MAX_BYTES,
                             &body, &code) == KVR_OK &&
            code == 200)
            kvr_oai_server_info_parse((const char *)body.data, body.len, out);
    }
    kvr_buf_free(&body);
    return st;
}

kvr_status kvr_oai_health(const char *base_url, long timeout_ms)
{
    struct kvr_buf body = {0};
    long code = 0;
    kvr_status st = kvr_oai_http_get(base_url, "/health", timeout_ms, 65536, &body, &code);
    kvr_buf_free(&body);
    if (st != KVR_OK)
        return st;
    /* any success (a proxy in front may answer 204 No Content); 503 while loading */
    return code >= 200 && code < 300 ? KVR_OK : code == 503 ? KVR_ERR_OVERLOADED : KVR_ERR_IO;
}

static bool printable(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] >= 0x7f)
            return false;
    }
    return n > 0;
}

kvr_status kvr_oai_model_first(const char *base_url, long timeout_ms, char *out, size_t len)
{
    struct kvr_buf body = {0};
    long code = 0;
    kvr_status st = kvr_oai_http_get(base_url, "/v1/models", timeout_ms, 1u << 20, &body, &code);
    if (st == KVR_OK && code != 200)
        st = code >= 400 ? kvr_oai_http_status(code, "") : KVR_ERR_IO;
    json_t *root = st == KVR_OK ? json_loadb((const char *)body.data, body.len, 0, NULL) : NULL;
    kvr_buf_free(&body);
    if (st != KVR_OK)
        return st;
    const json_t *id = json_object_get(json_array_get(json_object_get(root, "data"), 0), "id");
    size_t n = json_string_length(id);
    st = KVR_ERR_MALFORMED;
    if (json_is_string(id) && n < len && printable(json_string_value(id), n)) {
        memcpy(out, json_string_value(id), n + 1);
        st = KVR_OK;
    }
    json_decref(root);
    return st;
}
