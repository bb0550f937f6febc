/* The prefix index: events, strict prefixes, all overlaps in one walk, bounds, TTL. */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include "../criterion_end.h"
#include <string.h>

#include "index.h"
#include "kvr/hash.h"
#include "kvr/rng.h"

#define NS 1000000000ull

static struct kvr_blocktab tab;
static struct kvr_index ix;
static struct kvr_walk walk;
static bool ended; /* end ran: everything is freed */

static void setup_cfg(uint32_t max_entries)
{
    ended = false;
    cr_assert(eq(int, kvr_blocktab_init(&tab, 16), KVR_OK));
    struct kvr_index_config cfg = {120 * NS, max_entries, 80};
    cr_assert(eq(int, kvr_index_init(&ix, &tab, &cfg), KVR_OK));
    cr_assert(eq(int, kvr_index_reserve(&ix, 8), KVR_OK));
    cr_assert(eq(int, kvr_walk_reserve(&walk, 8), KVR_OK));
}

static void setup(void)
{
    setup_cfg(1000);
}

/* Every test's last step (criterion_end.h): the index freed, no node or set left behind. */
static void end(void)
{
    kvr_index_free(&ix);
    cr_assert(eq(u32, kvr_blocktab_count(&tab), 0), "no node outlives its entries");
    cr_assert(eq(sz, tab.set_bytes, 0));
    kvr_blocktab_free(&tab);
    kvr_walk_free(&walk);
    ended = true;
}

static void teardown(void)
{
    if (!ended) { /* a failed test */
        kvr_index_free(&ix);
        kvr_blocktab_free(&tab);
        kvr_walk_free(&walk);
    }
}

/* A prompt path: local hashes base+0.. and their sequence hashes. */
static void path(uint64_t base, uint32_t n, struct kvr_kv_block *blocks, uint64_t *seq)
{
    uint64_t prev = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t local = kvr_mix64(base + i);
        seq[i] = i ? kvr_hash_seq(prev, local) : local;
        prev = seq[i];
        if (blocks) {
            blocks[i].engine_id = 1000 * base + i;
            blocks[i].local_hash = local;
        }
    }
}

static void overlaps(const uint64_t *seq, uint32_t n, uint32_t *out)
{
    uint32_t nodes[64];
    memset(out, 0, 8 * sizeof *out);
    kvr_blocktab_walk(&tab, seq, n, &walk, out, NULL, NULL, nodes);
}

TestSuite(index, .init = setup, .fini = teardown);

KVR_TEST_END(index, stored_chain_with_parent_gives_overlap, end)
{
    struct kvr_kv_block b[6];
    uint64_t seq[6];
    uint32_t ov[8];
    path(1, 6, b, seq);
    cr_assert(eq(int, kvr_index_stored(&ix, 0, NULL, b, 3), KVR_OK));
    cr_assert(eq(int, kvr_index_stored(&ix, 0, &b[2].engine_id, b + 3, 3), KVR_OK));
    cr_assert(eq(int, kvr_index_stored(&ix, 1, NULL, b, 2), KVR_OK));
    overlaps(seq, 6, ov);
    cr_assert(eq(u32, ov[0], 6));
    cr_assert(eq(u32, ov[1], 2));
    cr_assert(eq(u32, ov[2], 0));
    cr_assert(eq(u32, kvr_index_entries(&ix), 8));
    cr_assert(eq(u32, kvr_index_worker_blocks(&ix, 0), 6));
    cr_assert(eq(u64, ix.cnt.stored_blocks, 8));
}

