/*
 * Real engines behind kvrouter (issue 12), without a GPU: kvrouter -> kvworker --engine openai
 * (the adapter) -> HTTP (OpenAI-compatible, SSE) and ZeroMQ (msgpack KV events) -> kvengine (the
 * engine stand-in), every hop a real socket on 127.0.0.1. Tokens and their text stream through;
 * a prefix routes to the worker whose engine caches it, learnt from the engine's own KV events;
 * a KV batch the engine never sent is replayed from its replay socket; a killed engine fails its
 * requests with ERR_WORKER_LOST; a cancel closes the HTTP stream and the engine aborts the
 * request; an engine without KV events is said in the heartbeat, the router warns once and
 * learns that worker's cache from its decisions.
 */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <curl/curl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "codec.h"
#include "harness.h"
#include "tsrv.h"

#define GEN       H_GEN
#define ENGINE_BS "16" /* block size of engines, adapters and router */

static struct nats_srv srv;
static natsConnection *nc;

static void setup(void)
{
    h_setup(&srv, 1, &nc);
}

static void teardown(void)
{
    h_teardown(&nc);
}

TestSuite(engines, .init = setup, .fini = teardown, .timeout = 120);

/* --- the processes ------------------------------------------------------------------------- */

struct engine {
    pid_t pid;
    int port;        /* HTTP */
    char url[64];    /* http://127.0.0.1:port */
    char pub[64];    /* KV events, "" when none */
    char replay[64]; /* */
    pid_t adapter;   /* the kvworker in front of it */
    int metrics;     /* the adapter's /metrics port */
};

/* kvengine on ephemeral ports, with KV events unless events is false, and more arguments
 * (NULL-terminated, or NULL). */
static void engine_start_with(struct engine *e, bool events, const char *speedup,
                              const char *const *more)
{
    memset(e, 0, sizeof *e);
    char prog[512];
    snprintf(prog, sizeof prog, "%s/src/standin/kvengine", KVR_BUILD_ROOT);
    if (events) {
        snprintf(e->pub, sizeof e->pub, "tcp://127.0.0.1:%d", h_free_port());
        snprintf(e->replay, sizeof e->replay, "tcp://127.0.0.1:%d", h_free_port());
    }
    const char *args[32] = {"--listen",  "127.0.0.1:0", "--block-size", ENGINE_BS,
                            "--speedup", speedup,       "--test-hooks", "--kv-events",
                            e->pub,      "--kv-replay", e->replay,      NULL};
    for (int i = 0, n = 11; more && more[i]; i++) {
        cr_assert(lt(int, n, 31));
        args[n++] = more[i];
    }
    e->pid = h_spawn_prog(prog, "kvengine", args);
    e->port = h_http_port(e->pid, 10000);
    snprintf(e->url, sizeof e->url, "http://127.0.0.1:%d", e->port);
}

static void engine_start(struct engine *e, bool events, const char *speedup)
{
    engine_start_with(e, events, speedup, NULL);
}

/* The adapter for e as worker id, with more arguments (NULL-terminated, or NULL). */
static void adapter_start_with(struct engine *e, const char *id, const char *const *more)
{
    const char *extra[24] = {"--engine",
                             "openai",
                             "--engine-url",
                             e->url,
                             "--kv-events",
                             e->pub,
                             "--kv-replay",
                             e->replay,
                             "--block-size",
                             ENGINE_BS,
                             "--metrics-addr",
                             "127.0.0.1:0",
                             "--engine-metrics-ms",
                             "100",
                             NULL};
    for (int i = 0, n = 14; more && more[i]; i++) {
        cr_assert(lt(int, n, 23));
        extra[n++] = more[i];
    }
    e->adapter = h_worker(srv.url, id, 1, 100, extra);
    e->metrics = h_http_port(e->adapter, 10000);
}

static void adapter_start(struct engine *e, const char *id)
{
    adapter_start_with(e, id, NULL);
}

static pid_t router(void)
{
    return h_router(srv.url, "r1",
                    H_ARGS("--block-size", ENGINE_BS, "--metrics-addr", "127.0.0.1:0"));
}

/* --- HTTP ---------------------------------------------------------------------------------- */

static char body[1 << 18];

/* The value of the series name (its text up to the value, labels included) at port's
 * /metrics; -1 when absent. */
static double metric(int port, const char *name)
{
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", port);
    if (h_http(url, body, sizeof body, 3000) != 200)
        return -1;
    size_t n = strlen(name);
    for (const char *l = body; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, name, n) && l[n] == ' ')
            return atof(l + n + 1);
    return -1;
}

/* Wait until metric(port, name) >= v; its last value. */
static double until_metric(int port, const char *name, double v, int timeout_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;
    double x;
    while ((x = metric(port, name)) < v && h_now_ms() < end)
        h_sleep_ms(20);
    return x;
}

/* Wait (up to timeout_ms) until metric name reads at most v; its last reading. */
static double until_metric_below(int port, const char *name, double v, int timeout_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;
    double x;
    while ((x = metric(port, name)) > v && h_now_ms() < end)
        h_sleep_ms(20);
    return x;
}

static size_t sink(char *p, size_t size, size_t n, void *ctx)
{
    return size * n;
}

/* POST url with an empty body: its status (0: none). */
static long post(const char *url)
{
    CURL *c = curl_easy_init();
    long code = 0;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, "");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 3000L);
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(c);
    return code;
}

/* --- a request, read chunk by chunk --------------------------------------------------------- */

struct got {
    uint32_t chunks, tokens;
    bool final;
    uint32_t error_code;
    uint64_t worker;
    uint32_t cached;
    char finish[40];
    char text[8192]; /* the stream's text, joined */
    size_t ntext;
    bool positions_ok; /* every chunk's position was the tokens before it */
};

