/*
 * The client contract (docs/protocol.md) against a real fleet: two routers and two workers on one
 * nats-server (127.0.0.1, a free port). Every stream is checked as a strict client checks it:
 * positions without gaps (repeats aside), one worker, one final chunk, nothing after it. Resends
 * at several timings, cancels, deadlines, a worker lost, a duplicate worker id, no router, the
 * limits a router announces.
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "harness.h"

#define GEN H_GEN

static struct nats_srv srv;
static natsConnection *nc;

static void setup(void)
{
    h_setup(&srv, 1, &nc);
}

static void teardown(void)
{
    h_teardown(&nc);
}

TestSuite(contract, .init = setup, .fini = teardown, .timeout = 180);

/* Two routers and two workers (speed-up s), serving. */
static void fleet(int speedup)
{
    h_router(srv.url, "ra", H_ARGS("--hello-ms", "200"));
    h_router(srv.url, "rb", H_ARGS("--hello-ms", "200"));
    h_worker(srv.url, "1", speedup, 500, NULL);
    h_worker(srv.url, "2", speedup, 500, NULL);
    h_until_served(nc, GEN, 2, 15000);
}

/* A stream as a strict client sees it. */
struct stream {
    natsSubscription *sub;
    char inbox[128];
    uint8_t data[8192];
    int len;
    uint32_t have;     /* tokens in order so far */
    uint32_t finals;   /* final chunks (repeats of the final counted apart) */
    uint32_t repeats;  /* chunks starting below what we had */
    uint32_t gaps;     /* chunks starting above what we had */
    uint32_t after;    /* non-repeat chunks after the final */
    uint32_t code;     /* the first final's error code */
    uint64_t worker;   /* the first chunk's worker */
    uint32_t workers;  /* chunks from another worker */
    uint64_t final_ms; /* when the final came */
};

/* Subscribe a fresh inbox and send a request of n tokens (base) wanting max_tokens, with extra
 * GenerateRequest fields appended (extra_len bytes, may be 0). */
static void start(struct stream *s, const char *id, uint32_t base, uint32_t n, uint32_t max_tokens,
                  const uint8_t *extra, int extra_len)
{
    memset(s, 0, sizeof *s);
    natsInbox *ib = NULL;
    natsInbox_Create(&ib);
    snprintf(s->inbox, sizeof s->inbox, "%s", ib);
    natsInbox_Destroy(ib);
    cr_assert(eq(int, natsConnection_SubscribeSync(&s->sub, nc, s->inbox), NATS_OK));
    natsSubscription_SetPendingLimits(s->sub, -1, -1);
    uint32_t t[2048];
    cr_assert(n <= 2048);
    for (uint32_t i = 0; i < n; i++)
        t[i] = base * 7919u + i;
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_generate(&b, id, t, n, max_tokens, NULL), KVR_OK));
    cr_assert(b.len + (size_t)extra_len <= sizeof s->data);
    memcpy(s->data, b.data, b.len);
    if (extra_len)
        memcpy(s->data + b.len, extra, (size_t)extra_len);
    s->len = (int)b.len + extra_len;
    kvr_buf_free(&b);
}

static void send_again(struct stream *s)
{
    cr_assert(eq(int, natsConnection_PublishRequest(nc, GEN, s->inbox, s->data, s->len), NATS_OK));
}

/* Read one chunk (at most ms); false when none came. */
static bool read_one(struct stream *s, int64_t ms)
{
    natsMsg *m = NULL;
    if (ms <= 0 || natsSubscription_NextMsg(&m, s->sub, ms) != NATS_OK)
        return false;
    struct kvr_wire_response r;
    cr_assert(eq(int,
                 kvr_wire_decode_response(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), &r),
                 KVR_OK));
    if (!s->worker)
        s->worker = r.worker_id;
    s->workers += r.worker_id != s->worker;
    bool repeat = r.position < s->have || (s->finals && r.position + r.ntokens <= s->have);
    s->repeats += repeat;
    s->gaps += r.position > s->have;
    if (!repeat && r.position == s->have)
        s->have += r.ntokens;
    if (r.final && !s->finals) {
        s->code = r.error_code;
        s->final_ms = h_now_ms();
    }
    if (s->finals && !repeat)
        s->after++;
    s->finals += r.final && !(s->finals && repeat);
    kvr_wire_response_free(&r);
    natsMsg_Destroy(m);
    return true;
}

