/*
 * The settings every NATS program shares.
 */
#include "natscfg.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "subject.h"

void kvr_nats_config_default(struct kvr_nats_config *c, enum kvr_log_level level)
{
    memset(c, 0, sizeof *c);
    strcpy(c->urls, "nats://127.0.0.1:4222");
    strcpy(c->ns, "default");
    strcpy(c->prefix, "kv");
    c->log_level = (int)level;
}

size_t kvr_nats_config_options(struct kvr_nats_config *c, struct kvr_opt *out)
{
    const struct kvr_opt t[KVR_NATS_OPTIONS] = {
        {.name = "nats",
         .env = "KVR_NATS",
         .type = KVR_OPT_STR,
         .ptr = c->urls,
         .help = "NATS server URLs, comma-separated"},
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
    };
    memcpy(out, t, sizeof t);
    return KVR_NATS_OPTIONS;
}

kvr_status kvr_nats_config_check(const struct kvr_nats_config *c, char *why, size_t len)
{
    if (kvr_token_ok(c->ns, KVR_NATS_TOKEN_MAX) && kvr_token_ok(c->prefix, KVR_NATS_TOKEN_MAX))
        return KVR_OK;
    snprintf(why, len, "--namespace and --prefix must be one subject token each (%d bytes at most)",
             KVR_NATS_TOKEN_MAX);
    return KVR_ERR_INVALID;
}
