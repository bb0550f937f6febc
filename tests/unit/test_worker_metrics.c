/*
 * The simulated worker's metrics and readiness (src/worker/metrics) without NATS: the exposition
 * after real requests through the handlers (values read back, and Debian's `promtool check
 * metrics` on it; the test fails when promtool is missing), a scrape that gives up on a held
 * lock, and readiness following the engine thread (alive when idle and through a step longer than
 * the stall limit, stalled when it cannot run) and the worker's state (serving, draining).
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"
#include "codec.h"
#include "log.h"
#include "metrics.h"
#include "procstat.h"
#include "rec.h"
#include "worker.h"

#define REPLY "_INBOX.client.1"

static struct kvr_wk_config cfg;
static struct kvr_worker w;
static struct kvr_buf text;
static pthread_t engine; /* the engine thread, while engine_on */
static bool engine_on;

static void setup(void)
{
    rec_reset();
    kvr_log_init("test_worker_metrics", KVR_LOG_ERROR);
    kvr_procstat_start();
    kvr_wk_config_default(&cfg);
    cfg.id = 3;
    cfg.engine.num_blocks = 256;
    cfg.engine.block_size = 16;
    cfg.max_prompt_tokens = 4096;
    cfg.max_output_tokens = 64;
    memset(&text, 0, sizeof text);
}

static void start(void)
{
    cr_assert(eq(int,
                 kvr_worker_init(&w, &cfg, (struct kvr_sink){.publish = rec_record, .ctx = NULL}),
                 KVR_OK));
}

static void stop_engine(void)
{
    if (!engine_on)
        return;
    kvr_worker_stop(&w);
    pthread_join(engine, NULL);
    engine_on = false;
}

static void teardown(void)
{
    stop_engine(); /* a test that failed with it running */
    kvr_worker_free(&w);
    kvr_buf_free(&text);
    rec_reset();
}

TestSuite(worker_metrics, .init = setup, .fini = teardown, .timeout = 60);

/* A router's forward of a 64-token prompt. */
static void forward(uint64_t key, const char *id, uint32_t max_tokens)
{
    uint32_t toks[64];
    for (uint32_t i = 0; i < 64; i++)
        toks[i] = 7 + i;
    struct kvr_buf g = {0}, b = {0};
    cr_assert(eq(int, kvr_wire_encode_generate(&g, id, toks, 64, max_tokens, NULL), KVR_OK));
    cr_assert(eq(int, kvr_wire_encode_worker_generate(&b, g.data, g.len, key, 0, "r1", 0), KVR_OK));
    kvr_worker_on_generate(&w, REPLY, b.data, b.len);
    kvr_buf_free(&g);
    kvr_buf_free(&b);
}

/* Run the engine in virtual time until it is idle. */
static void run(void)
{
    uint64_t vt = kvr_now_ns();
    for (int guard = 0;; guard++) {
        cr_assert(lt(int, guard, 10000), "the engine never went idle");
        pthread_mutex_lock(&w.mu);
        uint64_t d = kvr_engine_step_begin(w.eng, vt);
        if (d) {
            vt += d;
            kvr_engine_step_end(w.eng, vt);
        }
        pthread_mutex_unlock(&w.mu);
        kvr_worker_flush(&w);
        if (!d)
            return;
    }
}

/* The exposition as the link serves it, less its NATS part: the worker's families, process_*. */
static kvr_status scrape(void)
{
    struct kvr_prom p;
    text.len = 0;
    kvr_prom_begin(&p, &text);
    kvr_status st = kvr_wk_metrics(&w, &p);
    if (st != KVR_OK)
        return st;
    struct kvr_procstat ps;
    kvr_procstat_read(&ps);
    st = kvr_prom_process(&p, &ps);
    cr_assert(eq(int, kvr_buf_reserve(&text, text.len + 1), KVR_OK));
    text.data[text.len] = 0;
    return st;
}

/* The value of the sample line that starts with series followed by a space; asserted present. */
static double sample(const char *series)
{
    size_t n = strlen(series);
    for (const char *at = (const char *)text.data; at && *at;) {
        if (!strncmp(at, series, n) && at[n] == ' ')
            return strtod(at + n + 1, NULL);
        at = strchr(at, '\n');
        at = at ? at + 1 : NULL;
    }
    cr_fatal("no sample %s in:\n%s", series, (const char *)text.data);
    return 0;
}

/* --- promtool (as tests/unit/test_prom.c runs it) -------------------------------------------- */

static const char *find_promtool(char *buf, size_t len)
{
    const char *path = getenv("PATH");
    while (path && *path) {
        size_t n = strcspn(path, ":");
        if (n > 0 && (size_t)snprintf(buf, len, "%.*s/promtool", (int)n, path) < len &&
            access(buf, X_OK) == 0)
            return buf;
        path += n + (path[n] == ':');
    }
    return access("/usr/bin/promtool", X_OK) == 0 ? "/usr/bin/promtool" : NULL;
}

