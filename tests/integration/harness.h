/*
 * Integration test harness: a real nats-server on 127.0.0.1 (one, or a cluster; ephemeral ports,
 * or a given one for restarts), the real kvrouter/kvworker/kvbench binaries as child processes,
 * and a NATS client that sends GenerateRequests and collects the streamed answers.
 *
 * A test's life:
 *
 *     static void setup(void) { h_setup(&srv, 1, &nc); }        (.init)
 *     static void teardown(void) { h_teardown(&nc); }           (.fini)
 *     Test(...) { ...; h_end(); }                               (the last line of every test)
 *
 * Every process a test starts writes its own log (/tmp/kvr_it_<test pid>_<name>_<n>.log) and is
 * remembered. h_end checks that they stop cleanly: every daemon not killed on purpose (h_signal
 * SIGKILL) gets SIGTERM and must exit 0 within H_STOP_MS (routers drain, workers finish or reach
 * their --drain-timeout-ms), then the nats-servers get SIGTERM and must exit by themselves; a
 * non-zero status or a hang fails the test with the process's name, pid, status and log tail.
 * The check runs in the test body because Criterion 2.4 does not report an assertion that fails
 * in .fini (it prints it and still counts the test as passed). h_teardown (.fini) only cleans up:
 * it kills whatever is left (after a failed test) and says where each process's log is. The logs
 * of a test that passed are removed, unless KVR_IT_KEEP_LOGS is set.
 */
#ifndef KVR_HARNESS_H
#define KVR_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>
#include <nats/nats.h>

#define H_GEN         "kv.default.generate"
#define H_MAX_ROUTERS 16    /* digest answers collected at most */
#define H_STOP_MS     10000 /* every daemon exits within this after SIGTERM at h_end */

/* A NULL-terminated argument list: H_ARGS("--max-prompt-tokens", "1000"). */
#define H_ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* --- NATS servers ------------------------------------------------------------------------- */

struct nats_srv {
    pid_t pid;
    int port;
    char url[128];
    char monitor[128];
    char cluster[128]; /* its cluster listen URL, when clustered */
    char dir[256];     /* its ports file's directory */
};

/* Start nats-server (port 0: ephemeral); waits until it accepts clients. false on failure. */
bool h_nats_start(struct nats_srv *s, int port);
/* Start nats-server with the config file conf (ephemeral ports); false on failure. */
bool h_nats_start_conf(struct nats_srv *s, const char *conf);
/* The same on client port port (0: ephemeral), such as the port of a server stopped before. */
bool h_nats_start_conf_port(struct nats_srv *s, const char *conf, int port);
/*
 * Start a cluster node named name (cluster "kvr", ephemeral cluster port) routing to seed's cluster
 * URL (seed NULL: it is the seed), on client port port (0: ephemeral).
 */
bool h_nats_start_node(struct nats_srv *s, int port, const char *name, const struct nats_srv *seed);
/* Wait until every one of the n nodes has n - 1 routes; false on timeout. */
bool h_cluster_wait(const struct nats_srv *nodes, int n, int timeout_ms);
/* SIGTERM; asserts that it exits by itself within 5 s (nats-server 2.9 exits 1 on SIGTERM). */
void h_nats_stop(struct nats_srv *s);
/*
 * "url,url,...": the client URLs of nodes[0..n-1], nodes[first]'s first (a process prefers it and
 * fails over to the others). In a ring of static buffers: valid for the next 15 calls.
 */
const char *h_urls(const struct nats_srv *nodes, int n, int first);

/* --- a test's life ------------------------------------------------------------------------ */

/*
 * .init: start n NATS servers (n == 1: a lone server; n > 1: a cluster n1..nN seeded by nodes[0],
 * routes formed) and connect *nc to nodes[0]. Asserts.
 */
void h_setup(struct nats_srv *nodes, int n, natsConnection **nc);
/* The last line of every test: stop every process and assert that each stopped cleanly. */
void h_end(void);
/* .fini: close *nc, kill whatever is left, point at the logs when h_end was not reached. */
void h_teardown(natsConnection **nc);

/* --- processes ---------------------------------------------------------------------------- */

/* Start one of our binaries (name: "kvrouter", "kvworker", "kvbench") with args (NULL-terminated).
 */
pid_t h_spawn(const char *name, const char *const *args);
/* kvrouter --nats urls --id id --log-level info, then extra (NULL-terminated, or NULL). */
pid_t h_router(const char *urls, const char *id, const char *const *extra);
/*
 * kvworker --nats urls --id id --speedup speedup --heartbeat-ms heartbeat_ms --drain-timeout-ms
 * 2000 --log-level info, then extra.
 */
pid_t h_worker(const char *urls, const char *id, int speedup, int heartbeat_ms,
               const char *const *extra);
