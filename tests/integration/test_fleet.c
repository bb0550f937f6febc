/*
 * The router as users deploy it: a real nats-server on 127.0.0.1, real kvrouter and kvworker
 * processes, protobuf on the wire. Each test starts its own server and processes.
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "harness.h"
#include "util.h"

#define GEN H_GEN

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

TestSuite(fleet, .init = setup, .fini = teardown, .timeout = 60);

Test(fleet, a_request_streams_its_tokens)
{
    h_router(srv.url, "r1", NULL);
    h_worker(srv.url, "1", 50, 200, NULL);
    h_until_served(nc, GEN, 0, 15000);
    struct h_result r = h_ask(nc, GEN, "stream", 1, 0, 300, 20, 10000);
    cr_assert(r.final, "the final chunk arrived");
    cr_assert(eq(u32, r.error_code, 0));
    cr_assert(eq(u32, r.tokens, 20), "one token per requested output token");
    cr_assert(eq(u32, r.chunks, 21), "20 token chunks, then the final one");
    cr_assert(eq(u64, r.worker_id, 1));
    cr_assert(le(u64, r.first_ms, r.total_ms));
    h_end();
}

Test(fleet, shared_prefixes_stick_and_load_spreads)
{
    h_router(srv.url, "r1", NULL);
    for (int i = 1; i <= 4; i++) {
        char id[12];
        snprintf(id, sizeof id, "%d", i);
        h_worker(srv.url, id, 20, 200, NULL);
    }
    h_until_served(nc, GEN, 0, 15000);
    h_sleep_ms(500); /* every worker has announced itself */
    uint64_t first = 0;
    for (int i = 0; i < 6; i++) { /* one after another, sharing a 2,048-token prefix */
        char id[32];
        snprintf(id, sizeof id, "sticky-%d", i);
        struct h_result r = h_ask(nc, GEN, id, 100 + (uint32_t)i, 2048, 2048 + 64, 4, 10000);
        cr_assert(r.final && r.error_code == 0);
        if (i == 0)
            first = r.worker_id;
        else
            cr_assert(eq(u64, r.worker_id, first), "request %d left the worker caching its prefix",
                      i);
    }
    struct h_req q[8]; /* at once, nothing shared: the predicted load spreads them */
    for (int i = 0; i < 8; i++) {
        char id[32];
        snprintf(id, sizeof id, "spread-%d", i);
        cr_assert(h_send(nc, GEN, &q[i], id, 5000 + (uint32_t)i, 0, 2048, 30));
    }
    uint64_t seen[8];
    int distinct = 0;
    for (int i = 0; i < 8; i++) {
        cr_assert(h_collect(&q[i], 20000));
        cr_assert(eq(u32, q[i].res.error_code, 0));
        bool known = false;
        for (int k = 0; k < distinct; k++)
            known |= seen[k] == q[i].res.worker_id;
        if (!known)
            seen[distinct++] = q[i].res.worker_id;
    }
    cr_assert(ge(int, distinct, 3), "8 concurrent requests used %d of 4 workers", distinct);
    h_end();
}

/* A worker killed mid-generation: its clients hear "worker lost" within seconds. */
Test(fleet, a_killed_worker_fails_its_clients_within_seconds)
{
    h_router(srv.url, "r1", NULL);
    pid_t w1 = h_worker(srv.url, "1", 1, 500, NULL);
    pid_t w2 = h_worker(srv.url, "2", 1, 500, NULL);
    h_until_served(nc, GEN, 0, 15000);
    struct h_req q[4];
    uint64_t wid[4];
    for (int i = 0; i < 4; i++) { /* long generations: 3,000 tokens at real speed */
        char id[32];
        snprintf(id, sizeof id, "long-%d", i);
        cr_assert(h_send(nc, GEN, &q[i], id, 700 + (uint32_t)i, 0, 512, 3000));
    }
    for (int i = 0; i < 4; i++)
        wid[i] = h_first_worker(&q[i], 5000);
    uint64_t victim = wid[0];
    cr_assert(victim == 1 || victim == 2);
    h_signal(victim == 1 ? w1 : w2, SIGKILL);
    uint64_t t_kill = h_now_ms();
    for (int i = 0; i < 4; i++) {
        if (wid[i] != victim)
            continue;
        cr_assert(h_collect(&q[i], 8000), "request %d on the dead worker got no answer", i);
        cr_assert(eq(u32, q[i].res.error_code, KVR_ERR_WORKER_LOST));
        cr_assert(q[i].res.error_header, "the error carries the service error headers");
        cr_assert(lt(u64, h_now_ms() - t_kill, 5000), "failed within a few seconds");
    }
    for (int i = 0; i < 4; i++)
        if (q[i].sub)
            h_sub_close(q[i].nc, q[i].sub);
    /* the survivor still serves */
    struct h_result r = h_ask(nc, GEN, "after", 42, 0, 64, 2, 10000);
    cr_assert(r.final && r.error_code == 0);
    cr_assert(ne(u64, r.worker_id, victim));
    h_end();
}

