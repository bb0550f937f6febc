/*
 * Credentials and TLS against a real nats-server that requires them: a router and a worker given
 * the right user and password (or token, nkey seed file, .creds file in operator mode) serve a
 * request, over TLS (the server's certificate checked against --tls-ca) and mutual TLS
 * (--tls-cert/--tls-key) too; a router given a wrong password (an unknown nkey or account, no
 * client certificate, the wrong CA) exits non-zero within its --connect-timeout-ms, with the
 * reason in its log and no secret in it. The PKI, nkeys and JWTs are made at test time
 * (tests/pki/), so nothing committed expires.
 */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static natsConnection *nc;
static struct nats_srv srv;

static char dir[256]; /* the test's PKI, keys and config, removed at its end */

static void teardown(void)
{
    h_teardown(&nc);
    h_rmdir(dir);
    dir[0] = 0;
}

/* Start the server srv on port (0: ephemeral) with auth as its config's authorization block. */
static void start_auth(const char *auth, int port)
{
    char conf[256];
    snprintf(conf, sizeof conf, "/tmp/kvr_it_%d_secure.conf", (int)getpid());
    FILE *f = fopen(conf, "w");
    cr_assert(f != NULL, "cannot write %s", conf);
    fprintf(f, "max_payload: 8MB\nauthorization { %s }\n", auth);
    fclose(f);
    cr_assert(h_nats_start_conf_port(&srv, conf, port), "nats-server did not start with %s", conf);
}

/* A server whose config is auth (an authorization block), connected to as the client url. */
static void start(const char *auth, const char *client_auth)
{
    char url[256];
    start_auth(auth, 0);
    snprintf(url, sizeof url, "nats://%s@127.0.0.1:%d", client_auth, srv.port);
    nc = h_connect(url);
    cr_assert(nc != NULL, "cannot connect with the right credentials");
}

/* The text of the log of our n-th process called name. */
static bool log_has(const char *name, int n, const char *needle)
{
    char path[256], buf[16384];
    snprintf(path, sizeof path, "/tmp/kvr_it_%d_%s_%d.log", (int)getpid(), name, n);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    return strstr(buf, needle) != NULL;
}

Test(secure, user_password, .fini = teardown, .timeout = 120)
{
    start("user: kvr, password: \"pw-7f3\"", "kvr:pw-7f3");
    const char *const *creds = H_ARGS("--user", "kvr", "--password", "pw-7f3");
    h_worker(srv.url, "1", 10, 200, creds);
    h_router(srv.url, "r1", creds);
    h_until_served(nc, H_GEN, 1, 20000);
    struct h_result r = h_ask(nc, H_GEN, "secure-1", 1, 0, 200, 8, 10000);
    cr_expect(r.final && r.error_code == 0, "request not served (error %u)", r.error_code);
    h_end();
}

Test(secure, token, .fini = teardown, .timeout = 120)
{
    start("token: \"tok-91ac\"", "tok-91ac");
    setenv("KVR_NATS_TOKEN", "tok-91ac", 1); /* from the environment, as a deployment would */
    h_worker(srv.url, "1", 10, 200, NULL);
    h_router(srv.url, "r1", NULL);
    unsetenv("KVR_NATS_TOKEN");
    h_until_served(nc, H_GEN, 1, 20000);
    h_end();
}

Test(secure, wrong_password_exits, .fini = teardown, .timeout = 120)
{
    start("user: kvr, password: \"pw-7f3\"", "kvr:pw-7f3");
    uint64_t t0 = h_now_ms();
    pid_t r =
        h_router(srv.url, "r1",
                 H_ARGS("--user", "kvr", "--password", "wrong-pw", "--connect-timeout-ms", "1500"));
    int status = h_wait(r, 10000);
    uint64_t took = h_now_ms() - t0;
    cr_expect(status > 0 && status < 128, "a router with a wrong password: status %d", status);
    cr_expect(took < 6000, "it took %llu ms to give up", (unsigned long long)took);
    cr_expect(log_has("kvrouter", 1, "Authorization"), "no authorization error in its log");
    cr_expect(log_has("kvrouter", 1, "nats_connect_failed"), "no nats_connect_failed in its log");
    cr_expect(log_has("kvrouter", 1, "wrong-pw") == false, "the password is in its log");
    if (status <= 0)
        h_print_tail(r, 10);
    h_end();
}

/*
 * The server comes back with the user's password changed: nats.c closes a connection for good
 * when a server refuses two reconnects in a row, so the router and the worker, which would sit
 * there unconnected forever, stop with exit status 1 and nats_connection_lost in their log (a
 * supervisor starts them again, with the new password).
 */
