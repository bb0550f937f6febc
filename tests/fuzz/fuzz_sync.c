/* kvr_wire_decode_sync: a peer router's SyncRequest (snapshot, repair or key lookup). */
#include "fuzz.h"

static kvr_status decode_and_free(const uint8_t *data, size_t size)
{
    struct kvr_wire_sync s;
    kvr_status st = kvr_wire_decode_sync(data, size, &s);
    kvr_wire_sync_free(&s);
    return st;
}

static void round_trip(const struct kvr_wire_sync *s)
{
    FUZZ_CHECK(s->router_id && strlen(s->router_id) <= KVR_ROUTER_ID_MAX);
    FUZZ_CHECK(s->nkeys <= KVR_WIRE_SYNC_KEYS_MAX);
    FUZZ_CHECK(s->to_seq - s->from_seq <= KVR_WIRE_SYNC_RANGE_MAX);
    struct kvr_buf b = {0};
    FUZZ_CHECK(kvr_wire_encode_sync(&b, s) == KVR_OK);
    struct kvr_wire_sync again;
    FUZZ_CHECK(kvr_wire_decode_sync(b.data, b.len, &again) == KVR_OK);
    FUZZ_CHECK(fuzz_streq(s->router_id, again.router_id));
    FUZZ_CHECK(s->full == again.full);
    FUZZ_CHECK(s->nkeys == again.nkeys);
    FUZZ_CHECK(fuzz_memeq(s->keys, again.keys, s->nkeys, sizeof *s->keys));
    FUZZ_CHECK(s->from_seq == again.from_seq && s->to_seq == again.to_seq);
    FUZZ_CHECK(s->epoch == again.epoch && s->token == again.token);
    kvr_wire_sync_free(&again);
    kvr_buf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_wire_sync s;
    kvr_status st = kvr_wire_decode_sync(data, size, &s);
    if (st == KVR_OK) {
        round_trip(&s);
    } else {
        FUZZ_CHECK(!s.router_id && !s.full && !s.keys && s.nkeys == 0);
        FUZZ_CHECK(s.from_seq == 0 && s.to_seq == 0 && s.epoch == 0 && s.token == 0);
    }
    kvr_wire_sync_free(&s);
    fuzz_fail_alloc(data, size, st, decode_and_free);
    return 0;
}
