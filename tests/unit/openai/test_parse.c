/*
 * The pure parsers of src/openai: Server-Sent Events (every framing, every split point, the
 * bound), the completion chunk and error JSON (every field's type and range), the HTTP status
 * mapping, the Prometheus text reader and the engine metrics taken from vLLM's and SGLang's
 * expositions (several versions, written from their docs), SGLang's /get_server_info.
 */
#include <criterion/criterion.h>
#include "../../criterion_gt.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "chunk.h"
#include "http.h"
#include "openai.h"
#include "promtext.h"
#include "sse.h"

/* ---- SSE ---- */

/* Events seen, joined as "<data>|" so a sequence compares as one string. */
struct events {
    char text[8192];
    size_t len;
    unsigned n;
    unsigned stop_after; /* 0: never stop */
};

static bool on_event(void *ctx, const char *data, size_t len)
{
    struct events *e = ctx;
    cr_assert(eq(int, data[len], 0), "data is NUL-terminated");
    cr_assert(lt(sz, e->len + len + 1, sizeof e->text));
    memcpy(e->text + e->len, data, len);
    e->len += len;
    e->text[e->len++] = '|';
    e->text[e->len] = 0;
    e->n++;
    return !(e->stop_after && e->n == e->stop_after);
}

/* Takes a large event: checks its length only (ctx: unused). */
static bool on_big(void *ctx, const char *data, size_t len)
{
    (void)ctx;
    cr_assert(eq(sz, len, 300000 - 8));
    cr_assert(eq(int, data[0], 'x'));
    return true;
}

static void feed_all(const char *in, size_t n, size_t max, struct events *e)
{
    struct kvr_sse p;
    kvr_sse_init(&p, max);
    memset(e, 0, sizeof *e);
    cr_assert(eq(int, kvr_sse_feed(&p, in, n, on_event, e), KVR_OK));
    kvr_sse_free(&p);
}

Test(sse, framings)
{
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"data: a\n\n", "a|"},
        {"data: a\r\n\r\n", "a|"},
        {"data: a\r\rdata: b\r\r", "a|b|"},
        {"data:a\n\n", "a|"},              /* no space after the colon */
        {"data:  a\n\n", " a|"},           /* only one space is dropped */
        {"data: a\ndata: b\n\n", "a\nb|"}, /* lines joined by LF */
        {": comment\ndata: x\n\n", "x|"},  /* comments ignored */
        {"event: e\nid: 1\nretry: 5\ndata: y\n\n", "y|"},
        {"data\n\n", "|"},     /* a bare field name: empty data */
        {"datax: no\n\n", ""}, /* another field */
        {"dat: no\n\n", ""},
        {"\n\n\n", ""},       /* blank lines alone dispatch nothing */
        {"event: e\n\n", ""}, /* no data line: no event */
        {"\xef\xbb\xbf"
         "data: bom\n\n",
         "bom|"}, /* a leading BOM is skipped */
        {"\xef\xbb"
         "data: no\n\n",
         ""},                           /* half a BOM is content (a bad field) */
        {"data: a\n\ndata: b\n", "a|"}, /* an unfinished event waits */
        {"data: {\"x\":1}\n\ndata: [DONE]\n\n", "{\"x\":1}|[DONE]|"},
        {"data: a\r\n\ndata: b\n\r\n", "a|b|"},
        {"data: \xff\x01\n\n", "\xff\x01|"}, /* bytes are bytes */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct events e;
        feed_all(cases[i].in, strlen(cases[i].in), 0, &e);
        cr_expect(eq(str, e.text, (char *)cases[i].want), "case %zu", i);
    }
}

Test(sse, nul_inside_data)
{
    static const char in[] = "data: a\0b\n\n";
    struct events e;
    feed_all(in, sizeof in - 1, 0, &e);
    cr_assert(eq(u32, e.n, 1));
    cr_assert(eq(sz, e.len, 4)); /* "a\0b|" */
    cr_assert(eq(int, memcmp(e.text, "a\0b|", 4), 0));
}

/* The same events whatever the split: in two at every point, and one byte at a time. */
Test(sse, every_split)
{
    static const char in[] = "\xef\xbb\xbf: hi\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata:l1\n"
                             "data: l2\r\rdata\n\n: c\ndata: [DONE]\n\n";
    size_t n = sizeof in - 1;
    struct events whole;
    feed_all(in, n, 0, &whole);
    cr_assert(eq(str, whole.text, "{\"a\":1}|l1\nl2||[DONE]|"));
    for (size_t cut = 0; cut <= n; cut++) {
        struct kvr_sse p;
        kvr_sse_init(&p, 0);
        struct events e = {0};
        cr_assert(eq(int, kvr_sse_feed(&p, in, cut, on_event, &e), KVR_OK));
        cr_assert(eq(int, kvr_sse_feed(&p, in + cut, n - cut, on_event, &e), KVR_OK));
        cr_expect(eq(str, e.text, whole.text), "cut at %zu", cut);
        kvr_sse_free(&p);
    }
    struct kvr_sse p;
    kvr_sse_init(&p, 0);
    struct events e = {0};
    for (size_t i = 0; i < n; i++)
        cr_assert(eq(int, kvr_sse_feed(&p, in + i, 1, on_event, &e), KVR_OK));
    cr_assert(eq(str, e.text, whole.text));
    cr_assert(not(kvr_sse_pending(&p)));
    kvr_sse_free(&p);
}

