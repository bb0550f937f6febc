/*
 * kvr_map: an open-addressing hash table from u64 keys to u32 values (linear probing,
 * backward-shift deletion, no tombstones). It is the hot lookup structure of the core: block
 * hash -> node, request id -> request, engine block id -> index entry. Keys may be any u64
 * (they are mixed with the process's salt before use, so keys an attacker chose cannot be aimed
 * at one probe run: the daemons set a random salt at start, the simulator keeps 0 and stays
 * reproducible); KVR_NIL is not a storable value. It grows at 70 % load and
 * shrinks below 10 %, so its memory follows its contents. Single-threaded, like its owner.
 */
#ifndef KVR_MAP_H
#define KVR_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr/status.h"

#define KVR_NIL UINT32_MAX

struct kvr_map_slot {
    uint64_t key; /* the caller's key, unmixed */
    uint32_t val; /* KVR_NIL when the slot is empty */
};

struct kvr_map {
    struct kvr_map_slot *slots; /* mask + 1 slots, owned */
    uint32_t mask;              /* capacity - 1; capacity is a power of two */
    uint32_t count;             /* occupied slots */
    uint32_t min_cap;           /* never shrink below this capacity */
};

/* Initialise with room for about hint entries before the first growth. */
kvr_status kvr_map_init(struct kvr_map *m, uint32_t hint);
void kvr_map_free(struct kvr_map *m);

/* The salt every map mixes its keys with. Set it once, before any map holds a key. */
extern uint64_t kvr_map_salt;
void kvr_map_set_salt(uint64_t salt);

static inline uint32_t kvr_map_pos(const struct kvr_map *m, uint64_t key)
{
    key ^= kvr_map_salt;
    key *= 0x9e3779b97f4a7c15ull; /* the salt reaches every bit before the finalizer */
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (uint32_t)key & m->mask;
}

/* The value stored for key, or KVR_NIL. */
static inline uint32_t kvr_map_get(const struct kvr_map *m, uint64_t key)
{
    uint32_t i = kvr_map_pos(m, key);
    for (;;) {
        const struct kvr_map_slot *s = &m->slots[i];
        if (s->val == KVR_NIL)
            return KVR_NIL;
        if (s->key == key)
            return s->val;
        i = (i + 1) & m->mask;
    }
}

/* Hint the cache that key will be looked up soon. */
static inline void kvr_map_prefetch(const struct kvr_map *m, uint64_t key)
{
    __builtin_prefetch(&m->slots[kvr_map_pos(m, key)]);
}

/* Insert or overwrite. val must not be KVR_NIL. KVR_ERR_NOMEM leaves the map unchanged. */
kvr_status kvr_map_put(struct kvr_map *m, uint64_t key, uint32_t val);

/*
 * Find key, or claim a slot for it with one probe: returns a pointer to its value and sets
 * *created when the key is new; the caller must then store a value (not KVR_NIL) there, or
 * kvr_map_del the key. NULL when the table cannot grow. The pointer is valid until the next
 * change to the map.
 */
uint32_t *kvr_map_upsert(struct kvr_map *m, uint64_t key, bool *created);

/* Remove key; returns whether it was present. */
bool kvr_map_del(struct kvr_map *m, uint64_t key);

/* Bytes of memory the table holds. */
size_t kvr_map_bytes(const struct kvr_map *m);

#endif