/* GenerateRequest bytes with an Overrides{policy = name} appended (names the encoder won't make).
 */
static int with_policy(uint8_t *out, const char *name)
{
    struct kvr_buf b = {0};
    uint32_t t[70];
    for (int i = 0; i < 70; i++)
        t[i] = (uint32_t)i + 1;
    kvr_wire_encode_generate(&b, "policy", t, 70, 3, NULL);
    int n = (int)b.len;
    memcpy(out, b.data, b.len);
    size_t len = strlen(name);
    out[n++] = 0x22;
    out[n++] = (uint8_t)(len + 2);
    out[n++] = 0x0a;
    out[n++] = (uint8_t)len;
    memcpy(out + n, name, len);
    kvr_buf_free(&b);
    return n + (int)len;
}

/* errors_by_code of the generate endpoint (a $SRV.STATS answer): code name -> count. */
static uint64_t errors_of(json_t *stats, const char *code)
{
    json_t *by_code = h_json_at(h_endpoint(stats, "generate"), "errors_by_code");
    bool is_object = json_is_object(by_code);
    cr_assert(is_object, "$SRV.STATS has no errors_by_code for generate");
    return json_object_get(by_code, code) ? h_json_u64(by_code, code) : 0;
}

Test(fleet, bad_input_gets_errors_and_the_router_keeps_serving)
{
    h_router(srv.url, "r1", H_ARGS("--max-prompt-tokens", "1000"));
    h_until_router(nc, 5000);
    struct h_result r = h_ask(nc, GEN, "no-workers", 1, 0, 64, 2, 5000);
    cr_assert(r.final);
    cr_assert(eq(u32, r.error_code, KVR_ERR_NO_WORKERS), "no workers: an error at once");
    h_worker(srv.url, "1", 50, 200, NULL);
    h_until_served(nc, GEN, 0, 15000);
    /* "no workers" so far: that one, and the probes sent before the worker had joined */
    json_t *before = h_stats(nc, 2000);
    uint8_t garbage[64];
    memset(garbage, 0xff, sizeof garbage);
    r = h_ask_raw(nc, GEN, garbage, sizeof garbage, 5000);
    cr_assert(r.final && r.error_header);
    cr_assert(eq(u32, r.error_code, KVR_ERR_MALFORMED));
    r = h_ask(nc, GEN, "empty", 2, 0, 0, 2, 5000);
    cr_assert(eq(u32, r.error_code, KVR_ERR_EMPTY_PROMPT));
    r = h_ask(nc, GEN, "long", 3, 0, 2000, 2, 5000);
    cr_assert(eq(u32, r.error_code, KVR_ERR_PROMPT_TOO_LONG));
    uint8_t buf[512];
    r = h_ask_raw(nc, GEN, buf, with_policy(buf, "nope"), 5000);
    cr_assert(eq(u32, r.error_code, KVR_ERR_UNKNOWN_POLICY));
    r = h_ask_raw(nc, GEN, buf, with_policy(buf, "round_robin"), 5000);
    cr_assert(eq(u32, r.error_code, 0), "a known policy override is served");
    natsConnection_Publish(nc, "kv.default.ev.1.kv", garbage, sizeof garbage);
    natsConnection_Publish(nc, "kv.default.ev.x.hb", garbage, sizeof garbage);
    natsConnection_Publish(nc, "kv.default.generate", garbage, 10); /* no reply subject */
    r = h_ask(nc, GEN, "still", 4, 0, 256, 3, 5000);
    cr_assert(r.final && r.error_code == 0, "the router still serves");
    json_t *stats = h_stats(nc, 2000);
    json_t *gen = h_endpoint(stats, "generate");
    char *text = json_dumps(gen, JSON_COMPACT);
    cr_assert(ge(u64, h_json_u64(gen, "data.bad_events"), 2), "malformed events were counted: %s",
              text);
    cr_assert(ge(u64, h_json_u64(gen, "num_errors"), 5), "refused requests were counted");
    /* every refusal by its code: the garbage without a reply subject is a dropped malformed one */
    static const struct {
        const char *code;
        uint64_t n;
    } want[] = {
        {"ERR_MALFORMED", 2},
        {"ERR_EMPTY_PROMPT", 1},
        {"ERR_PROMPT_TOO_LONG", 1},
        {"ERR_UNKNOWN_POLICY", 1},
    };
    uint64_t no_workers = errors_of(before, "ERR_NO_WORKERS"), total = no_workers;
    cr_assert(ge(u64, no_workers, 1));
    cr_assert(eq(u64, errors_of(stats, "ERR_NO_WORKERS"), no_workers), "%s", text);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        cr_assert(eq(u64, errors_of(stats, want[i].code), want[i].n), "%s: %s", want[i].code, text);
        total += want[i].n;
    }
    cr_assert(eq(u64, (uint64_t)json_object_size(h_json_at(gen, "errors_by_code")),
                 sizeof want / sizeof want[0] + 1),
              "no other codes: %s", text);
    cr_assert(eq(u64, h_json_u64(gen, "num_errors"), total), "%s", text);
    cr_assert(eq(u64, h_json_u64(gen, "dropped"), 1), "the one without a reply subject: %s", text);
    free(text);
    json_decref(stats);
    json_decref(before);
    h_end();
}

