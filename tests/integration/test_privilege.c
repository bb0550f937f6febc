/*
 * Least privilege on a real nats-server over TLS, run on deploy/least-privilege.conf itself (one
 * user per role and instance: client, routers r1 and r2, workers 1 and 2 as w1 and w2, operator
 * ops; docs/security.md has its table), with the test's fresh PKI and passwords given through
 * the environment the file reads. A fleet of 2 routers and 2 workers runs on it and serves (the
 * workers stream to the client's inboxes by response permission alone, select-then-forward
 * too); a client cannot publish worker events, gossip or snapshot requests, nor subscribe the
 * fleet's subjects or another user's inbox; a worker cannot publish another worker's events, nor
 * write into a client's inbox unasked; a router cannot gossip under another's id. Each is refused
 * by the server (the connection's asynchronous error callback gets the Permissions Violation),
 * and the routers' state (digests and counters, asked as the operator) is unchanged. As a
 * control, worker 1's user then forges what it may (worker 1's own cache events), and the state
 * does change: the comparison can see a forgery that gets through.
 */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codec.h"
#include "harness.h"

#define NS   "kv.default."
#define CONF KVR_SOURCE_ROOT "/deploy/least-privilege.conf"

/* The users of deploy/least-privilege.conf; each one's password is in KVR_PW_<NAME>. */
static const char *const USERS[] = {"client", "r1", "r2", "w1", "w2", "ops", "bench"};

/* --- the server --------------------------------------------------------------------------- */

static natsConnection *nc; /* the test's client, user client (the harness's requests) */
static natsConnection *ops;
static struct nats_srv srv;
static char dir[256]; /* the PKI */

static const char *in_dir(const char *file)
{
    static char ring[16][320];
    static int k;
    char *out = ring[k++ % 16];
    snprintf(out, sizeof ring[0], "%s/%s", dir, file);
    return out;
}

static const char *password(const char *user)
{
    static char ring[8][64];
    static int k;
    char *out = ring[k++ % 8];
    snprintf(out, sizeof ring[0], "pw-%s-%d", user, (int)getpid());
    return out;
}

/* KVR_PW_<USER> */
static void password_var(const char *user, char *out, size_t len)
{
    int n = snprintf(out, len, "KVR_PW_%s", user);
    for (int i = 7; i < n && (size_t)i < len; i++)
        out[i] = (char)toupper((unsigned char)out[i]);
}

/*
 * nats-server on deploy/least-privilege.conf: its variables (listen address, TLS files, each
 * user's password) in the environment for it alone; -a/-p (the harness's) override the listen.
 */
static void start_server(void)
{
    char name[32];
    setenv("KVR_LISTEN", "127.0.0.1:-1", 1);
    setenv("KVR_TLS_CERT", in_dir("server.pem"), 1);
    setenv("KVR_TLS_KEY", in_dir("server-key.pem"), 1);
    setenv("KVR_TLS_CA", in_dir("ca.pem"), 1);
    for (size_t i = 0; i < sizeof USERS / sizeof *USERS; i++) {
        password_var(USERS[i], name, sizeof name);
        setenv(name, password(USERS[i]), 1);
    }
    bool up = h_nats_start_conf(&srv, CONF);
    unsetenv("KVR_LISTEN");
    unsetenv("KVR_TLS_CERT");
    unsetenv("KVR_TLS_KEY");
    unsetenv("KVR_TLS_CA");
    for (size_t i = 0; i < sizeof USERS / sizeof *USERS; i++) {
        password_var(USERS[i], name, sizeof name);
        unsetenv(name);
    }
    cr_assert(up, "nats-server did not start with %s", CONF);
}

/* --- connections and the errors the server sends them ------------------------------------- */

/* The asynchronous errors of one connection, as nats.c reports them. */
struct errs {
    pthread_mutex_t mu;
    char text[16384];
    size_t len;
};

