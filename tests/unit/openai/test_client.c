/*
 * The OpenAI-compatible client (src/openai/openai.h) against a real HTTP server on 127.0.0.1
 * (tsrv.c, libmicrohttpd): whole streams with and without token ids, usage on the last chunk and
 * on every chunk, finish reasons, HTTP errors of both JSON shapes, errors inside the stream,
 * refused and cut connections, timeouts, cancels the server sees (and no hook after them), 64
 * streams at once, malformed and oversized streams, destroy with streams in flight, the model
 * asked for, the engine's metrics, health and model over HTTP; and the client's CPU time per
 * token, printed.
 */
#include <criterion/criterion.h>
#include "../../criterion_gt.h"
#include "../../criterion_end.h"
#include <arpa/inet.h>
#include <jansson.h>
#include <malloc.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "openai.h"
#include "tsrv.h"

#define NKEYS   256
#define MAX_IDS 2048
#define WAIT_MS 10000 /* every wait's deadline */

/* ---- what the hooks saw, per key, under the caller's lock ---- */

struct seen {
    unsigned chunks, ends, usage_chunks;
    uint64_t tokens;
    uint32_t ids[MAX_IDS];
    uint32_t n_ids;
    char text[16384];
    size_t text_len;
    bool have_usage;
    struct kvr_oai_usage usage; /* the last one */
    char finish[KVR_OAI_FINISH_MAX];
    unsigned finishes;
    kvr_status st;
    char msg[KVR_OAI_MESSAGE_MAX];
    bool after_end; /* a hook came after the end */
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct seen k[NKEYS];
    unsigned ends, chunks;
    struct kvr_oai *c;
    pthread_t thread; /* the thread of the first hook */
    bool thread_set, other_thread;
    uint64_t cancel_key;   /* cancel this key from its chunk hook ... */
    unsigned cancel_after; /* ... after this many chunks (0: never) */
    uint64_t resubmit_key; /* submit this key again from its end hook, once (0: never) */
    kvr_status resubmit_st;
    bool stats_in_hook;     /* call kvr_oai_stats from the hooks (no client lock is held) */
    unsigned chunk_waiters; /* threads in wait_chunks: only then does a chunk wake anyone */
} R = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static struct tsrv *srv;

/* json_is_true as a function (Criterion's asserts take no macro that starts with a paren) */
static bool jtrue(const json_t *v)
{
    return json_is_true(v);
}

static void note_thread(void)
{
    if (!R.thread_set) {
        R.thread = pthread_self();
        R.thread_set = true;
    } else if (!pthread_equal(R.thread, pthread_self())) {
        R.other_thread = true;
    }
}

static void on_chunk(void *ctx, uint64_t key, const struct kvr_oai_chunk *ch)
{
    cr_assert(eq(ptr, ctx, &R));
    cr_assert(lt(u64, key, NKEYS));
    if (R.stats_in_hook) {
        struct kvr_oai_stats st;
        kvr_oai_stats(R.c, &st);
    }
    pthread_mutex_lock(&R.lock);
    note_thread();
    struct seen *s = &R.k[key];
    s->after_end |= s->ends > 0;
    s->chunks++;
    s->tokens += ch->n_tokens;
    for (uint32_t i = 0; i < ch->n_token_ids && s->n_ids < MAX_IDS; i++)
        s->ids[s->n_ids++] = ch->token_ids[i];
    cr_assert(eq(int, ch->text[ch->text_len], 0));
    if (s->text_len + ch->text_len < sizeof s->text) {
        memcpy(s->text + s->text_len, ch->text, ch->text_len);
        s->text_len += ch->text_len;
    }
    if (ch->have_usage) {
        s->have_usage = true;
        s->usage = ch->usage;
        s->usage_chunks++;
    }
    if (ch->finish_reason) {
        snprintf(s->finish, sizeof s->finish, "%s", ch->finish_reason);
        s->finishes++;
    }
    R.chunks++;
    bool cancel = R.cancel_after && key == R.cancel_key && s->chunks == R.cancel_after;
    if (R.chunk_waiters)
        pthread_cond_broadcast(&R.cond);
    pthread_mutex_unlock(&R.lock);
    if (cancel)
        kvr_oai_cancel(R.c, key); /* from inside a hook */
}

static kvr_status submit(uint64_t key, uint32_t sc, uint32_t p1, uint32_t p2, uint32_t p3,
                         uint32_t p4);

static void on_end(void *ctx, uint64_t key, kvr_status st, const char *msg)
{
    cr_assert(eq(ptr, ctx, &R));
    cr_assert(lt(u64, key, NKEYS));
    cr_assert(ne(ptr, (void *)msg, NULL));
    for (const char *p = msg; *p; p++)
        cr_assert(ge(int, (unsigned char)*p, 0x20), "message is printable: %s", msg);
    cr_assert(lt(sz, strlen(msg), KVR_OAI_MESSAGE_MAX));
    if (R.stats_in_hook) {
        struct kvr_oai_stats stt;
        kvr_oai_stats(R.c, &stt);
    }
    pthread_mutex_lock(&R.lock);
    note_thread();
    struct seen *s = &R.k[key];
    s->after_end |= s->ends > 0;
    s->ends++;
    s->st = st;
    snprintf(s->msg, sizeof s->msg, "%s", msg);
    R.ends++;
    bool again = R.resubmit_key && key == R.resubmit_key;
    if (again) {
        R.resubmit_key = 0;
        memset(s, 0, sizeof *s); /* the second stream starts afresh */
    }
    pthread_cond_broadcast(&R.cond);
    pthread_mutex_unlock(&R.lock);
    if (again) /* from inside a hook: the key is free again */
        R.resubmit_st = submit(key, TS_STREAM, 3, TF_STOP, 0, 0);
}

static const struct kvr_oai_hooks hooks = {on_chunk, on_end, &R};

static void deadline(struct timespec *dl, long ms)
{
    clock_gettime(CLOCK_REALTIME, dl);
    dl->tv_sec += ms / 1000;
    dl->tv_nsec += (ms % 1000) * 1000000L;
    if (dl->tv_nsec >= 1000000000L)
        dl->tv_sec++, dl->tv_nsec -= 1000000000L;
}