Test(fleet, sigterm_loses_no_request)
{
    pid_t r1 = h_router(srv.url, "r1", NULL);
    h_router(srv.url, "r2", NULL);
    h_worker(srv.url, "1", 50, 200, NULL);
    h_worker(srv.url, "2", 50, 200, NULL);
    /* both in the queue group: r2 still starting (its sync with r1) when r1 drains leaves no
     * router, and the requests get "no responders" (seen once under ASan) */
    h_until_served(nc, GEN, 2, 15000);
    enum { N = 120 };
    static struct h_req q[N];
    for (int i = 0; i < N; i++) {
        char id[32];
        snprintf(id, sizeof id, "drain-%d", i);
        cr_assert(h_send(nc, GEN, &q[i], id, 300 + (uint32_t)i, 512, 1024, 8));
        if (i == N / 3)
            h_signal(r1, SIGTERM);
        h_sleep_ms(5);
    }
    int ok = 0;
    for (int i = 0; i < N; i++) {
        bool got = h_collect(&q[i], 15000);
        ok += got && q[i].res.error_code == 0;
        if (!got || q[i].res.error_code)
            fprintf(stderr, "request %d: final=%d error=%u chunks=%u\n", i, got,
                    q[i].res.error_code, q[i].res.chunks);
    }
    cr_assert(eq(int, ok, N), "every request was served across the drain");
    cr_assert(eq(int, h_wait(r1, 10000), 0), "the drained router exits 0");
    h_end();
}

/* A WorkerGenerate of key (an n-token prompt, 4 out) into q, sent to worker 1 directly (as a
 * client does after a booked select). */
static void send_forward_gen(struct h_req *q, uint64_t key, uint32_t n, uint32_t max_tokens)
{
    uint32_t *toks = malloc((size_t)n * sizeof *toks);
    cr_assert(ne(ptr, toks, NULL));
    for (uint32_t i = 0; i < n; i++)
        toks[i] = ((uint32_t)key * 64 + i) % 100000;
    char id[32];
    snprintf(id, sizeof id, "fwd-%llu", (unsigned long long)key);
    struct kvr_buf g = {0}, b = {0};
    cr_assert(eq(int, kvr_wire_encode_generate(&g, id, toks, n, max_tokens, NULL), KVR_OK));
    free(toks);
    cr_assert(eq(int, kvr_wire_encode_worker_generate(&b, g.data, g.len, key, 0, "t", 0), KVR_OK));
    cr_assert(h_send_raw(nc, "kv.default.worker.1.generate", q, b.data, (int)b.len));
    kvr_buf_free(&g);
    kvr_buf_free(&b);
}

static void send_forward_of(struct h_req *q, uint64_t key, uint32_t n)
{
    send_forward_gen(q, key, n, 4);
}

static void send_forward(struct h_req *q, uint64_t key)
{
    send_forward_of(q, key, 64);
}

static void until_worker_1_serves(void)
{
    struct h_req probe;
    bool up = false;
    for (int i = 0; i < 100 && !up; i++) {
        send_forward(&probe, 1 + (uint64_t)i);
        up = h_collect(&probe, 100) && probe.res.error_code == 0;
        if (!up)
            h_sleep_ms(100); /* not subscribed yet: "no responders" at once */
    }
    cr_assert(up, "the worker never served");
}

