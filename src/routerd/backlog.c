/*
 * How far behind a subscription's handler runs (backlog.h).
 */
#include "backlog.h"

#include <stdatomic.h>

void kvr_backlog_start(struct kvr_backlog *b, uint64_t now)
{
    b->n = 0;
    b->heard = now;
}

void kvr_backlog_done(struct kvr_backlog *b)
{
    atomic_fetch_add_explicit(&b->done, 1, memory_order_release);
}

uint64_t kvr_backlog_note(struct kvr_backlog *b, uint64_t now, uint64_t received)
{
    uint64_t done = atomic_load_explicit(&b->done, memory_order_acquire);
    if (received <= done) { /* caught up: nothing waits */
        b->n = 0;
        b->heard = now > b->heard ? now : b->heard;
        return b->heard;
    }
    while (b->n && b->note[b->head].received <= done) {
        if (b->note[b->head].t > b->heard)
            b->heard = b->note[b->head].t;
        b->head = (b->head + 1) % KVR_BACKLOG_NOTES;
        b->n--;
    }
    if (b->n < KVR_BACKLOG_NOTES) {
        uint32_t tail = (b->head + b->n) % KVR_BACKLOG_NOTES;
        b->note[tail].t = now;
        b->note[tail].received = received;
        b->n++;
    }
    return b->heard;
}
