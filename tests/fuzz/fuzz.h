/*
 * Shared helpers of the fuzz targets (README.md here). A target decodes its input and checks what
 * codec.h promises: a successful decode is re-encoded and decoded again to the same values; an
 * error leaves the out-struct zeroed (apart from a request's id); the same decode with one of its
 * allocations failing (kvr_wire_fail_alloc) returns KVR_ERR_NOMEM and leaks nothing. Anything
 * else aborts, so libFuzzer reports it as a crash and saves the input.
 */
#ifndef KVR_FUZZ_H
#define KVR_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Abort with the failed condition's text: libFuzzer turns it into a crash report. */
#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Limits for the request decoders: wide enough for every seed, and a tight set to compare. */
static const struct kvr_wire_limits fuzz_wide = {1u << 20, 1u << 20};
static const struct kvr_wire_limits fuzz_tight = {16, 16};

static inline int fuzz_streq(const char *a, const char *b)
{
    return a && b && strcmp(a, b) == 0;
}

/* Equal arrays of n elements of size sz (either pointer may be NULL when n is 0). */
static inline int fuzz_memeq(const void *a, const void *b, size_t n, size_t sz)
{
    return n == 0 || (a && b && memcmp(a, b, n * sz) == 0);
}

/*
 * Decode the input once more with one of the decoder's allocations failing (which one comes from
 * the input's bytes, so the fuzzer varies it): if the failure happened the decoder must say
 * KVR_ERR_NOMEM, else what it said without it (want). decode_and_free decodes, frees what it got
 * and returns the status; a leak on the failure path is ASan's to report.
 */
static inline void fuzz_fail_alloc(const uint8_t *data, size_t size, kvr_status want,
                                   kvr_status (*decode_and_free)(const uint8_t *, size_t))
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < size; i++)
        h = (h ^ data[i]) * 16777619u;
    kvr_wire_fail_alloc((long)(h % 24));
    kvr_status st = decode_and_free(data, size);
    long left = kvr_wire_fail_alloc(-1);
    if (left == -1)
        FUZZ_CHECK(st == KVR_ERR_NOMEM);
    else
        FUZZ_CHECK(st == want);
}

static inline void fuzz_same_request(const struct kvr_wire_request *a,
                                     const struct kvr_wire_request *b)
{
    FUZZ_CHECK(fuzz_streq(a->request_id, b->request_id));
    FUZZ_CHECK(a->ntokens == b->ntokens);
    FUZZ_CHECK(fuzz_memeq(a->tokens, b->tokens, a->ntokens, sizeof *a->tokens));
    FUZZ_CHECK(a->max_tokens == b->max_tokens);
    FUZZ_CHECK(a->ov.flags == b->ov.flags);
    FUZZ_CHECK(a->ov.policy == b->ov.policy);
    FUZZ_CHECK(a->ov.overlap_weight == b->ov.overlap_weight);
    FUZZ_CHECK(a->ov.temperature == b->ov.temperature);
}

/* Encode a decoded request as a GenerateRequest into b. */
static inline void fuzz_encode_request(struct kvr_buf *b, const struct kvr_wire_request *r)
{
    FUZZ_CHECK(kvr_wire_encode_generate(b, r->request_id, r->tokens, r->ntokens, r->max_tokens,
                                        &r->ov) == KVR_OK);
}

/* A request decode's status says the request was readable: its id is kept (codec.h). */
static inline int fuzz_keeps_id(kvr_status st)
{
    return st == KVR_ERR_EMPTY_PROMPT || st == KVR_ERR_PROMPT_TOO_LONG ||
           st == KVR_ERR_UNKNOWN_POLICY;
}

/* After an error a request is zeroed apart from its id, which a readable request keeps. */
static inline void fuzz_check_failed_request(kvr_status st, const struct kvr_wire_request *r)
{
    if (st == KVR_OK)
        return;
    if (fuzz_keeps_id(st))
        FUZZ_CHECK(r->request_id != NULL);
    FUZZ_CHECK(r->tokens == NULL && r->ntokens == 0 && r->max_tokens == 0);
    FUZZ_CHECK(r->ov.flags == 0 && r->ov.policy == 0 && r->ov.overlap_weight == 0 &&
               r->ov.temperature == 0);
}

/*
 * What codec.h promises about one input decoded as a request under the wide (w) and the tight (t)
 * limits: the tight decode succeeds only if the wide one does, to the same request; a wide success
 * that fits the tight limits (prompt, max_tokens and the byte cap) succeeds there too.
 */
static inline void fuzz_check_limits(size_t size, kvr_status sw, const struct kvr_wire_request *w,
                                     kvr_status st, const struct kvr_wire_request *t)
{
    fuzz_check_failed_request(sw, w);
    fuzz_check_failed_request(st, t);
    if (st == KVR_OK) {
        FUZZ_CHECK(sw == KVR_OK);
        fuzz_same_request(w, t);
    }
    if (sw == KVR_OK && w->ntokens <= fuzz_tight.max_prompt_tokens &&
        w->max_tokens <= fuzz_tight.max_output_tokens && size <= kvr_wire_request_cap(&fuzz_tight))
        FUZZ_CHECK(st == KVR_OK);
}

static inline void fuzz_same_record(const struct kvr_request_record *a,
                                    const struct kvr_request_record *b)
{
    FUZZ_CHECK(a->request_id == b->request_id);
    FUZZ_CHECK(a->worker_id == b->worker_id);
    FUZZ_CHECK(a->nblocks == b->nblocks);
    FUZZ_CHECK(fuzz_memeq(a->block_hashes, b->block_hashes, a->nblocks, sizeof(uint64_t)));
    FUZZ_CHECK(a->prompt_tokens == b->prompt_tokens);
    FUZZ_CHECK(a->overlap_blocks == b->overlap_blocks);
    FUZZ_CHECK(a->prefill_done == b->prefill_done);
    FUZZ_CHECK(a->output_blocks == b->output_blocks);
}

/* A decision as codec.h validates it: it names a request and a worker, its prefix fits. */
static inline void fuzz_check_decision(const struct kvr_wire_decision *d)
{
    FUZZ_CHECK(d->rec.request_id != 0 && d->rec.worker_id != 0);
    FUZZ_CHECK(d->rec.overlap_blocks <= d->rec.nblocks);
    FUZZ_CHECK(d->rec.nblocks <= KVR_WIRE_DECISION_BLOCKS_MAX);
    FUZZ_CHECK(d->reply && strlen(d->reply) <= KVR_REPLY_MAX);
    FUZZ_CHECK(d->request_id && strlen(d->request_id) <= KVR_REQUEST_ID_MAX);
    FUZZ_CHECK(d->origin && strlen(d->origin) <= KVR_ROUTER_ID_MAX);
}

static inline void fuzz_same_decision(const struct kvr_wire_decision *a,
                                      const struct kvr_wire_decision *b)
{
    fuzz_same_record(&a->rec, &b->rec);
    FUZZ_CHECK(fuzz_streq(a->reply, b->reply));
    FUZZ_CHECK(fuzz_streq(a->request_id, b->request_id));
    FUZZ_CHECK(fuzz_streq(a->origin, b->origin));
}

#endif