Test(sse, bound)
{
    struct kvr_sse p;
    struct events e = {0};
    /* exactly max bytes pass, over one line or two */
    kvr_sse_init(&p, 8);
    cr_assert(eq(int, kvr_sse_feed(&p, "data: 12345678\n\n", 16, on_event, &e), KVR_OK));
    cr_assert(eq(int, kvr_sse_feed(&p, "data: 123\ndata: 4567\n\n", 22, on_event, &e), KVR_OK));
    cr_assert(eq(str, e.text, "12345678|123\n4567|"));
    /* one byte more is an error, and the parser stays stopped */
    cr_assert(
        eq(int, kvr_sse_feed(&p, "data: 123456789\n\n", 17, on_event, &e), KVR_ERR_TOO_LARGE));
    cr_assert(eq(int, kvr_sse_feed(&p, "data: 1\n\n", 9, on_event, &e), KVR_ERR_INVALID));
    kvr_sse_free(&p);
    /* the bound holds across lines and across feeds, and nothing past it is allocated */
    kvr_sse_init(&p, 1000);
    char chunk[100];
    memset(chunk, 'x', sizeof chunk);
    kvr_status st = kvr_sse_feed(&p, "data: ", 6, on_event, &e);
    for (int i = 0; i < 100 && st == KVR_OK; i++)
        st = kvr_sse_feed(&p, chunk, sizeof chunk, on_event, &e);
    cr_assert(eq(int, st, KVR_ERR_TOO_LARGE));
    cr_assert(le(sz, p.data.cap, 2048));
    kvr_sse_free(&p);
    /* empty data lines that never end the event count against the bound too: nine of them
     * make an event of 8 bytes (eight "\n", the last one dropped), a tenth is past it */
    kvr_sse_init(&p, 8);
    memset(&e, 0, sizeof e);
    const char *nine = "data:\ndata\ndata:\ndata: \ndata\ndata\ndata\ndata\ndata:\n";
    cr_assert(eq(int, kvr_sse_feed(&p, nine, strlen(nine), on_event, &e), KVR_OK));
    cr_assert(eq(int, kvr_sse_feed(&p, "data:\n", 6, on_event, &e), KVR_ERR_TOO_LARGE));
    cr_assert(le(sz, p.data.cap, 256));
    kvr_sse_free(&p);
    kvr_sse_init(&p, 8);
    cr_assert(eq(int, kvr_sse_feed(&p, nine, strlen(nine), on_event, &e), KVR_OK));
    cr_assert(eq(int, kvr_sse_feed(&p, "\n", 1, on_event, &e), KVR_OK));
    cr_assert(eq(str, e.text, "\n\n\n\n\n\n\n\n|"));
    kvr_sse_free(&p);
    kvr_sse_init(&p, 1000);
    st = KVR_OK;
    for (int i = 0; i < 100000 && st == KVR_OK; i++)
        st = kvr_sse_feed(&p, "data\n", 5, on_event, &e);
    cr_assert(eq(int, st, KVR_ERR_TOO_LARGE));
    cr_assert(le(sz, p.data.cap, 2048));
    kvr_sse_free(&p);
    /* comment lines and other fields of any length are never stored */
    kvr_sse_init(&p, 16);
    memset(&e, 0, sizeof e);
    st = kvr_sse_feed(&p, ":", 1, on_event, &e);
    for (int i = 0; i < 1000 && st == KVR_OK; i++)
        st = kvr_sse_feed(&p, chunk, sizeof chunk, on_event, &e);
    cr_assert(eq(int, st, KVR_OK));
    cr_assert(eq(int, kvr_sse_feed(&p, "\nevent: ", 8, on_event, &e), KVR_OK));
    for (int i = 0; i < 1000 && st == KVR_OK; i++)
        st = kvr_sse_feed(&p, chunk, sizeof chunk, on_event, &e);
    cr_assert(eq(int, kvr_sse_feed(&p, "\ndata: ok\n\n", 11, on_event, &e), KVR_OK));
    cr_assert(eq(str, e.text, "ok|"));
    cr_assert(le(sz, p.data.cap, 256));
    kvr_sse_free(&p);
}

/* A large event's room is freed once it is handed over; a small one's is kept for the next. */
Test(sse, a_large_event_does_not_keep_its_room)
{
    struct kvr_sse p;
    kvr_sse_init(&p, 0);
    struct events e = {0};
    cr_assert(eq(int, kvr_sse_feed(&p, "data: small\n\n", 13, on_event, &e), KVR_OK));
    size_t small = p.data.cap;
    cr_assert(gt(sz, small, 0), "a small event's room is kept");
    static char big[300000];
    memcpy(big, "data: ", 6);
    memset(big + 6, 'x', sizeof big - 8);
    memcpy(big + sizeof big - 2, "\n\n", 2);
    struct events quiet = {0};
    cr_assert(eq(int, kvr_sse_feed(&p, big, sizeof big, on_big, NULL), KVR_OK));
    cr_assert(le(sz, p.data.cap, 64 * 1024), "%zu bytes kept after a 300 KB event", p.data.cap);
    cr_assert(eq(int, kvr_sse_feed(&p, "data: next\n\n", 12, on_event, &quiet), KVR_OK));
    cr_assert(eq(str, quiet.text, "next|"));
    kvr_sse_free(&p);
}

Test(sse, stop)
{
    struct kvr_sse p;
    kvr_sse_init(&p, 0);
    struct events e = {.stop_after = 1};
    cr_assert(eq(int, kvr_sse_feed(&p, "data: a\n\ndata: b\n\n", 18, on_event, &e), KVR_OK));
    cr_assert(eq(str, e.text, "a|"));
    cr_assert(eq(int, kvr_sse_feed(&p, "data: c\n\n", 9, on_event, &e), KVR_ERR_INVALID));
    kvr_sse_free(&p);
}

/* ---- chunks ---- */

static kvr_status parse(struct kvr_oai_scratch *s, const char *json, struct kvr_oai_chunk *c,
                        char *why)
{
    return kvr_oai_chunk_parse(s, json, strlen(json), c, why, KVR_OAI_MESSAGE_MAX);
}

