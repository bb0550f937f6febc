/*
 * The outbox (src/base/outbox.c): what is queued under a lock is published outside it, in order,
 * with its reply and error; a failed publish of a tagged message is reported by its tag; the
 * count of messages lost to allocation failures survives every send (the operators' counter).
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "outbox.h"

struct seen {
    char subjects[8][32];
    uint32_t n;
    uint32_t fail_from; /* publishes from this one on fail */
};

static kvr_status publish(void *ctx, const struct kvr_outmsg *m)
{
    struct seen *s = ctx;
    uint32_t i = s->n++;
    if (i < 8)
        snprintf(s->subjects[i], sizeof s->subjects[i], "%s", m->subject);
    return i >= s->fail_from ? KVR_ERR_NOT_DELIVERED : KVR_OK;
}

Test(outbox, sends_in_order_outside_the_lock_and_reports_failed_tags)
{
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    struct kvr_outbox o = {0};
    struct seen s = {.fail_from = 2};
    struct kvr_sink sink = {.publish = publish, .ctx = &s};
    kvr_outbox_add(&o, "a", "1", 1, KVR_OK);
    kvr_outbox_add_request(&o, "b", "inbox", "2", 1);
    kvr_outbox_add_tagged(&o, "c", NULL, "3", 1, 42);
    kvr_outbox_add(&o, "", "x", 1, KVR_OK); /* no subject: nothing */
    struct kvr_outbox_failures f = {0};
    uint32_t failed = kvr_outbox_send_report(&o, &mu, &sink, &f);
    cr_assert(eq(u32, s.n, 3));
    cr_assert(eq(str, s.subjects[0], "a"));
    cr_assert(eq(str, s.subjects[2], "c"));
    cr_assert(eq(u32, failed, 1));
    cr_assert(eq(u32, f.n, 1));
    cr_assert(eq(u64, f.v[0].tag, 42));
    cr_assert(eq(u64, atomic_load(&sink.failed), 1), "the sink counts what failed");
    cr_assert(eq(u32, o.n, 0), "sent messages leave the outbox");
    kvr_outbox_failures_free(&f);
    kvr_outbox_free(&o);
}

Test(outbox, every_failed_publish_is_counted_and_every_tagged_one_reported)
{
    /* a batch of 1,000 forwards (tagged) and 1,000 other messages through a cut connection:
     * each failure is counted by the sink, each forward reported for placing again (the first
     * 64 only, before: the rest were neither placed again nor answered) */
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    struct kvr_outbox o = {0};
    struct seen s = {.fail_from = 0};
    struct kvr_sink sink = {.publish = publish, .ctx = &s};
    for (uint64_t i = 1; i <= 1000; i++) {
        kvr_outbox_add_tagged(&o, "w.generate", "inbox", "x", 1, i);
        kvr_outbox_add(&o, "gossip", "y", 1, KVR_OK);
    }
    struct kvr_outbox_failures f = {0};
    cr_assert(eq(u32, kvr_outbox_send_report(&o, &mu, &sink, &f), 2000));
    cr_assert(eq(u32, f.n, 1000));
    for (uint32_t i = 0; i < f.n; i++)
        cr_assert(eq(u64, f.v[i].tag, i + 1), "in order");
    cr_assert(eq(u64, f.lost, 0));
    kvr_outbox_add(&o, "late", "z", 1, KVR_OK);
    kvr_outbox_send(&o, &mu, &sink); /* no report asked: still counted */
    cr_assert(eq(u64, atomic_load(&sink.failed), 2001));
    kvr_outbox_failures_free(&f);
    kvr_outbox_free(&o);
}

Test(outbox, the_dropped_count_survives_a_send)
{
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    struct kvr_outbox o = {0};
    struct seen s = {.fail_from = 100};
    struct kvr_sink sink = {.publish = publish, .ctx = &s};
    o.dropped = 3; /* as if three copies had failed to allocate */
    kvr_outbox_add(&o, "a", "1", 1, KVR_OK);
    kvr_outbox_send(&o, &mu, &sink);
    kvr_outbox_send(&o, &mu, &sink);
    cr_assert(eq(u32, s.n, 1));
    cr_assert(eq(u64, o.dropped, 3), "a counter for /metrics, never reset by a send");
    kvr_outbox_free(&o);
}
