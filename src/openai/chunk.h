/*
 * The JSON of an OpenAI-compatible engine: one streamed completion chunk (an SSE event's data),
 * and an error body, parsed with jansson with every field type-checked and every number range-
 * checked before use. Pure; a parser's scratch belongs to one stream (one thread) at a time.
 *
 * A chunk: {"choices": [{"text"?, "token_ids"?, "finish_reason"?, "index"?, ...}] (at most one
 * choice: we never ask for n > 1), "usage"? {"prompt_tokens", "completion_tokens",
 * "prompt_tokens_details"? {"cached_tokens"}}, ...}; null stands for absent everywhere (vLLM
 * writes every unset field as null). Unknown fields are ignored. An error: {"error": {"message",
 * ...}} or {"object": "error", "message", ...}, the two shapes vLLM, SGLang and OpenAI use.
 */
#ifndef KVR_OAI_CHUNK_H
#define KVR_OAI_CHUNK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr/status.h"
#include "openai.h"

struct kvr_oai_scratch {
    uint32_t *ids;                   /* token ids of the last chunk, owned */
    uint32_t cap;                    /* entries allocated in ids */
    void *root;                      /* the parsed JSON of the last chunk (json_t), owned;
                                        NULL once released */
    char finish[KVR_OAI_FINISH_MAX]; /* the last chunk's finish_reason, made safe */
    bool has_choice;                 /* the last chunk had a choice (not usage only) */
};

/*
 * Parse one chunk (data[0..len), any bytes) into *out, which then points into s and stays
 * valid until the next parse, kvr_oai_scratch_release or kvr_oai_scratch_free; out->n_tokens is
 * left 0 (the caller counts tokens: it knows the stream's previous usage). KVR_OK; KVR_ERR_IO when
 * the chunk is an engine error (why: "engine error: <its message>"); KVR_ERR_MALFORMED with why
 * saying what is wrong; KVR_ERR_NOMEM. why (whylen bytes) is printable ASCII.
 */
kvr_status kvr_oai_chunk_parse(struct kvr_oai_scratch *s, const char *data, size_t len,
                               struct kvr_oai_chunk *out, char *why, size_t whylen);
void kvr_oai_scratch_free(struct kvr_oai_scratch *s);
/* Drop the last chunk's parsed JSON (~38 bytes a number: many times its text), once its out is
 * no longer used, so that a stream waiting for its next chunk keeps none of it. */
void kvr_oai_scratch_release(struct kvr_oai_scratch *s);

/*
 * The message of an error body (body[0..len), any bytes) into out (outlen bytes, printable
 * ASCII, escaped like kvr_log_safe): true when it had one of the two shapes; false, with the
 * start of the raw body, when not.
 */
bool kvr_oai_error_message(const char *body, size_t len, char *out, size_t outlen);

/* The status of an HTTP error (code >= 400) whose engine message is msg (ENGINES.md §2). */
kvr_status kvr_oai_http_status(long code, const char *msg);

#endif
