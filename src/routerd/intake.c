/*
 * Intake: generate, select and cancel.
 */
#define _DEFAULT_SOURCE
#include "intake.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "fleet.h"
#include "kvr/hash.h"
#include "log.h"
#include "place.h"
#include "rebind.h"
#include "send.h"
#include "subject.h"

_Static_assert(KVR_PENDING_REPLY_MAX == KVR_REPLY_MAX && KVR_PENDING_ID_MAX == KVR_REQUEST_ID_MAX,
               "a request key covers the longest reply subject and id the fleet takes");

/* Under mu: what became of an earlier request with key. true: it is answered (or ignored). */
static bool seen_before(struct kvr_rd *rd, uint64_t key, const char *reply, const char *id,
                        uint64_t now)
{
    const struct kvr_pending *p = kvr_pending_find(&rd->pend, key);
    struct kvr_recent *in = NULL; /* the table r is in */
    const struct kvr_recent_item *r = p ? NULL : kvr_rd_ended(rd, key, now, &in);
    if (!p && !r)
        r = kvr_recent_find(in = &rd->early_cancels, key, now);
    if (p || (r && r->kind == KVR_RECENT_ENDED)) {
        /* the same client and id: a resend of a request the fleet has in flight (its answer goes
         * to the same inbox), or of one that ended (its client lacks the stream, or has it and
         * ignores more); either way its stream stalled, so its worker is asked to repeat it */
        if (p)
            rd->fleet->resends++;
        else
            rd->n.resends_after_end++;
        uint64_t gone = 0;
        enum kvr_repeat rep = kvr_rebind_repeat(rd, p, key, reply, now, &gone);
        if (rep == KVR_REPEAT_GONE) {
            /* its worker left with the stream (drained and exited, or written off): the client
             * lacks it and nobody can repeat it, so it is told to try again, as when a worker
             * dies mid-stream (and a resend that crosses this answer is ignored, kvr_recent) */
            struct kvr_reply_why why = {.worker_id = gone};
            kvr_reply_fail(&rd->generate, &rd->out, reply, id, KVR_ERR_WORKER_LOST, &why);
            kvr_fleet_answered(rd, key, KVR_ERR_WORKER_LOST, now);
            rd->n.resends_worker_gone++;
        }
        kvr_log(KVR_LOG_DEBUG, p ? "resend_absorbed" : "resend_after_end",
                "key=%016" PRIx64 " repeat_asked=%s worker_gone=%s", key,
                rep == KVR_REPEAT_ASKED ? "true" : "false",
                rep == KVR_REPEAT_GONE ? "true" : "false");
        return true;
    }
    if (!r)
        return false;
    if (r->kind == KVR_RECENT_FAILED) {
        /* the fleet answered it with an error: soon after, a resend crossed that answer on its
         * way (its client will have it, or resend again); later, a new attempt. Soon is the
         * window plus how far behind this router reads (the loop that reads the generates reads
         * the worker events too): a resend read 3 s after the answer may have waited for longer
         * than that in the socket, sent before its client had the answer (an overloaded run on
         * two cores: loops 20-27 s behind, 115-135 requests answered and then streamed) */
        if (kvr_recent_age(in, r, now) >= rd->cfg->crossing_ns + rd->events_behind_ns)
            return false;
        rd->n.resends_after_error++;
        kvr_log(KVR_LOG_DEBUG, "resend_after_error", "key=%016" PRIx64 " error=\"%s\"", key,
                kvr_status_str(r->outcome));
        return true;
    }
    kvr_reply_error(&rd->generate, &rd->out, reply, id, r->outcome); /* the cancel came first */
    rd->n.cancelled_early++;
    kvr_recent_put(&rd->recent, key, KVR_RECENT_ENDED, KVR_OK, false, now);
    return true;
}

#define HASHES_ON_STACK 256 /* blocks: 16k tokens at 64 a block hash into the caller's array */