static void on_error(natsConnection *c, natsSubscription *sub, natsStatus s, void *closure)
{
    (void)sub;
    struct errs *e = closure;
    const char *text = NULL;
    natsConnection_GetLastError(c, &text);
    pthread_mutex_lock(&e->mu);
    int n = snprintf(e->text + e->len, sizeof e->text - e->len, "%s: %s\n", natsStatus_GetText(s),
                     text ? text : "");
    if (n > 0 && e->len + (size_t)n < sizeof e->text)
        e->len += (size_t)n;
    pthread_mutex_unlock(&e->mu);
}

/* Whether e gets needle within ms. */
static bool got_error(struct errs *e, const char *needle, int ms)
{
    uint64_t end = h_now_ms() + (uint64_t)ms;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        bool found = strstr(e->text, needle) != NULL;
        pthread_mutex_unlock(&e->mu);
        if (found || h_now_ms() >= end)
            return found;
        h_sleep_ms(5);
    }
}

/* A connection of the test as user, over TLS, its inbox prefix _INBOX.<user>, errors into e. */
static natsConnection *connect_as(const char *user, struct errs *e)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "_INBOX.%s", user);
    pthread_mutex_init(&e->mu, NULL);
    e->len = 0;
    e->text[0] = 0;
    struct h_conn c = {.user = user,
                       .password = password(user),
                       .tls_ca = in_dir("ca.pem"),
                       .inbox_prefix = prefix,
                       .on_error = on_error,
                       .closure = e};
    natsConnection *conn = h_connect_with(srv.url, &c);
    cr_assert(conn != NULL, "cannot connect as %s", user);
    return conn;
}

/* The server refuses conn (errors in e) to publish data on subject. */
static void pub_refused(natsConnection *conn, struct errs *e, const char *who, const char *subject,
                        const void *data, int len)
{
    char needle[256];
    snprintf(needle, sizeof needle, "Permissions Violation for Publish to \"%s\"", subject);
    cr_assert(eq(int, natsConnection_Publish(conn, subject, data, len), NATS_OK));
    natsConnection_Flush(conn);
    cr_expect(got_error(e, needle, 2000), "%s may publish on %s (errors: %s)", who, subject,
              e->text);
}

/* The server refuses conn to subscribe to subject; the (dead) subscription, to destroy. */
static natsSubscription *sub_refused(natsConnection *conn, struct errs *e, const char *who,
                                     const char *subject)
{
    char needle[256];
    snprintf(needle, sizeof needle, "Permissions Violation for Subscription to \"%s\"", subject);
    natsSubscription *sub = NULL;
    cr_assert(eq(int, natsConnection_SubscribeSync(&sub, conn, subject), NATS_OK));
    natsConnection_Flush(conn);
    cr_expect(got_error(e, needle, 2000), "%s may subscribe to %s (errors: %s)", who, subject,
              e->text);
    return sub;
}

/* --- the fleet ---------------------------------------------------------------------------- */

static struct errs client_errs, ops_errs;

static void teardown(void)
{
    natsConnection_Destroy(ops);
    ops = NULL;
    h_teardown(&nc);
    h_inbox_prefix(NULL);
    h_rmdir(dir);
    dir[0] = 0;
}

/* Every program's credentials as user, over TLS, with its inbox prefix. */
#define AS(user)                                                                                   \
    "--user", user, "--password", password(user), "--tls-ca", in_dir("ca.pem"), "--inbox-prefix",  \
        "_INBOX." user

/* Both routers' digests, asked as the operator: how many answered synced. */
static int synced_routers(struct h_digest *a)
{
    h_inbox_prefix("_INBOX.ops");
    int n = h_digests(ops, a, H_MAX_ROUTERS, 200), synced = 0;
    h_inbox_prefix("_INBOX.client");
    for (int i = 0; i < n; i++)
        synced += a[i].synced;
    return n == 2 ? synced : 0;
}