/* Read until the final chunk (at most timeout_ms), then linger_ms more for anything extra. */
static void finish(struct stream *s, int timeout_ms, int linger_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;
    while (!s->finals && read_one(s, (int64_t)end - (int64_t)h_now_ms()))
        ;
    end = h_now_ms() + (uint64_t)linger_ms;
    while (read_one(s, (int64_t)end - (int64_t)h_now_ms()))
        ;
    h_sub_close(nc, s->sub);
    s->sub = NULL;
}

/* The stream was one complete answer of `tokens` tokens. */
static void one_answer(const struct stream *s, uint32_t tokens, const char *what)
{
    cr_assert(eq(u32, s->finals, 1), "%s: %u final chunks", what, s->finals);
    cr_assert(eq(u32, s->code, 0), "%s: error %u", what, s->code);
    cr_assert(eq(u32, s->have, tokens), "%s: %u of %u tokens", what, s->have, tokens);
    cr_assert(eq(u32, s->gaps + s->workers + s->after, 0),
              "%s: gaps %u, chunks of a second worker %u, chunks after the final %u", what, s->gaps,
              s->workers, s->after);
}

enum timing { T_0MS, T_1MS, T_DECODING, T_AFTER_END, T_COUNT };
static const char *const timing_names[T_COUNT] = {"0 ms", "1 ms", "while decoding",
                                                  "after the end"};

Test(contract, a_resend_at_any_moment_is_answered_once)
{
    fleet(20);
    int trials = getenv("KVR_CONTRACT_TRIALS") ? atoi(getenv("KVR_CONTRACT_TRIALS")) : 25;
    for (int t = 0; t < T_COUNT; t++) {
        for (int i = 0; i < trials; i++) {
            struct stream s;
            char id[64];
            snprintf(id, sizeof id, "resend-%d-%d", t, i);
            start(&s, id, (uint32_t)(t * 1000 + i), 256, 24, NULL, 0);
            send_again(&s);
            if (t == T_0MS)
                send_again(&s);
            else if (t == T_1MS)
                nats_Sleep(1), send_again(&s);
            uint64_t end = h_now_ms() + 20000;
            if (t == T_DECODING) {
                while (!s.have && read_one(&s, (int64_t)end - (int64_t)h_now_ms()))
                    ;
                send_again(&s);
            }
            if (t == T_AFTER_END) {
                while (!s.finals && read_one(&s, (int64_t)end - (int64_t)h_now_ms()))
                    ;
                send_again(&s);
            }
            finish(&s, 20000, 150);
            char what[96];
            snprintf(what, sizeof what, "resend %s, trial %d", timing_names[t], i);
            one_answer(&s, 24, what);
        }
        fprintf(stderr, "  resend %-15s %d trials, each one answer\n", timing_names[t], trials);
    }
    h_end();
}

/*
 * Watch the workers' events on subject (into *ev), then send a request of 256 tokens (base)
 * wanting max_tokens that nobody listens for yet: the server drops its chunks, as a cluster node
 * that has not heard of the inbox does.
 */
static void send_unheard(struct stream *s, const char *subject, natsSubscription **ev,
                         const char *id, uint32_t base, uint32_t max_tokens)
{
    cr_assert(eq(int, natsConnection_SubscribeSync(ev, nc, subject), NATS_OK));
    natsSubscription_SetPendingLimits(*ev, -1, -1);
    start(s, id, base, 256, max_tokens, NULL, 0);
    h_sub_close(nc, s->sub); /* unsubscribed and flushed: nothing more reaches it */
    s->sub = NULL;
    send_again(s);
}

