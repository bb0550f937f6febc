/*
 * The router's kept reply subjects (src/routerd/kept.h): a ring of the last KVR_KEPT_MAX requests
 * that ended, within KVR_KEPT_BYTES of reply subjects, the oldest released first.
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kept.h"

static struct kvr_kept k;

static void setup(void)
{
    cr_assert(eq(int, kvr_kept_init(&k), KVR_OK));
}

static void teardown(void)
{
    kvr_kept_free(&k);
}

TestSuite(kept, .init = setup, .fini = teardown, .timeout = 60);

/* A reply subject of n bytes (n >= 8) naming i. */
static char *reply_of(uint32_t i, size_t n)
{
    char *s = malloc(n + 1);
    cr_assert(s != NULL);
    memset(s, 'r', n);
    s[n] = 0;
    char tag[16];
    int t = snprintf(tag, sizeof tag, "%u", i);
    memcpy(s, tag, (size_t)t);
    return s;
}

/* Key i (never 0) with its reply, what kvr_kept_find says of it. */
static bool kept(uint32_t i, size_t n)
{
    const struct kvr_kept_item *it = kvr_kept_find(&k, (uint64_t)i + 1);
    if (!it)
        return false;
    char *want = reply_of(i, n);
    bool same = !strcmp(it->reply, want) && it->worker_id == i % 7;
    free(want);
    cr_assert(same, "key %u kept with another reply or worker", i);
    return true;
}

static void put(uint32_t i, size_t n)
{
    kvr_kept_put(&k, (uint64_t)i + 1, i % 7, reply_of(i, n), 1000 + i);
}

Test(kept, the_ring_keeps_the_last_ones)
{
    for (uint32_t i = 0; i < KVR_KEPT_MAX + 10; i++)
        put(i, 40);
    for (uint32_t i = 0; i < 10; i++)
        cr_assert(not(kept(i, 40)), "key %u is among the oldest, reused", i);
    for (uint32_t i = 10; i < KVR_KEPT_MAX + 10; i++)
        cr_assert(kept(i, 40), "key %u is among the last %u", i, KVR_KEPT_MAX);
    cr_assert(eq(u64, k.bytes, (uint64_t)KVR_KEPT_MAX * 41));
}

Test(kept, long_reply_subjects_are_bounded_by_bytes_oldest_first)
{
    const size_t n = 1023; /* the longest a router takes is 1,024 bytes */
    const uint32_t fit = KVR_KEPT_BYTES / (n + 1), puts = 3 * fit;
    for (uint32_t i = 0; i < puts; i++) {
        put(i, n);
        cr_assert(le(u64, k.bytes, KVR_KEPT_BYTES), "over the budget after %u", i);
    }
    for (uint32_t i = puts - fit; i < puts; i++)
        cr_assert(kept(i, n), "key %u is among the newest that fit", i);
    cr_assert(not(kept(puts - fit - 1, n)), "the one before them was released");
    /* short ones again: they fill the ring, the long ones go as it turns */
    for (uint32_t i = puts; i < puts + KVR_KEPT_MAX; i++)
        put(i, 40);
    for (uint32_t i = puts; i < puts + KVR_KEPT_MAX; i++)
        cr_assert(kept(i, 40), "key %u", i);
    cr_assert(eq(u64, k.bytes, (uint64_t)KVR_KEPT_MAX * 41));
}

Test(kept, a_key_kept_again_replaces_its_entry)
{
    put(5, 40);
    kvr_kept_put(&k, 6, 9, reply_of(77, 60), 2000);
    const struct kvr_kept_item *it = kvr_kept_find(&k, 6);
    cr_assert(it && it->worker_id == 9 && it->at == 2000);
    cr_assert(eq(u64, k.bytes, 61), "the first entry's bytes went with it");
    for (uint32_t i = 100; i < 100 + KVR_KEPT_MAX; i++) /* around the ring, past the hole */
        put(i, 40);
    cr_assert(eq(u64, k.bytes, (uint64_t)KVR_KEPT_MAX * 41));
    kvr_kept_put(&k, 0, 1, reply_of(1, 40), 1); /* key 0: not kept, its reply freed */
    cr_assert(eq(ptr, (void *)kvr_kept_find(&k, 0), NULL));
}
