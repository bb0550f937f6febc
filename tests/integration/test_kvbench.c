/*
 * kvbench's own figures, against a real nats-server on 127.0.0.1 and a fake fleet written here
 * with nats.c: a router answering kv.default.generate (queue group kvrouter) at once with a
 * final chunk, a worker 77 answering its generate subject the same way, and routers answering
 * $SRV.STATS.kvrouter with the figures a test chooses. Each fake can fail a request by its id
 * (an error final, or no answer), so what kvbench makes of a failure is seen exactly:
 *
 * - hop's router_cpu_us_per_request is "na", with the reason on the routers line, when a router
 *   answered before the max-rate phase and not after, or when one router's (id, start) answers
 *   twice; it is a figure when the same routers answer both times (fakes, and a real kvrouter
 *   in front of a real kvworker --null);
 * - hop counts failed, timed-out and unanswered requests of both phases and exits 1;
 * - load (open loop) resends a stalled request while it still sends the later arrivals, not after
 *   the last one;
 * - the contract line says how many inbox messages nats.c dropped;
 * - load's time to first token is when position 0 came, not a later position held above it;
 * - load's inter-token gaps are those of the requests answered, as its other figures.
 */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "codec.h"
#include "harness.h"

#define FAKE_WORKER  77u
#define FAKE_ROUTERS 3

static struct nats_srv srv;
static natsConnection *nc;
static char dir[256]; /* a test's scratch directory, removed at its end */

/* How a fake router answers $SRV.STATS.kvrouter. */
enum stats_mode { STATS_NONE, STATS_ALWAYS, STATS_FIRST_ONLY, STATS_TWICE };

/* The fake fleet: what it does (set before kvbench starts) and what it saw (under mu). */
static struct {
    natsConnection *nc;
    natsSubscription *gen, *worker, *stats;
    pthread_mutex_t mu;
    enum stats_mode stats_mode[FAKE_ROUTERS]; /* routers fake-0, fake-1, ...: how they answer */
    uint32_t polls;                           /* $SRV.STATS asks heard */
    char drop_once[64];  /* the first copy of this request id gets no answer ("": none) */
    bool dropped;        /* ... it did */
    char error_id[64];   /* routed: this id ends ERR_OVERLOADED */
    char silent_id[64];  /* direct: this id never gets an answer */
    uint32_t rate_drop;  /* routed max-rate requests ("rate-...") left unanswered, the first ones */
    uint32_t rate_error; /* ... and then this many ended ERR_OVERLOADED */
    uint32_t rate_seen;  /* max-rate requests heard */
    uint32_t distinct;   /* routed requests heard, a resend not counted */
    uint32_t copies;     /* routed requests heard, resends too */
    uint32_t resent_at;  /* distinct requests heard when drop_once came again (0: it did not) */
    char late_first[64]; /* routed: this id's position 1 comes first, position 0 only 400 ms
                            later (with the rest and the final, as a repeat from 0) */
    char slow_fail[64];  /* routed: this id's token 0 comes at once, token 1 400 ms later, then
                            an error final */
} fake = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void setup(void)
{
    h_setup(&srv, 1, &nc);
}

static void teardown(void)
{
    h_teardown(&nc);
    h_rmdir(dir);
    dir[0] = 0;
}

TestSuite(kvbench, .init = setup, .fini = teardown, .timeout = 120);

/* A final chunk with max_tokens tokens (error: none, else that code and no tokens) to reply. */
static void answer(const char *reply, const char *id, uint32_t max_tokens, kvr_status error)
{
    uint32_t tok[64] = {0};
    struct kvr_buf b = {0};
    struct kvr_wire_chunk c = {.request_id = id,
                               .tokens = tok,
                               .ntokens = error ? 0 : (max_tokens < 64 ? max_tokens : 64),
                               .final = true,
                               .error = error,
                               .worker_id = error ? 0 : FAKE_WORKER};
    if (reply && kvr_wire_encode_chunk(&b, &c) == KVR_OK)
        natsConnection_Publish(fake.nc, reply, b.data, (int)b.len);
    kvr_buf_free(&b);
}

/* A chunk of n tokens from position pos (final or not, no error) of worker FAKE_WORKER. */
static void chunk(const char *reply, const char *id, uint32_t pos, uint32_t n, bool final)
{
    uint32_t tok[64] = {0};
    struct kvr_buf b = {0};
    struct kvr_wire_chunk c = {.request_id = id,
                               .tokens = tok,
                               .ntokens = n < 64 ? n : 64,
                               .position = pos,
                               .final = final,
                               .worker_id = FAKE_WORKER};
    if (reply && kvr_wire_encode_chunk(&b, &c) == KVR_OK)
        natsConnection_Publish(fake.nc, reply, b.data, (int)b.len);
    kvr_buf_free(&b);
}

