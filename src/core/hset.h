/*
 * kvr_hset: a set of worker slots, each member carrying a u32 value, and kvr_walk, the prefix
 * walk that intersects a chain of such sets in one pass.
 *
 * A block of the index or of the active map is held by a set of workers. Most blocks are held by
 * one worker (stored inline, no allocation), some by a few (a small sparse array of (slot, value)
 * pairs), and a shared system prompt's blocks by hundreds (a dense bitmap plus a small table).
 * The representation switches on size, with hysteresis, so memory stays proportional to the
 * members and the walk costs O(members) for sparse sets and O(live words) for dense ones.
 *
 * kvr_walk answers, for the chain of sets of a prompt's blocks, the number of *consecutive*
 * blocks from the start that each worker holds, for every worker at once: it keeps the set of
 * workers that held every block so far as a bitmap and records the depth at which each drops out.
 * Its cost is O(sum over depth of min(members, live words)) plus O(workers) to finish, never
 * O(blocks x workers). Consecutive blocks of a shared prefix are usually held by the very same
 * workers; a set whose fingerprint and size equal the previous one's cannot shrink the alive
 * set, so that step is skipped (fingerprints are 64-bit: a false match needs a collision).
 *
 * Not thread-safe: owned by the router's state thread.
 */
#ifndef KVR_HSET_H
#define KVR_HSET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr/rng.h"
#include "kvr/status.h"

#define KVR_HSET_DENSE     UINT32_MAX /* cap value of a dense set */
#define KVR_HSET_DENSE_AT  48u        /* a sparse set with this many members turns dense */
#define KVR_HSET_SPARSE_AT 12u        /* a dense set with fewer members turns sparse */
/* The same for the act sets (kvr__hset_ref, kvr__hset_unref) while their bitmap is small (hset.c,
 * dense_due): dense ones are shared along a path (kvr_hset_share), so they turn dense sooner */
#define KVR_HSET_ACT_DENSE_AT  8u
#define KVR_HSET_ACT_SPARSE_AT 4u

struct kvr_hpair {
    uint32_t slot; /* worker slot */
    uint32_t val;  /* the owner's value for that worker */
};

/*
 * Dense form: a bitmap of members (what the walk reads) and an open-addressing table from slot
 * to value (linear probing, backward-shift deletion), so add, find and delete stay O(1) however
 * many workers share the block.
 */
struct kvr_hdense {
    uint32_t words;  /* bitmap words; slots below words * 64 can be held */
    uint32_t tcap;   /* table capacity, a power of two, at most 3/4 full */
    uint32_t refs;   /* sets sharing it (kvr_hset_share); a change to a shared one copies it */
    uint32_t total;  /* the sum of the members' values (mod 2^32) */
    uint32_t pad;    /* */
    uint64_t wsum;   /* the sum of kvr_mix64(slot) x value over the members (mod 2^64) */
    uint64_t bits[]; /* words bitmap words, then tcap struct kvr_hpair (slot UINT32_MAX: empty) */
};

struct kvr_hset {
    uint64_t fp;  /* XOR of kvr_mix64(slot) over members, kept here so a walk need not chase */
    uint32_t n;   /* members */
    uint32_t cap; /* 0 or 1: inline; >= 2: capacity of pairs; KVR_HSET_DENSE: dense */
    union {
        struct kvr_hpair one;     /* cap <= 1 */
        struct kvr_hpair *pairs;  /* sparse: 2 <= cap < KVR_HSET_DENSE, unordered, owned */
        struct kvr_hdense *dense; /* cap == KVR_HSET_DENSE, owned */
    } u;
};

/* Hint the cache that s's members will be read soon. */
static inline void kvr_hset_prefetch(const struct kvr_hset *s)
{
    if (s->cap > 1)
        __builtin_prefetch(s->u.pairs); /* the first line of either heap form */
}

/* Hint the cache that slot will be looked up in s soon (its bitmap word and table home). */
void kvr__hset_prefetch_slot(const struct kvr_hset *s, uint32_t slot); /* heap forms */
static inline void kvr_hset_prefetch_slot(const struct kvr_hset *s, uint32_t slot)
{
    if (s->cap > 1)
        kvr__hset_prefetch_slot(s, slot);
}

/* Fingerprint of the members: XOR of kvr_mix64(slot); 0 for the empty set. */
static inline uint64_t kvr_hset_fp(const struct kvr_hset *s)
{
    return s->fp;
}

/* An empty set needs no initialisation beyond zeroing. */
#define KVR_HSET_INIT                                                                              \
    {                                                                                              \
        0, 0, 0,                                                                                   \
        {                                                                                          \
            {                                                                                      \
                0, 0                                                                               \
            }                                                                                      \
        }                                                                                          \
    }

/* Pointer to the value of slot, or NULL when slot is not a member. Valid until the next change;
 * writing through it is for a set that shares nothing (the index's sets never do). */
uint32_t *kvr_hset_find(struct kvr_hset *s, uint32_t slot);

/* Add slot (which must not be a member) with val. *bytes tracks heap bytes held by sets. */
kvr_status kvr_hset_add(struct kvr_hset *s, uint32_t slot, uint32_t val, size_t *bytes);

/* Remove slot; returns whether it was a member. */
bool kvr_hset_del(struct kvr_hset *s, uint32_t slot, size_t *bytes);

/*
 * Reference counting in one lookup (the active map's act sets): add a reference of slot, a new
 * member with value 1 (*added set) or one more on its value (*added cleared); or drop one, which
 * must be held, removing slot when its value reaches 0 (returns whether it did).
 */
