/*
 * kvr_map implementation. Invariant: every key sits in the probe run that starts at its home
 * position with no empty slot in between; deletion shifts later members of the run back so the
 * invariant holds without tombstones. At most 70 % of the slots are occupied, so every probe run
 * ends at an empty slot. Single-threaded, like its owner.
 */
#include "map.h"

#include <assert.h>
#include <stdlib.h>

#include "bigmem.h"

#define MAP_MIN_CAP 16u

uint64_t kvr_map_salt;

void kvr_map_set_salt(uint64_t salt)
{
    kvr_map_salt = salt;
}

static struct kvr_map_slot *alloc_slots(uint32_t cap)
{
    struct kvr_map_slot *s = kvr_bigmem_alloc((size_t)cap * sizeof *s);
    if (!s)
        return NULL;
    for (uint32_t i = 0; i < cap; i++)
        s[i].val = KVR_NIL;
    return s;
}

static uint32_t cap_for(uint32_t n)
{
    uint32_t cap = MAP_MIN_CAP;
    while (cap < (1u << 31) && (uint64_t)n * 10 > (uint64_t)cap * 7)
        cap <<= 1;
    return cap;
}

kvr_status kvr_map_init(struct kvr_map *m, uint32_t hint)
{
    uint32_t cap = cap_for(hint);
    m->slots = alloc_slots(cap);
    if (!m->slots)
        return KVR_ERR_NOMEM;
    m->mask = cap - 1;
    m->count = 0;
    m->min_cap = cap;
    return KVR_OK;
}

void kvr_map_free(struct kvr_map *m)
{
    free(m->slots);
    m->slots = NULL;
    m->mask = 0;
    m->count = 0;
}

static void place(struct kvr_map *m, uint64_t key, uint32_t val)
{
    uint32_t i = kvr_map_pos(m, key);
    while (m->slots[i].val != KVR_NIL)
        i = (i + 1) & m->mask;
    m->slots[i].key = key;
    m->slots[i].val = val;
}

static kvr_status resize(struct kvr_map *m, uint32_t cap)
{
    struct kvr_map_slot *old = m->slots;
    uint32_t old_cap = m->mask + 1;
    struct kvr_map_slot *s = alloc_slots(cap);
    if (!s)
        return KVR_ERR_NOMEM;
    m->slots = s;
    m->mask = cap - 1;
    for (uint32_t i = 0; i < old_cap; i++)
        if (old[i].val != KVR_NIL)
            place(m, old[i].key, old[i].val);
    free(old);
    return KVR_OK;
}

/* The load bound that keeps an empty slot at the end of every probe run. */
static inline __attribute__((unused)) bool load_ok(const struct kvr_map *m)
{
    return (uint64_t)m->count * 10 <= (uint64_t)(m->mask + 1) * 7;
}

kvr_status kvr_map_put(struct kvr_map *m, uint64_t key, uint32_t val)
{
    assert(val != KVR_NIL);
    uint32_t i = kvr_map_pos(m, key);
    for (;;) {
        struct kvr_map_slot *s = &m->slots[i];
        if (s->val == KVR_NIL)
            break;
        if (s->key == key) {
            s->val = val;
            return KVR_OK;
        }
        i = (i + 1) & m->mask;
    }
    if ((uint64_t)(m->count + 1) * 10 > (uint64_t)(m->mask + 1) * 7) {
        if (m->mask + 1 >= (1u << 31))
            return KVR_ERR_FULL;
        kvr_status st = resize(m, (m->mask + 1) * 2);
        if (st != KVR_OK)
            return st;
        place(m, key, val);
    } else {
        m->slots[i].key = key;
        m->slots[i].val = val;
    }
    m->count++;
    assert(load_ok(m));
    return KVR_OK;
}

uint32_t *kvr_map_upsert(struct kvr_map *m, uint64_t key, bool *created)
{
    if ((uint64_t)(m->count + 1) * 10 > (uint64_t)(m->mask + 1) * 7) {
        if (kvr_map_get(m, key) != KVR_NIL) { /* present: no growth needed */
            *created = false;
            uint32_t i = kvr_map_pos(m, key);
            while (m->slots[i].key != key || m->slots[i].val == KVR_NIL)
                i = (i + 1) & m->mask;
            return &m->slots[i].val;
        }
        if (m->mask + 1 >= (1u << 31) || resize(m, (m->mask + 1) * 2) != KVR_OK)
            return NULL;
    }
    uint32_t i = kvr_map_pos(m, key);
    for (;;) {
        struct kvr_map_slot *s = &m->slots[i];
        if (s->val == KVR_NIL) {
            s->key = key;
            s->val = 0;
            m->count++;
            assert(load_ok(m));
            *created = true;
            return &s->val;
        }
        if (s->key == key) {
            *created = false;
            return &s->val;
        }
        i = (i + 1) & m->mask;
    }
}

bool kvr_map_del(struct kvr_map *m, uint64_t key)
{
    uint32_t i = kvr_map_pos(m, key);
    for (;;) {
        struct kvr_map_slot *s = &m->slots[i];
        if (s->val == KVR_NIL)
            return false;
        if (s->key == key)
            break;
        i = (i + 1) & m->mask;
    }
    /* backward shift: pull later run members whose home lies at or before the hole */
    uint32_t hole = i;
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        struct kvr_map_slot *s = &m->slots[j];
        if (s->val == KVR_NIL)
            break;
        uint32_t home = kvr_map_pos(m, s->key);
        if (((j - home) & m->mask) >= ((j - hole) & m->mask)) {
            m->slots[hole] = *s;
            hole = j;
        }
    }
    m->slots[hole].val = KVR_NIL;
    assert(m->count > 0);
    m->count--;
    uint32_t cap = m->mask + 1;
    if (cap > m->min_cap && (uint64_t)m->count * 10 < cap)
        resize(m, cap / 2); /* on NOMEM the table simply stays larger */
    return true;
}

size_t kvr_map_bytes(const struct kvr_map *m)
{
    return m->slots ? (size_t)(m->mask + 1) * sizeof(struct kvr_map_slot) : 0;
}
