/*
 * kvr_oai: a client of an OpenAI-compatible engine (vLLM, SGLang, ...) over HTTP, on libcurl:
 * streaming completions (POST /v1/completions with a prompt of token ids, answered as Server-Sent
 * Events), and the engine's load and capacity (GET /metrics, /get_server_info), health
 * (GET /health) and model (GET /v1/models). ENGINES.md sections 2 and 3 have the wire facts.
 *
 * Threads: a kvr_oai owns one thread, which runs a curl multi handle (curl_multi_poll, woken by
 * curl_multi_wakeup) and calls every hook. kvr_oai_submit, kvr_oai_cancel and kvr_oai_stats are
 * thread-safe and never block on that thread (they take a short internal lock, never held while
 * a hook runs), so they may be called from inside a hook or while holding the lock the hooks
 * take. The blocking functions at the end (engine metrics, health, model) use their own easy
 * handle per call, are thread-safe and independent of any kvr_oai.
 *
 * Bounds: at most max_streams streams in flight (submitted, not yet ended or cancelled); an SSE
 * event (one chunk) of at most max_event_bytes; a prompt of at most KVR_OAI_MAX_PROMPT tokens;
 * the text of an error at most KVR_OAI_MESSAGE_MAX bytes; a finish_reason at most
 * KVR_OAI_FINISH_MAX; a metrics response at most KVR_OAI_METRICS_MAX_BYTES. Nothing the engine
 * sends grows memory past these.
 */
#ifndef KVR_OPENAI_H
#define KVR_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr/status.h"

#define KVR_OAI_MAX_STREAMS       256         /* the default of max_streams */
#define KVR_OAI_MAX_STREAMS_LIMIT 65536       /* max_streams above this is KVR_ERR_INVALID */
#define KVR_OAI_EVENT_BYTES       (1u << 20)  /* the default of max_event_bytes (1 MiB) */
#define KVR_OAI_MAX_PROMPT        (1u << 20)  /* tokens in a prompt, at most */
#define KVR_OAI_CONNECT_MS        2000        /* the default of connect_timeout_ms */
#define KVR_OAI_URL_MAX           512         /* bytes in base_url, NUL included */
#define KVR_OAI_MODEL_MAX         256         /* bytes in a model name, NUL included */
#define KVR_OAI_MESSAGE_MAX       256         /* bytes in an end message, NUL included */
#define KVR_OAI_FINISH_MAX        32          /* bytes in a finish_reason, NUL included */
#define KVR_OAI_METRICS_MAX_BYTES (16u << 20) /* a /metrics or /get_server_info body, at most */
#define KVR_OAI_DP_RANK_MAX       65535       /* vLLM names an engine core by 2 bytes */

struct kvr_oai_config {
    const char *base_url;     /* "http://host:port" (no trailing path); copied, borrowed */
    const char *model;        /* the "model" field; NULL or "": asked once from GET /v1/models
                                 (the first id) inside kvr_oai_create, which then blocks up to
                                 connect_timeout_ms + 5 s; copied */
    long connect_timeout_ms;  /* TCP connect, per stream; 0: KVR_OAI_CONNECT_MS */
    long idle_timeout_ms;     /* a stream that receives no byte for this long (headers
                                 included) ends with KVR_ERR_TIMEOUT, or KVR_OK past a
                                 finish_reason (checked every 50 ms at most); 0: never */
    long total_timeout_ms;    /* a stream longer than this ends so too; 0: never */
    uint32_t max_streams;     /* in flight at once; 0: KVR_OAI_MAX_STREAMS */
    uint32_t max_event_bytes; /* one SSE event, at most; 0: KVR_OAI_EVENT_BYTES */
    bool return_token_ids;    /* send "return_token_ids": true (vLLM >= 0.10.2) */
    bool continuous_usage;    /* send stream_options.continuous_usage_stats: true (vLLM) */
    bool pin_dp_rank;         /* send "X-data-parallel-rank: dp_rank" with every completion:
                                 vLLM (since 0.11, PR 24945) and SGLang run it on that
                                 data-parallel rank, not the one their balancer picks */
    uint32_t dp_rank;         /* with pin_dp_rank: 0..KVR_OAI_DP_RANK_MAX */
};

