/*
 * kvr_se_wire implementation: jansson for every JSON read and written.
 */
#include "wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "config.h"
#include "kvr/hash.h"
#include "kvr/rng.h"
#include "log.h"

#define VALUES_SLACK 256 /* commas a request may have beyond its prompt's */
#define VOCAB        32000u

void kvr_se_vrefuse(struct kvr_se_refusal *why, unsigned status, const char *param, const char *fmt,
                    va_list ap)
{
    why->status = status;
    why->param = param;
    vsnprintf(why->message, sizeof why->message, fmt, ap);
}

void kvr_se_refuse(struct kvr_se_refusal *why, unsigned status, const char *param, const char *fmt,
                   ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvr_se_vrefuse(why, status, param, fmt, ap);
    va_end(ap);
}

/* --- the request ----------------------------------------------------------------------------- */

/* A boolean field: absent or null gives def. false with *why set when it is another type. */
static bool get_bool(json_t *root, const char *name, bool def, bool *out,
                     struct kvr_se_refusal *why)
{
    json_t *v = json_object_get(root, name);
    *out = def;
    if (!v || json_is_null(v))
        return true;
    if (!json_is_boolean(v)) {
        kvr_se_refuse(why, 400, name, "`%s` must be a boolean", name);
        return false;
    }
    *out = json_is_true(v);
    return true;
}

/* The fields kvengine does not do: refused when given a value that asks for them. */
static bool unsupported(json_t *root, struct kvr_se_refusal *why)
{
    json_t *n = json_object_get(root, "n");
    if (n && !json_is_null(n) && !(json_is_integer(n) && json_integer_value(n) == 1)) {
        kvr_se_refuse(why, 400, "n", "`n` must be 1: kvengine makes one sequence per request");
        return true;
    }
    json_t *lp = json_object_get(root, "logprobs");
    if (lp && !json_is_null(lp)) {
        kvr_se_refuse(why, 400, "logprobs", "`logprobs` is not supported by kvengine");
        return true;
    }
    static const char *const flags[] = {"echo", "use_beam_search"};
    for (size_t i = 0; i < 2; i++) {
        bool on = false;
        if (!get_bool(root, flags[i], false, &on, why))
            return true;
        if (on) {
            kvr_se_refuse(why, 400, flags[i], "`%s` is not supported by kvengine", flags[i]);
            return true;
        }
    }
    return false;
}

/* The prompt: one non-empty list of token ids. */
static kvr_status get_prompt(json_t *root, struct kvr_se_completion *out,
                             struct kvr_se_refusal *why)
{
    json_t *p = json_object_get(root, "prompt");
    if (!p || json_is_null(p)) {
        kvr_se_refuse(why, 400, "prompt", "`prompt` is required: a list of token ids");
        return KVR_ERR_INVALID;
    }
    if (json_is_string(p) || (json_is_array(p) && json_is_string(json_array_get(p, 0)))) {
        kvr_se_refuse(why, 400, "prompt",
                      "prompt must be token ids: kvengine has no tokenizer, send a list of "
                      "integers");
        return KVR_ERR_INVALID;
    }
    if (!json_is_array(p)) {
        kvr_se_refuse(why, 400, "prompt", "`prompt` must be a list of token ids");
        return KVR_ERR_INVALID;
    }
    size_t n = json_array_size(p);
    if (n == 0) {
        kvr_se_refuse(why, 400, "prompt", "`prompt` must not be empty");
        return KVR_ERR_INVALID;
    }
    if (json_is_array(json_array_get(p, 0))) {
        kvr_se_refuse(why, 400, "prompt",
                      "a batch of prompts is not supported: send one list of token ids");
        return KVR_ERR_INVALID;
    }
    out->prompt = malloc(n * sizeof *out->prompt);
    if (!out->prompt) {
        kvr_se_refuse(why, 500, NULL, "out of memory");
        return KVR_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(p, i);
        json_int_t v = json_is_integer(t) ? json_integer_value(t) : -1;
        if (v < 0 || v > (json_int_t)UINT32_MAX) {
            kvr_se_refuse(why, 400, "prompt",
                          "prompt[%zu] must be a token id: an integer 0..4294967295", i);
            return KVR_ERR_INVALID;
        }
        out->prompt[i] = (uint32_t)v;
    }
    out->nprompt = (uint32_t)n; /* n <= commas + 1, bounded by the scan */
    return KVR_OK;
}

