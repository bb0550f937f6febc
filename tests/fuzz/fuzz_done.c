/* kvr_wire_decode_done: a worker's DoneEvent. */
#include "fuzz.h"

static kvr_status decode_and_free(const uint8_t *data, size_t size)
{
    struct kvr_wire_done d;
    return kvr_wire_decode_done(data, size, &d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_wire_done d, again;
    kvr_status st = kvr_wire_decode_done(data, size, &d);
    if (st == KVR_OK) {
        struct kvr_buf b = {0};
        FUZZ_CHECK(kvr_wire_encode_done(&b, d.worker_id, d.key, d.status, d.output_tokens) ==
                   KVR_OK);
        FUZZ_CHECK(kvr_wire_decode_done(b.data, b.len, &again) == KVR_OK);
        FUZZ_CHECK(d.worker_id == again.worker_id && d.key == again.key &&
                   d.status == again.status && d.output_tokens == again.output_tokens);
        kvr_buf_free(&b);
    } else {
        FUZZ_CHECK(d.worker_id == 0 && d.key == 0 && d.status == 0);
    }
    fuzz_fail_alloc(data, size, st, decode_and_free);
    return 0;
}
