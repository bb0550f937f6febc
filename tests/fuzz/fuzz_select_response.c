/*
 * kvr_wire_decode_select_response: a router's SelectResponse. Its out-params are set only on
 * success. The encoder writes the decision's fields only without an error, so with one the round
 * trip expects them zero.
 */
#include "fuzz.h"

#include "kvr/policy.h"

struct sel {
    uint64_t worker_id, key;
    uint32_t overlap, ncandidates, error_code;
};

static kvr_status decode(const void *buf, size_t len, struct sel *s)
{
    return kvr_wire_decode_select_response(buf, len, &s->worker_id, &s->overlap, &s->ncandidates,
                                           &s->error_code, &s->key);
}

static kvr_status decode_and_free(const uint8_t *data, size_t size)
{
    struct sel s;
    return decode(data, size, &s);
}

static void round_trip(const struct sel *s)
{
    FUZZ_CHECK(s->ncandidates <= KVR_WIRE_CANDIDATES_MAX);
    uint64_t *ids = calloc((size_t)s->ncandidates + 1, sizeof *ids);
    double *costs = calloc((size_t)s->ncandidates + 1, sizeof *costs);
    FUZZ_CHECK(ids && costs);
    struct kvr_decision d = {0};
    d.worker_id = s->worker_id;
    d.policy = KVR_POLICY_KV;
    d.overlap_blocks = s->overlap;
    d.ncandidates = s->ncandidates;
    d.worker_ids = ids;
    d.costs = costs;
    struct kvr_buf b = {0};
    FUZZ_CHECK(kvr_wire_encode_select_response(&b, &d, s->key, (kvr_status)s->error_code, "r1",
                                               NULL) == KVR_OK);
    struct sel again;
    FUZZ_CHECK(decode(b.data, b.len, &again) == KVR_OK);
    FUZZ_CHECK(again.error_code == s->error_code);
    if (s->error_code == 0)
        FUZZ_CHECK(again.worker_id == s->worker_id && again.overlap == s->overlap &&
                   again.ncandidates == s->ncandidates && again.key == s->key);
    else
        FUZZ_CHECK(again.worker_id == 0 && again.overlap == 0 && again.ncandidates == 0 &&
                   again.key == 0);
    kvr_buf_free(&b);
    free(ids);
    free(costs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sel s;
    memset(&s, 0xa5, sizeof s);
    kvr_status st = decode(data, size, &s);
    if (st == KVR_OK) {
        round_trip(&s);
    } else {
        struct sel untouched;
        memset(&untouched, 0xa5, sizeof untouched);
        FUZZ_CHECK(memcmp(&s, &untouched, sizeof s) == 0);
    }
    fuzz_fail_alloc(data, size, st, decode_and_free);
    return 0;
}
