/*
 * The router daemon's pending requests.
 */
#define _DEFAULT_SOURCE
#include "pending.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "kvr/hash.h"

void kvr_pending_init(struct kvr_pending_table *t, uint32_t max)
{
    memset(t, 0, sizeof *t);
    t->max = max;
}

static void free_item(struct kvr_pending *p)
{
    free(p->reply);
    free(p->raw);
    free(p); /* with its request_id */
}

void kvr_pending_clear(struct kvr_pending_table *t)
{
    struct kvr_pending *p, *tmp;
    HASH_ITER(hh, t->head, p, tmp)
    {
        HASH_DEL(t->head, p);
        free_item(p);
    }
    free(t->again);
    free(t->waiting);
    free(t->orphans);
    free(t->bookings);
    uint32_t max = t->max;
    kvr_pending_init(t, max);
}

struct kvr_pending *kvr_pending_find(const struct kvr_pending_table *t, uint64_t key)
{
    struct kvr_pending *p = NULL;
    HASH_FIND(hh, t->head, &key, sizeof key, p);
    return p;
}

kvr_status kvr_pending_add(struct kvr_pending_table *t, uint64_t key, const char *reply,
                           const char *request_id, const void *raw, size_t rawlen,
                           struct kvr_pending **out)
{
    if (kvr_pending_find(t, key))
        return KVR_ERR_DUPLICATE;
    if (t->n >= t->max) {
        t->full++;
        return KVR_ERR_FULL;
    }
    size_t idlen = request_id ? strlen(request_id) : 0;
    struct kvr_pending *p = calloc(1, sizeof *p + idlen + 1); /* its request_id after it */
    if (!p)
        return KVR_ERR_NOMEM;
    p->key = key;
    p->request_id = memcpy((char *)(p + 1), request_id ? request_id : "", idlen);
    p->reply = reply ? strdup(reply) : NULL;
    p->raw = raw ? malloc(rawlen ? rawlen : 1) : NULL;
    if ((reply && !p->reply) || (raw && !p->raw)) {
        free_item(p);
        return KVR_ERR_NOMEM;
    }
    if (raw && rawlen)
        memcpy(p->raw, raw, rawlen);
    p->rawlen = raw ? rawlen : 0;
    HASH_ADD(hh, t->head, key, sizeof p->key, p);
    t->n++;
    if (out)
        *out = p;
    return KVR_OK;
}

void kvr_pending_drop(struct kvr_pending_table *t, struct kvr_pending *p)
{
    assert(t->n > 0 && kvr_pending_find(t, p->key) == p);
    kvr_pending_notice(t, p, false);
    HASH_DEL(t->head, p);
    t->n--;
    free_item(p);
}

void kvr_pending_notice(struct kvr_pending_table *t, struct kvr_pending *p, bool on)
{
    if (p->origin && p->queued_notice != on) {
        assert(on || t->nnotices > 0);
        if (on)
            t->nnotices++;
        else
            t->nnotices--;
    }
    p->queued_notice = on;
}

void kvr_pending_started(struct kvr_pending *p)
{
    free(p->raw);
    p->raw = NULL;
    p->rawlen = 0;
}

/* Add p's key to the list keys[0..*n) of capacity *cap; it no longer has a worker. */
static kvr_status later(uint64_t **keys, uint32_t *n, uint32_t *cap, struct kvr_pending *p)
{
    if (!KVR_GROW(*keys, *cap, *n + 1, 64))
        return KVR_ERR_NOMEM;
    (*keys)[(*n)++] = p->key;
    p->avoid_worker = p->worker_id; /* placed again elsewhere when another worker can take it */
    p->worker_id = 0;
    return KVR_OK;
}

kvr_status kvr_pending_place_later(struct kvr_pending_table *t, struct kvr_pending *p)
{
    return later(&t->again, &t->nagain, &t->capagain, p);
}

kvr_status kvr_pending_place_next_tick(struct kvr_pending_table *t, struct kvr_pending *p)
{
    return later(&t->waiting, &t->nwaiting, &t->capwaiting, p);
}