/* Token counts of an engine's "usage" object. */
struct kvr_oai_usage {
    uint32_t prompt_tokens;     /* the prompt's length as the engine counts it */
    uint32_t completion_tokens; /* tokens generated so far (cumulative) */
    uint32_t cached_tokens;     /* prompt tokens served from the prefix cache; 0 unless
                                   have_cached */
    bool have_cached;           /* prompt_tokens_details.cached_tokens was present */
};

/*
 * One SSE event of a stream, as the engine sent it (its first choice; we never ask for n > 1, so
 * a chunk with more than one choice is malformed). Everything is borrowed until the hook
 * returns.
 *
 * n_tokens, the tokens this chunk stands for: n_token_ids when the engine sent token_ids (an
 * empty array too); else, when the chunk carries usage (continuous usage stats, or an engine
 * that puts its usage on its last chunk with a choice), how far usage.completion_tokens is past
 * the sum of the stream's earlier n_tokens (0 if it is not past: a usage never counts again what
 * earlier chunks stood for); else 1 when text is non-empty, 0 when empty. The usage-only last
 * chunk of include_usage (no choices) has n_tokens 0, text_len 0 and no finish_reason. An event
 * with empty data is skipped; data: [DONE] is no chunk (it ends the stream).
 */
struct kvr_oai_chunk {
    const uint32_t *token_ids; /* the choice's token_ids; NULL when the engine sent none */
    uint32_t n_token_ids;      /* entries in token_ids */
    uint32_t n_tokens;         /* see above */
    const char *text;          /* the model's output: any bytes, NUL-terminated at text_len,
                                  may contain NULs and control characters; "" when none */
    size_t text_len;           /* bytes in text */
    const char *finish_reason; /* NULL while null/absent/""; else the engine's word ("length",
                                  "stop", anything else) made safe as kvr_log_safe does
                                  (printable ASCII unchanged, other bytes as \xNN) and cut to
                                  KVR_OAI_FINISH_MAX - 1 bytes */
    bool have_usage;           /* the chunk carried a usage object */
    struct kvr_oai_usage usage;
};

/*
 * Called on the client's thread with no client lock held; they may call kvr_oai_submit and
 * kvr_oai_cancel (never kvr_oai_destroy). ctx must outlive the client.
 *
 * end is called exactly once for every accepted submission that is not cancelled, after its
 * last chunk; never for a cancelled one. message (never NULL, NUL-terminated, at most
 * KVR_OAI_MESSAGE_MAX - 1 bytes, printable ASCII only: safe to log) is "" with KVR_OK. The
 * statuses:
 *   KVR_OK                   data: [DONE]; or the stream ended (cleanly, cut, silent past
 *                            the idle or total timeout, or with an error object: SGLang's
 *                            usage chunk failing) after a chunk with a finish_reason: every
 *                            token came, only the usage chunk or [DONE] is missing
 *   KVR_ERR_MAX_TOKENS_TOO_LARGE  HTTP 400/413/422 whose message names max_tokens and says
 *                            "too large" or "exceed"
 *   KVR_ERR_PROMPT_TOO_LONG  HTTP 400/413/422 whose message says "context length", "maximum
 *                            model length", "max_model_len", "context window", "too long"
 *                            or "longer than" (ASCII case ignored): vLLM's and SGLang's words
 *   KVR_ERR_INVALID          any other HTTP 400, 413, 422; 404 (no such model or path), 405,
 *                            other 4xx
 *   KVR_ERR_OVERLOADED       HTTP 429 or 503
 *   KVR_ERR_TIMEOUT          HTTP 408 or 504; a connect, idle or total timeout (before a
 *                            finish_reason)
 *   KVR_ERR_IO               other HTTP 5xx; other statuses that are not 2xx; an error object
 *                            inside the stream before a finish_reason (message "engine
 *                            error: ..."); any other curl failure (the message is curl's)
 *   KVR_ERR_WORKER_LOST      connection refused, reset or cut, or the stream ended before
 *                            [DONE] and without a finish_reason (the engine died)
 *   KVR_ERR_MALFORMED        a chunk that is not what the API says (not JSON, wrong types,
 *                            numbers out of range, token id over u32, more than one choice),
 *                            or a 2xx answer whose Content-Type is not text/event-stream; the
 *                            connection is closed
 *   KVR_ERR_NOMEM            out of memory on the client's side
 *   KVR_ERR_TOO_LARGE        an SSE event over max_event_bytes; the connection is closed
 *   KVR_ERR_SHUTDOWN         never: kvr_oai_destroy calls no hook
 * With an HTTP error the message is "http <status>: <the engine's error message>" (from
 * {"error": {"message", ...}} or {"object": "error", "message", ...}; the raw body's start when
 * it is neither).
 */
