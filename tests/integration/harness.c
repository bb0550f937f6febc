/*
 * Integration test harness implementation.
 */
#define _DEFAULT_SOURCE
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "codec.h"

#define MAX_CHILDREN 64

static pid_t children[MAX_CHILDREN];
static int nchildren;

uint64_t h_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

void h_sleep_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000};
    while (nanosleep(&t, &t) && errno == EINTR)
        ;
}

static pid_t spawn_argv(char *const *argv, const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    if (pid > 0 && nchildren < MAX_CHILDREN)
        children[nchildren++] = pid;
    return pid;
}

static void json_str(const char *buf, const char *key, char *out, size_t len)
{
    const char *a = strstr(buf, key);
    out[0] = 0;
    if (a) {
        a += strlen(key);
        snprintf(out, len, "%.*s", (int)strcspn(a, "\""), a);
    }
}

static bool read_ports(struct nats_srv *s)
{
    char path[512], buf[1024];
    snprintf(path, sizeof path, "%s/nats-server_%d.ports", s->dir, (int)s->pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    json_str(buf, "\"nats\":[\"", s->url, sizeof s->url);
    json_str(buf, "\"monitoring\":[\"", s->monitor, sizeof s->monitor);
    json_str(buf, "\"cluster\":[\"", s->cluster, sizeof s->cluster);
    return s->url[0] && s->monitor[0];
}

/* Start nats-server with argv (its ports file in s->dir) and wait until it serves. */
static bool start_server(struct nats_srv *s, char *const *argv)
{
    char log[300];
    snprintf(log, sizeof log, "%s/nats.log", s->dir);
    s->pid = spawn_argv(argv, log);
    if (s->pid <= 0)
        return false;
    for (int i = 0; i < 200; i++) {
        if (read_ports(s)) {
            const char *colon = strrchr(s->url, ':');
            s->port = colon ? atoi(colon + 1) : 0;
            char health[200], body[256];
            snprintf(health, sizeof health, "%s/healthz", s->monitor);
            if (h_http_get(health, body, sizeof body))
                return true;
        }
        h_sleep_ms(25);
    }
    return false;
}

static bool make_dir(struct nats_srv *s)
{
    if (s->dir[0])
        return true;
    strcpy(s->dir, "/tmp/kvr_it_XXXXXX");
    return mkdtemp(s->dir) != NULL;
}

bool h_nats_start(struct nats_srv *s, int port)
{
    if (!make_dir(s))
        return false;
    char portarg[16];
    snprintf(portarg, sizeof portarg, "%d", port ? port : -1);
    char *argv[] = {"nats-server", "-a", "127.0.0.1",        "-p",   portarg,
                    "-m",          "-1", "--ports_file_dir", s->dir, NULL};
    return start_server(s, argv);
}

bool h_nats_start_node(struct nats_srv *s, int port, const char *name, const struct nats_srv *seed)
{
    if (!make_dir(s))
        return false;
    char portarg[16];
    snprintf(portarg, sizeof portarg, "%d", port ? port : -1);
    char *argv[] = {"nats-server",
                    "-a",
                    "127.0.0.1",
                    "-p",
                    portarg,
                    "-m",
                    "-1",
                    "--ports_file_dir",
                    s->dir,
                    "-n",
                    (char *)name,
                    "--cluster_name",
                    "kvr",
                    "--cluster",
                    "nats://127.0.0.1:-1",
                    seed ? "--routes" : NULL,
                    seed ? (char *)seed->cluster : NULL,
                    NULL};
    return start_server(s, argv);
}

bool h_cluster_wait(const struct nats_srv *nodes, int n, int timeout_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;
    while (h_now_ms() < end) {
        int ready = 0;
        for (int i = 0; i < n; i++) {
            char url[200], body[16384];
            snprintf(url, sizeof url, "%s/routez", nodes[i].monitor);
            const char *k =
                h_http_get(url, body, sizeof body) ? strstr(body, "\"num_routes\":") : NULL;
            ready += k && atoi(k + 13) >= n - 1;
        }
        if (ready == n)
            return true;
        h_sleep_ms(50);
    }
    return false;
}

void h_nats_stop(struct nats_srv *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGTERM);
        h_wait(s->pid, 5000);
        char path[512];
        snprintf(path, sizeof path, "%s/nats-server_%d.ports", s->dir, (int)s->pid);
        unlink(path);
        s->pid = 0;
    }
}

