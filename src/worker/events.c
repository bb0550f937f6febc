/*
 * What a worker tells the routers (under mu): its requests' lifecycle events (prefill done,
 * output blocks, done), alone or held for one EventBatch (--event-batch-ms), and its engine's KV
 * events; every message is queued in the outbox and published once mu is released.
 */
#include <string.h>

#include "clock.h"
#include "codec.h"
#include "worker.h"

/* Under mu: one lifecycle event as its own message. */
static void send_event(struct kvr_worker *w, const struct kvr_wire_event *ev)
{
    kvr_status st;
    if (ev->kind == KVR_WIRE_EV_TOKENS)
        st = kvr_wire_encode_tokens(&w->bbuf, w->cfg->id, ev->u.tokens.key, ev->u.tokens.kind);
    else
        st = kvr_wire_encode_done(&w->bbuf, w->cfg->id, ev->u.done.key, ev->u.done.status,
                                  ev->u.done.output_tokens);
    if (st == KVR_OK)
        kvr_outbox_add(&w->out, ev->kind == KVR_WIRE_EV_TOKENS ? w->subj_tokens : w->subj_done,
                       w->bbuf.data, w->bbuf.len, KVR_OK);
    else
        w->c.dropped++;
}

void kvr__worker_seal(struct kvr_worker *w)
{
    uint32_t n = w->nbatch;
    w->nbatch = 0;
    if (n == 1) { /* alone: as it would have gone unbatched */
        send_event(w, &w->batch[0]);
    } else if (n > 1) {
        if (kvr_wire_encode_batch(&w->bbuf, w->cfg->id, w->batch, n) == KVR_OK) {
            kvr_outbox_add(&w->out, w->subj_batch, w->bbuf.data, w->bbuf.len, KVR_OK);
            w->c.batches++;
            w->c.batched_events += n;
        } else {
            w->c.dropped += n;
        }
    }
}

void kvr__worker_emit(struct kvr_worker *w, const char *subject, kvr_status st)
{
    if (w->clashed)
        return; /* the older instance serves everything: say nothing */
    /* the lifecycle events held go before the messages that list requests: a heartbeat that no
     * longer lists a request after its done, a rebind ask after the ends it follows. KV events
     * need no such order (a router applies them to its index, apart from the requests' load),
     * so they do not cut a batch short. */
    if (w->nbatch && (subject == w->subj_hb || subject == w->subj_ask))
        kvr__worker_seal(w);
    if (st == KVR_OK)
        kvr_outbox_add(&w->out, subject, w->buf.data, w->buf.len, KVR_OK);
    else
        w->c.dropped++;
}

/* Under mu: a lifecycle event, sent now, or held for an EventBatch (--event-batch-ms): the first
 * one held sets when they go, and wakes the engine thread, which seals them then. */
static void lifecycle(struct kvr_worker *w, const struct kvr_wire_event *ev)
{
    if (w->clashed)
        return;
    if (!w->cfg->event_batch_ns || w->stopping) { /* stopping: no engine thread may seal it */
        kvr__worker_seal(w); /* those held before the stop go first (no-op when none) */
        send_event(w, ev);
        return;
    }
    if (w->nbatch == 0) {
        w->batch_due = kvr_now_ns() + w->cfg->event_batch_ns;
        pthread_cond_signal(&w->cv);
    }
    w->batch[w->nbatch++] = *ev;
    if (w->nbatch == KVR_WIRE_BATCH_MAX)
        kvr__worker_seal(w);
}

void kvr__worker_done(struct kvr_worker *w, uint64_t key, kvr_status outcome, uint32_t tokens)
{
    struct kvr_wire_event ev = {.kind = KVR_WIRE_EV_DONE};
    ev.u.done = (struct kvr_wire_done){w->cfg->id, key, (uint32_t)outcome, tokens};
    lifecycle(w, &ev);
}

/* A run of stored blocks, in events of KVR_WIRE_STORED_BLOCKS_MAX at most, each the parent of
 * the next (a router applies one event under its lock). */
void kvr__worker_stored(struct kvr_worker *w, const uint64_t *parent, const struct kvr_kv_block *b,
                        size_t n)
{
    for (size_t i = 0; i < n || (i == 0 && n == 0); i += KVR_WIRE_STORED_BLOCKS_MAX) {
        size_t k = n - i < KVR_WIRE_STORED_BLOCKS_MAX ? n - i : KVR_WIRE_STORED_BLOCKS_MAX;
        const uint64_t *p = i ? &b[i - 1].engine_id : parent;
        kvr__worker_emit(w, w->subj_kv,
                         kvr_wire_encode_stored(&w->buf, w->cfg->id, ++w->event_seq, p, b + i, k));
    }
}

void kvr__worker_removed(struct kvr_worker *w, const uint64_t *ids, size_t n)
{
    for (size_t i = 0; i < n || (i == 0 && n == 0); i += KVR_WIRE_REMOVED_IDS_MAX) {
        size_t k = n - i < KVR_WIRE_REMOVED_IDS_MAX ? n - i : KVR_WIRE_REMOVED_IDS_MAX;
        kvr__worker_emit(w, w->subj_kv,
                         kvr_wire_encode_removed(&w->buf, w->cfg->id, ++w->event_seq, ids + i, k));
    }
}

void kvr__worker_cleared(struct kvr_worker *w)
{
    kvr__worker_emit(w, w->subj_kv, kvr_wire_encode_cleared(&w->buf, w->cfg->id, ++w->event_seq));
}

static void tokens_event(struct kvr_worker *w, uint64_t key, enum kvr_wire_tokens_kind kind)
{
    struct kvr_wire_event ev = {.kind = KVR_WIRE_EV_TOKENS};
    ev.u.tokens = (struct kvr_wire_tokens){w->cfg->id, key, kind};
    lifecycle(w, &ev);
}

void kvr__worker_prefill(struct kvr_worker *w, uint64_t key)
{
    tokens_event(w, key, KVR_WIRE_PREFILL_DONE);
}

void kvr__worker_output_block(struct kvr_worker *w, uint64_t key)
{
    tokens_event(w, key, KVR_WIRE_OUTPUT_BLOCK);
}
