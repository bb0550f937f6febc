/* kvr_map against a reference, including growth, shrink and deletion behind overflowed groups. */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <stdlib.h>

#include "kvr/rng.h"
#include "map.h"

Test(map, put_get_overwrite_delete)
{
    struct kvr_map m;
    cr_assert(eq(int, kvr_map_init(&m, 0), KVR_OK));
    cr_assert(eq(u32, kvr_map_get(&m, 0), KVR_NIL));
    cr_assert(eq(int, kvr_map_put(&m, 0, 7), KVR_OK));
    cr_assert(eq(int, kvr_map_put(&m, UINT64_MAX, 8), KVR_OK));
    cr_assert(eq(u32, kvr_map_get(&m, 0), 7));
    cr_assert(eq(u32, kvr_map_get(&m, UINT64_MAX), 8));
    cr_assert(eq(int, kvr_map_put(&m, 0, 9), KVR_OK));
    cr_assert(eq(u32, kvr_map_get(&m, 0), 9));
    cr_assert(eq(u32, m.count, 2));
    cr_assert(kvr_map_del(&m, 0));
    cr_assert(not(kvr_map_del(&m, 0)));
    cr_assert(eq(u32, kvr_map_get(&m, 0), KVR_NIL));
    cr_assert(eq(u32, m.count, 1));
    kvr_map_free(&m);
}

Test(map, random_operations_match_reference)
{
    enum { KEYS = 5000, OPS = 200000 };
    static uint32_t ref[KEYS];
    struct kvr_map m;
    struct kvr_rng rng;
    kvr_rng_seed(&rng, 42);
    cr_assert(eq(int, kvr_map_init(&m, 4), KVR_OK));
    for (int i = 0; i < KEYS; i++)
        ref[i] = KVR_NIL;
    /* keys collide in their low bits on purpose: multiples of 2^20 */
    for (int op = 0; op < OPS; op++) {
        uint32_t k = (uint32_t)kvr_rng_below(&rng, KEYS);
        uint64_t key = (uint64_t)k << 20;
        if (kvr_rng_below(&rng, 3)) {
            uint32_t v = (uint32_t)kvr_rng_below(&rng, 1000000);
            cr_assert(eq(int, kvr_map_put(&m, key, v), KVR_OK));
            ref[k] = v;
        } else {
            cr_assert(eq(int, kvr_map_del(&m, key), ref[k] != KVR_NIL));
            ref[k] = KVR_NIL;
        }
    }
    uint32_t live = 0;
    for (int i = 0; i < KEYS; i++) {
        cr_assert(eq(u32, kvr_map_get(&m, (uint64_t)i << 20), ref[i]));
        live += ref[i] != KVR_NIL;
    }
    cr_assert(eq(u32, m.count, live));
    kvr_map_free(&m);
}

Test(map, grows_and_shrinks_with_contents)
{
    struct kvr_map m;
    cr_assert(eq(int, kvr_map_init(&m, 0), KVR_OK));
    size_t small = kvr_map_bytes(&m);
    for (uint32_t i = 0; i < 100000; i++)
        cr_assert(eq(int, kvr_map_put(&m, i, i), KVR_OK));
    cr_assert(gt(sz, kvr_map_bytes(&m), 100000 * 16)); /* 16 bytes a slot, 70 % full at most */
    for (uint32_t i = 0; i < 100000; i++)
        cr_assert(kvr_map_del(&m, i));
    cr_assert(eq(u32, m.count, 0));
    size_t big = kvr_map_bytes(&m);
    cr_assert(gt(sz, big, 100000 * 16), "emptied, it waits for the count to stay down");
    uint32_t slots = (m.mask + 1) * KVR_MAP_LANES;
    for (uint32_t i = 0; i < slots && kvr_map_bytes(&m) == big; i++) { /* an epoch, and one more */
        cr_assert(eq(int, kvr_map_put(&m, i, i), KVR_OK));
        cr_assert(kvr_map_del(&m, i));
    }
    cr_assert(le(sz, kvr_map_bytes(&m), small * 2), "memory follows the contents back down");
    kvr_map_free(&m);
}

Test(map, a_count_that_swings_keeps_its_size)
{
    struct kvr_map m;
    cr_assert(eq(int, kvr_map_init(&m, 0), KVR_OK));
    uint32_t next = 0, first = 0; /* keys first..next-1 are in */
    for (; next < 6000; next++)
        cr_assert(eq(int, kvr_map_put(&m, next, next), KVR_OK));
    uint32_t resizes = m.resizes, mask = m.mask;
    for (int swing = 0; swing < 50; swing++) { /* down to 400 (under 10 %) and back, oldest out */
        while (next - first > 400)
            cr_assert(kvr_map_del(&m, first++));
        for (; next - first < 6000; next++)
            cr_assert(eq(int, kvr_map_put(&m, next, next), KVR_OK));
    }
    cr_assert(eq(u32, m.resizes, resizes), "not rebuilt on every swing");
    cr_assert(eq(u32, m.mask, mask));
    for (uint32_t k = first; k < next; k++)
        cr_assert(eq(u32, kvr_map_get(&m, k), k));
    kvr_map_free(&m);
}

