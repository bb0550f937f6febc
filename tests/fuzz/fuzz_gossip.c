/* kvr_wire_decode_gossip: a peer router's Gossip (one decision, a hello or a queued notice). */
#include "fuzz.h"

static kvr_status decode_and_free(const uint8_t *data, size_t size)
{
    struct kvr_wire_gossip g;
    kvr_status st = kvr_wire_decode_gossip(data, size, &g);
    kvr_wire_gossip_free(&g);
    return st;
}

static void encode(struct kvr_buf *b, const struct kvr_wire_gossip *g)
{
    kvr_status st;
    if (g->kind == KVR_WIRE_GOSSIP_DECISION)
        st = kvr_wire_encode_gossip_decision(b, g->router_id, g->epoch, g->seq, &g->d.rec,
                                             g->d.reply, g->d.request_id, g->d.origin, 0, 0);
    else if (g->kind == KVR_WIRE_GOSSIP_QUEUED)
        st = kvr_wire_encode_gossip_queued(b, g->router_id, g->epoch, g->seq, &g->q);
    else
        st = kvr_wire_encode_gossip_hello(b, g->router_id, g->epoch, g->seq, g->serving);
    FUZZ_CHECK(st == KVR_OK);
}

static void round_trip(const struct kvr_wire_gossip *g)
{
    FUZZ_CHECK(g->router_id && g->router_id[0] && strlen(g->router_id) <= KVR_ROUTER_ID_MAX);
    FUZZ_CHECK(g->kind == KVR_WIRE_GOSSIP_DECISION || g->kind == KVR_WIRE_GOSSIP_HELLO ||
               g->kind == KVR_WIRE_GOSSIP_QUEUED);
    if (g->kind == KVR_WIRE_GOSSIP_DECISION)
        fuzz_check_decision(&g->d);
    if (g->kind == KVR_WIRE_GOSSIP_QUEUED)
        FUZZ_CHECK(g->q.reply && g->q.reply[0] && strlen(g->q.reply) <= KVR_REPLY_MAX &&
                   g->q.request_id && strlen(g->q.request_id) <= KVR_REQUEST_ID_MAX);
    struct kvr_buf b = {0};
    encode(&b, g);
    struct kvr_wire_gossip again;
    FUZZ_CHECK(kvr_wire_decode_gossip(b.data, b.len, &again) == KVR_OK);
    FUZZ_CHECK(fuzz_streq(g->router_id, again.router_id));
    FUZZ_CHECK(g->epoch == again.epoch && g->seq == again.seq && g->kind == again.kind);
    if (g->kind == KVR_WIRE_GOSSIP_DECISION)
        fuzz_same_decision(&g->d, &again.d);
    else if (g->kind == KVR_WIRE_GOSSIP_QUEUED)
        FUZZ_CHECK(fuzz_streq(g->q.reply, again.q.reply) &&
                   fuzz_streq(g->q.request_id, again.q.request_id) &&
                   g->q.decided_ns == again.q.decided_ns && g->q.wait_ms == again.q.wait_ms &&
                   g->q.released == again.q.released && g->q.error_code == again.q.error_code);
    else
        FUZZ_CHECK(g->serving == again.serving);
    kvr_wire_gossip_free(&again);
    kvr_buf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_wire_gossip g;
    kvr_status st = kvr_wire_decode_gossip(data, size, &g);
    if (st == KVR_OK) {
        round_trip(&g);
    } else {
        FUZZ_CHECK(!g.router_id && g.epoch == 0 && g.seq == 0 && g.kind == 0 && !g.serving);
        FUZZ_CHECK(!g.d.reply && !g.d.request_id && !g.d.origin && !g.d.rec.block_hashes);
        FUZZ_CHECK(g.d.rec.request_id == 0 && g.d.rec.worker_id == 0 && g.d.rec.nblocks == 0);
        FUZZ_CHECK(!g.q.reply && !g.q.request_id && g.q.decided_ns == 0 && !g.q.released &&
                   g.q.error_code == 0);
    }
    kvr_wire_gossip_free(&g);
    fuzz_fail_alloc(data, size, st, decode_and_free);
    return 0;
}