/* Read q's chunks (h_send'd) until the final one or timeout_ms. */
static struct got collect(struct h_req *q, int timeout_ms)
{
    struct got g = {.positions_ok = true};
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;
    while (!g.final && h_now_ms() < end) {
        natsMsg *m = NULL;
        if (natsSubscription_NextMsg(&m, q->sub, 200) != NATS_OK)
            continue;
        struct kvr_wire_response r;
        if (kvr_wire_decode_response(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), &r) ==
            KVR_OK) {
            g.chunks++;
            g.positions_ok &= r.position == g.tokens;
            g.tokens += r.ntokens;
            if (r.worker_id)
                g.worker = r.worker_id;
            if (r.cached_tokens)
                g.cached = r.cached_tokens;
            if (r.ntext && g.ntext + r.ntext < sizeof g.text) {
                memcpy(g.text + g.ntext, r.text, r.ntext);
                g.ntext += r.ntext;
            }
            if (r.final) {
                g.final = true;
                g.error_code = r.error_code;
                snprintf(g.finish, sizeof g.finish, "%s", r.finish_reason);
            }
            kvr_wire_response_free(&r);
        }
        natsMsg_Destroy(m);
    }
    return g;
}

static struct got ask(const char *id, uint32_t base, uint32_t shared, uint32_t n, uint32_t max)
{
    struct h_req q;
    cr_assert(h_send(nc, GEN, &q, id, base, shared, n, max));
    struct got g = collect(&q, 20000);
    h_sub_close(q.nc, q.sub);
    return g;
}

/* ask, of 4 tokens, once the router at rport books nothing: on an idle fleet (kv's cost also
 * prices the requests still decoding on a worker); asserts it finished. */
static struct got ask_when_idle(int rport, const char *id, uint32_t base, uint32_t n)
{
    cr_assert(eq(dbl, until_metric_below(rport, "kvrouter_inflight_requests", 0, 5000), 0));
    struct got g = ask(id, base, 0, n, 4);
    cr_assert(g.final && g.error_code == 0, "request %s: error %u", id, g.error_code);
    return g;
}

/* kvbench against the fleet with args (NULL-terminated, after --nats and --block-size); its
 * exit status, its pid in *pid for its log. */
static int kvbench(const char *const *args, pid_t *pid)
{
    const char *all[32] = {"--nats", srv.url, "--block-size", ENGINE_BS, "--log-level", "error"};
    for (int i = 0, n = 6; args[i]; i++) {
        cr_assert(lt(int, n, 31));
        all[n++] = args[i];
    }
    *pid = h_spawn("kvbench", all);
    return h_wait(*pid, 60000);
}

/* kvbench --mode load over the seed workload: every request finished, none broke the contract. */
static void kvbench_finishes_every_request(void)
{
    pid_t b;
    int st = kvbench((const char *const[]){"--mode", "load", "--workload", "seed", "--requests",
                                           "20", "--max-tokens", "16", "--policies", "kv", NULL},
                     &b);
    cr_expect(eq(int, st, 0), "kvbench --mode load exited %d", st);
    cr_expect(h_log_has(b, "finished=20 failed=0"),
              "kvbench did not take every stream as finished");
    cr_expect(h_log_has(b, " missing_tokens=0 "));
}

/* --- the tests ------------------------------------------------------------------------------ */

Test(engines, tokens_and_text_stream_through_the_adapter)
{
    struct engine e;
    engine_start(&e, true, "20");
    adapter_start(&e, "1");
    router();
    h_until_served(nc, GEN, 1, 15000);
    struct got g = ask("t1", 1000, 0, 100, 24);
    cr_assert(g.final, "no final chunk");
    cr_expect(eq(u32, g.error_code, 0));
    cr_expect(eq(u32, g.tokens, 24), "tokens: %u", g.tokens);
    cr_expect(g.positions_ok, "a chunk's position was not the tokens before it");
    cr_expect(eq(u64, g.worker, 1));
    cr_expect(eq(str, g.finish, "length"), "finish_reason %s", g.finish);
    cr_expect(gt(sz, g.ntext, 0), "no text streamed");
    /* the same prompt again: the engine reports its cache through the usage */
    g = ask("t2", 1000, 0, 100, 8);
    cr_expect(g.final && g.error_code == 0);
    cr_expect(ge(u32, g.cached, 96), "cached_tokens %u for a repeated 100-token prompt", g.cached);
    h_end();
}

Test(engines, an_engine_without_token_ids_streams_its_text_at_position_0)
{
    /* an older vLLM: text and a usage count, no token ids; the stream's positions stay 0, so a
     * client that follows docs/protocol.md has it whole (and no position missing) */
    struct engine e;
    engine_start(&e, true, "20");
    adapter_start_with(&e, "1", (const char *const[]){"--engine-token-ids=false", NULL});
    router();
    h_until_served(nc, GEN, 1, 15000);
    struct got g = ask("t1", 1000, 0, 100, 24);
    cr_assert(g.final, "no final chunk");
    cr_expect(eq(u32, g.error_code, 0));
    cr_expect(eq(u32, g.tokens, 0), "tokens: %u", g.tokens);
    cr_expect(g.positions_ok, "a chunk's position was not 0");
    cr_expect(gt(u32, g.chunks, 2), "%u chunks", g.chunks);
    cr_expect(gt(sz, g.ntext, 0), "no text streamed");
    cr_expect(eq(str, g.finish, "length"), "finish_reason %s", g.finish);
    cr_expect(gt(dbl, metric(e.metrics, "kvworker_adapter_chunks_without_token_ids_total"), 0));
    kvbench_finishes_every_request(); /* a client following the protocol takes them whole */
    h_end();
}

