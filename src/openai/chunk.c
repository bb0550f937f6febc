/*
 * The engines' JSON: completion chunks and error bodies (chunk.h). jansson parses with
 * JSON_ALLOW_NUL (the model's text may hold any character) and rejects duplicate keys; numbers
 * beyond 64 bits fail inside jansson, the rest are checked against u32 here.
 */
#include "chunk.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "grow.h"
#include "log.h"

/* A member, with null taken as absent. */
static json_t *member(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

static bool as_u32(const json_t *v, uint32_t *out)
{
    if (!json_is_integer(v))
        return false;
    json_int_t x = json_integer_value(v);
    if (x < 0 || x > (json_int_t)UINT32_MAX)
        return false;
    *out = (uint32_t)x;
    return true;
}

/* Whether root is an error object of either shape; its message made safe into out. */
static bool error_of(const json_t *root, char *out, size_t outlen)
{
    const json_t *e = member(root, "error");
    const json_t *msg = NULL;
    if (e) {
        msg = json_is_object(e) ? member(e, "message") : e;
    } else {
        const json_t *obj = member(root, "object");
        if (!json_is_string(obj) || strcmp(json_string_value(obj), "error") != 0)
            return false;
        msg = member(root, "message");
    }
    kvr_log_safe(out, outlen, json_is_string(msg) ? json_string_value(msg) : "(no message)");
    return true;
}

static kvr_status malformed(char *why, size_t whylen, const char *what)
{
    snprintf(why, whylen, "malformed chunk: %s", what);
    return KVR_ERR_MALFORMED;
}

static kvr_status parse_ids(struct kvr_oai_scratch *s, const json_t *ids, struct kvr_oai_chunk *out,
                            char *why, size_t whylen)
{
    if (!json_is_array(ids))
        return malformed(why, whylen, "token_ids is not an array");
    size_t n = json_array_size(ids);
    if (n > UINT32_MAX)
        return malformed(why, whylen, "too many token_ids");
    /* at least one entry: an empty array is token ids too, never NULL (none sent) */
    if (!KVR_GROW(s->ids, s->cap, n ? (uint32_t)n : 1, 16))
        return KVR_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        if (!as_u32(json_array_get(ids, i), &s->ids[i]))
            return malformed(why, whylen, "a token id is not an integer in 0..2^32-1");
    }
    out->token_ids = s->ids;
    out->n_token_ids = (uint32_t)n;
    return KVR_OK;
}

static kvr_status parse_choice(struct kvr_oai_scratch *s, const json_t *choice,
                               struct kvr_oai_chunk *out, char *why, size_t whylen)
{
    if (!json_is_object(choice))
        return malformed(why, whylen, "a choice is not an object");
    const json_t *index = member(choice, "index");
    if (index && !json_is_integer(index))
        return malformed(why, whylen, "index is not an integer");
    const json_t *text = member(choice, "text");
    if (text) {
        if (!json_is_string(text))
            return malformed(why, whylen, "text is not a string");
        out->text = json_string_value(text);
        out->text_len = json_string_length(text);
    }
    const json_t *finish = member(choice, "finish_reason");
    if (finish) {
        if (!json_is_string(finish))
            return malformed(why, whylen, "finish_reason is not a string");
        /* "" names no reason: as null (how a writer without null writes an unset string) */
        kvr_log_safe(s->finish, sizeof s->finish, json_string_value(finish));
        out->finish_reason = s->finish[0] ? s->finish : NULL;
    }
    const json_t *ids = member(choice, "token_ids");
    return ids ? parse_ids(s, ids, out, why, whylen) : KVR_OK;
}

static kvr_status parse_usage(const json_t *usage, struct kvr_oai_usage *u, char *why,
                              size_t whylen)
{
    if (!json_is_object(usage))
        return malformed(why, whylen, "usage is not an object");
    if (!as_u32(member(usage, "prompt_tokens"), &u->prompt_tokens) ||
        !as_u32(member(usage, "completion_tokens"), &u->completion_tokens))
        return malformed(why, whylen, "usage token counts are not integers in 0..2^32-1");
    const json_t *details = member(usage, "prompt_tokens_details");
    if (!details)
        return KVR_OK;
    if (!json_is_object(details))
        return malformed(why, whylen, "prompt_tokens_details is not an object");
    const json_t *cached = member(details, "cached_tokens");
    if (!cached)
        return KVR_OK;
    if (!as_u32(cached, &u->cached_tokens))
        return malformed(why, whylen, "cached_tokens is not an integer in 0..2^32-1");
    u->have_cached = true;
    return KVR_OK;
}