KVR_TEST_END(index, unknown_parent_rejects_whole_event, end)
{
    struct kvr_kv_block b[3];
    uint64_t seq[3], bogus = 424242;
    path(1, 3, b, seq);
    cr_assert(eq(int, kvr_index_stored(&ix, 0, &bogus, b, 3), KVR_ERR_UNKNOWN_PARENT));
    cr_assert(eq(u64, ix.cnt.unknown_parent, 1));
    cr_assert(eq(u32, kvr_index_entries(&ix), 0));
    cr_assert(eq(u32, kvr_blocktab_count(&tab), 0));
    /* a parent known on another worker is still unknown on this one */
    cr_assert(eq(int, kvr_index_stored(&ix, 1, NULL, b, 1), KVR_OK));
    cr_assert(eq(int, kvr_index_stored(&ix, 0, &b[0].engine_id, b + 1, 2), KVR_ERR_UNKNOWN_PARENT));
    cr_assert(eq(int, kvr_index_stored(&ix, 99, NULL, b, 1), KVR_ERR_INVALID));
}

KVR_TEST_END(index, hole_in_prefix_stops_overlap, end)
{
    struct kvr_kv_block b[5];
    uint64_t seq[5];
    uint32_t ov[8];
    path(3, 5, b, seq);
    cr_assert(eq(int, kvr_index_stored(&ix, 0, NULL, b, 5), KVR_OK));
    cr_assert(eq(int, kvr_index_stored(&ix, 1, NULL, b, 5), KVR_OK));
    uint64_t gone = b[2].engine_id;
    cr_assert(eq(int, kvr_index_removed(&ix, 0, &gone, 1), KVR_OK));
    overlaps(seq, 5, ov);
    cr_assert(eq(u32, ov[0], 2), "blocks 3 and 4 do not count after a hole at 2");
    cr_assert(eq(u32, ov[1], 5));
}

KVR_TEST_END(index, removed_frees_nodes_and_counts_unknown_ids, end)
{
    struct kvr_kv_block b[4];
    uint64_t seq[4], ids[5];
    path(5, 4, b, seq);
    cr_assert(eq(int, kvr_index_stored(&ix, 2, NULL, b, 4), KVR_OK));
    cr_assert(eq(u32, kvr_blocktab_count(&tab), 4));
    for (int i = 0; i < 4; i++)
        ids[i] = b[i].engine_id;
    ids[4] = 77;
    cr_assert(eq(int, kvr_index_removed(&ix, 2, ids, 5), KVR_OK));
    cr_assert(eq(u64, ix.cnt.unknown_block, 1));
    cr_assert(eq(u64, ix.cnt.removed_blocks, 4));
    cr_assert(eq(u32, kvr_blocktab_count(&tab), 0), "no empty node is left behind");
    cr_assert(eq(int, kvr_index_removed(&ix, 2, ids, 1), KVR_OK));
    cr_assert(eq(u64, ix.cnt.unknown_block, 2), "a second removal is an unknown id");
}

KVR_TEST_END(index, cleared_drops_one_worker_only, end)
{
    struct kvr_kv_block b[4];
    uint64_t seq[4];
    uint32_t ov[8];
    path(9, 4, b, seq);
    for (uint32_t w = 0; w < 3; w++)
        cr_assert(eq(int, kvr_index_stored(&ix, w, NULL, b, 4), KVR_OK));
    kvr_index_clear_worker(&ix, 1);
    overlaps(seq, 4, ov);
    cr_assert(eq(u32, ov[0], 4));
    cr_assert(eq(u32, ov[1], 0));
    cr_assert(eq(u32, ov[2], 4));
    cr_assert(eq(u32, kvr_index_worker_blocks(&ix, 1), 0));
    cr_assert(eq(u64, ix.cnt.cleared, 4));
    /* the cleared worker's engine ids are gone: a child of them is refused */
    cr_assert(eq(int, kvr_index_stored(&ix, 1, &b[3].engine_id, b, 1), KVR_ERR_UNKNOWN_PARENT));
}

