/* kvr_hset in all three forms, and kvr_walk against a brute-force prefix intersection. */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <string.h>

#include "hset.h"
#include "kvr/rng.h"

#define SLOTS 300

static void check_against(struct kvr_hset *s, const uint32_t *ref)
{
    uint32_t n = 0;
    for (uint32_t slot = 0; slot < SLOTS; slot++) {
        uint32_t *v = kvr_hset_find(s, slot);
        if (ref[slot] == UINT32_MAX) {
            cr_assert(v == NULL, "slot %u should be absent", slot);
        } else {
            cr_assert(v != NULL, "slot %u should be present", slot);
            cr_assert(eq(u32, *v, ref[slot]));
            n++;
        }
    }
    cr_assert(eq(u32, s->n, n));
    struct kvr_hset_iter it;
    uint32_t slot, val, seen = 0;
    kvr_hset_iter_init(&it, s);
    while (kvr_hset_next(&it, &slot, &val)) {
        cr_assert(lt(u32, slot, SLOTS));
        cr_assert(eq(u32, val, ref[slot]));
        seen++;
    }
    cr_assert(eq(u32, seen, n));
}

Test(hset, inline_sparse_dense_transitions)
{
    struct kvr_hset s = KVR_HSET_INIT;
    size_t bytes = 0;
    uint32_t ref[SLOTS];
    memset(ref, 0xff, sizeof ref);
    cr_assert(eq(int, kvr_hset_add(&s, 5, 50, &bytes), KVR_OK));
    ref[5] = 50;
    cr_assert(eq(sz, bytes, 0), "one member is stored inline");
    check_against(&s, ref);
    for (uint32_t i = 0; i < 200; i++) {
        uint32_t slot = (i * 37 + 11) % SLOTS;
        if (ref[slot] != UINT32_MAX)
            continue;
        cr_assert(eq(int, kvr_hset_add(&s, slot, i, &bytes), KVR_OK));
        ref[slot] = i;
        check_against(&s, ref);
    }
    cr_assert(eq(u32, s.cap, KVR_HSET_DENSE));
    *kvr_hset_find(&s, 5) = 77;
    ref[5] = 77;
    check_against(&s, ref);
    for (uint32_t slot = 0; slot < SLOTS; slot++) {
        if (ref[slot] == UINT32_MAX) {
            cr_assert(not(kvr_hset_del(&s, slot, &bytes)));
            continue;
        }
        cr_assert(kvr_hset_del(&s, slot, &bytes));
        ref[slot] = UINT32_MAX;
        check_against(&s, ref);
    }
    cr_assert(eq(u32, s.n, 0));
    cr_assert(eq(sz, bytes, 0), "an empty set holds no memory");
}

Test(hset, random_operations_match_reference)
{
    struct kvr_rng rng;
    kvr_rng_seed(&rng, 7);
    struct kvr_hset s = KVR_HSET_INIT;
    size_t bytes = 0;
    uint32_t ref[SLOTS];
    memset(ref, 0xff, sizeof ref);
    for (int op = 0; op < 20000; op++) {
        /* bias towards growth, then shrink, so every form is visited */
        uint32_t slot = (uint32_t)kvr_rng_below(&rng, op % 4000 < 2000 ? SLOTS : 64);
        if (ref[slot] == UINT32_MAX && (op % 4000) < 2000) {
            cr_assert(eq(int, kvr_hset_add(&s, slot, (uint32_t)op, &bytes), KVR_OK));
            ref[slot] = (uint32_t)op;
        } else if (ref[slot] != UINT32_MAX) {
            cr_assert(kvr_hset_del(&s, slot, &bytes));
            ref[slot] = UINT32_MAX;
        }
        if (op % 97 == 0)
            check_against(&s, ref);
    }
    check_against(&s, ref);
    kvr_hset_release(&s, &bytes);
    cr_assert(eq(sz, bytes, 0));
}

/*
 * The inline form's reference counting (handled in hset.h without a call): a first reference,
 * more on the same slot, a second slot moving the set to the heap and back, and the set emptying
 * to the all-zero state with the fingerprint kept equal to the members'.
 */