Test(map, a_table_that_stays_low_shrinks_within_two_epochs)
{
    struct kvr_map m;
    cr_assert(eq(int, kvr_map_init(&m, 0), KVR_OK));
    for (uint32_t i = 0; i < 100000; i++)
        cr_assert(eq(int, kvr_map_put(&m, i, i), KVR_OK));
    for (uint32_t i = 100; i < 100000; i++)
        cr_assert(kvr_map_del(&m, i));
    size_t big = kvr_map_bytes(&m);
    uint32_t slots = (m.mask + 1) * KVR_MAP_LANES, ops = 0, next = 100000, keys[100];
    for (uint32_t i = 0; i < 100; i++)
        keys[i] = i;
    /* the 100 keys churned, one out and one in, until it shrinks (two epochs at most) */
    for (uint32_t i = 0; ops < 2 * slots && kvr_map_bytes(&m) == big; ops += 2, i++) {
        cr_assert(kvr_map_del(&m, keys[i % 100]));
        keys[i % 100] = next;
        cr_assert(eq(int, kvr_map_put(&m, next, next), KVR_OK));
        next++;
    }
    for (uint32_t i = 0; i < 100; i++)
        cr_assert(eq(u32, kvr_map_get(&m, keys[i]), keys[i]));
    cr_assert(lt(sz, kvr_map_bytes(&m), big / 100), "shrunk at once to the size 100 keys need");
    cr_assert(ge(u32, m.count * 8, (m.mask + 1) * KVR_MAP_LANES), "12.5-25 %% full");
    cr_assert(lt(u32, m.count * 4, (m.mask + 1) * KVR_MAP_LANES));
    kvr_map_free(&m);
}

/* The inverse of an odd multiplier modulo 2^64 (Newton's iteration). */
static uint64_t inverse(uint64_t c)
{
    uint64_t x = c;
    for (int i = 0; i < 6; i++)
        x *= 2 - c * x;
    return x;
}

/* The key whose unsalted mix is h: the map's mixing undone step by step (what an attacker who
 * knows the function can do). */
static uint64_t unmix(uint64_t h)
{
    h ^= h >> 33;
    h *= inverse(0xff51afd7ed558ccdull);
    h ^= h >> 33;
    return h * inverse(0x9e3779b97f4a7c15ull);
}

/* Groups walked past home, summed over keys[0..n) once all are in. */
static uint64_t probes(const uint64_t *keys, uint32_t n)
{
    struct kvr_map m;
    cr_assert(eq(int, kvr_map_init(&m, n), KVR_OK));
    for (uint32_t i = 0; i < n; i++)
        cr_assert(eq(int, kvr_map_put(&m, keys[i], i), KVR_OK));
    uint64_t sum = 0;
    for (uint32_t s = 0; s < kvr_map_slots(&m); s++) {
        uint64_t key;
        uint32_t val;
        if (kvr_map_at(&m, s, &key, &val))
            sum += (s / KVR_MAP_LANES - ((uint32_t)kvr_map_hash(key) & m.mask)) & m.mask;
    }
    kvr_map_free(&m);
    return sum;
}

Test(map, keys_aimed_at_one_group_scatter_once_salted)
{
    enum { N = 5000 };
    uint64_t *aimed = malloc(N * sizeof *aimed), *random = malloc(N * sizeof *random);
    struct kvr_rng rng;
    kvr_rng_seed(&rng, 11);
    for (uint32_t i = 0; i < N; i++) {
        aimed[i] = unmix((uint64_t)(i + 1) << 32); /* the same low 32 bits: one home group */
        random[i] = kvr_rng_next(&rng);
    }
    kvr_map_set_salt(0);
    uint64_t flood = probes(aimed, N);
    kvr_map_set_salt(0x5eed5eed12345678ull);
    uint64_t salted = probes(aimed, N), base = probes(random, N);
    kvr_map_set_salt(0);
    cr_log_info("probes: aimed unsalted %llu, aimed salted %llu, random %llu",
                (unsigned long long)flood, (unsigned long long)salted, (unsigned long long)base);
    cr_assert(gt(u64, flood, 100 * base), "the attack is real without the salt");
    cr_assert(le(u64, salted, 2 * base), "salted, aimed keys cost what random ones do");
    free(aimed);
    free(random);
}

