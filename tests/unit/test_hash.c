/* Block hashing: the reference's known value, chaining, partial blocks, every block size. */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <stdlib.h>
#include <string.h>

#include "kvr/hash.h"

Test(hash, known_value_of_reference)
{
    cr_assert(eq(u64, kvr_hash_bytes("test data", 9), 13226331709069118873ull));
}

Test(hash, block_hash_is_xxh3_of_little_endian_tokens)
{
    uint32_t tokens[4] = {1, 2, 0x01020304u, 0xffffffffu};
    unsigned char bytes[16];
    for (int i = 0; i < 4; i++)
        for (int b = 0; b < 4; b++)
            bytes[4 * i + b] = (unsigned char)(tokens[i] >> (8 * b));
    cr_assert(eq(u64, kvr_hash_block(tokens, 4), kvr_hash_bytes(bytes, 16)));
}

Test(hash, seq_hash_chains_parent_and_local_as_le64)
{
    uint64_t parent = 0x0102030405060708ull, local = 0xa0b0c0d0e0f00011ull;
    unsigned char bytes[16];
    for (int b = 0; b < 8; b++) {
        bytes[b] = (unsigned char)(parent >> (8 * b));
        bytes[8 + b] = (unsigned char)(local >> (8 * b));
    }
    cr_assert(eq(u64, kvr_hash_seq(parent, local), kvr_hash_bytes(bytes, 16)));
}

Test(hash, prompt_hashes_full_blocks_only)
{
    uint32_t t[10];
    for (int i = 0; i < 10; i++)
        t[i] = (uint32_t)i + 100;
    uint64_t local[3] = {0}, seq[3] = {0};
    cr_assert(eq(sz, kvr_hash_prompt(t, 10, 4, local, seq), 2));
    cr_assert(eq(u64, local[0], kvr_hash_block(t, 4)));
    cr_assert(eq(u64, local[1], kvr_hash_block(t + 4, 4)));
    cr_assert(eq(u64, seq[0], local[0]));
    cr_assert(eq(u64, seq[1], kvr_hash_seq(seq[0], local[1])));
    cr_assert(eq(u64, local[2], 0), "the partial block must not be written");
    cr_assert(eq(sz, kvr_hash_prompt(t, 3, 4, local, seq), 0));
    cr_assert(eq(sz, kvr_hash_prompt(t, 10, 0, local, seq), 0));
    cr_assert(eq(sz, kvr_hash_prompt(t, 10, 4, NULL, NULL), 2));
}

Test(hash, equal_content_in_other_context_gets_another_seq)
{
    uint32_t a[8] = {1, 2, 3, 4, 9, 9, 9, 9};
    uint32_t b[8] = {5, 6, 7, 8, 9, 9, 9, 9};
    uint64_t la[2], sa[2], lb[2], sb[2];
    kvr_hash_prompt(a, 8, 4, la, sa);
    kvr_hash_prompt(b, 8, 4, lb, sb);
    cr_assert(eq(u64, la[1], lb[1]), "same tokens, same local hash");
    cr_assert(ne(u64, sa[1], sb[1]), "different prefix, different sequence hash");
}

Test(hash, shared_prefix_shares_sequence_hashes)
{
    uint32_t a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 1, 1, 1, 1};
    uint32_t b[12] = {1, 2, 3, 4, 5, 6, 7, 8, 2, 2, 2, 2};
    uint64_t sa[3], sb[3];
    kvr_hash_prompt(a, 12, 4, NULL, sa);
    kvr_hash_prompt(b, 12, 4, NULL, sb);
    cr_assert(eq(u64, sa[0], sb[0]));
    cr_assert(eq(u64, sa[1], sb[1]));
    cr_assert(ne(u64, sa[2], sb[2]));
}

/* kvr_hash_prompt takes XXH3's long path with a secret made once per prompt (61 tokens a block
 * and up): every block size, on either side of that bound, hashes as kvr_hash_block and as the
 * bytes' XXH3 with the seed. */
Test(hash, prompt_hashes_every_block_size_as_its_blocks)
{
    static const size_t sizes[] = {1, 16, 59, 60, 61, 62, 64, 128, 1000};
    enum { BLOCKS = 3 };
    uint32_t *t = malloc(1000 * BLOCKS * sizeof *t);
    cr_assert(t != NULL);
    for (size_t i = 0; i < 1000 * BLOCKS; i++)
        t[i] = (uint32_t)(i * 2654435761u);
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t B = sizes[s];
        uint64_t local[BLOCKS], seq[BLOCKS];
        cr_assert(eq(sz, kvr_hash_prompt(t, B * BLOCKS, B, local, seq), BLOCKS));
        for (size_t i = 0; i < BLOCKS; i++) {
            cr_assert(eq(u64, local[i], kvr_hash_block(t + i * B, B)), "block size %zu", B);
            cr_assert(eq(u64, local[i], kvr_hash_bytes(t + i * B, B * sizeof *t)), "block %zu", B);
            cr_assert(eq(u64, seq[i], i ? kvr_hash_seq(seq[i - 1], local[i]) : local[i]));
        }
    }
    free(t);
}
