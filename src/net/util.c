/*
 * Shared daemon plumbing: logs, clock, subjects, NATS connections, service-error replies and the
 * option table.
 */
#define _DEFAULT_SOURCE
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *log_program = "kvrouter";
static enum kvr_log_level log_threshold = KVR_LOG_INFO;

void kvr_log_init(const char *program, enum kvr_log_level level)
{
    log_program = program;
    log_threshold = level;
}

bool kvr_log_parse_level(const char *s, enum kvr_log_level *out)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++) {
        if (!strcmp(s, names[i])) {
            *out = (enum kvr_log_level)i;
            return true;
        }
    }
    return false;
}

void kvr_log(enum kvr_log_level level, const char *msg, const char *kv_fmt, ...)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    if (level < log_threshold)
        return;
    char ts[64];
    kvr_rfc3339(ts, sizeof ts, kvr_realtime_ns());
    char kv[1024] = "";
    if (kv_fmt && *kv_fmt) {
        va_list ap;
        va_start(ap, kv_fmt);
        vsnprintf(kv, sizeof kv, kv_fmt, ap);
        va_end(ap);
    }
    flockfile(stderr);
    fprintf(stderr, "ts=%s level=%s prog=%s msg=%s%s%s\n", ts, names[level], log_program, msg,
            *kv ? " " : "", kv);
    funlockfile(stderr);
}

uint64_t kvr_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

uint64_t kvr_realtime_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

void kvr_sleep_ns(uint64_t ns)
{
    struct timespec t = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&t, &t) && errno == EINTR)
        ;
}

void kvr_rfc3339(char *buf, size_t len, uint64_t ns)
{
    time_t s = (time_t)(ns / 1000000000ull);
    struct tm tm;
    gmtime_r(&s, &tm);
    char day[32];
    strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, len, "%s.%09lluZ", day, (unsigned long long)(ns % 1000000000ull));
}

bool kvr_subject(char *buf, size_t len, const char *prefix, const char *ns, const char *suffix)
{
    int n = snprintf(buf, len, "%s.%s.%s", prefix, ns, suffix);
    return n > 0 && (size_t)n < len;
}

static void on_disconnected(natsConnection *nc, void *closure)
{
    if (natsConnection_IsClosed(nc))
        return; /* our own close, not an outage */
    kvr_log(KVR_LOG_WARN, "nats_disconnected", "conn=%s", (const char *)closure);
}

static void on_reconnected(natsConnection *nc, void *closure)
{
    char url[256] = "";
    natsConnection_GetConnectedUrl(nc, url, sizeof url);
    kvr_log(KVR_LOG_INFO, "nats_reconnected", "conn=%s url=%s", (const char *)closure, url);
}

static void on_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *closure)
{
    (void)nc;
    (void)sub;
    kvr_log(KVR_LOG_WARN, "nats_error", "conn=%s error=\"%s\"", (const char *)closure,
            natsStatus_GetText(err));
}

kvr_status kvr_connect(const char *urls, const char *name, natsConnection **out)
{
    natsOptions *o = NULL;
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
    void *tag = (void *)name; /* the callbacks' closure: the caller keeps name alive */
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = natsOptions_SetServers(o, servers, nservers);
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
        s = natsOptions_SetDisconnectedCB(o, on_disconnected, tag);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(o, on_reconnected, tag);
    if (s == NATS_OK)
        s = natsOptions_SetErrorHandler(o, on_error, tag);
    if (s == NATS_OK)
        s = natsConnection_Connect(out, o);
    natsOptions_Destroy(o);
    if (s != NATS_OK) {
        kvr_log(KVR_LOG_ERROR, "nats_connect_failed", "urls=%s error=\"%s\"", urls,
                natsStatus_GetText(s));
        return KVR_ERR_IO;
    }
    return KVR_OK;
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
    return s == NATS_OK ? KVR_OK : KVR_ERR_IO;
}

/* --- options --------------------------------------------------------------------------------- */

