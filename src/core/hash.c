/*
 * Block hashing over xxHash (XXH3-64, seed 1337). Token ids are hashed as little-endian u32; on a
 * little-endian host that is their memory image, elsewhere a block is converted into a small
 * stack buffer first. Pure and thread-safe.
 */
#include "kvr/hash.h"

#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define KVR_LITTLE_ENDIAN 1
#else
#define KVR_LITTLE_ENDIAN 0
#endif

uint64_t kvr_hash_bytes(const void *data, size_t len)
{
    return XXH3_64bits_withSeed(data, len, KVR_HASH_SEED);
}

#if !KVR_LITTLE_ENDIAN
static void put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
#endif

uint64_t kvr_hash_block(const uint32_t *tokens, size_t block_size)
{
#if KVR_LITTLE_ENDIAN
    return XXH3_64bits_withSeed(tokens, block_size * sizeof(uint32_t), KVR_HASH_SEED);
#else
    XXH3_state_t st;
    unsigned char buf[256];
    XXH3_64bits_reset_withSeed(&st, KVR_HASH_SEED);
    size_t i = 0;
    while (i < block_size) {
        size_t n = 0;
        for (; n + 4 <= sizeof buf && i < block_size; n += 4, i++) {
            uint32_t t = tokens[i];
            buf[n] = (unsigned char)t;
            buf[n + 1] = (unsigned char)(t >> 8);
            buf[n + 2] = (unsigned char)(t >> 16);
            buf[n + 3] = (unsigned char)(t >> 24);
        }
        XXH3_64bits_update(&st, buf, n);
    }
    return XXH3_64bits_digest(&st);
#endif
}

uint64_t kvr_hash_seq(uint64_t parent_seq, uint64_t local)
{
#if KVR_LITTLE_ENDIAN
    uint64_t buf[2] = {parent_seq, local};
#else
    unsigned char buf[16];
    put_le64(buf, parent_seq);
    put_le64(buf + 8, local);
#endif
    return XXH3_64bits_withSeed(buf, sizeof buf, KVR_HASH_SEED);
}

/*
 * A block of more than XXH3_MIDSIZE_MAX bytes (61 tokens and up: the routers' default of 64 among
 * them) takes XXH3's long path, where XXH3_64bits_withSeed derives a secret from the seed on every
 * call. kvr_hash_prompt derives it once per prompt instead: XXH3_64bits_withSecretandSeed with
 * that secret gives exactly what XXH3_64bits_withSeed does (xxhash.h, "_withSecretandSeed").
 * hash_chain is inlined twice, with and without a secret, so neither path tests for the other.
 */
static inline __attribute__((always_inline)) void hash_chain(const uint32_t *tokens, size_t nblocks,
                                                             size_t block_size,
                                                             const unsigned char *secret,
                                                             uint64_t *local_out, uint64_t *seq_out)
{
    uint64_t prev = 0;
    for (size_t i = 0; i < nblocks; i++) {
        const uint32_t *t = tokens + i * block_size;
        uint64_t local =
            secret ? XXH3_64bits_withSecretandSeed(t, block_size * sizeof(uint32_t), secret,
                                                   XXH3_SECRET_DEFAULT_SIZE, KVR_HASH_SEED)
                   : kvr_hash_block(t, block_size);
        uint64_t seq = i == 0 ? local : kvr_hash_seq(prev, local);
        if (local_out)
            local_out[i] = local;
        if (seq_out)
            seq_out[i] = seq;
        prev = seq;
    }
}

size_t kvr_hash_prompt(const uint32_t *tokens, size_t ntokens, size_t block_size,
                       uint64_t *local_out, uint64_t *seq_out)
{
    if (block_size == 0)
        return 0;
    size_t nblocks = ntokens / block_size;
    if (KVR_LITTLE_ENDIAN && block_size * sizeof(uint32_t) > XXH3_MIDSIZE_MAX) {
        unsigned char secret[XXH3_SECRET_DEFAULT_SIZE];
        XXH3_generateSecret_fromSeed(secret, KVR_HASH_SEED);
        hash_chain(tokens, nblocks, block_size, secret, local_out, seq_out);
    } else {
        hash_chain(tokens, nblocks, block_size, NULL, local_out, seq_out);
    }
    return nblocks;
}