/* Wait until at least n end hooks ran in all, up to ms; whether they did. */
static bool wait_ends_ms(unsigned n, long ms)
{
    struct timespec dl;
    deadline(&dl, ms);
    pthread_mutex_lock(&R.lock);
    while (R.ends < n && pthread_cond_timedwait(&R.cond, &R.lock, &dl) == 0)
        ;
    bool ok = R.ends >= n;
    pthread_mutex_unlock(&R.lock);
    return ok;
}

static bool wait_ends(unsigned n)
{
    return wait_ends_ms(n, WAIT_MS);
}

static bool wait_chunks(uint64_t key, unsigned n)
{
    struct timespec dl;
    deadline(&dl, WAIT_MS);
    pthread_mutex_lock(&R.lock);
    R.chunk_waiters++;
    while (R.k[key].chunks < n && pthread_cond_timedwait(&R.cond, &R.lock, &dl) == 0)
        ;
    R.chunk_waiters--;
    bool ok = R.k[key].chunks >= n;
    pthread_mutex_unlock(&R.lock);
    return ok;
}

static struct seen snap(uint64_t key)
{
    pthread_mutex_lock(&R.lock);
    struct seen s = R.k[key];
    pthread_mutex_unlock(&R.lock);
    return s;
}

static unsigned total_ends(void)
{
    pthread_mutex_lock(&R.lock);
    unsigned n = R.ends;
    pthread_mutex_unlock(&R.lock);
    return n;
}

static kvr_status submit(uint64_t key, uint32_t sc, uint32_t p1, uint32_t p2, uint32_t p3,
                         uint32_t p4)
{
    uint32_t prompt[6] = {sc, p1, p2, p3, p4, 7};
    return kvr_oai_submit(R.c, key, prompt, 6, 100);
}

/* One stream to its end: its key's record. */
static struct seen run(uint64_t key, uint32_t sc, uint32_t p1, uint32_t p2, uint32_t p3,
                       uint32_t p4)
{
    unsigned before = total_ends();
    cr_assert(eq(int, submit(key, sc, p1, p2, p3, p4), KVR_OK));
    cr_assert(wait_ends(before + 1), "stream %llu ended", (unsigned long long)key);
    struct seen s = snap(key);
    cr_assert(eq(u32, s.ends, 1));
    return s;
}

static struct kvr_oai *client(struct kvr_oai_config cfg)
{
    if (!cfg.base_url)
        cfg.base_url = tsrv_url(srv);
    if (!cfg.model)
        cfg.model = "test-model";
    kvr_status st = KVR_ERR_IO;
    R.thread_set = false; /* a new client: a new hook thread */
    R.c = kvr_oai_create(&cfg, &hooks, &st);
    cr_assert(eq(int, st, KVR_OK));
    cr_assert(ne(ptr, R.c, NULL));
    return R.c;
}

/* Every hook came before the barrier's end: a stream on the same (one) hook thread. */
static void barrier(uint64_t key)
{
    struct seen s = run(key, TS_STREAM, 1, TF_STOP, 0, 0);
    cr_assert(eq(int, s.st, KVR_OK));
}

static void setup(void)
{
    memset(R.k, 0, sizeof R.k);
    R.ends = R.chunks = 0;
    R.c = NULL;
    srv = tsrv_start();
    cr_assert(ne(ptr, srv, NULL));
}

/* Every test's last step (criterion_end.h): the client destroyed, then what its hooks did. */
static void end(void)
{
    kvr_oai_destroy(R.c);
    R.c = NULL;
    cr_assert(not(R.other_thread), "every hook of a client ran on its one thread");
    for (unsigned i = 0; i < NKEYS; i++)
        cr_assert(not(R.k[i].after_end), "no hook after the end of key %u", i);
}

static void teardown(void)
{
    kvr_oai_destroy(R.c); /* a failed test's */
    tsrv_stop(srv);
}

TestSuite(client, .init = setup, .fini = teardown, .timeout = 120);

static bool slow(void)
{
    return getenv("KVR_VALGRIND") != NULL;
}

/* ---- whole streams ---- */

KVR_TEST_END(client, stream_with_ids_and_continuous_usage, end)
{
    client((struct kvr_oai_config){.return_token_ids = true, .continuous_usage = true});
    R.stats_in_hook = true;
    struct seen s = run(1, TS_STREAM, 20, TF_LENGTH, 0, TSF_CACHED);
    cr_assert(eq(int, s.st, KVR_OK), "%s", s.msg);
    cr_assert(eq(str, s.msg, ""));
    cr_assert(eq(u32, s.chunks, 21)); /* 20 tokens and the usage chunk */
    cr_assert(eq(u32, s.n_ids, 20));
    for (uint32_t i = 0; i < 20; i++)
        cr_assert(eq(u32, s.ids[i], 1000 + i));
    cr_assert(eq(u64, s.tokens, 20));
    cr_assert(eq(u32, s.usage_chunks, 21));
    cr_assert(eq(u32, s.usage.prompt_tokens, 6));
    cr_assert(eq(u32, s.usage.completion_tokens, 20));
    cr_assert(s.usage.have_cached);
    cr_assert(eq(u32, s.usage.cached_tokens, 4));
    cr_assert(eq(str, s.finish, "length"));
    cr_assert(eq(u32, s.finishes, 1));
    cr_assert(eq(int, strncmp(s.text, "t0 t1 t2 ", 9), 0));
    /* what the client asked for */
    char *body = tsrv_last_body(srv);
    json_t *req = json_loads(body, 0, NULL);
    free(body);
    cr_assert(ne(ptr, req, NULL));
    cr_assert(eq(str, (char *)json_string_value(json_object_get(req, "model")), "test-model"));
    json_t *prompt = json_object_get(req, "prompt");
    cr_assert(eq(sz, json_array_size(prompt), 6));
    cr_assert(eq(i64, json_integer_value(json_array_get(prompt, 5)), 7));
    cr_assert(eq(i64, json_integer_value(json_object_get(req, "max_tokens")), 100));
    cr_assert(jtrue(json_object_get(req, "stream")));
    cr_assert(jtrue(json_object_get(req, "return_token_ids")));
    json_t *opts = json_object_get(req, "stream_options");
    cr_assert(jtrue(json_object_get(opts, "include_usage")));
    cr_assert(jtrue(json_object_get(opts, "continuous_usage_stats")));
    json_decref(req);
    struct kvr_oai_stats st;
    kvr_oai_stats(R.c, &st);
    cr_assert(eq(u64, st.submitted, 1));
    cr_assert(eq(u64, st.started, 1));
    cr_assert(eq(u64, st.finished, 1));
    cr_assert(eq(u64, st.failed, 0));
    cr_assert(eq(u64, st.chunks, 21));
    cr_assert(eq(u64, st.tokens, 20));
    cr_assert(gt(u64, st.bytes, 2000));
    cr_assert(eq(u32, st.in_flight, 0));
    cr_assert(gt(u64, st.thread_cpu_ns, 0));
}