/* A stopping worker serves the forwards it received before its subscription went: those waiting
 * in its queue when its 200 ms of "leaving" ran out (routers sent them before they heard; a
 * worker behind on its messages holds seconds of them) were refused, each client's stream ended
 * with ERR_SHUTDOWN. Here the worker is frozen in those 200 ms while forwards reach its socket,
 * the first a prompt of 1,040,000 tokens its pool could never hold (refused ERR_FULL, after
 * milliseconds of decoding and hashing: the others wait behind it as behind a busy worker). */
Test(fleet, a_stopping_worker_serves_the_forwards_it_had_received)
{
    pid_t w = h_worker(srv.url, "1", 50, 200, NULL);
    until_worker_1_serves();
    enum { N = 20 };
    static struct h_req q[N];
    h_signal(w, SIGTERM);
    h_sleep_ms(100); /* in its 200 ms of leaving */
    h_signal(w, SIGSTOP);
    struct h_req big;
    send_forward_of(&big, 999, 1040000);
    for (int i = 0; i < N; i++)
        send_forward(&q[i], 1000 + (uint64_t)i);
    cr_assert(eq(int, natsConnection_Flush(nc), NATS_OK));
    h_sleep_ms(400); /* past its 200 ms: it resumes with the forwards in its socket */
    h_signal(w, SIGCONT);
    int served = 0;
    for (int i = 0; i < N; i++) {
        bool got = h_collect(&q[i], 10000);
        served += got && q[i].res.error_code == 0 && q[i].res.tokens == 4;
        if (!got || q[i].res.error_code)
            fprintf(stderr, "forward %d: final=%d error=%u\n", i, got, q[i].res.error_code);
    }
    cr_assert(h_collect(&big, 10000));
    cr_assert(eq(u32, big.res.error_code, KVR_ERR_FULL));
    cr_assert(eq(int, served, N), "every forward it had received was served");
    cr_assert(eq(int, h_wait(w, 10000), 0), "then it exits 0");
    h_end();
}

/* A drain that runs out of time ends what the worker still holds with ERR_SHUTDOWN, its client
 * told: before, the worker exited with it and a client forwarding after a select (no router
 * answers for it) heard nothing until its own deadline. */
Test(fleet, a_worker_out_of_drain_time_tells_its_clients)
{
    pid_t w = h_worker(srv.url, "1", 1, 200, H_ARGS("--drain-timeout-ms", "300"));
    until_worker_1_serves();
    struct h_req q;
    send_forward_gen(&q, 500, 64, 4000); /* in real time: about a minute of decoding */
    cr_assert(h_first_worker(&q, 5000), "it streams");
    h_signal(w, SIGTERM);
    cr_assert(h_collect(&q, 5000), "the client is told within the drain's time");
    cr_assert(eq(u32, q.res.error_code, KVR_ERR_SHUTDOWN));
    cr_assert(lt(u32, q.res.tokens, 4000));
    cr_assert(eq(int, h_wait(w, 10000), 0), "then it exits 0");
    h_end();
}

Test(fleet, a_router_restart_is_survived)
{
    pid_t r1 = h_router(srv.url, "r1", NULL);
    h_worker(srv.url, "1", 50, 200, NULL);
    h_until_served(nc, GEN, 0, 15000);
    h_signal(r1, SIGTERM);
    cr_assert(eq(int, h_wait(r1, 10000), 0));
    h_router(srv.url, "r1b", NULL);
    h_until_served(nc, GEN, 0, 15000);
    struct h_result r = h_ask(nc, GEN, "after-restart", 9, 0, 256, 5, 5000);
    cr_assert(r.final && r.error_code == 0);
    h_end();
}

Test(fleet, a_nats_server_restart_is_survived)
{
    h_router(srv.url, "r1", NULL);
    h_worker(srv.url, "1", 50, 200, NULL);
    h_until_served(nc, GEN, 0, 15000);
    int port = srv.port;
    natsConnection_Destroy(nc);
    nc = NULL;
    h_nats_stop(&srv);
    h_sleep_ms(500);
    cr_assert(h_nats_start(&srv, port), "nats-server restarted on port %d", port);
    nc = h_connect(srv.url);
    cr_assert(nc != NULL);
    h_until_served(nc, GEN, 0, 10000); /* router and worker reconnected and re-subscribed */
    struct h_result r = h_ask(nc, GEN, "after-nats", 11, 0, 256, 5, 5000);
    cr_assert(r.final && r.error_code == 0);
    h_end();
}

