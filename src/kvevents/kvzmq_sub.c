/*
 * kvzmq subscriber: the adapter side of the KV-event wire (kvzmq.h has the rules). One thread owns
 * the SUB and the replay DEALER and waits in zmq_poll (with a wake pipe for close and the replay's
 * deadline as its only timeout). Its state: the last seq delivered (or none), a mode (live, or
 * waiting for a replay) and a FIFO of live messages held while a replay runs. Invariant: hooks see
 * strictly increasing seqs between two resets, each once. The counters are under mu; hooks are
 * called with no lock held.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "clock.h"
#include "kvzmq.h"
#include "kvzmq_internal.h"

#define TURN          256 /* messages read from one socket before looking at the other */
#define FRAMES_MAX    4   /* frames of one message kept; more make it bad */
#define REPLAY_RCVHWM 100000

struct held {
    uint64_t seq;
    zmq_msg_t payload;
};

struct kvr_kvsub {
    struct kvr_kvsub_config cfg; /* strings below are the copies */
    char endpoint[KVR_KVZMQ_ENDPOINT_MAX];
    char replay_endpoint[KVR_KVZMQ_ENDPOINT_MAX];
    char *topic;
    size_t topic_len;
    struct kvr_kvsub_hooks hooks;

    void *zctx, *sub, *dealer; /* the thread's (dealer NULL without a replay endpoint) */
    int wake[2];
    pthread_t thread;
    atomic_bool stop;
    atomic_bool rewind; /* kvr_kvsub_rewind asked: forget the last seq, replay from 0 */

    /* the thread's state */
    bool has_last;
    uint64_t last;
    bool dirty;               /* something was delivered since the last reset (or open) */
    bool replaying;           /* a replay request is out */
    bool replay_restart;      /* it asks from 0 after an engine restart */
    bool replay_failed;       /* it did not cover its gap */
    uint64_t replay_from;     /* the seq it asks from */
    uint64_t replay_deadline; /* kvr_now_ns() */
    uint64_t gap_seen_ns;
    struct held *held; /* FIFO [hold_head, hold_len) */
    uint32_t hold_head, hold_len, hold_cap;
    size_t held_bytes; /* their payloads' bytes */

    pthread_mutex_t mu;
    struct kvr_kvsub_stats st;
};

kvr_status kvr_kvzmq_endpoint_fix(const char *endpoint, char *out, size_t cap)
{
    if (!endpoint || !endpoint[0])
        return KVR_ERR_INVALID;
    size_t n = strlen(endpoint);
    if (n + 1 > cap)
        return KVR_ERR_INVALID;
    memcpy(out, endpoint, n + 1);
    if (strncmp(out, "tcp://", 6) == 0 && n >= 2 && strcmp(out + n - 2, ":0") == 0)
        out[n - 1] = '*';
    return KVR_OK;
}

/* ---- counters ------------------------------------------------------------------------------- */

#define COUNT(s, field, n)                                                                         \
    do {                                                                                           \
        pthread_mutex_lock(&(s)->mu);                                                              \
        (s)->st.field += (n);                                                                      \
        pthread_mutex_unlock(&(s)->mu);                                                            \
    } while (0)

static void bad(struct kvr_kvsub *s, uint64_t seq, kvr_status st, bool decode)
{
    pthread_mutex_lock(&s->mu);
    s->st.bad++;
    if (decode)
        s->st.bad_decode++;
    pthread_mutex_unlock(&s->mu);
    if (s->hooks.bad)
        s->hooks.bad(s->hooks.ctx, seq, st);
}

/* ---- delivering ----------------------------------------------------------------------------- */

static void deliver(struct kvr_kvsub *s, uint64_t seq, const void *data, size_t len, bool replayed)
{
    struct kvr_kvev_batch b;
    kvr_status st = kvr_kvev_decode(data, len, &s->cfg.limits, &b);
    s->has_last = true;
    s->last = seq;
    s->dirty = true;
    pthread_mutex_lock(&s->mu);
    s->st.has_last = true;
    s->st.last_seq = seq;
    if (st == KVR_OK) {
        s->st.batches++;
        s->st.events += b.nevents;
        s->st.unknown_events += b.unknown_events;
        if (replayed)
            s->st.replayed++;
        s->st.last_batch_ns = kvr_now_ns();
        s->st.last_ts = b.ts;
    }
    pthread_mutex_unlock(&s->mu);
    if (st != KVR_OK) {
        bad(s, seq, st, true);
        return;
    }
    s->hooks.batch(s->hooks.ctx, seq, &b, replayed);
    kvr_kvev_batch_free(&b);
}

