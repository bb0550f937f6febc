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

#include "loop.h"
#include "natscfg.h"
#include "signals.h"

#define RETRY_NS (250 * KVR_NS_PER_MS) /* between two failed first connects */

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
    char url[256] = "", shown[300];
    natsConnection_GetConnectedUrl(nc, url, sizeof url);
    kvr_url_redact(url, shown, sizeof shown);
    kvr_log(KVR_LOG_INFO, "nats_reconnected", "conn=%s url=%s", name, shown);
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

/*
 * An nkey seed file: nats.c needs the public key beside the seed, and cannot derive it, so the
 * file holds both (what `nk -gen user -pubout` writes: the seed line, then the U... line).
 */
static natsStatus nkey_from_file(natsOptions *o, const char *path)
{
    char line[256], pub[128] = "";
    FILE *f = fopen(path, "r");
    if (!f) {
        kvr_log(KVR_LOG_ERROR, "nkey_seed_unreadable", "file=%s error=\"%s\"", path,
                strerror(errno));
        return NATS_INVALID_ARG;
    }
    while (!pub[0] && fgets(line, sizeof line, f)) {
        line[strcspn(line, " \t\r\n")] = 0;
        if (line[0] == 'U' && strlen(line) == 56)
            snprintf(pub, sizeof pub, "%s", line);
    }
    fclose(f);
    if (!pub[0]) {
        kvr_log(KVR_LOG_ERROR, "nkey_seed_unreadable", "file=%s error=\"no public key line\"",
                path);
        return NATS_INVALID_ARG;
    }
    return natsOptions_SetNKeyFromSeed(o, pub, path);
}

/* Credentials, TLS and the inbox prefix from c (NULL: none). */
static natsStatus secure(natsOptions *o, const struct kvr_nats_config *c)
{
    natsStatus s = NATS_OK;
    if (!c)
        return s;
    if (c->user[0])
        s = natsOptions_SetUserInfo(o, c->user, c->password[0] ? c->password : NULL);
    if (s == NATS_OK && c->token[0])
        s = natsOptions_SetToken(o, c->token);
    if (s == NATS_OK && c->nkey_seed[0])
        s = nkey_from_file(o, c->nkey_seed);
    if (s == NATS_OK && c->creds[0])
        s = natsOptions_SetUserCredentialsFromFiles(o, c->creds, NULL);
    if (s == NATS_OK && (c->tls || c->tls_ca[0] || c->tls_cert[0]))
        s = natsOptions_SetSecure(o, true);
    if (s == NATS_OK && c->tls_ca[0])
        s = natsOptions_LoadCATrustedCertificates(o, c->tls_ca);
    if (s == NATS_OK && c->tls_cert[0])
        s = natsOptions_LoadCertificatesChain(o, c->tls_cert, c->tls_key);
    if (s == NATS_OK && c->inbox_prefix[0])
        s = natsOptions_SetCustomInboxPrefix(o, c->inbox_prefix);
    return s;
}

/* nats.c's text for the last failure on this thread, quotes made single: one log field. */
static void last_error(natsStatus s, char *out, size_t len)
{
    natsStatus dummy;
    const char *text = nats_GetLastError(&dummy);
    snprintf(out, len, "%s", text && *text ? text : natsStatus_GetText(s));
    for (char *p = out; *p; p++)
        if (*p == '"' || *p == '\n')
            *p = '\'';
}

/* Sleep ns, or less when a stop signal comes; whether one came. */
static bool nap(uint64_t ns)
{
    for (uint64_t slept = 0; slept < ns && !kvr_signal_received(); slept += 10 * KVR_NS_PER_MS)
        kvr_sleep_ns(10 * KVR_NS_PER_MS);
    return kvr_signal_received() != 0;
}

/*
 * The first connect, tried every 250 ms: each failure logged with nats.c's reason, given up on
 * a stop signal or after timeout_ns (0: never).
 */
/* What to add to a failed attempt's reason: a TLS server that wants a client certificate closes
 * the connection after the handshake (TLS 1.3), which nats.c 3.4.1 reports only as a missing PONG.
 */
static const char *hint_for(const struct kvr_nats_config *c, const char *why)
{
    bool tls = c && (c->tls || c->tls_ca[0]);
    if (tls && !c->tls_cert[0] && strstr(why, "PONG"))
        return " hint=\"the server may require a client certificate: --tls-cert and --tls-key\"";
    return "";
}

