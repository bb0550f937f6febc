/*
 * Integration test harness implementation.
 */
#define _DEFAULT_SOURCE
#include "harness.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
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

/* --- the processes a test started --------------------------------------------------------- */

#define MAX_PROCS    64
#define TAIL_LINES   15
#define NATS_STOP_MS 5000

enum proc_state {
    P_RUNNING, /* started, nobody signalled it */
    P_TERMED,  /* SIGTERM sent: must exit 0 */
    P_KILLED,  /* SIGKILL sent on purpose: reaped, never checked */
    P_DONE,    /* reaped (status known) */
};

struct proc {
    pid_t pid;
    char name[32]; /* kvrouter, kvworker, kvbench, nats-server */
    int n;         /* 1, 2, ... among the processes of that name */
    char log[256];
    char dir[256]; /* a nats-server's ports file directory */
    bool nats;
    enum proc_state state;
    int status; /* when P_DONE: the exit status, or 128 + signal */
};

static struct proc procs[MAX_PROCS];
static int nprocs;
static bool ended;             /* h_end ran */
static natsSubscription *held; /* h_setup's hold on _INBOX.> in a cluster */

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

static struct proc *proc_of(pid_t pid)
{
    for (int i = 0; pid > 0 && i < nprocs; i++)
        if (procs[i].pid == pid)
            return &procs[i];
    return NULL;
}