static void reset(struct kvr_kvsub *s, const char *why)
{
    bool call = s->dirty;
    s->has_last = false;
    s->dirty = false;
    pthread_mutex_lock(&s->mu);
    s->st.has_last = false;
    if (call)
        s->st.resets++;
    pthread_mutex_unlock(&s->mu);
    if (call && s->hooks.reset)
        s->hooks.reset(s->hooks.ctx, why);
}

/* In order: delivered (or skipped as a duplicate); false: a gap, nothing done. */
static bool offer(struct kvr_kvsub *s, uint64_t seq, const void *data, size_t len, bool replayed)
{
    if (!s->has_last || seq == s->last + 1) {
        deliver(s, seq, data, len, replayed);
        return true;
    }
    if (seq <= s->last) {
        COUNT(s, duplicates, 1);
        return true;
    }
    return false;
}

/* ---- replay --------------------------------------------------------------------------------- */

static void set_int(void *sock, int opt, int v)
{
    zmq_setsockopt(sock, opt, &v, sizeof v);
}

static void put_be64(uint8_t *b, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        b[i] = (uint8_t)v;
        v >>= 8;
    }
}

static uint64_t rd_be64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | b[i];
    return v;
}

static void *open_dealer(struct kvr_kvsub *s)
{
    void *d = zmq_socket(s->zctx, ZMQ_DEALER);
    if (!d)
        return NULL;
    set_int(d, ZMQ_LINGER, 0);
    set_int(d, ZMQ_RCVHWM, REPLAY_RCVHWM);
    int64_t max = (int64_t)s->cfg.limits.max_bytes;
    zmq_setsockopt(d, ZMQ_MAXMSGSIZE, &max, sizeof max);
    if (zmq_connect(d, s->replay_endpoint) != 0) {
        zmq_close(d);
        return NULL;
    }
    return d;
}

/* A fresh DEALER, so replies to an abandoned request never reach the next one. */
static void reopen_dealer(struct kvr_kvsub *s)
{
    if (s->dealer)
        zmq_close(s->dealer);
    s->dealer = open_dealer(s);
}

static bool start_replay(struct kvr_kvsub *s, uint64_t from, bool restart)
{
    if (!s->dealer)
        return false;
    uint8_t seq[8];
    put_be64(seq, from);
    if (zmq_send(s->dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(s->dealer, seq, sizeof seq, ZMQ_DONTWAIT) < 0) {
        reopen_dealer(s);
        return false;
    }
    uint64_t now = kvr_now_ns();
    s->replaying = true;
    s->replay_restart = restart;
    s->replay_failed = false;
    s->replay_from = from;
    s->replay_deadline = now + (uint64_t)s->cfg.replay_timeout_ms * KVR_NS_PER_MS;
    s->gap_seen_ns = now;
    COUNT(s, replay_requests, 1);
    return true;
}

/* ---- the held FIFO -------------------------------------------------------------------------- */

static bool hold(struct kvr_kvsub *s, uint64_t seq, zmq_msg_t *payload)
{
    uint32_t n = s->hold_len - s->hold_head;
    size_t len = zmq_msg_size(payload);
    if (n >= s->cfg.hold_max || len > s->cfg.hold_bytes_max - s->held_bytes)
        return false;
    if (s->hold_head > 0 && s->hold_len == s->hold_cap) {
        memmove(s->held, s->held + s->hold_head, n * sizeof *s->held);
        s->hold_head = 0;
        s->hold_len = n;
    }
    if (s->hold_len == s->hold_cap) {
        uint32_t cap = s->hold_cap ? s->hold_cap * 2 : 64;
        struct held *h = realloc(s->held, (size_t)cap * sizeof *h);
        if (!h)
            return false;
        s->held = h;
        s->hold_cap = cap;
    }
    struct held *h = &s->held[s->hold_len++];
    h->seq = seq;
    zmq_msg_init(&h->payload);
    zmq_msg_move(&h->payload, payload);
    s->held_bytes += len;
    pthread_mutex_lock(&s->mu);
    if (n + 1 > s->st.held_max)
        s->st.held_max = n + 1;
    pthread_mutex_unlock(&s->mu);
    return true;
}

static void pop_held(struct kvr_kvsub *s)
{
    s->held_bytes -= zmq_msg_size(&s->held[s->hold_head].payload);
    zmq_msg_close(&s->held[s->hold_head].payload);
    if (++s->hold_head == s->hold_len)
        s->hold_head = s->hold_len = 0;
}

/*
 * Deliver what was held, in arrival order. A held batch past last + 1 is a new gap: with
 * may_replay a replay is asked and the rest stays held; else the subscriber resets and goes on.
 */
static void drain_held(struct kvr_kvsub *s, bool may_replay)
{
    while (!s->replaying && s->hold_head < s->hold_len) {
        struct held *h = &s->held[s->hold_head];
        void *data = zmq_msg_data(&h->payload);
        size_t len = zmq_msg_size(&h->payload);
        if (!offer(s, h->seq, data, len, false)) {
            COUNT(s, gaps, 1);
            if (may_replay && start_replay(s, s->last + 1, false))
                return;
            reset(s, "gap not filled");
            offer(s, h->seq, data, len, false);
        }
        pop_held(s);
    }
}

static void finish_replay(struct kvr_kvsub *s)
{
    s->replaying = false;
    /* a replay that brought nothing new is not asked again for the same gap */
    bool progress = s->has_last && s->last >= s->replay_from;
    drain_held(s, progress);
    if (!s->replaying && !s->replay_restart && !s->replay_failed) {
        pthread_mutex_lock(&s->mu);
        s->st.gaps_filled++;
        s->st.last_gap_fill_ns = kvr_now_ns() - s->gap_seen_ns;
        pthread_mutex_unlock(&s->mu);
    }
}

/* The replay did not finish: forget it, reset, go on from what is held. */
static void abandon_replay(struct kvr_kvsub *s, const char *why)
{
    reopen_dealer(s);
    s->replaying = false;
    reset(s, why);
    drain_held(s, false);
}

/* ---- messages ------------------------------------------------------------------------------- */

/* Read one whole message: up to FRAMES_MAX frames kept in f (initialised), the count in *n;
 * false when there was none. *over: it had more frames than that (drained). */
static bool read_msg(void *sock, zmq_msg_t *f, int *n, bool *over)
{
    *n = 0;
    *over = false;
    bool more = true;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, *n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(&m);
            return *n > 0;
        }
        more = zmq_msg_more(&m);
        if (*n < FRAMES_MAX) {
            f[(*n)++] = m;
        } else {
            *over = true;
            zmq_msg_close(&m);
        }
    }
    return true;
}