Test(chunk, vllm_shapes)
{
    struct kvr_oai_scratch s = {0};
    struct kvr_oai_chunk c;
    char why[KVR_OAI_MESSAGE_MAX];
    /* a chunk as vLLM writes it with return_token_ids and continuous usage */
    cr_assert(eq(int,
                 parse(&s,
                       "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":"
                       "\"m\",\"choices\":[{\"index\":0,\"text\":\" Hi\",\"logprobs\":null,"
                       "\"finish_reason\":null,\"stop_reason\":null,\"prompt_token_ids\":[1,2],"
                       "\"token_ids\":[4294967295,0]}],\"usage\":{\"prompt_tokens\":2,"
                       "\"completion_tokens\":2,\"total_tokens\":4}}",
                       &c, why),
                 KVR_OK),
              "%s", why);
    cr_assert(eq(u32, c.n_token_ids, 2));
    cr_assert(eq(u32, c.token_ids[0], 4294967295u));
    cr_assert(eq(u32, c.token_ids[1], 0));
    cr_assert(eq(sz, c.text_len, 3));
    cr_assert(eq(str, (char *)c.text, " Hi"));
    cr_assert(eq(ptr, (void *)c.finish_reason, NULL));
    cr_assert(c.have_usage);
    cr_assert(eq(u32, c.usage.prompt_tokens, 2));
    cr_assert(eq(u32, c.usage.completion_tokens, 2));
    cr_assert(not(c.usage.have_cached));
    cr_assert(s.has_choice);
    /* the final usage chunk, with cached tokens */
    cr_assert(eq(int,
                 parse(&s,
                       "{\"id\":\"c\",\"object\":\"text_completion\",\"choices\":[],\"usage\":"
                       "{\"prompt_tokens\":10,\"completion_tokens\":5,\"total_tokens\":15,"
                       "\"prompt_tokens_details\":{\"cached_tokens\":8}}}",
                       &c, why),
                 KVR_OK));
    cr_assert(not(s.has_choice));
    cr_assert(eq(ptr, (void *)c.token_ids, NULL));
    cr_assert(eq(sz, c.text_len, 0));
    cr_assert(eq(str, (char *)c.text, ""));
    cr_assert(c.usage.have_cached);
    cr_assert(eq(u32, c.usage.cached_tokens, 8));
    /* text only, a finish, a NUL in the text, nulls for every optional field */
    cr_assert(eq(int,
                 parse(&s,
                       "{\"choices\":[{\"index\":0,\"text\":\"a\\u0000b\",\"finish_reason\":"
                       "\"length\",\"token_ids\":null}],\"usage\":null}",
                       &c, why),
                 KVR_OK),
              "%s", why);
    cr_assert(eq(sz, c.text_len, 3));
    cr_assert(eq(int, memcmp(c.text, "a\0b", 3), 0));
    cr_assert(eq(str, (char *)c.finish_reason, "length"));
    cr_assert(not(c.have_usage));
    /* a finish_reason of any bytes and length comes out bounded and printable */
    cr_assert(eq(int,
                 parse(&s,
                       "{\"choices\":[{\"text\":\"\",\"finish_reason\":\"\\u0001\\u001b[31m "
                       "abcdefghijklmnopqrstuvwxyz0123456789\"}]}",
                       &c, why),
                 KVR_OK));
    cr_assert(lt(sz, strlen(c.finish_reason), KVR_OAI_FINISH_MAX));
    for (const char *p = c.finish_reason; *p; p++)
        cr_assert(gt(int, *p, 0x1f));
    cr_assert(eq(int, strncmp(c.finish_reason, "\\x01\\x1b", 8), 0));
    kvr_oai_scratch_free(&s);
}

/* "token_ids": [] is token ids, none of them: never taken for no token_ids at all (on a fresh
 * scratch it once came out NULL, so the chunk counted by its text, as an engine without ids) */
Test(chunk, empty_token_ids_are_ids_an_empty_finish_reason_is_none)
{
    struct kvr_oai_scratch s = {0};
    struct kvr_oai_chunk c;
    char why[KVR_OAI_MESSAGE_MAX];
    cr_assert(
        eq(int, parse(&s, "{\"choices\":[{\"text\":\"a\",\"token_ids\":[]}]}", &c, why), KVR_OK));
    cr_assert(ne(ptr, (void *)c.token_ids, NULL));
    cr_assert(eq(u32, c.n_token_ids, 0));
    cr_assert(eq(int, parse(&s, "{\"choices\":[{\"text\":\"a\"}]}", &c, why), KVR_OK));
    cr_assert(eq(ptr, (void *)c.token_ids, NULL)); /* absent: none */
    /* and a finish_reason "" (or one that is nothing printable before a NUL) is none */
    cr_assert(eq(int, parse(&s, "{\"choices\":[{\"text\":\"a\",\"finish_reason\":\"\"}]}", &c, why),
                 KVR_OK));
    cr_assert(eq(ptr, (void *)c.finish_reason, NULL));
    cr_assert(
        eq(int, parse(&s, "{\"choices\":[{\"finish_reason\":\"\\u0000stop\"}]}", &c, why), KVR_OK));
    cr_assert(eq(ptr, (void *)c.finish_reason, NULL));
    kvr_oai_scratch_free(&s);
}

