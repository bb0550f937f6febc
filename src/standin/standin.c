/*
 * kvr_standin implementation: the parts started in order (state, engine thread, server) and
 * stopped in reverse, the server first so that no connection holds a request when the state
 * goes.
 */
#include "standin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"
#include "log.h"
#include "state.h"

struct kvr_standin {
    struct kvr_se_config cfg;                  /* a copy: the server borrows it */
    struct kvr_se_config rcfg[KVR_SE_DP_MAX];  /* each rank's (its rank, its KV endpoints) */
    struct kvr_se_state st[KVR_SE_DP_MAX];     /* each rank's engine */
    struct kvr_se_state *ranks[KVR_SE_DP_MAX]; /* &st[i] */
    uint32_t nranks;                           /* started */
    struct kvr_se_http *http;                  /* */
};

/* vLLM's endpoint for rank r: a TCP port moved up by r (port 0 stays: ephemeral), anything else
 * suffixed _dp<r> (ipc, inproc). false when it does not fit. */
static bool rank_endpoint(char *ep, size_t len, uint32_t r)
{
    const char *colon = strrchr(ep, ':');
    if (!ep[0] || r == 0)
        return true;
    if (!strncmp(ep, "tcp://", 6) && colon && colon[1]) {
        unsigned long port = strtoul(colon + 1, NULL, 10);
        if (port == 0)
            return true;
        if (port + r > 65535)
            return false;
        size_t at = (size_t)(colon + 1 - ep);
        return (size_t)snprintf(ep + at, len - at, "%lu", port + r) < len - at;
    }
    size_t n = strlen(ep);
    return (size_t)snprintf(ep + n, len - n, "_dp%u", r) < len - n;
}

static void stop_ranks(struct kvr_standin *s)
{
    for (uint32_t i = s->nranks; i-- > 0;)
        kvr_se_state_free(&s->st[i]);
    s->nranks = 0;
}

/* Every rank's state set up and its engine thread started. */
static kvr_status start_ranks(struct kvr_standin *s, char *why, size_t len)
{
    for (uint32_t i = 0; i < s->cfg.dp_size; i++) {
        struct kvr_se_config *rc = &s->rcfg[i];
        *rc = s->cfg;
        rc->dp_rank = i;
        if (!rank_endpoint(rc->kv_events, sizeof rc->kv_events, i) ||
            !rank_endpoint(rc->kv_replay, sizeof rc->kv_replay, i)) {
            snprintf(why, len, "KV events: rank %u's endpoint does not fit", i);
            return KVR_ERR_INVALID;
        }
        kvr_status err = kvr_se_state_init(&s->st[i], rc, why, len);
        if (err != KVR_OK)
            return err;
        s->ranks[s->nranks++] = &s->st[i];
        if (kvr_se_state_start(&s->st[i]) != KVR_OK) {
            snprintf(why, len, "cannot start the engine thread");
            return KVR_ERR_IO;
        }
    }
    return KVR_OK;
}

kvr_status kvr_standin_create(const struct kvr_se_config *cfg, struct kvr_standin **out, char *why,
                              size_t len)
{
    *out = NULL;
    struct kvr_standin *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(why, len, "out of memory");
        return KVR_ERR_NOMEM;
    }
    s->cfg = *cfg;
    kvr_status err = kvr_se_config_check(&s->cfg, why, len);
    if (err == KVR_OK)
        err = start_ranks(s, why, len);
    if (err == KVR_OK)
        err = kvr_se_http_start(s->ranks, s->nranks, &s->cfg, &s->http, why, len);
    if (err != KVR_OK) {
        stop_ranks(s);
        free(s);
        return err;
    }
    kvr_log(KVR_LOG_INFO, "http_listening", "addr=%s port=%u dp_size=%u", s->cfg.listen,
            (unsigned)kvr_se_http_port(s->http), s->nranks);
    char ep[KVR_KVZMQ_ENDPOINT_MAX], rep[KVR_KVZMQ_ENDPOINT_MAX] = "";
    for (uint32_t i = 0; i < s->nranks; i++) {
        if (kvr_standin_kv_endpoint_rank(s, i, false, ep, sizeof ep) != KVR_OK)
            break;
        kvr_standin_kv_endpoint_rank(s, i, true, rep, sizeof rep);
        kvr_log(KVR_LOG_INFO, "kv_events_listening", "endpoint=%s replay=%s dp_rank=%u", ep,
                rep[0] ? rep : "none", i);
    }
    if (!s->st[0].pub)
        kvr_log(KVR_LOG_WARN, "kv_events_off",
                "reason=\"no --kv-events: a router learns nothing of this engine's cache\"");
    *out = s;
    return KVR_OK;
}

uint16_t kvr_standin_port(const struct kvr_standin *s)
{
    return kvr_se_http_port(s->http);
}

kvr_status kvr_standin_kv_endpoint(struct kvr_standin *s, bool replay, char *buf, size_t len)
{
    return kvr_standin_kv_endpoint_rank(s, 0, replay, buf, len);
}

kvr_status kvr_standin_kv_endpoint_rank(struct kvr_standin *s, uint32_t rank, bool replay,
                                        char *buf, size_t len)
{
    if (rank >= s->nranks || !s->st[rank].pub)
        return KVR_ERR_INVALID;
    return kvr_kvpub_endpoint(s->st[rank].pub, replay, buf, len);
}

uint32_t kvr_standin_drain(struct kvr_standin *s)
{
    uint32_t aborted = 0;
    for (uint32_t i = 0; i < s->nranks; i++) /* in turn: each lets its own finish */
        aborted += kvr_se_drain(&s->st[i], s->cfg.drain_timeout_ns);
    return aborted;
}

void kvr_standin_destroy(struct kvr_standin *s)
{
    if (!s)
        return;
    kvr_se_http_stop(s->http);
    stop_ranks(s);
    free(s);
}

struct kvr_se_state *kvr_standin_state(struct kvr_standin *s)
{
    return &s->st[0];
}

struct kvr_se_state *kvr_standin_rank_state(struct kvr_standin *s, uint32_t rank)
{
    return rank < s->nranks ? &s->st[rank] : NULL;
}
