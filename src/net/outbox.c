/*
 * kvr_outbox implementation.
 */
#include "outbox.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

static void add(struct kvr_outbox *o, const char *subject, const char *reply, const void *data,
                size_t len, kvr_status err)
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
    m->reply = reply ? strdup(reply) : NULL;
    m->data = malloc(len ? len : 1);
    if (!m->subject || !m->data || (reply && !m->reply)) {
        free(m->subject);
        free(m->reply);
        free(m->data);
        o->dropped++;
        return;
    }
    memcpy(m->data, data, len);
    m->len = len;
    m->err = err;
    o->n++;
}

void kvr_outbox_add(struct kvr_outbox *o, const char *subject, const void *data, size_t len,
                    kvr_status err)
{
    add(o, subject, NULL, data, len, err);
}

void kvr_outbox_add_request(struct kvr_outbox *o, const char *subject, const char *reply,
                            const void *data, size_t len)
{
    add(o, subject, reply, data, len, KVR_OK);
}

size_t kvr_outbox_flush(struct kvr_outbox *o, natsConnection *nc)
{
    size_t failed = 0;
    for (size_t i = 0; i < o->n; i++) {
        struct kvr_outmsg *m = &o->v[i];
        kvr_status st = m->reply ? (natsConnection_PublishRequest(nc, m->subject, m->reply, m->data,
                                                                  (int)m->len) == NATS_OK
                                        ? KVR_OK
                                        : KVR_ERR_IO)
                                 : kvr_publish(nc, m->subject, m->data, m->len, m->err);
        failed += st != KVR_OK;
        free(m->subject);
        free(m->reply);
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
        free(o->v[i].reply);
        free(o->v[i].data);
    }
    free(o->v);
    memset(o, 0, sizeof *o);
}