/* Under fake.mu: what the fake router does with routed request id; KVR_OK answers it,
 * KVR_ERR_NOT_DELIVERED drops it, another code ends it with that code. */
static kvr_status routed_fate(const char *id)
{
    fake.copies++;
    if (fake.drop_once[0] && !strcmp(id, fake.drop_once)) {
        if (!fake.dropped) { /* its first copy: lost on its way, as far as kvbench can tell */
            fake.dropped = true;
            fake.distinct++;
            return KVR_ERR_NOT_DELIVERED;
        }
        if (!fake.resent_at)
            fake.resent_at = fake.distinct;
        return KVR_OK;
    }
    fake.distinct++;
    if (fake.error_id[0] && !strcmp(id, fake.error_id))
        return KVR_ERR_OVERLOADED;
    if (strncmp(id, "rate-", 5))
        return KVR_OK;
    uint32_t k = fake.rate_seen++;
    if (k < fake.rate_drop)
        return KVR_ERR_NOT_DELIVERED;
    return k < fake.rate_drop + fake.rate_error ? KVR_ERR_OVERLOADED : KVR_OK;
}

static void on_generate(natsConnection *c, natsSubscription *sub, natsMsg *m, void *ctx)
{
    (void)c, (void)sub, (void)ctx;
    struct kvr_wire_limits lim = {1u << 20, 65536};
    struct kvr_wire_request r = {0};
    if (kvr_wire_decode_generate(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), &lim, &r) ==
        KVR_OK) {
        pthread_mutex_lock(&fake.mu);
        kvr_status fate = routed_fate(r.request_id);
        bool late_first = fake.late_first[0] && !strcmp(r.request_id, fake.late_first);
        bool slow_fail = fake.slow_fail[0] && !strcmp(r.request_id, fake.slow_fail);
        pthread_mutex_unlock(&fake.mu);
        if (slow_fail) { /* a 400 ms gap, then the stream fails */
            chunk(natsMsg_GetReply(m), r.request_id, 0, 1, false);
            natsConnection_Flush(fake.nc);
            h_sleep_ms(400);
            chunk(natsMsg_GetReply(m), r.request_id, 1, 1, false);
            answer(natsMsg_GetReply(m), r.request_id, 0, KVR_ERR_OVERLOADED);
        } else if (late_first) { /* position 0 lost on its way, repeated 400 ms later */
            chunk(natsMsg_GetReply(m), r.request_id, 1, 1, false);
            natsConnection_Flush(fake.nc);
            h_sleep_ms(400);
            chunk(natsMsg_GetReply(m), r.request_id, 0, r.max_tokens, true);
        } else if (fate != KVR_ERR_NOT_DELIVERED)
            answer(natsMsg_GetReply(m), r.request_id, r.max_tokens, fate);
    }
    kvr_wire_request_free(&r);
    natsMsg_Destroy(m);
}

static void on_worker(natsConnection *c, natsSubscription *sub, natsMsg *m, void *ctx)
{
    (void)c, (void)sub, (void)ctx;
    struct kvr_wire_limits lim = {1u << 20, 65536};
    struct kvr_wire_request r = {0};
    uint64_t key = 0;
    uint32_t overlap = 0;
    if (kvr_wire_decode_worker_generate(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), &lim,
                                        &r, &key, &overlap) == KVR_OK &&
        (!fake.silent_id[0] || strcmp(r.request_id, fake.silent_id)))
        answer(natsMsg_GetReply(m), r.request_id, r.max_tokens, KVR_OK);
    kvr_wire_request_free(&r);
    natsMsg_Destroy(m);
}

/* Router k's $SRV.STATS answer at its poll-th ask: its CPU and decisions grow with every ask. */
static void stats_answer(const char *reply, int k, uint32_t poll)
{
    char json[1024];
    snprintf(json, sizeof json,
             "{\"type\": \"io.nats.micro.v1.stats_response\", \"name\": \"kvrouter\", "
             "\"id\": \"fake-%d\", \"version\": \"0.0.0\", \"started\": "
             "\"2026-01-01T00:00:00.000000001Z\", \"metadata\": {\"namespace\": \"default\", "
             "\"prefix\": \"kv\"}, \"endpoints\": [{\"name\": \"generate\", \"subject\": "
             "\"kv.default.generate\", \"num_requests\": 0, \"num_errors\": 0, \"data\": "
             "{\"decisions\": %u, \"cpu_seconds\": %.3f}}]}",
             k, 1000 * poll, 1.0 + poll);
    natsConnection_PublishString(fake.nc, reply, json);
}

