/*
 * The kvengine program as the tests of the worker adapter will run it: --help and bad options,
 * the http_listening line with the port chosen, a port in use, SIGTERM draining a stream in
 * flight (an error event, [DONE], exit 0), and kill -9 cutting a stream with no [DONE].
 */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include "../../criterion_gt.h"
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <curl/curl.h>

#include "rig.h"

static pid_t child;
static int child_err = -1;   /* the read end of its stderr */
static char log_text[65536]; /* what it wrote so far */
static size_t log_len;

static void teardown(void)
{
    if (child > 0) {
        kill(child, SIGKILL); /* the one we started, by its pid */
        waitpid(child, NULL, 0);
    }
    child = 0;
    if (child_err >= 0)
        close(child_err);
    child_err = -1;
    log_len = 0;
    curl_global_cleanup();
}

TestSuite(proc, .fini = teardown, .timeout = 120);

/* Start kvengine with args (NULL-terminated), its stdout and stderr into one pipe. */
static void spawn(const char *const *args)
{
    int p[2];
    cr_assert(eq(int, pipe(p), 0));
    child = fork();
    cr_assert(ge(int, child, 0));
    if (child == 0) {
        dup2(p[1], 1);
        dup2(p[1], 2);
        close(p[0]);
        char *argv[32] = {KVENGINE};
        for (int i = 0; args[i] && i < 30; i++)
            argv[i + 1] = (char *)args[i];
        execv(KVENGINE, argv);
        _exit(127);
    }
    close(p[1]);
    child_err = p[0];
    fcntl(child_err, F_SETFL, O_NONBLOCK);
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* Read what the child wrote until text appears (true) or timeout_ms passes or it closes. */
static bool read_until(const char *text, unsigned timeout_ms)
{
    uint64_t deadline = rig_now_ns() + timeout_ms * 1000000ull;
    while (!strstr(log_text, text)) {
        uint64_t now = rig_now_ns();
        if (now >= deadline)
            return false;
        struct pollfd pf = {child_err, POLLIN, 0};
        poll(&pf, 1, (int)((deadline - now) / 1000000) + 1);
        ssize_t n = read(child_err, log_text + log_len, sizeof log_text - 1 - log_len);
        if (n == 0)
            return strstr(log_text, text) != NULL; /* it exited */
        if (n > 0)
            log_len += (size_t)n;
        log_text[log_len] = 0;
    }
    return true;
}

static int exit_status(unsigned timeout_ms)
{
    uint64_t deadline = rig_now_ns() + timeout_ms * 1000000ull;
    int status = 0;
    pid_t w;
    while ((w = waitpid(child, &status, WNOHANG)) == 0 && rig_now_ns() < deadline)
        rig_sleep_ms(10);
    cr_assert(eq(int, w, child), "kvengine did not exit within %u ms", timeout_ms);
    child = 0;
    read_until("\x01", 100); /* the rest of its output */
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static uint16_t listening_port(void)
{
    cr_assert(read_until("msg=http_listening", 20000), "no http_listening line: %s", log_text);
    const char *p = strstr(strstr(log_text, "msg=http_listening"), " port=");
    cr_assert(ne(ptr, (void *)p, NULL));
    return (uint16_t)atoi(p + 6);
}

Test(proc, help_and_bad_options)
{
    spawn((const char *const[]){"--help", NULL});
    cr_assert(eq(int, exit_status(20000), 0));
    cr_assert(ne(ptr, strstr(log_text, "--kv-events"), NULL), "%s", log_text);
    cr_assert(ne(ptr, strstr(log_text, "--max-model-len"), NULL));
    teardown();
    spawn((const char *const[]){"--kv-hash", "sha256", NULL});
    cr_assert(eq(int, exit_status(20000), 2));
    teardown();
    spawn((const char *const[]){"--kv-replay", "tcp://127.0.0.1:*", NULL});
    cr_assert(eq(int, exit_status(20000), 2));
    cr_assert(ne(ptr, strstr(log_text, "--kv-replay needs --kv-events"), NULL), "%s", log_text);
    teardown();
    spawn((const char *const[]){"--kv-hybrid", NULL}); /* groups are in map events only */
    cr_assert(eq(int, exit_status(20000), 2));
    cr_assert(ne(ptr, strstr(log_text, "--kv-hybrid needs --kv-layout map"), NULL), "%s", log_text);
    teardown();
    spawn((const char *const[]){"--listen", "localhost:80", NULL});
    cr_assert(eq(int, exit_status(20000), 2));
}

Test(proc, a_port_in_use_exits_1)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    cr_assert(eq(int, bind(fd, (struct sockaddr *)&a, sizeof a), 0));
    cr_assert(eq(int, listen(fd, 1), 0));
    getsockname(fd, (struct sockaddr *)&a, &al);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    spawn((const char *const[]){"--listen", addr, NULL});
    cr_assert(eq(int, exit_status(20000), 1));
    cr_assert(ne(ptr, strstr(log_text, "Address already in use"), NULL), "%s", log_text);
    close(fd);
}

static uint16_t port;

static void *long_stream(void *arg)
{
    struct rig_stream *s = arg;
    char *p = rig_prompt(8, 0);
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":%s,\"max_tokens\":1500,\"stream\":true}", p);
    rig_stream(port, body, 0, s);
    free(p);
    return NULL;
}

/* kvengine started, a stream of 1,500 slow tokens running in thread *t. */
static void serve_a_stream(pthread_t *t, struct rig_stream *s)
{
    spawn((const char *const[]){"--listen", "127.0.0.1:0", "--drain-timeout-ms", "200",
                                "--block-size", "4", NULL});
    port = listening_port();
    pthread_create(t, NULL, long_stream, s);
    cr_assert(eq(dbl, rig_wait_metric(port, "kvengine_requests_held", 1, 20000), 1));
    cr_assert(eq(dbl, rig_wait_metric(port, "vllm:num_requests_running", 1, 20000), 1));
}

Test(proc, sigterm_drains_and_exits_0)
{
    pthread_t t;
    static struct rig_stream s;
    serve_a_stream(&t, &s);
    cr_assert(eq(int, kill(child, SIGTERM), 0));
    pthread_join(t, NULL);
    cr_assert(eq(int, exit_status(30000), 0), "%s", log_text);
    cr_assert(s.done, "no [DONE] after the drain");
    cr_assert(gt(sz, s.n, 0));
    json_t *last = s.ev[s.n - 1];
    cr_assert(eq(str, (char *)json_string_value(json_object_get(last, "type")),
                 "ServiceUnavailableError"));
    cr_assert(ne(ptr, strstr(log_text, "msg=engine_stopped aborted=1"), NULL), "%s", log_text);
    rig_stream_free(&s);
}

Test(proc, kill_9_cuts_a_stream_without_done)
{
    pthread_t t;
    static struct rig_stream s;
    serve_a_stream(&t, &s);
    cr_assert(eq(int, kill(child, SIGKILL), 0));
    pthread_join(t, NULL);
    cr_assert(not(s.done));
    cr_assert(ne(int, s.resp.curl, CURLE_OK)); /* the transfer ended unfinished */
    cr_assert(eq(int, exit_status(30000), 128 + SIGKILL));
    rig_stream_free(&s);
}
