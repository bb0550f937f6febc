/* kvr_wire_decode_kv: a worker's KvEvent (Stored, Removed or Cleared), its fast path compared
 * with protobuf-c's answer. */
#include "fuzz.h"

#include "codec_internal.h" /* kvr_wire_decode_kv_pb */

static kvr_status decode_and_free(const uint8_t *data, size_t size)
{
    struct kvr_wire_kv e;
    kvr_status st = kvr_wire_decode_kv(data, size, &e);
    kvr_wire_kv_free(&e);
    return st;
}

static void encode(struct kvr_buf *b, const struct kvr_wire_kv *e)
{
    kvr_status st = KVR_ERR_INVALID;
    switch (e->kind) {
    case KVR_WIRE_STORED:
        st = kvr_wire_encode_stored(b, e->worker_id, e->event_seq,
                                    e->has_parent ? &e->parent : NULL, e->blocks, e->nblocks);
        break;
    case KVR_WIRE_REMOVED:
        st = kvr_wire_encode_removed(b, e->worker_id, e->event_seq, e->ids, e->nids);
        break;
    case KVR_WIRE_CLEARED:
        st = kvr_wire_encode_cleared(b, e->worker_id, e->event_seq);
        break;
    }
    FUZZ_CHECK(st == KVR_OK);
}

static void round_trip(const struct kvr_wire_kv *e)
{
    FUZZ_CHECK(e->kind == KVR_WIRE_STORED || e->kind == KVR_WIRE_REMOVED ||
               e->kind == KVR_WIRE_CLEARED);
    FUZZ_CHECK(e->nblocks <= KVR_WIRE_STORED_BLOCKS_MAX && e->nids <= KVR_WIRE_REMOVED_IDS_MAX);
    struct kvr_buf b = {0};
    encode(&b, e);
    struct kvr_wire_kv again;
    FUZZ_CHECK(kvr_wire_decode_kv(b.data, b.len, &again) == KVR_OK);
    FUZZ_CHECK(e->worker_id == again.worker_id);
    FUZZ_CHECK(e->event_seq == again.event_seq);
    FUZZ_CHECK(e->kind == again.kind);
    FUZZ_CHECK(e->has_parent == again.has_parent);
    FUZZ_CHECK(!e->has_parent || e->parent == again.parent);
    FUZZ_CHECK(e->nblocks == again.nblocks);
    FUZZ_CHECK(fuzz_memeq(e->blocks, again.blocks, e->nblocks, sizeof *e->blocks));
    FUZZ_CHECK(e->nids == again.nids);
    FUZZ_CHECK(fuzz_memeq(e->ids, again.ids, e->nids, sizeof *e->ids));
    kvr_wire_kv_free(&again);
    kvr_buf_free(&b);
}

/* The fast path's answer is protobuf-c's, field for field. */
static void same_as_protobuf(const uint8_t *data, size_t size, kvr_status st,
                             const struct kvr_wire_kv *e)
{
    struct kvr_wire_kv p;
    FUZZ_CHECK(kvr_wire_decode_kv_pb(data, size, &p) == st);
    FUZZ_CHECK(e->worker_id == p.worker_id && e->event_seq == p.event_seq && e->kind == p.kind);
    FUZZ_CHECK(e->has_parent == p.has_parent && e->parent == p.parent);
    FUZZ_CHECK(e->nblocks == p.nblocks && e->nids == p.nids);
    FUZZ_CHECK(fuzz_memeq(e->blocks, p.blocks, e->nblocks, sizeof *e->blocks));
    FUZZ_CHECK(fuzz_memeq(e->ids, p.ids, e->nids, sizeof *e->ids));
    kvr_wire_kv_free(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_wire_kv e;
    kvr_status st = kvr_wire_decode_kv(data, size, &e);
    same_as_protobuf(data, size, st, &e);
    if (st == KVR_OK) {
        round_trip(&e);
    } else {
        FUZZ_CHECK(e.worker_id == 0 && e.event_seq == 0 && e.kind == 0 && !e.has_parent);
        FUZZ_CHECK(e.parent == 0 && !e.blocks && e.nblocks == 0 && !e.ids && e.nids == 0);
    }
    kvr_wire_kv_free(&e);
    fuzz_fail_alloc(data, size, st, decode_and_free);
    return 0;
}
