/*
 * Shared daemon plumbing: logs, clock, subjects, NATS connections, service-error replies and the
 * option table.
 */
#define _DEFAULT_SOURCE
#include "util.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loop.h"
#include "natscfg.h"
#include "signals.h"

#define RETRY_NS (250 * KVR_NS_PER_MS) /* between two failed first connects */
#define CLOSE_MS 2000 /* kvr_conn_destroy waits this long for the closed callback */

natsStatus kvr_pending_bound(natsSubscription *sub)
{
    return natsSubscription_SetPendingLimits(sub, -1, KVR_PENDING_BYTES);
}

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

/*
 * What a connection's callbacks read (its name and hooks), owned here rather than by the caller:
 * nats.c can run a connection's disconnected and closed callbacks after natsConnection_Destroy
 * (NATS-NOTES.md), and runs every connection callback on one library thread in the order they were
 * posted, so once the closed callback has run no other callback of that connection runs or will.
 * Invariant: a life is freed by kvr_conn_destroy once it saw the closed callback, or by that
 * callback when kvr_conn_destroy gave up waiting (abandoned); a failed first connect posts no
 * callback, and connect() frees its life at once.
 */
struct conn_life {
    char name[320];              /* the connection's name, copied */
    struct kvr_conn_hooks hooks; /* copied; cut and back NULL for a plain connection */
    natsConnection *nc;          /* once connected */
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* signalled when closed is set */
    bool closed;            /* the closed callback ran */
    bool closing;           /* kvr_conn_destroy closes it: a close not ours is a loss */
    bool abandoned;         /* kvr_conn_destroy gave up waiting: the callback frees */
    struct conn_life *next; /* in lives */
};

static pthread_mutex_t lives_mu = PTHREAD_MUTEX_INITIALIZER;
static struct conn_life *lives; /* the connected ones, not yet destroyed */

static struct conn_life *life_new(const char *name, const struct kvr_conn_hooks *h)
{
    struct conn_life *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    snprintf(l->name, sizeof l->name, "%s", name);
    if (h)
        l->hooks = *h;
    l->hooks.name = l->name;
    pthread_mutex_init(&l->mu, NULL);
    kvr_cond_init_monotonic(&l->cv);
    return l;
}

static void life_free(struct conn_life *l)
{
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

/* Take nc's life out of lives; NULL when nc was not made here. */
static struct conn_life *lives_take(natsConnection *nc)
{
    pthread_mutex_lock(&lives_mu);
    struct conn_life **p = &lives;
    while (*p && (*p)->nc != nc)
        p = &(*p)->next;
    struct conn_life *l = *p;
    if (l)
        *p = l->next;
    pthread_mutex_unlock(&lives_mu);
    return l;
}

static bool log_cut(natsConnection *nc, const char *name)
{
    if (natsConnection_IsClosed(nc))
        return false; /* our own close, not an outage */
    kvr_log(KVR_LOG_WARN, "nats_disconnected", "conn=%s", name);
    return true;
}

static void on_disconnected(natsConnection *nc, void *closure)
{
    const struct conn_life *l = closure;
    if (log_cut(nc, l->name) && l->hooks.cut)
        l->hooks.cut(l->hooks.ctx);
}

static void on_reconnected(natsConnection *nc, void *closure)
{
    const struct conn_life *l = closure;
    char url[256] = "", shown[300];
    natsConnection_GetConnectedUrl(nc, url, sizeof url);
    kvr_url_redact(url, shown, sizeof shown);
    kvr_log(KVR_LOG_INFO, "nats_reconnected", "conn=%s url=%s", l->name, shown);
    if (l->hooks.back)
        l->hooks.back(l->hooks.ctx);
}

static void on_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *closure)
{
    (void)nc;
    (void)sub;
    const struct conn_life *l = closure;
    kvr_log(KVR_LOG_WARN, "nats_error", "conn=%s error=\"%s\"", l->name, natsStatus_GetText(err));
}

/* nats.c's text for a failure (or the status's when it has none), quotes made single: one log
 * field. */
static void error_field(const char *text, natsStatus s, char *out, size_t len)
{
    snprintf(out, len, "%s", text && *text ? text : natsStatus_GetText(s));
    for (char *p = out; *p; p++)
        if (*p == '"' || *p == '\n')
            *p = '\'';
}

