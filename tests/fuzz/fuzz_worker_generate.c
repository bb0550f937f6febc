/* kvr_wire_decode_worker_generate: a router's WorkerGenerate (the client's bytes wrapped). */
#include "fuzz.h"

static kvr_status decode_and_free(const uint8_t *data, size_t size)
{
    struct kvr_wire_request r;
    uint64_t key;
    uint32_t overlap;
    kvr_status st = kvr_wire_decode_worker_generate(data, size, &fuzz_wide, &r, &key, &overlap);
    kvr_wire_request_free(&r);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_wire_request w, t, again;
    uint64_t key = 1, tkey = 1, key2 = 1;
    uint32_t overlap = 1, toverlap = 1, overlap2 = 1;
    kvr_status sw = kvr_wire_decode_worker_generate(data, size, &fuzz_wide, &w, &key, &overlap);
    kvr_status st = kvr_wire_decode_worker_generate(data, size, &fuzz_tight, &t, &tkey, &toverlap);
    fuzz_check_limits(size, sw, &w, st, &t);
    if (st == KVR_OK)
        FUZZ_CHECK(key == tkey && overlap == toverlap);
    if (sw == KVR_OK) {
        FUZZ_CHECK(key != 0);
        struct kvr_buf req = {0}, b = {0};
        fuzz_encode_request(&req, &w);
        FUZZ_CHECK(kvr_wire_encode_worker_generate(&b, req.data, req.len, key, overlap, "fuzz",
                                                   0) == KVR_OK);
        FUZZ_CHECK(kvr_wire_decode_worker_generate(b.data, b.len, &fuzz_wide, &again, &key2,
                                                   &overlap2) == KVR_OK);
        fuzz_same_request(&w, &again);
        FUZZ_CHECK(key2 == key && overlap2 == overlap);
        kvr_wire_request_free(&again);
        kvr_buf_free(&req);
        kvr_buf_free(&b);
    }
    kvr_wire_request_free(&w);
    kvr_wire_request_free(&t);
    fuzz_fail_alloc(data, size, sw, decode_and_free);
    return 0;
}
