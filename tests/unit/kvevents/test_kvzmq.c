/*
 * kvzmq: the publisher and the subscriber over real ZeroMQ sockets on 127.0.0.1 ephemeral ports:
 * in-order delivery, a dropped batch filled from the replay socket (timed), a gap older than the
 * ring, no replay endpoint, a replay that never answers, too many batches held, an engine
 * restarted on the same endpoints, a 10,000-block burst from four threads, garbage on the PUB and
 * the replay sockets, undecodable payloads, prompt close. A recorder checks on every call that
 * seqs only ever go up between two resets.
 */
#include <criterion/criterion.h>
#include "../../criterion_gt.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "clock.h"
#include "kvzmq.h"

#define WAIT_MS 5000

/* Time bounds stretch under valgrind (meson test --setup=valgrind sets KVR_VALGRIND). */
static double slow(void)
{
    return getenv("KVR_VALGRIND") ? 20.0 : 1.0;
}

/* ---- the recorder --------------------------------------------------------------------------- */

#define REC_MAX 20000

struct rec {
    pthread_mutex_t mu;
    uint64_t seq[REC_MAX];
    uint64_t first_hash[REC_MAX];
    uint32_t nblocks[REC_MAX];
    bool replayed[REC_MAX];
    uint64_t at_ns[REC_MAX];
    uint32_t n;
    uint32_t resets;
    const char *why[16];
    uint32_t reset_at[16]; /* n when the reset came */
    uint32_t bads;
    kvr_status last_bad;
    bool steal;        /* take the batch's arrays (and free them) */
    uint64_t slow_ns;  /* time each batch takes the hook (a consumer slower than the engine) */
    bool order_broken; /* a seq not above the one before it since the last reset */
};

static struct rec *rec_new(void)
{
    struct rec *r = calloc(1, sizeof *r);
    cr_assert(r != NULL);
    pthread_mutex_init(&r->mu, NULL);
    return r;
}

static void on_batch(void *ctx, uint64_t seq, struct kvr_kvev_batch *b, bool replayed)
{
    struct rec *r = ctx;
    pthread_mutex_lock(&r->mu);
    uint32_t since = r->resets ? r->reset_at[(r->resets - 1) % 16] : 0;
    if (r->n > since && seq <= r->seq[r->n - 1])
        r->order_broken = true;
    if (r->n < REC_MAX) {
        r->seq[r->n] = seq;
        uint32_t blocks = 0;
        for (uint32_t i = 0; i < b->nevents; i++)
            blocks += b->events[i].nhashes;
        r->nblocks[r->n] = blocks;
        r->first_hash[r->n] = b->nevents && b->events[0].nhashes ? b->events[0].hashes[0] : 0;
        r->replayed[r->n] = replayed;
        r->at_ns[r->n] = kvr_now_ns();
        r->n++;
    }
    bool steal = r->steal;
    uint64_t slow_ns = r->slow_ns;
    pthread_mutex_unlock(&r->mu);
    if (slow_ns)
        kvr_sleep_ns(slow_ns);
    if (steal) {
        struct kvr_kvev_batch mine = *b;
        *b = (struct kvr_kvev_batch){0};
        kvr_kvev_batch_free(&mine);
    }
}

static void on_reset(void *ctx, const char *why)
{
    struct rec *r = ctx;
    pthread_mutex_lock(&r->mu);
    r->why[r->resets % 16] = why;
    r->reset_at[r->resets % 16] = r->n;
    r->resets++;
    pthread_mutex_unlock(&r->mu);
}

static void on_bad(void *ctx, uint64_t seq, kvr_status st)
{
    struct rec *r = ctx;
    pthread_mutex_lock(&r->mu);
    r->bads++;
    r->last_bad = st;
    pthread_mutex_unlock(&r->mu);
}

static uint32_t rec_n(struct rec *r)
{
    pthread_mutex_lock(&r->mu);
    uint32_t n = r->n;
    pthread_mutex_unlock(&r->mu);
    return n;
}

static bool wait_n(struct rec *r, uint32_t n, uint32_t ms)
{
    uint64_t end = kvr_now_ns() + ms * KVR_NS_PER_MS;
    while (rec_n(r) < n && kvr_now_ns() < end)
        kvr_sleep_ns(KVR_NS_PER_MS / 2);
    return rec_n(r) >= n;
}

/* A uint64_t counter at offset off of a subscriber's or a publisher's stats. */
static uint64_t sub_stat(void *obj, size_t off)
{
    struct kvr_kvsub_stats st;
    kvr_kvsub_stats(obj, &st);
    uint64_t v;
    memcpy(&v, (char *)&st + off, sizeof v);
    return v;
}

