/*
 * What the router sends to workers.
 */
#define _DEFAULT_SOURCE
#include "send.h"

#include <inttypes.h>
#include <stdio.h>

#include "clock.h"

uint32_t kvr_send_deadline_left(const struct kvr_pending *p, uint64_t now)
{
    if (!p->deadline_ns)
        return 0;
    /* rounded up: the worker, which counts from its own receipt, must not end it early */
    uint64_t left =
        p->deadline_ns > now ? (p->deadline_ns - now + KVR_NS_PER_MS - 1) / KVR_NS_PER_MS : 0;
    return left < 1 ? 1 : left > UINT32_MAX ? UINT32_MAX : (uint32_t)left;
}

void kvr_send_forward(struct kvr_rd *rd, const struct kvr_pending *p, const void *raw, size_t len,
                      uint64_t worker_id, uint32_t overlap)
{
    char subject[600];
    snprintf(subject, sizeof subject, "%s%" PRIu64 ".generate", rd->subj_worker, worker_id);
    uint32_t left = kvr_send_deadline_left(p, kvr_now_ns());
    if (kvr_wire_encode_worker_generate(&rd->buf, raw, len, p->key, overlap, rd->cfg->id, left) ==
        KVR_OK)
        kvr_outbox_add_tagged(&rd->out, subject, p->reply, rd->buf.data, rd->buf.len, p->key);
    else
        rd->out.dropped++; /* out of memory: anti-entropy places it again, or it expires */
}

void kvr_send_cancel(struct kvr_rd *rd, uint64_t key, uint64_t worker_id, kvr_status reason,
                     bool silent)
{
    char subject[600];
    snprintf(subject, sizeof subject, "%s%" PRIu64 ".cancel", rd->subj_worker, worker_id);
    struct kvr_wire_worker_cancel c = {key, reason, silent};
    if (kvr_wire_encode_worker_cancel(&rd->buf, &c, rd->cfg->id) == KVR_OK)
        kvr_outbox_add(&rd->out, subject, rd->buf.data, rd->buf.len, KVR_OK);
    else
        rd->out.dropped++;
}
