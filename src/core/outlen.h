/*
 * kvr_outlen: how much of their max_tokens the requests that ended here generated, learned as
 * they end, so the price of a request's own decode (decode_weight) rests on what it will likely
 * generate rather than on what its client allowed. A client that sends its exact output budget
 * is priced at it; one that sends one generous max_tokens for everything (or an adapter that fills
 * in the model's limit) is priced at what requests with that max_tokens generated on average.
 *
 * Requests are grouped by their max_tokens, eight groups per power of two (at most 12.5 % wide);
 * each group keeps the mean of output / max_tokens of its requests, and a request's prediction is
 * its max_tokens times its group's mean, once KVR_OUTLEN_MIN_SAMPLES of the group have ended
 * (its max_tokens until then). A group's sums are halved when its count reaches
 * KVR_OUTLEN_WINDOW, so the mean follows a changing load. Fixed size (3 KB), no allocation; pure,
 * with no I/O; single-threaded: the router's state thread.
 */
#ifndef KVR_OUTLEN_H
#define KVR_OUTLEN_H

#include <stdbool.h>
#include <stdint.h>

#define KVR_OUTLEN_MAX_TOKENS  (1u << 24) /* larger max_tokens share the last group */
#define KVR_OUTLEN_BUCKETS     176        /* 0-7 exact, then 8 per power of two below 2^24 */
#define KVR_OUTLEN_WINDOW      512u       /* a group's sums halve when its count reaches this */
#define KVR_OUTLEN_MIN_SAMPLES 16u        /* a group predicts once this many have ended */

struct kvr_outlen {
    double ratio[KVR_OUTLEN_BUCKETS];  /* per group: sum of output / max_tokens (each at most 1) */
    uint32_t n[KVR_OUTLEN_BUCKETS];    /* per group: requests in that sum */
    uint32_t seen[KVR_OUTLEN_BUCKETS]; /* per group: requests ever added (saturating) */
    bool on;                           /* false: predictions are max_tokens, nothing is learned */
};

/* Start empty; on false: nothing is learned. */
void kvr_outlen_init(struct kvr_outlen *o, bool on);

/* A request with this max_tokens (0: unknown, not counted) ended having generated output. */
void kvr_outlen_add(struct kvr_outlen *o, uint32_t max_tokens, uint32_t output);

/* The output to expect of a request with this max_tokens: at most max_tokens, at least 1 (0
 * stays 0). */
uint32_t kvr_outlen_predict(const struct kvr_outlen *o, uint32_t max_tokens);

/* The group of a max_tokens, and the largest max_tokens in a group (exposed for the tests). */
uint32_t kvr_outlen_bucket(uint32_t tokens);
uint32_t kvr_outlen_upper(uint32_t bucket);

#endif
