/*
 * kvr_standin implementation: the parts started in order (state, engine thread, server) and
 * stopped in reverse, the server first so that no connection holds a request when the state
 * goes.
 */
#include "standin.h"

#include <stdio.h>
#include <stdlib.h>

#include "http.h"
#include "log.h"
#include "state.h"

struct kvr_standin {
    struct kvr_se_config cfg; /* a copy: the parts borrow it */
    struct kvr_se_state st;   /* */
    struct kvr_se_http *http; /* */
};

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
        err = kvr_se_state_init(&s->st, &s->cfg, why, len);
    if (err != KVR_OK) {
        free(s);
        return err;
    }
    err = kvr_se_state_start(&s->st);
    if (err != KVR_OK)
        snprintf(why, len, "cannot start the engine thread");
    else
        err = kvr_se_http_start(&s->st, &s->cfg, &s->http, why, len);
    if (err != KVR_OK) {
        kvr_se_state_free(&s->st);
        free(s);
        return err;
    }
    kvr_log(KVR_LOG_INFO, "http_listening", "addr=%s port=%u", s->cfg.listen,
            (unsigned)kvr_se_http_port(s->http));
    char ep[KVR_KVZMQ_ENDPOINT_MAX], rep[KVR_KVZMQ_ENDPOINT_MAX] = "";
    if (kvr_standin_kv_endpoint(s, false, ep, sizeof ep) == KVR_OK) {
        kvr_standin_kv_endpoint(s, true, rep, sizeof rep);
        kvr_log(KVR_LOG_INFO, "kv_events_listening", "endpoint=%s replay=%s", ep,
                rep[0] ? rep : "none");
    } else {
        kvr_log(KVR_LOG_WARN, "kv_events_off",
                "reason=\"no --kv-events: a router learns nothing of this engine's cache\"");
    }
    *out = s;
    return KVR_OK;
}

uint16_t kvr_standin_port(const struct kvr_standin *s)
{
    return kvr_se_http_port(s->http);
}

kvr_status kvr_standin_kv_endpoint(struct kvr_standin *s, bool replay, char *buf, size_t len)
{
    if (!s->st.pub)
        return KVR_ERR_INVALID;
    return kvr_kvpub_endpoint(s->st.pub, replay, buf, len);
}

uint32_t kvr_standin_drain(struct kvr_standin *s)
{
    return kvr_se_drain(&s->st, s->cfg.drain_timeout_ns);
}

void kvr_standin_destroy(struct kvr_standin *s)
{
    if (!s)
        return;
    kvr_se_http_stop(s->http);
    kvr_se_state_free(&s->st);
    free(s);
}

struct kvr_se_state *kvr_standin_state(struct kvr_standin *s)
{
    return &s->st;
}