Test(engines, a_stream_the_model_ends_early_says_stop_and_counts_as_finished)
{
    /* a model reaching its end of sequence before max_tokens: finish_reason "stop" reaches the
     * client, and kvbench (load and direct) takes such a stream as finished, not short */
    struct engine e;
    engine_start_with(&e, true, "20", (const char *const[]){"--stop-after", "5", NULL});
    adapter_start(&e, "1");
    router();
    h_until_served(nc, GEN, 1, 15000);
    struct got g = ask("t1", 1000, 0, 100, 16);
    cr_assert(g.final, "no final chunk");
    cr_expect(eq(u32, g.error_code, 0));
    cr_expect(eq(u32, g.tokens, 5), "tokens: %u", g.tokens);
    cr_expect(eq(str, g.finish, "stop"), "finish_reason %s", g.finish);
    g = ask("t2", 2000, 0, 100, 4); /* asked for fewer: "length" */
    cr_expect(eq(u32, g.tokens, 4), "tokens: %u", g.tokens);
    cr_expect(eq(str, g.finish, "length"), "finish_reason %s", g.finish);
    kvbench_finishes_every_request();
    pid_t b;
    int st = kvbench((const char *const[]){"--mode", "direct", "--engine-url", e.url, "--requests",
                                           "5", "--warmup", "1", "--max-tokens", "16",
                                           "--prompt-tokens", "64", NULL},
                     &b);
    cr_expect(eq(int, st, 0), "kvbench --mode direct exited %d", st);
    cr_expect(h_log_has(b, " fleet_failed=0 direct_failed=0"));
    h_end();
}

Test(engines, a_prompt_of_200k_tokens_streams_though_its_first_chunk_echoes_it)
{
    /* vLLM (and kvengine) echo the prompt's ids in a stream's first chunk with return_token_ids:
     * 1.3 MB of JSON here, over the 1 MiB a chunk is otherwise allowed */
    struct engine e;
    engine_start_with(&e, true, "20", (const char *const[]){"--max-model-len", "262144", NULL});
    adapter_start(&e, "1");
    router();
    h_until_served(nc, GEN, 1, 15000);
    struct got g = ask("big", 0, 200000, 200000, 4);
    cr_assert(g.final, "no final chunk");
    cr_expect(eq(u32, g.error_code, 0), "error %u", g.error_code);
    cr_expect(eq(u32, g.tokens, 4), "tokens: %u", g.tokens);
    cr_expect(g.positions_ok);
    h_end();
}

/* An engine that answers its /health but not its /metrics (an error status, a text without a
 * sample) leaves the heartbeats with the last load read: that is counted and said (it once went
 * unnoticed, the load frozen without a word), while the engine stays up (no drain). */
Test(engines, an_engine_whose_metrics_fail_is_counted_and_said)
{
    struct tsrv *t = tsrv_start();
    tsrv_set_get(t, "/health", 200, "text/plain", "");
    tsrv_set_get(t, "/metrics", 200, "text/plain",
                 "vllm:num_requests_waiting{model_name=\"m\"} 3\n");
    tsrv_set_get(t, "/v1/models", 200, "application/json", "{\"data\":[{\"id\":\"m\"}]}");
    char url[128]; /* with a password (a proxy's basic auth): no log line shows it */
    snprintf(url, sizeof url, "http://bob:hunter2@%s", tsrv_url(t) + strlen("http://"));
    const char *extra[] = {"--engine",
                           "openai",
                           "--engine-url",
                           url,
                           "--block-size",
                           ENGINE_BS,
                           "--engine-metrics-ms",
                           "100",
                           "--metrics-addr",
                           "127.0.0.1:0",
                           NULL};
    pid_t w = h_worker(srv.url, "1", 1, 100, extra);
    int port = h_http_port(w, 10000);
    const char *failed = "kvworker_adapter_engine_metrics_failed_total";
    h_sleep_ms(500); /* five reads that answered */
    cr_assert(eq(dbl, metric(port, failed), 0));
    tsrv_set_get(t, "/metrics", 500, "application/json", "{\"error\":\"broken\"}");
    cr_assert(ge(dbl, until_metric(port, failed, 2, 5000), 2));
    tsrv_set_get(t, "/metrics", 200, "text/plain", "# nothing\n");
    double n = metric(port, failed);
    cr_assert(gt(dbl, until_metric(port, failed, n + 2, 5000), n + 1), "a text with no sample");
    cr_expect(eq(dbl, metric(port, "kvworker_adapter_engine_up"), 1), "the engine is up");
    cr_expect(h_log_has(w, "msg=engine_metrics_failed"));
    cr_expect(not(h_log_has(w, "hunter2")), "the engine's URL is logged without its password");
    h_end();
    tsrv_stop(t);
}