static void close_frames(zmq_msg_t *f, int n)
{
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
}

static void on_live(struct kvr_kvsub *s, uint64_t seq, zmq_msg_t *payload)
{
    if (s->replaying) {
        if (hold(s, seq, payload))
            return;
        abandon_replay(s, "too many batches held during a replay");
    }
    void *data = zmq_msg_data(payload);
    size_t len = zmq_msg_size(payload);
    if (s->has_last && seq <= s->last) {
        COUNT(s, restarts, 1);
        reset(s, "engine restarted");
        if (start_replay(s, 0, true)) {
            if (hold(s, seq, payload))
                return;
            reopen_dealer(s); /* out of memory: no replay */
            s->replaying = false;
        }
        offer(s, seq, data, len, false);
        return;
    }
    if (offer(s, seq, data, len, false))
        return;
    COUNT(s, gaps, 1);
    if (start_replay(s, s->last + 1, false)) {
        if (hold(s, seq, payload))
            return;
        reopen_dealer(s);
        s->replaying = false;
    }
    reset(s, s->cfg.replay_endpoint ? "gap not filled" : "gap and no replay endpoint");
    offer(s, seq, data, len, false);
}

static void read_live(struct kvr_kvsub *s)
{
    for (int k = 0; k < TURN && !atomic_load(&s->stop); k++) {
        zmq_msg_t f[FRAMES_MAX];
        int n;
        bool over;
        if (!read_msg(s->sub, f, &n, &over))
            return;
        bool ok = !over && n == 3 && zmq_msg_size(&f[1]) == 8;
        if (ok && s->topic_len > 0)
            ok = zmq_msg_size(&f[0]) == s->topic_len &&
                 memcmp(zmq_msg_data(&f[0]), s->topic, s->topic_len) == 0;
        if (!ok) {
            uint64_t seq = !over && n == 3 && zmq_msg_size(&f[1]) == 8
                               ? rd_be64(zmq_msg_data(&f[1]))
                               : UINT64_MAX;
            close_frames(f, n);
            bad(s, seq, KVR_ERR_MALFORMED, false);
            continue;
        }
        on_live(s, rd_be64(zmq_msg_data(&f[1])), &f[2]);
        close_frames(f, n);
    }
}

