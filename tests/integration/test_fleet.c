/*
 * The router as users deploy it: a real nats-server on 127.0.0.1, real kvrouter and kvworker
 * processes, protobuf on the wire. Each test starts its own server and processes.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "harness.h"

#define GEN "kv.default.generate"

static struct nats_srv srv;
static natsConnection *nc;

static void setup(void)
{
    memset(&srv, 0, sizeof srv);
    cr_assert(h_nats_start(&srv, 0), "nats-server did not start");
    nc = h_connect(srv.url);
    cr_assert(nc != NULL);
}

static void teardown(void)
{
    natsConnection_Destroy(nc);
    nc = NULL;
    h_kill_all();
}

TestSuite(fleet, .init = setup, .fini = teardown, .timeout = 60);

static pid_t router(const char *id, const char *extra)
{
    const char *args[] = {
        "--nats", srv.url, "--id", id, "--log-level", "warn", extra ? "--max-prompt-tokens" : NULL,
        extra,    NULL};
    return h_spawn("kvrouter", args);
}

static pid_t worker(const char *id, const char *speedup, const char *hb_ms)
{
    const char *args[] = {"--nats",         srv.url, "--id",        id,     "--speedup", speedup,
                          "--heartbeat-ms", hb_ms,   "--log-level", "warn", NULL};
    return h_spawn("kvworker", args);
}

/* Send one request and wait for its answer. */
static struct h_result ask(const char *id, uint32_t base, uint32_t shared, uint32_t n,
                           uint32_t max_tokens, int timeout_ms)
{
    struct h_req q;
    cr_assert(h_send(nc, GEN, &q, id, base, shared, n, max_tokens));
    h_collect(&q, timeout_ms);
    return q.res;
}

/* Wait until a request succeeds (the fleet is up). */
static void until_served(int timeout_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;
    for (int i = 0; h_now_ms() < end; i++) {
        char id[32];
        snprintf(id, sizeof id, "probe-%d", i);
        struct h_result r = ask(id, 900000 + (uint32_t)i, 0, 64, 1, 2000);
        if (r.final && r.error_code == 0)
            return;
        h_sleep_ms(100);
    }
    cr_assert(false, "the fleet never served a request");
}

Test(fleet, a_request_streams_its_tokens)
{
    router("r1", NULL);
    worker("1", "50", "200");
    until_served(5000);
    struct h_result r = ask("stream", 1, 0, 300, 20, 10000);
    cr_assert(r.final, "the final chunk arrived");
    cr_assert(eq(u32, r.error_code, 0));
    cr_assert(eq(u32, r.tokens, 20), "one token per requested output token");
    cr_assert(eq(u32, r.chunks, 21), "20 token chunks, then the final one");
    cr_assert(eq(u64, r.worker_id, 1));
    cr_assert(le(u64, r.first_ms, r.total_ms));
}

