/*
 * kvr_wire_decode_response: a GenerateResponse chunk. The encoder writes the status's own text as
 * the error, so the round trip checks the code and that text rather than the text received.
 */
#include "fuzz.h"

static kvr_status decode_and_free(const uint8_t *data, size_t size)
{
    struct kvr_wire_response r;
    kvr_status st = kvr_wire_decode_response(data, size, &r);
    kvr_wire_response_free(&r);
    return st;
}

static void round_trip(const struct kvr_wire_response *r)
{
    FUZZ_CHECK(r->request_id && strlen(r->request_id) <= KVR_REQUEST_ID_MAX);
    FUZZ_CHECK(r->error && strlen(r->error) <= KVR_ERROR_TEXT_MAX);
    FUZZ_CHECK(r->ntokens <= KVR_WIRE_RESPONSE_TOKENS_MAX);
    uint32_t *tokens = calloc((size_t)r->ntokens + 1, sizeof *tokens);
    FUZZ_CHECK(tokens);
    struct kvr_buf b = {0};
    FUZZ_CHECK(
        kvr_wire_encode_chunk(&b, &(struct kvr_wire_chunk){.request_id = r->request_id,
                                                           .tokens = tokens,
                                                           .ntokens = r->ntokens,
                                                           .final = r->final,
                                                           .error = (kvr_status)r->error_code,
                                                           .worker_id = r->worker_id,
                                                           .cached_tokens = r->cached_tokens,
                                                           .position = r->position}) == KVR_OK);
    struct kvr_wire_response again;
    FUZZ_CHECK(kvr_wire_decode_response(b.data, b.len, &again) == KVR_OK);
    FUZZ_CHECK(fuzz_streq(r->request_id, again.request_id));
    FUZZ_CHECK(r->ntokens == again.ntokens);
    FUZZ_CHECK(r->final == again.final);
    FUZZ_CHECK(r->position == again.position);
    FUZZ_CHECK(r->error_code == again.error_code);
    FUZZ_CHECK(
        fuzz_streq(again.error, r->error_code ? kvr_status_str((kvr_status)r->error_code) : ""));
    FUZZ_CHECK(r->worker_id == again.worker_id);
    FUZZ_CHECK(r->cached_tokens == again.cached_tokens);
    kvr_wire_response_free(&again);
    kvr_buf_free(&b);
    free(tokens);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_wire_response r;
    kvr_status st = kvr_wire_decode_response(data, size, &r);
    if (st == KVR_OK) {
        round_trip(&r);
    } else {
        FUZZ_CHECK(!r.request_id && !r.error && r.ntokens == 0 && !r.final);
        FUZZ_CHECK(r.error_code == 0 && r.worker_id == 0 && r.cached_tokens == 0);
    }
    kvr_wire_response_free(&r);
    fuzz_fail_alloc(data, size, st, decode_and_free);
    return 0;
}
