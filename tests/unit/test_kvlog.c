/*
 * The router's last moment of KV events (src/routerd/kvlog.h): a ring of message copies in the
 * order applied, bounded by count, bytes and a window behind the newest; the ones marked (from a
 * time on, as a filter says) read back in order.
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvlog.h"

#define MS 1000000ull

struct seen {
    uint64_t wid[64], seq[64], t[64];
    char first[64];
    size_t len[64];
    uint32_t n;
};

static void see(void *ctx, const struct kvr_kvlog_event *e)
{
    struct seen *s = ctx;
    cr_assert(lt(u32, s->n, 64));
    s->wid[s->n] = e->worker_id;
    s->seq[s->n] = e->seq;
    s->t[s->n] = e->t;
    s->first[s->n] = e->len ? (char)e->data[0] : 0;
    s->len[s->n] = e->len;
    s->n++;
}

static bool add(struct kvr_kvlog *l, uint64_t wid, uint64_t t, char c, size_t len)
{
    char buf[256];
    cr_assert(le(sz, len, sizeof buf));
    memset(buf, c, len);
    return kvr_kvlog_add(l, wid, 1000 + t, t, buf, len); /* numbered after its time */
}

/* Mark those applied at from or later (all of them: no filter), then read them back into s. */
static uint32_t since(struct kvr_kvlog *l, uint64_t from, struct seen *s)
{
    s->n = 0;
    uint32_t marked = kvr_kvlog_mark(l, from, NULL, NULL);
    uint32_t read = kvr_kvlog_replay(l, see, s);
    cr_assert(eq(u32, read, marked));
    cr_assert(eq(u32, kvr_kvlog_replay(l, see, s), 0), "read back once");
    return read;
}

Test(kvlog, read_back_in_order_from_a_time_on)
{
    struct kvr_kvlog l;
    kvr_kvlog_init(&l, 1000 * MS, 0, 0);
    cr_assert(eq(u32, l.max_events, KVR_KVLOG_EVENTS));
    cr_assert(eq(sz, l.max_bytes, (size_t)KVR_KVLOG_BYTES));
    for (uint32_t i = 0; i < 5; i++)
        cr_assert(add(&l, 1 + i % 2, (10 + i) * MS, (char)('a' + i), 8));
    cr_assert(add(&l, 3, 12 * MS, 'z', 0)); /* a clock set back: kept at the last one's time */
    struct seen s = {.n = 0};
    cr_assert(eq(u32, since(&l, 12 * MS, &s), 4));
    cr_assert(eq(chr, s.first[0], 'c'));
    cr_assert(eq(chr, s.first[2], 'e'));
    cr_assert(eq(u64, s.wid[2], 1));
    cr_assert(eq(u64, s.t[3], 14 * MS));
    cr_assert(eq(u64, s.seq[0], 1000 + 12 * MS));
    cr_assert(eq(sz, s.len[3], 0));
    cr_assert(eq(u64, l.dropped, 0));
    kvr_kvlog_free(&l);
}

Test(kvlog, the_oldest_go_past_the_window_the_count_or_the_bytes)
{
    struct kvr_kvlog l;
    kvr_kvlog_init(&l, 100 * MS, 4, 40);
    for (uint32_t i = 0; i < 6; i++) /* count: the last 4 stay, 2 let go for room */
        cr_assert(add(&l, 1, i * MS, (char)('a' + i), 8));
    struct seen s = {.n = 0};
    cr_assert(eq(u32, since(&l, 0, &s), 4));
    cr_assert(eq(chr, s.first[0], 'c'));
    cr_assert(eq(u64, l.dropped, 2));
    cr_assert(add(&l, 1, 6 * MS, 'g', 30)); /* bytes: 8 + 30 <= 40, so 3 more go */
    cr_assert(eq(u32, since(&l, 0, &s), 2));
    cr_assert(eq(chr, s.first[0], 'f'));
    cr_assert(eq(sz, l.bytes, 38));
    cr_assert(eq(u64, l.dropped, 5));
    cr_assert(not(add(&l, 1, 7 * MS, 'x', 41)), "larger than the bound: not kept");
    cr_assert(eq(u64, l.dropped, 6));
    cr_assert(eq(u32, l.n, 2), "and nothing let go for it");
    cr_assert(add(&l, 1, 200 * MS, 'h', 1)); /* window: both older than 100 ms go, not counted */
    cr_assert(eq(u32, since(&l, 0, &s), 1));
    cr_assert(eq(chr, s.first[0], 'h'));
    cr_assert(eq(u64, l.dropped, 6));
    cr_assert(eq(sz, l.bytes, 1));
    kvr_kvlog_free(&l);
    cr_assert(eq(u32, l.n, 0));
}

Test(kvlog, a_full_ring_wraps_around_many_times)
{
    struct kvr_kvlog l;
    kvr_kvlog_init(&l, 1000 * MS, 7, 0);
    for (uint32_t i = 0; i < 1000; i++)
        cr_assert(add(&l, i, i, (char)i, 1 + i % 200));
    struct seen s = {.n = 0};
    cr_assert(eq(u32, since(&l, 0, &s), 7));
    for (uint32_t i = 0; i < 7; i++) {
        cr_assert(eq(u64, s.wid[i], 993 + i));
        cr_assert(eq(sz, s.len[i], 1 + (993 + i) % 200));
    }
    size_t sum = 0;
    for (uint32_t i = 0; i < 7; i++)
        sum += s.len[i];
    cr_assert(eq(sz, l.bytes, sum));
    kvr_kvlog_free(&l);
}

/* Worker 2's events numbered above 5 only: the filter sees each event's worker and number. */
static bool of_two_above_five(void *ctx, const struct kvr_kvlog_event *e)
{
    (void)ctx;
    return e->worker_id == 2 && e->seq > 5;
}

Test(kvlog, a_filter_marks_some_and_an_event_added_later_is_not_marked)
{
    struct kvr_kvlog l;
    kvr_kvlog_init(&l, 1000 * MS, 0, 0);
    char b[4] = "abc";
    for (uint64_t i = 1; i <= 8; i++)
        cr_assert(kvr_kvlog_add(&l, 2 - i % 2, i, i * MS, b, sizeof b));   /* even: worker 2 */
    cr_assert(eq(u32, kvr_kvlog_mark(&l, 0, of_two_above_five, NULL), 2)); /* 6 and 8 */
    cr_assert(kvr_kvlog_add(&l, 2, 10, 9 * MS, b, sizeof b));              /* after the marking */
    struct seen s = {.n = 0};
    cr_assert(eq(u32, kvr_kvlog_replay(&l, see, &s), 2));
    cr_assert(eq(u64, s.seq[0], 6));
    cr_assert(eq(u64, s.seq[1], 8));
    cr_assert(eq(u32, kvr_kvlog_mark(&l, 7 * MS, NULL, NULL), 3), "7, 8 and 10: from a time on");
    cr_assert(eq(u32, kvr_kvlog_mark(&l, 0, of_two_above_five, NULL), 3), "marked again: 6, 8, 10");
    kvr_kvlog_free(&l);
}
