/*
 * UTF-8 made valid (src/base/utf8.c): the sequences accepted and refused, replacement of bad
 * bytes, NULs dropped, and a character cut between two pieces carried, never split or replaced.
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <stdio.h>
#include <string.h>

#include "utf8.h"

static size_t len_of(const char *s, size_t n, bool *partial)
{
    return kvr_utf8_len((const unsigned char *)s, n, partial);
}

Test(utf8, the_lengths_of_valid_sequences)
{
    bool p;
    cr_assert(eq(sz, len_of("a", 1, &p), 1));
    cr_assert(eq(sz, len_of("\xc3\xa9", 2, &p), 2));
    cr_assert(eq(sz, len_of("\xe2\x82\xac", 3, &p), 3));
    cr_assert(eq(sz, len_of("\xf0\x9f\x98\x80", 4, &p), 4));
    cr_assert(not(p));
}

Test(utf8, invalid_sequences_are_refused)
{
    bool p;
    const char *bad[] = {"\x80",         "\xc0\x80",         "\xc1\xbf",         "\xe0\x80\x80",
                         "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\xff",
                         "\xc3\x28"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert(eq(sz, len_of(bad[i], strlen(bad[i]), &p), 0), "sequence %zu", i);
        cr_assert(not(p), "sequence %zu is not the start of a valid one", i);
    }
}

Test(utf8, a_cut_character_is_partial_and_an_impossible_one_is_not)
{
    bool p;
    cr_assert(eq(sz, len_of("\xe2\x82", 2, &p), 0));
    cr_assert(p);
    cr_assert(eq(sz, len_of("\xf0", 1, &p), 0));
    cr_assert(p);
    cr_assert(eq(sz, len_of("\xe0\x80", 2, &p), 0)); /* overlong whatever follows */
    cr_assert(not(p));
    cr_assert(eq(sz, len_of("\xed\xa0", 2, &p), 0)); /* a surrogate whatever follows */
    cr_assert(not(p));
}

Test(utf8, clean_replaces_bad_bytes_drops_nuls_and_keeps_a_cut_character)
{
    struct kvr_buf b = {0};
    size_t kept = 99;
    cr_assert(eq(int,
                 kvr_utf8_clean(&b,
                                "a\xff"
                                "b\0c\xe2\x82",
                                7, &kept),
                 KVR_OK));
    cr_assert(eq(sz, kept, 2));
    cr_assert(eq(str, (char *)b.data,
                 "a\xef\xbf\xbd"
                 "bc"));
    /* the next piece completes it */
    b.len = 0;
    cr_assert(eq(int, kvr_utf8_clean(&b, "\xe2\x82\xac!", 4, &kept), KVR_OK));
    cr_assert(eq(sz, kept, 0));
    cr_assert(eq(str, (char *)b.data, "\xe2\x82\xac!"));
    kvr_buf_free(&b);
}

Test(utf8, every_split_of_a_text_gives_the_same_text)
{
    const char *t = "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80!";
    size_t n = strlen(t);
    for (size_t cut = 0; cut <= n; cut++) {
        struct kvr_buf out = {0}, part = {0};
        char carry[8];
        size_t kept;
        cr_assert(eq(int, kvr_utf8_clean(&out, t, cut, &kept), KVR_OK));
        memcpy(carry, t + cut - kept, kept);
        char joined[64];
        memcpy(joined, carry, kept);
        memcpy(joined + kept, t + cut, n - cut);
        cr_assert(eq(int, kvr_utf8_clean(&part, joined, kept + n - cut, &kept), KVR_OK));
        cr_assert(eq(sz, kept, 0));
        char all[128];
        snprintf(all, sizeof all, "%.*s%s", (int)out.len, (char *)out.data, (char *)part.data);
        cr_assert(eq(str, all, (char *)t), "cut at %zu", cut);
        kvr_buf_free(&out);
        kvr_buf_free(&part);
    }
}
