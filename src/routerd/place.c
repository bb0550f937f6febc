/*
 * Placing requests on workers.
 */
#define _DEFAULT_SOURCE
#include "place.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>

#include "clock.h"
#include "fleet.h"
#include "log.h"
#include "rebind.h"
#include "send.h"

/* Whether p may go to another worker: this router's own (it holds the client's bytes), not
 * cancelled by its client, and placed fewer than KVR_PLACE_MAX_AGAIN times. */
static bool may_place_again(const struct kvr_pending *p)
{
    return p && !p->origin && p->raw && !p->cancelled && p->attempts < KVR_PLACE_MAX_AGAIN;
}

void kvr_place_forward_failed(struct kvr_rd *rd, uint64_t key, kvr_status st)
{
    struct kvr_pending *p = kvr_pending_find(&rd->pend, key);
    rd->n.forwards_failed++;
    /* too large fails the same way anywhere; anything else is the connection's trouble of the
     * moment: place it again at the next tick, once nats.c has seen the cut (it buffers what is
     * published while it reconnects; sent again at once, the forward meets the same dead socket) */
    bool again = st != KVR_ERR_TOO_LARGE && may_place_again(p);
    char id[128];
    kvr_log(again ? KVR_LOG_WARN : KVR_LOG_ERROR, "forward_failed",
            "request=\"%s\" worker=%" PRIu64 " error=\"%s\" placed_again=%s",
            kvr_log_safe(id, sizeof id, p ? p->request_id : ""), p ? p->worker_id : 0,
            kvr_status_str(st), again ? "yes" : "no");
    if (!p || p->origin)
        return;
    kvr_router_cancel(rd->core, key); /* its booking is gone at once, not after its TTL */
    if (again && kvr_pending_place_next_tick(&rd->pend, p) == KVR_OK)
        return;
    struct kvr_reply_why why = {.worker_id = p->worker_id};
    kvr_status answer = p->cancelled              ? KVR_ERR_CANCELLED
                        : st == KVR_ERR_TOO_LARGE ? KVR_ERR_TOO_LARGE
                                                  : KVR_ERR_IO;
    kvr_reply_fail(&rd->generate, &rd->out, p->reply, p->request_id, answer, &why);
    kvr_fleet_answered(rd, key, answer, kvr_now_ns());
    kvr_pending_drop(&rd->pend, p);
}

/* Answer p's client with the error st and forget p (remembering the answer). */
static void refuse(struct kvr_rd *rd, struct kvr_pending *p, kvr_status st)
{
    kvr_reply_error(&rd->generate, &rd->out, p->reply, p->request_id, st);
    kvr_fleet_answered(rd, p->key, st, kvr_now_ns());
    kvr_pending_drop(&rd->pend, p);
}

/* Place p again (it never reached its worker). */
static void place_again(struct kvr_rd *rd, struct kvr_pending *p)
{
    struct kvr_wire_request q;
    kvr_status st = kvr_wire_decode_generate(p->raw, p->rawlen, &rd->lim, &q);
    if (st != KVR_OK) { /* it decoded once: only memory can fail now */
        refuse(rd, p, st);
        kvr_wire_request_free(&q);
        return;
    }
    struct kvr_request req = {.id = p->key,
                              .tokens = q.tokens,
                              .ntokens = q.ntokens,
                              .max_tokens = q.max_tokens,
                              .ov = q.ov,
                              .deadline = p->deadline_ns,
                              .avoid_worker = p->avoid_worker};
    struct kvr_decision d;
    p->attempts++;
    rd->placed_again++;
    st = kvr_router_route(rd->core, &req, kvr_now_ns(), &d);
    if (st == KVR_OK && !d.queued) {
        /* gossiped with its placement count (attempts, counted above): peers replace its
         * earlier decision with this one (fleet.c, placed_anew) instead of keeping the earlier
         * as a conflict would; a queued one carries it when PLACED forwards it */
        p->worker_id = d.worker_id;
        kvr_send_forward(rd, p, p->raw, p->rawlen, d.worker_id, d.overlap_blocks);
        kvr_fleet_decided(rd, p);
    }
    char id[128];
    kvr_log(KVR_LOG_INFO, "request_placed_again", "request=\"%s\" worker=%" PRIu64 " status=\"%s\"",
            kvr_log_safe(id, sizeof id, p->request_id), st == KVR_OK ? d.worker_id : 0,
            st == KVR_OK && d.queued ? "queued" : kvr_status_str(st));
    if (st != KVR_OK)
        refuse(rd, p, st);
    kvr_wire_request_free(&q);
}