KVR_TEST_END(index, repeated_and_reassigned_engine_ids, end)
{
    struct kvr_kv_block a[2], c[2];
    uint64_t sa[2], sc[2];
    uint32_t ov[8];
    path(20, 2, a, sa);
    path(30, 2, c, sc);
    cr_assert(eq(int, kvr_index_stored(&ix, 0, NULL, a, 2), KVR_OK));
    cr_assert(eq(int, kvr_index_stored(&ix, 0, NULL, a, 2), KVR_OK), "duplicates are idempotent");
    cr_assert(eq(u32, kvr_index_entries(&ix), 2));
    c[0].engine_id = a[0].engine_id; /* the engine reuses an id for another block */
    c[1].engine_id = 555;
    cr_assert(eq(int, kvr_index_stored(&ix, 0, NULL, c, 2), KVR_OK));
    cr_assert(eq(u64, ix.cnt.reassigned, 1));
    overlaps(sa, 2, ov);
    cr_assert(eq(u32, ov[0], 0), "the old block under the reused id is gone");
    overlaps(sc, 2, ov);
    cr_assert(eq(u32, ov[0], 2));
}

KVR_TEST_END(index, every_worker_overlap_in_one_walk, end)
{
    struct kvr_kv_block b[8];
    uint64_t seq[8];
    uint32_t ov[8];
    path(40, 8, b, seq);
    for (uint32_t w = 0; w < 8; w++)
        cr_assert(eq(int, kvr_index_stored(&ix, w, NULL, b, w), KVR_OK)); /* w holds w blocks */
    overlaps(seq, 8, ov);
    for (uint32_t w = 0; w < 8; w++)
        cr_assert(eq(u32, ov[w], w));
}

KVR_TEST_END(index, bounded_under_flood_of_stored_events, end)
{
    struct kvr_kv_block b[16];
    uint64_t seq[16];
    for (uint64_t p = 0; p < 5000; p++) {
        path(1000 + p, 16, b, seq);
        cr_assert(eq(int, kvr_index_stored(&ix, (uint32_t)(p % 8), NULL, b, 16), KVR_OK));
        cr_assert(le(u32, kvr_index_entries(&ix), 1000 + 16));
    }
    cr_assert(gt(u64, ix.cnt.pruned, 0));
    cr_assert(le(u32, kvr_blocktab_count(&tab), 1000 + 16));
    /* the newest path survived pruning */
    uint32_t ov[8];
    overlaps(seq, 16, ov);
    cr_assert(eq(u32, ov[4999 % 8], 16));
}

KVR_TEST_END(index, approximate_entries_expire_after_ttl_and_refresh_on_use, end)
{
    uint32_t nodes[4];
    uint64_t seq[4];
    uint32_t ov[8];
    path(50, 4, NULL, seq);
    for (int i = 0; i < 4; i++)
        cr_assert(eq(int, kvr_blocktab_get(&tab, seq[i], &nodes[i]), KVR_OK));
    cr_assert(eq(int, kvr_index_touch(&ix, 3, nodes, 4, 0), KVR_OK));
    cr_assert(eq(int, kvr_index_touch(&ix, 4, nodes, 2, 10 * NS), KVR_OK));
    kvr_index_expire(&ix, 100 * NS);
    overlaps(seq, 4, ov);
    cr_assert(eq(u32, ov[3], 4));
    cr_assert(eq(int, kvr_index_touch(&ix, 3, nodes, 1, 100 * NS), KVR_OK)); /* refresh block 0 */
    kvr_index_expire(&ix, 125 * NS);
    overlaps(seq, 4, ov);
    cr_assert(eq(u32, ov[3], 1), "only the refreshed block is left");
    cr_assert(eq(u32, ov[4], 2), "worker 4's entries live until 130 s");
    cr_assert(eq(u64, ix.cnt.expired, 3));
    kvr_index_expire(&ix, 130 * NS);
    overlaps(seq, 4, ov);
    cr_assert(eq(u32, ov[4], 0));
    cr_assert(eq(u64, ix.cnt.expired, 5));
    kvr_index_expire(&ix, 220 * NS);
    cr_assert(eq(u32, kvr_index_entries(&ix), 0));
    cr_assert(eq(u32, kvr_blocktab_count(&tab), 0));
}