static int decode_status(int status)
{
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Reap p if it has exited (no wait); true when it is reaped. */
static bool try_reap(struct proc *p)
{
    int status;
    if (p->state == P_DONE)
        return true;
    if (waitpid(p->pid, &status, WNOHANG) != p->pid)
        return false;
    p->status = decode_status(status);
    p->state = P_DONE;
    return true;
}

/* Fork and exec argv[0] (a path, or a name on PATH) with its output in its own log. */
static pid_t spawn_argv(char *const *argv, const char *name, bool nats)
{
    cr_assert(lt(int, nprocs, MAX_PROCS), "more than %d processes in one test", MAX_PROCS);
    struct proc *p = &procs[nprocs];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->n = 1;
    for (int i = 0; i < nprocs; i++)
        p->n += !strcmp(procs[i].name, name);
    snprintf(p->log, sizeof p->log, "/tmp/kvr_it_%d_%s_%d.log", (int)getpid(), name, p->n);
    p->nats = nats;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(p->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    if (pid > 0) {
        p->pid = pid;
        p->state = P_RUNNING;
        nprocs++;
    }
    return pid;
}

/* The last `lines` lines of p's log into out (len bytes), each indented. */
static void log_tail(const struct proc *p, int lines, char *out, size_t len)
{
    out[0] = 0;
    FILE *f = fopen(p->log, "r");
    if (!f) {
        snprintf(out, len, "    (no log: %s)\n", strerror(errno));
        return;
    }
    char buf[8192];
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    long from = size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0;
    fseek(f, from, SEEK_SET);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    if (n && buf[n - 1] == '\n')
        buf[--n] = 0;
    const char *start = buf;
    for (size_t i = n, seen = 0; i > 0; i--) {
        if (buf[i - 1] == '\n' && ++seen == (size_t)lines) {
            start = buf + i;
            break;
        }
    }
    if (!n) {
        snprintf(out, len, "    (empty log)\n");
        return;
    }
    size_t used = 0;
    while (*start && used + 8 < len) {
        size_t k = strcspn(start, "\n");
        int w = snprintf(out + used, len - used, "    %.*s\n", (int)k, start);
        if (w < 0 || used + (size_t)w >= len)
            break;
        used += (size_t)w;
        start += k + (start[k] == '\n');
    }
}

void h_print_tail(pid_t pid, int lines)
{
    struct proc *p = proc_of(pid);
    if (!p)
        return;
    char tail[8192];
    log_tail(p, lines, tail, sizeof tail);
    fprintf(stderr, "%s #%d (pid %d), %s:\n%s", p->name, p->n, (int)p->pid, p->log, tail);
}

static void describe_status(int status, char *out, size_t len)
{
    if (status < 0)
        snprintf(out, len, "did not exit within %d ms of SIGTERM (killed)", H_STOP_MS);
    else if (status >= 128)
        snprintf(out, len, "killed by signal %d (%s)", status - 128, strsignal(status - 128));
    else
        snprintf(out, len, "exited with status %d", status);
}

/* Append "name #n (pid, log): what; its log tail" to report. */
static void report_proc(char *report, size_t len, const struct proc *p, const char *what)
{
    char tail[4096];
    log_tail(p, TAIL_LINES, tail, sizeof tail);
    size_t used = strlen(report);
    snprintf(report + used, len - used, "%s #%d (pid %d) %s; last lines of %s:\n%s", p->name, p->n,
             (int)p->pid, what, p->log, tail);
}

pid_t h_spawn(const char *name, const char *const *args)
{
    char path[512];
    snprintf(path, sizeof path, "%s/src/%s", KVR_BUILD_ROOT, name);
    char *argv[64];
    int n = 0;
    argv[n++] = path;
    for (int i = 0; args && args[i]; i++) {
        cr_assert(lt(int, n, 63), "too many arguments for %s", name);
        argv[n++] = (char *)args[i];
    }
    argv[n] = NULL;
    return spawn_argv(argv, name, false);
}

/* args then extra (both NULL-terminated; extra may be NULL) into one list. */
static pid_t spawn_with(const char *name, const char *const *args, const char *const *extra)
{
    const char *all[64];
    int n = 0;
    for (int i = 0; args[i]; i++)
        all[n++] = args[i];
    for (int i = 0; extra && extra[i]; i++) {
        cr_assert(lt(int, n, 63), "too many arguments for %s", name);
        all[n++] = extra[i];
    }
    all[n] = NULL;
    return h_spawn(name, all);
}

/* The daemons' log level: KVR_IT_LOG_LEVEL (debug: each request's life by its key), else info. */
static const char *log_level(void)
{
    const char *l = getenv("KVR_IT_LOG_LEVEL");
    return l && *l ? l : "info";
}

pid_t h_router(const char *urls, const char *id, const char *const *extra)
{
    return spawn_with("kvrouter", H_ARGS("--nats", urls, "--id", id, "--log-level", log_level()),
                      extra);
}

pid_t h_worker(const char *urls, const char *id, int speedup, int heartbeat_ms,
               const char *const *extra)
{
    char s[16], hb[16];
    snprintf(s, sizeof s, "%d", speedup);
    snprintf(hb, sizeof hb, "%d", heartbeat_ms);
    return spawn_with("kvworker",
                      H_ARGS("--nats", urls, "--id", id, "--speedup", s, "--heartbeat-ms", hb,
                             "--drain-timeout-ms", "2000", "--log-level", log_level()),
                      extra);
}

void h_signal(pid_t pid, int sig)
{
    if (pid <= 0)
        return;
    struct proc *p = proc_of(pid);
    if (p && p->state != P_DONE) {
        if (sig == SIGKILL)
            p->state = P_KILLED;
        else if (sig == SIGTERM && p->state == P_RUNNING)
            p->state = P_TERMED;
    }
    kill(pid, sig);
}

int h_wait(pid_t pid, int ms)
{
    struct proc *p = proc_of(pid);
    if (p && p->state == P_DONE)
        return p->status;
    uint64_t end = h_now_ms() + (uint64_t)ms;
    int status;
    while (h_now_ms() < end) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            if (p) {
                p->state = P_DONE;
                p->status = decode_status(status);
            }
            return decode_status(status);
        }
        h_sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    if (p) {
        p->state = P_DONE;
        p->status = -1;
    }
    return -1;
}

bool h_exited(pid_t pid)
{
    struct proc *p = proc_of(pid);
    return p && try_reap(p);
}

/* --- NATS servers ------------------------------------------------------------------------- */

/* The first string of the array at key in the ports file's object, into out. */
static void first_url(json_t *o, const char *key, char *out, size_t len)
{
    const char *v = json_string_value(json_array_get(json_object_get(o, key), 0));
    snprintf(out, len, "%s", v ? v : "");
}

static bool read_ports(struct nats_srv *s)
{
    char path[512];
    snprintf(path, sizeof path, "%s/nats-server_%d.ports", s->dir, (int)s->pid);
    json_t *o = json_load_file(path, 0, NULL);
    if (!o)
        return false;
    first_url(o, "nats", s->url, sizeof s->url);
    first_url(o, "monitoring", s->monitor, sizeof s->monitor);
    first_url(o, "cluster", s->cluster, sizeof s->cluster);
    json_decref(o);
    return s->url[0] && s->monitor[0];
}

/* Start nats-server with argv (its ports file in s->dir) and wait until it serves. */
static bool start_server(struct nats_srv *s, char *const *argv)
{
    s->pid = spawn_argv(argv, "nats-server", true);
    if (s->pid <= 0)
        return false;
    struct proc *p = proc_of(s->pid);
    snprintf(p->dir, sizeof p->dir, "%s", s->dir);
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
    return h_nats_start_conf_port(s, KVR_NATS_CONF, port);
}

bool h_nats_start_conf(struct nats_srv *s, const char *conf)
{
    return h_nats_start_conf_port(s, conf, 0);
}

bool h_nats_start_conf_port(struct nats_srv *s, const char *conf, int port)
{
    if (!make_dir(s))
        return false;
    char portarg[16];
    snprintf(portarg, sizeof portarg, "%d", port ? port : -1);
    char *argv[] = {"nats-server", "-c", (char *)conf,       "-a",   "127.0.0.1", "-p", portarg,
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
                    "-c",
                    KVR_NATS_CONF,
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

/* The JSON body of an HTTP answer (after the headers), or NULL. */
static json_t *http_json(const char *url)
{
    static char body[65536];
    if (!h_http_get(url, body, sizeof body))
        return NULL;
    const char *b = strstr(body, "\r\n\r\n");
    return b ? json_loads(b + 4, 0, NULL) : NULL;
}

bool h_cluster_wait(const struct nats_srv *nodes, int n, int timeout_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;
    while (h_now_ms() < end) {
        int ready = 0;
        for (int i = 0; i < n; i++) {
            char url[200];
            snprintf(url, sizeof url, "%s/routez", nodes[i].monitor);
            json_t *o = http_json(url);
            ready += json_integer_value(json_object_get(o, "num_routes")) >= n - 1;
            json_decref(o);
        }
        if (ready == n)
            return true;
        h_sleep_ms(50);
    }
    return false;
}

/* nats-server 2.9 exits 1 on SIGTERM (0 on SIGINT); either is a clean stop by itself. */
static bool nats_stopped_cleanly(int status)
{
    return status == 0 || status == 1;
}

/* SIGTERM p (a nats-server) and wait for it; its status, -1 when it hung (then killed). */
static int stop_nats(struct proc *p)
{
    if (p->state == P_RUNNING || p->state == P_TERMED) {
        p->state = P_TERMED;
        kill(p->pid, SIGTERM);
    }
    int st = h_wait(p->pid, NATS_STOP_MS);
    char path[512];
    snprintf(path, sizeof path, "%s/nats-server_%d.ports", p->dir, (int)p->pid);
    unlink(path);
    return st;
}

void h_nats_stop(struct nats_srv *s)
{
    struct proc *p = proc_of(s->pid);
    if (!p)
        return;
    int st = stop_nats(p);
    s->pid = 0;
    if (!nats_stopped_cleanly(st)) {
        char what[128], report[8192] = "";
        describe_status(st, what, sizeof what);
        report_proc(report, sizeof report, p, what);
        cr_fatal("nats-server did not stop cleanly on SIGTERM:\n%s", report);
    }
}

const char *h_urls(const struct nats_srv *nodes, int n, int first)
{
    static char ring[16][1024];
    static int k;
    char *out = ring[k++ % 16];
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        int w = snprintf(out + used, sizeof ring[0] - used, "%s%s", i ? "," : "",
                         nodes[(first + i) % n].url);
        cr_assert(w > 0 && used + (size_t)w < sizeof ring[0], "URL list too long");
        used += (size_t)w;
    }
    return out;
}

/* --- a test's life ------------------------------------------------------------------------ */

#define PROBE "_INBOX.kvr-probe."
static atomic_int probe_seen = -1; /* the last node whose probe reached the hold */

/* The hold's messages are the per-request subscriptions' copies: dropped, but for the probes. */
static void on_held(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *ctx)
{
    (void)nc, (void)sub, (void)ctx;
    const char *subj = natsMsg_GetSubject(m);
    if (strncmp(subj, PROBE, strlen(PROBE)) == 0)
        atomic_store(&probe_seen, atoi(subj + strlen(PROBE)));
    natsMsg_Destroy(m);
}

/*
 * A cluster's answer can beat the interest in its inbox: a subscription made just before the
 * request reaches node 0 at once but the other nodes only later (an RS+ per subject), and a worker
 * on another node that answers first has its chunks dropped there. Clients hold one long-lived
 * subscription on their whole reply prefix, as docs/protocol.md asks, so hold _INBOX.> on nc and
 * wait until a message published on every other node reaches it.
 */
static void hold_replies(natsConnection *nc, const struct nats_srv *nodes, int n)
{
    cr_assert(natsConnection_Subscribe(&held, nc, "_INBOX.>", on_held, NULL) == NATS_OK &&
                  natsSubscription_SetPendingLimits(held, -1, -1) == NATS_OK &&
                  natsConnection_Flush(nc) == NATS_OK,
              "no hold on _INBOX.>");
    for (int i = 1; i < n; i++) {
        natsConnection *other = h_connect(nodes[i].url);
        cr_assert(ne(ptr, other, NULL), "no connection to %s", nodes[i].url);
        char subj[64];
        snprintf(subj, sizeof subj, PROBE "%d", i);
        uint64_t end = h_now_ms() + 10000;
        while (atomic_load(&probe_seen) != i && h_now_ms() < end) {
            natsConnection_PublishString(other, subj, "");
            natsConnection_Flush(other);
            h_sleep_ms(10);
        }
        natsConnection_Destroy(other);
        cr_assert(eq(int, atomic_load(&probe_seen), i), "node %d never saw the hold on _INBOX.>",
                  i + 1);
    }
}

void h_setup(struct nats_srv *nodes, int n, natsConnection **nc)
{
    nprocs = 0;
    ended = false;
    memset(nodes, 0, (size_t)n * sizeof *nodes);
    if (n == 1) {
        cr_assert(h_nats_start(&nodes[0], 0), "nats-server did not start");
    } else {
        for (int i = 0; i < n; i++) {
            char name[16];
            snprintf(name, sizeof name, "n%d", i + 1);
            cr_assert(h_nats_start_node(&nodes[i], 0, name, i ? &nodes[0] : NULL),
                      "node %s did not start", name);
        }
        cr_assert(h_cluster_wait(nodes, n, 10000), "the cluster did not form");
    }
    *nc = h_connect(nodes[0].url);
    cr_assert(ne(ptr, *nc, NULL), "no client connection to %s", nodes[0].url);
    if (n > 1)
        hold_replies(*nc, nodes, n);
}

void h_end(void)
{
    static char report[32768];
    report[0] = 0;
    ended = true;
    int failed = 0;
    /* the daemons first, all at once (they drain in parallel) */
    for (int i = 0; i < nprocs; i++) {
        struct proc *p = &procs[i];
        if (!p->nats && p->state == P_RUNNING) {
            p->state = P_TERMED;
            kill(p->pid, SIGTERM);
        }
    }
    uint64_t end = h_now_ms() + H_STOP_MS;
    for (;;) {
        bool waiting = false;
        for (int i = 0; i < nprocs; i++) {
            struct proc *p = &procs[i];
            if (p->nats || p->state == P_DONE)
                continue;
            if (p->state == P_KILLED) { /* killed on purpose: dies at once */
                waitpid(p->pid, NULL, 0);
                p->state = P_DONE;
                p->status = 128 + SIGKILL;
                continue;
            }
            if (try_reap(p)) {
                if (p->status != 0) {
                    char what[128];
                    describe_status(p->status, what, sizeof what);
                    report_proc(report, sizeof report, p, what);
                    failed++;
                }
            } else {
                waiting = true;
            }
        }
        if (!waiting)
            break;
        if (h_now_ms() >= end) { /* the ones left hang */
            for (int i = 0; i < nprocs; i++) {
                struct proc *p = &procs[i];
                if (p->nats || p->state == P_DONE)
                    continue;
                kill(p->pid, SIGKILL);
                waitpid(p->pid, NULL, 0);
                p->state = P_DONE;
                p->status = -1;
                char what[128];
                describe_status(-1, what, sizeof what);
                report_proc(report, sizeof report, p, what);
                failed++;
            }
            break;
        }
        h_sleep_ms(10);
    }
    /* then the servers */
    for (int i = 0; i < nprocs; i++) {
        struct proc *p = &procs[i];
        if (!p->nats || p->state == P_DONE)
            continue;
        bool killed = p->state == P_KILLED; /* on purpose: reaped, not judged */
        int st = stop_nats(p);
        if (!killed && !nats_stopped_cleanly(st)) {
            char what[128];
            describe_status(st, what, sizeof what);
            report_proc(report, sizeof report, p, what);
            failed++;
        }
    }
    cr_assert(eq(int, failed, 0), "%d process(es) did not stop cleanly on SIGTERM:\n%s", failed,
              report);
    if (!getenv("KVR_IT_KEEP_LOGS"))
        for (int i = 0; i < nprocs; i++)
            unlink(procs[i].log);
}

void h_teardown(natsConnection **nc)
{
    h_sub_close(*nc, held);
    held = NULL;
    natsConnection_Destroy(*nc);
    *nc = NULL;
    if (!ended && nprocs)
        fprintf(stderr, "the test ended before h_end: its processes and their logs:\n");
    for (int i = 0; i < nprocs; i++) {
        struct proc *p = &procs[i];
        if (!ended) {
            bool died = p->state == P_RUNNING && try_reap(p); /* on its own, during the test */
            char what[128] = "running";
            if (died)
                describe_status(p->status, what, sizeof what);
            else if (p->state == P_KILLED)
                snprintf(what, sizeof what, "killed on purpose");
            else if (p->state == P_DONE)
                snprintf(what, sizeof what, "ended (status %d)", p->status);
            fprintf(stderr, "  %s #%d (pid %d, %s): %s\n", p->name, p->n, (int)p->pid, what,
                    p->log);
            if (died)
                h_print_tail(p->pid, TAIL_LINES);
        }
        if (p->state != P_DONE) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, NULL, 0);
            p->state = P_DONE;
        }
        if (p->nats) {
            char path[512];
            snprintf(path, sizeof path, "%s/nats-server_%d.ports", p->dir, (int)p->pid);
            unlink(path);
            rmdir(p->dir);
        }
    }
    nprocs = 0;
}

