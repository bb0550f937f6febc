/*
 * The last moment's KV events (kvlog.h).
 */
#include "kvlog.h"

#include <stdlib.h>
#include <string.h>

void kvr_kvlog_init(struct kvr_kvlog *l, uint64_t window_ns, uint32_t max_events, size_t max_bytes)
{
    memset(l, 0, sizeof *l);
    l->window_ns = window_ns;
    l->max_events = max_events ? max_events : KVR_KVLOG_EVENTS;
    l->max_bytes = max_bytes ? max_bytes : KVR_KVLOG_BYTES;
}

static void drop_oldest(struct kvr_kvlog *l)
{
    struct kvr_kvlog_event *e = &l->ev[l->head];
    l->bytes -= e->len;
    free(e->data);
    e->data = NULL;
    l->head = (l->head + 1) % l->max_events;
    l->n--;
}

void kvr_kvlog_free(struct kvr_kvlog *l)
{
    while (l->n)
        drop_oldest(l);
    free(l->ev);
    memset(l, 0, sizeof *l);
}

bool kvr_kvlog_add(struct kvr_kvlog *l, uint64_t worker_id, uint64_t seq, uint64_t t,
                   const void *data, size_t len)
{
    while (l->n && l->ev[l->head].t + l->window_ns < t)
        drop_oldest(l); /* out of the window */
    if (len > l->max_bytes || (!l->ev && !(l->ev = calloc(l->max_events, sizeof *l->ev)))) {
        l->dropped++;
        return false;
    }
    while (l->n && (l->n == l->max_events || l->bytes + len > l->max_bytes)) {
        drop_oldest(l);
        l->dropped++;
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) {
        l->dropped++;
        return false;
    }
    if (len)
        memcpy(copy, data, len);
    uint64_t last = l->n ? l->ev[(l->head + l->n - 1) % l->max_events].t : 0;
    l->ev[(l->head + l->n) % l->max_events] =
        (struct kvr_kvlog_event){worker_id, seq, t > last ? t : last, copy, len, false};
    l->n++;
    l->bytes += len;
    return true;
}

uint32_t kvr_kvlog_mark(struct kvr_kvlog *l, uint64_t from,
                        bool (*keep)(void *ctx, const struct kvr_kvlog_event *e), void *ctx)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < l->n; i++) {
        struct kvr_kvlog_event *e = &l->ev[(l->head + i) % l->max_events];
        e->replay = e->t >= from && (!keep || keep(ctx, e));
        k += e->replay;
    }
    return k;
}

uint32_t kvr_kvlog_replay(struct kvr_kvlog *l,
                          void (*fn)(void *ctx, const struct kvr_kvlog_event *e), void *ctx)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < l->n; i++) {
        struct kvr_kvlog_event *e = &l->ev[(l->head + i) % l->max_events];
        if (e->replay) {
            e->replay = false;
            fn(ctx, e);
            k++;
        }
    }
    return k;
}