KVR_TEST_END(client, stream_text_only, end)
{
    client((struct kvr_oai_config){0});
    struct seen s = run(2, TS_STREAM, 10, TF_STOP, 1000, 0);
    cr_assert(eq(int, s.st, KVR_OK), "%s", s.msg);
    cr_assert(eq(u32, s.chunks, 11));
    cr_assert(eq(u32, s.n_ids, 0));
    cr_assert(eq(u64, s.tokens, 10));      /* one per non-empty chunk */
    cr_assert(eq(u32, s.usage_chunks, 1)); /* only the last */
    cr_assert(eq(u32, s.usage.completion_tokens, 10));
    cr_assert(not(s.usage.have_cached));
    cr_assert(eq(str, s.finish, "stop"));
    cr_assert(eq(sz, s.text_len, strlen("t0 t1 t2 t3 t4 t5 t6 t7 t8 t9 ")));
    char *body = tsrv_last_body(srv);
    json_t *req = json_loads(body, 0, NULL);
    free(body);
    cr_assert(eq(ptr, json_object_get(req, "return_token_ids"), NULL));
    json_t *opts = json_object_get(req, "stream_options");
    cr_assert(jtrue(json_object_get(opts, "include_usage")));
    cr_assert(eq(ptr, json_object_get(opts, "continuous_usage_stats"), NULL));
    json_decref(req);
}

KVR_TEST_END(client, continuous_usage_counts_tokens_without_ids, end)
{
    client((struct kvr_oai_config){.continuous_usage = true});
    struct seen s = run(3, TS_STREAM, 8, TF_LENGTH, 0, TSF_MULTI);
    cr_assert(eq(int, s.st, KVR_OK), "%s", s.msg);
    cr_assert(eq(u32, s.n_ids, 0));
    cr_assert(eq(u64, s.tokens, 16)); /* usage deltas: two per chunk, 0 for the last */
    cr_assert(eq(u32, s.usage.completion_tokens, 16));
    /* with ids too, the ids count */
    kvr_oai_destroy(R.c);
    client((struct kvr_oai_config){.continuous_usage = true, .return_token_ids = true});
    s = run(4, TS_STREAM, 8, TF_LENGTH, 0, TSF_MULTI);
    cr_assert(eq(u32, s.n_ids, 16));
    cr_assert(eq(u64, s.tokens, 16));
}

/* An engine that puts its usage on the last chunk with a choice (not on every chunk, not on a
 * usage-only chunk): the text chunks count one each, the usage adds only what they did not
 * count (it once added its whole count again: 6 for 3 tokens, and the adapter took a stream of
 * max_tokens tokens for one past its max_tokens). */
KVR_TEST_END(client, usage_on_the_last_choice_counts_no_token_twice, end)
{
    client((struct kvr_oai_config){.continuous_usage = true});
    const char *body = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
                       "data: {\"choices\":[{\"text\":\"b\"}]}\n\n"
                       "data: {\"choices\":[{\"text\":\"c\"}]}\n\n"
                       "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}],"
                       "\"usage\":{\"prompt_tokens\":6,\"completion_tokens\":3}}\n\n"
                       "data: [DONE]\n\n";
    tsrv_set_raw(srv, body, strlen(body));
    struct seen s = run(9, TS_RAW, 0, 0, 0, 0);
    cr_assert(eq(int, s.st, KVR_OK), "%s", s.msg);
    cr_assert(eq(u32, s.chunks, 4));
    cr_assert(eq(u64, s.tokens, 3));
    /* two tokens a chunk, the usage then says how many the text chunks stood for */
    body = "data: {\"choices\":[{\"text\":\"ab\"}]}\n\n"
           "data: {\"choices\":[{\"text\":\"cd\"}]}\n\n"
           "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}],"
           "\"usage\":{\"prompt_tokens\":6,\"completion_tokens\":4}}\n\n"
           "data: [DONE]\n\n";
    tsrv_set_raw(srv, body, strlen(body));
    s = run(19, TS_RAW, 0, 0, 0, 0);
    cr_assert(eq(int, s.st, KVR_OK), "%s", s.msg);
    cr_assert(eq(u64, s.tokens, 4));
    struct kvr_oai_stats st;
    kvr_oai_stats(R.c, &st);
    cr_assert(eq(u64, st.tokens, 7));
}

KVR_TEST_END(client, finish_reasons_and_ends, end)
{
    client((struct kvr_oai_config){.return_token_ids = true});
    struct seen s = run(5, TS_STREAM, 3, TF_ODD, 0, 0);
    cr_assert(eq(int, s.st, KVR_OK));
    cr_assert(lt(sz, strlen(s.finish), KVR_OAI_FINISH_MAX));
    cr_assert(eq(int, strncmp(s.finish, "odd\\x01\\x1b[31m reason", 22), 0), "%s", s.finish);
    /* no [DONE], the connection ends cleanly after the finish: done */
    s = run(6, TS_STREAM, 3, TF_LENGTH, 0, TSF_NO_DONE);
    cr_assert(eq(int, s.st, KVR_OK), "%s", s.msg);
    cr_assert(eq(u32, s.n_ids, 3));
    /* [DONE] without a finish_reason is still done */
    s = run(7, TS_STREAM, 3, TF_NONE, 0, 0);
    cr_assert(eq(int, s.st, KVR_OK));
    cr_assert(eq(u32, s.finishes, 0));
    /* neither: the engine went away */
    s = run(8, TS_STREAM, 3, TF_NONE, 0, TSF_NO_DONE);
    cr_assert(eq(int, s.st, KVR_ERR_WORKER_LOST));
    cr_assert(eq(str, s.msg, "the stream ended before [DONE]"));
    cr_assert(eq(u32, s.n_ids, 3));
}

