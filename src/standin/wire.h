/*
 * kvr_se_wire: kvengine's side of the OpenAI-compatible completions API, as vLLM speaks it
 * (vllm/entrypoints/openai/completion/protocol.py and serving.py): a request body read and
 * checked, and every JSON the server answers with (stream chunks, a whole completion, errors,
 * the model list, SGLang's server info). Jansson makes and reads the JSON. Pure: no I/O, no
 * clock, no locks; thread-safe on distinct buffers.
 *
 * The request (POST /v1/completions), every field checked for type and range, since the body
 * comes from anyone:
 *   - a JSON object, at most max_model_len + 256 commas in it (checked before parsing: the
 *     parse costs ~40 bytes a value, so an 8 MB list of zeros would cost 160 MB);
 *   - model: absent, null or the served name (another: 404 NotFoundError, as vLLM);
 *   - prompt: required, one non-empty list of token ids, each an integer 0..2^32-1. A string
 *     (or a list of strings) is refused with "prompt must be token ids": kvengine has no
 *     tokenizer. A list of lists (a batch) is refused too;
 *   - max_tokens: absent or null (16, vLLM's default) or an integer >= 1;
 *   - stream, return_token_ids: absent, null or a boolean; stream_options: absent, null or an
 *     object {include_usage, continuous_usage_stats}, each absent, null or a boolean, and only
 *     with stream true (vLLM's rule). include_usage defaults to true when stream_options is
 *     given (vLLM's StreamOptions default); continuous usage needs include_usage;
 *   - n must be 1, echo false, logprobs null, use_beam_search false when given (kvengine makes
 *     one plain sequence); every other field is ignored, as vLLM ignores unknown ones;
 *   - the prompt at most max_model_len tokens, prompt + max_tokens at most max_model_len (the
 *     older vLLM's 400 "This model's maximum context length is ..."), both in the KV pool at
 *     once (ceil((prompt + max_tokens) / block_size) <= num_blocks), and the prompt's first
 *     prefill chunk admissible into an empty engine (its blocks within the pool less the
 *     admission watermark: else the engine would hold it waiting for ever), with the figures.
 * A refusal is an HTTP status with vLLM's message; kvr_se_wire_error writes its body.
 *
 * The output: token i of a request is kvr_se_token(seed, i), seed = kvr_se_prompt_seed of its
 * prompt (the same prompt always gives the same tokens, as greedy decoding would); its text is
 * " t<id>". A stream is one SSE event per token ("data: {json}\n\n"), then with include_usage
 * a usage-only chunk ("choices": []), then "data: [DONE]\n\n". With return_token_ids, a
 * stream's first chunk echoes the prompt as prompt_token_ids, as vLLM's does (its JSON about 7
 * bytes a token: the event an adapter must take grows with the prompt).
 */
#ifndef KVR_SE_WIRE_H
#define KVR_SE_WIRE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/engine.h"
#include "buf.h"
#include "kvr/status.h"

#define KVR_SE_DEFAULT_MAX_TOKENS 16  /* vLLM's CompletionRequest default */
#define KVR_SE_MESSAGE_MAX        320 /* bytes of a refusal's message, NUL included */
#define KVR_SE_ID_MAX             48  /* bytes of a completion id ("cmpl-" + 32 hex), NUL too */

struct kvr_se_wire_limits {
    const char *model;      /* the served name (borrowed) */
    uint32_t max_model_len; /* prompt + max_tokens, at most */
    uint32_t block_size;    /* the KV pool: tokens per block */
    uint32_t num_blocks;    /* and blocks */
    uint32_t admit_blocks;  /* blocks a first prefill chunk may take: the pool less the
                               admission watermark */
    uint32_t chunk_tokens;  /* tokens of a first prefill chunk, at most (the step budget) */
};

/* The limits for an engine configured with e, serving model (borrowed) up to max_model_len. */
struct kvr_se_wire_limits kvr_se_wire_limits_of(const struct kvr_engine_config *e,
                                                const char *model, uint32_t max_model_len);

/* A request that passed every check. */
struct kvr_se_completion {
    uint32_t *prompt;      /* nprompt token ids (owned: kvr_se_completion_free) */
    uint32_t nprompt;      /* >= 1 */
    uint32_t max_tokens;   /* >= 1 */
    bool stream;           /* answer as an event stream */
    bool include_usage;    /* stream: a usage chunk before [DONE] */
    bool continuous_usage; /* stream: usage on every chunk */
    bool return_token_ids; /* token_ids on every choice */
};