/*
 * q's sequence hashes at the router's block size, made before the state mutex is taken (the hash
 * needs no state: a long prompt's hashing then holds nobody up): into local (HASHES_ON_STACK of
 * them) or, for a longer prompt, an array the caller frees when it is not local. NULL for a prompt
 * shorter than a block, or when memory is short (the router then hashes under the mutex).
 */
static uint64_t *hash_before_lock(const struct kvr_rd *rd, const struct kvr_wire_request *q,
                                  kvr_status st, uint64_t *local)
{
    uint32_t B = rd->cfg->core.block_size;
    size_t n = st == KVR_OK && B ? q->ntokens / B : 0;
    uint64_t *seq = n > HASHES_ON_STACK ? malloc(n * sizeof *seq) : n ? local : NULL;
    if (seq)
        kvr_hash_prompt(q->tokens, q->ntokens, B, NULL, seq);
    return seq;
}

static void hashes_free(uint64_t *seq, const uint64_t *local)
{
    if (seq != local)
        free(seq);
}

/* Under mu: route q (bytes data[0..len), key; seq its hashes or NULL) and remember it; KVR_OK or
 * why it is refused. */
static kvr_status route(struct kvr_rd *rd, const struct kvr_wire_request *q, const uint64_t *seq,
                        uint64_t key, const char *reply, const void *data, size_t len)
{
    uint64_t now = kvr_now_ns();
    if (seen_before(rd, key, reply, q->request_id, now))
        return KVR_OK;
    struct kvr_pending *p = NULL;
    kvr_status st = kvr_pending_add(&rd->pend, key, reply, q->request_id, data, len, &p);
    if (st == KVR_ERR_FULL)
        st = KVR_ERR_OVERLOADED;
    if (st != KVR_OK)
        return st;
    p->decided_ns = kvr_realtime_ns();
    p->deadline_ns = q->deadline_ms ? now + (uint64_t)q->deadline_ms * KVR_NS_PER_MS : 0;
    struct kvr_request req = {.id = key,
                              .tokens = q->tokens,
                              .ntokens = q->ntokens,
                              .max_tokens = q->max_tokens,
                              .ov = q->ov,
                              .deadline = p->deadline_ns,
                              .seq_hashes = seq};
    struct kvr_decision d;
    st = kvr_router_route(rd->core, &req, now, &d);
    if (st != KVR_OK) {
        kvr_pending_drop(&rd->pend, p);
        return st;
    }
    if (kvr_log_enabled(KVR_LOG_DEBUG)) { /* the client's id, to find the key by */
        char id[160];
        kvr_log(KVR_LOG_DEBUG, "request_routed",
                "key=%016" PRIx64 " id=\"%s\" worker=%" PRIu64 " overlap_blocks=%u queued=%s", key,
                kvr_log_safe(id, sizeof id, q->request_id), d.worker_id, d.overlap_blocks,
                d.queued ? "true" : "false");
    }
    if (!d.queued) { /* queued: PLACED forwards it */
        p->worker_id = d.worker_id;
        kvr_send_forward(rd, p, data, len, d.worker_id, d.overlap_blocks);
        kvr_fleet_decided(rd, p);
    } else {
        kvr_fleet_queued(rd, p); /* the peers absorb its resends meanwhile */
    }
    return KVR_OK;
}

/* What a request's reply subject and forward allow: KVR_OK, or the error with its figures. */
static kvr_status fits(const struct kvr_rd *rd, const char *reply, size_t len,
                       struct kvr_wire_request *q)
{
    if (!(reply && *reply))
        return KVR_ERR_NO_REPLY; /* nobody to answer: counted, dropped */
    size_t n = strlen(reply);
    if (n > KVR_REPLY_MAX) { /* peers could not take it over: refused here */
        q->got = n;
        q->limit = KVR_REPLY_MAX;
        return KVR_ERR_REPLY_TOO_LONG;
    }
    if (rd->max_request_bytes && len > rd->max_request_bytes) { /* its forward would not fit */
        q->got = len;
        q->limit = rd->max_request_bytes;
        return KVR_ERR_TOO_LARGE;
    }
    return KVR_OK;
}