/* A server that goes while a router starts: the subscriptions it made go again with the
 * reconnect, and it serves once a server is back (it used to exit 1, "subscribe_failed"). The
 * server freezes in the router's warm-up, so the flush after joining the queue group waits on it,
 * and dies with it. */
Test(fleet, a_server_lost_while_a_router_starts_is_survived)
{
    int port = srv.port;
    pid_t r1 = h_router(srv.url, "r1", H_ARGS("--warmup-ms", "2000"));
    json_t *c = NULL; /* listening: its events connection's subscriptions are made */
    for (int i = 0; i < 400 && !c; i++) {
        c = h_connz_entry(&srv, "kvrouter-r1-events");
        if (c && json_integer_value(json_object_get(c, "subscriptions")) < 5) {
            json_decref(c);
            c = NULL;
        }
        if (!c)
            h_sleep_ms(10);
    }
    cr_assert(not(eq(ptr, c, NULL)), "the router never listened");
    json_decref(c);
    h_signal(srv.pid, SIGSTOP);
    h_sleep_ms(3000); /* past its warm-up: it joined the queue group and waits for the flush */
    h_signal(srv.pid, SIGKILL);
    natsConnection_Destroy(nc);
    nc = NULL;
    h_sleep_ms(300);
    cr_assert(not(h_exited(r1)), "the router gave up");
    cr_assert(h_nats_start(&srv, port), "nats-server restarted on port %d", port);
    nc = h_connect(srv.url);
    cr_assert(nc != NULL);
    h_worker(srv.url, "1", 50, 200, NULL);
    h_until_served(nc, GEN, 0, 10000);
    cr_assert(h_log_has(r1, "subscribed_while_reconnecting"));
    struct h_result r = h_ask(nc, GEN, "after-the-cut", 12, 0, 256, 5, 5000);
    cr_assert(r.final && r.error_code == 0);
    h_end();
}

static void *kill_the_server_later(void *arg)
{
    (void)arg;
    h_sleep_ms(500);
    h_signal(srv.pid, SIGKILL);
    return NULL;
}

/* kvr_flush_subscribed, which every start-up calls after subscribing (the router's listen and
 * serve, the worker's two connections): a flush that the server's loss cuts is a success while
 * the connection reconnects, and the subscription is made again on the reconnect; on a closed
 * connection it is a failure. */
Test(fleet, a_subscription_flushed_across_a_cut_is_made_again)
{
    struct kvr_nats_config c;
    kvr_nats_config_default(&c, KVR_LOG_WARN);
    snprintf(c.urls, sizeof c.urls, "%s", srv.url);
    natsConnection *mine = NULL;
    cr_assert(eq(int, kvr_connect(&c, "flushed", &mine), KVR_OK));
    int port = srv.port;
    natsConnection_Destroy(nc); /* the test's own client: back after the restart */
    nc = NULL;
    h_signal(srv.pid, SIGSTOP);
    natsSubscription *sub = NULL;
    cr_assert(eq(int, natsConnection_SubscribeSync(&sub, mine, "kv.default.flushed"), NATS_OK));
    pthread_t killer;
    cr_assert(eq(int, pthread_create(&killer, NULL, kill_the_server_later, NULL), 0));
    natsStatus s = kvr_flush_subscribed(mine); /* waits on the frozen server, then its loss */
    pthread_join(killer, NULL);
    cr_assert(eq(int, s, NATS_OK), "%s", natsStatus_GetText(s));
    cr_assert(h_nats_start(&srv, port), "nats-server restarted on port %d", port);
    nc = h_connect(srv.url);
    cr_assert(nc != NULL);
    natsMsg *m = NULL;
    for (int i = 0; i < 100 && !m; i++) { /* until it has reconnected and subscribed again */
        natsConnection_PublishString(nc, "kv.default.flushed", "again");
        natsConnection_Flush(nc);
        if (natsSubscription_NextMsg(&m, sub, 100) != NATS_OK)
            m = NULL;
    }
    cr_assert(not(eq(ptr, m, NULL)), "the subscription was not made again on the reconnect");
    natsMsg_Destroy(m);
    natsSubscription_Destroy(sub);
    natsConnection_Close(mine);
    cr_assert(not(eq(int, kvr_flush_subscribed(mine), NATS_OK)), "closed: a failure");
    kvr_conn_destroy(mine);
    h_end();
}

