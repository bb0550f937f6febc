/* kvr_wire_decode_select: a client's SelectRequest (a GenerateRequest and a booking flag). */
#include "fuzz.h"

static kvr_status decode_and_free(const uint8_t *data, size_t size)
{
    struct kvr_wire_request r;
    bool book;
    kvr_status st = kvr_wire_decode_select(data, size, &fuzz_wide, &r, &book);
    kvr_wire_request_free(&r);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_wire_request w, t, again;
    bool book = false, tbook = false, book2 = false;
    kvr_status sw = kvr_wire_decode_select(data, size, &fuzz_wide, &w, &book);
    kvr_status st = kvr_wire_decode_select(data, size, &fuzz_tight, &t, &tbook);
    fuzz_check_limits(size, sw, &w, st, &t);
    if (st == KVR_OK)
        FUZZ_CHECK(book == tbook);
    if (sw == KVR_OK) {
        struct kvr_buf req = {0}, b = {0};
        fuzz_encode_request(&req, &w);
        FUZZ_CHECK(kvr_wire_encode_select_request(&b, req.data, req.len, book) == KVR_OK);
        FUZZ_CHECK(kvr_wire_decode_select(b.data, b.len, &fuzz_wide, &again, &book2) == KVR_OK);
        fuzz_same_request(&w, &again);
        FUZZ_CHECK(book2 == book);
        kvr_wire_request_free(&again);
        kvr_buf_free(&req);
        kvr_buf_free(&b);
    }
    kvr_wire_request_free(&w);
    kvr_wire_request_free(&t);
    fuzz_fail_alloc(data, size, sw, decode_and_free);
    return 0;
}
