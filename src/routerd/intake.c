/*
 * Intake: generate and select.
 */
#define _DEFAULT_SOURCE
#include "intake.h"

#include <string.h>

#include "clock.h"
#include "fleet.h"
#include "place.h"

_Static_assert(KVR_PENDING_REPLY_MAX == KVR_REPLY_MAX && KVR_PENDING_ID_MAX == KVR_REQUEST_ID_MAX,
               "a request key covers the longest reply subject and id the fleet takes");

/* Under mu: route q (bytes data[0..len), key) and remember it; KVR_OK or why it is refused. */
static kvr_status route(struct kvr_rd *rd, const struct kvr_wire_request *q, uint64_t key,
                        const char *reply, const void *data, size_t len)
{
    struct kvr_pending *p = NULL;
    kvr_status st = kvr_pending_add(&rd->pend, key, reply, q->request_id, data, len, &p);
    if (st == KVR_ERR_DUPLICATE) {
        /* the same client and id: a resend of a request the fleet already has in flight; its
         * answer goes to the same inbox */
        rd->fleet->resends++;
        return KVR_OK;
    }
    if (st == KVR_ERR_FULL)
        st = KVR_ERR_OVERLOADED;
    if (st != KVR_OK)
        return st;
    struct kvr_request req = {key, q->tokens, q->ntokens, q->max_tokens, q->ov, false};
    struct kvr_decision d;
    st = kvr_router_route(rd->core, &req, kvr_now_ns(), &d);
    if (st != KVR_OK) {
        kvr_pending_drop(&rd->pend, p);
        return st;
    }
    if (!d.queued) { /* queued: PLACED forwards it */
        p->worker_id = d.worker_id;
        kvr_place_forward(rd, p, data, len, d.worker_id, d.overlap_blocks);
        kvr_fleet_decided(rd, p);
    }
    return KVR_OK;
}

void kvr_intake_generate(struct kvr_rd *rd, const char *reply, const void *data, size_t len)
{
    uint64_t t0 = kvr_now_ns();
    struct kvr_wire_request q;
    kvr_status st = kvr_wire_decode_generate(data, len, &rd->lim, &q);
    pthread_mutex_lock(&rd->mu);
    if (st == KVR_OK && !(reply && *reply))
        st = KVR_ERR_INVALID; /* nobody to answer: counted, dropped */
    else if (st == KVR_OK && strlen(reply) > KVR_REPLY_MAX)
        st = KVR_ERR_TOO_LARGE; /* peers could not take it over: refused here */
    if (st == KVR_OK)
        st = route(rd, &q, kvr_pending_key(reply, q.request_id), reply, data, len);
    if (st != KVR_OK)
        kvr_reply_error(&rd->generate, &rd->out, reply, q.request_id, st);
    kvr_place_settle(rd);
    kvr_reply_count(&rd->generate, kvr_now_ns() - t0);
    pthread_mutex_unlock(&rd->mu);
    kvr_wire_request_free(&q);
    kvr_rd_flush(rd);
}

/* Under mu: decide q (key), booking it when asked; *d describes the decision. */
static kvr_status select_one(struct kvr_rd *rd, const struct kvr_wire_request *q, uint64_t key,
                             bool book, struct kvr_decision *d)
{
    struct kvr_request req = {key, q->tokens, q->ntokens, q->max_tokens, q->ov, true};
    if (book && kvr_pending_find(&rd->pend, key))
        return KVR_ERR_DUPLICATE;
    kvr_status st = kvr_router_select(rd->core, &req, kvr_now_ns(), d);
    if (st != KVR_OK || !book)
        return st;
    /* booked in the same critical section: still atomic */
    st = kvr_router_book(rd->core, key, d->worker_id, d->block_hashes, d->prompt_blocks,
                         d->prompt_tokens, d->overlap_blocks, kvr_now_ns());
    struct kvr_pending *p = NULL;
    if (st == KVR_OK &&
        kvr_pending_add(&rd->pend, key, NULL, q->request_id, NULL, 0, &p) == KVR_OK) {
        p->worker_id = d->worker_id;
        kvr_fleet_decided(rd, p);
    }
    return st;
}

void kvr_intake_select(struct kvr_rd *rd, const char *reply, const void *data, size_t len)
{
    uint64_t t0 = kvr_now_ns();
    struct kvr_wire_request q;
    bool book = false;
    kvr_status st = kvr_wire_decode_select(data, len, &rd->lim, &q, &book);
    struct kvr_decision d;
    uint64_t key = 0;
    pthread_mutex_lock(&rd->mu);
    if (st == KVR_OK && reply && strlen(reply) > KVR_REPLY_MAX)
        st = KVR_ERR_TOO_LARGE;
    if (st == KVR_OK) {
        key = kvr_pending_key(reply, q.request_id);
        st = select_one(rd, &q, key, book, &d);
    }
    kvr_reply_select(&rd->select, &rd->out, reply, st == KVR_OK ? &d : NULL, key, st, NULL);
    kvr_place_settle(rd);
    kvr_reply_count(&rd->select, kvr_now_ns() - t0);
    pthread_mutex_unlock(&rd->mu);
    kvr_wire_request_free(&q);
    kvr_rd_flush(rd);
}
