/* kvr_wire_decode_generate: a client's GenerateRequest. */
#include "fuzz.h"

static kvr_status decode_and_free(const uint8_t *data, size_t size)
{
    struct kvr_wire_request r;
    kvr_status st = kvr_wire_decode_generate(data, size, &fuzz_wide, &r);
    kvr_wire_request_free(&r);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_wire_request w, t, again;
    kvr_status sw = kvr_wire_decode_generate(data, size, &fuzz_wide, &w);
    kvr_status st = kvr_wire_decode_generate(data, size, &fuzz_tight, &t);
    fuzz_check_limits(size, sw, &w, st, &t);
    if (sw == KVR_OK) {
        struct kvr_buf b = {0};
        fuzz_encode_request(&b, &w);
        FUZZ_CHECK(kvr_wire_decode_generate(b.data, b.len, &fuzz_wide, &again) == KVR_OK);
        fuzz_same_request(&w, &again);
        kvr_wire_request_free(&again);
        kvr_buf_free(&b);
    }
    kvr_wire_request_free(&w);
    kvr_wire_request_free(&t);
    fuzz_fail_alloc(data, size, sw, decode_and_free);
    return 0;
}