/* The server, routers r1 and r2, workers 1 and 2, each as its own user; served, synced. */
static void start_fleet(void)
{
    h_tmpdir(dir, sizeof dir, "priv");
    h_pki(dir);
    start_server();
    nc = connect_as("client", &client_errs);
    ops = connect_as("ops", &ops_errs);
    h_inbox_prefix("_INBOX.client");
    h_worker(srv.url, "1", 10, 200, H_ARGS(AS("w1")));
    h_worker(srv.url, "2", 10, 200, H_ARGS(AS("w2")));
    h_router(srv.url, "r1", H_ARGS(AS("r1")));
    h_router(srv.url, "r2", H_ARGS(AS("r2")));
    struct h_digest a[H_MAX_ROUTERS];
    uint64_t end = h_now_ms() + 20000;
    while (synced_routers(a) != 2 && h_now_ms() < end)
        h_sleep_ms(100);
    cr_assert(eq(int, synced_routers(a), 2), "the two routers never answered the operator synced");
    h_until_served(nc, H_GEN, 0, 20000);
}

/* --- the routers' state ------------------------------------------------------------------- */

/* The digest answer's fields a forged message would move. */
static const char *const DIGEST_KEYS[] = {
    "digest",
    "workers",
    "requests",
    "peers",
    "decided",
    "gossip_bad",
    "gossip_stale",
    "imported",
    "lookups",
    "pages_sent",
    "gaps",
    "snapshots_served",
    "stale_events",
    "resyncs",
    "early_events",
    "conflicts",
    "rebinds_unknown",
    "import_unknown_worker",
};
/* $SRV.STATS generate endpoint's data fields, likewise. */
static const char *const STATS_KEYS[] = {
    "decisions",   "workers_joined",  "workers_left",          "bad_events",
    "cancels_bad", "failed_requests", "unknown_worker_events", "unknown_request_events",
};

/* key's value in o (an integer or a string) appended to out; "-" when it has none. */
static void put_value(char *out, size_t len, json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    size_t used = strlen(out);
    if (json_is_integer(v))
        snprintf(out + used, len - used, " %s=%lld", key, (long long)json_integer_value(v));
    else
        snprintf(out + used, len - used, " %s=%s", key,
                 json_is_string(v) ? json_string_value(v) : "-");
}

/* Every router's $SRV.STATS answer, as the operator: its fields appended to lines[its id's]. */
static void stats_lines(char lines[][2048], const char ids[][64], int n)
{
    natsSubscription *sub = NULL;
    cr_assert(eq(int, natsConnection_SubscribeSync(&sub, ops, "_INBOX.ops.stats"), NATS_OK));
    cr_assert(eq(
        int, natsConnection_PublishRequest(ops, "$SRV.STATS.kvrouter", "_INBOX.ops.stats", "", 0),
        NATS_OK));
    natsMsg *m = NULL;
    int got = 0;
    for (; got < n && natsSubscription_NextMsg(&m, sub, 1000) == NATS_OK; got++) {
        json_t *o = json_loadb(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), 0, NULL);
        natsMsg_Destroy(m);
        const char *id = json_string_value(h_json_at(o, "metadata.router_id"));
        json_t *data = o ? json_object_get(h_endpoint(o, "generate"), "data") : NULL;
        for (int i = 0; id && i < n; i++)
            for (size_t k = 0; !strcmp(ids[i], id) && k < sizeof STATS_KEYS / sizeof *STATS_KEYS;
                 k++)
                put_value(lines[i], sizeof lines[i], data, STATS_KEYS[k]);
        json_decref(o);
    }
    h_sub_close(ops, sub);
    cr_assert(eq(int, got, n), "%d of %d routers answered $SRV.STATS", got, n);
}

/*
 * The routers' state, as the operator asks for it: one line per router (sorted by id) with its
 * digest and the counters of DIGEST_KEYS and STATS_KEYS. Asserts that both answer.
 */