Test(secure, credentials_refused_on_reconnect_stop_the_daemons, .fini = teardown, .timeout = 120)
{
    start("user: kvr, password: \"pw-7f3\"", "kvr:pw-7f3");
    const char *const *creds = H_ARGS("--user", "kvr", "--password", "pw-7f3");
    pid_t w = h_worker(srv.url, "1", 10, 200, creds);
    pid_t r = h_router(srv.url, "r1", creds);
    h_until_served(nc, H_GEN, 1, 20000);
    int port = srv.port;
    h_nats_stop(&srv);
    start_auth("user: kvr, password: \"pw-new\"", port);
    int rs = h_wait(r, 15000), ws = h_wait(w, 15000);
    if (rs != 1)
        h_print_tail(r, 10);
    if (ws != 1)
        h_print_tail(w, 10);
    cr_expect(rs == 1, "the router: status %d, not 1", rs);
    cr_expect(ws == 1, "the worker: status %d, not 1", ws);
    cr_expect(h_log_has(r, "nats_connection_lost"), "no nats_connection_lost in the router's log");
    cr_expect(h_log_has(w, "nats_connection_lost"), "no nats_connection_lost in the worker's log");
    cr_expect(log_has("kvrouter", 1, "pw-7f3") == false, "the password is in its log");
    h_end();
}

/* --- TLS, nkeys, .creds ------------------------------------------------------------------- */

#define CONNECT_TIMEOUT "1500"
#define GIVE_UP_MS      6000 /* a refused program has exited by then (1.5 s, and slack) */

/* dir/file, in a ring of static buffers (valid for the next 15 calls). */
static const char *in_dir(const char *file)
{
    static char ring[16][320];
    static int k;
    char *out = ring[k++ % 16];
    snprintf(out, sizeof ring[0], "%s/%s", dir, file);
    return out;
}

/* Start a server whose config (dir/nats.conf) is max_payload and body. */
static void start_conf(const char *body)
{
    const char *conf = in_dir("nats.conf");
    FILE *f = fopen(conf, "w");
    cr_assert(f != NULL, "cannot write %s", conf);
    fprintf(f, "max_payload: 8MB\n%s\n", body);
    fclose(f);
    cr_assert(h_nats_start_conf(&srv, conf), "nats-server did not start with %s", conf);
}

/*
 * nats://127.0.0.1:<port>: the ports file says tls:// for a TLS server, which would make TLS
 * implicit; the programs are given nats:// so that their own flags must ask for it.
 */
static const char *url(void)
{
    static char u[64];
    snprintf(u, sizeof u, "nats://127.0.0.1:%d", srv.port);
    return u;
}

/* A TLS-only server with a fresh PKI (verify: client certificates required too); nc over TLS. */
static void start_tls(bool verify)
{
    h_tmpdir(dir, sizeof dir, "pki");
    h_pki(dir);
    char body[1536];
    snprintf(body, sizeof body,
             "tls {\n  cert_file: \"%s\"\n  key_file: \"%s\"\n  ca_file: \"%s\"\n  verify: %s\n"
             "  timeout: 2\n}\n",
             in_dir("server.pem"), in_dir("server-key.pem"), in_dir("ca.pem"),
             verify ? "true" : "false");
    start_conf(body);
    struct h_conn c = {.tls_ca = in_dir("ca.pem")};
    if (verify) {
        c.tls_cert = in_dir("client.pem");
        c.tls_key = in_dir("client-key.pem");
    }
    nc = h_connect_with(url(), &c);
    cr_assert(nc != NULL, "the test's client cannot connect over TLS");
}

/* Router r1 given args, with the worker already started, serves a request. Its pid. */
static pid_t served(const char *const *router_args)
{
    pid_t r = h_router(url(), "r1", router_args);
    h_until_served(nc, H_GEN, 1, 20000);
    struct h_result res = h_ask(nc, H_GEN, "secure-2", 2, 0, 200, 8, 10000);
    cr_expect(res.final && res.error_code == 0 && res.tokens == 8,
              "not served (error %u, %u tokens)", res.error_code, res.tokens);
    return r;
}

/* Worker 1 with env's variables (name, value, ... NULL) set for it alone. Its pid. */
static pid_t worker_env(const char *const *env)
{
    for (int i = 0; env[i]; i += 2)
        setenv(env[i], env[i + 1], 1);
    pid_t w = h_worker(url(), "1", 10, 200, NULL);
    for (int i = 0; env[i]; i += 2)
        unsetenv(env[i]);
    return w;
}

/*
 * A router given args is refused: it exits non-zero within GIVE_UP_MS with nats_connect_failed
 * and why (NULL: not checked) in its log. Its pid.
 */
static pid_t refused(const char *id, const char *const *args, const char *why)
{
    const char *all[32] = {"--connect-timeout-ms", CONNECT_TIMEOUT};
    int n = 2;
    for (int i = 0; args[i] && n < 31; i++)
        all[n++] = args[i];
    all[n] = NULL;
    uint64_t t0 = h_now_ms();
    pid_t r = h_router(url(), id, all);
    int status = h_wait(r, 3 * GIVE_UP_MS);
    uint64_t took = h_now_ms() - t0;
    bool ok = status > 0 && status < 128 && h_log_has(r, "nats_connect_failed") &&
              (!why || h_log_has(r, why));
    if (!ok)
        h_print_tail(r, 10);
    cr_expect(status > 0 && status < 128, "router %s: status %d", id, status);
    cr_expect(took < GIVE_UP_MS, "router %s took %llu ms to give up", id, (unsigned long long)took);
    cr_expect(h_log_has(r, "nats_connect_failed"), "router %s: no nats_connect_failed", id);
    if (why)
        cr_expect(h_log_has(r, why), "router %s: no \"%s\" in its log", id, why);
    return r;
}