/* From now on, s's inbox is listened to. */
static void listen_now(struct stream *s)
{
    cr_assert(eq(int, natsConnection_SubscribeSync(&s->sub, nc, s->inbox), NATS_OK));
    natsSubscription_SetPendingLimits(s->sub, -1, -1);
    natsConnection_Flush(nc);
}

/* Wait (at most ms) on sub (kv.default.ev.*.done) for a done of a request that streamed tokens. */
static bool done_of(natsSubscription *sub, uint32_t tokens, int ms)
{
    uint64_t end = h_now_ms() + (uint64_t)ms;
    natsMsg *m = NULL;
    while (natsSubscription_NextMsg(&m, sub, (int64_t)end - (int64_t)h_now_ms() + 1) == NATS_OK) {
        struct kvr_wire_done d;
        bool mine = kvr_wire_decode_done(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m),
                                         &d) == KVR_OK &&
                    d.output_tokens == tokens;
        natsMsg_Destroy(m);
        if (mine)
            return true;
    }
    return false;
}

Test(contract, a_stream_lost_whole_comes_again_on_a_resend)
{
    fleet(20);
    natsSubscription *dones = NULL;
    struct stream s;
    send_unheard(&s, "kv.default.ev.*.done", &dones, "lost-whole", 4242, 24); /* final included */
    cr_assert(done_of(dones, 24, 20000), "the request never ended on its worker");
    h_sub_close(nc, dones);
    listen_now(&s);
    send_again(&s); /* nothing came for a while: the client resends */
    uint64_t end = h_now_ms() + 5000;
    while (!s.finals && read_one(&s, (int64_t)end - (int64_t)h_now_ms()))
        ;
    send_again(&s); /* again at once: its worker repeats a stream once a second at most */
    finish(&s, 5000, 500);
    one_answer(&s, 24, "a resend of a stream lost whole");
    cr_assert(eq(u32, s.repeats, 0), "%u repeats: a resend repeats the stream once", s.repeats);
    fprintf(stderr, "  a stream lost whole: the whole stream again on the resend, once\n");
    h_end();
}

/* The router's count `key` of its $SRV.STATS data (the first endpoint's). */
static uint64_t router_stat(const char *key)
{
    json_t *stats = h_stats(nc, 2000);
    char path[96];
    snprintf(path, sizeof path, "data.%s", key);
    uint64_t v = h_json_u64(h_endpoint(stats, "generate"), path);
    json_decref(stats);
    return v;
}

/* A stream lost whole whose worker then left (drained and exited, as in a rolling restart):
 * nobody can repeat it, so the resend is answered at once with a final ERR_WORKER_LOST naming
 * that worker, and the client tries again, instead of resending into silence until it gives up. */
Test(contract, a_stream_lost_whole_whose_worker_left_is_answered_worker_lost)
{
    h_router(srv.url, "ra", NULL);
    pid_t w = h_worker(srv.url, "1", 20, 200, NULL);
    h_until_served(nc, GEN, 1, 15000);
    natsSubscription *dones = NULL;
    struct stream s;
    send_unheard(&s, "kv.default.ev.*.done", &dones, "left-after", 4343, 24);
    cr_assert(done_of(dones, 24, 20000), "the request never ended on its worker");
    h_sub_close(nc, dones);
    h_signal(w, SIGTERM); /* nothing in flight: it drains at once and exits */
    cr_assert(eq(int, h_wait(w, 10000), 0));
    uint64_t until = h_now_ms() + 10000; /* its silence (3 heartbeats) tells the router */
    while (router_stat("workers_left") < 1 && h_now_ms() < until)
        h_sleep_ms(100);
    cr_assert(eq(u64, router_stat("workers_left"), 1), "the router never saw the worker leave");
    listen_now(&s);
    uint64_t t0 = h_now_ms();
    send_again(&s); /* nothing came: the client resends, within 10 s of the end */
    finish(&s, 3000, 300);
    cr_assert(eq(u32, s.finals, 1), "no final chunk: the resend went unanswered");
    cr_assert(eq(u32, s.code, KVR_ERR_WORKER_LOST));
    cr_assert(eq(u64, s.worker, 1), "the final chunk names the worker that left");
    fprintf(stderr, "  a stream lost whole, its worker gone: worker lost after %llu ms\n",
            (unsigned long long)(s.final_ms - t0));
    cr_assert(eq(u64, router_stat("resends_worker_gone"), 1));
    h_end();
}