static void fingerprint(char *out, size_t len)
{
    static struct h_digest a[H_MAX_ROUTERS];
    h_inbox_prefix("_INBOX.ops");
    int n = h_digests(ops, a, H_MAX_ROUTERS, 300);
    h_inbox_prefix("_INBOX.client");
    cr_assert(eq(int, n, 2), "%d routers answered the digest request", n);
    if (strcmp(a[0].id, a[1].id) > 0) {
        struct h_digest t = a[0];
        a[0] = a[1];
        a[1] = t;
    }
    char lines[2][2048], ids[2][64];
    for (int i = 0; i < 2; i++) {
        memcpy(ids[i], a[i].id, sizeof ids[i]); /* both 64 bytes, NUL-terminated */
        ids[i][sizeof ids[i] - 1] = 0;
        strcpy(lines[i], ids[i]);
        strcat(lines[i], ":");
        json_t *o = json_loads(a[i].json, 0, NULL);
        for (size_t k = 0; k < sizeof DIGEST_KEYS / sizeof *DIGEST_KEYS; k++)
            put_value(lines[i], sizeof lines[i], o, DIGEST_KEYS[k]);
        json_decref(o);
    }
    stats_lines(lines, (const char(*)[64])ids, 2);
    snprintf(out, len, "%s\n%s\n", lines[0], lines[1]);
}

/* --- forged messages ---------------------------------------------------------------------- */

/* A heartbeat for worker id announcing interval_ms (1: "drop me now"; a new id: a phantom). */
static void forged_heartbeat(struct kvr_buf *b, uint64_t id, uint32_t interval_ms)
{
    struct kvr_wire_heartbeat h = {.info = {.id = id, .block_size = 64, .capacity_blocks = 16384},
                                   .interval_ms = interval_ms,
                                   .instance = 0x5eed,
                                   .started_ns = 1};
    cr_assert(eq(int, kvr_wire_encode_heartbeat(b, &h), KVR_OK));
}

/* A gossip hello under router id with an epoch newer than any real one. */
static void forged_hello(struct kvr_buf *b, const char *id)
{
    cr_assert(eq(int, kvr_wire_encode_gossip_hello(b, id, UINT64_MAX / 2, 1000000, true), KVR_OK));
}

/* What a client might forge: a subject and what to send there. */
struct forgery {
    const char *subject;
    int kind; /* 0: "forged", 1: worker 1's heartbeat (interval 1 ms), 2: r1's hello, 3: a
                 heartbeat of worker 9, nobody's */
};

static const struct forgery CLIENT_FORGERIES[] = {
    {NS "ev.1.tokens", 0},    {NS "ev.1.hb", 1},         {NS "ev.1.kv", 0},
    {NS "ev.1.done", 0},      {NS "ev.9.hb", 3},         {NS "router.gossip.r1", 2},
    {NS "router.sync.r1", 0}, {NS "router.lookup", 0},   {NS "router.pages.r1", 0},
    {NS "router.digest", 0},  {NS "worker.1.cancel", 0}, {NS "worker.1.rebind", 0},
    {NS "worker.1.hello", 0}, {"_INBOX.ops.stolen", 0},  {NS "worker.announce", 0},
};

/* f's bytes into b. */
static void forge(struct kvr_buf *b, const struct forgery *f)
{
    if (f->kind == 1)
        forged_heartbeat(b, 1, 1);
    else if (f->kind == 3)
        forged_heartbeat(b, 9, 60000);
    else if (f->kind == 2)
        forged_hello(b, "r1");
    else
        cr_assert(eq(int, kvr_buf_set(b, "forged", 6), KVR_OK));
}

/* --- the tests ---------------------------------------------------------------------------- */

#define REQUESTS 50