static uint64_t pub_stat(void *obj, size_t off)
{
    struct kvr_kvpub_stats st;
    kvr_kvpub_stats(obj, &st);
    uint64_t v;
    memcpy(&v, (char *)&st + off, sizeof v);
    return v;
}

/* Wait until the counter get(obj, off) reaches want: counters are updated on the sockets'
 * threads, some only after the batch they count was delivered. */
static bool wait_stat(uint64_t (*get)(void *, size_t), void *obj, size_t off, uint64_t want,
                      uint32_t ms)
{
    uint64_t end = kvr_now_ns() + ms * KVR_NS_PER_MS;
    for (;;) {
        if (get(obj, off) >= want)
            return true;
        if (kvr_now_ns() >= end)
            return false;
        kvr_sleep_ns(KVR_NS_PER_MS / 2);
    }
}
#define WAIT_STAT(s, field, want)                                                                  \
    wait_stat(sub_stat, s, offsetof(struct kvr_kvsub_stats, field), want, WAIT_MS)
/* the publisher counts a batch as sent once its send returned, so its delivery can come first */
#define WAIT_SENT(p, want)                                                                         \
    wait_stat(pub_stat, p, offsetof(struct kvr_kvpub_stats, sent), want, WAIT_MS)

/* ---- set-up --------------------------------------------------------------------------------- */

/* A payload: one Stored event of n blocks, hashes first..first+n-1, 4 tokens a block. */
static void payload(struct kvr_buf *out, uint64_t first, uint32_t n)
{
    uint64_t h[64];
    uint32_t t[256];
    cr_assert(n <= 64);
    for (uint32_t i = 0; i < n; i++)
        h[i] = first + i;
    for (uint32_t i = 0; i < n * 4; i++)
        t[i] = i;
    struct kvr_kvev_event e = {.kind = KVR_KVEV_STORED,
                               .hashes = h,
                               .nhashes = n,
                               .tokens = t,
                               .ntokens = n * 4,
                               .block_size = 4};
    strcpy(e.medium, "GPU");
    struct kvr_kvev_batch b = {.ts = 1.5, .events = &e, .nevents = 1};
    cr_assert(eq(int, kvr_kvev_encode(out, &b, NULL), KVR_OK));
}

static uint64_t publish(struct kvr_kvpub *p, uint64_t first, uint32_t n)
{
    struct kvr_buf b = {0};
    payload(&b, first, n);
    uint64_t seq;
    cr_assert(eq(int, kvr_kvpub_publish(p, b.data, b.len, &seq), KVR_OK));
    kvr_buf_free(&b);
    return seq;
}

struct rig {
    struct kvr_kvpub *pub;
    struct kvr_kvsub *sub;
    struct rec *rec;
    char ep[KVR_KVZMQ_ENDPOINT_MAX], rep[KVR_KVZMQ_ENDPOINT_MAX];
};

static void rig_pub(struct rig *g, uint32_t ring)
{
    kvr_status st;
    g->pub = kvr_kvpub_open("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", "kv-events", ring, &st);
    cr_assert(g->pub != NULL, "kvr_kvpub_open: %s", kvr_status_str(st));
    cr_assert(eq(int, kvr_kvpub_endpoint(g->pub, false, g->ep, sizeof g->ep), KVR_OK));
    cr_assert(eq(int, kvr_kvpub_endpoint(g->pub, true, g->rep, sizeof g->rep), KVR_OK));
    cr_assert(strncmp(g->ep, "tcp://127.0.0.1:", 16) == 0 && strcmp(g->ep + 16, "*") != 0,
              "bound %s", g->ep);
}

static void rig_sub(struct rig *g, const char *replay, struct kvr_kvsub_config *cfg)
{
    struct kvr_kvsub_config c = {0};
    if (cfg)
        c = *cfg;
    c.endpoint = g->ep;
    c.replay_endpoint = replay;
    c.topic = "kv-events";
    g->rec = rec_new();
    struct kvr_kvsub_hooks h = {g->rec, on_batch, on_reset, on_bad};
    kvr_status st;
    g->sub = kvr_kvsub_open(&c, &h, &st);
    cr_assert(g->sub != NULL, "kvr_kvsub_open: %s", kvr_status_str(st));
}

static void rig_open(struct rig *g, uint32_t ring, bool replay)
{
    memset(g, 0, sizeof *g);
    rig_pub(g, ring);
    rig_sub(g, replay ? g->rep : NULL, NULL);
    cr_assert(kvr_kvpub_wait_subscribers(g->pub, 1, WAIT_MS), "no subscription");
}

static void rig_close(struct rig *g)
{
    kvr_kvsub_close(g->sub);
    kvr_kvpub_close(g->pub);
    cr_assert(true == (!g->rec->order_broken), "a seq went down between two resets");
    pthread_mutex_destroy(&g->rec->mu);
    free(g->rec);
}