KVR_TEST_END(index, event_entry_outranks_ttl_entry, end)
{
    struct kvr_kv_block b[2];
    uint64_t seq[2];
    uint32_t nodes[2];
    path(60, 2, b, seq);
    for (int i = 0; i < 2; i++)
        cr_assert(eq(int, kvr_blocktab_get(&tab, seq[i], &nodes[i]), KVR_OK));
    cr_assert(eq(int, kvr_index_touch(&ix, 0, nodes, 2, 0), KVR_OK));
    cr_assert(eq(int, kvr_index_stored(&ix, 0, NULL, b, 2), KVR_OK));
    cr_assert(eq(u32, kvr_index_entries(&ix), 2), "the event upgraded the guesses in place");
    kvr_index_expire(&ix, 1000 * NS);
    cr_assert(eq(u32, kvr_index_entries(&ix), 2), "event entries do not expire");
    cr_assert(eq(int, kvr_index_removed(&ix, 0, &b[1].engine_id, 1), KVR_OK));
    cr_assert(eq(u32, kvr_index_entries(&ix), 1));
}

KVR_TEST_END(index, pruning_counts_live_entries_apart_from_guesses, end)
{
    struct kvr_kv_block b[10];
    uint64_t seq[10];
    uint32_t nodes[10];
    path(70, 10, b, seq);
    for (int i = 0; i < 10; i++)
        cr_assert(eq(int, kvr_blocktab_get(&tab, seq[i], &nodes[i]), KVR_OK));
    cr_assert(eq(int, kvr_index_touch(&ix, 1, nodes, 10, 0), KVR_OK)); /* 10 guesses */
    for (int i = 0; i < 10; i++)
        kvr_blocktab_release(&tab, nodes[i]);
    cr_assert(eq(int, kvr_index_stored(&ix, 0, NULL, b, 10), KVR_OK)); /* 10 engine blocks */
    cr_assert(eq(u32, kvr_index_entries(&ix), 20));
    uint64_t n;
    kvr_index_set_bound(&ix, 15); /* prune to 12: 8 of the 10 guesses go first */
    cr_assert(eq(u32, kvr_index_entries(&ix), 12));
    cr_assert(eq(u64, ix.cnt.pruned, 8));
    cr_assert(eq(u64, ix.cnt.pruned_live, 0), "the guesses went first");
    cr_assert(not(kvr_index_prune_report(&ix, 1 * NS, 60 * NS, &n)), "guesses are not reported");
    kvr_index_set_bound(&ix, 5); /* prune to 4: the 2 guesses left, then 6 live entries */
    cr_assert(eq(u64, ix.cnt.pruned, 16));
    cr_assert(eq(u64, ix.cnt.pruned_live, 6));
    cr_assert(kvr_index_prune_report(&ix, 5 * NS, 60 * NS, &n));
    cr_assert(eq(u64, n, 6));
    cr_assert(not(kvr_index_prune_report(&ix, 100 * NS, 60 * NS, &n)), "nothing new");
    kvr_index_set_bound(&ix, 2); /* prune to 1: 3 more live entries */
    cr_assert(not(kvr_index_prune_report(&ix, 6 * NS, 60 * NS, &n)), "too soon");
    cr_assert(kvr_index_prune_report(&ix, 65 * NS, 60 * NS, &n));
    cr_assert(eq(u64, n, 3));
    kvr_index_set_bound(&ix, 1000);
    cr_assert(eq(u32, kvr_index_entries(&ix), 1), "a higher bound prunes nothing");
}

/* What a walk in steps visited: each engine id, how many times. */
static uint32_t visits[4000];

static void count_visit(void *ctx, uint32_t slot, uint64_t seq, bool has_engine, uint64_t engine_id,
                        uint64_t expires)
{
    (void)ctx, (void)slot, (void)seq, (void)expires;
    cr_assert(has_engine && engine_id < 4000);
    visits[engine_id]++;
}