/* Wait (at most ms) on sub (kv.default.ev.*.tokens) until one request took n output blocks. */
static bool output_blocks(natsSubscription *sub, uint32_t n, int ms)
{
    uint64_t end = h_now_ms() + (uint64_t)ms, key = 0;
    uint32_t seen = 0;
    natsMsg *m = NULL;
    while (seen < n &&
           natsSubscription_NextMsg(&m, sub, (int64_t)end - (int64_t)h_now_ms() + 1) == NATS_OK) {
        struct kvr_wire_tokens t;
        if (kvr_wire_decode_tokens(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), &t) ==
                KVR_OK &&
            t.kind == KVR_WIRE_OUTPUT_BLOCK && (!key || t.key == key)) {
            key = t.key;
            seen++;
        }
        natsMsg_Destroy(m);
    }
    return seen == n;
}

Test(contract, a_stream_that_lost_its_first_chunks_is_filled_by_a_resend)
{
    fleet(2); /* slow: the stream is still going when the resend comes */
    natsSubscription *ev = NULL;
    struct stream s;
    send_unheard(&s, "kv.default.ev.*.tokens", &ev, "lost-head", 4343, 300);
    /* two output blocks: more than a block of tokens (64) went out to nobody */
    cr_assert(output_blocks(ev, 2, 20000), "the request never took two output blocks");
    h_sub_close(nc, ev);
    listen_now(&s);
    cr_assert(read_one(&s, 10000), "no chunk after subscribing");
    cr_assert(gt(u32, s.gaps, 0), "the first chunk seen starts above position 0: a gap");
    send_again(&s); /* positions missing: the client resends */
    finish(&s, 30000, 300);
    cr_assert(eq(u32, s.finals, 1), "%u final chunks", s.finals);
    cr_assert(eq(u32, s.code, 0));
    cr_assert(eq(u32, s.have, 300),
              "%u of 300 tokens in order from position 0: the repeat did "
              "not fill the gap",
              s.have);
    cr_assert(eq(u32, s.workers + s.after, 0));
    cr_assert(s.final_ms != 0);
    fprintf(stderr, "  a stream that lost its first chunks: filled by one repeat on the resend\n");
    h_end();
}

/* A GenerateRequest's deadline_ms (field 5) as bytes to append. */
static int deadline_field(uint8_t *out, uint32_t ms)
{
    int n = 0;
    out[n++] = 0x28;
    do {
        out[n++] = (uint8_t)((ms & 0x7f) | (ms > 0x7f ? 0x80 : 0));
        ms >>= 7;
    } while (ms);
    return n;
}

static void cancel(const struct stream *s, const char *id)
{
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_cancel(&b, id, s->inbox), KVR_OK));
    h_publish(nc, "kv.default.cancel", &b);
    kvr_buf_free(&b);
}

