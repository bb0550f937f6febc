/*
 * Queued notices (fleet.h): a request queued at its origin is known to the peers, so a resend of
 * it through another router is absorbed there rather than placed a second time. Without them, a
 * client whose request waited in one router's queue resent it after 2 s of silence, the other
 * router (which had not heard of it) placed it, and the first answered "overloaded" when its queue
 * timeout came: an error and a stream for one request.
 *
 * A peer's notice becomes a pending entry on no worker and outside the core (queued_notice), kept
 * until the origin's decision replaces it (fleet.c, resolve), the origin releases it, or the
 * longest it may wait there (at most QUEUED_WAIT_MAX_MS) and four hellos have passed; at most
 * QUEUED_HELD_MAX of them at once. Past its wait, as an orphan: dropped while its origin lives
 * (the origin answered), answered "not delivered" by the stand-in when the origin fell silent
 * (nobody else has the request's bytes; the client may send it again, a new attempt 3 s later).
 */
#define _DEFAULT_SOURCE
#include "fleet.h"

#include <inttypes.h>
#include <stdint.h>

#include "clock.h"
#include "log.h"
#include "subject.h"

#define QUEUED_WAIT_MAX_MS 60000u /* a peer's notice is believed this long at most */
/* Peers' requests held on notices at once: 64 routers' full queues of the default 1,024, so
 * forged notices never fill the pending table, which real requests need. */
#define QUEUED_HELD_MAX 65536u

static void notice(struct kvr_rd *rd, struct kvr_pending *p, bool released, kvr_status st)
{
    struct kvr_fleet *g = rd->fleet;
    uint64_t now = kvr_now_ns(), wait = rd->cfg->core.queue_timeout_ns;
    if (p->deadline_ns) { /* its client's deadline, when it comes first */
        uint64_t left = p->deadline_ns > now ? p->deadline_ns - now : 0;
        wait = left < wait ? left : wait;
    }
    uint64_t wait_ms = (wait + KVR_NS_PER_MS - 1) / KVR_NS_PER_MS;
    struct kvr_wire_queued q = {.reply = p->reply,
                                .request_id = p->request_id,
                                .decided_ns = p->decided_ns,
                                .wait_ms = wait_ms < UINT32_MAX ? (uint32_t)wait_ms : UINT32_MAX,
                                .released = released,
                                .error_code = (uint32_t)st};
    if (kvr_wire_encode_gossip_queued(&rd->buf, rd->cfg->id, g->epoch, g->seq, &q) != KVR_OK)
        return;
    kvr_outbox_add(&rd->out, g->subj_gossip, rd->buf.data, rd->buf.len, KVR_OK);
    g->queued_sent++;
    kvr_pending_notice(&rd->pend, p, !released);
}

void kvr_fleet_queued(struct kvr_rd *rd, struct kvr_pending *p)
{
    if (rd->cfg->gossip && p->reply && !p->origin)
        notice(rd, p, false, KVR_OK);
}

void kvr_fleet_unqueued(struct kvr_rd *rd, struct kvr_pending *p, kvr_status st)
{
    if (rd->cfg->gossip && p->queued_notice && !p->origin && !p->worker_id)
        notice(rd, p, true, st);
}

void kvr_fleet_on_queued(struct kvr_rd *rd, const struct kvr_peer *peer,
                         const struct kvr_wire_queued *q, uint64_t now)
{
    struct kvr_fleet *g = rd->fleet;
    /* its reply would become a subject (the stand-in's answer) */
    if (!kvr_subject_ok(q->reply, KVR_REPLY_MAX) ||
        !kvr_reply_usable(q->reply, rd->cfg->net.prefix)) {
        g->bad++;
        return;
    }
    uint64_t key = kvr_pending_key(q->reply, q->request_id);
    struct kvr_pending *p = kvr_pending_find(&rd->pend, key);
    if (q->released) {
        if (p && p->origin == peer && p->queued_notice) {
            kvr_fleet_answered(rd, key, (kvr_status)q->error_code, now); /* so was its client */
            kvr_pending_drop(&rd->pend, p);
            g->queued_released++;
        }
        return;
    }
    if (p || kvr_rd_ended(rd, key, now, NULL) || kvr_recent_find(&rd->early_cancels, key, now))
        return; /* known here: decisions settle who serves it (the earlier, a placed one first) */
    if (rd->pend.nnotices >= QUEUED_HELD_MAX ||
        kvr_pending_add(&rd->pend, key, q->reply, q->request_id, NULL, 0, &p) != KVR_OK) {
        g->lost++; /* a resend through this router may be placed a second time */
        return;
    }
    p->origin = peer;
    p->decided_ns = q->decided_ns;
    kvr_pending_notice(&rd->pend, p, true);
    uint32_t wait_ms = q->wait_ms < QUEUED_WAIT_MAX_MS ? q->wait_ms : QUEUED_WAIT_MAX_MS;
    uint64_t until = now + wait_ms * KVR_NS_PER_MS + 4 * rd->cfg->hello_ns;
    if (kvr_pending_orphan(&rd->pend, p, until, KVR_ERR_NOT_DELIVERED) != KVR_OK) {
        kvr_pending_drop(&rd->pend, p); /* nothing would forget it */
        g->lost++;
        return;
    }
    g->queued_heard++;
    char id[128];
    kvr_log(KVR_LOG_DEBUG, "queued_at_peer", "key=%016" PRIx64 " id=\"%s\" origin=%s", key,
            kvr_log_safe(id, sizeof id, p->request_id), peer->id);
}