static void on_reply(struct kvr_kvsub *s, uint64_t seq, zmq_msg_t *payload)
{
    if (!s->replaying)
        return; /* a reply to no request of this DEALER: cannot happen, ignore */
    if (seq == KVR_KVZMQ_SEQ_END) {
        finish_replay(s);
        return;
    }
    if (s->has_last && seq > s->last + 1) {
        s->replay_failed = true;
        reset(s, "replay did not cover the gap");
    }
    bool fresh = !s->has_last || seq > s->last;
    offer(s, seq, zmq_msg_data(payload), zmq_msg_size(payload), true);
    if (fresh) /* it answers: the timeout counts from its last batch that was new */
        s->replay_deadline = kvr_now_ns() + (uint64_t)s->cfg.replay_timeout_ms * KVR_NS_PER_MS;
}

static void read_replay(struct kvr_kvsub *s)
{
    for (int k = 0; k < TURN && s->dealer && !atomic_load(&s->stop); k++) {
        zmq_msg_t f[FRAMES_MAX];
        int n;
        bool over;
        if (!read_msg(s->dealer, f, &n, &over))
            return;
        int body = n >= 1 && zmq_msg_size(&f[0]) == 0 ? 1 : 0; /* the echoed delimiter */
        if (over || n != body + 2 || zmq_msg_size(&f[body]) != 8) {
            close_frames(f, n);
            bad(s, UINT64_MAX, KVR_ERR_MALFORMED, false);
            continue;
        }
        on_reply(s, rd_be64(zmq_msg_data(&f[body])), &f[body + 1]);
        close_frames(f, n);
    }
}

static void *sub_thread(void *arg)
{
    struct kvr_kvsub *s = arg;
    while (!atomic_load(&s->stop)) {
        zmq_pollitem_t it[3] = {
            {NULL, s->wake[0], ZMQ_POLLIN, 0},
            {s->sub, 0, ZMQ_POLLIN, 0},
            {s->dealer, 0, ZMQ_POLLIN, 0},
        };
        long timeout = -1;
        if (s->replaying) {
            uint64_t now = kvr_now_ns();
            timeout = now >= s->replay_deadline
                          ? 0
                          : (long)((s->replay_deadline - now + KVR_NS_PER_MS - 1) / KVR_NS_PER_MS);
        }
        int rc = zmq_poll(it, s->dealer ? 3 : 2, timeout);
        if (rc < 0 && zmq_errno() != EINTR)
            break;
        if (atomic_load(&s->stop))
            break;
        if (it[0].revents & ZMQ_POLLIN) {
            char b[64];
            while (read(s->wake[0], b, sizeof b) > 0) {
            }
        }
        if (!s->replaying && atomic_exchange(&s->rewind, false)) {
            COUNT(s, restarts, 1);
            reset(s, "engine restarted");
            start_replay(s, 0, true); /* what the new engine sent before we knew of it */
        }
        if (s->dealer && (it[2].revents & ZMQ_POLLIN))
            read_replay(s);
        if (it[1].revents & ZMQ_POLLIN)
            read_live(s);
        if (s->replaying && kvr_now_ns() >= s->replay_deadline) {
            COUNT(s, replay_timeouts, 1);
            abandon_replay(s, "replay timed out");
        }
    }
    return NULL;
}

/* ---- public --------------------------------------------------------------------------------- */