Test(contract, a_cancel_or_a_deadline_ends_the_stream_once)
{
    fleet(1); /* real time: 20,000 tokens take minutes */
    struct stream s;
    start(&s, "long", 1, 128, 20000, NULL, 0);
    send_again(&s);
    uint64_t end = h_now_ms() + 20000;
    while (s.have < 10 && read_one(&s, (int64_t)end - (int64_t)h_now_ms()))
        ;
    cr_assert(ge(u32, s.have, 10));
    uint64_t t0 = h_now_ms();
    cancel(&s, "long");
    finish(&s, 5000, 300);
    cr_assert(eq(u32, s.finals, 1));
    cr_assert(eq(u32, s.code, KVR_ERR_CANCELLED));
    cr_assert(eq(u32, s.gaps + s.after + s.workers, 0));
    fprintf(stderr, "  cancel at token 10: final after %llu ms, %u tokens in all\n",
            (unsigned long long)(s.final_ms - t0), s.have);
    start(&s, "early", 2, 128, 20000, NULL, 0); /* the cancel comes first */
    cancel(&s, "early");
    nats_Sleep(50);
    send_again(&s);
    finish(&s, 5000, 200);
    cr_assert(eq(u32, s.finals, 1));
    cr_assert(eq(u32, s.code, KVR_ERR_CANCELLED));
    cr_assert(eq(u32, s.have, 0));
    uint8_t f[8];
    t0 = h_now_ms(); /* before the first send: the deadline runs from the first router's receipt */
    start(&s, "hurry", 3, 128, 20000, f, deadline_field(f, 300));
    send_again(&s);
    finish(&s, 5000, 200);
    cr_assert(eq(u32, s.finals, 1));
    cr_assert(eq(u32, s.code, KVR_ERR_DEADLINE));
    cr_assert(ge(u64, s.final_ms - t0, 300), "not before its deadline");
    fprintf(stderr, "  deadline 300 ms: final after %llu ms\n",
            (unsigned long long)(s.final_ms - t0));
    json_t *stats = h_stats(nc, 2000);
    cr_assert(ne(ptr, stats, NULL));
    json_decref(stats);
    h_end();
}

Test(contract, a_dead_worker_is_named_within_two_seconds_and_a_clash_refused)
{
    h_router(srv.url, "ra", H_ARGS("--hello-ms", "200"));
    pid_t w = h_worker(srv.url, "1", 1, 500, NULL);
    h_until_served(nc, GEN, 1, 15000);
    pid_t twin = h_worker(srv.url, "1", 1, 500, NULL); /* the same id: refused */
    cr_assert(h_wait(twin, 10000) > 0, "a second worker with the same id exits with an error");
    struct stream s;
    start(&s, "doomed", 1, 128, 20000, NULL, 0);
    send_again(&s);
    uint64_t end = h_now_ms() + 20000;
    while (s.have < 5 && read_one(&s, (int64_t)end - (int64_t)h_now_ms()))
        ;
    uint64_t t0 = h_now_ms();
    h_signal(w, SIGKILL);
    h_wait(w, 5000);
    natsMsg *m = NULL;
    struct kvr_wire_response r = {0};
    while (natsSubscription_NextMsg(&m, s.sub, 10000) == NATS_OK) {
        cr_assert(eq(
            int, kvr_wire_decode_response(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), &r),
            KVR_OK));
        natsMsg_Destroy(m);
        if (r.final)
            break;
        kvr_wire_response_free(&r);
    }
    uint64_t took = h_now_ms() - t0;
    cr_assert(r.final, "no final chunk after the worker died");
    cr_assert(eq(u32, r.error_code, KVR_ERR_WORKER_LOST));
    cr_assert(eq(u64, r.worker_id, 1), "the final chunk names the dead worker");
    fprintf(stderr, "  worker lost: told after %llu ms\n", (unsigned long long)took);
    cr_assert(lt(u64, took, 5000),
              "well within the resend advice's reach (2 s on a quiet machine)");
    kvr_wire_response_free(&r);
    h_sub_close(nc, s.sub);
    h_end();
}

/* A worker paused past its window (SIGSTOP) is written off and its client answered worker lost;
 * once it runs again it stops that stream silently (the router tells it to) instead of streaming
 * on to a second final (seen: tokens again at once, a final OK at the end). */