Test(engines, an_engine_counting_more_tokens_than_max_tokens_fails_the_stream)
{
    /* an engine (or whatever answers in its place) whose usage jumps to 20 million tokens for a
     * request of max_tokens 8: the stream fails, the worker announces no 20 million tokens'
     * blocks, and keeps serving */
    struct tsrv *t = tsrv_start();
    tsrv_set_get(t, "/health", 200, "text/plain", "");
    tsrv_set_get(t, "/metrics", 200, "text/plain", "");
    tsrv_set_get(t, "/v1/models", 200, "application/json", "{\"data\":[{\"id\":\"m\"}]}");
    static const char lie[] =
        "data: {\"choices\":[{\"index\":0,\"text\":\"a\",\"finish_reason\":null}],"
        "\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":1}}\n\n"
        "data: {\"choices\":[{\"index\":0,\"text\":\"b\",\"finish_reason\":null}],"
        "\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":20000000}}\n\n"
        "data: {\"choices\":[{\"index\":0,\"text\":\"c\",\"finish_reason\":\"length\"}],"
        "\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":20000001}}\n\n"
        "data: [DONE]\n\n";
    tsrv_set_raw(t, lie, sizeof lie - 1);
    const char *extra[] = {"--engine",       "openai",       "--engine-url",
                           tsrv_url(t),      "--block-size", ENGINE_BS,
                           "--metrics-addr", "127.0.0.1:0",  NULL};
    pid_t w = h_worker(srv.url, "1", 1, 100, extra);
    router();
    h_until_router(nc, 15000);
    /* the prompt names tsrv's scenario: shared tokens are 7, 8, 9, 10: TS_RAW (7), 8 bytes a
     * write, an event stream */
    _Static_assert(TS_RAW == 7, "the prompt below");
    struct got g = ask("lie", 0, 4, 4, 8);
    cr_assert(g.final, "no final chunk");
    cr_assert(eq(u32, g.error_code, (uint32_t)KVR_ERR_MALFORMED), "error %u", g.error_code);
    cr_expect(eq(u32, g.tokens, 0), "tokens: %u", g.tokens);
    cr_expect(not(h_exited(w)), "the worker died");
    /* it still serves: the same again is failed the same way, at once */
    g = ask("lie2", 0, 4, 4, 8);
    cr_expect(g.final && g.error_code == (uint32_t)KVR_ERR_MALFORMED);
    h_end();
    tsrv_stop(t);
}

Test(engines, a_prefix_routes_to_the_engine_that_caches_it)
{
    struct engine e[2];
    engine_start(&e[0], true, "20");
    engine_start(&e[1], true, "20");
    adapter_start(&e[0], "1");
    adapter_start(&e[1], "2");
    pid_t r = router();
    int rport = h_http_port(r, 10000);
    h_until_served(nc, GEN, 1, 15000);
    /* four prefixes, one request each; then, once the router's index holds their blocks from
     * the engines' KV events, four more on each prefix, each sent once the router has heard the
     * previous one's done (an idle fleet: kv's cost also prices the requests decoding on a
     * worker): each goes where its prefix is cached */
    uint64_t first[4];
    for (int p = 0; p < 4; p++) {
        char id[16];
        snprintf(id, sizeof id, "a%d", p);
        struct got g = ask(id, 100000u * (uint32_t)(p + 1), 0, 520, 4);
        cr_assert(g.final && g.error_code == 0, "prefix %d: error %u", p, g.error_code);
        first[p] = g.worker;
    }
    double entries = until_metric(rport, "kvrouter_index_entries", 4 * 32, 5000);
    cr_assert(ge(dbl, entries, 4 * 32), "the router's index holds %g entries", entries);
    int same = 0, total = 0;
    for (int p = 0; p < 4; p++)
        for (int k = 0; k < 4; k++) {
            char id[32];
            snprintf(id, sizeof id, "b%d_%d", p, k);
            cr_assert(eq(dbl, until_metric_below(rport, "kvrouter_inflight_requests", 0, 5000), 0));
            struct got g = ask(id, 100000u * (uint32_t)(p + 1), 0, 560 + 16 * k, 4);
            cr_assert(g.final && g.error_code == 0);
            same += g.worker == first[p];
            total++;
            cr_expect(ge(u32, g.cached, 512), "request %s: cached_tokens %u", id, g.cached);
        }
    cr_expect(eq(int, same, total), "%d of %d followed their prefix", same, total);
    h_end();
}

Test(engines, a_dropped_batch_is_replayed)
{
    struct engine e;
    engine_start(&e, true, "20");
    adapter_start(&e, "1");
    pid_t r = router();
    int rport = h_http_port(r, 10000);
    h_until_served(nc, GEN, 1, 15000);
    char url[128];
    snprintf(url, sizeof url, "%s/test/drop_batches?n=1", e.url);
    cr_assert(eq(long, post(url), 200));
    /* A's batch is never sent; B's arrives with a gap, which the replay fills */
    struct got g = ask("A", 1000, 0, 160, 2);
    cr_assert(g.final && g.error_code == 0);
    g = ask("B", 9000, 0, 160, 2);
    cr_assert(g.final && g.error_code == 0);
    double filled = until_metric(e.metrics, "kvworker_adapter_kv_gaps_filled_total", 1, 3000);
    cr_expect(ge(dbl, filled, 1), "gaps filled: %g", filled);
    double took = metric(e.metrics, "kvworker_adapter_kv_gap_fill_seconds");
    printf("engines: a gap filled from the replay socket in %.3f ms\n", took * 1e3);
    cr_expect(gt(dbl, took, 0), "the fill time is reported"); /* (no reset: within the replay's
                                                                  500 ms wait, asserted below) */
    /* every block the engine caches (A's, in the batch it never sent, too) is in the index */
    double cached = metric(e.port, "kvengine_engine_cached_blocks");
    cr_assert(ge(dbl, cached, 20), "the engine caches %g blocks", cached);
    double entries = until_metric(rport, "kvrouter_index_entries", cached, 3000);
    cr_expect(eq(dbl, entries, cached), "the router holds %g blocks, the engine %g", entries,
              cached);
    cr_expect(eq(dbl, metric(e.metrics, "kvworker_adapter_kv_resets_total"), 0));
    h_end();
}