kvr_status kvr__hset_ref(struct kvr_hset *s, uint32_t slot, bool *added, size_t *bytes);
bool kvr__hset_unref(struct kvr_hset *s, uint32_t slot, size_t *bytes);

/*
 * The inline form (a block one worker uses: every block of a prompt's unique tail) is handled
 * here, without a call; the heap forms, and an inline set gaining a second member, out of line.
 */
static inline kvr_status kvr_hset_ref(struct kvr_hset *s, uint32_t slot, bool *added, size_t *bytes)
{
    if (s->cap <= 1 && s->n == 0) {
        s->u.one.slot = slot;
        s->u.one.val = 1;
        s->fp = kvr_mix64(slot);
        s->n = 1;
        s->cap = 1;
        *added = true;
        return KVR_OK;
    }
    if (s->cap <= 1 && s->u.one.slot == slot && s->u.one.val < UINT32_MAX - 1) {
        s->u.one.val++;
        *added = false;
        return KVR_OK;
    }
    return kvr__hset_ref(s, slot, added, bytes);
}

/* The set made empty (its storage already freed, or inline). */
static inline void kvr__hset_empty(struct kvr_hset *s)
{
    s->n = 0;
    s->cap = 0;
    s->fp = 0;
}

static inline bool kvr_hset_unref(struct kvr_hset *s, uint32_t slot, size_t *bytes)
{
    if (s->cap > 1 || s->n == 0 || s->u.one.slot != slot)
        return kvr__hset_unref(s, slot, bytes); /* a heap form, or not a member (asserts) */
    if (--s->u.one.val)
        return false;
    kvr__hset_empty(s);
    return true;
}

/*
 * Sharing (the active map's sets along one prompt path). A dense set can be shared by several sets
 * that hold the same members with the same values: each holds a reference, a change to any of them
 * first copies it (so the others keep theirs), and the storage is freed with the last reference.
 * kvr_hset_shape names what a dense set holds, for a caller that knows when two sets with the same
 * shape hold the same pairs (the active map: see active.c); false for the other forms.
 */
struct kvr_hset_shape {
    uint64_t fp;    /* the members' fingerprint */
    uint64_t wsum;  /* and their values' */
    uint32_t n;     /* members */
    uint32_t total; /* the sum of their values */
};
static inline bool kvr_hset_shape(const struct kvr_hset *s, struct kvr_hset_shape *out)
{
    if (s->cap != KVR_HSET_DENSE)
        return false;
    *out = (struct kvr_hset_shape){s->fp, s->u.dense->wsum, s->n, s->u.dense->total};
    return true;
}

static inline bool kvr_hset_shape_eq(const struct kvr_hset_shape *a, const struct kvr_hset_shape *b)
{
    return a->fp == b->fp && a->wsum == b->wsum && a->n == b->n && a->total == b->total;
}

/* dst (its own storage released) becomes a reference to src's dense set. */
void kvr_hset_share(struct kvr_hset *dst, const struct kvr_hset *src, size_t *bytes);

/* Free everything; the set becomes empty. */
void kvr__hset_release(struct kvr_hset *s, size_t *bytes);
static inline void kvr_hset_release(struct kvr_hset *s, size_t *bytes)
{
    if (s->cap > 1) {
        kvr__hset_release(s, bytes);
        return;
    }
    kvr__hset_empty(s);
}

/* Iteration in no particular order; the set must not change during it. */
struct kvr_hset_iter {
    const struct kvr_hset *s; /* borrowed */
    uint32_t i;               /* next pair, or next dense table position */
};
void kvr_hset_iter_init(struct kvr_hset_iter *it, const struct kvr_hset *s);
bool kvr_hset_next(struct kvr_hset_iter *it, uint32_t *slot, uint32_t *val);

/* Write the members' slots to out (room for s->n) and return how many: a dense set's from its
 * bitmap, in slot order, without reading its table. */
uint32_t kvr_hset_slots(const struct kvr_hset *s, uint32_t *out);

/* Scratch state of one prefix walk; reused across walks, all-zero between them. */
struct kvr_walk {
    uint32_t words;   /* capacity: slots below words * 64 */
    uint32_t nnz;     /* entries of nz in use */
    uint64_t last_fp; /* fingerprint of the last set intersected */
    uint32_t last_n;  /* its member count */
    uint64_t *alive;  /* workers that held every set so far, owned */
    uint64_t *tmp;    /* scratch bitmap, zero between steps, owned */
    uint32_t *nz;     /* indices of the nonzero words of alive, owned */
    uint32_t deepest; /* after kvr_walk_finish: the largest out[] value the walk wrote (0: none),
                         so a caller needs no O(workers) pass for the longest prefix */
};

/* Make room for slots below nslots. */
kvr_status kvr_walk_reserve(struct kvr_walk *w, uint32_t nslots);
void kvr_walk_free(struct kvr_walk *w);

/* Begin a walk: the alive set becomes the members of first. */
void kvr_walk_start(struct kvr_walk *w, const struct kvr_hset *first);

static inline bool kvr_walk_alive(const struct kvr_walk *w)
{
    return w->nnz != 0;
}

/* Intersect the alive set with s; every worker that drops out gets out[slot] = depth. */
void kvr_walk_step(struct kvr_walk *w, const struct kvr_hset *s, uint32_t depth, uint32_t *out);

/* End the walk: every worker still alive gets out[slot] = depth; the walk is reset. */
void kvr_walk_finish(struct kvr_walk *w, uint32_t depth, uint32_t *out);

#endif