Test(chunk, malformed)
{
    static const char *const bad[] = {
        "",
        "not json",
        "{\"choices\":[{\"text\":\"a\"}]",
        "[]",
        "42",
        "{}",
        "{\"choices\":{}}",
        "{\"choices\":null}",
        "{\"choices\":[1]}",
        "{\"choices\":[{},{}]}",
        "{\"choices\":[{\"text\":5}]}",
        "{\"choices\":[{\"text\":\"a\",\"index\":\"0\"}]}",
        "{\"choices\":[{\"finish_reason\":1}]}",
        "{\"choices\":[{\"token_ids\":\"1,2\"}]}",
        "{\"choices\":[{\"token_ids\":[-1]}]}",
        "{\"choices\":[{\"token_ids\":[4294967296]}]}",
        "{\"choices\":[{\"token_ids\":[1.5]}]}",
        "{\"choices\":[{\"token_ids\":[\"5\"]}]}",
        "{\"choices\":[{\"token_ids\":[null]}]}",
        "{\"choices\":[{\"token_ids\":[99999999999999999999999999]}]}",
        "{\"choices\":[{\"token_ids\":[1e400]}]}",
        "{\"choices\":[],\"usage\":5}",
        "{\"choices\":[],\"usage\":{}}",
        "{\"choices\":[],\"usage\":{\"prompt_tokens\":\"1\",\"completion_tokens\":1}}",
        "{\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":-1}}",
        "{\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,"
        "\"prompt_tokens_details\":[]}}",
        "{\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,"
        "\"prompt_tokens_details\":{\"cached_tokens\":1e3}}}",
        "{\"choices\":[],\"choices\":[]}", /* duplicate keys */
    };
    struct kvr_oai_scratch s = {0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct kvr_oai_chunk c;
        char why[KVR_OAI_MESSAGE_MAX] = "";
        cr_expect(eq(int, parse(&s, bad[i], &c, why), KVR_ERR_MALFORMED), "case %zu: %s", i,
                  bad[i]);
        cr_expect(eq(int, strncmp(why, "malformed chunk: ", 17), 0), "%s", why);
        for (const char *p = why; *p; p++)
            cr_assert(ge(int, (unsigned char)*p, 0x20));
    }
    kvr_oai_scratch_free(&s);
}

Test(chunk, engine_errors)
{
    static const char *const errs[] = {
        "{\"error\":{\"message\":\"boom\",\"type\":\"BadRequestError\",\"code\":400}}",
        "{\"error\":{\"object\":\"error\",\"message\":\"boom\",\"type\":\"x\",\"code\":400}}",
        "{\"object\":\"error\",\"message\":\"boom\",\"type\":\"x\",\"param\":null,\"code\":400}",
        "{\"error\":\"boom\"}",
    };
    struct kvr_oai_scratch s = {0};
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
        struct kvr_oai_chunk c;
        char why[KVR_OAI_MESSAGE_MAX] = "";
        cr_expect(eq(int, parse(&s, errs[i], &c, why), KVR_ERR_IO), "case %zu", i);
        cr_expect(eq(str, why, "engine error: boom"), "case %zu", i);
    }
    struct kvr_oai_chunk c;
    char why[KVR_OAI_MESSAGE_MAX] = "";
    cr_assert(eq(int, parse(&s, "{\"error\":{\"code\":1}}", &c, why), KVR_ERR_IO));
    cr_assert(eq(str, why, "engine error: (no message)"));
    /* null error is no error */
    cr_assert(eq(int, parse(&s, "{\"error\":null,\"choices\":[]}", &c, why), KVR_OK));
    kvr_oai_scratch_free(&s);
}

Test(chunk, error_bodies)
{
    char msg[KVR_OAI_MESSAGE_MAX];
    const char *a = "{\"error\":{\"message\":\"no\\nway\",\"type\":\"t\",\"code\":\"c\"}}";
    cr_assert(kvr_oai_error_message(a, strlen(a), msg, sizeof msg));
    cr_assert(eq(str, msg, "no\\x0away"));
    const char *b = "{\"object\":\"error\",\"message\":\"m\",\"code\":404}";
    cr_assert(kvr_oai_error_message(b, strlen(b), msg, sizeof msg));
    cr_assert(eq(str, msg, "m"));
    const char *c = "Internal Server Error\r\n";
    cr_assert(not(kvr_oai_error_message(c, strlen(c), msg, sizeof msg)));
    cr_assert(eq(str, msg, "Internal Server Error\\x0d\\x0a"));
    cr_assert(not(kvr_oai_error_message("", 0, msg, sizeof msg)));
    cr_assert(eq(str, msg, "(empty body)"));
    char big[5000];
    memset(big, 'q', sizeof big);
    cr_assert(not(kvr_oai_error_message(big, sizeof big, msg, sizeof msg)));
    cr_assert(lt(sz, strlen(msg), sizeof msg));
}