/* `promtool check metrics < file`: its exit status, its output (stdout and stderr) in output. */
static int promtool_check(const char *promtool, const char *file, char *output, size_t len)
{
    int fds[2];
    cr_assert(eq(int, pipe(fds), 0));
    pid_t pid = fork();
    cr_assert(ge(int, pid, 0));
    if (pid == 0) {
        int in = open(file, O_RDONLY);
        if (in < 0 || dup2(in, 0) < 0 || dup2(fds[1], 1) < 0 || dup2(fds[1], 2) < 0)
            _exit(126);
        close(fds[0]);
        execl(promtool, "promtool", "check", "metrics", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    size_t at = 0;
    ssize_t n;
    while (at + 1 < len && (n = read(fds[0], output + at, len - 1 - at)) > 0)
        at += (size_t)n;
    output[at] = 0;
    close(fds[0]);
    int status;
    cr_assert(eq(int, waitpid(pid, &status, 0), pid));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* promtool's verdict on text (not run under valgrind: it follows children, and in a Go program
 * reports thousands of errors of Go's runtime; the plain and ASan runs give the verdict). */
static void assert_promtool_clean(void)
{
    char where[4096];
    const char *promtool = find_promtool(where, sizeof where);
    if (!promtool)
        cr_fatal("promtool not found on PATH nor as /usr/bin/promtool: install Debian's "
                 "prometheus package (bash scripts/deps.sh does)");
    if (getenv("KVR_VALGRIND"))
        return;
    char file[] = "/tmp/kvr_wkm_XXXXXX";
    int fd = mkstemp(file);
    cr_assert(ge(int, fd, 0));
    cr_assert(eq(sz, (size_t)write(fd, text.data, text.len), text.len));
    close(fd);
    static char output[65536];
    int rc = promtool_check(promtool, file, output, sizeof output);
    unlink(file);
    cr_assert(eq(int, rc, 0), "promtool check metrics exited %d:\n%s\non:\n%s", rc, output,
              (const char *)text.data);
    cr_assert(eq(str, output, ""), "promtool check metrics said:\n%s", output);
}

/* --- the exposition -------------------------------------------------------------------------- */

Test(worker_metrics, the_exposition_counts_requests_errors_and_the_engine)
{
    start();
    forward(101, "a", 5);
    run();
    forward(102, "b", 65); /* over --max-output-tokens 64: refused */
    forward(101, "a", 5);  /* the same key again: a duplicate, dropped */
    cr_assert(eq(int, scrape(), KVR_OK));
    cr_assert(eq(dbl, sample("kvworker_requests_total"), 3.0));
    cr_assert(eq(dbl, sample("kvworker_errors_total{code=\"ERR_MAX_TOKENS_TOO_LARGE\"}"), 1.0));
    cr_assert(eq(dbl, sample("kvworker_request_seconds_count"), 3.0));
    cr_assert(eq(dbl, sample("kvworker_request_seconds_bucket{le=\"+Inf\"}"), 3.0));
    cr_assert(eq(dbl, sample("kvworker_served_total"), 1.0));
    cr_assert(eq(dbl, sample("kvworker_duplicates_total"), 1.0));
    cr_assert(eq(dbl, sample("kvworker_held_requests"), 0.0));
    cr_assert(eq(dbl, sample("kvworker_engine_capacity_blocks"), 256.0));
    struct kvr_engine_stats es;
    kvr_engine_stats(w.eng, &es);
    cr_assert(gt(u64, es.steps, 0));
    cr_assert(eq(dbl, sample("kvworker_engine_steps_total"), (double)es.steps));
    cr_assert(eq(dbl, sample("kvworker_engine_cached_blocks"), 4.0), "the prompt's 4 blocks");
    cr_assert(eq(dbl, sample("kvworker_engine_active_blocks"), 0.0));
    cr_assert(gt(dbl, sample("process_start_time_seconds"), 0.0));
    assert_promtool_clean();
}

Test(worker_metrics, a_request_in_flight_shows_in_the_gauges)
{
    start();
    forward(201, "a", 8);
    pthread_mutex_lock(&w.mu);
    uint64_t d = kvr_engine_step_begin(w.eng, kvr_now_ns()); /* admitted, prefill under way */
    pthread_mutex_unlock(&w.mu);
    cr_assert(gt(u64, d, 0));
    cr_assert(eq(int, scrape(), KVR_OK));
    cr_assert(eq(dbl, sample("kvworker_held_requests"), 1.0));
    cr_assert(eq(dbl, sample("kvworker_engine_running_requests"), 1.0));
    cr_assert(eq(dbl, sample("kvworker_engine_waiting_requests"), 0.0));
    cr_assert(gt(dbl, sample("kvworker_engine_active_blocks"), 0.0));
    cr_assert(gt(dbl, sample("kvworker_engine_kv_usage_ratio"), 0.0));
    assert_promtool_clean();
}

/* --- bounded waits --------------------------------------------------------------------------- */

static void *hold_lock(void *arg)
{
    pthread_mutex_lock(&w.mu);
    kvr_sleep_ns(*(const uint64_t *)arg);
    pthread_mutex_unlock(&w.mu);
    return NULL;
}

/* Another thread holds the worker's mutex for hold_ns from now (joined by the caller). */
static pthread_t hold_for(const uint64_t *hold_ns)
{
    pthread_t t;
    cr_assert(eq(int, pthread_create(&t, NULL, hold_lock, (void *)hold_ns), 0));
    for (int i = 0; i < 1000 && pthread_mutex_trylock(&w.mu) == 0; i++) {
        pthread_mutex_unlock(&w.mu); /* not taken yet */
        kvr_sleep_ns(KVR_NS_PER_MS);
    }
    return t;
}

Test(worker_metrics, a_scrape_gives_up_on_a_held_lock)
{
    start();
    static const uint64_t hold = 900 * KVR_NS_PER_MS;
    pthread_t t = hold_for(&hold);
    uint64_t t0 = kvr_now_ns();
    cr_assert(eq(int, scrape(), KVR_ERR_TIMEOUT));
    uint64_t waited = kvr_now_ns() - t0;
    cr_assert(eq(sz, text.len, 0), "nothing written");
    cr_assert(ge(u64, waited, KVR_WK_LOCK_WAIT_NS - 10 * KVR_NS_PER_MS));
    cr_assert(lt(u64, waited, KVR_WK_LOCK_WAIT_NS + 400 * KVR_NS_PER_MS));
    pthread_join(t, NULL);
    cr_assert(eq(int, scrape(), KVR_OK), "answers again once the lock is free");
}

/* --- readiness ------------------------------------------------------------------------------- */

static void *engine_thread(void *arg)
{
    (void)arg;
    kvr_worker_run_engine(&w);
    return NULL;
}

static void start_engine(void)
{
    cr_assert(eq(int, pthread_create(&engine, NULL, engine_thread, NULL), 0));
    engine_on = true;
    for (int i = 0; i < 1000 && !atomic_load(&w.engine_ns); i++)
        kvr_sleep_ns(KVR_NS_PER_MS);
    cr_assert(ne(u64, atomic_load(&w.engine_ns), 0), "the engine thread turned");
}

static void set_serving(void)
{
    pthread_mutex_lock(&w.mu);
    w.serving = true;
    pthread_mutex_unlock(&w.mu);
}

Test(worker_metrics, ready_follows_the_state_and_stays_ready_when_idle)
{
    start();
    char why[256] = "";
    cr_assert(not(kvr_wk_ready(&w, why, sizeof why)));
    cr_assert(ne(ptr, strstr(why, "engine thread has not run"), NULL), "%s", why);
    start_engine();
    cr_assert(not(kvr_wk_ready(&w, why, sizeof why)));
    cr_assert(ne(ptr, strstr(why, "not serving"), NULL), "%s", why);
    set_serving();
    cr_assert(kvr_wk_ready(&w, why, sizeof why), "%s", why);
    kvr_sleep_ns(KVR_WK_ENGINE_STALL_NS + 300 * KVR_NS_PER_MS); /* idle, longer than the limit */
    cr_assert(kvr_wk_ready(&w, why, sizeof why), "an idle engine is alive: %s", why);
    kvr_worker_set_draining(&w, true);
    cr_assert(not(kvr_wk_ready(&w, why, sizeof why)));
    cr_assert(ne(ptr, strstr(why, "draining"), NULL), "%s", why);
    stop_engine();
}

Test(worker_metrics, a_step_longer_than_the_stall_limit_is_not_a_stall)
{
    cfg.engine.speedup = 0.0005; /* the 1 ms floor of a step: 2 s */
    start();
    forward(301, "a", 4);
    start_engine();
    set_serving();
    kvr_sleep_ns(KVR_WK_ENGINE_STALL_NS + 300 * KVR_NS_PER_MS);
    pthread_mutex_lock(&w.mu);
    uint32_t held = w.nreqs;
    pthread_mutex_unlock(&w.mu);
    cr_assert(eq(u32, held, 1), "still in its first step");
    char why[256] = "";
    cr_assert(kvr_wk_ready(&w, why, sizeof why), "%s", why);
    stop_engine();
}

Test(worker_metrics, an_engine_that_cannot_run_is_not_ready_within_the_limit)
{
    start();
    start_engine();
    set_serving();
    static const uint64_t hold = KVR_WK_ENGINE_STALL_NS + 500 * KVR_NS_PER_MS;
    pthread_t t = hold_for(&hold);
    char why[256] = "";
    kvr_sleep_ns(KVR_WK_ENGINE_STALL_NS + 100 * KVR_NS_PER_MS);
    uint64_t t0 = kvr_now_ns();
    cr_assert(not(kvr_wk_ready(&w, why, sizeof why)));
    cr_assert(lt(u64, kvr_now_ns() - t0, KVR_WK_LOCK_WAIT_NS / 2), "said without the lock");
    cr_assert(ne(ptr, strstr(why, "engine thread has not run for"), NULL), "%s", why);
    pthread_join(t, NULL);
    kvr_sleep_ns(KVR_WK_ENGINE_WAKE_NS + 100 * KVR_NS_PER_MS);
    cr_assert(kvr_wk_ready(&w, why, sizeof why), "ready again: %s", why);
    stop_engine();
}