/* Why a request was refused: its HTTP status, vLLM's error type for it, the message. */
struct kvr_se_refusal {
    unsigned status;                  /* 400, 404, 405, 413, 429, 503, 500 */
    char message[KVR_SE_MESSAGE_MAX]; /* a sentence, with the figures */
    const char *param;                /* the field at fault (static), or NULL */
};

/* Fill *why (status, param, printf-formatted message). */
void kvr_se_refuse(struct kvr_se_refusal *why, unsigned status, const char *param, const char *fmt,
                   ...) __attribute__((format(printf, 4, 5)));
void kvr_se_vrefuse(struct kvr_se_refusal *why, unsigned status, const char *param, const char *fmt,
                    va_list ap) __attribute__((format(printf, 4, 0)));

/*
 * Read and check body[0..len) (borrowed) under lim into *out: KVR_OK, or KVR_ERR_INVALID with
 * *why filled (nothing allocated then), or KVR_ERR_NOMEM (why: 500).
 */
kvr_status kvr_se_wire_parse(const void *body, size_t len, const struct kvr_se_wire_limits *lim,
                             struct kvr_se_completion *out, struct kvr_se_refusal *why);
void kvr_se_completion_free(struct kvr_se_completion *c);

/* The output's tokens: token i of the request whose prompt gives seed; each below 32,000. */
uint64_t kvr_se_prompt_seed(const uint32_t *prompt, uint32_t n);
uint32_t kvr_se_token(uint64_t seed, uint32_t i);

/* What one chunk (or a whole completion) says. */
struct kvr_se_chunk {
    const char *id;             /* "cmpl-..." (borrowed) */
    const char *model;          /* (borrowed) */
    uint64_t created;           /* Unix seconds at the request's arrival */
    uint64_t seed;              /* the output's tokens */
    uint32_t from, n;           /* output tokens from..from+n; n 0 with choices false */
    bool choices;               /* false: the usage-only chunk ("choices": []) */
    const char *finish;         /* finish_reason ("length", "stop"); NULL: null */
    bool token_ids;             /* the choice carries token_ids */
    bool usage;                 /* carries usage */
    bool cached;                /* usage has prompt_tokens_details.cached_tokens */
    uint32_t prompt_tokens;     /* usage figures */
    uint32_t completion_tokens; /* */
    uint32_t cached_tokens;     /* */
    const uint32_t *prompt_ids; /* prompt_tokens ids the choice echoes as prompt_token_ids (vLLM,
                                   on a stream's first chunk with return_token_ids); NULL: none */
};

/* Append one stream event "data: {chunk}\n\n" to out. KVR_OK, KVR_ERR_NOMEM. */
kvr_status kvr_se_wire_sse_chunk(struct kvr_buf *out, const struct kvr_se_chunk *c);
/* Append "data: [DONE]\n\n". */
kvr_status kvr_se_wire_sse_done(struct kvr_buf *out);
/* Append an error inside a stream: "data: {error body}\n\n". */
kvr_status kvr_se_wire_sse_error(struct kvr_buf *out, int shape, const struct kvr_se_refusal *r);
/* Replace out with a whole completion (stream false): one choice of c's tokens, usage. */
kvr_status kvr_se_wire_completion(struct kvr_buf *out, const struct kvr_se_chunk *c);

/*
 * Replace out with the error body of r in shape (enum kvr_se_error_shape): flat
 * {"object":"error","message","type","param","code"} or nested {"error":{"message","type",
 * "param","code"}}; type from the status (BadRequestError, NotFoundError, ...).
 */
kvr_status kvr_se_wire_error(struct kvr_buf *out, int shape, const struct kvr_se_refusal *r);

/* Replace out with GET /v1/models: {"object":"list","data":[{"id": model, ...}]}. */
kvr_status kvr_se_wire_models(struct kvr_buf *out, const char *model, uint64_t created,
                              uint32_t max_model_len);

/* Replace out with SGLang's GET /get_server_info: model_path, page_size, max_total_num_tokens,
 * context_length, version. */
kvr_status kvr_se_wire_server_info(struct kvr_buf *out, const char *model, uint32_t page_size,
                                   uint64_t max_total_num_tokens, uint32_t context_length);

#endif
