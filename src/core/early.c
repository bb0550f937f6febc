/*
 * kvr_early implementation: a map from id to record and a FIFO for expiry and the bound (the TTL
 * is constant, so insertion order is expiry order). Invariant: the map and the FIFO hold the same
 * records, at most max of them.
 */
#include "early.h"

#include <assert.h>
#include <stddef.h>
#include <string.h>

#define FIFO offsetof(struct kvr_early_rec, fifo)

kvr_status kvr_early_init(struct kvr_early *e, uint32_t max, uint64_t ttl_ns)
{
    memset(e, 0, sizeof *e);
    e->max = max ? max : 1;
    e->ttl_ns = ttl_ns;
    kvr_pool_init(&e->recs, sizeof(struct kvr_early_rec));
    kvr_list_init(&e->fifo);
    return kvr_map_init(&e->ids, 64);
}

void kvr_early_free(struct kvr_early *e)
{
    kvr_map_free(&e->ids);
    kvr_pool_free(&e->recs);
    memset(e, 0, sizeof *e);
}

static struct kvr_early_rec *rec(const struct kvr_early *e, uint32_t h)
{
    return (struct kvr_early_rec *)kvr_pool_get(&e->recs, h);
}

static void drop(struct kvr_early *e, uint32_t h)
{
    kvr_list_unlink(&e->fifo, &e->recs, FIFO, h);
    kvr_map_del(&e->ids, rec(e, h)->id);
    kvr_pool_put(&e->recs, h);
}

void kvr_early_note(struct kvr_early *e, uint64_t id, enum kvr_early_kind kind, uint64_t now)
{
    uint32_t h = kvr_map_get(&e->ids, id);
    if (h == KVR_NIL) {
        if (e->recs.live >= e->max)
            drop(e, e->fifo.head);
        h = kvr_pool_alloc(&e->recs);
        if (h == KVR_NIL)
            return;
        if (kvr_map_put(&e->ids, id, h) != KVR_OK) {
            kvr_pool_put(&e->recs, h);
            return;
        }
        struct kvr_early_rec *r = rec(e, h);
        memset(r, 0, sizeof *r);
        r->id = id;
        r->expires = now + e->ttl_ns;
        kvr_list_append(&e->fifo, &e->recs, FIFO, h);
        assert(e->recs.live <= e->max && e->ids.count == e->recs.live);
    }
    struct kvr_early_rec *r = rec(e, h);
    if (kind == KVR_EARLY_PREFILL)
        r->prefill_done = true;
    else if (kind == KVR_EARLY_OUTBLOCK)
        r->outblocks++;
    else
        r->done = true;
}

bool kvr_early_take(struct kvr_early *e, uint64_t id, struct kvr_early_rec *out)
{
    uint32_t h = kvr_map_get(&e->ids, id);
    if (h == KVR_NIL)
        return false;
    *out = *rec(e, h);
    drop(e, h);
    return true;
}

bool kvr_early_done(const struct kvr_early *e, uint64_t id)
{
    uint32_t h = kvr_map_get(&e->ids, id);
    return h != KVR_NIL && rec(e, h)->done;
}

void kvr_early_expire(struct kvr_early *e, uint64_t now)
{
    while (e->fifo.head != KVR_NIL && rec(e, e->fifo.head)->expires <= now)
        drop(e, e->fifo.head);
}