Test(contract, a_paused_worker_written_off_does_not_stream_on_to_a_second_final)
{
    h_router(srv.url, "ra", NULL);
    pid_t w = h_worker(srv.url, "1", 1, 200, NULL); /* beats at 200 ms: written off after 640 */
    h_until_served(nc, GEN, 1, 15000);
    struct stream s;
    start(&s, "paused", 1, 128, 20000, NULL, 0);
    send_again(&s);
    uint64_t end = h_now_ms() + 20000;
    while (s.have < 5 && read_one(&s, (int64_t)end - (int64_t)h_now_ms()))
        ;
    h_signal(w, SIGSTOP);
    natsMsg *m = NULL;
    struct kvr_wire_response r = {0};
    int finals = 0;
    while (!finals && natsSubscription_NextMsg(&m, s.sub, 10000) == NATS_OK) {
        cr_assert(eq(
            int, kvr_wire_decode_response(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), &r),
            KVR_OK));
        natsMsg_Destroy(m);
        if (r.final) {
            finals++;
            cr_assert(eq(u32, r.error_code, KVR_ERR_WORKER_LOST));
        }
        kvr_wire_response_free(&r);
    }
    cr_assert(eq(int, finals, 1), "the client was answered while the worker was stopped");
    h_signal(w, SIGCONT);
    /* 4 s: at the simulated engine's pace some 600 more tokens, were it to stream on */
    uint64_t until = h_now_ms() + 4000;
    int after = 0;
    while (h_now_ms() < until) {
        if (natsSubscription_NextMsg(&m, s.sub, 200) != NATS_OK)
            continue;
        cr_assert(eq(
            int, kvr_wire_decode_response(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), &r),
            KVR_OK));
        natsMsg_Destroy(m);
        finals += r.final;
        after += (int)r.ntokens;
        kvr_wire_response_free(&r);
    }
    fprintf(stderr, "  a paused worker: %d tokens after its resume\n", after);
    cr_assert(eq(int, finals, 1), "no second final: the worker stopped it");
    cr_assert(lt(int, after, 100), "it stopped at once (%d tokens after its resume)", after);
    h_sub_close(nc, s.sub);
    h_end();
}

Test(contract, nobody_serving_is_a_503_and_a_router_announces_its_limits)
{
    natsMsg *m = NULL;
    natsStatus st = natsConnection_Request(&m, nc, "kv.nobody.generate", "x", 1, 2000);
    cr_assert(eq(int, st, NATS_NO_RESPONDERS), "no router: NATS answers 'no responders' (503)");
    h_router(srv.url, "ra", H_ARGS("--namespace", "limits", "--max-output-tokens", "999"));
    for (int i = 0; i < 100 && st != NATS_OK; i++) { /* until it serves $SRV */
        st = natsConnection_Request(&m, nc, "$SRV.INFO.kvrouter", "", 0, 1000);
        if (st != NATS_OK)
            nats_Sleep(100);
    }
    cr_assert(eq(int, st, NATS_OK), "the router never answered $SRV.INFO");
    json_error_t err;
    json_t *o = json_loadb(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), 0, &err);
    natsMsg_Destroy(m);
    cr_assert(ne(ptr, o, NULL));
    json_t *meta = json_object_get(o, "metadata");
    cr_assert(eq(str, (char *)json_string_value(json_object_get(meta, "namespace")), "limits"));
    cr_assert(
        eq(str, (char *)json_string_value(json_object_get(meta, "max_output_tokens")), "999"));
    const char *bytes = json_string_value(json_object_get(meta, "max_request_bytes"));
    cr_assert(ne(ptr, (void *)bytes, NULL));
    /* what both the decoders (1,048,576 tokens at 5 bytes, and slack) and the 8 MB max_payload
     * take, less the most a forward adds */
    struct kvr_wire_limits lim = {1u << 20, 999};
    uint64_t cap = kvr_wire_request_cap(&lim), payload = 8u << 20;
    cr_assert(eq(u64, strtoull(bytes, NULL, 10),
                 (cap < payload ? cap : payload) - KVR_WIRE_FORWARD_ENVELOPE));
    json_decref(o);
    h_end();
}