static bool set_opt(const struct kvr_opt *o, const char *v)
{
    char *end;
    errno = 0;
    switch (o->type) {
    case KVR_OPT_STR:
        if (strlen(v) >= KVR_OPT_STR_MAX)
            return false;
        strcpy((char *)o->ptr, v);
        return true;
    case KVR_OPT_U32: {
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *end || errno || *v == '-' || x > UINT32_MAX)
            return false;
        *(uint32_t *)o->ptr = (uint32_t)x;
        return true;
    }
    case KVR_OPT_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *end || errno || *v == '-')
            return false;
        *(uint64_t *)o->ptr = x;
        return true;
    }
    case KVR_OPT_DOUBLE: {
        double x = strtod(v, &end);
        if (!*v || *end || errno || x != x)
            return false;
        *(double *)o->ptr = x;
        return true;
    }
    case KVR_OPT_BOOL:
        if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on"))
            *(bool *)o->ptr = true;
        else if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off"))
            *(bool *)o->ptr = false;
        else
            return false;
        return true;
    }
    return false;
}

static const struct kvr_opt *find_opt(const struct kvr_opt *opts, size_t n, const char *name,
                                      size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(opts[i].name) == len && !strncmp(opts[i].name, name, len))
            return &opts[i];
    return NULL;
}

static void print_help(const struct kvr_opt *opts, size_t n, const char *program,
                       const char *summary)
{
    static const char *types[] = {"TEXT", "N", "N", "X", ""};
    printf("usage: %s [options]\n%s\n\noptions (also in a config file as 'name = value', or in the "
           "environment):\n",
           program, summary);
    printf("  --config PATH%*s a config file (env KVR_CONFIG)\n", 18, "");
    for (size_t i = 0; i < n; i++) {
        char left[64];
        snprintf(left, sizeof left, "--%s %s", opts[i].name, types[opts[i].type]);
        printf("  %-30s %s", left, opts[i].help);
        if (opts[i].env)
            printf(" (env %s)", opts[i].env);
        printf("\n");
    }
    printf("  --help                         this text\n");
}

static int read_config(const struct kvr_opt *opts, size_t n, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot read config file %s: %s\n", path, strerror(errno));
        return 2;
    }
    char line[1024];
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        char *p = line + strspn(line, " \t");
        p[strcspn(p, "#\r\n")] = 0;
        if (!*p)
            continue;
        char *eq = strchr(p, '=');
        size_t klen = eq ? strcspn(p, " \t=") : 0;
        char *v = eq ? eq + 1 + strspn(eq + 1, " \t") : NULL;
        if (v) {
            size_t vl = strlen(v);
            while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
                v[--vl] = 0;
        }
        const struct kvr_opt *o = eq ? find_opt(opts, n, p, klen) : NULL;
        if (!o || !set_opt(o, v)) {
            fprintf(stderr, "%s:%d: %s\n", path, lineno,
                    o ? "bad value" : "not an option (see --help)");
            rc = 2;
        }
    }
    fclose(f);
    return rc;
}

int kvr_opts_parse(const struct kvr_opt *opts, size_t n, int argc, char **argv, const char *program,
                   const char *summary)
{
    const char *config = getenv("KVR_CONFIG");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_help(opts, n, program, summary);
            return 1;
        }
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            config = argv[i + 1];
    }
    if (config && *config && read_config(opts, n, config))
        return 2;
    for (size_t i = 0; i < n; i++) {
        const char *v = opts[i].env ? getenv(opts[i].env) : NULL;
        if (v && !set_opt(&opts[i], v)) {
            fprintf(stderr, "%s: bad value in %s\n", program, opts[i].env);
            return 2;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--config")) {
            i++;
            continue;
        }
        if (strncmp(a, "--", 2)) {
            fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", program, a);
            return 2;
        }
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const struct kvr_opt *o = find_opt(opts, n, name, len);
        if (!o) {
            fprintf(stderr, "%s: unknown option '%s' (see --help)\n", program, a);
            return 2;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v && o->type == KVR_OPT_BOOL)
            v = "true";
        else if (!v && i + 1 < argc)
            v = argv[++i];
        if (!v || !set_opt(o, v)) {
            fprintf(stderr, "%s: --%s %s\n", program, o->name,
                    v ? "has a bad value" : "needs a value");
            return 2;
        }
    }
    return 0;
}
