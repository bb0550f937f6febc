/*
 * The last KV event sequence number per worker.
 */
#include "kvseq.h"

#include <stdlib.h>
#include <string.h>

#include "grow.h"

void kvr_kvseq_free(struct kvr_kvseq *s)
{
    if (s->at.groups)
        kvr_map_free(&s->at);
    free(s->w);
    *s = (struct kvr_kvseq){0};
}

/* Forget every worker (the table is full): the next event of each is its first. */
static void start_over(struct kvr_kvseq *s)
{
    kvr_map_free(&s->at); /* slots NULL: the next note initialises it again */
    s->n = 0;
}

/* a + b, at most UINT64_MAX (a number from the wire does not wrap a count to 0). */
static uint64_t add(uint64_t a, uint64_t b)
{
    return b > UINT64_MAX - a ? UINT64_MAX : a + b;
}

/* skipped numbers did not come (yet). */
static uint64_t skip(struct kvr_kvseq *s, uint64_t skipped)
{
    if (skipped) {
        s->missed = add(s->missed, skipped);
        s->open = add(s->open, skipped);
        s->gaps++;
    }
    return skipped;
}

/* One open number came after all. */
static void came_late(struct kvr_kvseq *s)
{
    if (s->open) {
        s->open--;
        s->late++;
    }
}

static bool bit(const struct kvr_kvseq_worker *w, uint64_t n)
{
    uint64_t r = n % KVR_KVSEQ_REORDER;
    return w->missing[r / 64] >> (r % 64) & 1;
}

static void set_bit(struct kvr_kvseq_worker *w, uint64_t n, bool open)
{
    uint64_t r = n % KVR_KVSEQ_REORDER, m = 1ull << (r % 64);
    w->missing[r / 64] = open ? w->missing[r / 64] | m : w->missing[r / 64] & ~m;
}

/* A worker's first number, or its first after a restart: nothing below it is watched. */
static void first(struct kvr_kvseq_worker *w, uint64_t seq)
{
    *w = (struct kvr_kvseq_worker){.seen = seq, .told = seq, .settled = seq};
}

/*
 * The highest received moves up from w->seen to seq: the window below it then holds seq - REORDER
 * to seq - 1, of which the old highest came and every watched number above it is open (the bits
 * of the numbers that leave the window are overwritten: those still open stay counted).
 */
static void slide(struct kvr_kvseq_worker *w, uint64_t seq)
{
    uint64_t from = seq - w->seen > KVR_KVSEQ_REORDER ? seq - KVR_KVSEQ_REORDER : w->seen;
    for (uint64_t n = from; n < seq; n++)
        set_bit(w, n, n != w->seen && n > w->settled);
    w->seen = seq;
}

uint64_t kvr_kvseq_note(struct kvr_kvseq *s, uint64_t wid, uint64_t seq)
{
    uint32_t i = s->at.groups ? kvr_map_get(&s->at, wid) : KVR_NIL;
    if (i == KVR_NIL) {
        if (s->n >= KVR_KVSEQ_MAX)
            start_over(s);
        if ((!s->at.groups && kvr_map_init(&s->at, 16) != KVR_OK) ||
            !KVR_GROW(s->w, s->cap, s->n + 1, 16) || kvr_map_put(&s->at, wid, s->n) != KVR_OK)
            return 0;
        first(&s->w[s->n++], seq);
        return 0;
    }
    struct kvr_kvseq_worker *w = &s->w[i];
    if (seq == w->seen)
        return 0; /* a repeat */
    if (seq < w->seen) {
        if (w->seen - seq > KVR_KVSEQ_REORDER) {
            first(w, seq);        /* a restarted worker, from 1 again */
        } else if (bit(w, seq)) { /* one that was open; else a repeat */
            set_bit(w, seq, false);
            came_late(s);
        }
        return 0;
    }
    slide(w, seq);
    if (seq <= w->told) { /* one its heartbeat named: counted then (unless settled since) */
        if (seq > w->settled)
            came_late(s);
        return 0;
    }
    uint64_t top = w->told; /* the numbers up to it are counted already */
    w->told = seq;
    return skip(s, seq - top - 1);
}

uint64_t kvr_kvseq_announce(struct kvr_kvseq *s, uint64_t wid, uint64_t seq)
{
    uint32_t i = s->at.groups ? kvr_map_get(&s->at, wid) : KVR_NIL;
    if (i == KVR_NIL || seq <= s->w[i].told)
        return 0; /* not noted yet (what came before is a snapshot's), or nothing new */
    uint64_t top = s->w[i].told;
    s->w[i].told = seq;
    return skip(s, seq - top); /* seq itself has not come either */
}

uint64_t kvr_kvseq_last_missing(const struct kvr_kvseq *s, uint64_t wid)
{
    uint32_t i = s->at.groups ? kvr_map_get(&s->at, wid) : KVR_NIL;
    if (i == KVR_NIL)
        return 0;
    const struct kvr_kvseq_worker *w = &s->w[i];
    if (w->told > w->seen && w->told > w->settled)
        return w->told; /* named by a heartbeat, not come (nor settled since) */
    uint64_t floor = w->seen > KVR_KVSEQ_REORDER ? w->seen - KVR_KVSEQ_REORDER : 0;
    for (uint64_t n = w->seen; n > floor && n - 1 > w->settled;)
        if (bit(w, --n))
            return n;
    return floor > w->settled ? floor : 0;
}

void kvr_kvseq_settle(struct kvr_kvseq *s)
{
    for (uint32_t i = 0; i < s->n; i++) {
        struct kvr_kvseq_worker *w = &s->w[i];
        w->settled = w->told;
        memset(w->missing, 0, sizeof w->missing);
    }
    s->open = 0;
}
