/* kvr_wire_decode_heartbeat: a worker's Heartbeat (its load report and in-flight keys). */
#include "fuzz.h"

static kvr_status decode_and_free(const uint8_t *data, size_t size)
{
    struct kvr_wire_heartbeat h;
    kvr_status st = kvr_wire_decode_heartbeat(data, size, &h);
    kvr_wire_heartbeat_free(&h);
    return st;
}

static void round_trip(const struct kvr_wire_heartbeat *h)
{
    FUZZ_CHECK(h->info.id != 0 && h->info.block_size != 0);
    FUZZ_CHECK(h->info.kv_usage >= 0 && h->info.kv_usage <= 1);
    FUZZ_CHECK(h->ninflight <= KVR_WIRE_INFLIGHT_MAX && h->nended <= KVR_WIRE_ENDED_MAX);
    struct kvr_buf b = {0};
    FUZZ_CHECK(kvr_wire_encode_heartbeat(&b, h) == KVR_OK);
    struct kvr_wire_heartbeat again;
    FUZZ_CHECK(kvr_wire_decode_heartbeat(b.data, b.len, &again) == KVR_OK);
    FUZZ_CHECK(h->info.id == again.info.id);
    FUZZ_CHECK(h->info.block_size == again.info.block_size);
    FUZZ_CHECK(h->info.capacity_blocks == again.info.capacity_blocks);
    FUZZ_CHECK(h->info.waiting == again.info.waiting);
    FUZZ_CHECK(h->info.kv_usage == again.info.kv_usage);
    FUZZ_CHECK(h->ninflight == again.ninflight);
    FUZZ_CHECK(fuzz_memeq(h->inflight, again.inflight, h->ninflight, sizeof *h->inflight));
    FUZZ_CHECK(h->nended == again.nended && h->instance == again.instance &&
               h->started_ns == again.started_ns);
    FUZZ_CHECK(fuzz_memeq(h->ended, again.ended, h->nended, sizeof *h->ended));
    FUZZ_CHECK(h->interval_ms == again.interval_ms);
    FUZZ_CHECK(h->draining == again.draining);
    kvr_wire_heartbeat_free(&again);
    kvr_buf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_wire_heartbeat h;
    kvr_status st = kvr_wire_decode_heartbeat(data, size, &h);
    if (st == KVR_OK) {
        round_trip(&h);
    } else {
        FUZZ_CHECK(h.info.id == 0 && h.info.block_size == 0 && h.info.capacity_blocks == 0);
        FUZZ_CHECK(h.info.waiting == 0 && h.info.kv_usage == 0 && !h.info.draining);
        FUZZ_CHECK(!h.inflight && h.ninflight == 0 && h.interval_ms == 0 && !h.draining &&
                   !h.ended && h.nended == 0);
    }
    kvr_wire_heartbeat_free(&h);
    fuzz_fail_alloc(data, size, st, decode_and_free);
    return 0;
}