/* REQUESTS requests at once through the routers, as user client: every one gets all its tokens. */
static void fifty_served(void)
{
    static struct h_req q[REQUESTS];
    for (int i = 0; i < REQUESTS; i++) {
        char id[32];
        snprintf(id, sizeof id, "priv-%d", i);
        cr_assert(h_send(nc, H_GEN, &q[i], id, 100 + (uint32_t)i, 64, 256, 16), "send %s", id);
    }
    int ok = 0;
    bool by[3] = {false, false, false};
    for (int i = 0; i < REQUESTS; i++) {
        h_collect(&q[i], 20000);
        ok += q[i].res.final && q[i].res.error_code == 0 && q[i].res.tokens == 16;
        if (q[i].res.worker_id == 1 || q[i].res.worker_id == 2)
            by[q[i].res.worker_id] = true;
    }
    cr_expect(eq(int, ok, REQUESTS), "%d of %d requests got all 16 tokens (client errors: %s)", ok,
              REQUESTS, client_errs.text);
    cr_expect(by[1] && by[2], "both workers streamed to the client (1: %d, 2: %d)", by[1], by[2]);
}

/* Select (booked), then forward to the chosen worker, as a client may: the stream arrives. */
static void select_then_forward(void)
{
    uint32_t t[128];
    for (uint32_t i = 0; i < 128; i++)
        t[i] = 70000 + i;
    struct kvr_buf req = {0}, sel = {0}, fwd = {0};
    cr_assert(eq(int, kvr_wire_encode_generate(&req, "priv-select", t, 128, 4, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_encode_select_request(&sel, req.data, req.len, true), KVR_OK));
    natsMsg *m = NULL;
    cr_assert(
        eq(int, natsConnection_Request(&m, nc, NS "select", sel.data, (int)sel.len, 5000), NATS_OK),
        "no answer to a select");
    uint64_t wid = 0, key = 0;
    uint32_t overlap = 0, ncand = 0, code = 99;
    cr_assert(
        eq(int,
           kvr_wire_decode_select_response(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m),
                                           &wid, &overlap, &ncand, &code, &key),
           KVR_OK));
    natsMsg_Destroy(m);
    cr_assert(code == 0 && key != 0 && (wid == 1 || wid == 2), "select: code %u, worker %llu", code,
              (unsigned long long)wid);
    cr_assert(eq(int,
                 kvr_wire_encode_worker_generate(&fwd, req.data, req.len, key, overlap, NULL, 0),
                 KVR_OK));
    char subject[64];
    snprintf(subject, sizeof subject, NS "worker.%llu.generate", (unsigned long long)wid);
    struct h_result r = h_ask_raw(nc, subject, fwd.data, (int)fwd.len, 10000);
    cr_expect(r.final && r.error_code == 0 && r.tokens == 4,
              "the forwarded request: error %u, %u tokens", r.error_code, r.tokens);
    kvr_buf_free(&req);
    kvr_buf_free(&sel);
    kvr_buf_free(&fwd);
}

/* The workers' $SRV.STATS field (their first endpoint's data), summed, asked as the operator. */
static uint64_t workers_sum(const char *field)
{
    natsSubscription *sub = NULL;
    cr_assert(eq(int, natsConnection_SubscribeSync(&sub, ops, "_INBOX.ops.wstats"), NATS_OK));
    cr_assert(eq(
        int, natsConnection_PublishRequest(ops, "$SRV.STATS.kvworker", "_INBOX.ops.wstats", "", 0),
        NATS_OK));
    uint64_t sum = 0;
    int got = 0;
    natsMsg *m = NULL;
    for (; got < 2 && natsSubscription_NextMsg(&m, sub, 1000) == NATS_OK; got++) {
        json_t *o = json_loadb(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), 0, NULL);
        natsMsg_Destroy(m);
        json_t *v = json_object_get(
            json_object_get(json_array_get(json_object_get(o, "endpoints"), 0), "data"), field);
        bool integer = json_is_integer(v);
        cr_assert(integer, "a worker's $SRV.STATS without data.%s", field);
        sum += (uint64_t)json_integer_value(v);
        json_decref(o);
    }
    h_sub_close(ops, sub);
    cr_assert(eq(int, got, 2), "%d of 2 workers answered $SRV.STATS", got);
    return sum;
}