struct kvr_oai_hooks {
    void (*chunk)(void *ctx, uint64_t key, const struct kvr_oai_chunk *chunk);
    void (*end)(void *ctx, uint64_t key, kvr_status st, const char *message);
    void *ctx;
};

/* Counters since create; a consistent snapshot. */
struct kvr_oai_stats {
    uint64_t submitted;        /* submissions accepted */
    uint64_t refused;          /* submissions refused (overloaded, duplicate, invalid) */
    uint64_t started;          /* transfers the thread started */
    uint64_t finished;         /* ended KVR_OK */
    uint64_t failed;           /* ended with an error: the sum of the six below */
    uint64_t failed_http;      /* an HTTP status >= 400 */
    uint64_t failed_lost;      /* refused, reset, cut before the end (KVR_ERR_WORKER_LOST) */
    uint64_t failed_timeout;   /* KVR_ERR_TIMEOUT */
    uint64_t failed_stream;    /* an error object inside the stream */
    uint64_t failed_malformed; /* KVR_ERR_MALFORMED or KVR_ERR_TOO_LARGE */
    uint64_t failed_other;     /* any other curl failure */
    uint64_t cancelled;        /* kvr_oai_cancel of a key in flight */
    uint64_t bytes;            /* body bytes received */
    uint64_t chunks;           /* chunks delivered to the chunk hook */
    uint64_t bad_chunks;       /* events that failed to parse (each ended its stream) */
    uint64_t tokens;           /* the sum of every delivered chunk's n_tokens */
    uint32_t in_flight;        /* streams submitted, not ended nor cancelled */
    uint64_t thread_cpu_ns;    /* CPU time the client's thread has used (read at the call) */
};

struct kvr_oai;

/*
 * A client of the engine at cfg->base_url, its thread started. cfg is borrowed for the call,
 * hooks copied. NULL on error with *st set: KVR_ERR_INVALID (no/overlong/non-http base URL,
 * bounds out of range, a hook NULL), KVR_ERR_NOMEM, KVR_ERR_IO (thread or curl), and the
 * statuses of kvr_oai_model_first when the model is asked for.
 */
struct kvr_oai *kvr_oai_create(const struct kvr_oai_config *cfg, const struct kvr_oai_hooks *h,
                               kvr_status *st);

/*
 * Stop every stream (closing its connection, no hook called), join the thread, free. No hook
 * runs after it returns. Not from a hook. NULL is a no-op.
 */
void kvr_oai_destroy(struct kvr_oai *c);

/* The model name in use (from the config or asked for); owned by c. */
const char *kvr_oai_model(const struct kvr_oai *c);

/*
 * Queue a completion of prompt[0..n) (borrowed for the call; the JSON body is built here, on the
 * caller's thread) for at most max_tokens tokens, under the caller's key; the client's thread
 * starts the transfer. Non-blocking, thread-safe. KVR_ERR_EMPTY_PROMPT (n == 0), KVR_ERR_INVALID
 * (prompt NULL), KVR_ERR_PROMPT_TOO_LONG (n > KVR_OAI_MAX_PROMPT), KVR_ERR_MAX_TOKENS_ZERO,
 * KVR_ERR_DUPLICATE (key in flight), KVR_ERR_OVERLOADED (max_streams in flight, or as many again
 * cancelled or finished streams whose connections the thread has not closed yet),
 * KVR_ERR_SHUTDOWN (destroy has begun), KVR_ERR_NOMEM; on an error no hook is called for it. A
 * key is free again once its end hook has begun or its cancel returned.
 */