Test(engines, a_killed_engine_fails_its_requests_as_worker_lost)
{
    struct engine e;
    engine_start(&e, true, "0.5"); /* slow: the request is still streaming when it dies */
    adapter_start(&e, "1");
    router();
    h_until_served(nc, GEN, 1, 15000);
    struct h_req q;
    cr_assert(h_send(nc, GEN, &q, "long", 1, 0, 64, 2000));
    cr_assert(ne(u64, h_first_worker(&q, 10000), 0), "no first chunk");
    h_signal(e.pid, SIGKILL);
    uint64_t t0 = h_now_ms();
    struct got g = collect(&q, 10000);
    h_sub_close(q.nc, q.sub);
    cr_assert(g.final, "no final chunk after the engine died");
    cr_expect(eq(u32, g.error_code, (uint32_t)KVR_ERR_WORKER_LOST), "error %u", g.error_code);
    printf("engines: final ERR_WORKER_LOST %llu ms after kill -9 of the engine\n",
           (unsigned long long)(h_now_ms() - t0));
    /* the adapter drains while the engine is down, and says why */
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/readyz", e.metrics);
    uint64_t end = h_now_ms() + 5000;
    int st = 200;
    while ((st = h_http(url, body, sizeof body, 2000)) == 200 && h_now_ms() < end)
        h_sleep_ms(50);
    cr_expect(eq(int, st, 503), "readyz %d", st);
    h_wait(e.pid, 2000);
    h_end();
}

Test(engines, a_cancel_aborts_the_request_in_the_engine)
{
    struct engine e;
    engine_start(&e, true, "0.5");
    adapter_start(&e, "1");
    router();
    h_until_served(nc, GEN, 1, 15000);
    struct h_req q;
    cr_assert(h_send(nc, GEN, &q, "c1", 1, 0, 64, 4000));
    cr_assert(ne(u64, h_first_worker(&q, 10000), 0), "no first chunk");
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_cancel(&b, "c1", q.inbox), KVR_OK));
    h_publish(nc, "kv.default.cancel", &b);
    kvr_buf_free(&b);
    struct got g = collect(&q, 10000);
    h_sub_close(q.nc, q.sub);
    cr_assert(g.final);
    cr_expect(eq(u32, g.error_code, (uint32_t)KVR_ERR_CANCELLED), "error %u", g.error_code);
    double aborted = until_metric(e.port, "kvengine_requests_aborted_total", 1, 3000);
    cr_expect(eq(dbl, aborted, 1), "the engine aborted %g requests", aborted);
    cr_expect(eq(dbl, until_metric_below(e.port, "kvengine_requests_held", 0, 1000), 0));
    h_end();
}

Test(engines, without_kv_events_the_router_learns_from_its_decisions)
{
    struct engine e[2];
    engine_start(&e[0], false, "20");
    engine_start(&e[1], false, "20");
    adapter_start(&e[0], "1");
    adapter_start(&e[1], "2");
    pid_t r = router();
    int rport = h_http_port(r, 10000);
    h_until_served(nc, GEN, 1, 15000);
    char v[64];
    cr_assert(h_log_value(r, "worker_without_kv_events", "worker", v, sizeof v, 5000),
              "the router did not warn");
    cr_expect(eq(dbl, metric(rport, "kvrouter_worker_approximate{worker=\"1\"}"), 1));
    uint64_t first[3];
    for (int p = 0; p < 3; p++) {
        char id[16];
        snprintf(id, sizeof id, "n%d", p);
        struct got g = ask(id, 100000u * (uint32_t)(p + 1), 0, 520, 4);
        cr_assert(g.final && g.error_code == 0);
        first[p] = g.worker;
    }
    int same = 0;
    for (int p = 0; p < 3; p++) {
        char id[16];
        snprintf(id, sizeof id, "m%d", p);
        struct got g = ask_when_idle(rport, id, 100000u * (uint32_t)(p + 1), 600);
        same += g.worker == first[p];
    }
    cr_expect(eq(int, same, 3), "%d of 3 followed their prefix", same);
    h_end();
}

Test(engines, a_burst_of_10000_stored_blocks_reaches_the_index)
{
    struct engine e;
    engine_start(&e, true, "50");
    adapter_start(&e, "1");
    pid_t r = router();
    int rport = h_http_port(r, 10000);
    h_until_served(nc, GEN, 1, 15000);
    enum { N = 40, LEN = 4000 }; /* 40 prompts of 250 blocks, all at once */
    static struct h_req q[N];
    for (int i = 0; i < N; i++) {
        char id[32];
        snprintf(id, sizeof id, "burst%d", i);
        cr_assert(h_send(nc, GEN, &q[i], id, 7000u + (uint32_t)i, 0, LEN, 2));
    }
    uint64_t t0 = h_now_ms();
    for (int i = 0; i < N; i++) {
        struct got g = collect(&q[i], 30000);
        h_sub_close(q[i].nc, q[i].sub);
        cr_assert(g.final && g.error_code == 0, "request %d: error %u", i, g.error_code);
    }
    double cached = metric(e.port, "kvengine_engine_cached_blocks");
    cr_assert(ge(dbl, cached, N * LEN / 16), "the engine caches %g blocks", cached);
    double entries = until_metric(rport, "kvrouter_index_entries", cached, 5000);
    printf("engines: burst: %g blocks cached by the engine, %g in the router's index, %llu ms\n",
           cached, entries, (unsigned long long)(h_now_ms() - t0));
    cr_expect(eq(dbl, entries, cached), "the router holds %g of the engine's %g blocks", entries,
              cached);
    cr_expect(eq(dbl, metric(e.metrics, "kvworker_adapter_kv_resets_total"), 0));
    h_end();
}

