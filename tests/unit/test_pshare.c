/* kvr_pshare: the share of a worker's time the prefills booked on it lately take. */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <math.h>

#include "pshare.h"

#define S 1000000000ull /* ns */

static double share(const struct kvr_pshare *p, uint32_t slot, uint64_t now)
{
    return p->load[slot] * kvr_pshare_scale(p, now);
}

static bool near(double a, double b)
{
    return fabs(a - b) <= 1e-9 * (fabs(b) > 1 ? fabs(b) : 1);
}

Test(pshare, a_steady_rate_of_prefill_reads_as_its_share_of_the_time)
{
    struct kvr_pshare p;
    kvr_pshare_init(&p, 10 * S, 1.0);
    cr_assert(eq(int, kvr_pshare_reserve(&p, 2), KVR_OK));
    /* 100 ms of prefill every 500 ms on slot 0: a fifth of its time; nothing on slot 1 */
    uint64_t t = 1000 * S;
    for (int i = 0; i < 400; i++, t += S / 2)
        kvr_pshare_add(&p, 0, 100.0, t);
    t -= S / 2; /* the last booking's time */
    double s = share(&p, 0, t);
    /* a sum of exponentially decayed 100 ms every 0.5 s over a 10 s window: 100 / (10000 *
     * (1 - exp(-0.05))) = 0.2050 */
    cr_assert(s > 0.204 && s < 0.206, "share %f", s);
    cr_assert(eq(dbl, share(&p, 1, t), 0.0));
    cr_assert(eq(dbl, kvr_pshare_left(p.load[1], kvr_pshare_scale(&p, t)), 1.0),
              "a worker with no prefill decodes unstretched");
    kvr_pshare_free(&p);
}

Test(pshare, a_burst_of_prefill_fades_by_e_each_window)
{
    struct kvr_pshare p;
    kvr_pshare_init(&p, 10 * S, 1.0);
    cr_assert(eq(int, kvr_pshare_reserve(&p, 1), KVR_OK));
    kvr_pshare_add(&p, 0, 5000.0, 7 * S); /* 5 s of prefill at once: half the window */
    cr_assert(near(share(&p, 0, 7 * S), 0.5));
    cr_assert(near(share(&p, 0, 17 * S), 0.5 * exp(-1.0)));
    cr_assert(near(share(&p, 0, 37 * S), 0.5 * exp(-3.0)));
    kvr_pshare_free(&p);
}

Test(pshare, moving_the_epoch_keeps_every_slot_s_share)
{
    /* two trackers, one booked every window for 100 windows (its epoch moves every 32), the other
     * read from its first booking only by formula */
    struct kvr_pshare p;
    kvr_pshare_init(&p, 2 * S, 1.0);
    cr_assert(eq(int, kvr_pshare_reserve(&p, 3), KVR_OK));
    kvr_pshare_add(&p, 2, 1000.0, 0);
    uint64_t t = 0;
    double want = 0;
    for (int i = 0; i < 100; i++, t += 2 * S) {
        kvr_pshare_add(&p, i % 2, 400.0, t);
        want = want * exp(-1.0) + (i % 2 ? 0 : 400.0);
    }
    t -= 2 * S;
    cr_assert(p.epoch > 0, "the epoch moved");
    cr_assert(near(p.load[0] * kvr_pshare_scale(&p, t) * 2000.0, want), "%f against %f",
              p.load[0] * kvr_pshare_scale(&p, t) * 2000.0, want);
    cr_assert(share(&p, 2, t) < 1e-40, "a booking 99 windows old is as good as gone");
    cr_assert(share(&p, 2, t) >= 0);
    kvr_pshare_free(&p);
}

Test(pshare, a_share_is_read_as_at_most_its_bound)
{
    struct kvr_pshare p;
    kvr_pshare_init(&p, 1 * S, 1.0);
    cr_assert(eq(int, kvr_pshare_reserve(&p, 1), KVR_OK));
    kvr_pshare_add(&p, 0, 1e9, S); /* far more prefill than time: a forged or absurd load */
    double left = kvr_pshare_left(p.load[0], kvr_pshare_scale(&p, S));
    cr_assert(near(left, 1.0 - KVR_PSHARE_MAX), "a decode at most 1 / (1 - max) slower");
    kvr_pshare_clear(&p, 0);
    cr_assert(eq(dbl, kvr_pshare_left(p.load[0], kvr_pshare_scale(&p, S)), 1.0),
              "a slot a new worker takes starts empty");
    kvr_pshare_free(&p);
}

