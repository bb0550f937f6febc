/*
 * kvr_recent: what a router or a worker remembers of requests it no longer holds, by request
 * key, for a fixed time: those that ended (finished, cancelled, past their deadline), so a resend
 * or a duplicate forward is absorbed instead of generated twice, and cancels that came before their
 * request, so the request is ended the moment it arrives.
 *
 * Invariants: at most `max` keys, each once; the uthash list runs oldest put first, and every key
 * is put for the same time, so the head is always the first to expire or to be evicted when the
 * table is full. Pure data, no I/O, no clock (time is an argument); its owner's lock covers it.
 */
#ifndef KVR_RECENT_H
#define KVR_RECENT_H

#include <stdbool.h>
#include <stdint.h>

#include <uthash.h>

#include "kvr/status.h"

#define KVR_RECENT_TTL_NS (60ull * 1000000000ull) /* how long a key is remembered */
#define KVR_RECENT_MAX    65536u                  /* keys remembered at most */

enum kvr_recent_kind {
    KVR_RECENT_ENDED = 1,     /* it ended here with `outcome`: a forward for it is a duplicate */
    KVR_RECENT_CANCELLED = 2, /* a cancel came first: end its forward with `outcome` at once */
};

struct kvr_recent_item {
    uint64_t key;              /* */
    uint64_t expires;          /* ns, the caller's clock */
    enum kvr_recent_kind kind; /* */
    kvr_status outcome;        /* ENDED: how (KVR_OK finished); CANCEL: the reason */
    bool silent;               /* CANCEL: end it without a chunk to the client */
    UT_hash_handle hh;         /* by key, in the order put; the table owns the item */
};

struct kvr_recent {
    struct kvr_recent_item *head; /* uthash head: the oldest */
    uint32_t n, max;              /* keys held, at most */
    uint64_t ttl_ns;              /* */
    uint64_t evicted;             /* forgotten before their time because the table was full */
};

void kvr_recent_init(struct kvr_recent *t, uint32_t max, uint64_t ttl_ns);
void kvr_recent_free(struct kvr_recent *t);

/* Remember key at now (an entry already there is replaced and its time restarted). KVR_ERR_NOMEM
 * leaves the key forgotten. */
kvr_status kvr_recent_put(struct kvr_recent *t, uint64_t key, enum kvr_recent_kind kind,
                          kvr_status outcome, bool silent, uint64_t now);

/* The entry for key if it is remembered at now, else NULL (borrowed until the next put). */
const struct kvr_recent_item *kvr_recent_find(struct kvr_recent *t, uint64_t key, uint64_t now);

/* Forget what is past its time at now. */
void kvr_recent_expire(struct kvr_recent *t, uint64_t now);

#endif