KVR_TEST_END(client, framings, end)
{
    client((struct kvr_oai_config){.return_token_ids = true, .continuous_usage = true});
    uint32_t flags[] = {TSF_CRLF, TSF_SPLIT_DATA, TSF_CRLF | TSF_SPLIT_DATA};
    for (unsigned i = 0; i < 3; i++) {
        struct seen s = run(10 + i, TS_STREAM, 12, TF_STOP, 0, flags[i]);
        cr_assert(eq(int, s.st, KVR_OK), "flags %u: %s", flags[i], s.msg);
        cr_assert(eq(u32, s.n_ids, 12));
        cr_assert(eq(u32, s.ids[11], 1011));
        cr_assert(eq(u32, s.chunks, 13));
    }
}

/* ---- errors ---- */

KVR_TEST_END(client, http_errors, end)
{
    client((struct kvr_oai_config){0});
    static const struct {
        uint32_t status, shape;
        kvr_status want;
        const char *msg;
    } cases[] = {
        {400, 0, KVR_ERR_INVALID, "http 400: bad things happened"},
        {404, 1, KVR_ERR_INVALID, "http 404: The model `x` does not exist."},
        {429, 0, KVR_ERR_OVERLOADED, "http 429: bad things happened"},
        {500, 2, KVR_ERR_IO, "http 500: Internal Server Error"},
        {503, 1, KVR_ERR_OVERLOADED, NULL},
        {400, 3, KVR_ERR_PROMPT_TOO_LONG, NULL},
        {400, 5, KVR_ERR_MAX_TOKENS_TOO_LARGE, NULL},
        {429, 4, KVR_ERR_OVERLOADED, "http 429: line1\\x0aline2\\x01\\x1b[31m"},
        {502, 0, KVR_ERR_IO, NULL},
    };
    for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct seen s = run(20 + i, TS_HTTP_ERROR, cases[i].status, cases[i].shape, 0, 0);
        cr_expect(eq(int, s.st, cases[i].want), "case %u: %s", i, s.msg);
        if (cases[i].msg)
            cr_expect(eq(str, s.msg, (char *)cases[i].msg), "case %u", i);
        cr_expect(eq(u32, s.chunks, 0));
    }
    struct kvr_oai_stats st;
    kvr_oai_stats(R.c, &st);
    cr_assert(eq(u64, st.failed_http, sizeof cases / sizeof cases[0]));
    cr_assert(eq(u64, st.failed, st.failed_http));
}

KVR_TEST_END(client, error_inside_the_stream, end)
{
    client((struct kvr_oai_config){.return_token_ids = true});
    for (uint32_t shape = 0; shape < 2; shape++) {
        struct seen s = run(30 + shape, TS_STREAM_ERROR, 0, shape, 0, 0);
        cr_assert(eq(int, s.st, KVR_ERR_IO));
        cr_assert(eq(str, s.msg, "engine error: engine broke\\x0abadly"));
        cr_assert(eq(u32, s.chunks, 1)); /* the chunk before the error came */
    }
    struct kvr_oai_stats st;
    kvr_oai_stats(R.c, &st);
    cr_assert(eq(u64, st.failed_stream, 2));
}

static uint16_t closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert(eq(int, bind(fd, (struct sockaddr *)&sa, sizeof sa), 0));
    socklen_t len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);
    close(fd); /* nothing listens there now */
    return ntohs(sa.sin_port);
}

KVR_TEST_END(client, connection_refused, end)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", closed_port());
    client((struct kvr_oai_config){.base_url = url});
    struct seen s = run(40, TS_STREAM, 3, TF_STOP, 0, 0);
    cr_assert(eq(int, s.st, KVR_ERR_WORKER_LOST), "%s", s.msg);
    cr_assert(ne(str, s.msg, ""));
    struct kvr_oai_stats st;
    kvr_oai_stats(R.c, &st);
    cr_assert(eq(u64, st.failed_lost, 1));
}

KVR_TEST_END(client, cut_mid_stream, end)
{
    client((struct kvr_oai_config){.return_token_ids = true});
    struct seen s = run(41, TS_CUT, 5, 0, 0, 0);
    cr_assert(eq(int, s.st, KVR_ERR_WORKER_LOST), "%s", s.msg);
    cr_assert(eq(u32, s.chunks, 5));
    s = run(42, TS_NOBODY, 0, 0, 0, 0);
    cr_assert(eq(int, s.st, KVR_ERR_WORKER_LOST), "%s", s.msg);
}

