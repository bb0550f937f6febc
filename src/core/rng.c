/*
 * xoshiro256** seeded by splitmix64 (public-domain algorithms by Blackman and Vigna), and
 * Lemire's nearly-divisionless bounded draw. Pure; each generator belongs to one thread.
 */
#include "kvr/rng.h"

__extension__ typedef unsigned __int128 u128;

uint64_t kvr_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void kvr_rng_seed(struct kvr_rng *rng, uint64_t seed)
{
    for (int i = 0; i < 4; i++) {
        seed += 0x9e3779b97f4a7c15ull;
        rng->s[i] = kvr_mix64(seed);
    }
    if (!(rng->s[0] | rng->s[1] | rng->s[2] | rng->s[3]))
        rng->s[0] = 1;
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t kvr_rng_next(struct kvr_rng *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t kvr_rng_below(struct kvr_rng *rng, uint64_t n)
{
    if (n == 0)
        return 0;
    u128 m = (u128)kvr_rng_next(rng) * n;
    uint64_t low = (uint64_t)m;
    if (low < n) {
        uint64_t threshold = -n % n;
        while (low < threshold) {
            m = (u128)kvr_rng_next(rng) * n;
            low = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

double kvr_rng_double(struct kvr_rng *rng)
{
    return (double)(kvr_rng_next(rng) >> 11) * 0x1.0p-53;
}