/* --- one request -------------------------------------------------------------------------- */

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

void h_publish(natsConnection *nc, const char *subject, const struct kvr_buf *b)
{
    cr_assert(eq(int, natsConnection_Publish(nc, subject, b->data, (int)b->len), NATS_OK),
              "publish on %s", subject);
}

/* h_inbox_prefix's ("": natsInbox_Create's _INBOX) */
static char inbox_prefix[128];

/* A fresh reply subject: _INBOX.<nuid>, or <inbox_prefix>.<nuid>. */
static void new_inbox(char *out, size_t len)
{
    natsInbox *ib = NULL;
    natsInbox_Create(&ib);
    int n = inbox_prefix[0] ? snprintf(out, len, "%s.%s", inbox_prefix, ib + strlen("_INBOX."))
                            : snprintf(out, len, "%s", ib);
    cr_assert(n > 0 && (size_t)n < len, "an inbox over %zu bytes", len);
    natsInbox_Destroy(ib);
}

void h_sub_close(natsConnection *nc, natsSubscription *sub)
{
    if (!sub)
        return;
    natsSubscription_Unsubscribe(sub);
    natsConnection_Flush(nc);
    natsSubscription_Destroy(sub);
}

static bool start_sub(natsConnection *nc, struct h_req *q, char *inbox, size_t len)
{
    memset(q, 0, sizeof *q);
    q->nc = nc;
    new_inbox(inbox, len);
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
    h_sub_close(q->nc, q->sub);
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
    h_sub_close(q->nc, q->sub);
    q->sub = NULL;
    return q->res.final;
}

