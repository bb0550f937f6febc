/*
 * kvr_outbox implementation.
 */
#define _DEFAULT_SOURCE
#include "outbox.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"

/* A message's data, subject and reply subject share one allocation, data first (its alignment). */
static void free_msg(struct kvr_outmsg *m)
{
    free(m->data);
}

static void add(struct kvr_outbox *o, const char *subject, const char *reply, const void *data,
                size_t len, kvr_status err, uint64_t tag)
{
    if (!subject || !*subject)
        return;
    size_t ns = strlen(subject) + 1, nr = reply ? strlen(reply) + 1 : 0;
    uint8_t *block = NULL;
    if (o->n == UINT32_MAX || len > SIZE_MAX - ns - nr || !KVR_GROW(o->v, o->cap, o->n + 1, 64) ||
        !(block = malloc(len + ns + nr))) {
        o->dropped++;
        return;
    }
    struct kvr_outmsg *m = &o->v[o->n];
    if (len)
        memcpy(block, data, len);
    m->data = block;
    m->subject = memcpy(block + len, subject, ns);
    m->reply = reply ? memcpy(block + len + ns, reply, nr) : NULL;
    m->len = len;
    m->err = err;
    m->tag = tag;
    o->n++;
}

void kvr_outbox_add(struct kvr_outbox *o, const char *subject, const void *data, size_t len,
                    kvr_status err)
{
    add(o, subject, NULL, data, len, err, 0);
}

void kvr_outbox_add_request(struct kvr_outbox *o, const char *subject, const char *reply,
                            const void *data, size_t len)
{
    add(o, subject, reply, data, len, KVR_OK, 0);
}

void kvr_outbox_add_tagged(struct kvr_outbox *o, const char *subject, const char *reply,
                           const void *data, size_t len, uint64_t tag)
{
    add(o, subject, reply, data, len, KVR_OK, tag);
}

void kvr_outbox_failures_free(struct kvr_outbox_failures *f)
{
    free(f->v);
    memset(f, 0, sizeof *f);
}

/* Tagged message m failed with st: appended to f (or counted lost). */
static void note_failure(struct kvr_outbox_failures *f, const struct kvr_outmsg *m, kvr_status st)
{
    if (!f || !m->tag)
        return;
    if (f->n == UINT32_MAX || !KVR_GROW(f->v, f->cap, f->n + 1, 16)) {
        f->lost++;
        return;
    }
    f->v[f->n++] = (struct kvr_outbox_failure){m->tag, st};
}

uint32_t kvr_outbox_flush(struct kvr_outbox *o, struct kvr_sink *sink,
                          struct kvr_outbox_failures *failures)
{
    uint32_t failed = 0;
    for (uint32_t i = 0; i < o->n; i++) {
        kvr_status st = sink->publish(sink->ctx, &o->v[i]);
        if (st != KVR_OK) {
            failed++;
            note_failure(failures, &o->v[i], st);
        }
        free_msg(&o->v[i]);
    }
    o->n = 0;
    if (failed)
        atomic_fetch_add_explicit(&sink->failed, failed, memory_order_relaxed);
    return failed;
}

uint32_t kvr_outbox_send_report(struct kvr_outbox *o, pthread_mutex_t *mu, struct kvr_sink *sink,
                                struct kvr_outbox_failures *failures)
{
    struct kvr_outbox local = {0};
    pthread_mutex_lock(mu);
    kvr_outbox_swap(&local, o);
    pthread_mutex_unlock(mu);
    uint32_t failed = kvr_outbox_flush(&local, sink, failures);
    kvr_outbox_free(&local);
    return failed;
}

void kvr_outbox_send(struct kvr_outbox *o, pthread_mutex_t *mu, struct kvr_sink *sink)
{
    kvr_outbox_send_report(o, mu, sink, NULL);
}

void kvr_outbox_swap(struct kvr_outbox *a, struct kvr_outbox *b)
{
    struct kvr_outbox t = *a;
    a->v = b->v;
    a->n = b->n;
    a->cap = b->cap;
    b->v = t.v;
    b->n = t.n;
    b->cap = t.cap;
}

void kvr_outbox_free(struct kvr_outbox *o)
{
    for (uint32_t i = 0; i < o->n; i++)
        free_msg(&o->v[i]);
    free(o->v);
    memset(o, 0, sizeof *o);
}

void kvr_turns_init(struct kvr_turns *t)
{
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->next = t->now = 0;
}

void kvr_turns_destroy(struct kvr_turns *t)
{
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
}

uint32_t kvr_turns_flush(struct kvr_turns *t, uint64_t turn, struct kvr_outbox *o,
                         struct kvr_sink *sink, struct kvr_outbox_failures *failures)
{
    pthread_mutex_lock(&t->mu);
    while (t->now != turn)
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
    uint32_t failed = kvr_outbox_flush(o, sink, failures);
    pthread_mutex_lock(&t->mu);
    t->now++;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    return failed;
}