/*
 * Send sig to pid. SIGKILL marks it killed on purpose (never checked); after SIGTERM it must
 * exit 0 (h_wait, or h_end checks it).
 */
void h_signal(pid_t pid, int sig);
/* Wait for pid to exit within ms; returns its exit status (128 + signal when a signal killed it),
 * or -1 on timeout (then it is killed). h_end does not check it again. */
int h_wait(pid_t pid, int ms);
/* Whether pid has exited (then reaped: h_wait returns its status at once). */
bool h_exited(pid_t pid);
/* Print the last lines of pid's log to stderr. */
void h_print_tail(pid_t pid, int lines);

/* --- one request -------------------------------------------------------------------------- */

/* What a request got back. */
struct h_result {
    uint32_t chunks;     /* chunks received */
    uint32_t tokens;     /* tokens received */
    bool final;          /* a final chunk arrived */
    uint32_t error_code; /* its kvr_status */
    bool error_header;   /* it carried Nats-Service-Error-Code */
    uint64_t worker_id;  /* who served it */
    uint64_t first_ms;   /* time to first token */
    uint64_t total_ms;   /* time to the final chunk */
};

/* A client request in flight. */
struct h_req {
    natsConnection *nc; /* the connection it was sent and is read on */
    natsSubscription *sub;
    uint64_t t0;
    struct h_result res;
    char inbox[128];    /* its reply subject */
    uint8_t data[4096]; /* its bytes, for resends (len 0: too large to keep) */
    int len;            /* */
    uint32_t resends;   /* times it was sent again */
    uint32_t extra;     /* chunks that came after the final one */
};

/*
 * Stop a subscription on nc and free it (NULL: nothing): unsubscribed, then a flush, so nc's reader
 * has handled every message of it before it is freed. nats.c 3.4.1's reader looks a message's
 * subscription up and then locks it without holding a reference, so natsSubscription_Destroy alone
 * on a subscription that messages still reach can free it under the reader (seen under ASan on a
 * busy one: a crash in natsConn_processMsg).
 */
void h_sub_close(natsConnection *nc, natsSubscription *sub);

/* Publish a GenerateRequest on subject; collect with h_collect. prompt: n tokens from base. */
bool h_send(natsConnection *nc, const char *subject, struct h_req *q, const char *id, uint32_t base,
            uint32_t shared, uint32_t n, uint32_t max_tokens);
/* Publish raw bytes as a request (for malformed input). */
bool h_send_raw(natsConnection *nc, const char *subject, struct h_req *q, const void *data,
                int len);
/* Read chunks until one names the worker serving q (0: none within timeout_ms). */
uint64_t h_first_worker(struct h_req *q, int timeout_ms);
/* Read chunks until the final one or timeout_ms; returns whether the final chunk arrived. */
bool h_collect(struct h_req *q, int timeout_ms);
/*
 * The same, as a client of a router fleet does: when nothing came for resend_ms, send the same
 * request again (same reply subject and id; routers absorb a resend of what the fleet has in
 * flight), at most max_resends times.
 */
bool h_collect_resend(natsConnection *nc, const char *subject, struct h_req *q, int resend_ms,
                      uint32_t max_resends, int timeout_ms, int linger_ms);
/* h_send (asserted), then h_collect: what came back. */
struct h_result h_ask(natsConnection *nc, const char *subject, const char *id, uint32_t base,
                      uint32_t shared, uint32_t n, uint32_t max_tokens, int timeout_ms);
/* h_send_raw (asserted), then h_collect. */
struct h_result h_ask_raw(natsConnection *nc, const char *subject, const void *data, int len,
                          int timeout_ms);

/* --- waiting for the fleet ---------------------------------------------------------------- */

/*
 * Assert that the fleet serves within timeout_ms: probes (64 tokens, 1 out) until one is served.
 * routers > 0: first until exactly that many routers answer the digest request, all synced (in
 * the request queue group).
 */
void h_until_served(natsConnection *nc, const char *subject, int routers, int timeout_ms);
/* Assert that a router answers $SRV.PING within timeout_ms. */
void h_until_router(natsConnection *nc, int timeout_ms);

/* --- what the routers say ----------------------------------------------------------------- */

/* One router's answer to kv.default.router.digest. */
struct h_digest {
    char id[64];     /* router_id */
    char digest[17]; /* 16 hex digits */
    bool synced;
    char json[4096]; /* the answer */
};

/* Ask every router for its digest; the answers that came within wait_ms (at most max). */
int h_digests(natsConnection *nc, struct h_digest *out, int max, int wait_ms);
/* A counter of a digest answer (a top-level integer: asserted). */
uint64_t h_stat(const struct h_digest *a, const char *key);
/*
 * Poll every every_ms until exactly n routers answer with one digest; the time it took, or -1
 * after timeout_ms (the answers printed). last ([H_MAX_ROUTERS]): the last answers.
 */