struct h_result h_ask(natsConnection *nc, const char *subject, const char *id, uint32_t base,
                      uint32_t shared, uint32_t n, uint32_t max_tokens, int timeout_ms)
{
    struct h_req q;
    cr_assert(h_send(nc, subject, &q, id, base, shared, n, max_tokens), "could not send %s", id);
    h_collect(&q, timeout_ms);
    return q.res;
}

struct h_result h_ask_raw(natsConnection *nc, const char *subject, const void *data, int len,
                          int timeout_ms)
{
    struct h_req q;
    cr_assert(h_send_raw(nc, subject, &q, data, len), "could not send %d raw bytes", len);
    h_collect(&q, timeout_ms);
    return q.res;
}

/* --- waiting for the fleet ---------------------------------------------------------------- */

void h_until_served(natsConnection *nc, const char *subject, int routers, int timeout_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;
    static struct h_digest a[H_MAX_ROUTERS];
    int synced = 0;
    for (int i = 0; h_now_ms() < end; i++) {
        if (routers > 0) {
            int got = h_digests(nc, a, H_MAX_ROUTERS, 100);
            synced = 0;
            for (int k = 0; k < got; k++)
                synced += a[k].synced;
            if (got != routers || synced != routers) {
                h_sleep_ms(100);
                continue;
            }
        }
        char id[32];
        snprintf(id, sizeof id, "probe-%d", i);
        struct h_result r = h_ask(nc, subject, id, 900000 + (uint32_t)i, 0, 64, 1, 2000);
        if (r.final && r.error_code == 0)
            return;
        h_sleep_ms(100);
    }
    if (routers > 0)
        cr_fatal("the fleet never served (%d of %d routers synced)", synced, routers);
    cr_fatal("the fleet never served a request");
}