static kvr_status first_connect(natsOptions *o, const struct kvr_nats_config *c, const char *shown,
                                uint64_t timeout_ns, natsConnection **out)
{
    uint64_t t0 = kvr_now_ns();
    char why[256];
    for (uint32_t attempt = 1;; attempt++) {
        natsStatus s = natsConnection_Connect(out, o);
        if (s == NATS_OK)
            return KVR_OK;
        last_error(s, why, sizeof why);
        kvr_log(KVR_LOG_WARN, "nats_connect_attempt", "urls=%s attempt=%u error=\"%s\"%s", shown,
                attempt, why, hint_for(c, why));
        uint64_t spent = kvr_now_ns() - t0;
        bool late = timeout_ns && spent + RETRY_NS > timeout_ns;
        if (late || nap(RETRY_NS)) {
            kvr_log(KVR_LOG_ERROR, "nats_connect_failed",
                    "urls=%s attempts=%u waited_ms=%llu error=\"%s\"%s gave_up=%s", shown, attempt,
                    (unsigned long long)(spent / KVR_NS_PER_MS), why, hint_for(c, why),
                    late ? "connect-timeout-ms" : "signal");
            return late ? kvr_nats_status(s) : KVR_ERR_SHUTDOWN;
        }
    }
}

static kvr_status connect(const struct kvr_nats_config *c, const char *name,
                          const struct kvr_conn_hooks *h, struct kvr_loop *lp, natsConnection **out)
{
    const char *urls = c->urls;
    const char *servers[32];
    char copy[2048];
    int nservers = 0;
    if (strlen(urls) >= sizeof copy)
        return KVR_ERR_INVALID;
    strcpy(copy, urls);
    for (char *save = NULL, *t = strtok_r(copy, ",", &save); t && nservers < 32;
         t = strtok_r(NULL, ",", &save))
        servers[nservers++] = t;
    if (!nservers) {
        kvr_log(KVR_LOG_ERROR, "nats_connect_failed", "urls= error=\"--nats names no server\"");
        return KVR_ERR_INVALID;
    }
    uint64_t timeout_ns = c->connect_timeout_ns;
    char shown[2048], why[256];
    kvr_url_redact(urls, shown, sizeof shown);
    natsOptions *o = NULL;
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = options(o, servers, nservers, name, h);
    if (s == NATS_OK)
        s = kvr__loop_options(o, lp);
    if (s == NATS_OK && timeout_ns && timeout_ns < 2 * KVR_NS_PER_S) /* one attempt's share */
        s = natsOptions_SetTimeout(o, (int64_t)(timeout_ns / KVR_NS_PER_MS) + 1);
    if (s == NATS_OK)
        s = secure(o, c);
    kvr_status st = kvr_nats_status(s);
    if (s != NATS_OK) { /* a bad setting, such as a CA file that cannot be read */
        last_error(s, why, sizeof why);
        kvr_log(KVR_LOG_ERROR, "nats_connect_failed", "urls=%s error=\"%s\"", shown, why);
    } else {
        st = first_connect(o, c, shown, timeout_ns, out);
    }
    natsOptions_Destroy(o);
    return st;
}

kvr_status kvr_connect(const struct kvr_nats_config *c, const char *name, natsConnection **out)
{
    return connect(c, name, NULL, NULL, out);
}

kvr_status kvr_connect_loop(const struct kvr_nats_config *c, const char *name, struct kvr_loop *lp,
                            natsConnection **out)
{
    return connect(c, name, NULL, lp, out);
}

kvr_status kvr_connect_hooked(const struct kvr_nats_config *c, const struct kvr_conn_hooks *h,
                              natsConnection **out)
{
    return connect(c, h->name, h, NULL, out);
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
    nats_CloseAndWait(5000);
}

uint64_t kvr_nats_reconnects(natsConnection *nc)
{
    natsStatistics *st = NULL;
    uint64_t n = 0;
    if (nc && natsStatistics_Create(&st) == NATS_OK && natsConnection_GetStats(nc, st) == NATS_OK)
        natsStatistics_GetCounts(st, NULL, NULL, NULL, NULL, &n);
    natsStatistics_Destroy(st);
    return n;
}

uint64_t kvr_nats_dropped(natsSubscription *const *subs, size_t n)
{
    uint64_t dropped = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t d = 0;
        if (subs[i] && natsSubscription_GetDropped(subs[i], &d) == NATS_OK && d > 0)
            dropped += (uint64_t)d;
    }
    return dropped;
}