/* max_tokens as a count; absent or null: the default. Its upper bound is the context check's. */
static bool get_max_tokens(json_t *root, uint64_t *out, struct kvr_se_refusal *why)
{
    json_t *v = json_object_get(root, "max_tokens");
    *out = KVR_SE_DEFAULT_MAX_TOKENS;
    if (!v || json_is_null(v))
        return true;
    if (!json_is_integer(v)) {
        kvr_se_refuse(why, 400, "max_tokens", "`max_tokens` must be an integer");
        return false;
    }
    json_int_t m = json_integer_value(v);
    if (m < 1) {
        kvr_se_refuse(why, 400, "max_tokens", "`max_tokens` must be at least 1, got %lld",
                      (long long)m);
        return false;
    }
    *out = (uint64_t)m;
    return true;
}

static bool get_stream_options(json_t *root, struct kvr_se_completion *out,
                               struct kvr_se_refusal *why)
{
    json_t *so = json_object_get(root, "stream_options");
    if (!so || json_is_null(so))
        return true;
    if (!json_is_object(so)) {
        kvr_se_refuse(why, 400, "stream_options", "`stream_options` must be an object");
        return false;
    }
    if (!out->stream) {
        kvr_se_refuse(why, 400, "stream_options",
                      "Stream options can only be defined when `stream=True`.");
        return false;
    }
    bool cont = false;
    if (!get_bool(so, "include_usage", true, &out->include_usage, why) ||
        !get_bool(so, "continuous_usage_stats", false, &cont, why))
        return false;
    out->continuous_usage = out->include_usage && cont;
    return true;
}

/* The model named, when it is not the one served: 404 as vLLM. */
static bool wrong_model(json_t *root, const char *model, struct kvr_se_refusal *why)
{
    json_t *m = json_object_get(root, "model");
    if (!m || json_is_null(m))
        return false;
    if (!json_is_string(m)) {
        kvr_se_refuse(why, 400, "model", "`model` must be a string");
        return true;
    }
    if (!strcmp(json_string_value(m), model))
        return false;
    char shown[96];
    kvr_se_refuse(why, 404, "model", "The model `%s` does not exist.",
                  kvr_log_safe(shown, sizeof shown, json_string_value(m)));
    return true;
}

/* The prompt and its output in the context length and in the KV pool. */
static bool too_long(const struct kvr_se_wire_limits *lim, uint64_t isl, uint64_t max_tokens,
                     struct kvr_se_refusal *why)
{
    uint64_t total = isl + max_tokens, bs = lim->block_size;
    if (isl > lim->max_model_len) {
        kvr_se_refuse(why, 400, "prompt",
                      "This model's maximum context length is %u tokens. However, your request "
                      "has %llu input tokens. Please reduce the length of the input.",
                      lim->max_model_len, (unsigned long long)isl);
        return true;
    }
    if (total > lim->max_model_len) {
        kvr_se_refuse(why, 400, "max_tokens",
                      "This model's maximum context length is %u tokens. However, you requested "
                      "%llu tokens (%llu in the prompt, %llu in the completion). Please reduce "
                      "the length of the prompt or completion.",
                      lim->max_model_len, (unsigned long long)total, (unsigned long long)isl,
                      (unsigned long long)max_tokens);
        return true;
    }
    uint64_t need = (total + bs - 1) / bs;
    if (need > lim->num_blocks) {
        kvr_se_refuse(why, 400, "max_tokens",
                      "too long for the KV cache: the prompt (%llu tokens) and max_tokens (%llu) "
                      "need %llu blocks of %llu tokens, the whole cache has %u",
                      (unsigned long long)isl, (unsigned long long)max_tokens,
                      (unsigned long long)need, (unsigned long long)bs, lim->num_blocks);
        return true;
    }
    uint64_t chunk = isl < lim->chunk_tokens ? isl : lim->chunk_tokens;
    if ((chunk + bs - 1) / bs > lim->admit_blocks) {
        kvr_se_refuse(why, 400, "prompt",
                      "prompt too long for the KV cache: its first prefill chunk (%llu tokens) "
                      "needs %llu blocks of %llu tokens, the engine admits %u at most (the cache "
                      "less its free watermark)",
                      (unsigned long long)chunk, (unsigned long long)((chunk + bs - 1) / bs),
                      (unsigned long long)bs, lim->admit_blocks);
        return true;
    }
    return false;
}