/* Generate and select requests at once, from one client: the intake's two endpoints run on
 * different delivery threads and share the state (the ThreadSanitizer stage runs this). Every
 * request is answered; the worker's own $SRV.STATS counts what it served. */
Test(fleet, selects_and_generates_at_once_are_all_answered)
{
    h_router(srv.url, "r1", NULL);
    h_worker(srv.url, "1", 50, 200, NULL);
    h_worker(srv.url, "2", 50, 200, NULL);
    h_until_served(nc, GEN, 0, 15000);
    enum { N = 200 };
    static struct h_req q[N];
    natsSubscription *answers = NULL;
    cr_assert(eq(int, natsConnection_SubscribeSync(&answers, nc, "_SEL.>"), NATS_OK));
    natsSubscription_SetPendingLimits(answers, -1, -1);
    uint32_t t[96];
    for (int i = 0; i < 96; i++)
        t[i] = 31 + (uint32_t)i;
    struct kvr_buf req = {0}, sel = {0};
    for (int i = 0; i < N; i++) {
        char id[32], reply[32];
        snprintf(id, sizeof id, "both-%d", i);
        cr_assert(h_send(nc, GEN, &q[i], id, 4000 + (uint32_t)i, 64, 128, 2));
        snprintf(id, sizeof id, "sel-%d", i);
        snprintf(reply, sizeof reply, "_SEL.%d", i);
        t[0] = (uint32_t)i;
        cr_assert(eq(int, kvr_wire_encode_generate(&req, id, t, 96, 4, NULL), KVR_OK));
        cr_assert(eq(int, kvr_wire_encode_select_request(&sel, req.data, req.len, false), KVR_OK));
        cr_assert(eq(
            int,
            natsConnection_PublishRequest(nc, "kv.default.select", reply, sel.data, (int)sel.len),
            NATS_OK));
    }
    int selected = 0;
    natsMsg *m = NULL;
    while (selected < N && natsSubscription_NextMsg(&m, answers, 5000) == NATS_OK) {
        uint64_t wid = 0, key = 0;
        uint32_t overlap, ncand, code = 99;
        cr_assert(
            eq(int,
               kvr_wire_decode_select_response(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m),
                                               &wid, &overlap, &ncand, &code, &key),
               KVR_OK));
        cr_assert(eq(u32, code, 0));
        cr_assert(wid == 1 || wid == 2);
        cr_assert(eq(u32, ncand, 2), "both workers priced");
        selected++;
        natsMsg_Destroy(m);
    }
    h_sub_close(nc, answers);
    cr_assert(eq(int, selected, N), "every select answered");
    for (int i = 0; i < N; i++) {
        cr_assert(h_collect(&q[i], 15000), "generate %d got no answer", i);
        cr_assert(eq(u32, q[i].res.error_code, 0));
    }
    /* each worker answers $SRV as service kvworker: collect every answer */
    natsSubscription *srv_answers = NULL;
    cr_assert(eq(int, natsConnection_SubscribeSync(&srv_answers, nc, "_SRVW.1"), NATS_OK));
    cr_assert(eq(int, natsConnection_PublishRequestString(nc, "$SRV.STATS.kvworker", "_SRVW.1", ""),
                 NATS_OK));
    uint64_t served = 0;
    int workers = 0;
    while (natsSubscription_NextMsg(&m, srv_answers, 1000) == NATS_OK) {
        json_error_t err;
        json_t *o = json_loadb(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), 0, &err);
        cr_assert(o != NULL, "STATS is JSON: %s", err.text);
        json_t *ep = h_endpoint(o, "generate");
        cr_assert(ep != NULL);
        cr_assert(eq(u64, h_json_u64(ep, "num_errors"), 0));
        served += h_json_u64(ep, "num_requests");
        workers++;
        json_decref(o);
        natsMsg_Destroy(m);
    }
    h_sub_close(nc, srv_answers);
    cr_assert(eq(int, workers, 2), "both workers answer $SRV.STATS.kvworker");
    cr_assert(ge(u64, served, N), "the workers counted the %d requests they served", N);
    kvr_buf_free(&req);
    kvr_buf_free(&sel);
    h_end();
}

/* A counter of the (one) router's $SRV.STATS: its generate endpoint's, at path. */
static uint64_t router_stat(const char *path)
{
    json_t *stats = h_stats(nc, 3000);
    uint64_t v = h_json_u64(h_endpoint(stats, "generate"), path);
    json_decref(stats);
    return v;
}