void h_until_router(natsConnection *nc, int timeout_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;
    while (h_now_ms() < end) {
        natsMsg *m = NULL;
        if (natsConnection_RequestString(&m, nc, "$SRV.PING.kvrouter", "", 500) == NATS_OK) {
            natsMsg_Destroy(m);
            return;
        }
        h_sleep_ms(50);
    }
    cr_fatal("no router answered $SRV.PING");
}

/* --- what the routers say ----------------------------------------------------------------- */

json_t *h_json_at(json_t *obj, const char *path)
{
    char key[128];
    while (obj && *path) {
        size_t k = strcspn(path, ".");
        snprintf(key, sizeof key, "%.*s", (int)k, path);
        obj = json_object_get(obj, key);
        path += k + (path[k] == '.');
    }
    return obj;
}

uint64_t h_json_u64(json_t *obj, const char *path)
{
    json_t *v = h_json_at(obj, path);
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        char *text = json_dumps(obj, JSON_COMPACT);
        char shown[2048];
        snprintf(shown, sizeof shown, "%s", text ? text : "(null)");
        free(text);
        cr_fatal("no non-negative integer at \"%s\" in %s", path, shown);
    }
    return (uint64_t)json_integer_value(v);
}

int h_digests(natsConnection *nc, struct h_digest *out, int max, int wait_ms)
{
    char ib[192];
    natsSubscription *sub = NULL;
    new_inbox(ib, sizeof ib);
    int n = 0;
    if (natsConnection_SubscribeSync(&sub, nc, ib) == NATS_OK &&
        natsConnection_PublishRequest(nc, "kv.default.router.digest", ib, "", 0) == NATS_OK) {
        uint64_t end = h_now_ms() + (uint64_t)wait_ms;
        natsMsg *m = NULL;
        while (n < max && h_now_ms() < end &&
               natsSubscription_NextMsg(&m, sub, (int64_t)(end - h_now_ms()) + 1) == NATS_OK) {
            struct h_digest *a = &out[n++];
            int len = natsMsg_GetDataLength(m);
            cr_assert(lt(int, len, (int)sizeof a->json), "a digest answer of %d bytes", len);
            memcpy(a->json, natsMsg_GetData(m), (size_t)len);
            a->json[len] = 0;
            natsMsg_Destroy(m);
            json_error_t err;
            json_t *o = json_loads(a->json, 0, &err);
            cr_assert(o != NULL, "a digest answer is not JSON (%s): %s", err.text, a->json);
            const char *id = json_string_value(json_object_get(o, "router_id"));
            const char *d = json_string_value(json_object_get(o, "digest"));
            json_t *synced = json_object_get(o, "synced");
            cr_assert(id && d && strlen(d) == 16 && json_is_boolean(synced),
                      "a digest answer without router_id, digest or synced: %s", a->json);
            snprintf(a->id, sizeof a->id, "%s", id);
            snprintf(a->digest, sizeof a->digest, "%s", d);
            a->synced = json_is_true(synced);
            json_decref(o);
        }
    }
    h_sub_close(nc, sub);
    return n;
}

