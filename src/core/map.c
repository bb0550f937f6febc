/*
 * kvr_map implementation. Invariants: every key sits in its home group or in a later one (probing
 * wraps), and every group from its home up to, not including, its own has no empty slot, so a
 * lookup may stop at the first group with one. A group that has an empty slot has therefore never
 * been probed past, and a deletion there may empty the slot; in a full group it leaves a
 * tombstone, which keeps the group full for the probes that pass it. Live keys and tombstones
 * fill at most 70 % of the slots, so an empty slot always ends a probe. Single-threaded, like its
 * owner.
 */
#include "map.h"

#include <assert.h>
#include <stdlib.h>

#include "bigmem.h"

#define MAP_MIN_GROUPS 4u
#define MAP_MAX_GROUPS (1u << 29) /* 2^31 slots */

uint64_t kvr_map_salt;

void kvr_map_set_salt(uint64_t salt)
{
    kvr_map_salt = salt;
}

static struct kvr_map_group *alloc_groups(uint32_t n)
{
    struct kvr_map_group *g = kvr_bigmem_alloc((size_t)n * sizeof *g);
    if (!g)
        return NULL;
    for (uint32_t i = 0; i < n; i++)
        g[i].ctrl = KVR_MAP_EMPTY * KVR_MAP_ONES;
    return g;
}

/* Whether live keys and tombstones, used slots in all, stay within the 70 % load bound. */
static inline bool fits(uint64_t used, uint32_t groups)
{
    return used * 10 <= (uint64_t)groups * KVR_MAP_LANES * 7;
}

/* The fewest groups (a power of two) that hold n keys within the load bound. */
static uint32_t groups_for(uint32_t n)
{
    uint32_t g = MAP_MIN_GROUPS;
    while (g < MAP_MAX_GROUPS && !fits(n, g))
        g <<= 1;
    return g;
}

kvr_status kvr_map_init(struct kvr_map *m, uint32_t hint)
{
    uint32_t g = groups_for(hint);
    m->groups = alloc_groups(g);
    if (!m->groups)
        return KVR_ERR_NOMEM;
    m->mask = g - 1;
    m->count = 0;
    m->tombs = 0;
    m->min_groups = g;
    return KVR_OK;
}

void kvr_map_free(struct kvr_map *m)
{
    free(m->groups);
    m->groups = NULL;
    m->mask = 0;
    m->count = 0;
    m->tombs = 0;
}

static inline void set_ctrl(struct kvr_map_group *grp, uint32_t i, uint32_t b)
{
    grp->ctrl = (grp->ctrl & ~(0xffu << (8 * i))) | b << (8 * i);
}

/* The first free slot (empty or a tombstone) on the probe path of hash h: its group in *grp. */
static uint32_t free_slot(const struct kvr_map *m, uint64_t h, struct kvr_map_group **grp)
{
    for (uint32_t g = (uint32_t)h & m->mask;; g = (g + 1) & m->mask) {
        uint32_t open = m->groups[g].ctrl & KVR_MAP_HIGHBITS;
        if (open) {
            *grp = &m->groups[g];
            return (uint32_t)__builtin_ctz(open) >> 3;
        }
    }
}

/* Rebuild into n groups: every key placed anew, no tombstone left. */
static kvr_status rebuild(struct kvr_map *m, uint32_t n)
{
    struct kvr_map_group *old = m->groups;
    uint32_t old_n = m->mask + 1;
    struct kvr_map_group *g = alloc_groups(n);
    if (!g)
        return KVR_ERR_NOMEM;
    m->groups = g;
    m->mask = n - 1;
    m->tombs = 0;
    for (uint32_t k = 0; k < old_n; k++) {
        for (uint32_t i = 0; i < KVR_MAP_LANES; i++) {
            if (old[k].ctrl >> (8 * i) & 0x80u)
                continue;
            uint64_t h = kvr_map_hash(old[k].key[i]);
            struct kvr_map_group *grp;
            uint32_t j = free_slot(m, h, &grp);
            set_ctrl(grp, j, (uint32_t)(h >> 57));
            grp->key[j] = old[k].key[i];
            grp->val[j] = old[k].val[i];
        }
    }
    free(old);
    return KVR_OK;
}

/*
 * Make room for one more key in an empty slot. When tombstones hold at least an eighth of the
 * slots, a rebuild at the same size clears them (and frees that eighth for insertions to come);
 * otherwise the table doubles. Either way a rebuild is paid for by the O(slots) insertions or
 * deletions before it.
 */