/* ---- tests ---------------------------------------------------------------------------------- */

Test(kvzmq, publish_subscribe_in_order)
{
    struct rig g;
    rig_open(&g, 0, true);
    for (uint64_t i = 0; i < 200; i++)
        cr_assert(eq(u64, publish(g.pub, 1000 * i, 3), i));
    cr_assert(wait_n(g.rec, 200, WAIT_MS));
    for (uint32_t i = 0; i < 200; i++) {
        cr_assert(eq(u64, g.rec->seq[i], i));
        cr_assert(eq(u64, g.rec->first_hash[i], 1000 * i));
        cr_assert(eq(u32, g.rec->nblocks[i], 3));
        cr_assert(true == (!g.rec->replayed[i]));
    }
    struct kvr_kvsub_stats st;
    kvr_kvsub_stats(g.sub, &st);
    cr_assert(eq(u64, st.batches, 200));
    cr_assert(eq(u64, st.events, 200));
    cr_assert(true == (((st.gaps) == (0)) && ((st.resets) == (0)) && ((st.bad) == (0))));
    cr_assert(true == (st.has_last && ((st.last_seq) == (199))));
    cr_assert(true == (st.last_batch_ns > 0 && ((st.last_ts) == (1.5))));
    cr_assert(WAIT_SENT(g.pub, 200));
    struct kvr_kvpub_stats ps;
    kvr_kvpub_stats(g.pub, &ps);
    cr_assert(true ==
              (((ps.next_seq) == (200)) && ((ps.published) == (200)) && ((ps.sent) == (200))));
    cr_assert(true == (((ps.subscribers) == (1)) && ((ps.ring) == (200))));
    rig_close(&g);
}

Test(kvzmq, dropped_batches_filled_from_replay)
{
    struct rig g;
    rig_open(&g, 0, true);
    for (int i = 0; i < 10; i++)
        publish(g.pub, 100 * (uint64_t)i, 2);
    cr_assert(wait_n(g.rec, 10, WAIT_MS));
    kvr_kvpub_drop(g.pub, 3);
    for (int i = 10; i < 13; i++)
        publish(g.pub, 100 * (uint64_t)i, 2); /* 10..12: numbered, kept, never sent */
    uint64_t t0 = kvr_now_ns();
    publish(g.pub, 1300, 2); /* 13: reveals the gap */
    cr_assert(wait_n(g.rec, 14, (uint32_t)(1000 * slow())), "gap not filled within 1 s");
    double ms = (double)(g.rec->at_ns[13] - t0) / 1e6;
    for (uint32_t i = 0; i < 14; i++) {
        cr_assert(eq(u64, g.rec->seq[i], i));
        cr_assert(eq(u64, g.rec->first_hash[i], 100 * i));
    }
    cr_assert(g.rec->replayed[10] && g.rec->replayed[11] && g.rec->replayed[12]);
    /* 13 came in the replay too, so it is delivered before the replay's end is read and the
     * gap counted as filled */
    cr_assert(WAIT_STAT(g.sub, gaps_filled, 1), "the replay never finished");
    struct kvr_kvsub_stats st;
    kvr_kvsub_stats(g.sub, &st);
    cr_assert(true == (((st.gaps) == (1)) && ((st.gaps_filled) == (1)) && ((st.resets) == (0))));
    cr_assert(true == (st.replayed >= 3 && ((st.replay_requests) == (1))));
    cr_assert(eq(u64, st.batches, 14));
    printf("kvzmq: 3 dropped batches filled from the replay socket: %.3f ms from the next batch's "
           "publish to its delivery (subscriber's own gap-fill time %.3f ms)\n",
           ms, (double)st.last_gap_fill_ns / 1e6);
    cr_assert(ms < 1000.0 * slow());
    cr_assert(WAIT_SENT(g.pub, 11));
    struct kvr_kvpub_stats ps;
    kvr_kvpub_stats(g.pub, &ps);
    cr_assert(true ==
              (((ps.dropped) == (3)) && ((ps.sent) == (11)) && ((ps.replay_requests) == (1))));
    /* and on: live batches after the fill */
    publish(g.pub, 1400, 2);
    cr_assert(wait_n(g.rec, 15, WAIT_MS));
    cr_assert(true == (((g.rec->seq[14]) == (14)) && !g.rec->replayed[14]));
    rig_close(&g);
}