/*
 * A stream lost whole (nobody subscribed to its inbox yet, as on a cluster node that had not heard
 * of it) comes again on the client's resend: its worker, which may answer clients only by
 * response permission, answers on the grant the router's WorkerRebind carries.
 */
static void lost_stream_repeated(void)
{
    uint32_t t[128];
    for (uint32_t i = 0; i < 128; i++)
        t[i] = 80000 + i;
    struct kvr_buf req = {0};
    cr_assert(eq(int, kvr_wire_encode_generate(&req, "priv-lost", t, 128, 8, NULL), KVR_OK));
    const char *inbox = "_INBOX.client.lost";
    uint64_t served = workers_sum("served");
    cr_assert(
        eq(int, natsConnection_PublishRequest(nc, H_GEN, inbox, req.data, (int)req.len), NATS_OK));
    uint64_t end = h_now_ms() + 10000;
    while (workers_sum("served") == served && h_now_ms() < end)
        h_sleep_ms(100);
    cr_assert(gt(u64, workers_sum("served"), served), "the lost request never ended");
    natsSubscription *sub = NULL;
    cr_assert(eq(int, natsConnection_SubscribeSync(&sub, nc, inbox), NATS_OK));
    natsConnection_Flush(nc);
    cr_assert(
        eq(int, natsConnection_PublishRequest(nc, H_GEN, inbox, req.data, (int)req.len), NATS_OK));
    natsMsg *m = NULL;
    struct kvr_wire_response r = {0};
    bool got = natsSubscription_NextMsg(&m, sub, 5000) == NATS_OK &&
               kvr_wire_decode_response(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), &r) ==
                   KVR_OK;
    natsMsg_Destroy(m);
    cr_expect(got && r.final && r.position == 0 && r.ntokens == 8 && r.error_code == 0,
              "the resend of a stream lost whole did not bring it again (chunk: %d, final %d, "
              "position %u, %u tokens, error %u)",
              got, r.final, r.position, r.ntokens, r.error_code);
    if (got)
        kvr_wire_response_free(&r);
    cr_expect(eq(u64, workers_sum("resend_repeats"), 1));
    h_sub_close(nc, sub);
    kvr_buf_free(&req);
}

Test(privilege, the_fleet_serves_with_least_privilege, .fini = teardown, .timeout = 60)
{
    start_fleet();
    fifty_served();
    select_then_forward();
    lost_stream_repeated();
    /* kvbench as a client: its stream inboxes under --inbox-prefix */
    pid_t b = h_spawn("kvbench",
                      H_ARGS(AS("client"), "--nats", srv.url, "--workers", "2", "--requests", "20",
                             "--policies", "kv", "--concurrency", "4", "--max-tokens", "8",
                             "--linger-ms", "100", "--timeout-ms", "30000", "--log-level", "warn"));
    int st = h_wait(b, 40000);
    bool all = h_log_has(b, "finished=20 failed=0") && h_log_has(b, "missing_tokens=0") &&
               h_log_has(b, "unanswered=0");
    if (st != 0 || !all)
        h_print_tail(b, 20);
    cr_expect(eq(int, st, 0), "kvbench exited %d", st);
    cr_expect(all, "kvbench: not all of 20 requests finished with their tokens");
    /* kvbench as the benchmark user: hop finds a worker by its heartbeats and calls it directly */
    b = h_spawn("kvbench", H_ARGS(AS("bench"), "--nats", srv.url, "--mode", "hop", "--requests",
                                  "50", "--hop-seconds", "1", "--log-level", "warn"));
    st = h_wait(b, 40000);
    if (st != 0)
        h_print_tail(b, 20);
    cr_expect(eq(int, st, 0), "kvbench --mode hop as bench exited %d", st);
    /* the routers replicate (gossip under their own ids) and agree */
    struct h_digest a[H_MAX_ROUTERS];
    h_inbox_prefix("_INBOX.ops");
    cr_expect(ge(i64, h_until_agree(ops, 2, 10000, 100, a), 0), "the routers never agreed");
    h_inbox_prefix("_INBOX.client");
    for (int i = 0; i < 2; i++)
        cr_expect(eq(u64, h_stat(&a[i], "peers_alive"), 1), "router %s hears %llu peers", a[i].id,
                  (unsigned long long)h_stat(&a[i], "peers_alive"));
    /* nobody in the fleet, nor the clients, was refused anything */
    pthread_mutex_lock(&client_errs.mu);
    cr_expect(eq(sz, client_errs.len, 0), "the client was refused something: %s", client_errs.text);
    pthread_mutex_unlock(&client_errs.mu);
    bool refused = h_log_has(srv.pid, "Violation");
    if (refused)
        h_print_tail(srv.pid, 10);
    cr_expect(refused == false, "the server refused someone something (its log above)");
    h_end();
}

