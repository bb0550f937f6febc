/*
 * Where a NATS program connects and how it logs: the settings kvrouter, kvworker and kvbench
 * share, with their defaults, their four options (--nats, --namespace, --prefix, --log-level,
 * each also from the environment) and their check. Start-up only.
 */
#ifndef KVR_NATSCFG_H
#define KVR_NATSCFG_H

#include <stddef.h>

#include "kvr/status.h"
#include "log.h"
#include "opts.h"

#define KVR_NATS_TOKEN_MAX                                                                         \
    64 /* bytes of the namespace and of the prefix (one subject token each) */

struct kvr_nats_config {
    char urls[KVR_OPT_STR_MAX];   /* server URLs, comma-separated, preferred first */
    char ns[KVR_OPT_STR_MAX];     /* subject namespace: <prefix>.<ns>.* */
    char prefix[KVR_OPT_STR_MAX]; /* subject prefix ("kv") */
    int log_level;                /* enum kvr_log_level */
};

/* nats://127.0.0.1:4222, namespace "default", prefix "kv", logging from level. */
void kvr_nats_config_default(struct kvr_nats_config *c, enum kvr_log_level level);

#define KVR_NATS_OPTIONS 4
/* The four options over c, into out (KVR_NATS_OPTIONS entries); returns the count. */
size_t kvr_nats_config_options(struct kvr_nats_config *c, struct kvr_opt *out);

/* The namespace and prefix are one subject token each; KVR_ERR_INVALID with why filled. */
kvr_status kvr_nats_config_check(const struct kvr_nats_config *c, char *why, size_t len);

#endif
