/* kvr_wire_decode_worker_cancel: a router's WorkerCancel. */
#include "fuzz.h"

static kvr_status decode_and_free(const uint8_t *data, size_t size)
{
    struct kvr_wire_worker_cancel c;
    return kvr_wire_decode_worker_cancel(data, size, &c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_wire_worker_cancel c, again;
    kvr_status st = kvr_wire_decode_worker_cancel(data, size, &c);
    if (st == KVR_OK) {
        FUZZ_CHECK(c.key != 0 && (c.reason == KVR_ERR_CANCELLED || c.reason == KVR_ERR_DEADLINE));
        struct kvr_buf b = {0};
        FUZZ_CHECK(kvr_wire_encode_worker_cancel(&b, &c, "fuzz") == KVR_OK);
        FUZZ_CHECK(kvr_wire_decode_worker_cancel(b.data, b.len, &again) == KVR_OK);
        FUZZ_CHECK(c.key == again.key && c.reason == again.reason && c.silent == again.silent);
        kvr_buf_free(&b);
    } else {
        FUZZ_CHECK(c.key == 0 && c.reason == 0 && !c.silent);
    }
    fuzz_fail_alloc(data, size, st, decode_and_free);
    return 0;
}
