/*
 * kvr_recent implementation.
 */
#include "recent.h"

#include <stdlib.h>

void kvr_recent_init(struct kvr_recent *t, uint32_t max, uint64_t ttl_ns)
{
    *t = (struct kvr_recent){.max = max ? max : 1, .ttl_ns = ttl_ns};
}

static void drop(struct kvr_recent *t, struct kvr_recent_item *it)
{
    HASH_DEL(t->head, it);
    free(it);
    t->n--;
}

void kvr_recent_free(struct kvr_recent *t)
{
    while (t->head)
        drop(t, t->head);
}

void kvr_recent_expire(struct kvr_recent *t, uint64_t now)
{
    while (t->head && t->head->expires <= now)
        drop(t, t->head);
}

kvr_status kvr_recent_put(struct kvr_recent *t, uint64_t key, enum kvr_recent_kind kind,
                          kvr_status outcome, bool silent, uint64_t now)
{
    kvr_recent_expire(t, now);
    struct kvr_recent_item *it = NULL;
    HASH_FIND(hh, t->head, &key, sizeof key, it);
    if (it) {
        HASH_DEL(t->head, it); /* added again below: it becomes the youngest */
        t->n--;
    } else {
        if (t->n >= t->max) {
            drop(t, t->head);
            t->evicted++;
        }
        if (!(it = malloc(sizeof *it)))
            return KVR_ERR_NOMEM;
    }
    *it = (struct kvr_recent_item){
        .key = key, .expires = now + t->ttl_ns, .kind = kind, .outcome = outcome, .silent = silent};
    HASH_ADD(hh, t->head, key, sizeof it->key, it);
    t->n++;
    return KVR_OK;
}

const struct kvr_recent_item *kvr_recent_find(struct kvr_recent *t, uint64_t key, uint64_t now)
{
    kvr_recent_expire(t, now);
    struct kvr_recent_item *it = NULL;
    HASH_FIND(hh, t->head, &key, sizeof key, it);
    return it && it->expires > now ? it : NULL; /* the head expires first only on one clock */
}
