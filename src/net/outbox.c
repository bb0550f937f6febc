/*
 * kvr_outbox implementation.
 */
#include "outbox.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

void kvr_outbox_add(struct kvr_outbox *o, const char *subject, const void *data, size_t len,
                    kvr_status err)
{
    if (!subject || !*subject)
        return;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        struct kvr_outmsg *v = realloc(o->v, cap * sizeof *v);
        if (!v) {
            o->dropped++;
            return;
        }
        o->v = v;
        o->cap = cap;
    }
    struct kvr_outmsg *m = &o->v[o->n];
    m->subject = strdup(subject);
    m->data = malloc(len ? len : 1);
    if (!m->subject || !m->data) {
        free(m->subject);
        free(m->data);
        o->dropped++;
        return;
    }
    memcpy(m->data, data, len);
    m->len = len;
    m->err = err;
    o->n++;
}

size_t kvr_outbox_flush(struct kvr_outbox *o, natsConnection *nc)
{
    size_t failed = 0;
    for (size_t i = 0; i < o->n; i++) {
        struct kvr_outmsg *m = &o->v[i];
        if (kvr_publish(nc, m->subject, m->data, m->len, m->err) != KVR_OK)
            failed++;
        free(m->subject);
        free(m->data);
    }
    o->n = 0;
    return failed;
}

void kvr_outbox_swap(struct kvr_outbox *a, struct kvr_outbox *b)
{
    struct kvr_outbox t = *a;
    *a = *b;
    *b = t;
}

void kvr_outbox_free(struct kvr_outbox *o)
{
    for (size_t i = 0; i < o->n; i++) {
        free(o->v[i].subject);
        free(o->v[i].data);
    }
    free(o->v);
    memset(o, 0, sizeof *o);
}