Test(hset, ref_unref_inline_form)
{
    struct kvr_hset s = KVR_HSET_INIT;
    size_t bytes = 0;
    bool added;
    cr_assert(eq(int, kvr_hset_ref(&s, 7, &added, &bytes), KVR_OK));
    cr_assert(added && s.n == 1 && s.cap == 1 && s.fp == kvr_mix64(7) && bytes == 0);
    for (int i = 0; i < 3; i++) {
        cr_assert(eq(int, kvr_hset_ref(&s, 7, &added, &bytes), KVR_OK));
        cr_assert(added == false);
    }
    cr_assert(eq(u32, *kvr_hset_find(&s, 7), 4));
    cr_assert(eq(int, kvr_hset_ref(&s, 9, &added, &bytes), KVR_OK)); /* to the heap */
    cr_assert(added && s.n == 2 && s.cap > 1 && bytes > 0);
    cr_assert(s.fp == (kvr_mix64(7) ^ kvr_mix64(9)));
    cr_assert(kvr_hset_unref(&s, 9, &bytes));
    for (int i = 0; i < 3; i++)
        cr_assert(kvr_hset_unref(&s, 7, &bytes) == false);
    cr_assert(eq(u32, *kvr_hset_find(&s, 7), 1));
    cr_assert(kvr_hset_unref(&s, 7, &bytes));
    cr_assert(s.n == 0 && s.fp == 0 && kvr_hset_find(&s, 7) == NULL);
    cr_assert(eq(int, kvr_hset_ref(&s, 3, &added, &bytes), KVR_OK)); /* reused after emptying */
    cr_assert(added && s.n == 1 && s.fp == kvr_mix64(3));
    kvr_hset_release(&s, &bytes);
    cr_assert(s.n == 0 && s.cap == 0 && s.fp == 0 && bytes == 0);
}

/* Reference counting (kvr_hset_ref/unref) against a reference array, through every form. */
Test(hset, ref_unref_match_reference)
{
    struct kvr_rng rng;
    kvr_rng_seed(&rng, 11);
    struct kvr_hset s = KVR_HSET_INIT;
    size_t bytes = 0;
    uint32_t ref[SLOTS];
    memset(ref, 0xff, sizeof ref);
    for (int op = 0; op < 40000; op++) {
        bool grow = op % 8000 < 4000;
        uint32_t slot = (uint32_t)kvr_rng_below(&rng, grow ? SLOTS : 80);
        if (grow && (ref[slot] == UINT32_MAX || kvr_rng_below(&rng, 2))) {
            bool added;
            cr_assert(eq(int, kvr_hset_ref(&s, slot, &added, &bytes), KVR_OK));
            cr_assert(eq(int, added, ref[slot] == UINT32_MAX));
            ref[slot] = ref[slot] == UINT32_MAX ? 1 : ref[slot] + 1;
        } else if (ref[slot] != UINT32_MAX) {
            bool gone = kvr_hset_unref(&s, slot, &bytes);
            cr_assert(eq(int, gone, ref[slot] == 1));
            ref[slot] = ref[slot] == 1 ? UINT32_MAX : ref[slot] - 1;
        }
        if (op % 89 == 0)
            check_against(&s, ref);
    }
    check_against(&s, ref);
    kvr_hset_release(&s, &bytes);
    cr_assert(eq(sz, bytes, 0));
}

/* An act set (ref/unref) turns dense at KVR_HSET_ACT_DENSE_AT members and sparse again under
 * KVR_HSET_ACT_SPARSE_AT; an index set (add/del) with as many members stays sparse. */
Test(hset, act_sets_turn_dense_sooner_than_index_sets)
{
    struct kvr_hset act = KVR_HSET_INIT, idx = KVR_HSET_INIT;
    size_t bytes = 0;
    uint32_t ref[SLOTS];
    memset(ref, 0xff, sizeof ref);
    for (uint32_t i = 0; i < KVR_HSET_ACT_DENSE_AT; i++) {
        bool added;
        uint32_t slot = 3 + i * 29;
        cr_assert(not(eq(u32, act.cap, KVR_HSET_DENSE)), "sparse below the threshold");
        cr_assert(eq(int, kvr_hset_ref(&act, slot, &added, &bytes), KVR_OK));
        cr_assert(added);
        cr_assert(eq(int, kvr_hset_add(&idx, slot, 1, &bytes), KVR_OK));
        ref[slot] = 1;
    }
    cr_assert(eq(u32, act.cap, KVR_HSET_DENSE), "dense at %u members", KVR_HSET_ACT_DENSE_AT);
    cr_assert(not(eq(u32, idx.cap, KVR_HSET_DENSE)), "an index set stays sparse");
    check_against(&act, ref);
    check_against(&idx, ref);
    for (uint32_t i = 0; act.n >= KVR_HSET_ACT_SPARSE_AT; i++) {
        cr_assert(eq(u32, act.cap, KVR_HSET_DENSE), "dense down to the lower threshold");
        cr_assert(kvr_hset_unref(&act, 3 + i * 29, &bytes));
        ref[3 + i * 29] = UINT32_MAX;
    }
    cr_assert(not(eq(u32, act.cap, KVR_HSET_DENSE)), "sparse under %u", KVR_HSET_ACT_SPARSE_AT);
    check_against(&act, ref);
    kvr_hset_release(&act, &bytes);
    kvr_hset_release(&idx, &bytes);
    cr_assert(eq(sz, bytes, 0));
}

/* In a large fleet an act set's bitmap would be large: it turns dense at KVR_HSET_DENSE_AT like
 * an index set, and sparse again under KVR_HSET_SPARSE_AT. */