static kvr_status make_room(struct kvr_map *m)
{
    uint32_t groups = m->mask + 1;
    if (fits((uint64_t)m->count + m->tombs + 1, groups))
        return KVR_OK;
    if ((uint64_t)m->tombs * 8 >= (uint64_t)groups * KVR_MAP_LANES)
        return rebuild(m, groups);
    if (groups >= MAP_MAX_GROUPS)
        return KVR_ERR_FULL;
    return rebuild(m, groups * 2);
}

uint32_t *kvr_map_upsert(struct kvr_map *m, uint64_t key, bool *created)
{
    uint64_t h = kvr_map_hash(key);
    uint32_t tag = (uint32_t)(h >> 57);
    struct kvr_map_group *slot_grp = NULL;
    uint32_t slot = 0;
    for (uint32_t g = (uint32_t)h & m->mask;; g = (g + 1) & m->mask) {
        struct kvr_map_group *grp = &m->groups[g];
        uint32_t ctrl = grp->ctrl;
        for (uint32_t hit = kvr_map_match(ctrl, tag); hit; hit &= hit - 1) {
            uint32_t i = (uint32_t)__builtin_ctz(hit) >> 3;
            if (grp->key[i] == key) {
                *created = false;
                return &grp->val[i];
            }
        }
        uint32_t open = ctrl & KVR_MAP_HIGHBITS;
        if (open && !slot_grp) { /* the first free slot on the path: where the key goes */
            slot_grp = grp;
            slot = (uint32_t)__builtin_ctz(open) >> 3;
        }
        if (kvr_map_match(ctrl, KVR_MAP_EMPTY))
            break;
    }
    if ((slot_grp->ctrl >> (8 * slot) & 0xffu) == KVR_MAP_DELETED) {
        m->tombs--; /* a tombstone reused: the used slots stay as many */
    } else if (!fits((uint64_t)m->count + m->tombs + 1, m->mask + 1)) {
        if (make_room(m) != KVR_OK)
            return NULL;
        slot = free_slot(m, h, &slot_grp); /* the table is new: no tombstone, the key absent */
    }
    set_ctrl(slot_grp, slot, tag);
    slot_grp->key[slot] = key;
    slot_grp->val[slot] = 0;
    m->count++;
    assert(fits((uint64_t)m->count + m->tombs, m->mask + 1));
    *created = true;
    return &slot_grp->val[slot];
}

kvr_status kvr_map_put(struct kvr_map *m, uint64_t key, uint32_t val)
{
    assert(val != KVR_NIL);
    bool created;
    uint32_t *v = kvr_map_upsert(m, key, &created);
    if (!v)
        return m->mask + 1 >= MAP_MAX_GROUPS ? KVR_ERR_FULL : KVR_ERR_NOMEM;
    *v = val;
    return KVR_OK;
}

bool kvr_map_del(struct kvr_map *m, uint64_t key)
{
    uint64_t h = kvr_map_hash(key);
    uint32_t tag = (uint32_t)(h >> 57);
    for (uint32_t g = (uint32_t)h & m->mask;; g = (g + 1) & m->mask) {
        struct kvr_map_group *grp = &m->groups[g];
        uint32_t ctrl = grp->ctrl;
        for (uint32_t hit = kvr_map_match(ctrl, tag); hit; hit &= hit - 1) {
            uint32_t i = (uint32_t)__builtin_ctz(hit) >> 3;
            if (grp->key[i] != key)
                continue;
            bool open = kvr_map_match(ctrl, KVR_MAP_EMPTY) != 0; /* never probed past */
            set_ctrl(grp, i, open ? KVR_MAP_EMPTY : KVR_MAP_DELETED);
            m->tombs += !open;
            assert(m->count > 0);
            m->count--;
            uint32_t groups = m->mask + 1;
            if (groups > m->min_groups &&
                (uint64_t)m->count * 10 < (uint64_t)groups * KVR_MAP_LANES)
                rebuild(m, groups / 2); /* on NOMEM the table simply stays larger */
            return true;
        }
        if (kvr_map_match(ctrl, KVR_MAP_EMPTY))
            return false;
    }
}

size_t kvr_map_bytes(const struct kvr_map *m)
{
    return m->groups ? (size_t)(m->mask + 1) * sizeof(struct kvr_map_group) : 0;
}