Test(engines, every_wire_form_of_kv_events_and_metrics_is_read)
{
    /* integer hashes in vLLM's old array layout, signed; 32-byte digests in current vLLM's map
     * events; SGLang's metrics names and /get_server_info for the capacity */
    static const char *const forms[3][7] = {
        {"--kv-hash", "int", "--kv-layout", "old", "--num-blocks", "3000", NULL},
        {"--kv-hash", "bytes", "--kv-layout", "map", "--num-blocks", "4000", NULL},
        {"--kv-hash", "uint", "--metrics-style", "sglang", "--num-blocks", "5000", NULL},
    };
    struct engine e[3];
    for (int i = 0; i < 3; i++)
        engine_start_with(&e[i], true, "20", forms[i]);
    for (int i = 0; i < 3; i++) {
        char id[12];
        snprintf(id, sizeof id, "%d", i + 1);
        adapter_start(&e[i], id);
    }
    pid_t r = router();
    int rport = h_http_port(r, 10000);
    h_until_served(nc, GEN, 1, 15000);
    for (int i = 0; i < 3; i++) { /* the capacity each engine's metrics gave */
        char name[80];
        snprintf(name, sizeof name, "kvrouter_worker_capacity_blocks{worker=\"%d\"}", i + 1);
        double cap = until_metric(rport, name, 3000 + 1000 * i, 5000);
        cr_expect(eq(dbl, cap, 3000 + 1000 * i), "worker %d: capacity %g", i + 1, cap);
    }
    for (int p = 0; p < 12; p++) {
        char id[16];
        snprintf(id, sizeof id, "w%d", p);
        struct got g = ask(id, 50000u * (uint32_t)(p + 1), 0, 320, 2);
        cr_assert(g.final && g.error_code == 0, "request %d: error %u", p, g.error_code);
    }
    double cached = 0;
    for (int i = 0; i < 3; i++) {
        double c = metric(e[i].port, "kvengine_engine_cached_blocks");
        cr_assert(ge(dbl, c, 0), "engine %d has no kvengine_engine_cached_blocks", i + 1);
        cached += c;
    }
    cr_assert(ge(dbl, cached, 12 * 20));
    double entries = until_metric(rport, "kvrouter_index_entries", cached, 5000);
    cr_expect(eq(dbl, entries, cached), "the router holds %g of the engines' %g blocks", entries,
              cached);
    h_end();
}

/* vLLM serving a hybrid model announces each block twice, from its sliding-window group 0 and
 * its full-attention group 1 (map events with group_idx, the kind on each Stored); the window
 * then evicts group 0's copy, here at once. The adapter took a block out of the router's index
 * at the first group's Removed, so the index stayed empty while the engine cached every prefix:
 * it follows the full-attention group now, and counts group 0's blocks as skipped. */
Test(engines, a_hybrid_models_sliding_window_evictions_leave_its_prefixes_indexed)
{
    static const char *const hybrid[] = {"--kv-layout", "map", "--kv-hybrid", NULL};
    struct engine e;
    engine_start_with(&e, true, "20", hybrid);
    adapter_start(&e, "1");
    pid_t r = router();
    int rport = h_http_port(r, 10000);
    h_until_served(nc, GEN, 1, 15000);
    for (int p = 0; p < 4; p++) {
        char id[16];
        snprintf(id, sizeof id, "hy%d", p);
        struct got g = ask(id, 70000u * (uint32_t)(p + 1), 0, 320, 2);
        cr_assert(g.final && g.error_code == 0, "request %d: error %u", p, g.error_code);
    }
    double cached = metric(e.port, "kvengine_engine_cached_blocks");
    cr_assert(ge(dbl, cached, 4 * 20), "the engine caches %g blocks", cached);
    double entries = until_metric(rport, "kvrouter_index_entries", cached, 5000);
    cr_expect(eq(dbl, entries, cached), "the router holds %g of the engine's %g blocks", entries,
              cached);
    double stored = metric(e.metrics, "kvworker_adapter_kv_stored_blocks_total");
    double skipped = metric(e.metrics, "kvworker_adapter_kv_skipped_blocks_total{why=\"group\"}");
    cr_expect(eq(dbl, skipped, 2 * stored), "group 0's %g Stored and Removed blocks: %g skipped",
              stored, skipped);
    h_end();
}

Test(engines, an_engine_silent_on_its_kv_events_endpoint_is_found_out)
{
    /* the engine publishes no KV events, but the adapter was told to expect them: once a request
     * that stored full blocks is served and no batch follows, it says so */
    struct engine e;
    engine_start(&e, false, "20");
    snprintf(e.pub, sizeof e.pub, "tcp://127.0.0.1:%d", h_free_port());
    const char *extra[] = {"--engine",
                           "openai",
                           "--engine-url",
                           e.url,
                           "--kv-events",
                           e.pub,
                           "--block-size",
                           ENGINE_BS,
                           "--kv-events-timeout-ms",
                           "300",
                           "--engine-metrics-ms",
                           "100",
                           NULL};
    e.adapter = h_worker(srv.url, "1", 1, 100, extra);
    pid_t r = router();
    h_until_served(nc, GEN, 1, 15000);
    char v[64];
    struct got g = ask("s1", 1, 0, 160, 2);
    cr_assert(g.final && g.error_code == 0);
    cr_assert(h_log_value(e.adapter, "kv_events_missing", "endpoint", v, sizeof v, 5000),
              "the adapter did not notice");
    cr_assert(h_log_value(r, "worker_without_kv_events", "worker", v, sizeof v, 5000),
              "the router did not warn");
    h_end();
}

