/*
 * kvr_outlen implementation. Group b < 8 holds the max_tokens b; from 8 on, the group of a
 * max_tokens t with its highest bit e (e >= 3) is 8 + 8 (e - 3) + the three bits below that one,
 * so each power of two is cut into eight equal groups. Invariant: per group, n < WINDOW and
 * ratio <= n.
 */
#include "outlen.h"

#include <math.h>
#include <string.h>

void kvr_outlen_init(struct kvr_outlen *o, bool on)
{
    memset(o, 0, sizeof *o);
    o->on = on;
}

uint32_t kvr_outlen_bucket(uint32_t tokens)
{
    if (tokens > KVR_OUTLEN_MAX_TOKENS - 1)
        tokens = KVR_OUTLEN_MAX_TOKENS - 1;
    if (tokens < 8)
        return tokens;
    uint32_t e = 31u - (uint32_t)__builtin_clz(tokens);
    return 8 + 8 * (e - 3) + ((tokens >> (e - 3)) & 7u);
}

uint32_t kvr_outlen_upper(uint32_t bucket)
{
    if (bucket < 8)
        return bucket;
    uint32_t e = (bucket - 8) / 8 + 3, sub = (bucket - 8) % 8;
    return ((9u + sub) << (e - 3)) - 1;
}

void kvr_outlen_add(struct kvr_outlen *o, uint32_t max_tokens, uint32_t output)
{
    if (!o->on || max_tokens == 0)
        return;
    uint32_t b = kvr_outlen_bucket(max_tokens);
    o->ratio[b] += output >= max_tokens ? 1.0 : (double)output / max_tokens;
    o->seen[b] += o->seen[b] < UINT32_MAX;
    if (++o->n[b] >= KVR_OUTLEN_WINDOW) {
        o->n[b] /= 2;
        o->ratio[b] /= 2;
    }
}

uint32_t kvr_outlen_predict(const struct kvr_outlen *o, uint32_t max_tokens)
{
    uint32_t b = kvr_outlen_bucket(max_tokens);
    if (!o->on || max_tokens == 0 || o->seen[b] < KVR_OUTLEN_MIN_SAMPLES)
        return max_tokens;
    double t = floor((double)max_tokens * o->ratio[b] / o->n[b] + 0.5);
    return t < 1 ? 1 : t > max_tokens ? max_tokens : (uint32_t)t;
}