static void on_stats(natsConnection *c, natsSubscription *sub, natsMsg *m, void *ctx)
{
    (void)c, (void)sub, (void)ctx;
    pthread_mutex_lock(&fake.mu);
    uint32_t poll = ++fake.polls;
    pthread_mutex_unlock(&fake.mu);
    for (int k = 0; k < FAKE_ROUTERS && natsMsg_GetReply(m); k++) {
        enum stats_mode mode = fake.stats_mode[k];
        if (mode == STATS_ALWAYS || mode == STATS_TWICE || (mode == STATS_FIRST_ONLY && poll == 1))
            stats_answer(natsMsg_GetReply(m), k, poll);
        if (mode == STATS_TWICE)
            stats_answer(natsMsg_GetReply(m), k, poll);
    }
    natsMsg_Destroy(m);
}

/* The fake fleet, as set in fake's fields: its subscriptions made and flushed. */
static void fake_start(void)
{
    fake.nc = h_connect(srv.url);
    cr_assert(fake.nc != NULL);
    cr_assert(
        eq(int,
           natsConnection_QueueSubscribe(&fake.gen, fake.nc, H_GEN, "kvrouter", on_generate, NULL),
           NATS_OK));
    cr_assert(eq(int,
                 natsConnection_Subscribe(&fake.worker, fake.nc, "kv.default.worker.77.generate",
                                          on_worker, NULL),
                 NATS_OK));
    cr_assert(eq(
        int, natsConnection_Subscribe(&fake.stats, fake.nc, "$SRV.STATS.kvrouter", on_stats, NULL),
        NATS_OK));
    cr_assert(eq(int, natsConnection_Flush(fake.nc), NATS_OK));
}

static void fake_stop(void)
{
    h_sub_close(fake.nc, fake.gen);
    h_sub_close(fake.nc, fake.worker);
    h_sub_close(fake.nc, fake.stats);
    natsConnection_Destroy(fake.nc);
    fake.nc = NULL;
}

/* kvbench --mode hop against the fake fleet (10 counted round trips of each kind, 1 s at the
 * highest rate); its exit status, its pid in *pid for its log. */
static int hop(pid_t *pid)
{
    const char *args[] = {
        "--nats",        srv.url, "--mode",       "hop", "--worker-id", "77",    "--requests", "10",
        "--hop-seconds", "1",     "--hop-window", "4",   "--log-level", "error", NULL};
    *pid = h_spawn("kvbench", args);
    return h_wait(*pid, 60000);
}

/* --- fix 1: router_cpu_us_per_request only from the same routers before and after ---------- */

Test(kvbench, hop_gives_the_routers_cpu_when_the_same_routers_answer)
{
    fake.stats_mode[0] = STATS_ALWAYS;
    fake.stats_mode[1] = STATS_ALWAYS;
    fake_start();
    pid_t b;
    int st = hop(&b);
    fake_stop();
    cr_expect(eq(int, st, 0), "kvbench --mode hop exited %d", st);
    cr_expect(h_log_has(b, " router_cpu_us_per_request="), "no router CPU in the summary line");
    cr_expect(eq(int, h_log_has(b, "router_cpu_us_per_request=na"), 0),
              "the same routers: a figure");
    cr_expect(h_log_has(b, "routers (max-rate phase): 2 answered  decisions=2000 "));
    cr_expect(h_log_has(b, "latency phase: routed failed=0 timed_out=0, direct failed=0 "
                           "timed_out=0 (of 10 each)"));
    cr_expect(h_log_has(b, " errors=0 unanswered=0\n"));
    cr_expect(h_log_has(b, " malformed=0 dropped=0 "), "the contract line counts inbox drops");
    h_end();
}

Test(kvbench, hop_cpu_is_na_when_a_router_answers_before_the_phase_only)
{
    fake.stats_mode[0] = STATS_ALWAYS;
    fake.stats_mode[1] = STATS_FIRST_ONLY; /* gone by the second poll: its CPU is not summed */
    fake_start();
    pid_t b;
    int st = hop(&b);
    fake_stop();
    cr_expect(eq(int, st, 0), "kvbench --mode hop exited %d", st);
    cr_expect(h_log_has(b, " router_cpu_us_per_request=na\n"), "a figure from half the routers");
    cr_expect(h_log_has(b, "routers (max-rate phase): 1 answered (2 before the run, 1 of them "
                           "not heard after it; 0 counted from start)"));
    cr_expect(h_log_has(b, "; router_cpu_us_per_request=na: 1 router(s) answered before the "
                           "phase and not after it\n"));
    h_end();
}

