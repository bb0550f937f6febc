/*
 * kvr_recent: what a router or a worker remembers of requests it no longer holds, by request
 * key, for a fixed time: those that ended (finished, cancelled, past their deadline), so a resend
 * or a duplicate forward is absorbed instead of generated twice, and cancels that came before their
 * request, so the request is ended the moment it arrives.
 *
 * Every key is put for the same time, so the items form a queue, oldest put first: a ring of
 * items (grown by doubling up to `max`, never shrunk) and a kvr_map from key to the ring position
 * of its live item. A key put again leaves a dead item behind, which the queue drops when it
 * reaches the head, or when the full ring is over a quarter dead (then the dead are compacted
 * out, so live keys keep at least 3/4 of the room). Expiry and eviction pop the head; nothing is
 * allocated per key, and the map's keys are salted like every kvr_map's, so keys a client chose
 * cannot be aimed at one probe run. Invariants: at most `max` items (so at most `max` live keys),
 * each live key once in the map. Pure data, no I/O, no clock (time is an argument); its owner's
 * lock covers it.
 */
#ifndef KVR_RECENT_H
#define KVR_RECENT_H

#include <stdbool.h>
#include <stdint.h>

#include "kvr/status.h"
#include "map.h"

#define KVR_RECENT_TTL_NS (60ull * 1000000000ull) /* how long a key is remembered */
#define KVR_RECENT_MAX    65536u                  /* keys remembered at most */

enum kvr_recent_kind {
    KVR_RECENT_ENDED = 1,     /* it ended here with `outcome`: a forward for it is a duplicate */
    KVR_RECENT_CANCELLED = 2, /* a cancel came first: end its forward with `outcome` at once */
    KVR_RECENT_FAILED = 3,    /* the fleet answered it with the error `outcome` (a router: a
                                 resend soon after crossed that answer on its way) */
};

struct kvr_recent_item {
    uint64_t key;              /* */
    uint64_t expires;          /* ns, the caller's clock */
    enum kvr_recent_kind kind; /* */
    kvr_status outcome;        /* ENDED: how (KVR_OK finished); CANCEL: the reason */
    bool silent;               /* CANCEL: end it without a chunk to the client */
    bool live;                 /* false: its key was put again later, or forgotten */
};

struct kvr_recent {
    struct kvr_recent_item *ring; /* cap items, owned; [head, head + len) mod cap in use */
    uint32_t cap, head, len;      /* cap: 0 until the first put, at most max */
    struct kvr_map at;            /* live key -> ring position (slots NULL until the first put) */
    uint32_t n, max;              /* live keys, at most */
    uint64_t ttl_ns;              /* */
    uint64_t evicted;             /* forgotten before their time because the table was full */
};

/* Allocates nothing (the first put does). */
void kvr_recent_init(struct kvr_recent *t, uint32_t max, uint64_t ttl_ns);
void kvr_recent_free(struct kvr_recent *t);

/* Remember key at now (an entry already there is replaced and its time restarted). KVR_ERR_NOMEM
 * leaves the key forgotten. */
kvr_status kvr_recent_put(struct kvr_recent *t, uint64_t key, enum kvr_recent_kind kind,
                          kvr_status outcome, bool silent, uint64_t now);

/* The entry for key if it is remembered at now, else NULL (borrowed until the next put). */
const struct kvr_recent_item *kvr_recent_find(struct kvr_recent *t, uint64_t key, uint64_t now);

/* How long ago item (of t) was put, at now. */
static inline uint64_t kvr_recent_age(const struct kvr_recent *t, const struct kvr_recent_item *it,
                                      uint64_t now)
{
    uint64_t put = it->expires - t->ttl_ns;
    return now > put ? now - put : 0;
}

/* Forget what is past its time at now. */
void kvr_recent_expire(struct kvr_recent *t, uint64_t now);

/* The live entries, oldest put first: start *pos at 0; NULL after the last. Borrowed until the
 * next put or expiry. */
const struct kvr_recent_item *kvr_recent_next(const struct kvr_recent *t, uint32_t *pos);

#endif
