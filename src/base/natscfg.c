/*
 * The settings every NATS program shares.
 */
#include "natscfg.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "subject.h"

/* The last config whose options were built: the program's own (start-up only). */

void kvr_nats_config_default(struct kvr_nats_config *c, enum kvr_log_level level)
{
    memset(c, 0, sizeof *c);
    strcpy(c->urls, "nats://127.0.0.1:4222");
    strcpy(c->ns, "default");
    strcpy(c->prefix, "kv");
    c->log_level = (int)level;
    c->connect_timeout_ns = 30 * KVR_NS_PER_S;
}

#define FILE_OPT(n, e, p, h)                                                                       \
    {                                                                                              \
        .name = n, .env = e, .type = KVR_OPT_STR, .ptr = p, .help = h                              \
    }

/* Credentials, TLS and the connect timeout: the group of c's options. */
static void group_options(struct kvr_nats_config *c)
{
    const struct kvr_opt t[KVR_NATS_CONN_OPTIONS] = {
        FILE_OPT("user", "KVR_NATS_USER", c->user, "NATS user (with --password)"),
        {.name = "password",
         .env = "KVR_NATS_PASSWORD",
         .type = KVR_OPT_STR,
         .ptr = c->password,
         .help = "NATS password (prefer the environment or a config file to the flag)",
         .secret = true},
        {.name = "token",
         .env = "KVR_NATS_TOKEN",
         .type = KVR_OPT_STR,
         .ptr = c->token,
         .help = "NATS authentication token",
         .secret = true},
        FILE_OPT("nkey-seed", "KVR_NATS_NKEY_SEED", c->nkey_seed, "nkey seed file"),
        FILE_OPT("creds", "KVR_NATS_CREDS", c->creds, ".creds file (user JWT and nkey seed)"),
        {.name = "tls",
         .env = "KVR_NATS_TLS",
         .type = KVR_OPT_BOOL,
         .ptr = &c->tls,
         .help = "require TLS (implied by --tls-ca, --tls-cert, --tls-key)"},
        FILE_OPT("tls-ca", "KVR_NATS_TLS_CA", c->tls_ca, "CA file the server is checked against"),
        FILE_OPT("tls-cert", "KVR_NATS_TLS_CERT", c->tls_cert,
                 "client certificate file (mutual TLS, with --tls-key)"),
        FILE_OPT("tls-key", "KVR_NATS_TLS_KEY", c->tls_key, "client private key file"),
        {.name = "connect-timeout-ms",
         .env = "KVR_CONNECT_TIMEOUT_MS",
         .type = KVR_OPT_MS,
         .ptr = &c->connect_timeout_ns,
         .help = "exit when the first connect has not succeeded by then (0: retry forever)",
         .min = 0,
         .max = 8.64e7},
        {.name = "inbox-prefix",
         .env = "KVR_NATS_INBOX_PREFIX",
         .type = KVR_OPT_STR,
         .ptr = c->inbox_prefix,
         .help = "reply subjects start with it (subscribe permissions: <prefix>.>)"},
    };
    memcpy(c->group, t, sizeof t);
}

size_t kvr_nats_config_options(struct kvr_nats_config *c, struct kvr_opt *out)
{
    group_options(c);
    const struct kvr_opt t[KVR_NATS_OPTIONS] = {
        {.name = "nats",
         .env = "KVR_NATS",
         .type = KVR_OPT_STR,
         .ptr = c->urls,
         .help = "NATS server URLs, comma-separated",
         .urls = true,
         .min = 1,
         .max = KVR_OPT_STR_MAX - 1},
        {.name = "namespace",
         .env = "KVR_NAMESPACE",
         .type = KVR_OPT_STR,
         .ptr = c->ns,
         .help = "subject namespace"},
        {.name = "prefix",
         .env = "KVR_PREFIX",
         .type = KVR_OPT_STR,
         .ptr = c->prefix,
         .help = "subject prefix"},
        {.name = "log-level",
         .env = "KVR_LOG_LEVEL",
         .type = KVR_OPT_ENUM,
         .ptr = &c->log_level,
         .help = "least severe level logged",
         .choices = kvr_log_level_names},
        {.name = "connection",
         .type = KVR_OPT_GROUP,
         .ptr = c->group,
         .help = "credentials, TLS, connect timeout",
         .nsub = KVR_NATS_CONN_OPTIONS},
    };
    memcpy(out, t, sizeof t);
    return KVR_NATS_OPTIONS;
}

/* Authentication and TLS settings that cannot go together; NULL when they can. */
static const char *credentials_clash(const struct kvr_nats_config *c)
{
    int ways = !!c->user[0] + !!c->token[0] + !!c->nkey_seed[0] + !!c->creds[0];
    if (ways > 1)
        return "give one of --user, --token, --nkey-seed and --creds, not several";
    if (c->password[0] && !c->user[0])
        return "--password needs --user";
    if (!c->tls_cert[0] != !c->tls_key[0])
        return "--tls-cert and --tls-key go together (mutual TLS)";
    return NULL;
}

kvr_status kvr_nats_config_check(const struct kvr_nats_config *c, char *why, size_t len)
{
    const char *clash = credentials_clash(c);
    if (!c->urls[strspn(c->urls, " ,")]) {
        snprintf(why, len, "--nats is empty: give at least one server URL (nats://host:port)");
        return KVR_ERR_INVALID;
    }
    if (clash) {
        snprintf(why, len, "%s", clash);
        return KVR_ERR_INVALID;
    }
    if (c->inbox_prefix[0] && !kvr_subject_ok(c->inbox_prefix, KVR_NATS_INBOX_MAX)) {
        snprintf(why, len, "--inbox-prefix must be a subject without wildcards (%d bytes at most)",
                 KVR_NATS_INBOX_MAX);
        return KVR_ERR_INVALID;
    }
    if (kvr_token_ok(c->ns, KVR_NATS_TOKEN_MAX) && kvr_token_ok(c->prefix, KVR_NATS_TOKEN_MAX))
        return KVR_OK;
    snprintf(why, len, "--namespace and --prefix must be one subject token each (%d bytes at most)",
             KVR_NATS_TOKEN_MAX);
    return KVR_ERR_INVALID;
}
