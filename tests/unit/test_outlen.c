/* kvr_outlen: the share of max_tokens that requests generated, learned per group of max_tokens. */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <stdbool.h>
#include <stdlib.h>

#include "kvr/rng.h"
#include "outlen.h"

Test(outlen, a_bucket_holds_its_lengths_and_is_at_most_an_eighth_wide)
{
    uint32_t prev = 0;
    for (uint32_t t = 0; t < KVR_OUTLEN_MAX_TOKENS; t += 1 + t / 64) {
        uint32_t b = kvr_outlen_bucket(t);
        cr_assert(b < KVR_OUTLEN_BUCKETS);
        cr_assert(b >= prev, "buckets follow the lengths' order");
        cr_assert(kvr_outlen_upper(b) >= t, "%u in bucket %u", t, b);
        cr_assert(b == 0 || kvr_outlen_upper(b - 1) < t, "%u: the bucket below ends before it", t);
        cr_assert(kvr_outlen_upper(b) - t <= t / 8, "%u: bucket %u ends at %u", t, b,
                  kvr_outlen_upper(b));
        prev = b;
    }
    cr_assert(eq(u32, kvr_outlen_bucket(UINT32_MAX), KVR_OUTLEN_BUCKETS - 1), "clamped");
    cr_assert(eq(u32, kvr_outlen_upper(KVR_OUTLEN_BUCKETS - 1), KVR_OUTLEN_MAX_TOKENS - 1));
}

Test(outlen, a_client_that_sends_its_exact_budget_is_priced_at_it)
{
    struct kvr_outlen o;
    kvr_outlen_init(&o, true);
    struct kvr_rng g;
    kvr_rng_seed(&g, 7);
    for (int i = 0; i < 20000; i++) {
        uint32_t m = 1 + (uint32_t)kvr_rng_below(&g, 3000);
        kvr_outlen_add(&o, m, m);
    }
    for (uint32_t m = 1; m <= 3000; m++)
        cr_assert(eq(u32, kvr_outlen_predict(&o, m), m));
}

Test(outlen, one_generous_max_tokens_for_everything_is_priced_at_the_mean_output)
{
    struct kvr_outlen o;
    kvr_outlen_init(&o, true);
    struct kvr_rng g;
    kvr_rng_seed(&g, 8);
    double sum = 0;
    for (uint32_t i = 0; i < 400; i++) {
        uint32_t out = (uint32_t)kvr_rng_below(&g, 601),
                 want = i < KVR_OUTLEN_MIN_SAMPLES ? 2048 : 0;
        if (want)
            cr_assert(eq(u32, kvr_outlen_predict(&o, 2048), 2048), "too few to go by: as sent");
        kvr_outlen_add(&o, 2048, out);
        kvr_outlen_add(&o, 100, 100); /* exact ones beside them keep theirs */
        sum += out;
    }
    uint32_t p = kvr_outlen_predict(&o, 2048), mean = (uint32_t)(sum / 400);
    cr_assert(p + 1 >= mean && p <= mean + 1, "predicted %u, mean %u", p, mean);
    cr_assert(eq(u32, kvr_outlen_predict(&o, 100), 100));
    cr_assert(eq(u32, kvr_outlen_predict(&o, 4096), 4096), "nothing learned of that group");
}

Test(outlen, it_follows_a_load_that_changes_and_stays_bounded)
{
    struct kvr_outlen o;
    kvr_outlen_init(&o, true);
    for (int i = 0; i < 5000; i++)
        kvr_outlen_add(&o, 1000, 100);
    cr_assert(eq(u32, kvr_outlen_predict(&o, 1000), 100));
    for (int i = 0; i < 2000; i++)
        kvr_outlen_add(&o, 1000, 900);
    uint32_t p = kvr_outlen_predict(&o, 1000);
    cr_assert(p >= 890 && p <= 900, "%u: the old ones are forgotten", p);
    for (uint32_t b = 0; b < KVR_OUTLEN_BUCKETS; b++)
        cr_assert(o.n[b] < KVR_OUTLEN_WINDOW && o.ratio[b] <= o.n[b]);
}

Test(outlen, off_unknown_and_out_of_range)
{
    struct kvr_outlen o;
    kvr_outlen_init(&o, false);
    for (int i = 0; i < 1000; i++)
        kvr_outlen_add(&o, 500, 3);
    cr_assert(eq(u32, kvr_outlen_predict(&o, 500), 500), "off: as sent");
    kvr_outlen_init(&o, true);
    for (int i = 0; i < 1000; i++) {
        kvr_outlen_add(&o, 500, 0);
        kvr_outlen_add(&o, 0, 7);                 /* not known: not counted */
        kvr_outlen_add(&o, 64, 1000);             /* more than allowed counts as all of it */
        kvr_outlen_add(&o, UINT32_MAX, 1u << 20); /* the last group */
    }
    cr_assert(eq(u32, kvr_outlen_predict(&o, 500), 1), "at least 1");
    cr_assert(eq(u32, kvr_outlen_predict(&o, 0), 0));
    cr_assert(eq(u32, kvr_outlen_predict(&o, 64), 64));
    uint32_t big = kvr_outlen_predict(&o, UINT32_MAX);
    cr_assert(big >= 1u << 20 && big <= (1u << 20) + 1, "%u: its share of its own max_tokens", big);
}

Test(outlen, one_forged_answer_moves_its_group_by_one_request_at_most)
{
    struct kvr_outlen o;
    kvr_outlen_init(&o, true);
    for (int i = 0; i < 99; i++)
        kvr_outlen_add(&o, 1000, 100);
    cr_assert(eq(u32, kvr_outlen_predict(&o, 1000), 100));
    kvr_outlen_add(&o, 1000, UINT32_MAX); /* counted as all of its max_tokens, no more */
    uint32_t b = kvr_outlen_bucket(1000), p = kvr_outlen_predict(&o, 1000);
    cr_assert(eq(u32, p, 109), "(99 x 0.1 + 1) / 100 of 1,000");
    cr_assert(o.ratio[b] <= o.n[b]);
}