struct kvr_se_wire_limits kvr_se_wire_limits_of(const struct kvr_engine_config *e,
                                                const char *model, uint32_t max_model_len)
{
    /* the engine's own figure: admission keeps (uint32_t)(watermark * num_blocks) blocks free */
    uint32_t keep = (uint32_t)(e->watermark * e->num_blocks);
    return (struct kvr_se_wire_limits){model,         max_model_len,        e->block_size,
                                       e->num_blocks, e->num_blocks - keep, e->max_batched_tokens};
}

static size_t count_commas(const char *s, size_t len)
{
    size_t n = 0;
    for (const char *end = s + len; (s = memchr(s, ',', (size_t)(end - s))); s++)
        n++;
    return n;
}

/* Everything but the parse itself; under root. */
static kvr_status check(json_t *root, const struct kvr_se_wire_limits *lim,
                        struct kvr_se_completion *out, struct kvr_se_refusal *why)
{
    uint64_t max_tokens;
    if (!json_is_object(root)) {
        kvr_se_refuse(why, 400, NULL, "the request body must be a JSON object");
        return KVR_ERR_INVALID;
    }
    if (unsupported(root, why) || !get_max_tokens(root, &max_tokens, why) ||
        !get_bool(root, "stream", false, &out->stream, why) ||
        !get_bool(root, "return_token_ids", false, &out->return_token_ids, why) ||
        !get_stream_options(root, out, why))
        return KVR_ERR_INVALID;
    kvr_status st = get_prompt(root, out, why);
    if (st != KVR_OK)
        return st;
    if (wrong_model(root, lim->model, why) || too_long(lim, out->nprompt, max_tokens, why))
        return KVR_ERR_INVALID;
    out->max_tokens = (uint32_t)max_tokens; /* <= max_model_len */
    return KVR_OK;
}

kvr_status kvr_se_wire_parse(const void *body, size_t len, const struct kvr_se_wire_limits *lim,
                             struct kvr_se_completion *out, struct kvr_se_refusal *why)
{
    memset(out, 0, sizeof *out);
    if (count_commas(body, len) > (size_t)lim->max_model_len + VALUES_SLACK) {
        kvr_se_refuse(why, 400, "prompt",
                      "This model's maximum context length is %u tokens. However, the request "
                      "has more than %u values: its prompt is longer.",
                      lim->max_model_len, lim->max_model_len + VALUES_SLACK);
        return KVR_ERR_INVALID;
    }
    json_error_t err;
    json_t *root = json_loadb(body, len, 0, &err);
    if (!root) {
        char text[160];
        kvr_se_refuse(why, 400, NULL, "the request body is not valid JSON (line %d, column %d): %s",
                      err.line, err.column, kvr_log_safe(text, sizeof text, err.text));
        return KVR_ERR_INVALID;
    }
    kvr_status st = check(root, lim, out, why);
    json_decref(root);
    if (st != KVR_OK)
        kvr_se_completion_free(out);
    return st;
}

