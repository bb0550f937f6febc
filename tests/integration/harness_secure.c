/*
 * The integration harness's part for TLS, credentials and permissions: connections with them,
 * scratch directories, the PKI and NATS keys made at test time (tests/pki), a file's first line.
 */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

/* --- connections -------------------------------------------------------- */

/* c's credentials, TLS and inbox prefix on o. */
static natsStatus secure_opts(natsOptions *o, const struct h_conn *c)
{
    natsStatus s = NATS_OK;
    if (c->user)
        s = natsOptions_SetUserInfo(o, c->user, c->password);
    if (s == NATS_OK && c->nkey_pub)
        s = natsOptions_SetNKeyFromSeed(o, c->nkey_pub, c->nkey_seed);
    if (s == NATS_OK && c->creds)
        s = natsOptions_SetUserCredentialsFromFiles(o, c->creds, NULL);
    if (s == NATS_OK && c->tls_ca)
        s = natsOptions_SetSecure(o, true);
    if (s == NATS_OK && c->tls_ca)
        s = natsOptions_LoadCATrustedCertificates(o, c->tls_ca);
    if (s == NATS_OK && c->tls_cert)
        s = natsOptions_LoadCertificatesChain(o, c->tls_cert, c->tls_key);
    if (s == NATS_OK && c->inbox_prefix)
        s = natsOptions_SetCustomInboxPrefix(o, c->inbox_prefix);
    if (s == NATS_OK && c->on_error)
        s = natsOptions_SetErrorHandler(o, c->on_error, c->closure);
    return s;
}

natsConnection *h_connect_with(const char *url, const struct h_conn *c)
{
    natsConnection *nc = NULL;
    natsOptions *o = NULL;
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = natsOptions_SetURL(o, url);
    if (s == NATS_OK)
        s = natsOptions_SetSendAsap(o, true);
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(o, -1);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(o, 100);
    if (s == NATS_OK)
        s = secure_opts(o, c);
    /* nats.c 3.4.1 leaves the signature out of CONNECT when its first byte is 0 (1 in 256
     * nonces, fixed in nats.c 3.8: nats-io/nats.c#705), and the server refuses that connect: a
     * client that signs (nkey or creds) is refused at random. A new connect signs a new nonce,
     * so it is tried up to 4 times; a client the server really refuses is refused each time. */
    bool signs = c->nkey_pub || c->creds;
    for (int attempt = 1; s == NATS_OK; attempt++) {
        s = natsConnection_Connect(&nc, o);
        if (s == NATS_CONNECTION_AUTH_FAILED && signs && attempt < 4)
            s = NATS_OK; /* sign a new nonce */
        else
            break;
    }
    if (s != NATS_OK) {
        natsStatus dummy;
        fprintf(stderr, "cannot connect to %s: %s (%s)\n", url, natsStatus_GetText(s),
                nats_GetLastError(&dummy));
        nc = NULL;
    }
    natsOptions_Destroy(o);
    return nc;
}

void h_tmpdir(char *out, size_t len, const char *what)
{
    int n = snprintf(out, len, "/tmp/kvr_it_%d_%s_XXXXXX", (int)getpid(), what);
    cr_assert(n > 0 && (size_t)n < len && mkdtemp(out) != NULL, "cannot make a directory %s", out);
}

void h_rmdir(const char *dir)
{
    char cmd[600];
    if (!dir[0] || strncmp(dir, "/tmp/kvr_it_", 12) != 0 || strstr(dir, ".."))
        return; /* only what h_tmpdir made */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

/* Run `bash tests/pki/<script> dir`; asserts that it exits 0, with its output on failure. */
static void run_pki_script(const char *script, const char *dir)
{
    char cmd[1200], out[8192] = "";
    snprintf(cmd, sizeof cmd, "bash '%s/tests/pki/%s' '%s' 2>&1", KVR_SOURCE_ROOT, script, dir);
    FILE *p = popen(cmd, "r");
    cr_assert(p != NULL, "cannot run %s", cmd);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    cr_assert(st == 0, "%s failed (status %d), a prerequisite of this test:\n%s", cmd, st, out);
}

void h_pki(const char *dir)
{
    run_pki_script("make-pki.sh", dir);
}

void h_nats_keys(const char *dir)
{
    run_pki_script("make-nats-keys.sh", dir);
}

bool h_first_line(const char *path, char *out, size_t len)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool ok = fgets(out, (int)len, f) != NULL;
    fclose(f);
    if (ok)
        out[strcspn(out, "\r\n")] = 0;
    return ok;
}
