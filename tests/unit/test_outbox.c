/*
 * The outbox (src/base/outbox.c): what is queued under a lock is published outside it, in order,
 * with its reply and error; a failed publish of a tagged message is reported by its tag; the
 * count of messages lost to allocation failures survives every send (the operators' counter).
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <pthread.h>
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
    struct kvr_sink sink = {publish, &s};
    kvr_outbox_add(&o, "a", "1", 1, KVR_OK);
    kvr_outbox_add_request(&o, "b", "inbox", "2", 1);
    kvr_outbox_add_tagged(&o, "c", NULL, "3", 1, 42);
    kvr_outbox_add(&o, "", "x", 1, KVR_OK); /* no subject: nothing */
    struct kvr_outbox_failure f[4];
    uint32_t k = kvr_outbox_send_report(&o, &mu, &sink, f, 4);
    cr_assert(eq(u32, s.n, 3));
    cr_assert(eq(str, s.subjects[0], "a"));
    cr_assert(eq(str, s.subjects[2], "c"));
    cr_assert(eq(u32, k, 1));
    cr_assert(eq(u64, f[0].tag, 42));
    cr_assert(eq(u32, o.n, 0), "sent messages leave the outbox");
    kvr_outbox_free(&o);
}

Test(outbox, the_dropped_count_survives_a_send)
{
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    struct kvr_outbox o = {0};
    struct seen s = {.fail_from = 100};
    struct kvr_sink sink = {publish, &s};
    o.dropped = 3; /* as if three copies had failed to allocate */
    kvr_outbox_add(&o, "a", "1", 1, KVR_OK);
    kvr_outbox_send(&o, &mu, &sink);
    kvr_outbox_send(&o, &mu, &sink);
    cr_assert(eq(u32, s.n, 1));
    cr_assert(eq(u64, o.dropped, 3), "a counter for /metrics, never reset by a send");
    kvr_outbox_free(&o);
}