uint64_t h_stat(const struct h_digest *a, const char *key)
{
    json_t *o = json_loads(a->json, 0, NULL);
    uint64_t v = h_json_u64(o, key);
    json_decref(o);
    return v;
}

int64_t h_until_agree(natsConnection *nc, int n, int timeout_ms, int every_ms,
                      struct h_digest *last)
{
    uint64_t t0 = h_now_ms();
    while (h_now_ms() - t0 < (uint64_t)timeout_ms) {
        int got = h_digests(nc, last, H_MAX_ROUTERS, 150);
        bool same = got == n;
        for (int i = 1; i < got && same; i++)
            same = !strcmp(last[i].digest, last[0].digest);
        if (same)
            return (int64_t)(h_now_ms() - t0);
        h_sleep_ms(every_ms);
    }
    int got = h_digests(nc, last, H_MAX_ROUTERS, 150);
    fprintf(stderr, "%d routers answered, %d expected to agree:\n", got, n);
    for (int i = 0; i < got; i++)
        fprintf(stderr, "  %s: %s\n", last[i].id, last[i].json);
    return -1;
}

json_t *h_connz_entry(const struct nats_srv *s, const char *name)
{
    static char body[65536];
    char u[200];
    snprintf(u, sizeof u, "%s/connz?limit=1024", s->monitor);
    const char *b = h_http_get(u, body, sizeof body) ? strstr(body, "\r\n\r\n") : NULL;
    json_t *o = b ? json_loads(b + 4, 0, NULL) : NULL, *c, *found = NULL;
    size_t i;
    json_array_foreach(json_object_get(o, "connections"), i, c)
    {
        const char *n = json_string_value(json_object_get(c, "name"));
        if (n && !strcmp(n, name))
            found = json_incref(c);
    }
    json_decref(o);
    return found;
}