Test(engines, a_restarted_engine_leaves_no_stale_blocks_in_the_index)
{
    struct engine e;
    char listen[32], port[8];
    snprintf(port, sizeof port, "%d", h_free_port());
    snprintf(listen, sizeof listen, "127.0.0.1:%s", port);
    const char *on_port[] = {"--listen", listen, NULL}; /* the same addresses after the restart */
    engine_start_with(&e, true, "20", on_port);
    adapter_start(&e, "1");
    pid_t r = router();
    int rport = h_http_port(r, 10000);
    h_until_served(nc, GEN, 1, 15000);
    struct got g = ask("before", 3000, 0, 320, 2);
    cr_assert(g.final && g.error_code == 0);
    double cached = metric(e.port, "kvengine_engine_cached_blocks");
    cr_assert(ge(dbl, until_metric(rport, "kvrouter_index_entries", cached, 3000), 20));
    h_signal(e.pid, SIGKILL);
    h_wait(e.pid, 2000);
    /* a new engine on the same HTTP, PUB and replay addresses: its cache is empty */
    char prog[512];
    snprintf(prog, sizeof prog, "%s/src/standin/kvengine", KVR_BUILD_ROOT);
    const char *args[] = {"--listen",    listen, "--block-size", ENGINE_BS, "--speedup", "20",
                          "--kv-events", e.pub,  "--kv-replay",  e.replay,  NULL};
    e.pid = h_spawn_prog(prog, "kvengine", args);
    cr_assert(eq(int, h_http_port(e.pid, 10000), atoi(port)));
    /* the routers forget what the old one cached (the adapter saw it down, or its sequence
     * start again), and what the new one stores comes in */
    uint64_t end = h_now_ms() + 10000;
    double entries;
    while ((entries = metric(rport, "kvrouter_index_entries")) != 0 && h_now_ms() < end)
        h_sleep_ms(50);
    cr_expect(eq(dbl, entries, 0), "the index still holds %g blocks of the dead engine", entries);
    char v[64];
    cr_assert(h_log_value(e.adapter, "engine_restarted", "url", v, sizeof v, 5000),
              "the adapter did not tell the restart");
    /* the new engine's blocks come in; its first batch may go before the adapter's subscriber
     * has reconnected (ZeroMQ's slow joiner: a lost hit, never a false one), so up to 3 tries */
    entries = 0;
    for (int k = 0; k < 3 && entries == 0; k++) {
        char id[32];
        snprintf(id, sizeof id, "after%d", k);
        g = ask(id, 4000u + 1000u * (uint32_t)k, 0, 320, 2);
        cr_assert(g.final && g.error_code == 0, "after the restart: error %u", g.error_code);
        entries = until_metric(rport, "kvrouter_index_entries", 20, 2000);
    }
    cached = metric(e.port, "kvengine_engine_cached_blocks");
    cr_expect(ge(dbl, entries, 20), "the router holds %g, the new engine %g", entries, cached);
    cr_expect(le(dbl, entries, cached), "the router holds %g blocks, the engine only %g", entries,
              cached);
    h_end();
}

/* A POST with a body and headers (NULL-terminated), answered within timeout_ms: its status. */
static long post_json(const char *url, const char *json, const char *header, long timeout_ms)
{
    CURL *c = curl_easy_init();
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    h = curl_slist_append(h, header);
    long code = 0;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, json);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return code;
}

/* The prompt tokens kvengine's data-parallel rank r took in. */
static double rank_prompt_tokens(int port, int r)
{
    char name[96];
    snprintf(name, sizeof name, "vllm:prompt_tokens_total{model_name=\"kvengine\",engine=\"%d\"}",
             r);
    return metric(port, name);
}

static void *stalled_request(void *url)
{
    post_json(url, "{\"model\":\"kvengine\",\"prompt\":[1,2,3],\"max_tokens\":2}",
              "X-data-parallel-rank: 1", 10000);
    return NULL;
}

/* One vLLM with two data-parallel ranks behind one server (kvengine --dp-size 2), a worker per
 * rank (--engine-dp-rank): each worker's requests run on its own rank, so a prefix returns to
 * the rank that caches it; each heartbeat carries its own rank's capacity and queue, not the sum
 * over the engine; each worker reads its own rank's KV events. */