Test(hset, act_sets_of_a_large_fleet_turn_dense_as_index_sets_do)
{
    struct kvr_hset act = KVR_HSET_INIT;
    size_t bytes = 0;
    bool added;
    for (uint32_t i = 0; i < KVR_HSET_DENSE_AT; i++) { /* slots up to 60,000: 938 words */
        cr_assert(not(eq(u32, act.cap, KVR_HSET_DENSE)), "sparse at %u members", act.n);
        cr_assert(eq(int, kvr_hset_ref(&act, 60000 - i * 1000, &added, &bytes), KVR_OK));
    }
    cr_assert(eq(u32, act.cap, KVR_HSET_DENSE));
    for (uint32_t i = 0; act.n >= KVR_HSET_SPARSE_AT; i++)
        cr_assert(kvr_hset_unref(&act, 60000 - i * 1000, &bytes));
    cr_assert(not(eq(u32, act.cap, KVR_HSET_DENSE)), "sparse under %u", KVR_HSET_SPARSE_AT);
    kvr_hset_release(&act, &bytes);
    cr_assert(eq(sz, bytes, 0));
}

/* Slots with equal low bits (one of every 4 workers) fill a dense set like any others. */
Test(hset, dense_slots_with_equal_low_bits)
{
    struct kvr_hset s = KVR_HSET_INIT;
    size_t bytes = 0;
    uint32_t ref[SLOTS];
    memset(ref, 0xff, sizeof ref);
    for (uint32_t slot = 3; slot < SLOTS; slot += 4) {
        cr_assert(eq(int, kvr_hset_add(&s, slot, slot * 2, &bytes), KVR_OK));
        ref[slot] = slot * 2;
    }
    cr_assert(eq(u32, s.cap, KVR_HSET_DENSE));
    check_against(&s, ref);
    for (uint32_t slot = 3; slot < SLOTS; slot += 8) {
        cr_assert(kvr_hset_del(&s, slot, &bytes));
        ref[slot] = UINT32_MAX;
    }
    check_against(&s, ref);
    kvr_hset_release(&s, &bytes);
    cr_assert(eq(sz, bytes, 0));
}

/* Random chain of sets, sizes spanning all three forms; the walk must equal brute force. */
Test(walk, equals_brute_force_prefix_intersection)
{
    enum { DEPTH = 40, TRIALS = 60 };
    struct kvr_rng rng;
    kvr_rng_seed(&rng, 99);
    struct kvr_walk w = {0};
    cr_assert(eq(int, kvr_walk_reserve(&w, SLOTS), KVR_OK));
    for (int trial = 0; trial < TRIALS; trial++) {
        static struct kvr_hset sets[DEPTH];
        static bool member[DEPTH][SLOTS];
        size_t bytes = 0;
        memset(member, 0, sizeof member);
        uint32_t depth = 1 + (uint32_t)kvr_rng_below(&rng, DEPTH);
        uint32_t density = (uint32_t)kvr_rng_below(&rng, 100); /* percent */
        for (uint32_t d = 0; d < depth; d++) {
            memset(&sets[d], 0, sizeof sets[d]);
            for (uint32_t slot = 0; slot < SLOTS; slot++) {
                /* deeper blocks are held less often, as in a real prefix tree */
                bool in = kvr_rng_below(&rng, 100) < density && kvr_rng_below(&rng, 50) >= d;
                if (in) {
                    cr_assert(eq(int, kvr_hset_add(&sets[d], slot, 1, &bytes), KVR_OK));
                    member[d][slot] = true;
                }
            }
        }
        uint32_t out[SLOTS];
        memset(out, 0, sizeof out);
        kvr_walk_start(&w, &sets[0]);
        uint32_t d = 1;
        for (; d < depth && kvr_walk_alive(&w); d++)
            kvr_walk_step(&w, &sets[d], d, out);
        kvr_walk_finish(&w, d, out);
        uint32_t deepest = 0;
        for (uint32_t slot = 0; slot < SLOTS; slot++) {
            uint32_t expect = 0;
            while (expect < depth && member[expect][slot])
                expect++;
            cr_assert(eq(u32, out[slot], expect), "trial %d slot %u", trial, slot);
            deepest = expect > deepest ? expect : deepest;
        }
        cr_assert(eq(u32, w.deepest, deepest), "trial %d: the longest prefix", trial);
        for (uint32_t k = 0; k < w.words; k++) {
            cr_assert(eq(u64, w.alive[k], 0), "the walk leaves no state behind");
            cr_assert(eq(u64, w.tmp[k], 0));
        }
        for (uint32_t k = 0; k < depth; k++)
            kvr_hset_release(&sets[k], &bytes);
        cr_assert(eq(sz, bytes, 0));
    }
    kvr_walk_free(&w);
}