KVR_TEST_END(client, idle_timeout, end)
{
    client((struct kvr_oai_config){.idle_timeout_ms = 200});
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct seen s = run(43, TS_SILENT, 0, 0, 0, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_assert(eq(int, s.st, KVR_ERR_TIMEOUT), "%s", s.msg);
    cr_assert(eq(str, s.msg, "no data for 200 ms"));
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    cr_assert(ge(dbl, ms, 190.0));
    cr_assert(tsrv_wait_closed(srv, 1, WAIT_MS), "the server saw the connection close");
    /* a stream that keeps sending is not idle */
    s = run(44, TS_STREAM, 10, TF_STOP, 50000, 0);
    cr_assert(eq(int, s.st, KVR_OK), "%s", s.msg);
}

KVR_TEST_END(client, total_timeout, end)
{
    client((struct kvr_oai_config){.total_timeout_ms = 300});
    struct seen s = run(45, TS_HOLD, 10000, 0, 0, 0);
    cr_assert(eq(int, s.st, KVR_ERR_TIMEOUT), "%s", s.msg);
    cr_assert(gt(u32, s.chunks, 0));
    cr_assert(tsrv_wait_closed(srv, 1, WAIT_MS));
    struct kvr_oai_stats st;
    kvr_oai_stats(R.c, &st);
    cr_assert(eq(u64, st.failed_timeout, 1));
}

/* Two chunks of one token each, the second with finish_reason "stop". */
#define TWO_THEN_STOP                                                                              \
    "data: {\"choices\":[{\"text\":\"a\",\"token_ids\":[5]}]}\n\n"                                 \
    "data: {\"choices\":[{\"text\":\"b\",\"token_ids\":[6],\"finish_reason\":\"stop\"}]}\n\n"

/* s is TWO_THEN_STOP's stream, whole: KVR_OK, "stop", both tokens. */
static void two_then_stop_whole(struct seen *s)
{
    cr_assert(eq(int, s->st, KVR_OK), "%s", s->msg);
    cr_assert(eq(str, s->finish, "stop"));
    cr_assert(eq(u32, s->n_ids, 2));
}

/* Every token came (a finish_reason), then the engine fell silent without [DONE] or closing:
 * done, as when it closes or the connection is cut there (it once failed with KVR_ERR_TIMEOUT,
 * a whole answer reported as lost); the connection is closed all the same. Without a finish,
 * still a timeout. */
KVR_TEST_END(client, silence_after_the_finish_is_done, end)
{
    const char *body = TWO_THEN_STOP;
    tsrv_set_raw(srv, body, strlen(body));
    client((struct kvr_oai_config){.idle_timeout_ms = 200, .return_token_ids = true});
    struct seen s = run(46, TS_RAW, 0, 0, 1, 0);
    two_then_stop_whole(&s);
    cr_assert(tsrv_wait_closed(srv, 1, WAIT_MS));
    struct kvr_oai_stats st;
    kvr_oai_stats(R.c, &st);
    cr_assert(eq(u64, st.finished, 1));
    cr_assert(eq(u64, st.failed, 0));
    kvr_oai_destroy(R.c);
    client((struct kvr_oai_config){.total_timeout_ms = 300, .return_token_ids = true});
    s = run(47, TS_RAW, 0, 0, 1, 0);
    cr_assert(eq(int, s.st, KVR_OK), "%s", s.msg);
    cr_assert(tsrv_wait_closed(srv, 2, WAIT_MS));
    body = "data: {\"choices\":[{\"text\":\"a\",\"token_ids\":[5]}]}\n\n";
    tsrv_set_raw(srv, body, strlen(body));
    s = run(48, TS_RAW, 0, 0, 1, 0);
    cr_assert(eq(int, s.st, KVR_ERR_TIMEOUT), "%s", s.msg);
}

/* "finish_reason": "" on every chunk (a server that writes an unset string field as "", not
 * null) names no reason: a stream cut after such chunks is lost, not whole (it once ended
 * KVR_OK, a partial answer passed on as complete, its finish_reason ""). */
KVR_TEST_END(client, an_empty_finish_reason_is_none, end)
{
    const char *body = "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":\"\"}]}\n\n"
                       "data: {\"choices\":[{\"text\":\"b\",\"finish_reason\":\"\"}]}\n\n";
    tsrv_set_raw(srv, body, strlen(body));
    client((struct kvr_oai_config){0});
    struct seen s = run(49, TS_RAW, 0, 0, 0, 0);
    cr_assert(eq(int, s.st, KVR_ERR_WORKER_LOST), "%s", s.msg);
    cr_assert(eq(u32, s.chunks, 2));
    cr_assert(eq(u32, s.finishes, 0));
}

/* An engine's error event after the finish (SGLang emits one when something fails once the last
 * token is out, building its usage chunk): every token came, the stream is whole; before the
 * finish the same event fails it. */
KVR_TEST_END(client, an_error_after_the_finish_leaves_the_stream_whole, end)
{
    const char *body =
        TWO_THEN_STOP "data: {\"error\":{\"message\":\"usage failed\",\"code\":500}}\n\n";
    tsrv_set_raw(srv, body, strlen(body));
    client((struct kvr_oai_config){.idle_timeout_ms = 5000, .return_token_ids = true});
    struct seen s = run(141, TS_RAW, 0, 0, 1, 0);
    two_then_stop_whole(&s);
    body = "data: {\"choices\":[{\"text\":\"a\",\"token_ids\":[5]}]}\n\n"
           "data: {\"error\":{\"message\":\"queue full\",\"code\":500}}\n\n";
    tsrv_set_raw(srv, body, strlen(body));
    s = run(142, TS_RAW, 0, 0, 1, 0);
    cr_assert(eq(int, s.st, KVR_ERR_IO), "%s", s.msg);
}

/* ---- cancels ---- */

KVR_TEST_END(client, cancel_from_a_hook, end)
{
    client((struct kvr_oai_config){.return_token_ids = true});
    R.cancel_key = 50;
    R.cancel_after = 3;
    cr_assert(eq(int, submit(50, TS_HOLD, 2000, 0, 0, 0), KVR_OK));
    cr_assert(tsrv_wait_closed(srv, 1, WAIT_MS), "the server saw the connection close");
    barrier(51);
    struct seen s = snap(50);
    cr_assert(eq(u32, s.chunks, 3)); /* absolute from a hook: nothing after */
    cr_assert(eq(u32, s.ends, 0));
    struct kvr_oai_stats st;
    kvr_oai_stats(R.c, &st);
    cr_assert(eq(u64, st.cancelled, 1));
    cr_assert(eq(u32, st.in_flight, 0));
}

KVR_TEST_END(client, cancel_from_another_thread_under_the_hooks_lock, end)
{
    client((struct kvr_oai_config){.return_token_ids = true});
    cr_assert(eq(int, submit(52, TS_HOLD, 1000, 0, 0, 0), KVR_OK));
    cr_assert(wait_chunks(52, 5));
    pthread_mutex_lock(&R.lock); /* the lock the hooks take: cancel must not wait for them */
    unsigned at = R.k[52].chunks;
    kvr_oai_cancel(R.c, 52);
    kvr_oai_cancel(R.c, 52); /* twice: a no-op */
    pthread_mutex_unlock(&R.lock);
    cr_assert(tsrv_wait_closed(srv, 1, WAIT_MS));
    barrier(53);
    struct seen s = snap(52);
    cr_assert(le(u32, s.chunks, at + 1)); /* at most the one already under way */
    cr_assert(eq(u32, s.ends, 0));
    kvr_oai_cancel(R.c, 999999); /* unknown: a no-op */
}

KVR_TEST_END(client, cancel_storm, end)
{
    client((struct kvr_oai_config){.max_streams = 16});
    unsigned n = slow() ? 20 : 200;
    for (unsigned i = 0; i < n; i++) {
        uint64_t key = 100 + i % 100;
        cr_assert(eq(int, submit(key, TS_HOLD, 500, 0, 0, 0), KVR_OK));
        if (i % 3 == 1)
            sched_yield();
        kvr_oai_cancel(R.c, key);
    }
    barrier(60);
    for (unsigned i = 0; i < 100; i++)
        cr_assert(eq(u32, snap(100 + i).ends, 0));
    struct kvr_oai_stats st;
    kvr_oai_stats(R.c, &st);
    cr_assert(eq(u64, st.cancelled, n));
    cr_assert(eq(u32, st.in_flight, 0));
    cr_assert(le(u64, st.started, n + 1));
    /* every connection the server saw was closed by the client */
    cr_assert(tsrv_wait_closed(srv, tsrv_requests(srv) - 1, WAIT_MS));
}

KVR_TEST_END(client, duplicates_and_reuse, end)
{
    client((struct kvr_oai_config){0});
    cr_assert(eq(int, submit(70, TS_HOLD, 2000, 0, 0, 0), KVR_OK));
    cr_assert(eq(int, submit(70, TS_STREAM, 1, 0, 0, 0), KVR_ERR_DUPLICATE));
    kvr_oai_cancel(R.c, 70);
    cr_assert(eq(int, submit(70, TS_STREAM, 2, TF_STOP, 0, 0), KVR_OK)); /* free after cancel */
    cr_assert(wait_ends(1));
    cr_assert(eq(int, snap(70).st, KVR_OK));
    /* submit from an end hook: the key is free once its end began */
    R.resubmit_key = 71;
    cr_assert(eq(int, submit(71, TS_STREAM, 2, TF_STOP, 0, 0), KVR_OK));
    cr_assert(wait_ends(3));
    cr_assert(eq(int, R.resubmit_st, KVR_OK));
    struct seen s = snap(71);
    cr_assert(eq(int, s.st, KVR_OK));
    cr_assert(eq(u32, s.chunks, 4)); /* the second stream: 3 tokens and the usage chunk */
    struct kvr_oai_stats st;
    kvr_oai_stats(R.c, &st);
    cr_assert(eq(u64, st.refused, 1));
}

KVR_TEST_END(client, overloaded_and_bad_submissions, end)
{
    client((struct kvr_oai_config){.max_streams = 4});
    for (uint64_t k = 0; k < 4; k++)
        cr_assert(eq(int, submit(80 + k, TS_HOLD, 5000, 0, 0, 0), KVR_OK));
    cr_assert(eq(int, submit(84, TS_STREAM, 1, 0, 0, 0), KVR_ERR_OVERLOADED));
    kvr_oai_cancel(R.c, 80);
    cr_assert(eq(int, submit(84, TS_STREAM, 1, TF_STOP, 0, 0), KVR_OK));
    cr_assert(wait_ends(1));
    uint32_t p[1] = {1};
    cr_assert(eq(int, kvr_oai_submit(R.c, 85, p, 0, 10), KVR_ERR_EMPTY_PROMPT));
    cr_assert(eq(int, kvr_oai_submit(R.c, 85, NULL, 1, 10), KVR_ERR_INVALID));
    cr_assert(eq(int, kvr_oai_submit(R.c, 85, p, 1, 0), KVR_ERR_MAX_TOKENS_ZERO));
    cr_assert(
        eq(int, kvr_oai_submit(R.c, 85, p, KVR_OAI_MAX_PROMPT + 1, 1), KVR_ERR_PROMPT_TOO_LONG));
}

KVR_TEST_END(client, destroy_with_streams_in_flight, end)
{
    client((struct kvr_oai_config){0});
    for (uint64_t k = 0; k < 8; k++)
        cr_assert(eq(int, submit(90 + k, TS_HOLD, 1000, 0, 0, 0), KVR_OK));
    for (uint64_t k = 0; k < 8; k++)
        cr_assert(wait_chunks(90 + k, 1));
    cr_assert(eq(int, submit(98, TS_HOLD, 1000, 0, 0, 0), KVR_OK)); /* perhaps not started */
    kvr_oai_destroy(R.c);
    R.c = NULL;
    unsigned ends = total_ends();
    cr_assert(eq(u32, ends, 0));
    cr_assert(tsrv_wait_closed(srv, 8, WAIT_MS));
}

/* ---- many at once ---- */

KVR_TEST_END(client, sixty_four_streams, end)
{
    client((struct kvr_oai_config){
        .return_token_ids = true, .continuous_usage = true, .max_streams = 64});
    uint32_t n = slow() ? 10 : 100;
    for (uint64_t k = 0; k < 64; k++)
        cr_assert(eq(int, submit(k, TS_STREAM, n, TF_LENGTH, 1000, 0), KVR_OK));
    cr_assert(eq(int, submit(64, TS_STREAM, 1, 0, 0, 0), KVR_ERR_OVERLOADED));
    cr_assert(wait_ends(64));
    for (uint64_t k = 0; k < 64; k++) {
        struct seen s = snap(k);
        cr_assert(eq(int, s.st, KVR_OK), "key %llu: %s", (unsigned long long)k, s.msg);
        cr_assert(eq(u32, s.n_ids, n));
        for (uint32_t i = 0; i < n; i++)
            cr_assert(eq(u32, s.ids[i], 1000 + i));
        cr_assert(eq(u64, s.tokens, n));
    }
    struct kvr_oai_stats st;
    kvr_oai_stats(R.c, &st);
    cr_assert(eq(u64, st.finished, 64));
    cr_assert(eq(u64, st.tokens, 64 * n));
}

/* ---- malformed streams ---- */

KVR_TEST_END(client, malformed_streams, end)
{
    client((struct kvr_oai_config){.max_event_bytes = 4096});
    static const char *const bodies[] = {
        "data: not json\n\n",
        "data: {\"choices\":[{\"text\":5}]}\n\n",
        "data: {\"choices\":[{\"token_ids\":[4294967296]}]}\n\n",
        "data: {\"choices\":[{\"token_ids\":[-3]}]}\n\n",
        "data: {\"choices\":[{\"token_ids\":[123456789012345678901234567890]}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1e10,\"completion_tokens\":1}}\n\n",
        "data: {\"choices\":[{\"text\":\"a\"},{\"text\":\"b\"}]}\n\n",
        "data: [1,2,3]\n\n",
        "data: {\"choices\":[{\"text\":\"ok\"}]}\n\ndata: {\"choices\":{}}\n\n",
    };
    for (unsigned i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        tsrv_set_raw(srv, bodies[i], strlen(bodies[i]));
        struct seen s = run(110 + i, TS_RAW, 3, 0, 0, 0);
        cr_expect(eq(int, s.st, KVR_ERR_MALFORMED), "case %u: %s", i, s.msg);
        cr_expect(eq(int, strncmp(s.msg, "malformed chunk: ", 17), 0), "%s", s.msg);
    }
    cr_assert(eq(u32, snap(118).chunks, 1)); /* the good chunk before the bad one */
    /* an event over the bound, slowly, in small pieces */
    char big[6000];
    memcpy(big, "data: ", 6);
    memset(big + 6, 'x', sizeof big - 6);
    tsrv_set_raw(srv, big, sizeof big);
    struct seen s = run(130, TS_RAW, 100, 0, 0, 0);
    cr_assert(eq(int, s.st, KVR_ERR_TOO_LARGE), "%s", s.msg);
    cr_assert(eq(str, s.msg, "an event over 4096 bytes"));
    /* a 2xx that is not an event stream */
    const char *json = "{\"choices\":[{\"text\":\"x\"}]}";
    tsrv_set_raw(srv, json, strlen(json));
    s = run(131, TS_RAW, 0, 1, 0, 0);
    cr_assert(eq(int, s.st, KVR_ERR_MALFORMED));
    cr_assert(eq(str, s.msg, "the answer is not an event stream"));
    struct kvr_oai_stats st;
    kvr_oai_stats(R.c, &st);
    cr_assert(eq(u64, st.bad_chunks, sizeof bodies / sizeof bodies[0] + 1));
    cr_assert(eq(u64, st.failed_malformed, sizeof bodies / sizeof bodies[0] + 2));
}

KVR_TEST_END(client, ten_megabyte_event, end)
{
    client((struct kvr_oai_config){0}); /* the default bound, 1 MiB */
    struct seen s = run(132, TS_BIG, 10u << 20, 0, 0, 0);
    cr_assert(eq(int, s.st, KVR_ERR_TOO_LARGE), "%s", s.msg);
    cr_assert(eq(u32, s.chunks, 0));
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    cr_assert(lt(long, ru.ru_maxrss, 200L * 1024), "resident memory stays small (kB)");
    cr_assert(tsrv_wait_closed(srv, 1, WAIT_MS));
}

/* Heap bytes in use (every arena, and the blocks malloc maps on its own). */
static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/* A stream's last chunk is not kept parsed once its hook returned: jansson's tree costs ~38
 * bytes a number, so 4 streams that each got a 512 kB chunk (an engine's prompt echo, or any
 * field it adds) and then waited held ~9 MB each, for as long as their engine stayed silent
 * (the idle timeout: 600 s in the adapter), far past the bound of one event a stream. */
KVR_TEST_END(client, a_delivered_chunk_is_not_kept_parsed, end)
{
    enum { STREAMS = 4, ZEROS = 256 * 1024 };
    static char body[2 * ZEROS + 256];
    size_t n = (size_t)snprintf(body, sizeof body, "%s",
                                "data: {\"choices\":[{\"text\":\"a\",\"token_ids\":[5]}],"
                                "\"prompt_token_ids\":[");
    for (unsigned i = 0; i < ZEROS; i++)
        n += (size_t)snprintf(body + n, sizeof body - n, i ? ",0" : "0");
    n += (size_t)snprintf(body + n, sizeof body - n, "]}\n\n");
    tsrv_set_raw(srv, body, n);
    client((struct kvr_oai_config){.return_token_ids = true});
    barrier(140); /* the client's thread and its connections set up */
    size_t before = heap_in_use();
    for (uint64_t k = 141; k < 141 + STREAMS; k++) /* each then silent, open */
        cr_assert(eq(int, submit(k, TS_RAW, 0, 0, 1, 0), KVR_OK));
    for (uint64_t k = 141; k < 141 + STREAMS; k++)
        cr_assert(wait_chunks(k, 1));
    barrier(150); /* every hook of theirs returned */
    size_t held = heap_in_use() - before;
    /* what may stay: each stream's parser buffer and the server's copy of the event, each
     * at most twice its size (buffers grow by doubling); parsed, it held 24 times its size */
    cr_assert(lt(sz, held, (size_t)STREAMS * 6 * n), "%zu bytes held for %u streams of %zu", held,
              (unsigned)STREAMS, n);
}

/* ---- creation, the model ---- */

KVR_TEST_END(client, create_checks_and_model_discovery, end)
{
    kvr_status st = KVR_OK;
    struct kvr_oai_config bad[] = {
        {.base_url = NULL, .model = "m"},
        {.base_url = "127.0.0.1:80", .model = "m"},
        {.base_url = "ftp://127.0.0.1", .model = "m"},
        {.base_url = "http://", .model = "m"},
        {.base_url = "http://a b", .model = "m"},
        {.base_url = "http://127.0.0.1:1", .model = "m", .max_streams = 70000},
        {.base_url = "http://127.0.0.1:1", .model = "m", .idle_timeout_ms = -1},
    };
    for (unsigned i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect(eq(ptr, kvr_oai_create(&bad[i], &hooks, &st), NULL), "case %u", i);
        cr_expect(eq(int, st, KVR_ERR_INVALID), "case %u", i);
    }
    struct kvr_oai_config ok = {.base_url = "http://127.0.0.1:1", .model = "m"};
    cr_assert(eq(ptr, kvr_oai_create(&ok, &(struct kvr_oai_hooks){0}, &st), NULL));
    cr_assert(eq(int, st, KVR_ERR_INVALID));
    /* no model: asked from /v1/models */
    struct kvr_oai_config ask = {.base_url = tsrv_url(srv), .model = ""};
    cr_assert(eq(ptr, kvr_oai_create(&ask, &hooks, &st), NULL)); /* 404 */
    cr_assert(eq(int, st, KVR_ERR_INVALID));
    tsrv_set_get(srv, "/v1/models", 200, "application/json", "{\"object\":\"list\",\"data\":[]}");
    cr_assert(eq(ptr, kvr_oai_create(&ask, &hooks, &st), NULL));
    cr_assert(eq(int, st, KVR_ERR_MALFORMED));
    tsrv_set_get(srv, "/v1/models", 200, "application/json",
                 "{\"object\":\"list\",\"data\":[{\"id\":\"org/model-7b\",\"object\":\"model\"},"
                 "{\"id\":\"lora\"}]}");
    R.c = kvr_oai_create(&ask, &hooks, &st);
    cr_assert(eq(int, st, KVR_OK));
    cr_assert(eq(str, (char *)kvr_oai_model(R.c), "org/model-7b"));
    struct seen s = run(140, TS_STREAM, 1, TF_STOP, 0, 0);
    cr_assert(eq(int, s.st, KVR_OK));
    char *body = tsrv_last_body(srv);
    cr_assert(ne(ptr, strstr(body, "\"model\":\"org/model-7b\""), NULL), "%s", body);
    free(body);
    char name[8];
    cr_assert(eq(int, kvr_oai_model_first(tsrv_url(srv), 0, name, sizeof name),
                 KVR_ERR_MALFORMED)); /* too long for the buffer */
}

/* ---- the engine's metrics, health ---- */

KVR_TEST_END(client, engine_metrics_over_http, end)
{
    const char *url = tsrv_url(srv);
    struct kvr_engine_metrics m;
    cr_assert(eq(int, kvr_oai_engine_metrics(url, 2000, &m), KVR_ERR_IO)); /* 404 */
    tsrv_set_get(srv, "/metrics", 200, "text/plain; version=0.0.4",
                 "# TYPE vllm:num_requests_running gauge\n"
                 "vllm:num_requests_running{model_name=\"m\"} 3\n"
                 "vllm:num_requests_waiting{model_name=\"m\"} 1\n"
                 "vllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n"
                 "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"100\"} 1\n");
    cr_assert(eq(int, kvr_oai_engine_metrics(url, 2000, &m), KVR_OK));
    cr_assert(eq(int, m.kind, KVR_ENGINE_VLLM));
    cr_assert(eq(u64, m.running, 3));
    cr_assert(eq(u64, m.capacity_tokens, 1600));
    /* SGLang: capacity from /get_server_info */
    tsrv_set_get(srv, "/metrics", 200, "text/plain",
                 "sglang:num_running_reqs{model_name=\"m\"} 2\n"
                 "sglang:num_queue_reqs{model_name=\"m\"} 0\n"
                 "sglang:token_usage{model_name=\"m\"} 0.1\n");
    cr_assert(eq(int, kvr_oai_engine_metrics(url, 2000, &m), KVR_OK));
    cr_assert(eq(int, m.kind, KVR_ENGINE_SGLANG));
    cr_assert(not(m.have_num_blocks)); /* no /get_server_info yet: unknown, not an error */
    tsrv_set_get(srv, "/get_server_info", 200, "application/json",
                 "{\"page_size\":1,\"max_total_num_tokens\":65536}");
    cr_assert(eq(int, kvr_oai_engine_metrics(url, 2000, &m), KVR_OK));
    cr_assert(eq(u64, m.capacity_tokens, 65536));
    cr_assert(eq(u32, m.block_size, 1));
    tsrv_set_get(srv, "/metrics", 500, "text/plain", "oops");
    cr_assert(eq(int, kvr_oai_engine_metrics(url, 2000, &m), KVR_ERR_IO));
    tsrv_set_get(srv, "/metrics", 200, "text/plain", "<html>not metrics</html>");
    cr_assert(eq(int, kvr_oai_engine_metrics(url, 2000, &m), KVR_ERR_MALFORMED));
    char closed[64];
    snprintf(closed, sizeof closed, "http://127.0.0.1:%u", closed_port());
    cr_assert(eq(int, kvr_oai_engine_metrics(closed, 2000, &m), KVR_ERR_WORKER_LOST));
    cr_assert(eq(int, kvr_oai_engine_metrics("nonsense", 2000, &m), KVR_ERR_INVALID));
    /* health */
    cr_assert(eq(int, kvr_oai_health(url, 2000), KVR_ERR_IO)); /* 404 */
    tsrv_set_get(srv, "/health", 200, "text/plain", "");
    cr_assert(eq(int, kvr_oai_health(url, 2000), KVR_OK));
    tsrv_set_get(srv, "/health", 204, "text/plain", ""); /* a proxy's No Content: up too */
    cr_assert(eq(int, kvr_oai_health(url, 2000), KVR_OK));
    tsrv_set_get(srv, "/health", 302, "text/plain", ""); /* a redirect (to a login page): not */
    cr_assert(eq(int, kvr_oai_health(url, 2000), KVR_ERR_IO));
    tsrv_set_get(srv, "/health", 503, "text/plain", "loading");
    cr_assert(eq(int, kvr_oai_health(url, 2000), KVR_ERR_OVERLOADED));
    cr_assert(eq(int, kvr_oai_health(closed, 2000), KVR_ERR_WORKER_LOST));
}

KVR_TEST_END(client, metrics_body_bound, end)
{
    char *big = malloc(KVR_OAI_METRICS_MAX_BYTES + 2);
    memset(big, '#', KVR_OAI_METRICS_MAX_BYTES + 1);
    big[KVR_OAI_METRICS_MAX_BYTES + 1] = 0;
    tsrv_set_get(srv, "/metrics", 200, "text/plain", big);
    free(big);
    struct kvr_engine_metrics m;
    cr_assert(eq(int, kvr_oai_engine_metrics(tsrv_url(srv), 5000, &m), KVR_ERR_TOO_LARGE));
}

/* ---- the figure the adapter needs ---- */

Test(client, cpu_per_token, .timeout = 300)
{
    client((struct kvr_oai_config){
        .return_token_ids = true, .continuous_usage = true, .max_streams = 100});
    uint32_t streams = slow() ? 10 : 100, per = slow() ? 100 : 1000;
    struct kvr_oai_stats before;
    kvr_oai_stats(R.c, &before);
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (uint64_t k = 0; k < streams; k++)
        cr_assert(eq(int, submit(k, TS_STREAM, per, TF_LENGTH, 0, 0), KVR_OK));
    cr_assert(wait_ends_ms(streams, 240000));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    getrusage(RUSAGE_SELF, &r1);
    struct kvr_oai_stats st;
    kvr_oai_stats(R.c, &st);
    cr_assert(eq(u64, st.finished, streams));
    cr_assert(eq(u64, st.tokens, (uint64_t)streams * per));
    double tokens = (double)st.tokens;
    double thread_ns = (double)(st.thread_cpu_ns - before.thread_cpu_ns);
    double proc_us = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) * 1e6 +
                     (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) +
                     (double)(r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) * 1e6 +
                     (double)(r1.ru_stime.tv_usec - r0.ru_stime.tv_usec);
    double wall = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    fprintf(stderr,
            "openai client: %.0f tokens in %u streams (token ids, continuous usage): client "
            "thread %.2f us CPU per token (%.3f s), whole process (test server included) %.2f us "
            "per token, %.0f tokens/s wall, %.0f bytes per token%s\n",
            tokens, streams, thread_ns / tokens / 1e3, thread_ns / 1e9, proc_us / tokens,
            tokens / wall, (double)st.bytes / tokens, slow() ? " (under valgrind)" : "");
    end();
}