/* Whether port of 127.0.0.1 can be bound now. */
static bool bindable(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* kvengine --dp-size 2 (3,000 blocks a rank) into e, its ranks' KV endpoints into pubs and reps:
 * rank 1 publishes on the ports after rank 0's, as vLLM's ranks do. Free ports are only free
 * when asked, and the one after a free port may be taken (a connection's ephemeral port: seen in
 * a clean-clone CI run), so a start that cannot bind is tried again on other ports. */
static void dp_engine_start(struct engine *e, char pubs[2][64], char reps[2][64])
{
    char prog[512];
    snprintf(prog, sizeof prog, "%s/src/standin/kvengine", KVR_BUILD_ROOT);
    for (int attempt = 0;; attempt++) {
        int pub, rep;
        do {
            pub = h_free_port();
            rep = h_free_port();
        } while (rep == pub + 1 || pub == rep + 1 || rep == pub || pub == 65535 || rep == 65535 ||
                 !bindable(pub + 1) || !bindable(rep + 1));
        for (int r = 0; r < 2; r++) {
            snprintf(pubs[r], 64, "tcp://127.0.0.1:%d", pub + r);
            snprintf(reps[r], 64, "tcp://127.0.0.1:%d", rep + r);
        }
        e->pid = h_spawn_prog(
            prog, "kvengine",
            (const char *const[]){"--listen", "127.0.0.1:0", "--block-size", ENGINE_BS, "--speedup",
                                  "20", "--test-hooks", "--kv-events", pubs[0], "--kv-replay",
                                  reps[0], "--dp-size", "2", "--num-blocks", "3000", NULL});
        uint64_t end = h_now_ms() + 10000;
        while (!h_log_has(e->pid, "msg=http_listening") && !h_exited(e->pid) && h_now_ms() < end)
            h_sleep_ms(20);
        if (!h_exited(e->pid) || attempt == 4)
            break;
    }
    e->port = h_http_port(e->pid, 10000);
}

Test(engines, a_worker_per_data_parallel_rank_of_one_engine)
{
    struct engine e[2];
    memset(e, 0, sizeof e);
    char pubs[2][64], reps[2][64];
    dp_engine_start(&e[0], pubs, reps);
    snprintf(e[0].url, sizeof e[0].url, "http://127.0.0.1:%d", e[0].port);
    e[1] = e[0];
    for (int r = 0; r < 2; r++) {
        snprintf(e[r].pub, sizeof e[r].pub, "%s", pubs[r]);
        snprintf(e[r].replay, sizeof e[r].replay, "%s", reps[r]);
        adapter_start_with(&e[r], r ? "2" : "1",
                           (const char *const[]){"--engine-dp-rank", r ? "1" : "0", NULL});
    }
    pid_t rt = router();
    int rport = h_http_port(rt, 10000);
    h_until_served(nc, GEN, 1, 15000);
    /* capacity: each rank's pool, not the engine's two */
    for (int w = 1; w <= 2; w++) {
        char name[96];
        snprintf(name, sizeof name, "kvrouter_worker_capacity_blocks{worker=\"%d\"}", w);
        cr_assert(eq(dbl, until_metric(rport, name, 3000, 5000), 3000), "worker %d", w);
    }
    /* queue: rank 1 stalled with a request held, worker 2 says it, worker 1 does not */
    char url[128];
    snprintf(url, sizeof url, "%s/test/stall?ms=3000&rank=1", e[0].url);
    cr_assert(eq(long, post(url), 200));
    snprintf(url, sizeof url, "%s/v1/completions", e[0].url);
    pthread_t t;
    cr_assert(eq(int, pthread_create(&t, NULL, stalled_request, url), 0));
    double q2 = until_metric(rport, "kvrouter_worker_waiting_requests{worker=\"2\"}", 1, 2500);
    double q1 = metric(rport, "kvrouter_worker_waiting_requests{worker=\"1\"}");
    pthread_join(t, NULL);
    cr_expect(eq(dbl, q2, 1), "worker 2 (rank 1) reports %g waiting", q2);
    cr_expect(eq(dbl, q1, 0), "worker 1 (rank 0) reports %g waiting", q1);
    /* requests: concurrent ones spread over both workers; each ran on its worker's rank */
    double before[2];
    for (int r = 0; r < 2; r++)
        before[r] = rank_prompt_tokens(e[0].port, r);
    struct h_req q[6];
    uint64_t served[6];
    for (int i = 0; i < 6; i++) {
        char id[16];
        snprintf(id, sizeof id, "p%d", i);
        cr_assert(h_send(nc, GEN, &q[i], id, 200000u * (uint32_t)(i + 1), 0, 520, 40));
    }
    double tokens[2] = {0, 0};
    for (int i = 0; i < 6; i++) {
        struct got g = collect(&q[i], 20000);
        h_sub_close(q[i].nc, q[i].sub);
        cr_assert(g.final && g.error_code == 0, "request %d: error %u", i, g.error_code);
        cr_assert(g.worker == 1 || g.worker == 2);
        served[i] = g.worker;
        tokens[g.worker - 1] += 520;
    }
    cr_assert(gt(dbl, tokens[1], 0), "the router sent nothing to worker 2");
    for (int r = 0; r < 2; r++) {
        double ran = rank_prompt_tokens(e[0].port, r) - before[r];
        cr_expect(eq(dbl, ran, tokens[r]), "rank %d ran %g prompt tokens, worker %d was sent %g", r,
                  ran, r + 1, tokens[r]);
    }
    /* each prefix again: routed to the worker whose rank caches it, and found cached there */
    double entries = until_metric(rport, "kvrouter_index_entries", 6 * 32, 5000);
    cr_assert(ge(dbl, entries, 6 * 32), "the router's index holds %g entries", entries);
    for (int i = 0; i < 6; i++) {
        char id[24];
        snprintf(id, sizeof id, "again%d", i);
        struct got g = ask_when_idle(rport, id, 200000u * (uint32_t)(i + 1), 560);
        cr_expect(eq(u64, g.worker, served[i]), "prefix %d: worker %" PRIu64 ", first %" PRIu64, i,
                  g.worker, served[i]);
        cr_expect(ge(u32, g.cached, 512), "prefix %d: cached_tokens %u", i, g.cached);
    }
    for (int r = 0; r < 2; r++) {
        cr_expect(gt(dbl, metric(e[r].metrics, "kvworker_adapter_kv_batches_total"), 0));
        cr_expect(eq(dbl, metric(e[r].metrics, "kvworker_adapter_kv_other_rank_batches_total"), 0));
    }
    /* a worker of rank 0 given rank 1's KV ports by mistake: rank 1's batches (the rank in each)
     * are skipped and counted, none applied as its own (prompts sent to rank 1 until one is seen:
     * a subscriber hears only what is published after it joined) */
    struct engine wrong = e[1];
    adapter_start_with(&wrong, "3", (const char *const[]){"--engine-dp-rank", "0", NULL});
    double skipped = 0;
    for (int i = 0; i < 50 && skipped <= 0; i++) { /* -1: not served yet */
        char json[256];
        int n =
            snprintf(json, sizeof json, "{\"model\":\"kvengine\",\"max_tokens\":1,\"prompt\":[");
        for (int k = 0; k < 20; k++)
            n += snprintf(json + n, sizeof json - (size_t)n, "%s%d", k ? "," : "",
                          900000 + 32 * i + k);
        snprintf(json + n, sizeof json - (size_t)n, "]}");
        cr_assert(eq(long, post_json(url, json, "X-data-parallel-rank: 1", 10000), 200));
        skipped = metric(wrong.metrics, "kvworker_adapter_kv_other_rank_batches_total");
        if (skipped <= 0)
            h_sleep_ms(100);
    }
    cr_assert(gt(dbl, skipped, 0), "rank 1's batches were not skipped by a worker of rank 0");
    cr_expect(eq(dbl, metric(wrong.metrics, "kvworker_adapter_kv_batches_total"), 0));
    h_end();
}