void kvr_intake_generate(struct kvr_rd *rd, const char *reply, const void *data, size_t len)
{
    uint64_t t0 = kvr_now_ns();
    struct kvr_wire_request q;
    kvr_status st = kvr_wire_decode_generate(data, len, &rd->lim, &q);
    if (!kvr_reply_usable(reply, rd->cfg->net.prefix))
        reply = NULL; /* never answered: counted as ERR_NO_REPLY, dropped */
    uint64_t local[HASHES_ON_STACK];
    uint64_t *seq = hash_before_lock(rd, &q, reply ? st : KVR_ERR_NO_REPLY, local);
    pthread_mutex_lock(&rd->mu);
    if (st == KVR_OK)
        st = fits(rd, reply, len, &q);
    if (st == KVR_OK)
        st = route(rd, &q, seq, kvr_pending_key(reply, q.request_id), reply, data, len);
    if (st != KVR_OK)
        kvr_reply_refuse(&rd->generate, &rd->out, reply, &q, st);
    kvr_place_settle(rd);
    kvr_reply_count(&rd->generate, kvr_now_ns() - t0);
    kvr_rd_unlock_flush(rd);
    kvr_wire_request_free(&q);
    hashes_free(seq, local);
}

/* Under mu: decide q (key; seq its hashes or NULL), booking it when asked; *d describes the
 * decision. */
static kvr_status select_one(struct kvr_rd *rd, const struct kvr_wire_request *q,
                             const uint64_t *seq, uint64_t key, bool book, struct kvr_decision *d)
{
    struct kvr_request req = {.id = key,
                              .tokens = q->tokens,
                              .ntokens = q->ntokens,
                              .max_tokens = q->max_tokens,
                              .ov = q->ov,
                              .explain = true,
                              .seq_hashes = seq};
    if (book && kvr_pending_find(&rd->pend, key))
        return KVR_ERR_DUPLICATE;
    uint64_t now = kvr_now_ns();
    kvr_status st = kvr_router_select(rd->core, &req, now, d);
    if (st != KVR_OK || !book)
        return st;
    /* booked in the same critical section: still atomic */
    st = kvr_router_book(rd->core, key, d->worker_id, d->block_hashes, d->prompt_blocks,
                         d->prompt_tokens, d->reuse_blocks, now);
    struct kvr_pending *p = NULL;
    if (st == KVR_OK) {
        kvr_router_note_max_tokens(rd->core, key, q->max_tokens); /* its completion teaches */
        st = kvr_pending_add(&rd->pend, key, NULL, q->request_id, NULL, 0, &p);
        if (st != KVR_OK)
            kvr_router_cancel(rd->core, key); /* a booking nobody could expire */
    }
    if (st == KVR_OK) {
        p->worker_id = d->worker_id;
        p->decided_ns = kvr_realtime_ns();
        kvr_pending_booked(&rd->pend, p, now + rd->cfg->booking_ttl_ns);
        kvr_fleet_decided(rd, p);
    }
    return st == KVR_ERR_FULL ? KVR_ERR_OVERLOADED : st;
}

void kvr_intake_select(struct kvr_rd *rd, const char *reply, const void *data, size_t len)
{
    uint64_t t0 = kvr_now_ns();
    struct kvr_wire_request q;
    bool book = false;
    kvr_status st = kvr_wire_decode_select(data, len, &rd->lim, &q, &book);
    struct kvr_decision d;
    uint64_t key = 0;
    char detail[128] = "";
    if (!kvr_reply_usable(reply, rd->cfg->net.prefix)) {
        reply = NULL; /* never answered (nor booked): counted as ERR_NO_REPLY, dropped */
        st = st == KVR_OK ? KVR_ERR_NO_REPLY : st;
    }
    uint64_t local[HASHES_ON_STACK];
    uint64_t *seq = hash_before_lock(rd, &q, st, local);
    pthread_mutex_lock(&rd->mu);
    if (st == KVR_OK && reply && strlen(reply) > KVR_REPLY_MAX) {
        q.got = strlen(reply);
        q.limit = KVR_REPLY_MAX;
        st = KVR_ERR_REPLY_TOO_LONG;
    }
    if (st == KVR_OK) {
        key = kvr_pending_key(reply, q.request_id);
        st = select_one(rd, &q, seq, key, book, &d);
    }
    kvr_wire_request_why(&q, st, detail, sizeof detail);
    kvr_reply_select(&rd->select, &rd->out, reply, st == KVR_OK ? &d : NULL,
                     st == KVR_OK && book ? key : 0, st, detail);
    kvr_place_settle(rd);
    kvr_reply_count(&rd->select, kvr_now_ns() - t0);
    pthread_mutex_unlock(&rd->mu);
    kvr_wire_request_free(&q);
    hashes_free(seq, local);
    kvr_rd_flush(rd);
}

