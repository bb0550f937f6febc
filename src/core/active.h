/*
 * kvr_active: the predictive active-block map (ROUTING.md section 3).
 *
 * The router books every request it routes on the chosen worker: a reference on each of the
 * prompt's blocks (the act sets of the shared block table count requests per worker and block),
 * the prompt tokens the worker still has to prefill, and the blocks outside the table (a trailing
 * partial block, then one per output block). Lifecycle events move those figures: prefill done
 * takes the prefill tokens out, each output block adds a block, done frees everything. From that
 * the router predicts each worker's load without asking the engines:
 *   active_blocks(w)  = distinct table blocks with a reference on w + w's extra blocks
 *   prefill_tokens(w) = sum of outstanding prefill tokens of w's requests
 * Every operation is O(1) per block. Requests that are never freed are dropped after a TTL
 * counted from their last event. Single-threaded.
 */
#ifndef KVR_ACTIVE_H
#define KVR_ACTIVE_H

#include <stdbool.h>
#include <stdint.h>

#include "blocktab.h"

struct kvr_active_req {
    uint64_t id;            /* request id */
    uint64_t prefill;       /* prompt tokens still to prefill (0 once prefill is done) */
    uint64_t last_ns;       /* time of its last event */
    uint64_t booked_ns;     /* time it was booked */
    uint64_t missed_ns;     /* first heartbeat of its worker that did not list it (0: none) */
    uint32_t *nodes;        /* block table nodes it references, owned */
    uint32_t nnodes;        /* */
    uint32_t slot;          /* worker slot */
    uint32_t extra;         /* blocks held outside the table */
    uint32_t prompt_tokens; /* */
    uint32_t overlap;       /* cached prefix blocks at booking */
    uint32_t max_tokens;    /* its client's generation limit (0: not known: imported) */
    bool noted;             /* its prefill counts in its worker's share (pshare.h) */
    struct kvr_link ttl;    /* in the TTL list (by last_ns) */
    struct kvr_link wl;     /* in its worker's list */
};

struct kvr_active_worker {
    uint64_t blocks;      /* predicted active blocks */
    uint64_t prefill;     /* predicted outstanding prefill tokens */
    uint32_t nreqs;       /* requests in flight */
    uint32_t load_pos;    /* its position in by_load; KVR_NIL while not listed */
    struct kvr_list reqs; /* its requests */
    uint64_t key;         /* the digest's name for the worker in this slot (set when it joins,
                             with no request in flight) */
};

struct kvr_active {
    struct kvr_blocktab *tab;    /* borrowed; must outlive the map */
    struct kvr_pool reqs;        /* struct kvr_active_req */
    struct kvr_map ids;          /* request id -> request handle */
    struct kvr_active_worker *w; /* per worker slot, owned */
    uint32_t nslots;             /* */
    uint32_t nworking;           /* workers with at least one request in flight */
    struct kvr_list ttl;         /* requests, least recently active first */
    uint64_t digest;             /* XOR of kvr_mix64(id ^ key of its slot) over the requests,
                                    kept as they come and go */
    uint32_t block_size;         /* B */
    size_t node_bytes;           /* bytes of the requests' node arrays */
    /*
     * The listed slots (the live workers) in order of load: by_load[0..nlisted) ascending by
     * nreqs, and by_load[load_first[c]] the first with nreqs >= c (nlisted when none), for c
     * below nloads. A booking or a free moves one slot by one swap, O(1); a decision reads the
     * least loaded workers first and can stop where no more loaded one can cost less.
     */
    uint32_t *by_load;    /* nslots room, owned */
    uint32_t nlisted;     /* */
    uint32_t *load_first; /* nloads entries, owned; the last is always nlisted (no slot is that
                             loaded), so a slot can always move up one */
    uint32_t nloads;      /* */
};

typedef void (*kvr_active_drop_fn)(void *ctx, uint64_t request_id, uint32_t slot);

kvr_status kvr_active_init(struct kvr_active *a, struct kvr_blocktab *tab, uint32_t block_size,
                           uint32_t hint);