/* A client publishes every CLIENT_FORGERY: all refused. */
static void client_publish_refused(void)
{
    struct kvr_buf b = {0};
    for (size_t i = 0; i < sizeof CLIENT_FORGERIES / sizeof *CLIENT_FORGERIES; i++) {
        forge(&b, &CLIENT_FORGERIES[i]);
        pub_refused(nc, &client_errs, "a client", CLIENT_FORGERIES[i].subject, b.data, (int)b.len);
    }
    kvr_buf_free(&b);
}

/*
 * A client subscribes to the fleet's subjects and other users' inboxes: refused, and nothing
 * arrives there while the workers heartbeat (kv.default.ev.N.hb, every 200 ms) and the operator
 * gets answers (_INBOX.ops.*).
 */
static void client_subscribe_refused(void)
{
    const char *subjects[] = {NS ">", NS "ev.>", NS "worker.1.>", "_INBOX.ops.>", "_INBOX.>"};
    natsSubscription *subs[5];
    for (int i = 0; i < 5; i++)
        subs[i] = sub_refused(nc, &client_errs, "a client", subjects[i]);
    static char state[8192];
    fingerprint(state, sizeof state); /* answers on _INBOX.ops.* */
    h_sleep_ms(600);                  /* heartbeats meanwhile */
    for (int i = 0; i < 5; i++) {
        natsMsg *m = NULL;
        cr_expect(ne(int, natsSubscription_NextMsg(&m, subs[i], 1), NATS_OK),
                  "a client's refused subscription to %s got %s", subjects[i],
                  m ? natsMsg_GetSubject(m) : "?");
        natsMsg_Destroy(m);
        natsSubscription_Destroy(subs[i]);
    }
}

/*
 * Worker 1's user cannot speak for worker 2, nor take its requests, nor write into a client's
 * inbox unasked; r2's cannot gossip as r1; the operator's can only ask.
 */