void kvr_se_completion_free(struct kvr_se_completion *c)
{
    free(c->prompt);
    memset(c, 0, sizeof *c);
}

uint64_t kvr_se_prompt_seed(const uint32_t *prompt, uint32_t n)
{
    return kvr_hash_bytes(prompt, (size_t)n * sizeof *prompt);
}

uint32_t kvr_se_token(uint64_t seed, uint32_t i)
{
    return (uint32_t)(kvr_mix64(seed + i) % VOCAB);
}

/* --- output ---------------------------------------------------------------------------------- */

/* Append prefix, j (compact; its reference taken, even on failure) and suffix to out. */
static kvr_status put_json(struct kvr_buf *out, json_t *j, const char *prefix, const char *suffix)
{
    if (!j)
        return KVR_ERR_NOMEM;
    size_t np = strlen(prefix), ns = strlen(suffix);
    size_t need = json_dumpb(j, NULL, 0, JSON_COMPACT);
    kvr_status st = need ? kvr_buf_reserve(out, out->len + np + need + ns) : KVR_ERR_NOMEM;
    if (st == KVR_OK) {
        memcpy(out->data + out->len, prefix, np);
        json_dumpb(j, (char *)out->data + out->len + np, need, JSON_COMPACT);
        memcpy(out->data + out->len + np + need, suffix, ns);
        out->len += np + need + ns;
    }
    json_decref(j);
    return st;
}

static kvr_status put_text(struct kvr_buf *out, const char *s)
{
    size_t n = strlen(s);
    if (kvr_buf_reserve(out, out->len + n) != KVR_OK)
        return KVR_ERR_NOMEM;
    memcpy(out->data + out->len, s, n);
    out->len += n;
    return KVR_OK;
}

static json_t *usage_of(const struct kvr_se_chunk *c)
{
    json_t *u = json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)c->prompt_tokens,
                          "completion_tokens", (json_int_t)c->completion_tokens, "total_tokens",
                          (json_int_t)c->prompt_tokens + c->completion_tokens);
    if (u && c->cached &&
        json_object_set_new(u, "prompt_tokens_details",
                            json_pack("{s:I}", "cached_tokens", (json_int_t)c->cached_tokens))) {
        json_decref(u);
        return NULL;
    }
    return u;
}

/* prompt_token_ids into the choice ch; false when memory ran out. */
static bool echo_prompt(json_t *ch, const struct kvr_se_chunk *c)
{
    json_t *p = json_array();
    for (uint32_t i = 0; p && i < c->prompt_tokens; i++)
        if (json_array_append_new(p, json_integer(c->prompt_ids[i]))) {
            json_decref(p);
            return false;
        }
    return p && json_object_set_new(ch, "prompt_token_ids", p) == 0;
}

/* The choice of tokens from..from+n: text, finish_reason, token_ids when asked (and the prompt's
 * with prompt_ids). */
static json_t *choice_of(const struct kvr_se_chunk *c)
{
    char *text = malloc((size_t)c->n * 8 + 1); /* " t31999" is 7 bytes */
    json_t *ids = c->token_ids ? json_array() : NULL;
    json_t *ch = NULL;
    if (!text || (c->token_ids && !ids))
        goto out;
    size_t at = 0;
    text[0] = 0;
    for (uint32_t i = 0; i < c->n; i++) {
        uint32_t t = kvr_se_token(c->seed, c->from + i);
        at += (size_t)snprintf(text + at, 9, " t%u", t);
        if (ids && json_array_append_new(ids, json_integer(t)))
            goto out;
    }
    ch = json_pack("{s:i, s:s, s:n, s:s?, s:n}", "index", 0, "text", text, "logprobs",
                   "finish_reason", c->finish, "stop_reason");
    if (ch && ids) {
        int rc = json_object_set_new(ch, "token_ids", ids); /* taken even on failure */
        ids = NULL;
        if (rc || (c->prompt_ids && !echo_prompt(ch, c))) {
            json_decref(ch);
            ch = NULL;
        }
    }
out:
    json_decref(ids);
    free(text);
    return ch;
}

