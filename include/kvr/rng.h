/*
 * A small seeded PRNG (xoshiro256**, seeded through splitmix64), so every random choice of the
 * router and the simulator is reproducible from one seed. Not for cryptography. A kvr_rng is a
 * plain value: no allocation, not shared between threads.
 */
#ifndef KVR_RNG_H
#define KVR_RNG_H

#include <stdint.h>

struct kvr_rng {
    uint64_t s[4]; /* generator state; never all zero */
};

/* Seed the generator; equal seeds give equal sequences. */
void kvr_rng_seed(struct kvr_rng *rng, uint64_t seed);

/* The next 64 uniform random bits. */
uint64_t kvr_rng_next(struct kvr_rng *rng);

/* Uniform integer in [0, n); n = 0 returns 0. Unbiased. */
uint64_t kvr_rng_below(struct kvr_rng *rng, uint64_t n);

/* Uniform double in [0, 1). */
double kvr_rng_double(struct kvr_rng *rng);

/* One splitmix64 step: a good 64-bit mixer for seeds and integer keys. */
uint64_t kvr_mix64(uint64_t x);

#endif
