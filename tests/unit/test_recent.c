/* kvr_recent: the table of ended requests and early cancels, against a reference model. */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <stdbool.h>
#include <stdlib.h>

#include "kvr/rng.h"
#include "recent.h"

Test(recent, bounded_and_forgets_the_oldest_first)
{
    struct kvr_recent t;
    kvr_recent_init(&t, 3, 10);
    for (uint64_t k = 1; k <= 3; k++)
        cr_assert(eq(int, kvr_recent_put(&t, k, KVR_RECENT_ENDED, KVR_OK, false, 0), KVR_OK));
    cr_assert(
        eq(int, kvr_recent_put(&t, 4, KVR_RECENT_CANCELLED, KVR_ERR_DEADLINE, true, 0), KVR_OK));
    cr_assert(eq(u32, t.n, 3));
    cr_assert(eq(u64, t.evicted, 1));
    cr_assert(kvr_recent_find(&t, 1, 0) == NULL, "the oldest went first");
    const struct kvr_recent_item *it = kvr_recent_find(&t, 4, 0);
    cr_assert(it != NULL);
    cr_assert(eq(int, it->kind, KVR_RECENT_CANCELLED));
    cr_assert(eq(int, it->outcome, KVR_ERR_DEADLINE));
    cr_assert(it->silent);
    kvr_recent_put(&t, 2, KVR_RECENT_ENDED, KVR_ERR_CANCELLED, false, 5); /* again: younger */
    cr_assert(kvr_recent_find(&t, 3, 10) == NULL, "its time is up");
    cr_assert(kvr_recent_find(&t, 4, 10) == NULL);
    it = kvr_recent_find(&t, 2, 10);
    cr_assert(it != NULL, "restarted at 5: until 15");
    cr_assert(eq(int, it->outcome, KVR_ERR_CANCELLED));
    cr_assert(eq(u32, t.n, 1));
    cr_assert(kvr_recent_find(&t, 2, 15) == NULL);
    cr_assert(eq(u32, t.n, 0));
    kvr_recent_free(&t);
}

Test(recent, a_key_put_again_leaves_a_dead_item_that_holds_no_room)
{
    struct kvr_recent t;
    kvr_recent_init(&t, 2, 100);
    kvr_recent_put(&t, 7, KVR_RECENT_ENDED, KVR_OK, false, 0);
    kvr_recent_put(&t, 7, KVR_RECENT_ENDED, KVR_ERR_CANCELLED, false, 1); /* the first dies */
    cr_assert(eq(u32, t.n, 1));
    kvr_recent_put(&t, 8, KVR_RECENT_ENDED, KVR_OK, false, 2);
    cr_assert(eq(u32, t.n, 2));
    cr_assert(eq(u64, t.evicted, 0), "the dead item went, not a live key");
    cr_assert(kvr_recent_find(&t, 7, 2) != NULL);
    cr_assert(eq(int, kvr_recent_find(&t, 7, 2)->outcome, KVR_ERR_CANCELLED));
    uint32_t pos = 0;
    const struct kvr_recent_item *a = kvr_recent_next(&t, &pos), *b = kvr_recent_next(&t, &pos);
    cr_assert(a && b && !kvr_recent_next(&t, &pos), "two live items");
    cr_assert(eq(u64, a->key, 7), "oldest first");
    cr_assert(eq(u64, b->key, 8));
    kvr_recent_free(&t);
}

/* The reference: every item in the order put, oldest first, a key put again leaving its old item
 * dead (it holds a place until it reaches the head, as in the ring). */
struct ref {
    uint64_t key[256], expires[256];
    int outcome[256];
    bool live[256];
    uint32_t n, live_n;
    uint64_t evicted;
};

static int ref_find(const struct ref *r, uint64_t key)
{
    for (uint32_t i = 0; i < r->n; i++)
        if (r->live[i] && r->key[i] == key)
            return (int)i;
    return -1;
}

static void ref_pop(struct ref *r)
{
    r->live_n -= r->live[0];
    for (uint32_t j = 0; j + 1 < r->n; j++) {
        r->key[j] = r->key[j + 1];
        r->expires[j] = r->expires[j + 1];
        r->outcome[j] = r->outcome[j + 1];
        r->live[j] = r->live[j + 1];
    }
    r->n--;
}

static void ref_expire(struct ref *r, uint64_t now)
{
    while (r->n && (!r->live[0] || r->expires[0] <= now))
        ref_pop(r);
}

Test(recent, random_operations_match_the_reference_through_growth_and_wraps)
{
    enum { MAX = 150, KEYS = 260, OPS = 200000 };
    struct kvr_recent t;
    struct ref r = {.n = 0, .live_n = 0};
    kvr_recent_init(&t, MAX, 200);
    struct kvr_rng rng;
    kvr_rng_seed(&rng, 5);
    uint64_t now = 0;
    int compactions = 0;
    for (int op = 0; op < OPS; op++) {
        /* phases: time passing (keys expire); time still, few keys (each put again leaves a dead
         * item: compacted out); time still, many keys (live keys evicted) */
        int phase = op / 10000 % 3;
        now += phase == 0 ? kvr_rng_below(&rng, 3) : 0;
        uint64_t key = kvr_rng_below(&rng, phase == 1 ? KEYS / 3 : KEYS);
        if (kvr_rng_below(&rng, 2)) {
            int outcome = (int)kvr_rng_below(&rng, 4);
            cr_assert(
                eq(int, kvr_recent_put(&t, key, KVR_RECENT_ENDED, outcome, false, now), KVR_OK));
            ref_expire(&r, now);
            int i = ref_find(&r, key);
            if (i >= 0) {
                r.live[i] = false;
                r.live_n--;
            }
            if (r.n == MAX && r.n - r.live_n > MAX / 4) { /* compacted */
                uint32_t k = 0;
                for (uint32_t j = 0; j < r.n; j++)
                    if (r.live[j]) {
                        r.key[k] = r.key[j];
                        r.expires[k] = r.expires[j];
                        r.outcome[k] = r.outcome[j];
                        r.live[k++] = true;
                    }
                r.n = k;
                compactions++;
            }
            if (r.n == MAX) {
                r.evicted += r.live[0];
                ref_pop(&r);
                ref_expire(&r, now);
            }
            r.key[r.n] = key;
            r.expires[r.n] = now + 200;
            r.live[r.n] = true;
            r.outcome[r.n++] = outcome;
            r.live_n++;
        } else {
            const struct kvr_recent_item *it = kvr_recent_find(&t, key, now);
            ref_expire(&r, now);
            int i = ref_find(&r, key);
            cr_assert(eq(int, it != NULL, i >= 0), "op %d key %llu", op, (unsigned long long)key);
            if (it)
                cr_assert(eq(int, it->outcome, r.outcome[i]));
        }
        cr_assert(eq(u32, t.n, r.live_n));
        cr_assert(eq(u64, t.evicted, r.evicted));
        if (op % 997 == 0) { /* the iteration, oldest first */
            uint32_t pos = 0, k = 0, seen = 0;
            for (const struct kvr_recent_item *it; (it = kvr_recent_next(&t, &pos)); seen++) {
                while (!r.live[k])
                    k++;
                cr_assert(eq(u64, it->key, r.key[k++]));
            }
            cr_assert(eq(u32, seen, r.live_n));
        }
    }
    cr_assert(eq(u32, t.cap, MAX), "grown from 64 to 128, then to max");
    cr_assert(gt(int, compactions, 0), "the dead were compacted out");
    cr_assert(gt(u64, r.evicted, 0), "live keys were evicted");
    kvr_recent_free(&t);
}