kvr_status kvr_oai_submit(struct kvr_oai *c, uint64_t key, const uint32_t *prompt, uint32_t n,
                          uint32_t max_tokens);

/*
 * kvr_oai_submit in two halves, so that a caller builds the body (the costly part: a 50,000-token
 * prompt is tens of milliseconds of JSON) outside its own locks. kvr_oai_body checks the prompt
 * as kvr_oai_submit does and builds its request body; thread-safe (it reads only c's settings).
 * NULL with the reason in *st (kvr_oai_submit counts such a prompt in stats.refused; a caller of
 * the two halves refuses it itself). kvr_oai_submit_body takes the body from then on, freed
 * whatever it returns, and answers as kvr_oai_submit.
 */
char *kvr_oai_body(const struct kvr_oai *c, const uint32_t *prompt, uint32_t n, uint32_t max_tokens,
                   kvr_status *st);
kvr_status kvr_oai_submit_body(struct kvr_oai *c, uint64_t key, char *body);

/*
 * Abort the stream of key: the client's thread removes its transfer, which closes the connection
 * (how vLLM and SGLang abort a request). Thread-safe, non-blocking; unknown or ended keys are a
 * no-op. The guarantee: no hook for this submission of key begins after cancel returns. Called
 * from a hook (the client's thread), that is absolute. Called from another thread while the
 * client's thread is already inside (or entering) a hook for key, that one call may still run
 * or finish after cancel returns, and none follows; a caller whose hooks take its lock L, and
 * which holds L around cancel and forgets the key there, sees that call find the key unknown.
 * Submitting the same key again right after cancel, under that L, is therefore safe only if the
 * caller tells the two apart itself; kvr_oai_submit accepts it.
 */
void kvr_oai_cancel(struct kvr_oai *c, uint64_t key);

/* A snapshot of the counters into out. Thread-safe. */
void kvr_oai_stats(struct kvr_oai *c, struct kvr_oai_stats *out);

/* ---- the engine's load and capacity (blocking, own easy handle, thread-safe) ---- */

enum kvr_engine_kind { KVR_ENGINE_UNKNOWN, KVR_ENGINE_VLLM, KVR_ENGINE_SGLANG };

/*
 * What an engine's /metrics says, each value summed over its label sets (several models, data
 * parallel ranks) unless said otherwise, each with a have_ flag (false: no sample seen). Read
 * for one data-parallel rank (kvr_oai_metrics_parse_rank), the samples whose "engine" label (vLLM
 * labels each rank's series engine="<rank>") names another rank are left out; samples without
 * that label count as ever.
 */
struct kvr_engine_metrics {
    enum kvr_engine_kind kind; /* from the metric names seen (vllm: or sglang:) */
    bool have_running;
    uint64_t running; /* vllm:num_requests_running, sglang:num_running_reqs */
    bool have_waiting;
    uint64_t waiting; /* vllm:num_requests_waiting, sglang:num_queue_reqs */
    bool have_kv_usage;
    double kv_usage; /* 0..1, the mean over label sets: vllm:kv_cache_usage_perc (or
                        vllm:gpu_cache_usage_perc), sglang:token_usage */
    bool have_block_size;
    uint32_t block_size; /* tokens per block: vllm:cache_config_info{block_size}; SGLang's
                            page_size from /get_server_info. Label sets that disagree:
                            the first, and block_size_conflict set */
    bool block_size_conflict;
    bool have_num_blocks;
    uint64_t num_blocks; /* vllm:cache_config_info{num_gpu_blocks}; SGLang:
                            max_total_num_tokens / page_size */
    bool have_capacity_tokens;
    uint64_t capacity_tokens; /* num_blocks * block_size (SGLang: max_total_num_tokens) */
    bool have_prefix_cache;
    double prefix_cache_hits;    /* vllm:prefix_cache_hits_total (tokens; counter) */
    double prefix_cache_queries; /* vllm:prefix_cache_queries_total (tokens; counter) */
    bool have_cache_hit_rate;
    double cache_hit_rate; /* sglang:cache_hit_rate, 0..1, the mean over label sets */
    bool have_start_time;
    double start_time;    /* process_start_time_seconds (Unix s) of the engine's server: a new
                             value is a restarted engine */
    uint32_t samples;     /* sample lines parsed */
    uint32_t bad_lines;   /* lines skipped as malformed (the rest still counts) */
    uint32_t other_ranks; /* samples left out: their engine label names another rank */
    bool rank_labelled;   /* read for a rank: a sample read carried an engine label */
    bool rank_seen;       /* ... and one of them named the rank asked for */
};