pid_t h_spawn(const char *name, const char *const *args)
{
    char path[512], log[512];
    snprintf(path, sizeof path, "%s/src/%s", KVR_BUILD_ROOT, name);
    snprintf(log, sizeof log, "/tmp/kvr_it_%s_%d.log", name, (int)getpid());
    char *argv[32];
    int n = 0;
    argv[n++] = path;
    for (int i = 0; args && args[i] && n < 31; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    return spawn_argv(argv, log);
}

void h_signal(pid_t pid, int sig)
{
    if (pid > 0)
        kill(pid, sig);
}

int h_wait(pid_t pid, int ms)
{
    uint64_t end = h_now_ms() + (uint64_t)ms;
    int status;
    while (h_now_ms() < end) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        h_sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

void h_kill_all(void)
{
    for (int i = 0; i < nchildren; i++) {
        if (children[i] > 0) {
            kill(children[i], SIGKILL);
            waitpid(children[i], NULL, 0);
        }
    }
    nchildren = 0;
}

natsConnection *h_connect(const char *url)
{
    natsConnection *nc = NULL;
    natsOptions *o = NULL;
    natsOptions_Create(&o);
    natsOptions_SetURL(o, url);
    natsOptions_SetSendAsap(o, true);
    natsOptions_SetMaxReconnect(o, -1);
    natsOptions_SetReconnectWait(o, 100);
    natsConnection_Connect(&nc, o);
    natsOptions_Destroy(o);
    return nc;
}

static bool start_sub(natsConnection *nc, struct h_req *q, char *inbox, size_t len)
{
    memset(q, 0, sizeof *q);
    natsInbox *ib = NULL;
    natsInbox_Create(&ib);
    snprintf(inbox, len, "%s", ib);
    natsInbox_Destroy(ib);
    if (natsConnection_SubscribeSync(&q->sub, nc, inbox) != NATS_OK)
        return false;
    natsSubscription_SetPendingLimits(q->sub, -1, -1);
    q->t0 = h_now_ms();
    return true;
}

bool h_send(natsConnection *nc, const char *subject, struct h_req *q, const char *id, uint32_t base,
            uint32_t shared, uint32_t n, uint32_t max_tokens)
{
    if (!start_sub(nc, q, q->inbox, sizeof q->inbox))
        return false;
    uint32_t *t = malloc((n + 1) * sizeof *t);
    for (uint32_t i = 0; i < n; i++) /* the first `shared` tokens are the same for every base */
        t[i] = i < shared ? 7 + i : base * 100003u + i;
    struct kvr_buf b = {0};
    bool ok = kvr_wire_encode_generate(&b, id, t, n, max_tokens, NULL) == KVR_OK &&
              natsConnection_PublishRequest(nc, subject, q->inbox, b.data, (int)b.len) == NATS_OK;
    if (ok && b.len <= sizeof q->data) {
        memcpy(q->data, b.data, b.len);
        q->len = (int)b.len;
    }
    kvr_buf_free(&b);
    free(t);
    return ok;
}

bool h_send_raw(natsConnection *nc, const char *subject, struct h_req *q, const void *data, int len)
{
    return start_sub(nc, q, q->inbox, sizeof q->inbox) &&
           natsConnection_PublishRequest(nc, subject, q->inbox, data, len) == NATS_OK;
}

/* Read one chunk (waiting at most ms) into q->res; false when none came. */
static bool read_chunk(struct h_req *q, int64_t ms)
{
    natsMsg *m = NULL;
    if (ms <= 0 || natsSubscription_NextMsg(&m, q->sub, ms) != NATS_OK)
        return false;
    struct kvr_wire_response r;
    if (kvr_wire_decode_response(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), &r) ==
        KVR_OK) {
        if (q->res.final) {
            q->extra++;
        } else {
            q->res.chunks++;
            q->res.tokens += r.ntokens;
            if (r.ntokens && !q->res.first_ms)
                q->res.first_ms = h_now_ms() - q->t0;
            if (r.worker_id)
                q->res.worker_id = r.worker_id;
        }
        if (r.final && !q->res.final) {
            q->res.final = true;
            q->res.error_code = r.error_code;
            q->res.total_ms = h_now_ms() - q->t0;
            const char *v = NULL;
            q->res.error_header =
                natsMsgHeader_Get(m, "Nats-Service-Error-Code", &v) == NATS_OK && v;
        }
        kvr_wire_response_free(&r);
    }
    natsMsg_Destroy(m);
    return true;
}

uint64_t h_first_worker(struct h_req *q, int timeout_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;
    while (!q->res.worker_id && !q->res.final && read_chunk(q, (int64_t)end - (int64_t)h_now_ms()))
        ;
    return q->res.worker_id;
}

bool h_collect(struct h_req *q, int timeout_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;
    while (!q->res.final && read_chunk(q, (int64_t)end - (int64_t)h_now_ms()))
        ;
    natsSubscription_Destroy(q->sub);
    q->sub = NULL;
    return q->res.final;
}

bool h_collect_resend(natsConnection *nc, const char *subject, struct h_req *q, int resend_ms,
                      uint32_t max_resends, int timeout_ms, int linger_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms, last = q->t0;
    while (!q->res.final && h_now_ms() < end) {
        uint64_t resend_at = last + (uint64_t)resend_ms;
        int64_t wait = (int64_t)(resend_at < end ? resend_at : end) - (int64_t)h_now_ms();
        if (read_chunk(q, wait > 0 ? wait : 1)) {
            last = h_now_ms();
        } else if (h_now_ms() >= resend_at && q->resends < max_resends && q->len) {
            natsConnection_PublishRequest(nc, subject, q->inbox, q->data, q->len);
            q->resends++;
            last = h_now_ms();
        }
    }
    uint64_t linger_end = h_now_ms() + (uint64_t)linger_ms;
    while (q->res.final && read_chunk(q, (int64_t)linger_end - (int64_t)h_now_ms()))
        ;
    natsSubscription_Destroy(q->sub);
    q->sub = NULL;
    return q->res.final;
}

bool h_http_get(const char *url, char *buf, size_t len)
{
    /* http://127.0.0.1:PORT/path, plain HTTP/1.0 */
    int port = 0;
    char path[200] = "/";
    if (sscanf(url, "http://127.0.0.1:%d%199s", &port, path) < 1 || port <= 0)
        return false;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return false;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (ok) {
        char req[300];
        int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
        ok = write(fd, req, (size_t)n) == n;
    }
    size_t got = 0;
    while (ok && got + 1 < len) {
        ssize_t r = read(fd, buf + got, len - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    buf[got] = 0;
    close(fd);
    return ok && strstr(buf, " 200 ") != NULL;
}
