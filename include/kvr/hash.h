/*
 * Block hashing, bit-compatible with the reference router (ROUTING.md section 1).
 *
 * A prompt is cut into full blocks of B tokens; a trailing partial block is never hashed.
 *   local[i] = XXH3_64bits_withSeed(tokens of block i as little-endian u32, 1337)
 *   seq[0]   = local[0]
 *   seq[i]   = XXH3_64bits_withSeed(le64(seq[i-1]) || le64(local[i]), 1337)
 * local hashes name a block's content, seq hashes name a block in its context (its whole prefix).
 * Pure functions, thread-safe. This is the only module that includes xxhash.h.
 */
#ifndef KVR_HASH_H
#define KVR_HASH_H

#include <stddef.h>
#include <stdint.h>

#define KVR_HASH_SEED 1337u

/* XXH3-64 with seed 1337 of any bytes. data is borrowed; len may be 0. */
uint64_t kvr_hash_bytes(const void *data, size_t len);

/* local hash of one block: tokens[0..block_size) as little-endian u32. tokens is borrowed. */
uint64_t kvr_hash_block(const uint32_t *tokens, size_t block_size);

/* seq hash of a block whose predecessor has seq hash parent_seq and whose own local hash is local.
 */
uint64_t kvr_hash_seq(uint64_t parent_seq, uint64_t local);

/*
 * Hash every full block of a prompt. Writes ntokens / block_size hashes to local_out and seq_out
 * (either may be NULL when not wanted; both are caller-owned with room for that many) and returns
 * that count. block_size 0 returns 0.
 */
size_t kvr_hash_prompt(const uint32_t *tokens, size_t ntokens, size_t block_size,
                       uint64_t *local_out, uint64_t *seq_out);

#endif