Test(kvbench, hop_counts_a_router_that_answers_twice_once)
{
    fake.stats_mode[0] = STATS_TWICE; /* the same (id, start) twice in each poll */
    fake_start();
    pid_t b;
    int st = hop(&b);
    fake_stop();
    cr_expect(eq(int, st, 0), "kvbench --mode hop exited %d", st);
    cr_expect(h_log_has(b, "routers (max-rate phase): 1 answered  decisions=1000 "),
              "one router's decisions, once");
    cr_expect(h_log_has(b, " router_cpu_us_per_request=na\n"));
    cr_expect(h_log_has(b, "; router_cpu_us_per_request=na: 2 answer(s) not counted: "));
    h_end();
}

Test(kvbench, hop_against_a_real_router_gives_its_cpu_and_no_failures)
{
    h_worker(srv.url, "1", 1, 200, H_ARGS("--null"));
    h_router(srv.url, "r1", H_ARGS("--gossip=false"));
    h_until_served(nc, H_GEN, 1, 15000);
    const char *args[] = {
        "--nats",        srv.url, "--mode",       "hop", "--worker-id", "1",     "--requests", "20",
        "--hop-seconds", "1",     "--hop-window", "8",   "--log-level", "error", NULL};
    pid_t b = h_spawn("kvbench", args);
    int st = h_wait(b, 60000);
    cr_expect(eq(int, st, 0), "kvbench --mode hop exited %d", st);
    cr_expect(h_log_has(b, " router_cpu_us_per_request="));
    cr_expect(eq(int, h_log_has(b, "router_cpu_us_per_request=na"), 0), "no router CPU read");
    cr_expect(h_log_has(b, "routers (max-rate phase): 1 answered  decisions="));
    cr_expect(h_log_has(b, "latency phase: routed failed=0 timed_out=0, direct failed=0 "
                           "timed_out=0 (of 20 each)"));
    cr_expect(h_log_has(b, " errors=0 unanswered=0\n"));
    h_end();
}

/* --- fix 3: hop counts what failed in both phases, and exits 1 ------------------------------ */

Test(kvbench, hop_counts_failed_and_unanswered_requests_and_fails)
{
    fake.stats_mode[0] = STATS_ALWAYS;
    snprintf(fake.error_id, sizeof fake.error_id, "hop-55");   /* a counted routed round trip */
    snprintf(fake.silent_id, sizeof fake.silent_id, "hop-57"); /* a counted direct one: 5 s */
    fake.rate_drop = 2;
    fake.rate_error = 1;
    fake_start();
    pid_t b;
    int st = hop(&b);
    fake_stop();
    cr_expect(eq(int, st, 1), "kvbench --mode hop exited %d, not 1, after failures", st);
    cr_expect(h_log_has(b, "latency phase: routed failed=1 timed_out=0, direct failed=0 "
                           "timed_out=1 (of 10 each)\n"));
    cr_expect(h_log_has(b, "latency phase errors: 7 ("));
    cr_expect(h_log_has(b, "hop: 9 routed and 9 direct round trips"), "the sample leaves them out");
    cr_expect(h_log_has(b, " errors=1 unanswered=2\n"), "the max-rate phase's failures");
    cr_expect(h_log_has(b, " in flight (1 errors, 2 unanswered)\n"));
    cr_expect(h_log_has(b, "max-rate phase errors: 7 ("));
    cr_expect(h_log_has(b, " unanswered=2 malformed=0 dropped=0 "), "the contract line");
    cr_expect(h_log_has(b, "hop: FAIL"));
    h_end();
}

/* --- fix 2: open loop resends while it still sends ---------------------------------------- */

/* A trace of n requests (16 prompt tokens, 2 out) every gap_ms from 0, into path. */
static void write_trace(const char *path, int n, int gap_ms)
{
    FILE *f = fopen(path, "w");
    cr_assert(f != NULL, "cannot write %s", path);
    for (int i = 0; i < n; i++)
        fprintf(f,
                "{\"timestamp\": %d, \"input_length\": 16, \"output_length\": 2, "
                "\"hash_ids\": [%d]}\n",
                i * gap_ms, i);
    cr_assert(eq(int, fclose(f), 0));
}

