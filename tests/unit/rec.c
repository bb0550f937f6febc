/*
 * The unit tests' recording sink (rec.h).
 */
#define _DEFAULT_SOURCE
#include "rec.h"

#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

struct rec_sent rec_sent[REC_MAX];
size_t rec_nsent;

kvr_status rec_record(void *ctx, const struct kvr_outmsg *m)
{
    (void)ctx;
    cr_assert(lt(sz, rec_nsent, (size_t)REC_MAX));
    struct rec_sent *s = &rec_sent[rec_nsent++];
    s->subject = strdup(m->subject);
    s->reply = strdup(m->reply ? m->reply : "");
    s->data = malloc(m->len + 1);
    memcpy(s->data, m->data, m->len);
    s->data[m->len] = 0;
    s->len = m->len;
    s->err = m->err;
    return KVR_OK;
}

void rec_truncate(size_t mark)
{
    for (size_t i = mark; i < rec_nsent; i++) {
        free(rec_sent[i].subject);
        free(rec_sent[i].reply);
        free(rec_sent[i].data);
    }
    if (mark < rec_nsent)
        rec_nsent = mark;
}

void rec_reset(void)
{
    rec_truncate(0);
}

int rec_count(const char *subject, size_t from, const struct rec_sent **last)
{
    int n = 0;
    for (size_t i = from; i < rec_nsent; i++) {
        if (!strcmp(rec_sent[i].subject, subject)) {
            n++;
            if (last)
                *last = &rec_sent[i];
        }
    }
    return n;
}

uint32_t rec_error_in(const struct rec_sent *m)
{
    struct kvr_wire_response r;
    cr_assert(eq(int, kvr_wire_decode_response(m->data, m->len, &r), KVR_OK));
    cr_assert(r.final, "an error is a final chunk");
    uint32_t code = r.error_code;
    cr_assert(eq(u32, (uint32_t)m->err, code), "the service error header carries the code");
    kvr_wire_response_free(&r);
    return code;
}

struct rec_event rec_heartbeat(uint64_t wid, uint64_t capacity, const uint64_t *keys, uint32_t n,
                               uint32_t interval_ms, uint32_t forwards_waiting)
{
    struct kvr_wire_heartbeat h = {
        .info = {.id = wid, .block_size = 64, .capacity_blocks = capacity},
        .inflight = (uint64_t *)keys,
        .ninflight = n,
        .interval_ms = interval_ms,
        .forwards_waiting = forwards_waiting};
    struct rec_event e = {.b = {0}};
    snprintf(e.subject, sizeof e.subject, "kv.default.ev.%llu.hb", (unsigned long long)wid);
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&e.b, &h), KVR_OK));
    return e;
}

static pthread_mutex_t order_mu = PTHREAD_MUTEX_INITIALIZER;
uint64_t rec_order_next, rec_order_wrong;

kvr_status rec_order_sink(void *ctx, const struct kvr_outmsg *m)
{
    (void)ctx;
    uint64_t v;
    if (strcmp(m->subject, "order.test") || m->len != sizeof v)
        return KVR_OK;
    memcpy(&v, m->data, sizeof v);
    sched_yield(); /* a publish takes a while: a thread that unlocked later may overtake */
    pthread_mutex_lock(&order_mu);
    rec_order_wrong += v != rec_order_next;
    rec_order_next = v + 1;
    pthread_mutex_unlock(&order_mu);
    return KVR_OK;
}

struct order_run {
    int each;
    pthread_mutex_t *mu;
    struct kvr_outbox *out;
    void (*unlock)(void *ctx);
    void *ctx;
    uint64_t seq; /* under mu */
};

static void *order_thread(void *arg)
{
    struct order_run *r = arg;
    for (int i = 0; i < r->each; i++) {
        pthread_mutex_lock(r->mu);
        uint64_t v = r->seq++;
        kvr_outbox_add(r->out, "order.test", &v, sizeof v, KVR_OK);
        r->unlock(r->ctx);
    }
    return NULL;
}

void rec_order_run(int nthreads, int each, pthread_mutex_t *mu, struct kvr_outbox *out,
                   void (*unlock)(void *ctx), void *ctx)
{
    struct order_run r = {each, mu, out, unlock, ctx, 0};
    pthread_t t[16];
    cr_assert(nthreads > 0 && nthreads <= 16);
    for (int i = 0; i < nthreads; i++)
        cr_assert(eq(int, pthread_create(&t[i], NULL, order_thread, &r), 0));
    for (int i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
}