void kvr_active_free(struct kvr_active *a);
kvr_status kvr_active_reserve(struct kvr_active *a, uint32_t nslots);

/*
 * List slot (reserved, not listed) in by_load, or take it out: the router lists a worker when it
 * joins and unlists it when it leaves, so by_load holds the live workers. O(nloads).
 */
kvr_status kvr_active_list(struct kvr_active *a, uint32_t slot);
void kvr_active_unlist(struct kvr_active *a, uint32_t slot);

/*
 * Book request id on worker slot: a reference on nodes[0..n) (copied), prompt_tokens to prefill
 * minus the overlap_blocks already cached. KVR_ERR_DUPLICATE when id is in flight.
 */
kvr_status kvr_active_add(struct kvr_active *a, uint64_t id, uint32_t slot, const uint32_t *nodes,
                          uint32_t n, uint32_t prompt_tokens, uint32_t overlap_blocks,
                          uint64_t now);

/* Lifecycle events; KVR_ERR_UNKNOWN_REQUEST when id is not in flight. */
kvr_status kvr_active_prefill_done(struct kvr_active *a, uint64_t id, uint64_t now);
kvr_status kvr_active_output_block(struct kvr_active *a, uint64_t id, uint64_t now);
/* n output blocks at once (an imported request's count so far); saturates. */
kvr_status kvr_active_output_blocks(struct kvr_active *a, uint64_t id, uint32_t n, uint64_t now);
kvr_status kvr_active_remove(struct kvr_active *a, uint64_t id);

/* Note request id's max_tokens (kvr_active_add leaves it 0); nothing when id is not in flight. */
void kvr_active_set_max_tokens(struct kvr_active *a, uint64_t id, uint32_t max_tokens);

/* The same, with whether its prefill was counted in its worker's share (kvr_active_add: not), in
 * one lookup: at its booking. */
void kvr_active_set_booked(struct kvr_active *a, uint64_t id, uint32_t max_tokens, bool noted);

/* Call fn for every request in flight (none may be added or removed meanwhile). */
void kvr_active_each(const struct kvr_active *a,
                     void (*fn)(void *ctx, const struct kvr_active_req *req), void *ctx);

/*
 * The same, least recently active first, in steps between which the map may change (a snapshot
 * served in slices): begin, then each kvr_active_walk
 * calls fn for at most max more requests and returns how many; fewer than max, the walk is over. A
 * request in flight from begin to end is visited once (one active meanwhile, moved to the tail, may
 * be visited again); one booked meanwhile is visited, one ended before its turn is not (kvr_list's
 * cursor). One walk at a time; fn must not change the map.
 */
void kvr_active_walk_begin(struct kvr_active *a);
uint32_t kvr_active_walk(struct kvr_active *a,
                         void (*fn)(void *ctx, const struct kvr_active_req *req), void *ctx,
                         uint32_t max);

/* Drop request id (as kvr_active_remove) and tell fn, as the expiry paths do. */
kvr_status kvr_active_drop(struct kvr_active *a, uint64_t id, kvr_active_drop_fn fn, void *ctx);

/* Drop requests whose last event is at or before cutoff; fn (may be NULL) hears of each. */
uint32_t kvr_active_expire(struct kvr_active *a, uint64_t cutoff, kvr_active_drop_fn fn, void *ctx);

/* Drop every request of a worker; fn (may be NULL) hears of each. */
uint32_t kvr_active_drop_worker(struct kvr_active *a, uint32_t slot, kvr_active_drop_fn fn,
                                void *ctx);

static inline const struct kvr_active_req *kvr_active_find(const struct kvr_active *a, uint64_t id)
{
    uint32_t h = kvr_map_get(&a->ids, id);
    return h == KVR_NIL ? NULL : (const struct kvr_active_req *)kvr_pool_get(&a->reqs, h);
}

static inline uint32_t kvr_active_count(const struct kvr_active *a)
{
    return a->reqs.live;
}

size_t kvr_active_bytes(const struct kvr_active *a);

#endif