Test(chunk, http_status)
{
    static const struct {
        long code;
        const char *msg;
        kvr_status want;
    } cases[] = {
        {400, "bad things", KVR_ERR_INVALID},
        {400, "This model's maximum context length is 4096 tokens.", KVR_ERR_PROMPT_TOO_LONG},
        {400, "The decoder prompt (length 5000) is longer than the maximum model length of 4096.",
         KVR_ERR_PROMPT_TOO_LONG},
        {400, "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
         KVR_ERR_PROMPT_TOO_LONG},
        {400, "'max_tokens' is too large: 5000. This model's maximum context length is 4096",
         KVR_ERR_MAX_TOKENS_TOO_LARGE},
        {422, "Prompt TOO LONG", KVR_ERR_PROMPT_TOO_LONG},
        {404, "The model `x` does not exist.", KVR_ERR_INVALID},
        {401, "", KVR_ERR_INVALID},
        {408, "", KVR_ERR_TIMEOUT},
        {429, "", KVR_ERR_OVERLOADED},
        {500, "context length", KVR_ERR_IO},
        {502, "", KVR_ERR_IO},
        {503, "", KVR_ERR_OVERLOADED},
        {504, "", KVR_ERR_TIMEOUT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_expect(eq(int, kvr_oai_http_status(cases[i].code, cases[i].msg), cases[i].want),
                  "case %zu", i);
}

/* ---- the Prometheus text ---- */

Test(promtext, lines)
{
    char scratch[KVR_PROMTEXT_LINE_MAX];
    struct kvr_promtext_sample s;
    bool is;
    const char *l = "vllm:x{a=\"q\\\"u\\\\o\\nte\",b=\"\",} 1.5e3 1700000000000";
    cr_assert(eq(int, kvr_promtext_line(l, strlen(l), scratch, &s, &is), KVR_OK));
    cr_assert(is);
    cr_assert(eq(sz, s.name_len, 6));
    cr_assert(eq(u32, s.n_labels, 2));
    cr_assert(eq(int, memcmp(s.labels[0].value, "q\"u\\o\nte", 8), 0));
    cr_assert(eq(sz, s.labels[0].value_len, 8));
    cr_assert(eq(sz, s.labels[1].value_len, 0));
    cr_assert(kvr_promtext_label_is(&s.labels[1], "b"));
    cr_assert(eq(dbl, s.value, 1500.0));
    cr_assert(s.has_timestamp);
    cr_assert(eq(i64, s.timestamp_ms, 1700000000000));
    static const char *const ok[] = {
        "a 1",       "  a\t-2",   "a{} 0",  "a { x = \"1\" } +Inf",
        "a NaN",     "a -Inf -5", "a 1e-3", "# HELP a b",
        "#anything", "",          "   ",    "_a:b_c 3",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        cr_expect(eq(int, kvr_promtext_line(ok[i], strlen(ok[i]), scratch, &s, &is), KVR_OK), "%s",
                  ok[i]);
    static const char *const bad[] = {
        "a",
        "1a 1",
        "a{x=1} 1",
        "a{x=\"1} 1",
        "a{x=\"\\t\"} 1",
        "a{1x=\"\"} 1",
        "a 0x10",
        "a inf",
        "a 1 2 3",
        "a 1 1.5",
        "a{x=\"1\"}1",
        "a{x=\"1\" y=\"2\"} 1",
        "a{x=\"1\",,} 1",
        "a 1e999",
        "a{x} 1",
        "a- 1",
        "a{x=\"1\"",
        "a 1 9999999999999999999999",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect(
            eq(int, kvr_promtext_line(bad[i], strlen(bad[i]), scratch, &s, &is), KVR_ERR_MALFORMED),
            "%s", bad[i]);
    /* bounds: a line too long, too many labels */
    static char big[KVR_PROMTEXT_LINE_MAX + 2];
    memset(big, 'a', KVR_PROMTEXT_LINE_MAX + 1);
    cr_assert(eq(int, kvr_promtext_line(big, KVR_PROMTEXT_LINE_MAX + 1, scratch, &s, &is),
                 KVR_ERR_TOO_LARGE));
    size_t n = 0;
    for (int i = -1; i <= KVR_PROMTEXT_LABELS_MAX; i++)
        n += (size_t)snprintf(big + n, sizeof big - n, i < 0 ? "a{" : "l%d=\"v\",", i);
    n += (size_t)snprintf(big + n, sizeof big - n, "} 1");
    cr_assert(eq(int, kvr_promtext_line(big, n, scratch, &s, &is), KVR_ERR_MALFORMED));
}

/* vLLM V1 (0.10-0.11), two data-parallel engines, as the docs show it. */
static const char vllm_v1[] =
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 3.0\n"
    "vllm:num_requests_running{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 5.0\n"
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    "vllm:num_requests_waiting{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 2.0\n"
    "vllm:num_requests_waiting{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.0\n"
    "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.25\n"
    "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.75\n"
    "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried "
    "tokens.\n"
    "# TYPE vllm:prefix_cache_queries_total counter\n"
    "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 1000.0\n"
    "vllm:prefix_cache_queries_total{engine=\"1\",model_name=\"m\"} 500.0\n"
    "# TYPE vllm:prefix_cache_queries_created gauge\n"
    "vllm:prefix_cache_queries_created{engine=\"0\",model_name=\"m\"} 1.7e9\n"
    "# TYPE vllm:prefix_cache_hits_total counter\n"
    "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 600.0\n"
    "vllm:prefix_cache_hits_total{engine=\"1\",model_name=\"m\"} 100.0\n"
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",calculate_kv_scales=\"False\","
    "cpu_offload_gb=\"0\",enable_prefix_caching=\"True\",engine=\"0\",gpu_memory_utilization="
    "\"0.9\",is_attention_free=\"False\",num_cpu_blocks=\"None\",num_gpu_blocks=\"27000\","
    "num_gpu_blocks_override=\"None\",prefix_caching_hash_algo=\"sha256\",sliding_window=\"None\","
    "swap_space=\"4\",swap_space_bytes=\"4294967296\"} 1.0\n"
    "vllm:cache_config_info{block_size=\"16\",engine=\"1\",num_gpu_blocks=\"27000\"} 1.0\n"
    "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.\n"
    "# TYPE vllm:time_to_first_token_seconds histogram\n"
    "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.001\",model_name=\"m\"} 0.0\n"
    "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"m\"} 12.0\n"
    "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"m\"} 12.0\n"
    "vllm:time_to_first_token_seconds_sum{engine=\"0\",model_name=\"m\"} 0.52\n"
    "python_gc_objects_collected_total{generation=\"0\"} 12345.0\n";

/* vLLM V0 (0.6-0.8): the old usage name, the hit rate gauge, num_gpu_blocks as a label. */
static const char vllm_v0[] =
    "# HELP vllm:cache_config_info information of cache_config\n"
    "# TYPE vllm:cache_config_info gauge\n"
    "vllm:cache_config_info{block_size=\"32\",cache_dtype=\"auto\",enable_prefix_caching="
    "\"False\",gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"2048\",num_gpu_blocks=\"7000\","
    "num_gpu_blocks_override=\"None\",sliding_window=\"None\",swap_space_bytes=\"4294967296\"} "
    "1.0\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{model_name=\"facebook/opt-125m\"} 1.0\n"
    "vllm:num_requests_swapped{model_name=\"facebook/opt-125m\"} 0.0\n"
    "vllm:num_requests_waiting{model_name=\"facebook/opt-125m\"} 4.0\n"
    "vllm:gpu_cache_usage_perc{model_name=\"facebook/opt-125m\"} 0.5\n"
    "vllm:cpu_cache_usage_perc{model_name=\"facebook/opt-125m\"} 0.0\n"
    "vllm:gpu_prefix_cache_hit_rate{model_name=\"facebook/opt-125m\"} 0.125\n";

/* SGLang (0.4-0.5), as its production metrics page shows it. */
static const char sglang_text[] =
    "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.\n"
    "# TYPE sglang:prompt_tokens_total counter\n"
    "sglang:prompt_tokens_total{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 8.128902e+06\n"
    "# HELP sglang:num_running_reqs The number of running requests.\n"
    "# TYPE sglang:num_running_reqs gauge\n"
    "sglang:num_running_reqs{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 28.0\n"
    "# HELP sglang:num_used_tokens The number of used tokens.\n"
    "# TYPE sglang:num_used_tokens gauge\n"
    "sglang:num_used_tokens{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 123859.0\n"
    "# HELP sglang:token_usage The token usage\n"
    "# TYPE sglang:token_usage gauge\n"
    "sglang:token_usage{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.28\n"
    "# HELP sglang:cache_hit_rate The cache hit rate\n"
    "# TYPE sglang:cache_hit_rate gauge\n"
    "sglang:cache_hit_rate{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} "
    "0.007507552643049313\n"
    "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"
    "# TYPE sglang:num_queue_reqs gauge\n"
    "sglang:num_queue_reqs{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 2826.0\n"
    "sglang:time_to_first_token_seconds_bucket{le=\"0.001\",model_name=\"m\"} 0.0\n";

static void metrics(const char *text, struct kvr_engine_metrics *m, kvr_status want)
{
    cr_assert(eq(int, kvr_oai_metrics_parse(text, strlen(text), m), want));
}

Test(metrics, vllm_v1)
{
    struct kvr_engine_metrics m;
    metrics(vllm_v1, &m, KVR_OK);
    cr_assert(eq(int, m.kind, KVR_ENGINE_VLLM));
    cr_assert(m.have_running && m.have_waiting && m.have_kv_usage);
    cr_assert(eq(u64, m.running, 8));
    cr_assert(eq(u64, m.waiting, 2));
    cr_assert(eq(dbl, m.kv_usage, 0.5));
    cr_assert(m.have_block_size);
    cr_assert(not(m.block_size_conflict));
    cr_assert(eq(u32, m.block_size, 16));
    cr_assert(m.have_num_blocks);
    cr_assert(eq(u64, m.num_blocks, 54000));
    cr_assert(m.have_capacity_tokens);
    cr_assert(eq(u64, m.capacity_tokens, 54000 * 16));
    cr_assert(m.have_prefix_cache);
    cr_assert(eq(dbl, m.prefix_cache_hits, 700.0));
    cr_assert(eq(dbl, m.prefix_cache_queries, 1500.0));
    cr_assert(not(m.have_cache_hit_rate));
    cr_assert(eq(u32, m.bad_lines, 0));
    cr_assert(eq(u32, m.samples, 18));
}

/* A series named twice (an exposition may not) is taken once: a duplicated cache_config_info
 * line doubled the engine's capacity, and the worker's admission and heartbeat with it. The
 * labels' order does not make another series. */
Test(metrics, a_series_named_twice_is_taken_once)
{
    static const char twice[] =
        "vllm:cache_config_info{block_size=\"64\",num_gpu_blocks=\"1000\"} 1\n"
        "vllm:cache_config_info{num_gpu_blocks=\"1000\",block_size=\"64\"} 1\n"
        "vllm:num_requests_running{engine=\"0\"} 3\n"
        "vllm:num_requests_running{engine=\"0\"} 3\n"
        "vllm:num_requests_running{engine=\"1\"} 2\n";
    struct kvr_engine_metrics m;
    metrics(twice, &m, KVR_OK);
    cr_assert(eq(u64, m.num_blocks, 1000));
    cr_assert(eq(u64, m.running, 5), "engines 0 and 1, each once");
    cr_assert(eq(u32, m.bad_lines, 2));
}

Test(metrics, vllm_v0)
{
    struct kvr_engine_metrics m;
    metrics(vllm_v0, &m, KVR_OK);
    cr_assert(eq(int, m.kind, KVR_ENGINE_VLLM));
    cr_assert(eq(u64, m.running, 1));
    cr_assert(eq(u64, m.waiting, 4));
    cr_assert(m.have_kv_usage);
    cr_assert(eq(dbl, m.kv_usage, 0.5));
    cr_assert(eq(u32, m.block_size, 32));
    cr_assert(eq(u64, m.num_blocks, 7000));
    cr_assert(eq(u64, m.capacity_tokens, 7000 * 32));
    cr_assert(not(m.have_prefix_cache));
    cr_assert(m.have_cache_hit_rate);
    cr_assert(eq(dbl, m.cache_hit_rate, 0.125));
}

Test(metrics, vllm_both_names_and_conflicts)
{
    struct kvr_engine_metrics m;
    metrics("vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.1\n"
            "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1\n"
            "vllm:cache_config_info{block_size=\"32\",num_gpu_blocks=\"10\"} 1\n",
            &m, KVR_OK);
    cr_assert(eq(dbl, m.kv_usage, 0.1)); /* the current name wins */
    cr_assert(eq(u32, m.block_size, 16));
    cr_assert(m.block_size_conflict);
    cr_assert(eq(u64, m.num_blocks, 10)); /* "None" is no count */
}

Test(metrics, sglang)
{
    struct kvr_engine_metrics m;
    metrics(sglang_text, &m, KVR_OK);
    cr_assert(eq(int, m.kind, KVR_ENGINE_SGLANG));
    cr_assert(eq(u64, m.running, 28));
    cr_assert(eq(u64, m.waiting, 2826));
    cr_assert(eq(dbl, m.kv_usage, 0.28));
    cr_assert(m.have_cache_hit_rate);
    cr_assert(not(m.have_block_size));
    cr_assert(not(m.have_num_blocks));
    /* older SGLang: capacity at the top of /get_server_info */
    const char *old = "{\"model_path\":\"m\",\"page_size\":1,\"max_total_num_tokens\":500000,"
                      "\"internal_states\":[{\"last_gen_throughput\":1.0}]}";
    cr_assert(eq(int, kvr_oai_server_info_parse(old, strlen(old), &m), KVR_OK));
    cr_assert(eq(u32, m.block_size, 1));
    cr_assert(eq(u64, m.capacity_tokens, 500000));
    cr_assert(eq(u64, m.num_blocks, 500000));
    /* newer: per data-parallel rank in internal_states, page size 16 */
    metrics(sglang_text, &m, KVR_OK);
    const char *dp = "{\"page_size\":16,\"internal_states\":[{\"max_total_num_tokens\":1600},"
                     "{\"max_total_num_tokens\":3200}]}";
    cr_assert(eq(int, kvr_oai_server_info_parse(dp, strlen(dp), &m), KVR_OK));
    cr_assert(eq(u32, m.block_size, 16));
    cr_assert(eq(u64, m.capacity_tokens, 4800));
    cr_assert(eq(u64, m.num_blocks, 300));
    static const char *const bad[] = {
        "",
        "[]",
        "{}",
        "{\"max_total_num_tokens\":-1}",
        "{\"max_total_num_tokens\":\"5\"}",
        "{\"max_total_num_tokens\":5,\"page_size\":0}",
        "{\"internal_states\":[{\"max_total_num_tokens\":1},{}]}",
        "{\"internal_states\":[]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct kvr_engine_metrics z = {0};
        cr_expect(eq(int, kvr_oai_server_info_parse(bad[i], strlen(bad[i]), &z), KVR_ERR_MALFORMED),
                  "%s", bad[i]);
        cr_expect(not(z.have_block_size));
    }
}

/* SGLang's capacity summed over many data-parallel ranks stays a count: 65,536 ranks of 2^48
 * tokens each once wrapped the sum to 0 (and 65,537 to 2^48, a capacity no rank reported) */
Test(metrics, sglang_capacity_summed_over_ranks_never_wraps)
{
    size_t n = 65536, cap = n * 64 + 64, len = 0;
    char *json = malloc(cap);
    len += (size_t)snprintf(json + len, cap - len, "{\"page_size\":1,\"internal_states\":[");
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(json + len, cap - len, "%s{\"max_total_num_tokens\":%llu}",
                                i ? "," : "", 1ull << 48);
    len += (size_t)snprintf(json + len, cap - len, "]}");
    cr_assert(lt(sz, len, cap));
    struct kvr_engine_metrics m = {0};
    kvr_status st = kvr_oai_server_info_parse(json, len, &m);
    free(json);
    cr_assert(eq(int, st, KVR_ERR_MALFORMED), "capacity %llu",
              (unsigned long long)m.capacity_tokens);
    cr_assert(not(m.have_capacity_tokens));
}

Test(metrics, garbage)
{
    struct kvr_engine_metrics m;
    /* bad lines are counted and skipped; bad values are not taken */
    metrics("garbage here\nvllm:num_requests_running 2\n{oops} 1\n"
            "vllm:num_requests_running{engine=\"1\"} NaN\n"
            "vllm:num_requests_waiting -1\nvllm:kv_cache_usage_perc 1.5\n"
            "vllm:num_requests_waiting 1e300\r\nvllm:num_requests_waiting 3\r\n",
            &m, KVR_OK);
    cr_assert(eq(u64, m.running, 2));
    cr_assert(eq(u64, m.waiting, 3));
    cr_assert(not(m.have_kv_usage));
    cr_assert(eq(u32, m.bad_lines, 6));
    /* no sample at all */
    metrics("", &m, KVR_ERR_MALFORMED);
    metrics("# only comments\n\n", &m, KVR_ERR_MALFORMED);
    metrics("\x01\x02\xff\n{}}}\n", &m, KVR_ERR_MALFORMED);
    cr_assert(eq(u32, m.bad_lines, 2));
    /* a sample with no known name: parsed, unknown engine */
    metrics("other_metric 1\n", &m, KVR_OK);
    cr_assert(eq(int, m.kind, KVR_ENGINE_UNKNOWN));
    cr_assert(not(m.have_running));
    /* binary noise of every byte value never crashes */
    char noise[4096];
    for (size_t i = 0; i < sizeof noise; i++)
        noise[i] = (char)(i * 7919 % 251);
    cr_assert(eq(int, kvr_oai_metrics_parse(noise, sizeof noise, &m), KVR_ERR_MALFORMED));
}

static void rank_metrics(const char *text, int32_t rank, struct kvr_engine_metrics *m,
                         kvr_status want)
{
    cr_assert(eq(int, kvr_oai_metrics_parse_rank(text, strlen(text), rank, m), want));
}

/* One adapter per data-parallel rank: each reads its own rank's series (vLLM labels them
 * engine="<rank>"), not the sum over every rank of the engine. */
Test(metrics, one_data_parallel_rank)
{
    struct kvr_engine_metrics m;
    rank_metrics(vllm_v1, 1, &m, KVR_OK);
    cr_assert(m.rank_labelled && m.rank_seen);
    cr_assert(eq(u64, m.running, 5));
    cr_assert(eq(u64, m.waiting, 0));
    cr_assert(eq(dbl, m.kv_usage, 0.75));
    cr_assert(eq(u64, m.num_blocks, 27000), "rank 1's blocks, not the engine's 54000");
    cr_assert(eq(u32, m.block_size, 16));
    cr_assert(eq(dbl, m.prefix_cache_hits, 100.0));
    cr_assert(eq(dbl, m.prefix_cache_queries, 500.0));
    cr_assert(eq(u32, m.other_ranks, 6), "rank 0's samples of the families read");
    cr_assert(eq(u32, m.bad_lines, 0));
    rank_metrics(vllm_v1, 0, &m, KVR_OK);
    cr_assert(eq(u64, m.running, 3));
    cr_assert(eq(u64, m.waiting, 2));
    cr_assert(eq(dbl, m.kv_usage, 0.25));
    cr_assert(eq(u64, m.num_blocks, 27000));
    /* < 0: every rank, as kvr_oai_metrics_parse */
    rank_metrics(vllm_v1, -1, &m, KVR_OK);
    cr_assert(eq(u64, m.running, 8));
    cr_assert(eq(u64, m.num_blocks, 54000));
    cr_assert(not(m.rank_labelled));
    cr_assert(eq(u32, m.other_ranks, 0));
}

/* A rank the engine does not label (a smaller data-parallel size than the adapter thinks): the
 * labelled series are all left out and the caller is told; series without the label (an engine
 * that does not label its ranks, process_start_time_seconds) count as ever. */
Test(metrics, a_rank_the_engine_does_not_have)
{
    struct kvr_engine_metrics m;
    rank_metrics(vllm_v1, 2, &m, KVR_OK);
    cr_assert(m.rank_labelled);
    cr_assert(not(m.rank_seen));
    cr_assert(not(m.have_running || m.have_num_blocks || m.have_kv_usage));
    cr_assert(eq(u32, m.other_ranks, 12));
    rank_metrics(vllm_v0, 3, &m, KVR_OK); /* no engine label anywhere */
    cr_assert(not(m.rank_labelled));
    cr_assert(eq(u64, m.running, 1));
    cr_assert(eq(u64, m.num_blocks, 7000));
    rank_metrics("process_start_time_seconds 1.7e9\nvllm:num_requests_waiting{engine=\"0\"} 4\n", 1,
                 &m, KVR_OK);
    cr_assert(m.have_start_time, "no engine label: read for every rank");
    cr_assert(not(m.have_waiting));
    rank_metrics(vllm_v1, KVR_OAI_DP_RANK_MAX + 1, &m, KVR_ERR_INVALID);
}

/* The engine label is the engine's text: matched as the exact decimal, whatever it holds. */
Test(metrics, rank_labels_are_matched_exactly)
{
    static const char odd[] = "vllm:num_requests_waiting{engine=\"01\"} 1\n"
                              "vllm:num_requests_waiting{engine=\"1 \"} 2\n"
                              "vllm:num_requests_waiting{engine=\"%s%n\"} 4\n"
                              "vllm:num_requests_waiting{engine=\"\"} 8\n"
                              "vllm:num_requests_waiting{engine=\"1\\\"\"} 16\n"
                              "vllm:num_requests_waiting{engine=\"11\"} 32\n"
                              "vllm:num_requests_waiting{engine=\"1\",engine=\"0\"} 64\n"
                              "vllm:num_requests_waiting{model_name=\"m\",engine=\"1\"} 128\n";
    struct kvr_engine_metrics m;
    rank_metrics(odd, 1, &m, KVR_OK);
    cr_assert(eq(u64, m.waiting, 64 + 128), "the first engine label decides");
    cr_assert(eq(u32, m.other_ranks, 6));
    char big[KVR_PROMTEXT_LINE_MAX];
    size_t n = (size_t)snprintf(big, sizeof big, "vllm:num_requests_waiting{engine=\"");
    memset(big + n, '1', 9000);
    n += 9000;
    n += (size_t)snprintf(big + n, sizeof big - n, "\"} 5\nvllm:num_requests_running 1\n");
    cr_assert(eq(int, kvr_oai_metrics_parse_rank(big, n, 1, &m), KVR_OK));
    cr_assert(not(m.have_waiting));
    cr_assert(eq(u32, m.other_ranks, 1));
    cr_assert(eq(u64, m.running, 1));
}

/* The pin of a completion to one data-parallel rank: vLLM's header (and SGLang's). */
Test(headers, data_parallel_rank)
{
    struct curl_slist *h = NULL;
    cr_assert(eq(int, kvr_oai_http_headers(false, 0, &h), KVR_OK));
    size_t n = 0;
    for (struct curl_slist *l = h; l; l = l->next, n++)
        cr_assert(not(eq(int, strncasecmp(l->data, "x-data-parallel-rank", 20), 0)));
    cr_assert(eq(sz, n, 3));
    curl_slist_free_all(h);
    cr_assert(eq(int, kvr_oai_http_headers(true, 65535, &h), KVR_OK));
    struct curl_slist *last = h;
    while (last->next)
        last = last->next;
    cr_assert(eq(str, last->data, "X-data-parallel-rank: 65535"));
    curl_slist_free_all(h);
}
