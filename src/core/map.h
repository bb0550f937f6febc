/*
 * kvr_map: an open-addressing hash table from u64 keys to u32 values. It is the hot lookup
 * structure of the core: block hash -> node, request id -> request, engine block id -> index entry.
 *
 * Slots come in groups of four that fill one 64-byte cache line: their keys, their values, a
 * control byte each (empty, or seven bits of the key's hash as a tag) and a count of the keys
 * whose probe passed the group. A key's home is a group; a lookup compares the home group's four
 * control bytes with the key's tag at once and reads only the keys whose tag matches, and it stops
 * at the first group that no key's probe has passed, so it touches one line and takes no
 * data-dependent branch when the key is in its home group or none overflowed it, as nearly
 * always. An insertion that finds its home group full counts itself in each full group it passes;
 * a deletion takes the count back, so a deletion leaves nothing behind (no tombstone, no shifting
 * of other keys).
 *
 * Keys may be any u64 (they are mixed with the process's salt before use, so keys an attacker
 * chose cannot be aimed at one group: the daemons set a random salt at start, the simulator keeps
 * 0 and stays reproducible); KVR_NIL is not a storable value. It grows at 70 % load. It shrinks
 * once its count has stayed under 10 % of its slots for a whole epoch (as many insertions and
 * deletions as it has slots), to the size that count needs: its memory follows its contents
 * while they change, and a count that swings (a router's in-flight blocks, as its load comes and
 * goes, down to none between bursts) does not rebuild it on every swing. A table emptied and
 * left alone keeps its size. Single-threaded, like its owner.
 */
#ifndef KVR_MAP_H
#define KVR_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr/status.h"

#define KVR_NIL UINT32_MAX

/* Control bytes: a tag (seven bits of the key's hash, below 0x80), or empty. */
#define KVR_MAP_EMPTY 0x80u

#define KVR_MAP_LANES    4u          /* slots per group */
#define KVR_MAP_ONES     0x01010101u /* one in each control byte */
#define KVR_MAP_HIGHBITS 0x80808080u /* the top bit of each control byte: empty */

struct kvr_map_group {
    uint64_t key[KVR_MAP_LANES]; /* the callers' keys, unmixed */
    uint32_t val[KVR_MAP_LANES]; /* */
    uint32_t ctrl;               /* byte i (bits 8i..8i+7): slot i's control byte */
    uint32_t passed;             /* keys stored in later groups whose probe began at or before
                                    this one (it was full when they were inserted) */
    uint32_t pad[2];             /* to one cache line */
} __attribute__((aligned(64)));

struct kvr_map {
    struct kvr_map_group *groups; /* mask + 1 groups, owned */
    uint32_t mask;                /* groups - 1; the number of groups is a power of two */
    uint32_t count;               /* keys stored */
    uint32_t min_groups;          /* never shrink below this */
    uint32_t ops;                 /* insertions and deletions in this epoch */
    uint32_t peak, prev_peak;     /* the highest count in this epoch and in the one before */
    uint32_t resizes;             /* rebuilds so far */
};

/* Initialise with room for about hint entries before the first growth. */
kvr_status kvr_map_init(struct kvr_map *m, uint32_t hint);
void kvr_map_free(struct kvr_map *m);

/* The salt every map mixes its keys with. Set it once, before any map holds a key. */
extern uint64_t kvr_map_salt;
void kvr_map_set_salt(uint64_t salt);

/* The key's mixed hash: its low bits choose the home group, its top seven bits are the tag. */
static inline uint64_t kvr_map_hash(uint64_t key)
{
    key ^= kvr_map_salt;
    key *= 0x9e3779b97f4a7c15ull; /* the salt reaches every bit before the finalizer */
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return key;
}

/* The top bit of each control byte of ctrl that is zero (exact: no carry crosses a byte). */
static inline uint32_t kvr_map_zero_bytes(uint32_t ctrl)
{
    return ~(((ctrl & 0x7f7f7f7fu) + 0x7f7f7f7fu) | ctrl) & KVR_MAP_HIGHBITS;
}

/* The slots of a group whose control byte is b, as the top bit of each matching byte. */
static inline uint32_t kvr_map_match(uint32_t ctrl, uint32_t b)
{
    return kvr_map_zero_bytes(ctrl ^ (b * KVR_MAP_ONES));
}

/* The slot of key, whose hash is h: its lane, and its group in *grp; KVR_NIL when absent. The one
 * probe every lookup, update and deletion makes. */
static inline uint32_t kvr__map_find(const struct kvr_map *m, uint64_t h, uint64_t key,
                                     struct kvr_map_group **grp)
{
    uint32_t tag = (uint32_t)(h >> 57);
    for (uint32_t g = (uint32_t)h & m->mask;; g = (g + 1) & m->mask) {
        struct kvr_map_group *at = &m->groups[g];
        for (uint32_t hit = kvr_map_match(at->ctrl, tag); hit; hit &= hit - 1) {
            uint32_t i = (uint32_t)__builtin_ctz(hit) >> 3;
            if (at->key[i] == key) {
                *grp = at;
                return i;
            }
        }
        if (at->passed == 0)
            return KVR_NIL;
    }
}

/* The value stored for key, or KVR_NIL. */
static inline uint32_t kvr_map_get(const struct kvr_map *m, uint64_t key)
{
    struct kvr_map_group *grp;
    uint32_t i = kvr__map_find(m, kvr_map_hash(key), key, &grp);
    return i == KVR_NIL ? KVR_NIL : grp->val[i];
}

/* Hint the cache that key will be looked up soon. */
static inline void kvr_map_prefetch(const struct kvr_map *m, uint64_t key)
{
    __builtin_prefetch(&m->groups[(uint32_t)kvr_map_hash(key) & m->mask]);
}

/* Insert or overwrite. val must not be KVR_NIL. KVR_ERR_NOMEM leaves the map unchanged. */
kvr_status kvr_map_put(struct kvr_map *m, uint64_t key, uint32_t val);

/*
 * Find key, or claim a slot for it: returns a pointer to its value and sets *created when the key
 * is new; the caller must then store a value (not KVR_NIL) there, or kvr_map_del the key. NULL when
 * the table cannot grow. The pointer is valid until the next change to the map.
 */
uint32_t *kvr_map_upsert(struct kvr_map *m, uint64_t key, bool *created);

/* Remove key; returns whether it was present. */
bool kvr_map_del(struct kvr_map *m, uint64_t key);

/* Slots in the table (iteration: kvr_map_at). */
static inline uint32_t kvr_map_slots(const struct kvr_map *m)
{
    return (m->mask + 1) * KVR_MAP_LANES;
}

/* Slot pos (below kvr_map_slots): whether it holds a key, and if so the key and its value. The map
 * must not change during an iteration. */
static inline bool kvr_map_at(const struct kvr_map *m, uint32_t pos, uint64_t *key, uint32_t *val)
{
    const struct kvr_map_group *grp = &m->groups[pos / KVR_MAP_LANES];
    uint32_t i = pos % KVR_MAP_LANES;
    if (grp->ctrl >> (8 * i) & 0x80u)
        return false;
    *key = grp->key[i];
    *val = grp->val[i];
    return true;
}

/* Bytes of memory the table holds. */
size_t kvr_map_bytes(const struct kvr_map *m);

#endif