/* Under mu: the client cancelled key. */
static void cancel(struct kvr_rd *rd, uint64_t key, uint64_t now)
{
    struct kvr_pending *p = kvr_pending_find(&rd->pend, key);
    if (!p) {
        if (!kvr_rd_ended(rd, key, now, NULL)) /* not ended: it may be on its way here */
            kvr_recent_put(&rd->early_cancels, key, KVR_RECENT_CANCELLED, KVR_ERR_CANCELLED, false,
                           now);
        return;
    }
    if (p->worker_id) {
        /* its worker answers, and its done frees every router's booking; if the forward never
         * reached it, the origin answers once that shows, and does not place it again */
        p->cancelled = true;
        kvr_send_cancel(rd, key, p->worker_id, KVR_ERR_CANCELLED, false);
        rd->n.cancels_sent++;
        return;
    }
    if (p->origin)
        return; /* queued at its origin, which heard the cancel too */
    kvr_router_cancel(rd->core, key);
    kvr_reply_error(&rd->generate, &rd->out, p->reply, p->request_id, KVR_ERR_CANCELLED);
    kvr_fleet_answered(rd, key, KVR_ERR_CANCELLED, now);
    kvr_fleet_unqueued(rd, p, KVR_ERR_CANCELLED);
    kvr_pending_drop(&rd->pend, p);
    rd->n.cancelled_queued++;
}

void kvr_intake_cancel(struct kvr_rd *rd, const void *data, size_t len)
{
    struct kvr_wire_cancel c;
    kvr_status st = kvr_wire_decode_cancel(data, len, &c);
    uint64_t left = 0;
    pthread_mutex_lock(&rd->mu);
    rd->n.cancels++;
    if (st == KVR_OK)
        cancel(rd, kvr_pending_key(c.reply, c.request_id), kvr_now_ns());
    else
        rd->n.cancels_bad++;
    /* anyone may publish cancels, and every router hears them: a line per bad one was a flood */
    bool logged = st != KVR_OK && kvr_log_gate_pass(&rd->cancel_log, &left);
    pthread_mutex_unlock(&rd->mu);
    if (logged)
        kvr_log(KVR_LOG_WARN, "cancel_dropped", "bytes=%zu error=\"%s\" suppressed=%" PRIu64, len,
                kvr_status_str(st), left);
    kvr_wire_cancel_free(&c);
    kvr_rd_flush(rd);
}

/* A booking whose TTL passed. */
static void expire_booking(void *ctx, struct kvr_pending *p)
{
    struct kvr_rd *rd = ctx;
    char id[128];
    kvr_log(KVR_LOG_INFO, "booking_expired", "request=\"%s\" worker=%" PRIu64,
            kvr_log_safe(id, sizeof id, p->request_id), p->worker_id);
    kvr_router_cancel(rd->core, p->key);
    kvr_pending_drop(&rd->pend, p);
    rd->n.bookings_expired++;
}

void kvr_intake_expire_bookings(struct kvr_rd *rd, uint64_t now)
{
    if (rd->pend.nbookings)
        kvr_pending_due_bookings(&rd->pend, now, expire_booking, rd);
}
