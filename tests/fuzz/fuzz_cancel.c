/* kvr_wire_decode_cancel: a client's CancelRequest. */
#include <string.h>

#include "fuzz.h"

static kvr_status decode_and_free(const uint8_t *data, size_t size)
{
    struct kvr_wire_cancel c;
    kvr_status st = kvr_wire_decode_cancel(data, size, &c);
    kvr_wire_cancel_free(&c);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_wire_cancel c, again;
    kvr_status st = kvr_wire_decode_cancel(data, size, &c);
    if (st == KVR_OK) {
        FUZZ_CHECK(strlen(c.request_id) <= KVR_REQUEST_ID_MAX && c.reply[0] &&
                   strlen(c.reply) <= KVR_REPLY_MAX);
        struct kvr_buf b = {0};
        FUZZ_CHECK(kvr_wire_encode_cancel(&b, c.request_id, c.reply) == KVR_OK);
        FUZZ_CHECK(kvr_wire_decode_cancel(b.data, b.len, &again) == KVR_OK);
        FUZZ_CHECK(!strcmp(c.request_id, again.request_id) && !strcmp(c.reply, again.reply));
        kvr_wire_cancel_free(&again);
        kvr_buf_free(&b);
    } else {
        FUZZ_CHECK(c.request_id == NULL && c.reply == NULL);
    }
    kvr_wire_cancel_free(&c);
    fuzz_fail_alloc(data, size, st, decode_and_free);
    return 0;
}
