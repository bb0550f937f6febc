/*
 * kvengine's HTTP API (src/standin), in-process, through real sockets on 127.0.0.1 with libcurl:
 * streamed completions (tokens in order, finish_reason, usage and cached tokens for a repeated
 * prompt, continuous usage), stream=false, every refusal (bad JSON, wrong types, too long,
 * negative max_tokens, unknown paths, wrong methods, bodies too large, overload, drain), a client
 * that closes (mid-stream or during its prefill) cancelling its request in the engine, a client
 * that does not read, the connection limit, /metrics through promtool, the SGLang style, the
 * test hooks, and the time to first token (printed, not asserted).
 */
#include <criterion/criterion.h>
#include "../../criterion_gt.h"
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <curl/curl.h>

#include "rig.h"
#include "wire.h"

static struct kvr_se_config cfg;
static struct kvr_standin *srv;
static uint16_t port;

static void up(void)
{
    srv = rig_start(&cfg);
    port = kvr_standin_port(srv);
}

static void setup(void)
{
    rig_config(&cfg);
}

static void teardown(void)
{
    kvr_standin_destroy(srv);
    srv = NULL;
    curl_global_cleanup();
}

TestSuite(http, .init = setup, .fini = teardown, .timeout = 60);

/* {"prompt":[base..base+n), "max_tokens":m, ...extra} */
static char *body_of(uint32_t n, uint32_t base, uint32_t m, const char *extra)
{
    char *p = rig_prompt(n, base);
    size_t len = strlen(p) + strlen(extra) + 64;
    char *b = malloc(len);
    snprintf(b, len, "{\"prompt\":%s,\"max_tokens\":%u%s}", p, m, extra);
    free(p);
    return b;
}

static uint64_t seed_of(uint32_t n, uint32_t base)
{
    uint32_t t[4096];
    for (uint32_t i = 0; i < n; i++)
        t[i] = base + i;
    return kvr_se_prompt_seed(t, n);
}

/* jansson's tests are macros, which Criterion's cr_assert cannot take first */
static bool is_null(json_t *j)
{
    return json_is_null(j);
}

static bool is_int(json_t *j)
{
    return json_is_integer(j);
}

static const char *str_at(json_t *j, const char *path)
{
    return json_string_value(json_object_get(j, path));
}

static json_t *choice0(json_t *ev)
{
    return json_array_get(json_object_get(ev, "choices"), 0);
}

/* A stream's choice chunks check out: n tokens of seed, in order, the last one "length". */
static void check_tokens(const struct rig_stream *s, size_t n, uint64_t seed, bool ids)
{
    const char *id = str_at(s->ev[0], "id");
    cr_assert(eq(int, strncmp(id, "cmpl-", 5), 0), "id %s", id);
    for (size_t i = 0; i < n; i++) {
        json_t *ev = s->ev[i], *c = choice0(ev);
        cr_assert(eq(str, (char *)str_at(ev, "id"), (char *)id));
        cr_assert(eq(str, (char *)str_at(ev, "object"), "text_completion"));
        cr_assert(eq(str, (char *)str_at(ev, "model"), "kvengine"));
        cr_assert(is_int(json_object_get(ev, "created")));
        cr_assert(eq(sz, json_array_size(json_object_get(ev, "choices")), 1));
        cr_assert(eq(i64, json_integer_value(json_object_get(c, "index")), 0));
        uint32_t tok = kvr_se_token(seed, (uint32_t)i);
        char text[16];
        snprintf(text, sizeof text, " t%u", tok);
        cr_assert(eq(str, (char *)str_at(c, "text"), text), "chunk %zu", i);
        cr_assert(is_null(json_object_get(c, "logprobs")));
        json_t *fr = json_object_get(c, "finish_reason");
        if (i + 1 < n)
            cr_assert(is_null(fr), "chunk %zu finished early", i);
        else
            cr_assert(eq(str, (char *)json_string_value(fr), "length"));
        json_t *tids = json_object_get(c, "token_ids");
        if (!ids) {
            cr_assert(eq(ptr, tids, NULL));
            continue;
        }
        cr_assert(eq(sz, json_array_size(tids), 1));
        cr_assert(eq(i64, json_integer_value(json_array_get(tids, 0)), tok));
    }
}

static void check_usage(json_t *u, uint32_t prompt, uint32_t completion, int64_t cached)
{
    cr_assert(ne(ptr, u, NULL));
    cr_assert(eq(i64, json_integer_value(json_object_get(u, "prompt_tokens")), prompt));
    cr_assert(eq(i64, json_integer_value(json_object_get(u, "completion_tokens")), completion));
    cr_assert(eq(i64, json_integer_value(json_object_get(u, "total_tokens")), prompt + completion));
    json_t *d = json_object_get(u, "prompt_tokens_details");
    if (cached < 0)
        cr_assert(eq(ptr, d, NULL));
    else
        cr_assert(eq(i64, json_integer_value(json_object_get(d, "cached_tokens")), cached));
}

