/*
 * The router daemon's pending requests: every request in flight that some router of the fleet
 * decided, by its fleet-wide key (XXH3 of reply subject and client id), with what it takes to
 * answer its client (reply subject, client id), to place it again if it never reaches its worker
 * (the client's bytes, kept by the origin until the first token), and who answers for it (the
 * origin). Beside the table: the keys to place again once the core call that dropped them has
 * returned, and the orphans (failed while their origin was silent) awaiting their grace period.
 *
 * Invariants: a key is in the table at most once; the table holds at most `max` entries (a full
 * table refuses with KVR_ERR_FULL, counted); the lists hold keys, never pointers, so an entry
 * dropped meanwhile is simply skipped. Pure data: no NATS, no core; the state mutex covers it.
 */
#ifndef KVR_RD_PENDING_H
#define KVR_RD_PENDING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uthash.h>

#include "kvr/status.h"

struct kvr_peer; /* fleet.h: another router, kept while a pending request points at it */

struct kvr_pending {
    uint64_t key;                  /* the fleet-wide id */
    char *reply;                   /* the client's reply subject (owned); NULL for booked selects */
    char *request_id;              /* the client's id (in the item's allocation, after it) */
    uint8_t *raw;                  /* the client's GenerateRequest until its first token (owned;
                                      origin only), to place it again if it never starts */
    size_t rawlen;                 /* */
    uint64_t worker_id;            /* 0 while queued (or between placements) */
    uint32_t attempts;             /* placements after the first */
    uint64_t avoid_worker;         /* the worker it last failed to reach (0: none) */
    uint64_t orphan_at;            /* failed while its origin was silent: answer then (0: no) */
    kvr_status orphan_status;      /* ... with this */
    const struct kvr_peer *origin; /* the router that decided it; NULL: this one */
    uint64_t decided_ns;           /* when its origin decided it (Unix ns): the earlier of two
                                      decisions for one key stands */
    uint64_t deadline_ns;          /* the client's deadline (monotonic ns; 0: none; origin) */
    uint64_t book_expires;         /* a booked select not started yet: dropped then (0: no) */
    bool cancelled;                /* its client cancelled it on its worker: never placed again,
                                      answered "cancelled" if it never reached it */
    bool queued_notice;            /* a Queued notice went out for it (this router's: queued
                                      here, its peers absorb resends), or came for it (a peer's,
                                      no decision yet: on no worker, not in the core) */
    UT_hash_handle hh;             /* by key; the table owns the item */
};

struct kvr_pending_table {
    struct kvr_pending *head;        /* uthash head */
    uint32_t n, max;                 /* entries, bound */
    uint64_t full;                   /* additions refused at the bound */
    uint64_t *again;                 /* keys to place again */
    uint32_t nagain, capagain;       /* */
    uint64_t *waiting;               /* keys to place again at the next tick */
    uint32_t nwaiting, capwaiting;   /* */
    uint64_t *orphans;               /* keys of orphans */
    uint32_t norphans, caporphans;   /* */
    uint64_t *bookings;              /* keys of booked selects not started yet */
    uint32_t nbookings, capbookings; /* */
    uint32_t nnotices;               /* peers' requests held on their Queued notices */
};

void kvr_pending_init(struct kvr_pending_table *t, uint32_t max);
/* Drop every entry and list. */
void kvr_pending_clear(struct kvr_pending_table *t);

struct kvr_pending *kvr_pending_find(const struct kvr_pending_table *t, uint64_t key);

/*
 * Add key with copies of reply (may be NULL) and request_id, and of raw[0..rawlen) when raw is
 * not NULL. KVR_ERR_DUPLICATE if key is there, KVR_ERR_FULL at the bound, KVR_ERR_NOMEM.
 */
kvr_status kvr_pending_add(struct kvr_pending_table *t, uint64_t key, const char *reply,
                           const char *request_id, const void *raw, size_t rawlen,
                           struct kvr_pending **out);

void kvr_pending_drop(struct kvr_pending_table *t, struct kvr_pending *p);

/* p is held on its origin's Queued notice (on: p->origin set, no decision yet), or no longer;
 * counted in nnotices while it is. */
void kvr_pending_notice(struct kvr_pending_table *t, struct kvr_pending *p, bool on);

/* The request started: its bytes are no longer needed (it will not be placed again). */
void kvr_pending_started(struct kvr_pending *p);

/* Remember p to place again (p->worker_id becomes 0); KVR_ERR_NOMEM when the list is full. */
kvr_status kvr_pending_place_later(struct kvr_pending_table *t, struct kvr_pending *p);
/* The same, but placed again only once kvr_pending_tick says so: its forward was lost to the
 * connection, which nats.c has not seen cut yet (sent again at once, it would fail again). */
kvr_status kvr_pending_place_next_tick(struct kvr_pending_table *t, struct kvr_pending *p);
/* The keys kvr_pending_place_next_tick held join those to place again. */
kvr_status kvr_pending_tick(struct kvr_pending_table *t);
/* Take the keys to place again: *keys (owned by the table, valid until the next call), count. */
uint32_t kvr_pending_take_again(struct kvr_pending_table *t, const uint64_t **keys);

/* p is a booked select: drop it at expires unless a worker starts it first. */
kvr_status kvr_pending_booked(struct kvr_pending_table *t, struct kvr_pending *p, uint64_t expires);
/* Bookings whose time has come at now, passed to fn (which drops them) oldest first; started or
 * dropped ones are forgotten, the others stay listed. */
void kvr_pending_due_bookings(struct kvr_pending_table *t, uint64_t now,
                              void (*fn)(void *ctx, struct kvr_pending *p), void *ctx);
/* Keys of bookings on worker_id still within their time at now, into keys (at most max). */
uint32_t kvr_pending_live_bookings(const struct kvr_pending_table *t, uint64_t worker_id,
                                   uint64_t now, uint64_t *keys, uint32_t max);

/* p failed while its origin was silent: answer with st at time at unless it comes back. */
kvr_status kvr_pending_orphan(struct kvr_pending_table *t, struct kvr_pending *p, uint64_t at,
                              kvr_status st);
/*
 * Every orphan whose time has come, passed to fn (which may drop it) in the order they failed;
 * the others stay listed.
 */
void kvr_pending_due_orphans(struct kvr_pending_table *t, uint64_t now,
                             void (*fn)(void *ctx, struct kvr_pending *p), void *ctx);

#define KVR_PENDING_REPLY_MAX 1024 /* bytes of a reply subject the fleet takes (KVR_REPLY_MAX) */
#define KVR_PENDING_ID_MAX    256  /* bytes of a client request id (KVR_REQUEST_ID_MAX) */

/* The fleet-wide key of a client's request: XXH3 of its whole reply subject and id; never 0. */
uint64_t kvr_pending_key(const char *reply, const char *request_id);

#endif
