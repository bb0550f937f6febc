/* kvr_wire_decode_tokens: a worker's TokensEvent (prefill done, or one more output block). */
#include "fuzz.h"

static kvr_status decode_and_free(const uint8_t *data, size_t size)
{
    struct kvr_wire_tokens t;
    return kvr_wire_decode_tokens(data, size, &t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_wire_tokens t, again;
    kvr_status st = kvr_wire_decode_tokens(data, size, &t);
    if (st == KVR_OK) {
        FUZZ_CHECK(t.kind == KVR_WIRE_PREFILL_DONE || t.kind == KVR_WIRE_OUTPUT_BLOCK);
        struct kvr_buf b = {0};
        FUZZ_CHECK(kvr_wire_encode_tokens(&b, t.worker_id, t.key, t.kind) == KVR_OK);
        FUZZ_CHECK(kvr_wire_decode_tokens(b.data, b.len, &again) == KVR_OK);
        FUZZ_CHECK(t.worker_id == again.worker_id && t.key == again.key && t.kind == again.kind);
        kvr_buf_free(&b);
    } else {
        FUZZ_CHECK(t.worker_id == 0 && t.key == 0 && t.kind == 0);
    }
    fuzz_fail_alloc(data, size, st, decode_and_free);
    return 0;
}
