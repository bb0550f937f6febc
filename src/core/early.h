/*
 * kvr_early: events that reached a router before the decision they belong to. With several router
 * replicas, a worker's prefill-done, output-block or done event can overtake the gossip carrying
 * the decision. The events are kept here for a while; when the decision arrives they are applied
 * (or, for done, the decision is refused: a tombstone). Bounded: past max entries or ttl the
 * oldest are forgotten. Single-threaded.
 */
#ifndef KVR_EARLY_H
#define KVR_EARLY_H

#include <stdbool.h>
#include <stdint.h>

#include "map.h"
#include "pool.h"

struct kvr_early_rec {
    uint64_t id;          /* request id */
    uint64_t expires;     /* ns */
    uint32_t outblocks;   /* output-block events seen */
    bool prefill_done;    /* prefill-done seen */
    bool done;            /* done seen: a tombstone */
    struct kvr_link fifo; /* in insertion order */
};

struct kvr_early {
    struct kvr_map ids;   /* id -> record */
    struct kvr_pool recs; /* struct kvr_early_rec */
    struct kvr_list fifo; /* oldest first */
    uint32_t max;         /* bound on records */
    uint64_t ttl_ns;      /* lifetime of a record */
};

enum kvr_early_kind { KVR_EARLY_PREFILL, KVR_EARLY_OUTBLOCK, KVR_EARLY_DONE };

kvr_status kvr_early_init(struct kvr_early *e, uint32_t max, uint64_t ttl_ns);
void kvr_early_free(struct kvr_early *e);

/* Remember an event for id (unknown to the router) at time now. */
void kvr_early_note(struct kvr_early *e, uint64_t id, enum kvr_early_kind kind, uint64_t now);

/* Take (and forget) what was remembered for id; false when nothing was. */
bool kvr_early_take(struct kvr_early *e, uint64_t id, struct kvr_early_rec *out);

/* Whether id's done came before its decision (a tombstone), without taking anything. */
bool kvr_early_done(const struct kvr_early *e, uint64_t id);

/* Forget records older than their ttl. */
void kvr_early_expire(struct kvr_early *e, uint64_t now);

static inline uint32_t kvr_early_count(const struct kvr_early *e)
{
    return e->recs.live;
}

#endif