static void impersonation_refused(void)
{
    static struct errs w1_errs, r2_errs;
    natsConnection *w1 = connect_as("w1", &w1_errs), *r2 = connect_as("r2", &r2_errs);
    struct kvr_buf b = {0};
    forged_heartbeat(&b, 2, 1); /* worker 2: "drop me within 20 ms" */
    pub_refused(w1, &w1_errs, "worker 1", NS "ev.2.hb", b.data, (int)b.len);
    pub_refused(w1, &w1_errs, "worker 1", NS "ev.2.kv", "forged", 6);
    pub_refused(w1, &w1_errs, "worker 1", NS "ev.2.tokens", "forged", 6);
    pub_refused(w1, &w1_errs, "worker 1", NS "ev.2.done", "forged", 6);
    pub_refused(w1, &w1_errs, "worker 1", NS "worker.2.hello", "forged", 6);
    pub_refused(w1, &w1_errs, "worker 1", NS "worker.announce", "forged", 6);
    pub_refused(w1, &w1_errs, "worker 1", NS "router.gossip.r1", "forged", 6);
    /* a client's inbox only in answer to a request this connection received */
    pub_refused(w1, &w1_errs, "worker 1", "_INBOX.client.unasked", "forged", 6);
    natsSubscription_Destroy(sub_refused(w1, &w1_errs, "worker 1", NS "worker.2.>"));
    natsSubscription_Destroy(sub_refused(w1, &w1_errs, "worker 1", NS "generate"));
    forged_hello(&b, "r1");
    pub_refused(r2, &r2_errs, "router r2", NS "router.gossip.r1", b.data, (int)b.len);
    pub_refused(ops, &ops_errs, "the operator", NS "router.sync.r1", "forged", 6);
    pub_refused(ops, &ops_errs, "the operator", NS "generate", "forged", 6);
    kvr_buf_free(&b);
    natsConnection_Destroy(w1);
    natsConnection_Destroy(r2);
}

/*
 * The control: worker 1's user forges what it may, worker 1's own cache events (a worker may lie
 * about itself: docs/security.md), and the routers' state does move, so the comparison would see
 * a forgery that got through.
 */
static void own_forgery_counts(const char *before)
{
    static struct errs e;
    natsConnection *w1 = connect_as("w1", &e);
    struct kvr_kv_block blocks[8];
    for (int i = 0; i < 8; i++)
        blocks[i] = (struct kvr_kv_block){.engine_id = 900000 + (uint64_t)i,
                                          .local_hash = 0x5eed0000u + (uint64_t)i};
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_stored(&b, 1, 1000000, NULL, blocks, 8), KVR_OK));
    h_publish(w1, NS "ev.1.kv", &b);
    natsConnection_Flush(w1);
    kvr_buf_free(&b);
    static char after[8192];
    uint64_t end = h_now_ms() + 3000;
    do {
        h_sleep_ms(100);
        fingerprint(after, sizeof after);
    } while (!strcmp(after, before) && h_now_ms() < end);
    fprintf(stderr, "after worker 1's user forged its own cache events:\n%s", after);
    cr_expect(strcmp(after, before) != 0,
              "a forgery that got through changed nothing: the check cannot see one:\n%s", after);
    pthread_mutex_lock(&e.mu);
    cr_expect(eq(sz, e.len, 0), "worker 1's user was refused its own events: %s", e.text);
    pthread_mutex_unlock(&e.mu);
    natsConnection_Destroy(w1);
}

/* Wait until the routers' state holds still (two fingerprints 500 ms apart); into out. */
static void quiet(char *out, size_t len)
{
    static char last[8192];
    last[0] = 0;
    uint64_t end = h_now_ms() + 10000;
    fingerprint(out, len);
    while (strcmp(out, last) != 0 && h_now_ms() < end) {
        snprintf(last, sizeof last, "%s", out);
        h_sleep_ms(500);
        fingerprint(out, len);
    }
    cr_assert(eq(str, out, last), "the routers' state never held still");
}

Test(privilege, forgeries_are_refused, .fini = teardown, .timeout = 60)
{
    start_fleet();
    static char before[8192], after[8192];
    quiet(before, sizeof before);
    client_publish_refused();
    client_subscribe_refused();
    impersonation_refused();
    h_sleep_ms(300); /* what got through (nothing should) has been handled by then */
    fingerprint(after, sizeof after);
    fprintf(stderr, "routers before the forgeries:\n%safter:\n%s", before, after);
    cr_expect(eq(str, before, after), "the routers' state changed");
    own_forgery_counts(after);
    h_end();
}
