/*
 * Router replicas in the simulator: each booking a replica makes (a route, or a queued request
 * placed) is exported once the call into that replica returns (its event callback must not call
 * back into the router) and travels to the other replicas as one heap event, gossip_delay_ns
 * later, as kvrouter's gossip does. Its wire size is counted as kvrouter's Gossip message would
 * be encoded. Invariant: a replica's booked list is empty between calls into it. Single-threaded:
 * one run, one thread.
 */
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "sim.h"
#include "sim_int.h"

/*
 * The wire size of the Gossip message kvrouter publishes for a booking (proto/kvrouter/v1:
 * Gossip{router_id, epoch, seq, Decision{request_key, worker_id, block_hashes (packed),
 * prompt_tokens, overlap_blocks, reply, request_id, origin, decided_ns, max_tokens}}), counted as
 * protobuf encodes it: one-byte tags, varints at their real length, zero fields left out (a first
 * placement's is 0). What the simulation does not have is given a typical size: 64-bit hashes
 * (request key, epoch) 10 bytes, a wall-clock time in ns 9 bytes, router ids ("host-pid") 12
 * bytes, the client's reply subject ("_INBOX.<22-char nuid>.<n>") 36, its request id 16. So a
 * decision of n blocks costs about 9.5 n + 140 bytes (the block hashes, random 64-bit values, take
 * 9 or 10 bytes each).
 */
#define WIRE_HASH       10
#define WIRE_ROUTER_ID  12
#define WIRE_REPLY      36
#define WIRE_REQUEST_ID 16
#define WIRE_TIME_NS    9

static uint32_t varint_len(uint64_t v)
{
    uint32_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* A length-delimited field of len bytes, with its tag and length. */
static uint32_t delimited(uint32_t len)
{
    return 1 + varint_len(len) + len;
}

/* A varint field, left out when zero. */
static uint32_t varint_field(uint64_t v)
{
    return v ? 1 + varint_len(v) : 0;
}

static uint32_t gossip_size(const struct kvr_request_record *rec, uint64_t seq)
{
    uint32_t hashes = 0;
    for (uint32_t b = 0; b < rec->nblocks; b++)
        hashes += varint_len(rec->block_hashes[b]);
    uint32_t d = 1 + WIRE_HASH + varint_field(rec->worker_id) +
                 (rec->nblocks ? delimited(hashes) : 0) + varint_field(rec->prompt_tokens) +
                 varint_field(rec->overlap_blocks) + delimited(WIRE_REPLY) +
                 delimited(WIRE_REQUEST_ID) + delimited(WIRE_ROUTER_ID) + 1 + WIRE_TIME_NS +
                 varint_field(rec->max_tokens);
    return delimited(WIRE_ROUTER_ID) + 1 + WIRE_HASH + varint_field(seq) + delimited(d);
}

void kvr__sim_booked(struct replica *rp, uint64_t id)
{
    struct sim *s = rp->s;
    s->decisions++;
    if (!s->gossip)
        return;
    if (!KVR_GROW(rp->booked, rp->cap_booked, rp->nbooked + 1, 64)) {
        kvr__sim_fail(s, KVR_ERR_NOMEM);
        return;
    }
    rp->booked[rp->nbooked++] = id;
}

void kvr__sim_gossip_out(struct replica *rp)
{
    struct sim *s = rp->s;
    for (uint32_t k = 0; k < rp->nbooked; k++) {
        struct kvr_request_record rec;
        if (kvr_router_export(rp->router, rp->booked[k], &rec) != KVR_OK)
            continue; /* nothing ends inside the call that booked it */
        struct gossip_msg *m = malloc(sizeof *m + (size_t)rec.nblocks * sizeof *m->hashes);
        if (!m) {
            kvr__sim_fail(s, KVR_ERR_NOMEM);
            break;
        }
        m->rec = rec;
        memcpy(m->hashes, rec.block_hashes, (size_t)rec.nblocks * sizeof *m->hashes);
        m->rec.block_hashes = m->hashes;
        s->gossip_msgs++;
        s->gossip_bytes += gossip_size(&m->rec, ++rp->sent);
        kvr__sim_push(s, s->now + s->cfg->gossip_delay_ns, EV_GOSSIP, rp->i, 0, m);
    }
    rp->nbooked = 0;
}
