/* kvr_wire_decode_batch: a worker's EventBatch (its lifecycle events sent together). */
#include "fuzz.h"

static kvr_status decode_and_free(const uint8_t *data, size_t size)
{
    struct kvr_wire_batch b;
    kvr_status st = kvr_wire_decode_batch(data, size, &b);
    kvr_wire_batch_free(&b);
    return st;
}

static bool same_event(const struct kvr_wire_event *a, const struct kvr_wire_event *b)
{
    if (a->kind != b->kind)
        return false;
    if (a->kind == KVR_WIRE_EV_TOKENS)
        return a->u.tokens.worker_id == b->u.tokens.worker_id &&
               a->u.tokens.key == b->u.tokens.key && a->u.tokens.kind == b->u.tokens.kind;
    return a->u.done.worker_id == b->u.done.worker_id && a->u.done.key == b->u.done.key &&
           a->u.done.status == b->u.done.status &&
           a->u.done.output_tokens == b->u.done.output_tokens;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_wire_batch b, again;
    kvr_status st = kvr_wire_decode_batch(data, size, &b);
    if (st == KVR_OK) {
        FUZZ_CHECK(b.n <= KVR_WIRE_BATCH_MAX && (b.n == 0 || b.ev));
        for (uint32_t i = 0; i < b.n; i++) /* every event is the batch's worker's */
            FUZZ_CHECK((b.ev[i].kind == KVR_WIRE_EV_TOKENS
                            ? b.ev[i].u.tokens.worker_id
                            : b.ev[i].u.done.worker_id) == b.worker_id);
        if (b.n) {
            struct kvr_buf e = {0};
            FUZZ_CHECK(kvr_wire_encode_batch(&e, b.worker_id, b.ev, b.n) == KVR_OK);
            FUZZ_CHECK(kvr_wire_decode_batch(e.data, e.len, &again) == KVR_OK);
            FUZZ_CHECK(again.worker_id == b.worker_id && again.n == b.n);
            for (uint32_t i = 0; i < b.n; i++)
                FUZZ_CHECK(same_event(&b.ev[i], &again.ev[i]));
            kvr_wire_batch_free(&again);
            kvr_buf_free(&e);
        }
    } else {
        FUZZ_CHECK(b.ev == NULL && b.n == 0);
    }
    kvr_wire_batch_free(&b);
    fuzz_fail_alloc(data, size, st, decode_and_free);
    return 0;
}