int64_t h_until_agree(natsConnection *nc, int n, int timeout_ms, int every_ms,
                      struct h_digest *last);

/* The connection called name in server s's /connz, as JSON to json_decref (NULL: none). */
json_t *h_connz_entry(const struct nats_srv *s, const char *name);

/* One router's $SRV.STATS.kvrouter answer (type checked; asserted), to json_decref. */
json_t *h_stats(natsConnection *nc, int timeout_ms);
/* Its endpoint called name (borrowed; asserted). */
json_t *h_endpoint(json_t *stats, const char *name);
/* The value at a dotted path ("data.replication.gaps") under obj, or NULL. */
json_t *h_json_at(json_t *obj, const char *path);
/* The non-negative integer at path (asserted). */
uint64_t h_json_u64(json_t *obj, const char *path);

/* --- small things ------------------------------------------------------------------------- */

natsConnection *h_connect(const char *url);
struct kvr_buf;
/* Publish b's bytes on subject (asserted). */
void h_publish(natsConnection *nc, const char *subject, const struct kvr_buf *b);
uint64_t h_now_ms(void);
void h_sleep_ms(int ms);
/* GET url (monitoring), into buf; false on failure. */
bool h_http_get(const char *url, char *buf, size_t len);

/* --- TLS, credentials, permissions -------------------------------------------------------- */

/* How a test's own client connects: fields left NULL are not used. */
struct h_conn {
    const char *user, *password;
    const char *nkey_pub, *nkey_seed; /* an nkey user: its public key and its seed file */
    const char *creds;                /* a .creds file (user JWT and seed) */
    const char *tls_ca;               /* TLS: the server's certificate checked against this CA */
    const char *tls_cert, *tls_key;   /* mutual TLS: the client's certificate and key */
    const char *inbox_prefix;         /* the connection's request inboxes (<prefix>.<nuid>...) */
    natsErrHandler on_error;          /* asynchronous errors (permission violations) */
    void *closure;                    /* on_error's */
};

/* Connect to url as c says, else as h_connect does; NULL (the reason printed) on failure. */
natsConnection *h_connect_with(const char *url, const struct h_conn *c);
/*
 * The reply subjects h_send, h_send_raw and h_digests (and what calls them) subscribe to start
 * with prefix (<prefix>.<nuid>); NULL: natsInbox_Create's _INBOX.<nuid>, the default.
 */
void h_inbox_prefix(const char *prefix);
/* A fresh directory /tmp/kvr_it_<test pid>_<what>_XXXXXX into out. Asserts. */
void h_tmpdir(char *out, size_t len, const char *what);
/* Remove dir (one that h_tmpdir made; nothing else) and everything in it. */
void h_rmdir(const char *dir);
/*
 * A fresh test PKI in dir (tests/pki/make-pki.sh): ca.pem, server.pem and server-key.pem (for
 * 127.0.0.1), client.pem and client-key.pem, other-ca.pem. Asserts, with the script's output.
 */
void h_pki(const char *dir);
/*
 * Fresh nkeys, JWTs and .creds files in dir (tests/pki/make-nats-keys.sh, which runs npm ci in
 * tests/js first when its node_modules is missing): user.nk, user.pub, stranger.nk,
 * operator.conf, user.creds, stranger.creds. Asserts, with the script's output.
 */
void h_nats_keys(const char *dir);
/* Whether the log of process pid (one the harness started, a nats-server too) has needle. */
bool h_log_has(pid_t pid, const char *needle);
/* The first line of file path into out (without its newline); false when unreadable. */
bool h_first_line(const char *path, char *out, size_t len);

/* --- the operators' endpoints and other programs ------------------------------------------ */

/*
 * GET url (http://127.0.0.1:PORT/path) over HTTP/1.0, giving up timeout_ms after the call: the
 * status code, or 0 when no complete answer came (refused, reset, or the time ran out). The body
 * (after the headers; cut to len - 1 bytes) into body.
 */
int h_http(const char *url, char *body, size_t len, int timeout_ms);
/*
 * Wait at most timeout_ms for a line of pid's log with msg=<msg>; the value of key=<value> on
 * the first such line into out (quotes kept). false on timeout.
 */
bool h_log_value(pid_t pid, const char *msg, const char *key, char *out, size_t len,
                 int timeout_ms);
/*
 * The port of the HTTP server a daemon started with --metrics-addr HOST:0 (its http_listening
 * line's port=N); asserts that it came within timeout_ms.
 */
int h_http_port(pid_t pid, int timeout_ms);
/* A TCP port that was free on 127.0.0.1 a moment ago. */
int h_free_port(void);
/*
 * Start another program (a path, or a name on PATH) as the harness starts its own, logged as
 * name: h_end sends it SIGTERM and wants exit status 0 (or h_signal and h_wait it earlier).
 */
pid_t h_spawn_prog(const char *prog, const char *name, const char *const *args);

#endif