Test(secure, tls_with_ca, .fini = teardown, .timeout = 60)
{
    start_tls(false);
    h_worker(url(), "1", 10, 200, H_ARGS("--tls-ca", in_dir("ca.pem")));
    served(H_ARGS("--tls-ca", in_dir("ca.pem")));
    json_t *c = h_connz_entry(&srv, "kvrouter-r1");
    const char *v = json_string_value(json_object_get(c, "tls_version"));
    cr_expect(v && v[0], "the router's connection is not TLS in /connz");
    json_decref(c);
    refused("r2", H_ARGS("--tls-ca", in_dir("other-ca.pem")), "SSL handshake error");
    h_end();
}

Test(secure, mutual_tls, .fini = teardown, .timeout = 60)
{
    start_tls(true);
    worker_env(H_ARGS("KVR_NATS_TLS_CA", in_dir("ca.pem"), "KVR_NATS_TLS_CERT",
                      in_dir("client.pem"), "KVR_NATS_TLS_KEY", in_dir("client-key.pem")));
    served(H_ARGS("--tls-ca", in_dir("ca.pem"), "--tls-cert", in_dir("client.pem"), "--tls-key",
                  in_dir("client-key.pem")));
    /*
     * Without a client certificate: TLS 1.3 ends the handshake on the client's side before the
     * server checks the certificate, so nats.c 3.4.1 only sees the connection close ("Expected
     * 'PONG', got ''"): the router's log adds the hint, the server's log has the reason.
     */
    refused("r2", H_ARGS("--tls-ca", in_dir("ca.pem")), "may require a client certificate");
    cr_expect(h_log_has(srv.pid, "client didn't provide a certificate"),
              "the server did not refuse for want of a client certificate");
    refused("r3",
            H_ARGS("--tls-ca", in_dir("other-ca.pem"), "--tls-cert", in_dir("client.pem"),
                   "--tls-key", in_dir("client-key.pem")),
            "SSL handshake error");
    h_end();
}

Test(secure, nkey_seed_file, .fini = teardown, .timeout = 60)
{
    h_tmpdir(dir, sizeof dir, "keys");
    h_nats_keys(dir);
    char pub[128], seed[128], body[256];
    cr_assert(h_first_line(in_dir("user.pub"), pub, sizeof pub), "no user.pub");
    cr_assert(h_first_line(in_dir("user.nk"), seed, sizeof seed), "no user.nk");
    snprintf(body, sizeof body, "authorization { users = [ { nkey: %s } ] }", pub);
    start_conf(body);
    nc = h_connect_with(url(), &(struct h_conn){.nkey_pub = pub, .nkey_seed = in_dir("user.nk")});
    cr_assert(nc != NULL, "the test's client cannot connect with the nkey");
    pid_t w = worker_env(H_ARGS("KVR_NATS_NKEY_SEED", in_dir("user.nk")));
    pid_t r = served(H_ARGS("--nkey-seed", in_dir("user.nk")));
    pid_t r2 =
        refused("r2", H_ARGS("--nkey-seed", in_dir("stranger.nk")), "Authorization Violation");
    bool leaked = h_log_has(w, seed) || h_log_has(r, seed) || h_log_has(r2, seed);
    cr_expect(leaked == false, "an nkey seed is in a log");
    h_end();
}

/* Operator mode: the operator JWT, a memory resolver, the account JWT preloaded. */
Test(secure, creds_file, .fini = teardown, .timeout = 60)
{
    h_tmpdir(dir, sizeof dir, "keys");
    h_nats_keys(dir);
    start_conf("include \"operator.conf\"\n");
    nc = h_connect_with(url(), &(struct h_conn){.creds = in_dir("user.creds")});
    cr_assert(nc != NULL, "the test's client cannot connect with user.creds");
    pid_t w = worker_env(H_ARGS("KVR_NATS_CREDS", in_dir("user.creds")));
    pid_t r = served(H_ARGS("--creds", in_dir("user.creds")));
    pid_t r2 =
        refused("r2", H_ARGS("--creds", in_dir("stranger.creds")), "Authorization Violation");
    char line[256], seed[128] = "";
    FILE *f = fopen(in_dir("user.creds"), "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "SU", 2))
            snprintf(seed, sizeof seed, "%.*s", (int)strcspn(line, "\r\n"), line);
    if (f)
        fclose(f);
    cr_assert(strlen(seed) > 0, "no seed line in %s", in_dir("user.creds"));
    bool leaked = h_log_has(w, seed) || h_log_has(r, seed) || h_log_has(r2, seed);
    cr_expect(leaked == false, "a .creds file's seed is in a log");
    h_end();
}