json_t *h_stats(natsConnection *nc, int timeout_ms)
{
    natsMsg *m = NULL;
    cr_assert(eq(int, natsConnection_RequestString(&m, nc, "$SRV.STATS.kvrouter", "", timeout_ms),
                 NATS_OK),
              "no router answered $SRV.STATS");
    json_error_t err;
    json_t *o = json_loadb(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), 0, &err);
    cr_assert(o != NULL, "$SRV.STATS answered no JSON (%s): %.*s", err.text,
              natsMsg_GetDataLength(m), natsMsg_GetData(m));
    natsMsg_Destroy(m);
    const char *type = json_string_value(json_object_get(o, "type"));
    cr_assert(type && !strcmp(type, "io.nats.micro.v1.stats_response"), "type %s",
              type ? type : "(none)");
    return o;
}

json_t *h_endpoint(json_t *stats, const char *name)
{
    json_t *eps = json_object_get(stats, "endpoints"), *e;
    size_t i;
    json_array_foreach(eps, i, e)
    {
        const char *n = json_string_value(json_object_get(e, "name"));
        if (n && !strcmp(n, name))
            return e;
    }
    cr_fatal("$SRV.STATS has no endpoint %s", name);
    return NULL;
}

/* --- small things ------------------------------------------------------------------------- */

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

void h_inbox_prefix(const char *prefix)
{
    snprintf(inbox_prefix, sizeof inbox_prefix, "%s", prefix ? prefix : "");
}

bool h_log_has(pid_t pid, const char *needle)
{
    struct proc *p = proc_of(pid);
    FILE *f = p ? fopen(p->log, "r") : NULL;
    if (!f)
        return false;
    static char buf[1 << 20];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    return strstr(buf, needle) != NULL;
}

/* --- the operators' endpoints and other programs ------------------------------------------ */

