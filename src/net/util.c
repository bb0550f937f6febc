/*
 * Shared daemon plumbing: logs, clock, subjects, NATS connections, service-error replies and the
 * option table.
 */
#define _DEFAULT_SOURCE
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvr_status kvr_nats_status(natsStatus s)
{
    switch (s) {
    case NATS_OK:
        return KVR_OK;
    case NATS_NO_MEMORY:
        return KVR_ERR_NOMEM;
    case NATS_TIMEOUT:
        return KVR_ERR_TIMEOUT;
    case NATS_INVALID_ARG:
    case NATS_INVALID_SUBJECT:
        return KVR_ERR_INVALID;
    case NATS_MAX_PAYLOAD:
        return KVR_ERR_TOO_LARGE;
    default:
        return KVR_ERR_IO;
    }
}

/* The callbacks' closure: the connection's name (kvr_connect), or its kvr_conn_hooks
 * (kvr_connect_hooked, whose name they log). */
static bool log_cut(natsConnection *nc, const char *name)
{
    if (natsConnection_IsClosed(nc))
        return false; /* our own close, not an outage */
    kvr_log(KVR_LOG_WARN, "nats_disconnected", "conn=%s", name);
    return true;
}

static void log_back(natsConnection *nc, const char *name)
{
    char url[256] = "";
    natsConnection_GetConnectedUrl(nc, url, sizeof url);
    kvr_log(KVR_LOG_INFO, "nats_reconnected", "conn=%s url=%s", name, url);
}

static void on_disconnected(natsConnection *nc, void *closure)
{
    log_cut(nc, closure);
}

static void on_reconnected(natsConnection *nc, void *closure)
{
    log_back(nc, closure);
}

static void on_cut_hooked(natsConnection *nc, void *closure)
{
    const struct kvr_conn_hooks *h = closure;
    if (log_cut(nc, h->name) && h->cut)
        h->cut(h->ctx);
}

static void on_back_hooked(natsConnection *nc, void *closure)
{
    const struct kvr_conn_hooks *h = closure;
    log_back(nc, h->name);
    if (h->back)
        h->back(h->ctx);
}

static void on_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *closure)
{
    (void)nc;
    (void)sub;
    kvr_log(KVR_LOG_WARN, "nats_error", "conn=%s error=\"%s\"", (const char *)closure,
            natsStatus_GetText(err));
}

/* The settings every connection gets (NATS-NOTES.md). */
static natsStatus options(natsOptions *o, const char **servers, int n, const char *name,
                          const struct kvr_conn_hooks *h)
{
    natsStatus s = natsOptions_SetServers(o, servers, n);
    if (s == NATS_OK) /* the first URL is the preferred node: operators spread processes */
        s = natsOptions_SetNoRandomize(o, true);
    if (s == NATS_OK)
        s = natsOptions_SetName(o, name);
    if (s == NATS_OK)
        s = natsOptions_SetSendAsap(o, true);
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(o, -1);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(o, 250);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectJitter(o, 100, 1000);
    if (s == NATS_OK)
        s = natsOptions_SetRetryOnFailedConnect(o, true, NULL, NULL);
    if (s == NATS_OK)
        s = natsOptions_SetMaxPendingMsgs(o, 1 << 20);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectBufSize(o, 64 << 20);
    if (s == NATS_OK)
        s = h ? natsOptions_SetDisconnectedCB(o, on_cut_hooked, (void *)h)
              : natsOptions_SetDisconnectedCB(o, on_disconnected, (void *)name);
    if (s == NATS_OK)
        s = h ? natsOptions_SetReconnectedCB(o, on_back_hooked, (void *)h)
              : natsOptions_SetReconnectedCB(o, on_reconnected, (void *)name);
    if (s == NATS_OK)
        s = natsOptions_SetErrorHandler(o, on_error, (void *)name);
    return s;
}

static kvr_status connect(const char *urls, const char *name, const struct kvr_conn_hooks *h,
                          natsConnection **out)
{
    const char *servers[32];
    char copy[2048];
    int nservers = 0;
    if (strlen(urls) >= sizeof copy)
        return KVR_ERR_INVALID;
    strcpy(copy, urls);
    for (char *save = NULL, *t = strtok_r(copy, ",", &save); t && nservers < 32;
         t = strtok_r(NULL, ",", &save))
        servers[nservers++] = t;
    if (!nservers)
        return KVR_ERR_INVALID;
    natsOptions *o = NULL;
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = options(o, servers, nservers, name, h);
    if (s == NATS_OK)
        s = natsConnection_Connect(out, o);
    natsOptions_Destroy(o);
    if (s != NATS_OK) {
        kvr_log(KVR_LOG_ERROR, "nats_connect_failed", "urls=%s error=\"%s\"", urls,
                natsStatus_GetText(s));
        return kvr_nats_status(s);
    }
    return KVR_OK;
}

kvr_status kvr_connect(const char *urls, const char *name, natsConnection **out)
{
    return connect(urls, name, NULL, out);
}

kvr_status kvr_connect_hooked(const char *urls, const struct kvr_conn_hooks *h,
                              natsConnection **out)
{
    return connect(urls, h->name, h, out);
}

kvr_status kvr_publish(natsConnection *nc, const char *subject, const void *data, size_t len,
                       kvr_status err)
{
    if (!subject || !*subject)
        return KVR_ERR_INVALID;
    natsStatus s;
    if (err == KVR_OK) {
        s = natsConnection_Publish(nc, subject, data, (int)len);
    } else {
        natsMsg *m = NULL;
        char code[16];
        snprintf(code, sizeof code, "%d", (int)err);
        s = natsMsg_Create(&m, subject, NULL, data, (int)len);
        if (s == NATS_OK)
            s = natsMsgHeader_Set(m, "Nats-Service-Error", kvr_status_str(err));
        if (s == NATS_OK)
            s = natsMsgHeader_Set(m, "Nats-Service-Error-Code", code);
        if (s == NATS_OK)
            s = natsConnection_PublishMsg(nc, m);
        natsMsg_Destroy(m);
    }
    return kvr_nats_status(s);
}

static kvr_status publish_outmsg(void *ctx, const struct kvr_outmsg *m)
{
    natsConnection *nc = ctx;
    if (m->reply)
        return kvr_nats_status(
            natsConnection_PublishRequest(nc, m->subject, m->reply, m->data, (int)m->len));
    return kvr_publish(nc, m->subject, m->data, m->len, m->err);
}

struct kvr_sink kvr_nats_sink(natsConnection *nc)
{
    return (struct kvr_sink){publish_outmsg, nc};
}

void kvr_net_shutdown(void)
{
    nats_Close();
}