/* A snapshot walks the index in slices while events change it: every entry there throughout is
 * visited once, the walk's next entry removed between two steps does not end or derail it, an
 * entry removed before its turn is not visited, one stored meanwhile is. */
KVR_TEST_END(index, a_walk_in_steps_survives_the_index_changing_between_them, end)
{
    struct kvr_kv_block b[100], c[5];
    uint64_t seq[100];
    path(1, 100, b, seq); /* engine ids 1000..1099, in age order */
    cr_assert(eq(int, kvr_index_stored(&ix, 0, NULL, b, 100), KVR_OK));
    memset(visits, 0, sizeof visits);
    kvr_index_walk_begin(&ix);
    cr_assert(eq(u32, kvr_index_walk(&ix, count_visit, NULL, 10), 10)); /* 1000..1009 */
    uint64_t gone[3] = {1010, 1003, 1050}; /* the walk's next one, a visited one, a later one */
    cr_assert(eq(int, kvr_index_removed(&ix, 0, gone, 3), KVR_OK));
    path(3, 5, c, seq); /* 3000..3004, stored after the walk began */
    cr_assert(eq(int, kvr_index_stored(&ix, 1, NULL, c, 5), KVR_OK));
    uint32_t steps = 0, n, total = 10;
    while ((n = kvr_index_walk(&ix, count_visit, NULL, 7)) == 7)
        total += n, steps++;
    total += n;
    cr_assert(eq(u32, total, 100 - 2 + 5), "every entry but the two removed before their turn");
    for (uint64_t id = 1000; id < 1100; id++)
        cr_assert(eq(u32, visits[id], id == 1010 || id == 1050 ? 0 : 1), "engine id %llu",
                  (unsigned long long)id);
    for (uint64_t id = 3000; id < 3005; id++)
        cr_assert(eq(u32, visits[id], 1), "stored meanwhile: %llu", (unsigned long long)id);
    cr_assert(eq(u32, kvr_index_walk(&ix, count_visit, NULL, 7), 0), "the walk is over");
}

/* A guess the walk has not reached made an engine's entry between two steps (moved to the event
 * entries' list, empty when the walk began): there throughout, it is visited. */
KVR_TEST_END(index, a_walk_visits_a_guess_made_an_engine_entry, end)
{
    struct kvr_kv_block c[2];
    uint64_t cseq[2];
    uint32_t nodes[2];
    path(3, 2, c, cseq); /* guesses on worker 1: 3000, 3001 */
    for (int i = 0; i < 2; i++)
        cr_assert(eq(int, kvr_blocktab_get(&tab, cseq[i], &nodes[i]), KVR_OK));
    cr_assert(eq(int, kvr_index_touch(&ix, 1, nodes, 2, 0), KVR_OK));
    memset(visits, 0, sizeof visits);
    kvr_index_walk_begin(&ix);
    cr_assert(eq(int, kvr_index_stored(&ix, 1, NULL, c, 2), KVR_OK)); /* both to the events' */
    cr_assert(eq(u32, kvr_index_walk(&ix, count_visit, NULL, 4), 2));
    cr_assert(eq(u32, visits[3000] + visits[3001], 2));
}

/* The walk's next entry, its list's last, refreshed between two steps (a repeated Stored event
 * moves it to the tail where it was): there throughout, it is visited, once. */
KVR_TEST_END(index, a_walk_visits_its_last_entry_refreshed, end)
{
    struct kvr_kv_block b[3];
    uint64_t seq[3];
    path(2, 3, b, seq); /* 2000..2002 */
    cr_assert(eq(int, kvr_index_stored(&ix, 0, NULL, b, 3), KVR_OK));
    memset(visits, 0, sizeof visits);
    kvr_index_walk_begin(&ix);
    cr_assert(eq(u32, kvr_index_walk(&ix, count_visit, NULL, 2), 2)); /* 4000, 4001 */
    cr_assert(eq(int, kvr_index_stored(&ix, 0, &b[1].engine_id, &b[2], 1), KVR_OK)); /* again */
    while (kvr_index_walk(&ix, count_visit, NULL, 2) == 2)
        ;
    for (uint64_t id = 2000; id < 2003; id++)
        cr_assert(eq(u32, visits[id], 1), "engine id %llu", (unsigned long long)id);
}