/*
 * The connection's last callback: it is closed, and nothing of it runs after this. nats.c closes a
 * connection on its own (it reconnects forever otherwise) when a server refuses two reconnects in
 * a row with the same authentication error: revoked or changed credentials, or nats.c 3.4.1's
 * unsigned CONNECT (1 in 256, docs/security.md). Nothing would ever reconnect it, so the daemon
 * is asked to stop with a failure (kvr_signals_fail) and its supervisor starts it again.
 */
static void on_closed(natsConnection *nc, void *closure)
{
    struct conn_life *l = closure;
    pthread_mutex_lock(&l->mu);
    bool lost = !l->closing;
    /* closed is set after the log: a kvr_conn_destroy that comes meanwhile waits for it, so it
     * cannot free l under the log */
    pthread_mutex_unlock(&l->mu);
    if (lost) {
        const char *text = NULL;
        natsStatus s = natsConnection_GetLastError(nc, &text);
        char why[256];
        error_field(text, s, why, sizeof why);
        kvr_log(KVR_LOG_ERROR, "nats_connection_lost", "conn=%s error=\"%s\" action=stop", l->name,
                why);
        kvr_signals_fail();
    }
    pthread_mutex_lock(&l->mu);
    l->closed = true;
    bool gone = l->abandoned;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    if (gone)
        life_free(l);
}

void kvr_conn_destroy(natsConnection *nc)
{
    if (!nc)
        return;
    struct conn_life *l = lives_take(nc);
    if (l) {
        pthread_mutex_lock(&l->mu);
        l->closing = true;
        pthread_mutex_unlock(&l->mu);
    }
    natsConnection_Close(nc); /* posts the disconnected callback, then the closed one */
    bool seen = true;
    if (l) {
        struct timespec until = kvr_deadline_ms(CLOSE_MS);
        pthread_mutex_lock(&l->mu);
        int rc = 0;
        while (!l->closed && rc == 0)
            rc = pthread_cond_timedwait(&l->cv, &l->mu, &until);
        seen = l->closed;
        if (!seen) {
            kvr_log(KVR_LOG_WARN, "nats_close_unconfirmed", "conn=%s waited_ms=%d", l->name,
                    CLOSE_MS);
            l->abandoned = true; /* the closed callback frees it, whenever it runs */
        }
        pthread_mutex_unlock(&l->mu);
    }
    natsConnection_Destroy(nc);
    if (l && seen)
        life_free(l);
}

/* The settings every connection gets (NATS-NOTES.md). */
static natsStatus options(natsOptions *o, const char **servers, int n, struct conn_life *l)
{
    const char *name = l->name;
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
        s = natsOptions_SetDisconnectedCB(o, on_disconnected, l);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(o, on_reconnected, l);
    if (s == NATS_OK)
        s = natsOptions_SetErrorHandler(o, on_error, l);
    if (s == NATS_OK)
        s = natsOptions_SetClosedCB(o, on_closed, l);
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
    error_field(nats_GetLastError(&dummy), s, out, len);
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
    struct conn_life *life = life_new(name, h);
    if (!life)
        return KVR_ERR_NOMEM;
    natsOptions *o = NULL;
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = options(o, servers, nservers, life);
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
    if (st != KVR_OK) { /* no connection: none of its callbacks was posted */
        life_free(life);
        return st;
    }
    life->nc = *out;
    pthread_mutex_lock(&lives_mu);
    life->next = lives;
    lives = life;
    pthread_mutex_unlock(&lives_mu);
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
    return (struct kvr_sink){.publish = publish_outmsg, .ctx = nc};
}

void kvr_net_shutdown(void)
{
    nats_CloseAndWait(5000);
}

natsStatus kvr_flush_subscribed(natsConnection *nc)
{
    natsStatus s = natsConnection_Flush(nc);
    if (s != NATS_OK && !natsConnection_IsClosed(nc) &&
        (s == NATS_CONNECTION_DISCONNECTED || natsConnection_IsReconnecting(nc))) {
        kvr_log(KVR_LOG_WARN, "subscribed_while_reconnecting",
                "error=\"%s\" action=\"made again on the reconnect\"", natsStatus_GetText(s));
        return NATS_OK;
    }
    return s;
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