/*
 * GET base_url/metrics and parse it into *out (zeroed first); for SGLang, when /metrics gave no
 * capacity, GET base_url/get_server_info too (max_total_num_tokens, page_size). timeout_ms bounds
 * each request (0: 5000). KVR_OK when the text parsed (even with bad lines counted), else
 * KVR_ERR_INVALID (arguments), KVR_ERR_WORKER_LOST (connection refused), KVR_ERR_TIMEOUT,
 * KVR_ERR_IO (HTTP status not 200, other transfer errors), KVR_ERR_TOO_LARGE (a body over
 * KVR_OAI_METRICS_MAX_BYTES), KVR_ERR_MALFORMED (no sample at all).
 */
kvr_status kvr_oai_engine_metrics(const char *base_url, long timeout_ms,
                                  struct kvr_engine_metrics *out);

/*
 * The pure parsers behind kvr_oai_engine_metrics, for tests and for callers with the text in
 * hand. kvr_oai_metrics_parse parses a Prometheus text exposition (text[0..len), no NUL needed)
 * into *out (zeroed first): KVR_OK, or KVR_ERR_MALFORMED when no sample line parsed.
 * kvr_oai_server_info_parse reads SGLang's /get_server_info JSON and fills block size, blocks and
 * capacity when they are not set yet: KVR_OK, or KVR_ERR_MALFORMED.
 */
kvr_status kvr_oai_metrics_parse(const char *text, size_t len, struct kvr_engine_metrics *out);

/*
 * kvr_oai_metrics_parse and kvr_oai_engine_metrics for data-parallel rank (0..
 * KVR_OAI_DP_RANK_MAX; < 0: every series, as the two above): a sample of the families read whose
 * engine label is not exactly rank in decimal is left out (counted in other_ranks). Series that
 * carry engine labels but none for rank leave rank_labelled set and rank_seen false: the caller
 * judges (the figures then hold only the unlabelled series).
 */
kvr_status kvr_oai_metrics_parse_rank(const char *text, size_t len, int32_t rank,
                                      struct kvr_engine_metrics *out);
kvr_status kvr_oai_engine_metrics_rank(const char *base_url, long timeout_ms, int32_t rank,
                                       struct kvr_engine_metrics *out);
kvr_status kvr_oai_server_info_parse(const char *json, size_t len, struct kvr_engine_metrics *out);

/*
 * GET base_url/health: KVR_OK on HTTP 2xx (a proxy may answer 204); KVR_ERR_WORKER_LOST (refused),
 * KVR_ERR_TIMEOUT, KVR_ERR_OVERLOADED (503), KVR_ERR_IO (other statuses, other errors),
 * KVR_ERR_INVALID. timeout_ms: 0 is 5000.
 */
kvr_status kvr_oai_health(const char *base_url, long timeout_ms);

/*
 * GET base_url/v1/models and copy the first entry's "id" into out (len bytes, NUL included):
 * KVR_OK; KVR_ERR_MALFORMED (no such entry, not a string, not printable, not shorter than len),
 * or the transfer statuses of kvr_oai_health.
 */
kvr_status kvr_oai_model_first(const char *base_url, long timeout_ms, char *out, size_t len);

#endif