Test(kvbench, load_resends_a_stalled_request_before_the_last_arrival)
{
    enum { N = 30, GAP_MS = 200 }; /* arrivals over 5.8 s; the first request resent after 1 s */
    char trace[512];
    h_tmpdir(dir, sizeof dir, "trace");
    snprintf(trace, sizeof trace, "%s/trace.jsonl", dir);
    write_trace(trace, N, GAP_MS);
    fake.stats_mode[0] = STATS_ALWAYS;
    snprintf(fake.drop_once, sizeof fake.drop_once, "b1-0"); /* run 1's first request */
    fake_start();
    const char *args[] = {"--nats",       srv.url, "--workload",  "conversation",
                          "--trace",      trace,   "--requests",  "30",
                          "--rate-scale", "1",     "--resend-ms", "1000",
                          "--policies",   "kv",    "--workers",   "1",
                          "--log-level",  "error", NULL};
    pid_t b = h_spawn("kvbench", args);
    int st = h_wait(b, 60000);
    fake_stop();
    cr_expect(eq(int, st, 0), "kvbench --mode load exited %d", st);
    cr_expect(h_log_has(b, "finished=30 failed=0"), "every request answered, the first resent");
    cr_expect(h_log_has(b, " unanswered=0 malformed=0 dropped=0 "), "the contract line");
    pthread_mutex_lock(&fake.mu);
    uint32_t at = fake.resent_at, distinct = fake.distinct, copies = fake.copies;
    pthread_mutex_unlock(&fake.mu);
    cr_expect(eq(u32, distinct, N));
    cr_expect(eq(u32, copies, N + 1), "the first request sent once more, nothing else");
    cr_expect(gt(u32, at, 0), "the stalled request was never resent");
    cr_expect(lt(u32, at, N),
              "the stalled request was resent after the last arrival (%u of %d "
              "requests heard by then), not while kvbench still sent",
              at, N);
    h_end();
}

/* --- fix 4: the time to first token is when position 0 came, not a later position -------- */

/* results[0]'s member path (ttft_ms.mean) of report.json in out_dir. */
static double report_value(const char *out_dir, const char *path)
{
    char file[600];
    snprintf(file, sizeof file, "%s/report.json", out_dir);
    json_t *root = json_load_file(file, 0, NULL);
    cr_assert(root != NULL, "no %s", file);
    json_t *v = h_json_at(json_array_get(json_object_get(root, "results"), 0), path);
    bool number = json_is_number(v);
    cr_assert(number, "no %s in %s", path, file);
    double x = json_number_value(v);
    json_decref(root);
    return x;
}

/* kvbench --mode load of a trace of n requests against the fake router (its faults set by the
 * caller), its report into out (len bytes); its pid, once it exited (0 expected). */
static pid_t load_against_fake(int n, char *out, size_t len)
{
    char trace[512];
    h_tmpdir(dir, sizeof dir, "trace");
    snprintf(trace, sizeof trace, "%s/trace.jsonl", dir);
    snprintf(out, len, "%s/out", dir);
    write_trace(trace, n, 0);
    fake.stats_mode[0] = STATS_ALWAYS;
    fake_start();
    const char *args[] = {"--nats",    srv.url, "--workload",  "conversation", "--trace",
                          trace,       "--out", out,           "--policies",   "kv",
                          "--workers", "1",     "--log-level", "error",        NULL};
    pid_t b = h_spawn("kvbench", args);
    int st = h_wait(b, 60000);
    fake_stop();
    cr_expect(eq(int, st, 0), "kvbench --mode load exited %d", st);
    return b;
}

Test(kvbench, load_ttft_waits_for_position_0_when_a_later_one_comes_first)
{
    char out[512];
    snprintf(fake.late_first, sizeof fake.late_first, "b1-0");
    pid_t b = load_against_fake(1, out, sizeof out);
    cr_expect(h_log_has(b, "finished=1 failed=0"));
    double ttft = report_value(out, "ttft_ms.mean"), e2e = report_value(out, "e2e_ms.mean");
    cr_expect(ge(dbl, ttft, 400.0),
              "time to first token %.1f ms: position 1 came at once, position 0 400 ms later",
              ttft);
    cr_expect(ge(dbl, e2e, ttft));
    h_end();
}

/* --- fix 5: the inter-token latency leaves out the failed requests, as the other figures ---- */

Test(kvbench, load_itl_leaves_out_the_gaps_of_a_failed_request)
{
    char out[512];
    snprintf(fake.slow_fail, sizeof fake.slow_fail, "b1-1");
    pid_t b = load_against_fake(2, out, sizeof out);
    cr_expect(h_log_has(b, "finished=1 failed=1"));
    double itl = report_value(out, "itl_ms.p99");
    cr_expect(lt(dbl, itl, 400.0),
              "inter-token p99 %.1f ms: the 400 ms gap of the failed request, left out of its "
              "time to first token and end-to-end latency",
              itl);
    h_end();
}
