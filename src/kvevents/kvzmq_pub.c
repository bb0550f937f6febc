/*
 * kvzmq publisher: the engine side of the KV-event wire (kvzmq.h). publish() runs on any thread:
 * under the mutex it numbers the batch and puts it in the ring (refcounted entries), then wakes
 * the publisher's thread through a pipe. That thread owns both sockets (an XPUB, so it can count
 * subscriptions, and the replay ROUTER): it sends every ring entry it has not sent yet, zero-copy
 * (each message holds a reference to its entry), and answers replay requests from the ring.
 * Invariant: send_next <= next_seq; entries in the ring have consecutive seqs.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "clock.h"
#include "kvzmq.h"
#include "kvzmq_internal.h"

#define REPLAY_REQ_MAX    64 /* bytes of one replay request frame (ZMQ_MAXMSGSIZE) */
#define REPLAY_FRAMES_MAX 8  /* frames of one replay request read before the rest is drained */
#define CLOSE_LINGER_MS   100

struct entry {
    atomic_uint refs;
    uint64_t seq;
    bool send; /* false: kvr_kvpub_drop'ed, never sent on the PUB socket */
    size_t len;
    uint8_t data[];
};

struct kvr_kvpub {
    void *zctx;
    void *pub;    /* XPUB, the thread's */
    void *replay; /* ROUTER or NULL, the thread's */
    int wake[2];  /* pipe: publish and close write a byte, the thread reads */
    pthread_t thread;
    char endpoint[KVR_KVZMQ_ENDPOINT_MAX];
    char replay_endpoint[KVR_KVZMQ_ENDPOINT_MAX];
    char *topic;
    size_t topic_len;

    pthread_mutex_t mu; /* everything below */
    pthread_cond_t subs_cv;
    struct entry **ring; /* cap slots; count entries from head (oldest) */
    uint32_t cap, head, count;
    uint64_t next_seq;  /* seq of the next publish */
    uint64_t send_next; /* seq of the next entry the thread has to send */
    uint32_t drop_left; /* kvr_kvpub_drop */
    bool closing;
    struct kvr_kvpub_stats st;
    int64_t subs; /* subscriptions less unsubscriptions */
};

/* ---- entries -------------------------------------------------------------------------------- */

static void entry_unref(struct entry *e)
{
    if (e && atomic_fetch_sub(&e->refs, 1) == 1)
        free(e);
}

static void entry_ref(struct entry *e)
{
    atomic_fetch_add(&e->refs, 1);
}

static void msg_free(void *data, void *hint)
{
    (void)data;
    entry_unref(hint);
}

/* A ring entry by seq (under mu), or NULL when it has left the ring or is not there yet. */
static struct entry *ring_at(struct kvr_kvpub *p, uint64_t seq)
{
    if (p->count == 0)
        return NULL;
    uint64_t first = p->ring[p->head]->seq;
    if (seq < first || seq - first >= p->count)
        return NULL;
    return p->ring[(p->head + (uint32_t)(seq - first)) % p->cap];
}

/* References to the ring's entries with seq >= from (under mu), into a malloc'ed array. */
static struct entry **ring_from(struct kvr_kvpub *p, uint64_t from, uint32_t *n)
{
    *n = 0;
    if (p->count == 0)
        return NULL;
    uint64_t first = p->ring[p->head]->seq;
    if (from < first)
        from = first;
    uint64_t end = first + p->count;
    if (from >= end)
        return NULL;
    uint32_t k = (uint32_t)(end - from);
    struct entry **v = malloc((size_t)k * sizeof *v);
    if (!v)
        return NULL;
    for (uint32_t i = 0; i < k; i++) {
        v[i] = ring_at(p, from + i);
        entry_ref(v[i]);
    }
    *n = k;
    return v;
}

/* ---- sending -------------------------------------------------------------------------------- */

static void put_be64(uint8_t *b, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        b[i] = (uint8_t)v;
        v >>= 8;
    }
}

/* The entry's bytes as the last frame of a message, zero-copy (the message holds a reference). */
static int send_payload(void *sock, struct entry *e)
{
    zmq_msg_t m;
    entry_ref(e);
    if (e->len == 0) {
        zmq_msg_init(&m);
        entry_unref(e);
    } else if (zmq_msg_init_data(&m, e->data, e->len, msg_free, e) != 0) {
        entry_unref(e);
        return -1;
    }
    int rc = zmq_msg_send(&m, sock, ZMQ_DONTWAIT);
    if (rc < 0)
        zmq_msg_close(&m);
    return rc < 0 ? -1 : 0;
}