/* A queued request found a worker. */
static void placed(struct kvr_rd *rd, struct kvr_pending *p, const struct kvr_rd_deferred *ev)
{
    if (!p || !p->raw || p->worker_id)
        return;
    kvr_pending_notice(&rd->pend, p, false); /* its decision replaces its Queued notice */
    p->worker_id = ev->worker_id;
    kvr_send_forward(rd, p, p->raw, p->rawlen, ev->worker_id, ev->overlap_blocks);
    kvr_fleet_decided(rd, p);
}

/* A request left the core unserved (rejected from the queue, failed, expired). */
static void ended(struct kvr_rd *rd, struct kvr_pending *p, const struct kvr_rd_deferred *ev)
{
    if (!p)
        return;
    bool never_started = ev->status == KVR_ERR_NOT_DELIVERED || ev->kind == KVR_EV_FAILED;
    if (never_started && may_place_again(p) && kvr_pending_place_later(&rd->pend, p) == KVR_OK)
        return; /* it never started: another worker can take it (unless its client cancelled) */
    char id[128];
    kvr_log(KVR_LOG_WARN, "request_failed", "request=\"%s\" worker=%" PRIu64 " error=\"%s\"",
            kvr_log_safe(id, sizeof id, p->request_id), ev->worker_id, kvr_status_str(ev->status));
    if (!p->origin && ev->worker_id)
        /* its worker was written off (silent too long) or the request went stale: the client is
         * answered now, so a worker that is alive after all (paused, cut off) is told to stop,
         * silently, rather than stream on after that final and finish work nobody counts */
        kvr_send_cancel(rd, p->key, ev->worker_id, KVR_ERR_CANCELLED, true);
    kvr_fleet_failed(rd, p, p->cancelled ? KVR_ERR_CANCELLED : ev->status);
}

void kvr_place_refuse_unplaced(struct kvr_rd *rd, kvr_status st)
{
    struct kvr_pending *next;
    for (struct kvr_pending *p = rd->pend.head; p; p = next) {
        next = p->hh.next;
        if (p->origin || p->worker_id)
            continue; /* a peer's, or on its worker */
        kvr_router_withdraw(rd->core, p->key);
        kvr_fleet_unqueued(rd, p, st); /* its peers stop standing in for it (a second final) */
        refuse(rd, p, st);
    }
}

static void handle(struct kvr_rd *rd, const struct kvr_rd_deferred *ev)
{
    struct kvr_pending *p = ev->request_id ? kvr_pending_find(&rd->pend, ev->request_id) : NULL;
    switch (ev->kind) {
    case KVR_EV_PLACED:
        placed(rd, p, ev);
        break;
    case KVR_EV_REJECTED:
    case KVR_EV_FAILED:
    case KVR_EV_EXPIRED:
        ended(rd, p, ev);
        break;
    case KVR_EV_WORKER_LEFT:
        kvr_log(KVR_LOG_WARN, "worker_left", "worker=%" PRIu64, ev->worker_id);
        kvr_rebind_worker_left(rd, ev->worker_id);
        break;
    }
}

void kvr_place_settle(struct kvr_rd *rd)
{
    for (;;) {
        for (uint32_t i = 0; i < rd->ndeferred; i++) {
            struct kvr_rd_deferred ev = rd->deferred[i]; /* handling may grow the array */
            handle(rd, &ev);
        }
        rd->ndeferred = 0;
        const uint64_t *keys;
        uint32_t n = kvr_pending_take_again(&rd->pend, &keys);
        for (uint32_t i = 0; i < n; i++) {
            struct kvr_pending *p = kvr_pending_find(&rd->pend, keys[i]);
            if (p && p->raw)
                place_again(rd, p);
        }
        if (!rd->ndeferred && !rd->pend.nagain)
            break;
    }
}