/* Whether every group's `passed` counts exactly the keys whose probe runs through it. */
static bool passed_counts_hold(const struct kvr_map *m)
{
    uint32_t groups = m->mask + 1;
    uint32_t *want = calloc(groups, sizeof *want);
    for (uint32_t s = 0; s < kvr_map_slots(m); s++) {
        uint64_t key;
        uint32_t val;
        if (!kvr_map_at(m, s, &key, &val))
            continue;
        for (uint32_t g = (uint32_t)kvr_map_hash(key) & m->mask; g != s / KVR_MAP_LANES;
             g = (g + 1) & m->mask)
            want[g]++;
    }
    bool ok = true;
    for (uint32_t g = 0; g < groups; g++)
        ok &= m->groups[g].passed == want[g];
    free(want);
    return ok;
}

/*
 * Under steady churn (one key out, a new one in, the count constant) at the highest load the table
 * keeps, every key stays findable, deleted ones are gone, each group's count of the probes that
 * pass it stays exact (so a lookup stops where it may), and the table neither grows nor shrinks.
 * kvr_map_at visits exactly the live keys.
 */
Test(map, churn_keeps_probe_counts_exact_and_keys_found)
{
    enum { N = 11000, STEPS = 200000 };
    static uint64_t keys[N];
    struct kvr_map m;
    struct kvr_rng rng;
    kvr_rng_seed(&rng, 7);
    cr_assert(eq(int, kvr_map_init(&m, 0), KVR_OK));
    for (uint32_t i = 0; i < N; i++) {
        keys[i] = kvr_rng_next(&rng);
        cr_assert(eq(int, kvr_map_put(&m, keys[i], i), KVR_OK));
    }
    size_t filled = kvr_map_bytes(&m);
    cr_log_info("churn: %u keys in %u slots", N, kvr_map_slots(&m));
    cr_assert(passed_counts_hold(&m));
    for (uint32_t s = 0; s < STEPS; s++) {
        uint32_t i = (uint32_t)kvr_rng_below(&rng, N);
        uint64_t gone = keys[i];
        cr_assert(kvr_map_del(&m, gone));
        cr_assert(eq(u32, kvr_map_get(&m, gone), KVR_NIL));
        keys[i] = kvr_rng_next(&rng);
        cr_assert(eq(int, kvr_map_put(&m, keys[i], i), KVR_OK));
        cr_assert(eq(u32, m.count, N));
        if (s % 20000 == 0)
            cr_assert(passed_counts_hold(&m));
    }
    cr_assert(passed_counts_hold(&m));
    cr_assert(eq(sz, kvr_map_bytes(&m), filled), "churn alone neither grows nor shrinks it");
    for (uint32_t i = 0; i < N; i++)
        cr_assert(eq(u32, kvr_map_get(&m, keys[i]), i));
    uint64_t sum = 0, want = 0;
    uint32_t seen = 0;
    for (uint32_t s = 0; s < kvr_map_slots(&m); s++) {
        uint64_t key;
        uint32_t val;
        if (!kvr_map_at(&m, s, &key, &val))
            continue;
        cr_assert(eq(u64, key, keys[val]));
        sum += val;
        seen++;
    }
    for (uint32_t i = 0; i < N; i++)
        want += i;
    cr_assert(eq(u32, seen, N));
    cr_assert(eq(u64, sum, want));
    kvr_map_free(&m);
}

/* An upsert claims a slot the caller fills, or finds the key's; a claim given back by delete
 * leaves the map as it was. */
Test(map, upsert_claims_and_finds)
{
    struct kvr_map m;
    bool created;
    cr_assert(eq(int, kvr_map_init(&m, 0), KVR_OK));
    for (uint32_t i = 0; i < 1000; i++) {
        uint32_t *v = kvr_map_upsert(&m, (uint64_t)i * 0x10001, &created);
        cr_assert(v && created);
        *v = i;
    }
    for (uint32_t i = 0; i < 1000; i++) {
        uint32_t *v = kvr_map_upsert(&m, (uint64_t)i * 0x10001, &created);
        cr_assert(v && !created);
        cr_assert(eq(u32, *v, i));
    }
    cr_assert(kvr_map_upsert(&m, 42ull << 40, &created) && created);
    cr_assert(kvr_map_del(&m, 42ull << 40));
    cr_assert(eq(u32, m.count, 1000));
    cr_assert(eq(u32, kvr_map_get(&m, 42ull << 40), KVR_NIL));
    kvr_map_free(&m);
}