/* Workers that send their lifecycle events in EventBatches: every request is served, the router
 * applies them (its predicted load goes back to nothing), in fewer messages than events. Their
 * heartbeats are 20 s apart (the first at start), so it is the engine thread that sends what is
 * held, not a beat. */
Test(fleet, lifecycle_events_in_batches_book_and_free_as_alone)
{
    h_router(srv.url, "r1", NULL);
    /* the workers announce themselves at start and then every 20 s (a router started after them
     * asks them again: a_router_started_after_its_workers_knows_them_at_once) */
    h_until_router(nc, 10000);
    h_worker(srv.url, "1", 50, 20000, (const char *[]){"--event-batch-ms", "5", NULL});
    h_worker(srv.url, "2", 50, 20000, (const char *[]){"--event-batch-ms", "5", NULL});
    h_until_served(nc, GEN, 0, 15000);
    h_sleep_ms(500); /* both have announced themselves */
    enum { N = 40 };
    struct h_req q[N];
    for (int i = 0; i < N; i++) {
        char id[32];
        snprintf(id, sizeof id, "batched-%d", i);
        cr_assert(h_send(nc, GEN, &q[i], id, 100 + (uint32_t)i * 7, i % 2 ? 512 : 0, 1024, 40));
    }
    for (int i = 0; i < N; i++) {
        cr_assert(h_collect(&q[i], 20000), "request %d finished", i);
        cr_assert(eq(u32, q[i].res.error_code, 0));
        cr_assert(eq(u32, q[i].res.tokens, 40));
    }
    uint64_t inflight = 1, blocks = 1; /* within a second: well before the next heartbeats */
    for (int i = 0; i < 50 && (inflight || blocks); i++, h_sleep_ms(20)) {
        inflight = router_stat("data.inflight");
        blocks = router_stat("data.active_blocks");
    }
    cr_assert(eq(u64, inflight, 0), "every done applied");
    cr_assert(eq(u64, blocks, 0), "every block freed");
    uint64_t batches = router_stat("data.event_batches"),
             events = router_stat("data.batched_events");
    cr_assert(gt(u64, batches, 0), "the events came in batches");
    cr_assert(gt(u64, events, batches), "more events than messages (%" PRIu64 " in %" PRIu64 ")",
              events, batches);
    cr_assert(eq(u64, router_stat("data.bad_events"), 0));
    cr_assert(eq(u64, router_stat("data.ends_from_heartbeats"), 0), "the dones came first");
    h_end();
}

/* A router that starts after its workers asks them to announce themselves: it knows both within
 * about a second, not at their next heartbeat (20 s apart here, the first sent before the router
 * existed). */
Test(fleet, a_router_started_after_its_workers_knows_them_at_once)
{
    natsSubscription *hb = NULL;
    cr_assert(eq(int, natsConnection_SubscribeSync(&hb, nc, "kv.default.ev.*.hb"), NATS_OK));
    cr_assert(eq(int, natsConnection_Flush(nc), NATS_OK));
    h_worker(srv.url, "1", 50, 20000, NULL);
    h_worker(srv.url, "2", 50, 20000, NULL);
    int beats = 0;
    for (natsMsg *m = NULL; beats < 2 && natsSubscription_NextMsg(&m, hb, 10000) == NATS_OK;
         beats++)
        natsMsg_Destroy(m); /* each worker's first heartbeat: gone before any router */
    cr_assert(eq(int, beats, 2));
    h_router(srv.url, "r1", NULL);
    h_until_router(nc, 10000);
    uint64_t t0 = h_now_ms();
    bool seen[3] = {false, false, false};
    for (int i = 0; i < 60 && !(seen[1] && seen[2]); i++) {
        char id[32];
        snprintf(id, sizeof id, "late-router-%d", i);
        struct h_result r = h_ask(nc, GEN, id, 5000 + (uint32_t)i * 1000, 0, 64, 1, 2000);
        if (r.final && r.error_code == 0 && r.worker_id >= 1 && r.worker_id <= 2)
            seen[r.worker_id] = true;
        else
            h_sleep_ms(50);
    }
    cr_assert(seen[1] && seen[2], "both workers served within %" PRIu64 " ms", h_now_ms() - t0);
    cr_assert(lt(u64, h_now_ms() - t0, 10000), "long before their next heartbeats");
    cr_assert(ge(u64, router_stat("data.worker_announces_asked"), 1));
    h_sub_close(nc, hb);
    h_end();
}