Test(http, streamed_completion_tokens_in_order_then_usage_then_done)
{
    up();
    char *b = body_of(10, 100, 5,
                      ",\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                      "\"return_token_ids\":true");
    struct rig_stream s;
    rig_stream(port, b, 0, &s);
    cr_assert(eq(int, s.resp.curl, CURLE_OK));
    cr_assert(eq(long, s.resp.status, 200));
    cr_assert(eq(int, strncmp(s.resp.ctype, "text/event-stream", 17), 0), "%s", s.resp.ctype);
    cr_assert(not(s.bad));
    cr_assert(s.done);
    cr_assert(eq(sz, s.n, 6)); /* 5 tokens, the usage chunk */
    check_tokens(&s, 5, seed_of(10, 100), true);
    for (size_t i = 0; i < 5; i++)
        cr_assert(eq(ptr, json_object_get(s.ev[i], "usage"), NULL));
    json_t *last = s.ev[5];
    cr_assert(eq(sz, json_array_size(json_object_get(last, "choices")), 0));
    check_usage(json_object_get(last, "usage"), 10, 5, 0);
    rig_stream_free(&s);
    free(b);
}

Test(http, repeated_prompt_reports_cached_tokens)
{
    up();
    char *b = body_of(10, 7, 2, ",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    struct rig_stream s[2];
    for (int i = 0; i < 2; i++) {
        rig_stream(port, b, 0, &s[i]);
        cr_assert(s[i].done);
        cr_assert(eq(sz, s[i].n, 3));
    }
    check_tokens(&s[1], 2, seed_of(10, 7), false);
    check_usage(json_object_get(s[0].ev[2], "usage"), 10, 2, 0);
    /* 10 tokens at block size 4: two full blocks cached, the last token always computed */
    check_usage(json_object_get(s[1].ev[2], "usage"), 10, 2, 8);
    cr_assert(eq(dbl, rig_metric(port, "vllm:prefix_cache_queries_total"), 20));
    cr_assert(eq(dbl, rig_metric(port, "vllm:prefix_cache_hits_total"), 8));
    for (int i = 0; i < 2; i++)
        rig_stream_free(&s[i]);
    free(b);
}

Test(http, continuous_usage_on_every_chunk)
{
    up();
    char *b = body_of(6, 1, 4,
                      ",\"stream\":true,\"stream_options\":{\"include_usage\":true,"
                      "\"continuous_usage_stats\":true}");
    struct rig_stream s;
    rig_stream(port, b, 0, &s);
    cr_assert(s.done);
    cr_assert(eq(sz, s.n, 5));
    for (uint32_t i = 0; i < 4; i++)
        check_usage(json_object_get(s.ev[i], "usage"), 6, i + 1, -1);
    check_usage(json_object_get(s.ev[4], "usage"), 6, 4, 0);
    rig_stream_free(&s);
    free(b);
}

Test(http, no_usage_without_include_usage)
{
    up();
    char *b = body_of(5, 1, 3, ",\"stream\":true");
    struct rig_stream s;
    rig_stream(port, b, 0, &s);
    cr_assert(s.done);
    cr_assert(eq(sz, s.n, 3));
    check_tokens(&s, 3, seed_of(5, 1), false);
    for (size_t i = 0; i < 3; i++)
        cr_assert(eq(ptr, json_object_get(s.ev[i], "usage"), NULL));
    rig_stream_free(&s);
    free(b);
}

Test(http, stream_false_is_one_completion)
{
    up();
    char *b = body_of(9, 3, 4, ",\"return_token_ids\":true,\"model\":\"kvengine\"");
    struct rig_resp r;
    cr_assert(eq(long, rig_post(port, "/v1/completions", b, &r), 200));
    cr_assert(eq(str, r.ctype, "application/json"));
    json_t *j = rig_json(&r), *c = choice0(j);
    uint64_t seed = seed_of(9, 3);
    char text[64] = "";
    for (uint32_t i = 0; i < 4; i++) {
        snprintf(text + strlen(text), sizeof text - strlen(text), " t%u", kvr_se_token(seed, i));
        cr_assert(eq(i64, json_integer_value(json_array_get(json_object_get(c, "token_ids"), i)),
                     kvr_se_token(seed, i)));
    }
    cr_assert(eq(str, (char *)str_at(j, "object"), "text_completion"));
    cr_assert(eq(str, (char *)str_at(c, "text"), text));
    cr_assert(eq(str, (char *)str_at(c, "finish_reason"), "length"));
    check_usage(json_object_get(j, "usage"), 9, 4, 0);
    json_decref(j);
    rig_resp_free(&r);
    free(b);
}

/* --- refusals -------------------------------------------------------------------------------- */

/* body answered with status, type, a message containing want and param (NULL: null). */
static void refused(const char *body, long status, const char *type, const char *want,
                    const char *param)
{
    struct rig_resp r;
    cr_assert(eq(long, rig_post(port, "/v1/completions", body, &r), status), "%s -> %s", body,
              r.body);
    json_t *j = rig_json(&r);
    cr_assert(eq(str, (char *)str_at(j, "object"), "error"), "%s", r.body);
    cr_assert(eq(str, (char *)str_at(j, "type"), (char *)type), "%s", r.body);
    cr_assert(eq(i64, json_integer_value(json_object_get(j, "code")), status));
    cr_assert(ne(ptr, strstr(str_at(j, "message"), want), NULL), "%s: %s", body, r.body);
    json_t *p = json_object_get(j, "param");
    if (param)
        cr_assert(eq(str, (char *)json_string_value(p), (char *)param), "%s", r.body);
    else
        cr_assert(is_null(p), "%s", r.body);
    json_decref(j);
    rig_resp_free(&r);
}

Test(http, every_bad_request_is_400_with_vllm_error_body)
{
    cfg.max_model_len = 64;
    up();
    static const struct {
        const char *body, *want, *param;
    } cases[] = {
        {"{\"prompt\":[1,2", "not valid JSON", NULL},
        {"", "not valid JSON", NULL},
        {"[1,2,3]", "must be a JSON object", NULL},
        {"{\"prompt\":\"hello\"}", "prompt must be token ids", "prompt"},
        {"{\"prompt\":[\"a\",\"b\"]}", "prompt must be token ids", "prompt"},
        {"{\"max_tokens\":3}", "`prompt` is required", "prompt"},
        {"{\"prompt\":null}", "`prompt` is required", "prompt"},
        {"{\"prompt\":[]}", "must not be empty", "prompt"},
        {"{\"prompt\":[[1,2],[3]]}", "batch of prompts", "prompt"},
        {"{\"prompt\":{\"a\":1}}", "must be a list of token ids", "prompt"},
        {"{\"prompt\":[1,2.5]}", "prompt[1] must be a token id", "prompt"},
        {"{\"prompt\":[1,-3]}", "prompt[1] must be a token id", "prompt"},
        {"{\"prompt\":[4294967296]}", "prompt[0] must be a token id", "prompt"},
        {"{\"prompt\":[1,true]}", "prompt[1] must be a token id", "prompt"},
        {"{\"prompt\":[1],\"max_tokens\":-5}", "at least 1, got -5", "max_tokens"},
        {"{\"prompt\":[1],\"max_tokens\":0}", "at least 1, got 0", "max_tokens"},
        {"{\"prompt\":[1],\"max_tokens\":\"7\"}", "must be an integer", "max_tokens"},
        {"{\"prompt\":[1],\"max_tokens\":2.0}", "must be an integer", "max_tokens"},
        {"{\"prompt\":[1],\"stream\":\"yes\"}", "`stream` must be a boolean", "stream"},
        {"{\"prompt\":[1],\"return_token_ids\":1}", "must be a boolean", "return_token_ids"},
        {"{\"prompt\":[1],\"stream_options\":{\"include_usage\":true}}",
         "only be defined when `stream=True`", "stream_options"},
        {"{\"prompt\":[1],\"stream\":true,\"stream_options\":[1]}", "must be an object",
         "stream_options"},
        {"{\"prompt\":[1],\"stream\":true,\"stream_options\":{\"include_usage\":1}}",
         "`include_usage` must be a boolean", "include_usage"},
        {"{\"prompt\":[1],\"n\":2}", "`n` must be 1", "n"},
        {"{\"prompt\":[1],\"echo\":true}", "`echo` is not supported", "echo"},
        {"{\"prompt\":[1],\"logprobs\":1}", "`logprobs` is not supported", "logprobs"},
        {"{\"prompt\":[1],\"model\":7}", "`model` must be a string", "model"},
        {"{\"prompt\":[1],\"max_tokens\":64}",
         "maximum context length is 64 tokens. However, "
         "you requested 65 tokens (1 in the prompt, 64",
         "max_tokens"},
        {"{\"prompt\":[1],\"max_tokens\":9223372036854775807}", "maximum context length",
         "max_tokens"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        refused(cases[i].body, 400, "BadRequestError", cases[i].want, cases[i].param);
    char *p = body_of(65, 0, 1, "");
    refused(p, 400, "BadRequestError",
            "maximum context length is 64 tokens. However, your "
            "request has 65 input tokens",
            "prompt");
    free(p);
    /* far too many values: refused before the parse, and still as the context length */
    char *big = body_of(400, 0, 1, "");
    refused(big, 400, "BadRequestError", "maximum context length is 64 tokens", "prompt");
    free(big);
    refused("{\"prompt\":[1],\"model\":\"gpt-4\"}", 404, "NotFoundError",
            "The model `gpt-4` does not exist.", "model");
    cr_assert(eq(dbl, rig_metric(port, "kvengine_http_refusals_total{code=\"400\"}"),
                 sizeof cases / sizeof cases[0] + 2));
    cr_assert(eq(dbl, rig_metric(port, "kvengine_requests_total"), 0));
}

Test(http, a_request_larger_than_the_kv_pool_is_400_with_the_figures)
{
    cfg.engine.num_blocks = 16; /* 64 tokens */
    up();
    char *b = body_of(60, 0, 10, "");
    refused(b, 400, "BadRequestError",
            "too long for the KV cache: the prompt (60 tokens) and max_tokens (10) need 18 "
            "blocks of 4 tokens, the whole cache has 16",
            "max_tokens");
    free(b);
}

Test(http, a_prompt_the_engine_could_never_admit_is_400)
{
    cfg.engine.num_blocks = 1000; /* 4,000 tokens; admission keeps 10 blocks free */
    cfg.engine.max_batched_tokens = 4000;
    cfg.max_model_len = 4000;
    up();
    char *b = body_of(3980, 0, 1, "");
    refused(b, 400, "BadRequestError",
            "prompt too long for the KV cache: its first prefill chunk (3980 tokens) needs 995 "
            "blocks of 4 tokens, the engine admits 990 at most",
            "prompt");
    free(b);
    b = body_of(3950, 0, 50, ""); /* in one chunk, the rest of the pool for its output */
    struct rig_resp r;
    cr_assert(eq(long, rig_post(port, "/v1/completions", b, &r), 200), "%s", r.body);
    rig_resp_free(&r);
    free(b);
}

Test(http, nested_error_shape)
{
    cfg.error_shape = KVR_SE_ERROR_NESTED;
    up();
    struct rig_resp r;
    cr_assert(eq(long, rig_post(port, "/v1/completions", "{\"prompt\":\"x\"}", &r), 400));
    json_t *j = rig_json(&r), *e = json_object_get(j, "error");
    cr_assert(eq(ptr, json_object_get(j, "object"), NULL));
    cr_assert(eq(str, (char *)str_at(e, "type"), "BadRequestError"));
    cr_assert(eq(i64, json_integer_value(json_object_get(e, "code")), 400));
    cr_assert(ne(ptr, strstr(str_at(e, "message"), "prompt must be token ids"), NULL));
    json_decref(j);
    rig_resp_free(&r);
}

static void check_error(const struct rig_resp *r, long status, const char *type)
{
    cr_assert(eq(long, r->status, status), "%s", r->body);
    json_t *j = rig_json(r);
    cr_assert(eq(str, (char *)str_at(j, "type"), (char *)type), "%s", r->body);
    cr_assert(eq(i64, json_integer_value(json_object_get(j, "code")), status));
    json_decref(j);
}

Test(http, unknown_path_404_wrong_method_405)
{
    up();
    struct rig_resp r;
    rig_get(port, "/v1/chat/completions", &r);
    check_error(&r, 404, "NotFoundError");
    rig_resp_free(&r);
    rig_get(port, "/test/stall", &r); /* the hooks are off by default */
    check_error(&r, 404, "NotFoundError");
    rig_resp_free(&r);
    rig_get(port, "/get_server_info", &r); /* SGLang's, not vLLM's */
    check_error(&r, 404, "NotFoundError");
    rig_resp_free(&r);
    rig_get(port, "/v1/completions", &r);
    check_error(&r, 405, "MethodNotAllowedError");
    cr_assert(eq(str, r.allow, "POST"));
    rig_resp_free(&r);
    rig_post(port, "/metrics", "{}", &r);
    check_error(&r, 405, "MethodNotAllowedError");
    cr_assert(eq(str, r.allow, "GET, HEAD"));
    rig_resp_free(&r);
    rig_http(port, "DELETE", "/health", NULL, NULL, &r);
    check_error(&r, 405, "MethodNotAllowedError");
    rig_resp_free(&r);
    /* the connection limit is not worn down by refusals */
    cr_assert(eq(long, rig_get(port, "/health", &r), 200));
    rig_resp_free(&r);
}

Test(http, body_too_large_413)
{
    cfg.max_body_bytes = 1024;
    up();
    char *b = body_of(300, 0, 1, ""); /* > 1 KB */
    struct rig_resp r;
    rig_post(port, "/v1/completions", b, &r);
    check_error(&r, 413, "RequestEntityTooLargeError");
    rig_resp_free(&r);
    const char *const chunked[] = {"Transfer-Encoding: chunked", NULL};
    rig_http(port, "POST", "/v1/completions", b, chunked, &r);
    check_error(&r, 413, "RequestEntityTooLargeError");
    rig_resp_free(&r);
    char *ok = body_of(20, 0, 1, "");
    cr_assert(eq(long, rig_http(port, "POST", "/v1/completions", ok, chunked, &r), 200), "%s",
              r.body);
    rig_resp_free(&r);
    cr_assert(eq(dbl, rig_metric(port, "kvengine_http_refusals_total{code=\"413\"}"), 2));
    free(ok);
    free(b);
}

Test(http, models_health_and_head)
{
    up();
    struct rig_resp r;
    cr_assert(eq(long, rig_get(port, "/v1/models", &r), 200));
    json_t *j = rig_json(&r), *m = json_array_get(json_object_get(j, "data"), 0);
    cr_assert(eq(str, (char *)str_at(j, "object"), "list"));
    cr_assert(eq(str, (char *)str_at(m, "id"), "kvengine"));
    cr_assert(eq(str, (char *)str_at(m, "object"), "model"));
    cr_assert(eq(i64, json_integer_value(json_object_get(m, "max_model_len")), 2048));
    json_decref(j);
    rig_resp_free(&r);
    cr_assert(eq(long, rig_get(port, "/health", &r), 200));
    cr_assert(eq(sz, r.len, 0));
    rig_resp_free(&r);
    cr_assert(eq(long, rig_http(port, "HEAD", "/health", NULL, NULL, &r), 200));
    rig_resp_free(&r);
}

/* --- clients that leave, and overload --------------------------------------------------------- */

/* POST /test/stall?ms=ms (the hooks on). */
static void stall(unsigned ms)
{
    char path[64];
    struct rig_resp r;
    snprintf(path, sizeof path, "/test/stall?ms=%u", ms);
    cr_assert(eq(long, rig_post(port, path, "", &r), 200), "%s", r.body);
    rig_resp_free(&r);
}

/* The engine holds exactly n requests, within 5 s. */
static void held(double n)
{
    cr_assert(eq(dbl, rig_wait_metric(port, "kvengine_requests_held", n, 5000), n));
}

static void pool_freed(void)
{
    cr_assert(eq(dbl, rig_wait_metric(port, "vllm:num_requests_running", 0, 5000), 0));
    cr_assert(eq(dbl, rig_metric(port, "vllm:num_requests_waiting"), 0));
    cr_assert(eq(dbl, rig_metric(port, "vllm:kv_cache_usage_perc"), 0));
}

Test(http, client_closing_mid_stream_cancels_the_engine_request)
{
    cfg.engine.speedup = 1; /* a token a millisecond or more: 1,500 of them outlast the test */
    up();
    char *b = body_of(12, 0, 1500, ",\"stream\":true");
    struct rig_stream s;
    rig_stream(port, b, 3, &s);
    cr_assert(eq(int, s.resp.curl, CURLE_WRITE_ERROR)); /* the client cut it */
    /* after 3 events at least: one read may bring several (7 in a CI run on a loaded machine) */
    cr_assert(ge(sz, s.n, 3));
    cr_assert(lt(sz, s.n, 1500), "cut long before the end");
    cr_assert(eq(dbl, rig_wait_metric(port, "kvengine_requests_aborted_total", 1, 5000), 1));
    cr_assert(eq(dbl, rig_metric(port, "kvengine_engine_cancels_total"), 1));
    cr_assert(eq(dbl, rig_metric(port, "kvengine_requests_finished_total"), 0));
    held(0);
    pool_freed();
    double gen = rig_metric(port, "vllm:generation_tokens_total");
    rig_sleep_ms(50);
    cr_assert(eq(dbl, rig_metric(port, "vllm:generation_tokens_total"), gen)); /* it stopped */
    cr_assert(lt(dbl, gen, 1500));
    rig_stream_free(&s);
    free(b);
}

Test(http, client_closing_during_prefill_cancels_at_once)
{
    cfg.test_hooks = true;
    up();
    stall(20000);
    char *b[2] = {body_of(8, 0, 4, ",\"stream\":true"), body_of(8, 50, 4, "")};
    for (int i = 0; i < 2; i++) { /* a stream, then a whole answer: both wait in the engine */
        char *raw = rig_raw_post("/v1/completions", b[i]);
        int fd = rig_send_raw(port, raw);
        held(1);
        uint64_t t0 = rig_now_ns();
        close(fd);
        cr_assert(
            eq(dbl, rig_wait_metric(port, "kvengine_requests_aborted_total", i + 1, 5000), i + 1));
        cr_log_info("client gone -> cancel seen on /metrics: %.1f ms",
                    (double)(rig_now_ns() - t0) / 1e6);
        held(0);
        free(raw);
        free(b[i]);
    }
    cr_assert(eq(dbl, rig_metric(port, "vllm:num_requests_waiting"), 0));
}

Test(http, overloaded_is_429_and_capacity_returns)
{
    cfg.test_hooks = true;
    cfg.max_inflight = 1;
    up();
    struct rig_resp r;
    stall(20000);
    char *b = body_of(8, 0, 2, ",\"stream\":true");
    char *raw = rig_raw_post("/v1/completions", b);
    int fd = rig_send_raw(port, raw);
    held(1);
    rig_post(port, "/v1/completions", b, &r);
    check_error(&r, 429, "TooManyRequestsError");
    cr_assert(ne(ptr, strstr(r.body, "at most 1"), NULL), "%s", r.body);
    rig_resp_free(&r);
    close(fd);
    held(0);
    stall(1); /* over */
    struct rig_stream s;
    rig_stream(port, b, 0, &s);
    cr_assert(s.done);
    rig_stream_free(&s);
    free(raw);
    free(b);
}

Test(http, a_client_that_does_not_read_is_cut_off)
{
    cfg.stream_buffer_bytes = 4096;
    cfg.max_model_len = 32768;
    cfg.engine.num_blocks = 16384;
    up();
    char *b = body_of(8, 0, 30000, ",\"stream\":true,\"return_token_ids\":true");
    char *raw = rig_raw_post("/v1/completions", b);
    int fd = rig_send_raw_buf(port, raw, 4096); /* never read */
    cr_assert(eq(dbl, rig_wait_metric(port, "kvengine_stream_overflows_total", 1, 20000), 1));
    held(0);
    pool_freed();
    cr_assert(lt(dbl, rig_metric(port, "vllm:generation_tokens_total"), 30000));
    close(fd);
    free(raw);
    free(b);
}

Test(http, connection_limit)
{
    cfg.max_connections = 2;
    up();
    int fds[2];
    for (int i = 0; i < 2; i++)
        fds[i] = rig_send_raw(port, "");
    /* once libmicrohttpd has accepted both, a third connection is closed unanswered */
    uint64_t deadline = rig_now_ns() + 5000000000ull;
    struct rig_resp r;
    long st;
    while ((st = rig_get(port, "/health", &r)) != 0 && rig_now_ns() < deadline)
        rig_resp_free(&r);
    rig_resp_free(&r);
    cr_assert(eq(long, st, 0), "a third connection was served");
    close(fds[0]);
    deadline = rig_now_ns() + 5000000000ull;
    while ((st = rig_get(port, "/health", &r)) != 200 && rig_now_ns() < deadline) {
        rig_resp_free(&r);
        rig_sleep_ms(10);
    }
    rig_resp_free(&r);
    cr_assert(eq(long, st, 200));
    close(fds[1]);
}

/* A stream waiting longer than the idle timeout for its next token is not cut; an idle
 * keep-alive connection after it is. */
Test(http, a_long_wait_is_not_idle_but_an_idle_connection_is_closed)
{
    cfg.test_hooks = true;
    cfg.idle_timeout_ns = 1000 * 1000000ull;
    up();
    stall(1800);
    char *b = body_of(8, 0, 20, ",\"stream\":true");
    struct rig_stream s;
    rig_stream(port, b, 0, &s);
    cr_assert(eq(int, s.resp.curl, CURLE_OK));
    cr_assert(s.done);
    cr_assert(eq(sz, s.n, 20));
    cr_assert(ge(dbl, (double)(s.first_ns - s.sent_ns) / 1e6, 1000)); /* it did wait */
    rig_stream_free(&s);
    char *raw = rig_raw_post("/v1/completions", b);
    int fd = rig_send_raw(port, raw);
    char buf[65536];
    struct timeval tv = {10, 0}; /* a server that never closes fails the test, not hangs it */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint64_t t0 = rig_now_ns();
    ssize_t n;
    size_t got = 0;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0) /* the answer, then the close */
        got += (size_t)n;
    double ms = (double)(rig_now_ns() - t0) / 1e6;
    cr_assert(gt(sz, got, 0));
    cr_assert(lt(dbl, ms, 10000), "an idle connection stayed open %.0f ms", ms);
    close(fd);
    free(raw);
    free(b);
}

/* --- metrics --------------------------------------------------------------------------------- */

static const char *find_promtool(void)
{
    static char buf[4096];
    const char *path = getenv("PATH");
    while (path && *path) {
        size_t n = strcspn(path, ":");
        if (n > 0 &&
            (size_t)snprintf(buf, sizeof buf, "%.*s/promtool", (int)n, path) < sizeof buf &&
            access(buf, X_OK) == 0)
            return buf;
        path += n + (path[n] == ':');
    }
    return access("/usr/bin/promtool", X_OK) == 0 ? "/usr/bin/promtool" : NULL;
}

/* promtool check metrics on text: its exit status; its output in out. */
static int promtool(const char *text, char *out, size_t len)
{
    const char *tool = find_promtool();
    cr_assert(ne(ptr, (void *)tool, NULL),
              "promtool not found: install Debian's prometheus package");
    char file[] = "/tmp/kvengine_metrics_XXXXXX";
    int fd = mkstemp(file);
    cr_assert(ge(int, fd, 0));
    cr_assert(eq(i64, (int64_t)write(fd, text, strlen(text)), (int64_t)strlen(text)));
    close(fd);
    int p[2];
    cr_assert(eq(int, pipe(p), 0));
    pid_t pid = fork();
    if (pid == 0) {
        int in = open(file, O_RDONLY);
        if (in < 0 || dup2(in, 0) < 0 || dup2(p[1], 1) < 0 || dup2(p[1], 2) < 0)
            _exit(126);
        close(p[0]);
        execl(tool, "promtool", "check", "metrics", (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    size_t at = 0;
    ssize_t n;
    while ((n = read(p[0], out + at, len - 1 - at)) > 0)
        at += (size_t)n;
    out[at] = 0;
    close(p[0]);
    int status;
    waitpid(pid, &status, 0);
    unlink(file);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* Lint clean but for the engine's own ':' names, which promtool flags in a real vLLM's too. */
static void promtool_clean(const char *text, const char *prefix)
{
    if (getenv("KVR_VALGRIND")) { /* valgrind follows children; Go's runtime is all errors */
        cr_log_info("under valgrind: promtool not run");
        return;
    }
    char out[65536];
    int rc = promtool(text, out, sizeof out);
    cr_assert(rc == 0 || rc == 3, "promtool failed (%d): %s", rc, out);
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        cr_assert(eq(int, strncmp(line, prefix, strlen(prefix)), 0), "promtool: %s", line);
        cr_assert(ne(ptr, strstr(line, "metric names should not contain ':'"), NULL),
                  "promtool: %s", line);
    }
}

Test(http, metrics_pass_promtool)
{
    cfg.kv_events[0] = 0;
    up();
    char *b = body_of(10, 0, 3, ",\"stream\":true");
    struct rig_stream s;
    rig_stream(port, b, 0, &s);
    rig_stream_free(&s);
    struct rig_resp r;
    rig_post(port, "/v1/completions", "{\"prompt\":\"x\"}", &r);
    rig_resp_free(&r);
    cr_assert(eq(long, rig_get(port, "/metrics", &r), 200));
    cr_assert(eq(int, strncmp(r.ctype, "text/plain; version=0.0.4", 25), 0));
    cr_assert(ne(ptr,
                 strstr(r.body, "vllm:cache_config_info{engine=\"0\",block_size=\"4\","
                                "num_gpu_blocks=\"1024\""),
                 NULL),
              "%s", r.body);
    cr_assert(eq(dbl, rig_metric(port, "vllm:num_requests_running"), 0));
    cr_assert(eq(dbl, rig_metric(port, "vllm:generation_tokens_total"), 3));
    cr_assert(eq(dbl, rig_metric(port, "kvengine_requests_finished_total"), 1));
    cr_assert(eq(dbl, rig_metric(port, "kvengine_time_to_first_token_seconds_count"), 1));
    cr_assert(eq(dbl, rig_metric(port, "kvengine_kv_events_enabled"), 0));
    promtool_clean(r.body, "vllm:");
    rig_resp_free(&r);
    free(b);
}

Test(http, sglang_style_metrics_and_server_info)
{
    cfg.metrics_style = KVR_SE_STYLE_SGLANG;
    up();
    char *b = body_of(10, 0, 2, "");
    struct rig_resp r;
    cr_assert(eq(long, rig_post(port, "/v1/completions", b, &r), 200));
    rig_resp_free(&r);
    rig_post(port, "/v1/completions", b, &r);
    rig_resp_free(&r);
    cr_assert(eq(long, rig_get(port, "/metrics", &r), 200));
    cr_assert(eq(ptr, strstr(r.body, "vllm:"), NULL));
    cr_assert(eq(dbl, rig_metric(port, "sglang:num_running_reqs"), 0));
    cr_assert(eq(dbl, rig_metric(port, "sglang:num_queue_reqs"), 0));
    cr_assert(eq(dbl, rig_metric(port, "sglang:token_usage"), 0));
    cr_assert(eq(dbl, rig_metric(port, "sglang:cache_hit_rate"), 8.0 / 20));
    promtool_clean(r.body, "sglang:");
    rig_resp_free(&r);
    cr_assert(eq(long, rig_get(port, "/get_server_info", &r), 200));
    json_t *j = rig_json(&r);
    cr_assert(eq(i64, json_integer_value(json_object_get(j, "page_size")), 4));
    cr_assert(eq(i64, json_integer_value(json_object_get(j, "max_total_num_tokens")), 4096));
    json_decref(j);
    rig_resp_free(&r);
    free(b);
}

/* --- test hooks ------------------------------------------------------------------------------ */

Test(http, test_hooks_check_their_arguments)
{
    cfg.test_hooks = true;
    up();
    static const char *const bad[] = {
        "/test/stall",           "/test/stall?ms=0",        "/test/stall?ms=abc",
        "/test/stall?ms=600001", "/test/drop_batches?n=-1", "/test/drop_batches?n=1x"};
    struct rig_resp r;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rig_post(port, bad[i], "", &r);
        check_error(&r, 400, "BadRequestError");
        rig_resp_free(&r);
    }
    rig_post(port, "/test/drop_batches?n=3", "", &r); /* no KV events configured */
    check_error(&r, 409, "ConflictError");
    rig_resp_free(&r);
    rig_get(port, "/test/clear", &r);
    check_error(&r, 405, "MethodNotAllowedError");
    rig_resp_free(&r);
}

Test(http, clear_refused_while_requests_run)
{
    cfg.test_hooks = true;
    up();
    struct rig_resp r;
    stall(20000);
    char *b = body_of(8, 0, 2, "");
    char *raw = rig_raw_post("/v1/completions", b);
    int fd = rig_send_raw(port, raw);
    held(1);
    rig_post(port, "/test/clear", "", &r);
    check_error(&r, 409, "ConflictError");
    rig_resp_free(&r);
    close(fd);
    held(0);
    cr_assert(eq(long, rig_post(port, "/test/clear", "", &r), 200));
    rig_resp_free(&r);
    cr_assert(eq(dbl, rig_metric(port, "kvengine_test_clears_total"), 1));
    free(raw);
    free(b);
}

Test(http, clear_drops_the_prefix_cache)
{
    cfg.test_hooks = true;
    up();
    char *b = body_of(10, 0, 1, ",\"stream\":true,\"stream_options\":{}");
    struct rig_stream s;
    struct rig_resp r;
    rig_stream(port, b, 0, &s);
    rig_stream_free(&s);
    cr_assert(eq(long, rig_post(port, "/test/clear", "", &r), 200));
    rig_resp_free(&r);
    rig_stream(port, b, 0, &s); /* stream_options {}: include_usage defaults to true */
    cr_assert(eq(sz, s.n, 2));
    check_usage(json_object_get(s.ev[1], "usage"), 10, 1, 0);
    rig_stream_free(&s);
    free(b);
}

/* --- drain ----------------------------------------------------------------------------------- */

static void *stream_thread(void *arg)
{
    struct rig_stream *s = arg;
    char *b = body_of(8, 0, 1500, ",\"stream\":true");
    rig_stream(port, b, 0, s);
    free(b);
    return NULL;
}

Test(http, drain_aborts_what_runs_with_an_error_event_and_refuses_new_requests)
{
    cfg.engine.speedup = 1;
    cfg.drain_timeout_ns = 100 * 1000000ull;
    up();
    static struct rig_stream s;
    pthread_t t;
    pthread_create(&t, NULL, stream_thread, &s);
    held(1);
    cr_assert(eq(u32, kvr_standin_drain(srv), 1));
    pthread_join(t, NULL);
    cr_assert(eq(long, s.resp.status, 200));
    cr_assert(s.done, "the stream got no [DONE] after the drain");
    cr_assert(gt(sz, s.n, 1));
    json_t *last = s.ev[s.n - 1];
    cr_assert(eq(str, (char *)str_at(last, "type"), "ServiceUnavailableError"));
    cr_assert(ne(ptr, strstr(str_at(last, "message"), "shutting down"), NULL));
    rig_stream_free(&s);
    struct rig_resp r;
    char *b = body_of(8, 0, 2, "");
    rig_post(port, "/v1/completions", b, &r);
    check_error(&r, 503, "ServiceUnavailableError");
    rig_resp_free(&r);
    rig_get(port, "/health", &r);
    check_error(&r, 503, "ServiceUnavailableError");
    rig_resp_free(&r);
    cr_assert(eq(dbl, rig_metric(port, "kvengine_requests_shutdown_total"), 1));
    cr_assert(eq(dbl, rig_metric(port, "kvengine_draining"), 1));
    free(b);
}

static int count_fds(void)
{
    int n = 0;
    char path[64];
    for (int fd = 0; fd < 4096; fd++) {
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        n += access(path, F_OK) == 0;
    }
    return n;
}

Test(http, destroy_releases_every_descriptor)
{
    snprintf(cfg.kv_events, sizeof cfg.kv_events, "tcp://127.0.0.1:*");
    snprintf(cfg.kv_replay, sizeof cfg.kv_replay, "tcp://127.0.0.1:*");
    int before = count_fds();
    up();
    char *b = body_of(8, 0, 3, ",\"stream\":true");
    struct rig_stream s;
    rig_stream(port, b, 0, &s);
    cr_assert(s.done);
    rig_stream_free(&s);
    char *raw = rig_raw_post("/v1/completions", b);
    int fd = rig_send_raw(port, raw); /* a connection still open at the destroy */
    cr_assert(eq(dbl, rig_wait_metric(port, "kvengine_requests_total", 2, 5000), 2));
    kvr_standin_destroy(srv);
    srv = NULL;
    close(fd);
    cr_assert(eq(int, count_fds(), before));
    free(raw);
    free(b);
}

/* --- time to first token --------------------------------------------------------------------- */

Test(http, time_to_first_token_is_printed)
{
    cfg.engine.speedup = 1; /* the engine's own timing */
    up();
    char *b = body_of(16, 0, 1, ",\"stream\":true");
    double ms[5];
    for (int i = 0; i < 5; i++) {
        struct rig_stream s;
        rig_stream(port, b, 0, &s);
        cr_assert(s.done);
        ms[i] = (double)(s.first_ns - s.sent_ns) / 1e6;
        rig_stream_free(&s);
    }
    double sum = rig_metric(port, "kvengine_time_to_first_token_seconds_sum");
    double n = rig_metric(port, "kvengine_time_to_first_token_seconds_count");
    fprintf(stderr,
            "kvengine TTFT, 16-token prompt, speedup 1: client %.2f %.2f %.2f %.2f %.2f ms; "
            "engine side mean %.2f ms\n",
            ms[0], ms[1], ms[2], ms[3], ms[4], sum / n * 1e3);
    free(b);
}