/* lru[0], the guesses, in expiry order: what kvr_index_expire and prune read it as. */
static void assert_expiry_order(void)
{
    uint64_t last = 0;
    for (uint32_t h = ix.lru[0].head; h != KVR_NIL;) {
        const struct kvr_index_entry *e = kvr_pool_get(&ix.entries, h);
        cr_assert(ge(u64, e->expires, last), "lru[0] in expiry order");
        last = e->expires;
        h = e->lru.next;
    }
}

/* A guess imported from a peer (its TTL left, the peer's) after this router's own guesses of
 * longer life (decisions made during a snapshot) expires at its time, not at theirs: lru[0] stays
 * in expiry order whatever order the guesses come in. */
KVR_TEST_END(index, an_imported_guess_expires_at_its_time_behind_longer_ones, end)
{
    uint64_t seq[3], peer[2];
    uint32_t nodes[3];
    path(1, 3, NULL, seq);
    path(2, 2, NULL, peer);
    for (int i = 0; i < 3; i++)
        cr_assert(eq(int, kvr_blocktab_get(&tab, seq[i], &nodes[i]), KVR_OK));
    cr_assert(eq(int, kvr_index_touch(&ix, 0, nodes, 3, 10 * NS), KVR_OK)); /* expire at 130 s */
    cr_assert(eq(int, kvr_index_import(&ix, 1, peer[0], false, 0, 20 * NS), KVR_OK));
    cr_assert(eq(int, kvr_index_import(&ix, 1, peer[1], false, 0, 40 * NS), KVR_OK));
    cr_assert(eq(int, kvr_index_import(&ix, 2, peer[0], false, 0, 200 * NS), KVR_OK));
    assert_expiry_order();
    kvr_index_expire(&ix, 30 * NS);
    cr_assert(eq(u32, kvr_index_entries(&ix), 5), "the guess of 20 s is gone at 30 s");
    cr_assert(eq(u32, kvr_index_worker_blocks(&ix, 1), 1));
    kvr_index_expire(&ix, 50 * NS);
    cr_assert(eq(u32, kvr_index_worker_blocks(&ix, 1), 0));
    kvr_index_expire(&ix, 130 * NS);
    cr_assert(eq(u32, kvr_index_entries(&ix), 1), "the peer's longer guess outlives ours");
    kvr_index_expire(&ix, 200 * NS);
    cr_assert(eq(u32, kvr_index_entries(&ix), 0));
}

/* Behind more than 64 longer guesses, an imported one is moved back no further (a cost bound): it
 * takes the expiry of the guess it stops behind, and the order holds. */
KVR_TEST_END(index, an_imported_guess_behind_many_takes_the_expiry_it_stops_at, end)
{
    uint64_t seq[70], peer[1];
    uint32_t nodes[70];
    path(1, 70, NULL, seq);
    path(2, 1, NULL, peer);
    for (uint32_t i = 0; i < 70; i++) {
        cr_assert(eq(int, kvr_blocktab_get(&tab, seq[i], &nodes[i]), KVR_OK));
        cr_assert(eq(int, kvr_index_touch(&ix, 0, &nodes[i], 1, i * NS), KVR_OK));
    }
    cr_assert(eq(int, kvr_index_import(&ix, 1, peer[0], false, 0, 30 * NS), KVR_OK));
    assert_expiry_order();
    kvr_index_expire(&ix, 125 * NS); /* ours of 0..5 s go; the import, now 125 s, with them */
    cr_assert(eq(u32, kvr_index_worker_blocks(&ix, 1), 0));
    cr_assert(eq(u32, kvr_index_entries(&ix), 64));
}
