/*
 * kvr_map implementation. Invariants: a key sits in its home group or a later one (probing wraps),
 * and every group from its home up to, not including, its own counts it in `passed`; so a group's
 * `passed` is the number of keys whose probe runs through it, and a lookup that reaches a group
 * with `passed` 0 without finding its key may stop. A key is inserted in the first group with an
 * empty slot on its probe, and only full groups are passed. At most 70 % of the slots hold keys, so
 * a probe always ends. Single-threaded, like its owner.
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
    for (uint32_t i = 0; i < n; i++) {
        g[i].ctrl = KVR_MAP_EMPTY * KVR_MAP_ONES;
        g[i].passed = 0;
    }
    return g;
}

/* Whether n keys stay within the 70 % load bound of `groups` groups. */
static inline bool fits(uint64_t n, uint32_t groups)
{
    return n * 10 <= (uint64_t)groups * KVR_MAP_LANES * 7;
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
    m->min_groups = g;
    m->ops = m->peak = m->prev_peak = m->resizes = 0;
    return KVR_OK;
}

void kvr_map_free(struct kvr_map *m)
{
    free(m->groups);
    m->groups = NULL;
    m->mask = 0;
    m->count = 0;
}

/* Set slot i's control byte of grp to b. */
static inline void set_ctrl(struct kvr_map_group *grp, uint32_t i, uint32_t b)
{
    grp->ctrl = (grp->ctrl & ~(0xffu << (8 * i))) | b << (8 * i);
}

/* Store key (absent) with hash h and value val: in the first group with an empty slot on its
 * probe, counted in every full group before it. Returns a pointer to the value. */
static uint32_t *place(struct kvr_map *m, uint64_t h, uint64_t key, uint32_t val)
{
    uint32_t g = (uint32_t)h & m->mask;
    uint32_t open;
    while (!(open = m->groups[g].ctrl & KVR_MAP_HIGHBITS)) {
        m->groups[g].passed++;
        g = (g + 1) & m->mask;
    }
    struct kvr_map_group *grp = &m->groups[g];
    uint32_t i = (uint32_t)__builtin_ctz(open) >> 3;
    set_ctrl(grp, i, (uint32_t)(h >> 57));
    grp->key[i] = key;
    grp->val[i] = val;
    return &grp->val[i];
}

/* An insertion or a deletion: the epoch's highest count; an epoch ends after as many as there
 * are slots, so a rebuild it leads to is paid for by that many operations. */
static void note_op(struct kvr_map *m)
{
    if (m->count > m->peak)
        m->peak = m->count;
    if (++m->ops >= (m->mask + 1) * KVR_MAP_LANES) {
        m->prev_peak = m->peak;
        m->peak = m->count;
        m->ops = 0;
    }
}

/* The groups a table under 10 % load shrinks to: halved while the highest count of this epoch
 * and the last one stays under a quarter of the half (so the table stayed low for a whole epoch
 * at least, and is then 12.5-25 % full at that count). Emptied, it waits like any other: a count
 * that often falls to 0 (a router between bursts) would otherwise rebuild it every time. */
static uint32_t shrunk(const struct kvr_map *m)
{
    uint64_t high = m->peak > m->prev_peak ? m->peak : m->prev_peak;
    uint32_t g = m->mask + 1;
    while (g / 2 >= m->min_groups && high * 4 < (uint64_t)(g / 2) * KVR_MAP_LANES)
        g /= 2;
    return g;
}

/* Rebuild into n groups, every key placed anew. */
static kvr_status rebuild(struct kvr_map *m, uint32_t n)
{
    struct kvr_map_group *old = m->groups;
    uint32_t old_n = m->mask + 1;
    struct kvr_map_group *g = alloc_groups(n);
    if (!g)
        return KVR_ERR_NOMEM;
    m->groups = g;
    m->mask = n - 1;
    m->ops = 0; /* a new epoch */
    m->peak = m->prev_peak = m->count;
    m->resizes++;
    for (uint32_t k = 0; k < old_n; k++)
        for (uint32_t i = 0; i < KVR_MAP_LANES; i++)
            if (!(old[k].ctrl >> (8 * i) & KVR_MAP_EMPTY))
                place(m, kvr_map_hash(old[k].key[i]), old[k].key[i], old[k].val[i]);
    free(old);
    return KVR_OK;
}

uint32_t *kvr_map_upsert(struct kvr_map *m, uint64_t key, bool *created)
{
    uint64_t h = kvr_map_hash(key);
    struct kvr_map_group *grp;
    uint32_t i = kvr__map_find(m, h, key, &grp);
    if (i != KVR_NIL) {
        *created = false;
        return &grp->val[i];
    }
    uint32_t groups = m->mask + 1;
    if (!fits((uint64_t)m->count + 1, groups) &&
        (groups >= MAP_MAX_GROUPS || rebuild(m, groups * 2) != KVR_OK))
        return NULL;
    m->count++;
    note_op(m);
    *created = true;
    return place(m, h, key, 0);
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
    struct kvr_map_group *grp;
    uint32_t i = kvr__map_find(m, h, key, &grp);
    if (i == KVR_NIL)
        return false;
    set_ctrl(grp, i, KVR_MAP_EMPTY);
    for (uint32_t g = (uint32_t)h & m->mask; &m->groups[g] != grp; g = (g + 1) & m->mask) {
        assert(m->groups[g].passed > 0);
        m->groups[g].passed--; /* the probe that passed it is gone */
    }
    assert(m->count > 0);
    m->count--;
    note_op(m);
    uint32_t groups = m->mask + 1;
    if (groups > m->min_groups && (uint64_t)m->count * 10 < (uint64_t)groups * KVR_MAP_LANES) {
        uint32_t want = shrunk(m);
        if (want < groups)
            rebuild(m, want); /* on NOMEM the table simply stays larger */
    }
    return true;
}

size_t kvr_map_bytes(const struct kvr_map *m)
{
    return m->groups ? (size_t)(m->mask + 1) * sizeof(struct kvr_map_group) : 0;
}