/* The highest KV event number, and the last heartbeat's last_event_seq, of worker 1's messages
 * on sub for up to ms, or until the heartbeat names the highest number seen (> 0). */
static void read_numbers(natsSubscription *sub, int ms, uint64_t *top, uint64_t *told)
{
    uint64_t until = h_now_ms() + (uint64_t)ms;
    natsMsg *m = NULL;
    while (!(*top && *told == *top) && h_now_ms() < until) {
        if (natsSubscription_NextMsg(&m, sub, 100) != NATS_OK)
            continue; /* a quiet 100 ms: the heartbeats come every 200 */
        const char *subj = natsMsg_GetSubject(m);
        const void *data = natsMsg_GetData(m);
        size_t len = (size_t)natsMsg_GetDataLength(m);
        struct kvr_wire_kv e;
        struct kvr_wire_heartbeat h;
        if (!strcmp(subj, "kv.default.ev.1.kv") && kvr_wire_decode_kv(data, len, &e) == KVR_OK) {
            *top = e.event_seq > *top ? e.event_seq : *top;
            kvr_wire_kv_free(&e);
        } else if (!strcmp(subj, "kv.default.ev.1.hb") &&
                   kvr_wire_decode_heartbeat(data, len, &h) == KVR_OK) {
            *told = h.last_event_seq;
            kvr_wire_heartbeat_free(&h);
        }
        natsMsg_Destroy(m);
    }
}

/* A KV event lost last, with nothing numbered after it, shows only in the worker's next
 * heartbeat, which names the number of its last KV event sent. */
Test(fleet, heartbeats_number_the_last_kv_event_so_a_lost_last_one_shows)
{
    natsSubscription *sub = NULL;
    cr_assert(eq(int, natsConnection_SubscribeSync(&sub, nc, "kv.default.ev.1.>"), NATS_OK));
    natsSubscription_SetPendingLimits(sub, -1, -1);
    cr_assert(eq(int, natsConnection_Flush(nc), NATS_OK));
    pid_t r1 = h_router(srv.url, "r1", NULL);
    h_worker(srv.url, "1", 50, 200, NULL);
    h_until_served(nc, GEN, 1, 10000);
    for (int i = 0; i < 3; i++) {
        char id[32];
        snprintf(id, sizeof id, "numbered-%d", i);
        struct h_result r = h_ask(nc, GEN, id, 1 + 1000 * (uint32_t)i, 0, 256, 2, 10000);
        cr_assert(r.final && r.error_code == 0);
    }
    uint64_t top = 0, told = 0;
    read_numbers(sub, 5000, &top, &told);
    cr_assert(gt(u64, top, 0), "the prompts' blocks were stored");
    cr_assert(eq(u64, told, top), "a heartbeat names the last one (%llu of %llu)",
              (unsigned long long)told, (unsigned long long)top);
    h_sub_close(nc, sub);
    /* a real worker's traffic reads as no loss (a heartbeat ahead of its events would count a
     * gap, closed when they come: never logged as missed) */
    h_sleep_ms(400);
    cr_assert(not(h_log_has(r1, "msg=kv_events_missed")));
    uint64_t missed = router_stat("data.kv_events_missed"),
             gaps = router_stat("data.kv_event_gaps");
    /* worker 9 numbers events 2 to 4 it never sends: only its heartbeat says so */
    struct kvr_wire_heartbeat hb = {.info = {.id = 9, .block_size = 64, .capacity_blocks = 64},
                                    .interval_ms = 500};
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &hb), KVR_OK));
    h_publish(nc, "kv.default.ev.9.hb", &b);
    cr_assert(eq(int, kvr_wire_encode_cleared(&b, 9, 1), KVR_OK));
    h_publish(nc, "kv.default.ev.9.kv", &b);
    hb.last_event_seq = 4;
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &hb), KVR_OK));
    h_publish(nc, "kv.default.ev.9.hb", &b);
    kvr_buf_free(&b);
    natsConnection_Flush(nc);
    uint64_t t0 = h_now_ms();
    while (!h_log_has(r1, "msg=kv_events_missed") && h_now_ms() - t0 < 5000)
        h_sleep_ms(50);
    cr_assert(h_log_has(r1, "open=3"), "logged, with no peer to ask");
    cr_assert(eq(u64, router_stat("data.kv_events_missed"), missed + 3));
    cr_assert(eq(u64, router_stat("data.kv_event_gaps"), gaps + 1));
    h_end();
}