kvr_status kvr_pending_tick(struct kvr_pending_table *t)
{
    if (!t->nwaiting)
        return KVR_OK;
    if (!KVR_GROW(t->again, t->capagain, t->nagain + t->nwaiting, 64))
        return KVR_ERR_NOMEM; /* they wait for the next tick */
    memcpy(t->again + t->nagain, t->waiting, t->nwaiting * sizeof *t->waiting);
    t->nagain += t->nwaiting;
    t->nwaiting = 0;
    return KVR_OK;
}

uint32_t kvr_pending_take_again(struct kvr_pending_table *t, const uint64_t **keys)
{
    uint32_t n = t->nagain;
    *keys = t->again;
    t->nagain = 0;
    return n;
}

kvr_status kvr_pending_booked(struct kvr_pending_table *t, struct kvr_pending *p, uint64_t expires)
{
    if (!KVR_GROW(t->bookings, t->capbookings, t->nbookings + 1, 64))
        return KVR_ERR_NOMEM;
    t->bookings[t->nbookings++] = p->key;
    p->book_expires = expires ? expires : 1;
    return KVR_OK;
}

void kvr_pending_due_bookings(struct kvr_pending_table *t, uint64_t now,
                              void (*fn)(void *ctx, struct kvr_pending *p), void *ctx)
{
    uint32_t kept = 0, n = t->nbookings;
    for (uint32_t i = 0; i < n; i++) {
        struct kvr_pending *p = kvr_pending_find(t, t->bookings[i]);
        if (!p || !p->book_expires)
            continue;
        if (now < p->book_expires) {
            t->bookings[kept++] = t->bookings[i];
            continue;
        }
        p->book_expires = 0;
        fn(ctx, p);
        assert(t->nbookings == n);
    }
    t->nbookings = kept;
}

uint32_t kvr_pending_live_bookings(const struct kvr_pending_table *t, uint64_t worker_id,
                                   uint64_t now, uint64_t *keys, uint32_t max)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < t->nbookings && k < max; i++) {
        const struct kvr_pending *p = kvr_pending_find(t, t->bookings[i]);
        if (p && p->book_expires > now && p->worker_id == worker_id)
            keys[k++] = p->key;
    }
    return k;
}

kvr_status kvr_pending_orphan(struct kvr_pending_table *t, struct kvr_pending *p, uint64_t at,
                              kvr_status st)
{
    if (!KVR_GROW(t->orphans, t->caporphans, t->norphans + 1, 64))
        return KVR_ERR_NOMEM;
    t->orphans[t->norphans++] = p->key;
    p->orphan_at = at ? at : 1;
    p->orphan_status = st;
    return KVR_OK;
}

void kvr_pending_due_orphans(struct kvr_pending_table *t, uint64_t now,
                             void (*fn)(void *ctx, struct kvr_pending *p), void *ctx)
{
    uint32_t kept = 0, n = t->norphans;
    for (uint32_t i = 0; i < n; i++) {
        struct kvr_pending *p = kvr_pending_find(t, t->orphans[i]);
        if (!p || !p->orphan_at)
            continue;
        if (now < p->orphan_at) {
            t->orphans[kept++] = t->orphans[i];
            continue;
        }
        p->orphan_at = 0;
        fn(ctx, p); /* answers or drops it; never lists another orphan */
        assert(t->norphans == n);
    }
    t->norphans = kept;
}

uint64_t kvr_pending_key(const char *reply, const char *request_id)
{
    /* the bytes of "<reply>\0<request id>" (every router of a fleet computes the same key for the
     * same client request). Replies are at most KVR_PENDING_REPLY_MAX bytes and ids at most
     * KVR_PENDING_ID_MAX (longer ones are refused before a key is made), so the whole of both
     * is hashed; anything longer would be cut at the buffer, never read past it. */
    char buf[KVR_PENDING_REPLY_MAX + KVR_PENDING_ID_MAX + 2];
    size_t a = reply ? strlen(reply) : 0, b = request_id ? strlen(request_id) : 0;
    size_t n = a + 1 + b, keep = n < sizeof buf ? n : sizeof buf - 1;
    memcpy(buf, reply ? reply : "", a < keep ? a : keep);
    if (a < keep)
        buf[a] = 0;
    if (keep > a + 1)
        memcpy(buf + a + 1, request_id, keep - a - 1);
    buf[keep < sizeof buf ? keep : sizeof buf - 1] = 0;
    uint64_t k = kvr_hash_bytes(buf, n < sizeof buf ? n : sizeof buf);
    return k ? k : 1;
}