Test(kvzmq, gap_older_than_ring_resets)
{
    struct rig g;
    rig_open(&g, 4, true);
    publish(g.pub, 0, 1);
    publish(g.pub, 100, 1);
    cr_assert(wait_n(g.rec, 2, WAIT_MS));
    kvr_kvpub_drop(g.pub, 10);
    for (int i = 2; i < 12; i++)
        publish(g.pub, 100 * (uint64_t)i, 1);
    publish(g.pub, 1200, 1); /* 12; the ring keeps 9..12 */
    cr_assert(wait_n(g.rec, 6, WAIT_MS));
    kvr_sleep_ns(50 * KVR_NS_PER_MS);
    cr_assert(eq(u32, rec_n(g.rec), 6));
    const uint64_t want[] = {0, 1, 9, 10, 11, 12};
    for (int i = 0; i < 6; i++)
        cr_assert(eq(u64, g.rec->seq[i], want[i]), "delivery %d", i);
    cr_assert(eq(u32, g.rec->resets, 1));
    cr_assert(eq(u32, g.rec->reset_at[0], 2), "the reset comes before the newer batches");
    cr_assert(eq(str, (char *)g.rec->why[0], "replay did not cover the gap"));
    struct kvr_kvsub_stats st;
    kvr_kvsub_stats(g.sub, &st);
    cr_assert(true == (((st.gaps) == (1)) && ((st.gaps_filled) == (0)) && ((st.resets) == (1))));
    rig_close(&g);
}

Test(kvzmq, gap_without_replay_endpoint_resets)
{
    struct rig g;
    rig_open(&g, 0, false);
    publish(g.pub, 0, 1);
    cr_assert(wait_n(g.rec, 1, WAIT_MS));
    kvr_kvpub_drop(g.pub, 2);
    publish(g.pub, 100, 1);
    publish(g.pub, 200, 1);
    publish(g.pub, 300, 1);
    cr_assert(wait_n(g.rec, 2, WAIT_MS));
    cr_assert(eq(u64, g.rec->seq[1], 3));
    cr_assert(eq(u32, g.rec->resets, 1));
    cr_assert(eq(str, (char *)g.rec->why[0], "gap and no replay endpoint"));
    rig_close(&g);
}

/* A replay that keeps answering is waited for, however long its batches take to deliver: the
 * timeout is for a replay socket that says nothing (a consumer that fell behind has a large gap,
 * and a reset would throw away what the replay brings). */
Test(kvzmq, a_long_replay_that_keeps_answering_is_not_timed_out)
{
    struct rig g;
    memset(&g, 0, sizeof g);
    rig_pub(&g, 0);
    struct kvr_kvsub_config c = {.replay_timeout_ms = 200};
    rig_sub(&g, g.rep, &c);
    cr_assert(kvr_kvpub_wait_subscribers(g.pub, 1, WAIT_MS));
    publish(g.pub, 0, 1);
    cr_assert(wait_n(g.rec, 1, WAIT_MS));
    pthread_mutex_lock(&g.rec->mu);
    g.rec->slow_ns = KVR_NS_PER_MS; /* 300 batches: 300 ms, past the timeout */
    pthread_mutex_unlock(&g.rec->mu);
    kvr_kvpub_drop(g.pub, 299);
    for (int i = 1; i <= 300; i++)
        publish(g.pub, 100 * (uint64_t)i, 1); /* 1..299 lost, 300 reveals the gap */
    cr_assert(wait_n(g.rec, 301, (uint32_t)(5000 * slow())), "%u delivered", rec_n(g.rec));
    for (uint32_t i = 0; i < 301; i++)
        cr_assert(eq(u64, g.rec->seq[i], i));
    cr_assert(eq(u32, g.rec->resets, 0), "reset: %s", g.rec->resets ? g.rec->why[0] : "");
    cr_assert(WAIT_STAT(g.sub, gaps_filled, 1));
    struct kvr_kvsub_stats st;
    kvr_kvsub_stats(g.sub, &st);
    cr_assert(true == (((st.replay_timeouts) == (0)) && ((st.replay_requests) == (1))));
    rig_close(&g);
}

/* A ROUTER that reads requests and never answers them. */
struct mute {
    void *ctx, *router;
    char ep[KVR_KVZMQ_ENDPOINT_MAX];
};

