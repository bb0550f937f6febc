/*
 * The router daemon's memory of ended requests.
 */
#include "recent.h"

#include <stdlib.h>
#include <string.h>

kvr_status kvr_recent_init(struct kvr_recent *t, uint32_t max, uint64_t ttl_ns)
{
    memset(t, 0, sizeof *t);
    t->max = max ? max : 1;
    t->ttl_ns = ttl_ns;
    t->ring = calloc(t->max, sizeof *t->ring);
    return t->ring ? KVR_OK : KVR_ERR_NOMEM;
}

void kvr_recent_free(struct kvr_recent *t)
{
    struct kvr_recent_item *it, *tmp;
    HASH_ITER(hh, t->head, it, tmp)
    {
        HASH_DEL(t->head, it);
        free(it);
    }
    free(t->ring);
    memset(t, 0, sizeof *t);
}

/* Forget the oldest key of the ring. */
static void pop(struct kvr_recent *t)
{
    uint64_t key = t->ring[t->first];
    t->first = (t->first + 1) % t->max;
    t->n--;
    struct kvr_recent_item *it = NULL;
    HASH_FIND(hh, t->head, &key, sizeof key, it);
    if (it) {
        HASH_DEL(t->head, it);
        free(it);
    }
}

kvr_status kvr_recent_put(struct kvr_recent *t, uint64_t key, enum kvr_recent_kind kind,
                          kvr_status status, uint64_t now)
{
    struct kvr_recent_item *it = NULL;
    HASH_FIND(hh, t->head, &key, sizeof key, it);
    if (!it) {
        if (t->n == t->max) {
            pop(t);
            t->evicted++;
        }
        if (!(it = calloc(1, sizeof *it)))
            return KVR_ERR_NOMEM;
        it->key = key;
        HASH_ADD(hh, t->head, key, sizeof it->key, it);
        t->ring[(t->first + t->n) % t->max] = key;
        t->n++;
    }
    it->kind = kind;
    it->status = status;
    it->expires = now + t->ttl_ns;
    return KVR_OK;
}

struct kvr_recent_item *kvr_recent_find(struct kvr_recent *t, uint64_t key, uint64_t now)
{
    struct kvr_recent_item *it = NULL;
    HASH_FIND(hh, t->head, &key, sizeof key, it);
    return it && it->expires > now ? it : NULL;
}

void kvr_recent_expire(struct kvr_recent *t, uint64_t now)
{
    while (t->n) {
        struct kvr_recent_item *it = NULL;
        uint64_t key = t->ring[t->first];
        HASH_FIND(hh, t->head, &key, sizeof key, it);
        if (it && it->expires > now)
            return; /* the oldest still counts (a later put restarted its time) */
        pop(t);
    }
}
