/* kvr_map against a reference, including growth, shrink and backward-shift deletion. */
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
    cr_assert(gt(sz, kvr_map_bytes(&m), 100000 * sizeof(struct kvr_map_slot)));
    for (uint32_t i = 0; i < 100000; i++)
        cr_assert(kvr_map_del(&m, i));
    cr_assert(eq(u32, m.count, 0));
    cr_assert(le(sz, kvr_map_bytes(&m), small * 2), "memory follows the contents back down");
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

/* Slots walked past home, summed over keys[0..n) once all are in. */
static uint64_t probes(const uint64_t *keys, uint32_t n)
{
    struct kvr_map m;
    cr_assert(eq(int, kvr_map_init(&m, n), KVR_OK));
    for (uint32_t i = 0; i < n; i++)
        cr_assert(eq(int, kvr_map_put(&m, keys[i], i), KVR_OK));
    uint64_t sum = 0;
    for (uint32_t s = 0; s <= m.mask; s++)
        if (m.slots[s].val != KVR_NIL)
            sum += (s - kvr_map_pos(&m, m.slots[s].key)) & m.mask;
    kvr_map_free(&m);
    return sum;
}

Test(map, keys_aimed_at_one_slot_scatter_once_salted)
{
    enum { N = 5000 };
    uint64_t *aimed = malloc(N * sizeof *aimed), *random = malloc(N * sizeof *random);
    struct kvr_rng rng;
    kvr_rng_seed(&rng, 11);
    for (uint32_t i = 0; i < N; i++) {
        aimed[i] = unmix((uint64_t)(i + 1) << 32); /* the same low 32 bits: one home slot */
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