static void destroy(struct kvr_kvsub *s)
{
    if (s->sub)
        zmq_close(s->sub);
    if (s->dealer)
        zmq_close(s->dealer);
    if (s->zctx)
        zmq_ctx_term(s->zctx);
    for (uint32_t i = s->hold_head; i < s->hold_len; i++)
        zmq_msg_close(&s->held[i].payload);
    free(s->held);
    free(s->topic);
    if (s->wake[0] >= 0)
        close(s->wake[0]);
    if (s->wake[1] >= 0)
        close(s->wake[1]);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* The configuration's zero fields given their defaults. */
static void defaults(struct kvr_kvsub_config *c)
{
    struct kvr_kvev_limits *l = &c->limits;
    if (!l->max_events)
        l->max_events = KVR_KVEV_MAX_EVENTS;
    if (!l->max_hashes)
        l->max_hashes = KVR_KVEV_MAX_HASHES;
    if (!l->max_tokens)
        l->max_tokens = KVR_KVEV_MAX_TOKENS;
    if (!l->max_bytes)
        l->max_bytes = KVR_KVEV_MAX_BYTES;
    if (!c->replay_timeout_ms)
        c->replay_timeout_ms = KVR_KVSUB_REPLAY_TIMEOUT_MS;
    if (!c->hold_max)
        c->hold_max = KVR_KVSUB_HOLD_DEFAULT;
    if (!c->hold_bytes_max)
        c->hold_bytes_max = KVR_KVSUB_HOLD_BYTES;
    if (c->rcvhwm <= 0)
        c->rcvhwm = KVR_KVZMQ_HWM_DEFAULT;
}

struct kvr_kvsub *kvr_kvsub_open(const struct kvr_kvsub_config *cfg,
                                 const struct kvr_kvsub_hooks *hooks, kvr_status *st)
{
    kvr_status dummy;
    if (!st)
        st = &dummy;
    *st = KVR_ERR_INVALID;
    if (!cfg || !cfg->endpoint || !hooks || !hooks->batch)
        return NULL;
    struct kvr_kvsub *s = calloc(1, sizeof *s);
    if (!s) {
        *st = KVR_ERR_NOMEM;
        return NULL;
    }
    s->wake[0] = s->wake[1] = -1;
    pthread_mutex_init(&s->mu, NULL);
    s->cfg = *cfg;
    s->hooks = *hooks;
    defaults(&s->cfg);
    if (kvr_kvzmq_endpoint_fix(cfg->endpoint, s->endpoint, sizeof s->endpoint) != KVR_OK ||
        (cfg->replay_endpoint && kvr_kvzmq_endpoint_fix(cfg->replay_endpoint, s->replay_endpoint,
                                                        sizeof s->replay_endpoint) != KVR_OK))
        goto fail;
    s->cfg.endpoint = s->endpoint;
    s->cfg.replay_endpoint = cfg->replay_endpoint ? s->replay_endpoint : NULL;
    s->topic_len = cfg->topic ? strlen(cfg->topic) : 0;
    s->topic = malloc(s->topic_len + 1);
    if (!s->topic) {
        *st = KVR_ERR_NOMEM;
        goto fail;
    }
    memcpy(s->topic, cfg->topic ? cfg->topic : "", s->topic_len + 1);
    s->cfg.topic = s->topic;
    if (pipe(s->wake) != 0) {
        s->wake[0] = s->wake[1] = -1;
        *st = KVR_ERR_IO;
        goto fail;
    }
    fcntl(s->wake[0], F_SETFL, O_NONBLOCK);
    fcntl(s->wake[1], F_SETFL, O_NONBLOCK);
    *st = KVR_ERR_IO;
    s->zctx = zmq_ctx_new();
    if (!s->zctx)
        goto fail;
    s->sub = zmq_socket(s->zctx, ZMQ_SUB);
    if (!s->sub)
        goto fail;
    set_int(s->sub, ZMQ_RCVHWM, s->cfg.rcvhwm);
    set_int(s->sub, ZMQ_LINGER, 0);
    int64_t max = (int64_t)s->cfg.limits.max_bytes;
    zmq_setsockopt(s->sub, ZMQ_MAXMSGSIZE, &max, sizeof max);
    zmq_setsockopt(s->sub, ZMQ_SUBSCRIBE, s->topic, s->topic_len);
    if (zmq_connect(s->sub, s->endpoint) != 0) {
        *st = KVR_ERR_INVALID;
        goto fail;
    }
    if (s->cfg.replay_endpoint) {
        s->dealer = open_dealer(s);
        if (!s->dealer) {
            *st = KVR_ERR_INVALID;
            goto fail;
        }
    }
    if (pthread_create(&s->thread, NULL, sub_thread, s) != 0) {
        *st = KVR_ERR_NOMEM;
        goto fail;
    }
    *st = KVR_OK;
    return s;
fail:
    destroy(s);
    return NULL;
}

void kvr_kvsub_stats(struct kvr_kvsub *s, struct kvr_kvsub_stats *out)
{
    if (!s || !out)
        return;
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    pthread_mutex_unlock(&s->mu);
}

void kvr_kvsub_rewind(struct kvr_kvsub *s)
{
    if (!s)
        return;
    atomic_store(&s->rewind, true);
    ssize_t w = write(s->wake[1], "x", 1);
    (void)w;
}

void kvr_kvsub_close(struct kvr_kvsub *s)
{
    if (!s)
        return;
    atomic_store(&s->stop, true);
    ssize_t w = write(s->wake[1], "x", 1);
    (void)w;
    pthread_join(s->thread, NULL);
    destroy(s);
}