int h_http(const char *url, char *body, size_t len, int timeout_ms)
{
    static char buf[1 << 20];
    body[0] = 0;
    int port = 0;
    char path[1024] = "/";
    if (sscanf(url, "http://127.0.0.1:%d%1023s", &port, path) < 1 || port <= 0 || port > 65535)
        return 0;
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int status = 0;
    size_t got = 0, sent = 0;
    char req[1200];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1:%d\r\n\r\n", path, port);
    bool connected = connect(fd, (struct sockaddr *)&a, sizeof a) == 0 || errno == EINPROGRESS;
    bool eof = false;
    while (connected && !eof) {
        int64_t left = (int64_t)end - (int64_t)h_now_ms();
        if (left <= 0)
            break;
        struct pollfd pf = {fd, sent < (size_t)n ? POLLOUT : POLLIN, 0};
        int r = poll(&pf, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        if (sent < (size_t)n) {
            ssize_t w = send(fd, req + sent, (size_t)n - sent, MSG_NOSIGNAL);
            if (w < 0 && errno != EAGAIN && errno != EINTR)
                break;
            sent += w > 0 ? (size_t)w : 0;
            continue;
        }
        ssize_t k = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (k < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (k < 0)
            break;
        eof = k == 0 || got + (size_t)k >= sizeof buf - 1;
        got += (size_t)k;
    }
    close(fd);
    buf[got] = 0;
    const char *b = strstr(buf, "\r\n\r\n");
    if (eof && b && sscanf(buf, "HTTP/1.%*d %d", &status) == 1)
        snprintf(body, len, "%s", b + 4);
    return eof && b ? status : 0;
}

/* The value of key on a line of text (up to its end) with msg=<msg>, into out. */
static bool line_value(const char *text, const char *msg, const char *key, char *out, size_t len)
{
    char m[128], k[128];
    snprintf(m, sizeof m, " msg=%s", msg);
    snprintf(k, sizeof k, " %s=", key);
    for (const char *at = strstr(text, m); at; at = strstr(at + 1, m)) {
        size_t ml = strlen(m);
        if (at[ml] != ' ' && at[ml] != '\n' && at[ml] != 0)
            continue; /* msg=<msg>_longer */
        const char *eol = strchr(at, '\n');
        const char *v = strstr(at, k);
        if (!v || (eol && v > eol))
            continue;
        v += strlen(k);
        size_t vl = *v == '"' ? strcspn(v + 1, "\"\n") + 2 : strcspn(v, " \n");
        snprintf(out, len, "%.*s", (int)vl, v);
        return true;
    }
    return false;
}

bool h_log_value(pid_t pid, const char *msg, const char *key, char *out, size_t len, int timeout_ms)
{
    static char buf[1 << 20];
    struct proc *p = proc_of(pid);
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;
    while (p) {
        bool gone = try_reap(p); /* read once more after it exited */
        FILE *f = fopen(p->log, "r");
        if (f) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = 0;
            if (line_value(buf, msg, key, out, len))
                return true;
        }
        if (gone || h_now_ms() >= end)
            break;
        h_sleep_ms(20);
    }
    return false;
}

int h_http_port(pid_t pid, int timeout_ms)
{
    char v[32] = "";
    bool found = h_log_value(pid, "http_listening", "port", v, sizeof v, timeout_ms);
    if (!found) {
        h_print_tail(pid, TAIL_LINES);
        cr_fatal("pid %d logged no msg=http_listening ... port=N within %d ms", (int)pid,
                 timeout_ms);
    }
    int port = atoi(v);
    cr_assert(port > 0 && port < 65536, "pid %d: http_listening port=%s", (int)pid, v);
    return port;
}

int h_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &al) == 0;
    if (fd >= 0)
        close(fd);
    cr_assert(ok, "no free port on 127.0.0.1: %s", strerror(errno));
    return ntohs(a.sin_port);
}

pid_t h_spawn_prog(const char *prog, const char *name, const char *const *args)
{
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)prog;
    for (int i = 0; args && args[i]; i++) {
        cr_assert(lt(int, n, 63), "too many arguments for %s", name);
        argv[n++] = (char *)args[i];
    }
    argv[n] = NULL;
    return spawn_argv(argv, name, false);
}