Test(pshare, off_it_stretches_nothing)
{
    struct kvr_pshare p;
    kvr_pshare_init(&p, 0, 1.0);
    cr_assert(eq(int, kvr_pshare_reserve(&p, 1), KVR_OK));
    kvr_pshare_add(&p, 0, 5000.0, S);
    cr_assert(eq(dbl, kvr_pshare_scale(&p, S), 0.0));
    cr_assert(eq(dbl, kvr_pshare_left(p.load[0], 0.0), 1.0));
    kvr_pshare_free(&p);
}

Test(pshare, the_window_is_the_engines_time)
{
    /* engines 10 times faster than the model: 1 s of the router's clock is 10 s of the model's,
     * so a 10 s window fades by e in 1 s, and 5 s of the model's prefill are half of it */
    struct kvr_pshare p;
    kvr_pshare_init(&p, 10 * S, 10.0);
    cr_assert(eq(int, kvr_pshare_reserve(&p, 1), KVR_OK));
    kvr_pshare_add(&p, 0, 5000.0, 0);
    cr_assert(near(share(&p, 0, 0), 0.5));
    cr_assert(near(share(&p, 0, S), 0.5 * exp(-1.0)));
    /* a steady 100 model ms every 0.1 s of the router's clock (1 s of the model's): 10 % */
    kvr_pshare_clear(&p, 0);
    uint64_t t = 100 * S;
    for (int i = 0; i < 400; i++, t += S / 10)
        kvr_pshare_add(&p, 0, 100.0, t);
    double s = share(&p, 0, t - S / 10);
    cr_assert(s > 0.10 && s < 0.106, "share %f", s);
    kvr_pshare_free(&p);
}

Test(pshare, a_withdrawn_prefill_is_taken_back)
{
    struct kvr_pshare p;
    kvr_pshare_init(&p, 2 * S, 1.0);
    cr_assert(eq(int, kvr_pshare_reserve(&p, 2), KVR_OK));
    kvr_pshare_add(&p, 0, 300.0, 5 * S);
    kvr_pshare_add(&p, 0, 700.0, 6 * S);
    kvr_pshare_add(&p, 1, 700.0, 6 * S);
    kvr_pshare_sub(&p, 0, 300.0, 5 * S);
    cr_assert(near(share(&p, 0, 7 * S), share(&p, 1, 7 * S)), "only the 700 ms are left");
    /* the epoch moves past a booking (a booking 100 s later on slot 1), then it is taken back */
    kvr_pshare_add(&p, 1, 100.0, 106 * S);
    cr_assert(p.epoch == 106 * S, "the epoch moved");
    double faded = p.load[0]; /* 700 ms faded by 50 windows, against the new epoch */
    cr_assert(gt(dbl, faded, 0.0));
    kvr_pshare_sub(&p, 0, 700.0, 6 * S);
    cr_assert(p.load[0] >= 0 && p.load[0] < faded * 1e-6, "nothing left: %g of %g", p.load[0],
              faded);
    kvr_pshare_sub(&p, 1, 1e6, 106 * S);
    cr_assert(eq(dbl, p.load[1], 0.0), "never below 0");
    kvr_pshare_free(&p);
    kvr_pshare_init(&p, 0, 1.0);
    cr_assert(eq(int, kvr_pshare_reserve(&p, 1), KVR_OK));
    kvr_pshare_sub(&p, 0, 5.0, S);
    cr_assert(eq(dbl, p.load[0], 0.0), "off: nothing");
    kvr_pshare_free(&p);
}

Test(pshare, growing_keeps_the_loads_and_starts_new_slots_empty)
{
    struct kvr_pshare p;
    kvr_pshare_init(&p, 10 * S, 1.0);
    cr_assert(eq(int, kvr_pshare_reserve(&p, 1), KVR_OK));
    kvr_pshare_add(&p, 0, 300.0, S);
    cr_assert(eq(int, kvr_pshare_reserve(&p, 1000), KVR_OK));
    cr_assert(eq(int, kvr_pshare_reserve(&p, 10), KVR_OK), "a smaller reserve keeps the room");
    cr_assert(eq(u32, p.nslots, 1000));
    cr_assert(near(share(&p, 0, S), 0.03));
    for (uint32_t i = 1; i < 1000; i++)
        cr_assert(eq(dbl, p.load[i], 0.0));
    kvr_pshare_free(&p);
}
