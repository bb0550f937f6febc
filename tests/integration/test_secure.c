/*
 * Credentials against a real nats-server that requires them: a router and a worker given the
 * right user and password (or token) serve a request; a router given a wrong password exits
 * non-zero within its --connect-timeout-ms, with the server's authorization error in its log and
 * the password nowhere in it.
 */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static natsConnection *nc;
static struct nats_srv srv;

static void teardown(void)
{
    h_teardown(&nc);
}

/* A server whose config is auth (an authorization block), connected to as the client url. */
static void start(const char *auth, const char *client_auth)
{
    char conf[256], url[256];
    snprintf(conf, sizeof conf, "/tmp/kvr_it_%d_secure.conf", (int)getpid());
    FILE *f = fopen(conf, "w");
    cr_assert(f != NULL, "cannot write %s", conf);
    fprintf(f, "max_payload: 8MB\nauthorization { %s }\n", auth);
    fclose(f);
    cr_assert(h_nats_start_conf(&srv, conf), "nats-server did not start with %s", conf);
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
