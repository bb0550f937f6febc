/*
 * What a router does to a GenerateRequest before it routes it, per request (docs/benchmarks.md,
 * "The router's CPU per routed request"): decoding it (kvr_wire_decode_generate: the packed
 * varint token ids are most of it) and hashing its prompt into block hashes (kvr_hash_prompt), at
 * the prompt kvbench --mode hop sends (1,024 tokens) and other id ranges, since a varint's length
 * follows its id (below 128: one byte; below 16,384: two; below 2,097,152: three).
 * Each figure is the best of ROUNDS rounds of REPS requests (the least disturbed by other jobs on
 * a shared machine), printed in ns per request and per token. Prints figures, asserts nothing.
 * Usage: bench_codec [--tokens N] [--rounds R].
 */
#define _DEFAULT_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "buf.h"
#include "codec.h"
#include "kvr/hash.h"

#define REPS 100

static volatile uint64_t hash_sink; /* the hashes are used: the loop is not optimised away */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* kvbench hop's prompt: ids spread over [0, range) by a multiplicative step. */
static void prompt(uint32_t *tok, uint32_t n, uint32_t range)
{
    for (uint32_t t = 0; t < n; t++)
        tok[t] = (uint32_t)((t * 2654435761u) % range);
}

/* The best time of rounds rounds of REPS decodes of b, ns per decode; 0 on a decode error. */
static double decode_ns(const struct kvr_buf *b, uint32_t ntokens, int rounds)
{
    struct kvr_wire_limits lim = {ntokens, 1u << 20};
    double best = 1e18;
    for (int r = 0; r < rounds; r++) {
        uint64_t t0 = now_ns();
        for (int i = 0; i < REPS; i++) {
            struct kvr_wire_request q;
            kvr_status st = kvr_wire_decode_generate(b->data, b->len, &lim, &q);
            bool ok = st == KVR_OK && q.ntokens == ntokens;
            kvr_wire_request_free(&q);
            if (!ok)
                return 0;
        }
        double d = (double)(now_ns() - t0) / REPS;
        best = d < best ? d : best;
    }
    return best;
}

/* The same for hashing tok[0..n) into blocks of bs tokens. */
static double hash_ns(const uint32_t *tok, uint32_t n, uint32_t bs, int rounds)
{
    uint64_t *seq = malloc((n / bs + 1) * sizeof *seq);
    if (!seq)
        return 0;
    double best = 1e18;
    for (int r = 0; r < rounds; r++) {
        uint64_t t0 = now_ns();
        for (int i = 0; i < REPS; i++) {
            kvr_hash_prompt(tok, n, bs, NULL, seq);
            hash_sink += seq[0];
        }
        double d = (double)(now_ns() - t0) / REPS;
        best = d < best ? d : best;
    }
    free(seq);
    return best;
}

int main(int argc, char **argv)
{
    uint32_t ntokens = 1024;
    int rounds = 200;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            ntokens = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_codec [--tokens N] [--rounds R]\n");
            return 2;
        }
    }
    if (ntokens == 0 || ntokens > (1u << 20) || rounds < 1) {
        fprintf(stderr, "bench_codec: --tokens 1 to 1048576, --rounds at least 1\n");
        return 2;
    }
    uint32_t *tok = malloc((size_t)ntokens * sizeof *tok);
    if (!tok)
        return 1;
    static const uint32_t ranges[] = {128, 32000, 152064};
    for (size_t k = 0; k < sizeof ranges / sizeof ranges[0]; k++) {
        prompt(tok, ntokens, ranges[k]);
        struct kvr_buf b = {0};
        if (kvr_wire_encode_generate(&b, "bench-0000000001", tok, ntokens, 16, NULL) != KVR_OK) {
            fprintf(stderr, "bench_codec: encoding failed\n");
            return 1;
        }
        double d = decode_ns(&b, ntokens, rounds);
        if (d == 0) {
            fprintf(stderr, "bench_codec: decoding failed\n");
            return 1;
        }
        printf("decode tokens=%u id_range=%u bytes=%zu ns_per_request=%.0f ns_per_token=%.2f\n",
               ntokens, ranges[k], b.len, d, d / ntokens);
        kvr_buf_free(&b);
    }
    prompt(tok, ntokens, 32000);
    static const uint32_t sizes[] = {16, 64};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        double d = hash_ns(tok, ntokens, sizes[k], rounds);
        printf("hash tokens=%u block=%u ns_per_request=%.0f ns_per_token=%.2f\n", ntokens, sizes[k],
               d, d / ntokens);
    }
    free(tok);
    return 0;
}