static void mute_open(struct mute *m)
{
    m->ctx = zmq_ctx_new();
    m->router = zmq_socket(m->ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(m->router, ZMQ_LINGER, &zero, sizeof zero);
    cr_assert(eq(int, zmq_bind(m->router, "tcp://127.0.0.1:*"), 0));
    size_t sz = sizeof m->ep;
    zmq_getsockopt(m->router, ZMQ_LAST_ENDPOINT, m->ep, &sz);
}

static void mute_close(struct mute *m)
{
    zmq_close(m->router);
    zmq_ctx_term(m->ctx);
}

Test(kvzmq, replay_timeout_resets)
{
    struct mute m;
    mute_open(&m);
    struct rig g;
    memset(&g, 0, sizeof g);
    rig_pub(&g, 0);
    struct kvr_kvsub_config c = {.replay_timeout_ms = 200};
    rig_sub(&g, m.ep, &c);
    cr_assert(kvr_kvpub_wait_subscribers(g.pub, 1, WAIT_MS));
    publish(g.pub, 0, 1);
    cr_assert(wait_n(g.rec, 1, WAIT_MS));
    kvr_kvpub_drop(g.pub, 1);
    publish(g.pub, 100, 1);
    uint64_t t0 = kvr_now_ns();
    publish(g.pub, 200, 1);
    publish(g.pub, 300, 1);
    cr_assert(wait_n(g.rec, 3, WAIT_MS));
    double ms = (double)(g.rec->at_ns[1] - t0) / 1e6;
    cr_assert(ms >= 150.0 && ms < 1000.0 * slow(), "held for %.1f ms", ms);
    cr_assert(true == (((g.rec->seq[1]) == (2)) && ((g.rec->seq[2]) == (3))));
    cr_assert(eq(u32, g.rec->resets, 1));
    cr_assert(eq(str, (char *)g.rec->why[0], "replay timed out"));
    struct kvr_kvsub_stats st;
    kvr_kvsub_stats(g.sub, &st);
    cr_assert(true == (((st.replay_timeouts) == (1)) && ((st.held_max) == (2))));
    rig_close(&g);
    mute_close(&m);
}

/* A gap held open by a replay that never answers: more than c allows held resets at once. */
static void held_over(struct kvr_kvsub_config *c)
{
    struct mute m;
    mute_open(&m);
    struct rig g;
    memset(&g, 0, sizeof g);
    rig_pub(&g, 0);
    rig_sub(&g, m.ep, c);
    cr_assert(kvr_kvpub_wait_subscribers(g.pub, 1, WAIT_MS));
    publish(g.pub, 0, 1);
    cr_assert(wait_n(g.rec, 1, WAIT_MS));
    kvr_kvpub_drop(g.pub, 1);
    for (int i = 1; i <= 7; i++)
        publish(g.pub, 100 * (uint64_t)i, 1); /* 1 lost; 2..5 held; 6 overflows */
    cr_assert(wait_n(g.rec, 7, (uint32_t)(2000 * slow())),
              "a full hold must not wait for the replay's timeout");
    for (int i = 1; i < 7; i++)
        cr_assert(eq(u64, g.rec->seq[i], (uint64_t)i + 1));
    cr_assert(eq(u32, g.rec->resets, 1));
    cr_assert(eq(str, (char *)g.rec->why[0], "too many batches held during a replay"));
    rig_close(&g);
    mute_close(&m);
}

Test(kvzmq, too_many_held_resets)
{
    held_over(&(struct kvr_kvsub_config){.replay_timeout_ms = 60000, .hold_max = 4});
}

Test(kvzmq, too_many_held_bytes_reset)
{
    /* room for four of these batches' bytes, not five (they are all of one size) */
    struct kvr_buf b = {0};
    payload(&b, 100, 1);
    size_t room = b.len * 4 + b.len / 2;
    kvr_buf_free(&b);
    held_over(&(struct kvr_kvsub_config){.replay_timeout_ms = 60000, .hold_bytes_max = room});
}

Test(kvzmq, engine_restart_resets_then_replays_from_zero)
{
    struct rig g;
    rig_open(&g, 0, true);
    for (int i = 0; i < 5; i++)
        publish(g.pub, 100 * (uint64_t)i, 1);
    cr_assert(wait_n(g.rec, 5, WAIT_MS));
    kvr_kvpub_close(g.pub);
    /* the new engine on the same endpoints, its seq from 0 again */
    kvr_status st;
    g.pub = NULL;
    for (int tries = 0; tries < 100 && !g.pub; tries++) {
        g.pub = kvr_kvpub_open(g.ep, g.rep, "kv-events", 0, &st);
        if (!g.pub)
            kvr_sleep_ns(10 * KVR_NS_PER_MS);
    }
    cr_assert(g.pub != NULL, "reopen on %s: %s", g.ep, kvr_status_str(st));
    /* its first two batches go out before the subscriber is back (the slow joiner) */
    publish(g.pub, 5000, 1);
    publish(g.pub, 5100, 1);
    cr_assert(kvr_kvpub_wait_subscribers(g.pub, 1, WAIT_MS));
    publish(g.pub, 5200, 1);
    cr_assert(wait_n(g.rec, 8, WAIT_MS));
    kvr_sleep_ns(50 * KVR_NS_PER_MS);
    cr_assert(eq(u32, rec_n(g.rec), 8), "each of the new engine's batches once");
    cr_assert(eq(u32, g.rec->resets, 1));
    cr_assert(eq(str, (char *)g.rec->why[0], "engine restarted"));
    cr_assert(eq(u32, g.rec->reset_at[0], 5));
    for (int i = 0; i < 3; i++) {
        cr_assert(eq(u64, g.rec->seq[5 + i], (uint64_t)i));
        cr_assert(eq(u64, g.rec->first_hash[5 + i], 5000 + 100 * (uint64_t)i));
    }
    struct kvr_kvsub_stats ss;
    kvr_kvsub_stats(g.sub, &ss);
    cr_assert(true == (((ss.restarts) == (1)) && ((ss.resets) == (1)) && ((ss.last_seq) == (2))));
    rig_close(&g);
}

struct burst_arg {
    struct kvr_kvpub *pub;
    int id;
};

static void *burst_thread(void *arg)
{
    struct burst_arg *a = arg;
    for (int i = 0; i < 250; i++)
        publish(a->pub, (uint64_t)a->id << 32 | (uint64_t)i * 10, 10);
    return NULL;
}

Test(kvzmq, burst_of_10000_blocks_none_lost)
{
    struct rig g;
    rig_open(&g, 0, true);
    g.rec->steal = true;
    uint64_t t0 = kvr_now_ns();
    pthread_t th[4];
    struct burst_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (struct burst_arg){g.pub, i};
        pthread_create(&th[i], NULL, burst_thread, &a[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    cr_assert(wait_n(g.rec, 1000, 10000));
    double ms = (double)(kvr_now_ns() - t0) / 1e6;
    uint64_t blocks = 0;
    for (uint32_t i = 0; i < 1000; i++) {
        cr_assert(eq(u64, g.rec->seq[i], i));
        blocks += g.rec->nblocks[i];
    }
    cr_assert(eq(u64, blocks, 10000));
    struct kvr_kvsub_stats st;
    kvr_kvsub_stats(g.sub, &st);
    cr_assert(true == (((st.resets) == (0)) && ((st.bad) == (0))));
    printf("kvzmq: 10,000 blocks in 1,000 batches from 4 threads delivered in %.1f ms "
           "(%llu gaps, all filled: %llu)\n",
           ms, (unsigned long long)st.gaps, (unsigned long long)st.gaps_filled);
    rig_close(&g);
}

/* A raw PUB socket in place of the engine, to send what no publisher of ours would. */
struct raw {
    void *ctx, *pub;
    char ep[KVR_KVZMQ_ENDPOINT_MAX];
};

static void raw_send(struct raw *r, int nframes, const void *const *f, const size_t *len)
{
    for (int i = 0; i < nframes; i++)
        cr_assert(zmq_send(r->pub, f[i], len[i], i + 1 < nframes ? ZMQ_SNDMORE : 0) >= 0);
}

static void raw_batch(struct raw *r, const char *topic, uint64_t seq, const void *p, size_t n)
{
    uint8_t s[8];
    for (int i = 7; i >= 0; i--, seq >>= 8)
        s[i] = (uint8_t)seq;
    const void *f[3] = {topic, s, p};
    size_t len[3] = {strlen(topic), 8, n};
    raw_send(r, 3, f, len);
}

Test(kvzmq, garbage_on_the_pub_socket_is_counted)
{
    struct raw r;
    r.ctx = zmq_ctx_new();
    r.pub = zmq_socket(r.ctx, ZMQ_XPUB);
    cr_assert(eq(int, zmq_bind(r.pub, "tcp://127.0.0.1:*"), 0));
    size_t sz = sizeof r.ep;
    zmq_getsockopt(r.pub, ZMQ_LAST_ENDPOINT, r.ep, &sz);
    struct rig g;
    memset(&g, 0, sizeof g);
    strcpy(g.ep, r.ep);
    rig_sub(&g, NULL, NULL);
    zmq_pollitem_t it = {r.pub, 0, ZMQ_POLLIN, 0};
    cr_assert(eq(int, zmq_poll(&it, 1, WAIT_MS), 1), "no subscription");
    char subm[64];
    zmq_recv(r.pub, subm, sizeof subm, 0);

    struct kvr_buf ok = {0};
    payload(&ok, 7, 2);
    raw_batch(&r, "kv-events", 0, ok.data, ok.len);
    /* two frames; a 7-byte seq; four frames; the topic's longer cousin; bad payload */
    const void *f2[2] = {"kv-events", "\0\0\0\0\0\0\0\1"};
    size_t l2[2] = {9, 8};
    raw_send(&r, 2, f2, l2);
    const void *f3[3] = {"kv-events", "\0\0\0\0\0\0\1", ok.data};
    size_t l3[3] = {9, 7, ok.len};
    raw_send(&r, 3, f3, l3);
    const void *f4[4] = {"kv-events", "\0\0\0\0\0\0\0\1", ok.data, "x"};
    size_t l4[4] = {9, 8, ok.len, 1};
    raw_send(&r, 4, f4, l4);
    raw_batch(&r, "kv-events-2", 1, ok.data, ok.len);
    raw_batch(&r, "kv-events", 1, "\x93\x01", 2); /* seq 1 does not decode: skipped */
    raw_batch(&r, "kv-events", 2, ok.data, ok.len);
    cr_assert(wait_n(g.rec, 2, WAIT_MS));
    cr_assert(WAIT_STAT(g.sub, bad, 5));
    struct kvr_kvsub_stats st;
    kvr_kvsub_stats(g.sub, &st);
    cr_assert(true == (((st.bad) == (5)) && ((st.bad_decode) == (1))));
    cr_assert(true == (((st.gaps) == (0)) && ((st.resets) == (0))), "a skipped batch is no gap");
    cr_assert(true == (((g.rec->seq[0]) == (0)) && ((g.rec->seq[1]) == (2))));
    cr_assert(true == (((g.rec->bads) == (5)) && ((g.rec->last_bad) == (KVR_ERR_MALFORMED))));
    kvr_buf_free(&ok);
    kvr_kvsub_close(g.sub);
    pthread_mutex_destroy(&g.rec->mu);
    free(g.rec);
    zmq_close(r.pub);
    zmq_ctx_term(r.ctx);
}

/* Receive one whole message's frames (up to 6) with a timeout; returns the count, 0 on none. */
static int recv_msg(void *s, zmq_msg_t *f, int max, int ms)
{
    zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, ms) != 1)
        return 0;
    int n = 0;
    for (;;) {
        zmq_msg_init(&f[n]);
        cr_assert(zmq_msg_recv(&f[n], s, 0) >= 0);
        bool more = zmq_msg_more(&f[n]);
        n++;
        if (!more || n == max)
            return n;
    }
}

static uint64_t be64(const zmq_msg_t *m)
{
    const uint8_t *b = zmq_msg_data((zmq_msg_t *)m);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | b[i];
    return v;
}

static void close_all(zmq_msg_t *f, int n)
{
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
}

Test(kvzmq, replay_socket_envelopes_and_garbage)
{
    struct rig g;
    memset(&g, 0, sizeof g);
    rig_pub(&g, 0);
    for (int i = 0; i < 5; i++)
        publish(g.pub, 100 * (uint64_t)i, 1);
    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    cr_assert(eq(int, zmq_connect(d, g.rep), 0));
    zmq_msg_t f[6];

    /* DEALER with a delimiter, from 3: ["", 3, p], ["", 4, p], ["", END, ""] */
    zmq_send(d, "", 0, ZMQ_SNDMORE);
    zmq_send(d, "\0\0\0\0\0\0\0\3", 8, 0);
    for (uint64_t want = 3; want <= 5; want++) {
        int n = recv_msg(d, f, 6, WAIT_MS);
        cr_assert(eq(int, n, 3));
        cr_assert(true == (((zmq_msg_size(&f[0])) == (0)) && ((zmq_msg_size(&f[1])) == (8))));
        if (want < 5) {
            cr_assert(eq(u64, be64(&f[1]), want));
            struct kvr_kvev_batch b;
            cr_assert(eq(int, kvr_kvev_decode(zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), NULL, &b),
                         KVR_OK));
            cr_assert(eq(u64, b.events[0].hashes[0], 100 * want));
            kvr_kvev_batch_free(&b);
        } else {
            cr_assert(true ==
                      (((be64(&f[1])) == (KVR_KVZMQ_SEQ_END)) && ((zmq_msg_size(&f[2])) == (0))));
        }
        close_all(f, n);
    }
    /* DEALER without a delimiter, from past the newest: just [END, ""] */
    zmq_send(d, "\0\0\0\0\0\0\0\x09", 8, 0);
    int n = recv_msg(d, f, 6, WAIT_MS);
    cr_assert(true == (((n) == (2)) && ((be64(&f[0])) == (KVR_KVZMQ_SEQ_END))));
    close_all(f, n);
    /* garbage: a 7-byte seq, two seq frames, a text: each answered with the end marker alone */
    zmq_send(d, "", 0, ZMQ_SNDMORE);
    zmq_send(d, "\0\0\0\0\0\0\1", 7, 0);
    zmq_send(d, "\0\0\0\0\0\0\0\1", 8, ZMQ_SNDMORE);
    zmq_send(d, "\0\0\0\0\0\0\0\1", 8, 0);
    zmq_send(d, "hello", 5, 0);
    for (int i = 0; i < 3; i++) {
        n = recv_msg(d, f, 6, WAIT_MS);
        cr_assert(n >= 2, "garbage %d answered", i);
        cr_assert(true == (((be64(&f[n - 2])) == (KVR_KVZMQ_SEQ_END)) &&
                           ((zmq_msg_size(&f[n - 1])) == (0))));
        close_all(f, n);
    }
    /* a REQ socket, as vLLM's example subscriber has: it reads the first reply */
    void *req = zmq_socket(ctx, ZMQ_REQ);
    zmq_setsockopt(req, ZMQ_LINGER, &zero, sizeof zero);
    cr_assert(eq(int, zmq_connect(req, g.rep), 0));
    zmq_send(req, "\0\0\0\0\0\0\0\0", 8, 0);
    n = recv_msg(req, f, 6, WAIT_MS);
    cr_assert(true == (((n) == (2)) && ((be64(&f[0])) == (0)) && zmq_msg_size(&f[1]) > 0));
    close_all(f, n);
    struct kvr_kvpub_stats ps;
    kvr_kvpub_stats(g.pub, &ps);
    cr_assert(true == (((ps.replay_bad) == (3)) && ((ps.replay_requests) == (3))));
    zmq_close(req);
    zmq_close(d);
    zmq_ctx_term(ctx);
    kvr_kvpub_close(g.pub);
}

