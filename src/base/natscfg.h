/*
 * Where a NATS program connects, as whom, and how it logs: the settings kvrouter, kvworker and
 * kvbench share, with their defaults, their options (--nats, --namespace, --prefix, --log-level,
 * then a group with the credentials, TLS, --connect-timeout-ms and --inbox-prefix; each also from
 * the environment) and their check. Start-up only. kvr_connect (src/net/util.h) takes the whole
 * struct: where, as whom, with what TLS.
 */
#ifndef KVR_NATSCFG_H
#define KVR_NATSCFG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr/status.h"
#include "log.h"
#include "opts.h"

#define KVR_NATS_TOKEN_MAX                                                                         \
    64 /* bytes of the namespace and of the prefix (one subject token each) */

#define KVR_NATS_INBOX_MAX 128 /* bytes of --inbox-prefix */

#define KVR_NATS_CONN_OPTIONS 11 /* the group: credentials, TLS, connect timeout, inbox prefix */

struct kvr_nats_config {
    char urls[KVR_OPT_STR_MAX];   /* server URLs, comma-separated, preferred first */
    char ns[KVR_OPT_STR_MAX];     /* subject namespace: <prefix>.<ns>.* */
    char prefix[KVR_OPT_STR_MAX]; /* subject prefix ("kv") */
    int log_level;                /* enum kvr_log_level */
    /* as whom: at most one of user (+ password), token, nkey seed file, .creds file */
    char user[KVR_OPT_STR_MAX];
    char password[KVR_OPT_STR_MAX];     /* secret: never logged nor printed */
    char token[KVR_OPT_STR_MAX];        /* secret: never logged nor printed */
    char nkey_seed[KVR_OPT_STR_MAX];    /* path of an nkey seed file */
    char creds[KVR_OPT_STR_MAX];        /* path of a .creds file (user JWT and nkey seed) */
    bool tls;                           /* require TLS (implied by the three files below) */
    char tls_ca[KVR_OPT_STR_MAX];       /* CA bundle the server's certificate is checked against */
    char tls_cert[KVR_OPT_STR_MAX];     /* mutual TLS: the client's certificate chain ... */
    char tls_key[KVR_OPT_STR_MAX];      /* ... and its private key */
    uint64_t connect_timeout_ns;        /* the first connect gives up after this (0: never) */
    char inbox_prefix[KVR_OPT_STR_MAX]; /* nats.c's inboxes (and kvbench's streams) under it */
    struct kvr_opt group[KVR_NATS_CONN_OPTIONS]; /* the options over the fields above */
};

/* nats://127.0.0.1:4222, namespace "default", prefix "kv", logging from level, no credentials,
 * no TLS, a 30 s connect timeout. */
void kvr_nats_config_default(struct kvr_nats_config *c, enum kvr_log_level level);

#define KVR_NATS_OPTIONS 5
/* The four options and the group over c, into out (KVR_NATS_OPTIONS entries); returns the count. */
size_t kvr_nats_config_options(struct kvr_nats_config *c, struct kvr_opt *out);

/*
 * --nats names a server, the namespace and prefix are one subject token each, at most one way to
 * authenticate, a password needs a user and a certificate its key; KVR_ERR_INVALID with why
 * filled.
 */
kvr_status kvr_nats_config_check(const struct kvr_nats_config *c, char *why, size_t len);

#endif