Test(fleet, shared_prefixes_stick_and_load_spreads)
{
    router("r1", NULL);
    for (int i = 1; i <= 4; i++) {
        char id[8];
        snprintf(id, sizeof id, "%d", i);
        worker(id, "20", "200");
    }
    until_served(5000);
    h_sleep_ms(500); /* every worker has announced itself */
    uint64_t first = 0;
    for (int i = 0; i < 6; i++) { /* one after another, sharing a 2,048-token prefix */
        char id[32];
        snprintf(id, sizeof id, "sticky-%d", i);
        struct h_result r = ask(id, 100 + (uint32_t)i, 2048, 2048 + 64, 4, 10000);
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
}

/* Read until the first token (to learn the worker), without waiting for the end. */
Test(fleet, a_killed_worker_fails_its_clients_within_seconds)
{
    router("r1", NULL);
    pid_t w1 = worker("1", "1", "500");
    pid_t w2 = worker("2", "1", "500");
    until_served(5000);
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
            natsSubscription_Destroy(q[i].sub);
    /* the survivor still serves */
    struct h_result r = ask("after", 42, 0, 64, 2, 10000);
    cr_assert(r.final && r.error_code == 0);
    cr_assert(ne(u64, r.worker_id, victim));
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

static struct h_result raw(const void *data, int len)
{
    struct h_req q;
    cr_assert(h_send_raw(nc, GEN, &q, data, len));
    h_collect(&q, 5000);
    return q.res;
}

/* Wait until a router answers $SRV.PING. */
static void until_router(int timeout_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;
    while (h_now_ms() < end) {
        natsMsg *m = NULL;
        if (natsConnection_RequestString(&m, nc, "$SRV.PING.kvrouter", "", 500) == NATS_OK) {
            natsMsg_Destroy(m);
            return;
        }
        h_sleep_ms(50);
    }
    cr_assert(false, "no router answered $SRV.PING");
}

Test(fleet, bad_input_gets_errors_and_the_router_keeps_serving)
{
    router("r1", "1000");
    until_router(5000);
    struct h_result r = ask("no-workers", 1, 0, 64, 2, 5000);
    cr_assert(r.final);
    cr_assert(eq(u32, r.error_code, KVR_ERR_NO_WORKERS), "no workers: an error at once");
    worker("1", "50", "200");
    until_served(5000);
    uint8_t garbage[64];
    memset(garbage, 0xff, sizeof garbage);
    r = raw(garbage, sizeof garbage);
    cr_assert(r.final && r.error_header);
    cr_assert(eq(u32, r.error_code, KVR_ERR_MALFORMED));
    r = ask("empty", 2, 0, 0, 2, 5000);
    cr_assert(eq(u32, r.error_code, KVR_ERR_EMPTY_PROMPT));
    r = ask("long", 3, 0, 2000, 2, 5000);
    cr_assert(eq(u32, r.error_code, KVR_ERR_PROMPT_TOO_LONG));
    uint8_t buf[512];
    r = raw(buf, with_policy(buf, "nope"));
    cr_assert(eq(u32, r.error_code, KVR_ERR_UNKNOWN_POLICY));
    r = raw(buf, with_policy(buf, "round_robin"));
    cr_assert(eq(u32, r.error_code, 0), "a known policy override is served");
    natsConnection_Publish(nc, "kv.default.ev.1.kv", garbage, sizeof garbage);
    natsConnection_Publish(nc, "kv.default.ev.x.hb", garbage, sizeof garbage);
    natsConnection_Publish(nc, "kv.default.generate", garbage, 10); /* no reply subject */
    r = ask("still", 4, 0, 256, 3, 5000);
    cr_assert(r.final && r.error_code == 0, "the router still serves");
    natsMsg *stats = NULL;
    cr_assert(eq(int, natsConnection_RequestString(&stats, nc, "$SRV.STATS.kvrouter", "", 2000),
                 NATS_OK));
    const char *json = natsMsg_GetData(stats);
    cr_assert(strstr(json, "\"type\":\"io.nats.micro.v1.stats_response\"") != NULL);
    const char *bad = strstr(json, "\"bad_events\":");
    cr_assert(bad && atoi(bad + 13) >= 2, "malformed events were counted: %s", json);
    const char *errs = strstr(json, "\"num_errors\":");
    cr_assert(errs && atoi(errs + 13) >= 5, "refused requests were counted");
    natsMsg_Destroy(stats);
}

Test(fleet, sigterm_loses_no_request)
{
    pid_t r1 = router("r1", NULL);
    router("r2", NULL);
    worker("1", "50", "200");
    worker("2", "50", "200");
    until_served(5000);
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
}

Test(fleet, a_router_restart_is_survived)
{
    pid_t r1 = router("r1", NULL);
    worker("1", "50", "200");
    until_served(5000);
    h_signal(r1, SIGTERM);
    cr_assert(eq(int, h_wait(r1, 10000), 0));
    router("r1b", NULL);
    until_served(5000);
    struct h_result r = ask("after-restart", 9, 0, 256, 5, 5000);
    cr_assert(r.final && r.error_code == 0);
}

Test(fleet, a_nats_server_restart_is_survived)
{
    router("r1", NULL);
    worker("1", "50", "200");
    until_served(5000);
    int port = srv.port;
    natsConnection_Destroy(nc);
    nc = NULL;
    h_nats_stop(&srv);
    h_sleep_ms(500);
    cr_assert(h_nats_start(&srv, port), "nats-server restarted on port %d", port);
    nc = h_connect(srv.url);
    cr_assert(nc != NULL);
    until_served(10000); /* router and worker reconnected and re-subscribed */
    struct h_result r = ask("after-nats", 11, 0, 256, 5, 5000);
    cr_assert(r.final && r.error_code == 0);
}