void kvr_oai_scratch_free(struct kvr_oai_scratch *s)
{
    json_decref(s->root);
    free(s->ids);
    memset(s, 0, sizeof *s);
}

void kvr_oai_scratch_release(struct kvr_oai_scratch *s)
{
    json_decref(s->root);
    s->root = NULL;
}

kvr_status kvr_oai_chunk_parse(struct kvr_oai_scratch *s, const char *data, size_t len,
                               struct kvr_oai_chunk *out, char *why, size_t whylen)
{
    json_decref(s->root);
    s->has_choice = false;
    memset(out, 0, sizeof *out);
    out->text = "";
    json_error_t err;
    json_t *root = json_loadb(data, len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &err);
    s->root = root;
    if (!root) {
        char safe[96];
        snprintf(why, whylen, "malformed chunk: not JSON: %s",
                 kvr_log_safe(safe, sizeof safe, err.text));
        return KVR_ERR_MALFORMED;
    }
    if (!json_is_object(root))
        return malformed(why, whylen, "not an object");
    char msg[KVR_OAI_MESSAGE_MAX - 16];
    if (error_of(root, msg, sizeof msg)) {
        snprintf(why, whylen, "engine error: %s", msg);
        return KVR_ERR_IO;
    }
    const json_t *choices = member(root, "choices");
    if (!json_is_array(choices))
        return malformed(why, whylen, "choices is not an array");
    if (json_array_size(choices) > 1)
        return malformed(why, whylen, "more than one choice");
    kvr_status st = KVR_OK;
    s->has_choice = json_array_size(choices) == 1;
    if (s->has_choice)
        st = parse_choice(s, json_array_get(choices, 0), out, why, whylen);
    const json_t *usage = member(root, "usage");
    if (st == KVR_OK && usage) {
        st = parse_usage(usage, &out->usage, why, whylen);
        out->have_usage = st == KVR_OK;
    }
    return st;
}

bool kvr_oai_error_message(const char *body, size_t len, char *out, size_t outlen)
{
    json_t *root = json_loadb(body, len, JSON_ALLOW_NUL, NULL);
    bool shaped = json_is_object(root) && error_of(root, out, outlen);
    json_decref(root);
    if (shaped)
        return true;
    char raw[KVR_OAI_MESSAGE_MAX];
    size_t n = len < sizeof raw - 1 ? len : sizeof raw - 1;
    memcpy(raw, body, n);
    raw[n] = 0;
    kvr_log_safe(out, outlen, n ? raw : "(empty body)");
    return false;
}

/* Whether s contains word, ignoring ASCII case (word is lower case). */
static bool has_word(const char *s, const char *word)
{
    size_t n = strlen(word);
    for (; *s; s++) {
        size_t i = 0;
        while (i < n && s[i] && tolower((unsigned char)s[i]) == word[i])
            i++;
        if (i == n)
            return true;
    }
    return false;
}

kvr_status kvr_oai_http_status(long code, const char *msg)
{
    static const char *const too_long[] = {
        "context length", "maximum model length", "max_model_len", "context window",
        "too long",       "longer than",
    };
    if (code == 429 || code == 503)
        return KVR_ERR_OVERLOADED;
    if (code == 408 || code == 504)
        return KVR_ERR_TIMEOUT;
    if (code >= 500)
        return KVR_ERR_IO;
    if (code != 400 && code != 413 && code != 422)
        return KVR_ERR_INVALID;
    if (has_word(msg, "max_tokens") && (has_word(msg, "too large") || has_word(msg, "exceed")))
        return KVR_ERR_MAX_TOKENS_TOO_LARGE;
    for (size_t i = 0; i < sizeof too_long / sizeof too_long[0]; i++) {
        if (has_word(msg, too_long[i]))
            return KVR_ERR_PROMPT_TOO_LONG;
    }
    return KVR_ERR_INVALID;
}