Test(kvzmq, open_errors_and_endpoints)
{
    kvr_status st;
    cr_assert(kvr_kvpub_open(NULL, NULL, NULL, 0, &st) == NULL && st == KVR_ERR_INVALID);
    cr_assert(kvr_kvpub_open("nonsense", NULL, NULL, 0, &st) == NULL && st == KVR_ERR_INVALID);
    struct kvr_kvpub *p = kvr_kvpub_open("tcp://127.0.0.1:0", NULL, NULL, 0, &st);
    cr_assert(p != NULL, "port 0: %s", kvr_status_str(st));
    char ep[KVR_KVZMQ_ENDPOINT_MAX];
    cr_assert(eq(int, kvr_kvpub_endpoint(p, false, ep, sizeof ep), KVR_OK));
    cr_assert(eq(int, kvr_kvpub_endpoint(p, true, ep, sizeof ep), KVR_ERR_INVALID));
    cr_assert(eq(int, kvr_kvpub_endpoint(p, false, ep, 5), KVR_ERR_INVALID));
    cr_assert(eq(int, kvr_kvpub_endpoint(p, false, ep, sizeof ep), KVR_OK));
    struct kvr_kvpub *q = kvr_kvpub_open(ep, NULL, NULL, 0, &st);
    cr_assert(q == NULL && st == KVR_ERR_IO, "the port is taken");
    cr_assert(eq(int, kvr_kvpub_publish(p, NULL, 3, NULL), KVR_ERR_INVALID));
    cr_assert(eq(int, kvr_kvpub_publish(p, "", 0, NULL), KVR_OK));
    kvr_kvpub_close(p);
    kvr_kvpub_close(NULL);

    struct kvr_kvsub_hooks h = {NULL, on_batch, NULL, NULL};
    struct kvr_kvsub_config c = {0};
    cr_assert(kvr_kvsub_open(&c, &h, &st) == NULL && st == KVR_ERR_INVALID);
    c.endpoint = "bogus://x";
    cr_assert(kvr_kvsub_open(&c, &h, &st) == NULL && st == KVR_ERR_INVALID);
    c.endpoint = "tcp://127.0.0.1:1";
    struct kvr_kvsub_hooks nohook = {0};
    cr_assert(kvr_kvsub_open(&c, &nohook, &st) == NULL && st == KVR_ERR_INVALID);
    kvr_kvsub_close(NULL);
}

Test(kvzmq, close_is_prompt)
{
    struct rec *r = rec_new();
    struct kvr_kvsub_hooks h = {r, on_batch, on_reset, on_bad};
    struct kvr_kvsub_config c = {.endpoint = "tcp://127.0.0.1:1",
                                 .replay_endpoint = "tcp://127.0.0.1:2"};
    kvr_status st;
    struct kvr_kvsub *s = kvr_kvsub_open(&c, &h, &st);
    cr_assert(s != NULL);
    kvr_sleep_ns(20 * KVR_NS_PER_MS);
    uint64_t t0 = kvr_now_ns();
    kvr_kvsub_close(s);
    double ms = (double)(kvr_now_ns() - t0) / 1e6;
    cr_assert(ms < 100.0 * slow(), "close took %.1f ms", ms);
    struct kvr_kvpub *p = kvr_kvpub_open("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", "t", 0, &st);
    cr_assert(p != NULL);
    t0 = kvr_now_ns();
    kvr_kvpub_close(p);
    ms = (double)(kvr_now_ns() - t0) / 1e6;
    cr_assert(ms < 300.0 * slow(), "publisher close took %.1f ms", ms);
    pthread_mutex_destroy(&r->mu);
    free(r);
}