/* The chunk's object: id, object, created, model, choices, usage when asked. */
static json_t *chunk_of(const struct kvr_se_chunk *c, bool usage)
{
    json_t *choices = json_array();
    if (choices && c->choices && json_array_append_new(choices, choice_of(c))) {
        json_decref(choices);
        return NULL;
    }
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", c->id, "object", "text_completion",
                          "created", (json_int_t)c->created, "model", c->model, "choices", choices);
    if (j && usage && json_object_set_new(j, "usage", usage_of(c))) {
        json_decref(j);
        return NULL;
    }
    return j;
}

kvr_status kvr_se_wire_sse_chunk(struct kvr_buf *out, const struct kvr_se_chunk *c)
{
    return put_json(out, chunk_of(c, c->usage), "data: ", "\n\n");
}

kvr_status kvr_se_wire_sse_done(struct kvr_buf *out)
{
    return put_text(out, "data: [DONE]\n\n");
}

kvr_status kvr_se_wire_completion(struct kvr_buf *out, const struct kvr_se_chunk *c)
{
    out->len = 0;
    return put_json(out, chunk_of(c, true), "", "");
}

static const char *type_of(unsigned status)
{
    switch (status) {
    case 400:
        return "BadRequestError";
    case 404:
        return "NotFoundError";
    case 405:
        return "MethodNotAllowedError";
    case 409:
        return "ConflictError";
    case 413:
        return "RequestEntityTooLargeError";
    case 429:
        return "TooManyRequestsError";
    case 503:
        return "ServiceUnavailableError";
    default:
        return "InternalServerError";
    }
}

static json_t *error_of(int shape, const struct kvr_se_refusal *r)
{
    const char *type = type_of(r->status);
    if (shape == KVR_SE_ERROR_NESTED)
        return json_pack("{s:{s:s, s:s, s:s?, s:i}}", "error", "message", r->message, "type", type,
                         "param", r->param, "code", (int)r->status);
    return json_pack("{s:s, s:s, s:s, s:s?, s:i}", "object", "error", "message", r->message, "type",
                     type, "param", r->param, "code", (int)r->status);
}

kvr_status kvr_se_wire_error(struct kvr_buf *out, int shape, const struct kvr_se_refusal *r)
{
    out->len = 0;
    return put_json(out, error_of(shape, r), "", "");
}

kvr_status kvr_se_wire_sse_error(struct kvr_buf *out, int shape, const struct kvr_se_refusal *r)
{
    return put_json(out, error_of(shape, r), "data: ", "\n\n");
}

kvr_status kvr_se_wire_models(struct kvr_buf *out, const char *model, uint64_t created,
                              uint32_t max_model_len)
{
    json_t *card =
        json_pack("{s:s, s:s, s:I, s:s, s:s, s:n, s:I, s:[]}", "id", model, "object", "model",
                  "created", (json_int_t)created, "owned_by", "kvengine", "root", model, "parent",
                  "max_model_len", (json_int_t)max_model_len, "permission");
    out->len = 0;
    return put_json(out, card ? json_pack("{s:s, s:[o]}", "object", "list", "data", card) : NULL,
                    "", "");
}

kvr_status kvr_se_wire_server_info(struct kvr_buf *out, const char *model, uint32_t page_size,
                                   uint64_t max_total_num_tokens, uint32_t context_length)
{
    out->len = 0;
    return put_json(out,
                    json_pack("{s:s, s:i, s:I, s:I, s:s}", "model_path", model, "page_size",
                              (int)page_size, "max_total_num_tokens",
                              (json_int_t)max_total_num_tokens, "context_length",
                              (json_int_t)context_length, "version", "kvengine"),
                    "", "");
}
