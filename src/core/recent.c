/*
 * kvr_recent implementation. The ring holds [head, head + len) (mod cap) oldest first; every
 * live item's position is its key's value in the map, and a dead item is in no map entry.
 */
#include "recent.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#define RECENT_FIRST_CAP 64u /* items of the first ring */

void kvr_recent_init(struct kvr_recent *t, uint32_t max, uint64_t ttl_ns)
{
    *t = (struct kvr_recent){.max = max ? max : 1, .ttl_ns = ttl_ns};
}

void kvr_recent_free(struct kvr_recent *t)
{
    free(t->ring);
    if (t->at.groups)
        kvr_map_free(&t->at);
    t->ring = NULL;
    t->cap = t->head = t->len = t->n = 0;
}

static uint32_t wrap(const struct kvr_recent *t, uint64_t i)
{
    return (uint32_t)(i % t->cap);
}

/* Drop the oldest item, forgetting its key if it was live. */
static void pop(struct kvr_recent *t)
{
    struct kvr_recent_item *it = &t->ring[t->head];
    if (it->live) {
        kvr_map_del(&t->at, it->key);
        t->n--;
    }
    t->head = wrap(t, (uint64_t)t->head + 1);
    t->len--;
}

void kvr_recent_expire(struct kvr_recent *t, uint64_t now)
{
    while (t->len && (!t->ring[t->head].live || t->ring[t->head].expires <= now))
        pop(t);
}

/* Double the ring (up to max), its items moved to the front in order and the map told. */
static kvr_status grow(struct kvr_recent *t)
{
    uint32_t cap = t->cap ? t->cap * 2 : RECENT_FIRST_CAP;
    if (cap > t->max || cap < t->cap)
        cap = t->max;
    struct kvr_recent_item *ring = malloc((size_t)cap * sizeof *ring);
    if (!ring)
        return KVR_ERR_NOMEM;
    for (uint32_t k = 0; k < t->len; k++) {
        ring[k] = t->ring[wrap(t, (uint64_t)t->head + k)];
        if (ring[k].live)
            kvr_map_put(&t->at, ring[k].key, k); /* a key already held: cannot fail */
    }
    free(t->ring);
    t->ring = ring;
    t->cap = cap;
    t->head = 0;
    return KVR_OK;
}

/* Drop every dead item, the live ones closing up behind the head in order (the map told): the
 * k-th live item moves to head + k, never past an item not yet read (k <= i). */
static void compact(struct kvr_recent *t)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < t->len; i++) {
        struct kvr_recent_item it = t->ring[wrap(t, (uint64_t)t->head + i)];
        if (!it.live)
            continue;
        uint32_t to = wrap(t, (uint64_t)t->head + k++);
        t->ring[to] = it;
        kvr_map_put(&t->at, it.key, to); /* a key already held: cannot fail */
    }
    t->len = k;
}

kvr_status kvr_recent_put(struct kvr_recent *t, uint64_t key, enum kvr_recent_kind kind,
                          kvr_status outcome, bool silent, uint64_t now)
{
    if (!t->at.groups && kvr_map_init(&t->at, 0) != KVR_OK)
        return KVR_ERR_NOMEM;
    kvr_recent_expire(t, now);
    uint32_t was = kvr_map_get(&t->at, key);
    if (was != KVR_NIL) { /* put again: the old item dies, the key becomes the youngest */
        t->ring[was].live = false;
        kvr_map_del(&t->at, key);
        t->n--;
    }
    if (t->len == t->cap && t->cap < t->max && grow(t) != KVR_OK)
        return KVR_ERR_NOMEM;
    if (t->len == t->cap && t->len - t->n > t->cap / 4)
        compact(t);         /* a quarter dead: O(len) once per cap / 4 dead items, O(1) a put */
    if (t->len == t->cap) { /* full at max: the oldest goes, early if it is still live */
        t->evicted += t->ring[t->head].live;
        pop(t);
        kvr_recent_expire(t, now); /* dead items behind it hold no key */
    }
    uint32_t pos = wrap(t, (uint64_t)t->head + t->len);
    if (kvr_map_put(&t->at, key, pos) != KVR_OK)
        return KVR_ERR_NOMEM;
    t->ring[pos] = (struct kvr_recent_item){.key = key,
                                            .expires = now + t->ttl_ns,
                                            .kind = kind,
                                            .outcome = outcome,
                                            .silent = silent,
                                            .live = true};
    t->len++;
    t->n++;
    assert(t->n <= t->len && t->len <= t->cap && t->cap <= t->max);
    return KVR_OK;
}

const struct kvr_recent_item *kvr_recent_find(struct kvr_recent *t, uint64_t key, uint64_t now)
{
    kvr_recent_expire(t, now);
    if (!t->at.groups)
        return NULL;
    uint32_t pos = kvr_map_get(&t->at, key);
    if (pos == KVR_NIL)
        return NULL;
    const struct kvr_recent_item *it = &t->ring[pos];
    return it->expires > now ? it : NULL; /* the head expires first only on one clock */
}

const struct kvr_recent_item *kvr_recent_next(const struct kvr_recent *t, uint32_t *pos)
{
    while (*pos < t->len) {
        const struct kvr_recent_item *it = &t->ring[wrap(t, (uint64_t)t->head + (*pos)++)];
        if (it->live)
            return it;
    }
    return NULL;
}