static void send_live(struct kvr_kvpub *p, struct entry *e)
{
    uint8_t seq[8];
    put_be64(seq, e->seq);
    if (zmq_send(p->pub, p->topic, p->topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return;
    zmq_send(p->pub, seq, sizeof seq, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    if (send_payload(p->pub, e) == 0) {
        pthread_mutex_lock(&p->mu);
        p->st.sent++;
        pthread_mutex_unlock(&p->mu);
    }
}

/* Send what publish() added since the last time. */
static void flush_new(struct kvr_kvpub *p)
{
    pthread_mutex_lock(&p->mu);
    uint64_t first = p->count ? p->ring[p->head]->seq : p->next_seq;
    if (p->send_next < first) {
        p->st.lost += first - p->send_next;
        p->send_next = first;
    }
    uint32_t n;
    struct entry **v = ring_from(p, p->send_next, &n);
    if (v || n == 0)
        p->send_next += n;
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 0; i < n; i++) {
        if (v[i]->send)
            send_live(p, v[i]);
        entry_unref(v[i]);
    }
    free(v);
}

/* ---- replay --------------------------------------------------------------------------------- */

/* One reply [identity, ("",) seq, payload] on the ROUTER; e NULL: the end marker. */
static void send_reply(struct kvr_kvpub *p, const zmq_msg_t *id, bool delim, struct entry *e)
{
    uint8_t seq[8];
    put_be64(seq, e ? e->seq : KVR_KVZMQ_SEQ_END);
    if (zmq_send(p->replay, zmq_msg_data((zmq_msg_t *)id), zmq_msg_size((zmq_msg_t *)id),
                 ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return;
    if (delim)
        zmq_send(p->replay, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(p->replay, seq, sizeof seq, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    if (e)
        send_payload(p->replay, e);
    else
        zmq_send(p->replay, "", 0, ZMQ_DONTWAIT);
}

static uint64_t rd_be64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | b[i];
    return v;
}

/* Read one request (all its frames) and answer it. */
static void serve_replay(struct kvr_kvpub *p)
{
    zmq_msg_t f[REPLAY_FRAMES_MAX];
    int n = 0;
    bool more = true, too_many = false;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, p->replay, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break;
        }
        more = zmq_msg_more(&m);
        if (n < REPLAY_FRAMES_MAX) {
            f[n++] = m;
        } else {
            too_many = true;
            zmq_msg_close(&m);
        }
    }
    if (n == 0)
        return;
    /* f[0] is the identity; then an optional empty delimiter, then the 8-byte seq. */
    bool delim = n >= 2 && zmq_msg_size(&f[1]) == 0;
    int body = delim ? 2 : 1;
    bool ok = !too_many && n == body + 1 && zmq_msg_size(&f[body]) == 8;
    if (!ok) {
        pthread_mutex_lock(&p->mu);
        p->st.replay_bad++;
        pthread_mutex_unlock(&p->mu);
        if (n >= 1)
            send_reply(p, &f[0], delim, NULL);
    } else {
        uint64_t from = rd_be64(zmq_msg_data(&f[body]));
        pthread_mutex_lock(&p->mu);
        p->st.replay_requests++;
        uint32_t k = 0;
        struct entry **v = ring_from(p, from, &k);
        p->st.replayed += k;
        pthread_mutex_unlock(&p->mu);
        for (uint32_t i = 0; i < k; i++) {
            send_reply(p, &f[0], delim, v[i]);
            entry_unref(v[i]);
        }
        free(v);
        send_reply(p, &f[0], delim, NULL);
    }
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
}

/* Subscription messages on the XPUB: 1 topic... subscribes, 0 topic... unsubscribes. */
static void read_subscriptions(struct kvr_kvpub *p)
{
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, p->pub, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        if (zmq_msg_size(&m) >= 1) {
            uint8_t c = *(uint8_t *)zmq_msg_data(&m);
            pthread_mutex_lock(&p->mu);
            if (c == 1)
                p->subs++;
            else if (c == 0 && p->subs > 0)
                p->subs--;
            p->st.subscribers = (uint32_t)p->subs;
            pthread_cond_broadcast(&p->subs_cv);
            pthread_mutex_unlock(&p->mu);
        }
        zmq_msg_close(&m);
    }
}

static void drain_pipe(int fd)
{
    char b[64];
    while (read(fd, b, sizeof b) > 0) {
    }
}

static void *pub_thread(void *arg)
{
    struct kvr_kvpub *p = arg;
    for (;;) {
        zmq_pollitem_t it[3] = {
            {NULL, p->wake[0], ZMQ_POLLIN, 0},
            {p->pub, 0, ZMQ_POLLIN, 0},
            {p->replay, 0, ZMQ_POLLIN, 0},
        };
        int n = zmq_poll(it, p->replay ? 3 : 2, -1);
        if (n < 0 && zmq_errno() != EINTR)
            break;
        if (it[0].revents & ZMQ_POLLIN)
            drain_pipe(p->wake[0]);
        flush_new(p);
        if (it[1].revents & ZMQ_POLLIN)
            read_subscriptions(p);
        if (p->replay && (it[2].revents & ZMQ_POLLIN))
            for (int i = 0; i < 64; i++) { /* a bounded turn, then the live batches again */
                int ev = 0;
                size_t sz = sizeof ev;
                if (zmq_getsockopt(p->replay, ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & ZMQ_POLLIN))
                    break;
                serve_replay(p);
                flush_new(p);
            }
        pthread_mutex_lock(&p->mu);
        bool done = p->closing && p->send_next >= p->next_seq;
        pthread_mutex_unlock(&p->mu);
        if (done)
            break;
    }
    return NULL;
}

/* ---- public --------------------------------------------------------------------------------- */

static void wake(struct kvr_kvpub *p)
{
    ssize_t w = write(p->wake[1], "x", 1);
    (void)w; /* a full pipe already wakes the thread */
}

static void set_int(void *s, int opt, int v)
{
    zmq_setsockopt(s, opt, &v, sizeof v);
}

static kvr_status bind_to(void *s, const char *endpoint, char *bound)
{
    char ep[KVR_KVZMQ_ENDPOINT_MAX];
    if (kvr_kvzmq_endpoint_fix(endpoint, ep, sizeof ep) != KVR_OK)
        return KVR_ERR_INVALID;
    if (zmq_bind(s, ep) != 0)
        return zmq_errno() == EINVAL || zmq_errno() == EPROTONOSUPPORT ? KVR_ERR_INVALID
                                                                       : KVR_ERR_IO;
    size_t sz = KVR_KVZMQ_ENDPOINT_MAX;
    if (zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, bound, &sz) != 0)
        bound[0] = '\0';
    bound[KVR_KVZMQ_ENDPOINT_MAX - 1] = '\0';
    return KVR_OK;
}

static void destroy(struct kvr_kvpub *p)
{
    if (p->pub)
        zmq_close(p->pub);
    if (p->replay)
        zmq_close(p->replay);
    if (p->zctx)
        zmq_ctx_term(p->zctx);
    for (uint32_t i = 0; i < p->count; i++)
        entry_unref(p->ring[(p->head + i) % p->cap]);
    free(p->ring);
    free(p->topic);
    if (p->wake[0] >= 0)
        close(p->wake[0]);
    if (p->wake[1] >= 0)
        close(p->wake[1]);
    pthread_cond_destroy(&p->subs_cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

struct kvr_kvpub *kvr_kvpub_open(const char *endpoint, const char *replay_endpoint,
                                 const char *topic, uint32_t ring_batches, kvr_status *st)
{
    kvr_status dummy;
    if (!st)
        st = &dummy;
    *st = KVR_ERR_INVALID;
    if (!endpoint)
        return NULL;
    struct kvr_kvpub *p = calloc(1, sizeof *p);
    if (!p) {
        *st = KVR_ERR_NOMEM;
        return NULL;
    }
    p->wake[0] = p->wake[1] = -1;
    pthread_mutex_init(&p->mu, NULL);
    kvr_cond_init_monotonic(&p->subs_cv);
    p->cap = ring_batches ? ring_batches : KVR_KVPUB_RING_DEFAULT;
    p->ring = calloc(p->cap, sizeof *p->ring);
    p->topic_len = topic ? strlen(topic) : 0;
    p->topic = malloc(p->topic_len + 1);
    if (!p->ring || !p->topic) {
        *st = KVR_ERR_NOMEM;
        goto fail;
    }
    memcpy(p->topic, topic ? topic : "", p->topic_len + 1);
    if (pipe(p->wake) != 0) {
        p->wake[0] = p->wake[1] = -1;
        *st = KVR_ERR_IO;
        goto fail;
    }
    fcntl(p->wake[0], F_SETFL, O_NONBLOCK);
    fcntl(p->wake[1], F_SETFL, O_NONBLOCK);
    p->zctx = zmq_ctx_new();
    if (!p->zctx) {
        *st = KVR_ERR_IO;
        goto fail;
    }
    p->pub = zmq_socket(p->zctx, ZMQ_XPUB);
    if (!p->pub) {
        *st = KVR_ERR_IO;
        goto fail;
    }
    set_int(p->pub, ZMQ_SNDHWM, KVR_KVZMQ_HWM_DEFAULT);
    set_int(p->pub, ZMQ_LINGER, CLOSE_LINGER_MS);
    set_int(p->pub, ZMQ_XPUB_VERBOSER, 1);
    if ((*st = bind_to(p->pub, endpoint, p->endpoint)) != KVR_OK)
        goto fail;
    if (replay_endpoint) {
        p->replay = zmq_socket(p->zctx, ZMQ_ROUTER);
        if (!p->replay) {
            *st = KVR_ERR_IO;
            goto fail;
        }
        int64_t max = REPLAY_REQ_MAX;
        zmq_setsockopt(p->replay, ZMQ_MAXMSGSIZE, &max, sizeof max);
        int hwm = p->cap > (uint32_t)(INT32_MAX - 16) ? 0 : (int)p->cap + 16;
        set_int(p->replay, ZMQ_SNDHWM, hwm);
        set_int(p->replay, ZMQ_LINGER, 0);
        if ((*st = bind_to(p->replay, replay_endpoint, p->replay_endpoint)) != KVR_OK)
            goto fail;
    }
    if (pthread_create(&p->thread, NULL, pub_thread, p) != 0) {
        *st = KVR_ERR_NOMEM;
        goto fail;
    }
    *st = KVR_OK;
    return p;
fail:
    destroy(p);
    return NULL;
}

kvr_status kvr_kvpub_endpoint(struct kvr_kvpub *p, bool replay, char *buf, size_t cap)
{
    if (!p || !buf)
        return KVR_ERR_INVALID;
    const char *ep = replay ? p->replay_endpoint : p->endpoint;
    if (replay && !p->replay)
        return KVR_ERR_INVALID;
    size_t n = strlen(ep);
    if (n + 1 > cap)
        return KVR_ERR_INVALID;
    memcpy(buf, ep, n + 1);
    return KVR_OK;
}

kvr_status kvr_kvpub_publish(struct kvr_kvpub *p, const void *payload, size_t len,
                             uint64_t *seq_out)
{
    if (!p || (!payload && len) || len > KVR_KVEV_MAX_BYTES)
        return KVR_ERR_INVALID;
    struct entry *e = malloc(sizeof *e + len);
    if (!e)
        return KVR_ERR_NOMEM;
    atomic_init(&e->refs, 1);
    e->len = len;
    if (len)
        memcpy(e->data, payload, len);
    struct entry *evicted = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->closing) {
        pthread_mutex_unlock(&p->mu);
        free(e);
        return KVR_ERR_SHUTDOWN;
    }
    uint64_t seq = e->seq = p->next_seq++;
    e->send = true;
    if (p->drop_left > 0) {
        p->drop_left--;
        e->send = false;
        p->st.dropped++;
    }
    if (p->count == p->cap) {
        evicted = p->ring[p->head];
        p->head = (p->head + 1) % p->cap;
        p->count--;
    }
    p->ring[(p->head + p->count) % p->cap] = e;
    p->count++;
    p->st.published++;
    pthread_mutex_unlock(&p->mu);
    entry_unref(evicted);
    if (seq_out)
        *seq_out = seq;
    wake(p);
    return KVR_OK;
}

void kvr_kvpub_drop(struct kvr_kvpub *p, uint32_t n)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->drop_left += n;
    pthread_mutex_unlock(&p->mu);
}

bool kvr_kvpub_wait_subscribers(struct kvr_kvpub *p, uint32_t n, uint32_t timeout_ms)
{
    if (!p)
        return false;
    struct timespec dl = kvr_deadline_ms(timeout_ms);
    pthread_mutex_lock(&p->mu);
    while (p->subs < (int64_t)n)
        if (pthread_cond_timedwait(&p->subs_cv, &p->mu, &dl) == ETIMEDOUT)
            break;
    bool ok = p->subs >= (int64_t)n;
    pthread_mutex_unlock(&p->mu);
    return ok;
}

void kvr_kvpub_stats(struct kvr_kvpub *p, struct kvr_kvpub_stats *out)
{
    if (!p || !out)
        return;
    pthread_mutex_lock(&p->mu);
    *out = p->st;
    out->next_seq = p->next_seq;
    out->ring = p->count;
    pthread_mutex_unlock(&p->mu);
}

void kvr_kvpub_close(struct kvr_kvpub *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->closing = true;
    pthread_mutex_unlock(&p->mu);
    wake(p);
    pthread_join(p->thread, NULL);
    destroy(p);
}
