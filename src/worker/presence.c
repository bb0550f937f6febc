/*
 * kvr_worker's presence in the fleet: its heartbeat (also the answer to a hello), the worker id
 * clash rule, the outgoing connection's cuts (the repeat they call for is in worker.c), and what a
 * stop waits for. Runs on the heartbeat thread, the delivery threads and the NATS library's event
 * thread, under the worker's mutex.
 */
#define _DEFAULT_SOURCE
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "clock.h"
#include "codec.h"
#include "log.h"
#include "subject.h"
#include "worker.h"

/* Keys of the requests that ended here (for the fleet: not stopped for another worker's copy) at
 * or after since, into keys (KVR_WIRE_ENDED_MAX at most, the newest); returns the count. */
static uint32_t ended_since(struct kvr_worker *w, uint64_t since, uint64_t *keys)
{
    uint32_t n = 0;
    uint64_t ttl = w->recent.ttl_ns;
    uint32_t pos = 0;
    for (const struct kvr_recent_item *it; (it = kvr_recent_next(&w->recent, &pos));) {
        if (it->kind != KVR_RECENT_ENDED || it->silent || it->expires < since + ttl)
            continue;
        keys[n % KVR_WIRE_ENDED_MAX] = it->key; /* oldest first: past the cap, wrap around */
        n++;
    }
    return n < KVR_WIRE_ENDED_MAX ? n : KVR_WIRE_ENDED_MAX;
}

/* The heartbeat as it stands, into w->buf. */
static kvr_status encode_heartbeat(struct kvr_worker *w)
{
    struct kvr_wire_heartbeat h = {.info = {.id = w->cfg->id,
                                            .block_size = w->cfg->engine.block_size,
                                            .capacity_blocks = w->capacity},
                                   .interval_ms = (uint32_t)(w->cfg->heartbeat_ns / KVR_NS_PER_MS),
                                   .draining = w->draining || w->leaving,
                                   .instance = w->instance,
                                   .started_ns = w->started_ns,
                                   .last_event_seq = w->event_seq};
    /* forwards not taken yet: routers judge no request it does not list never reached it while
     * some wait (a worker behind on its messages would hold them soon) */
    h.forwards_waiting = atomic_load(&w->taking) + (w->queued ? w->queued(w->queued_ctx) : 0);
    w->be->load(w, &h.info);
    h.draining = h.draining || h.info.draining; /* an adapter whose engine is down */
    h.inflight = malloc(((size_t)w->nreqs + 1) * sizeof *h.inflight);
    if (!h.inflight)
        return KVR_ERR_NOMEM;
    for (struct kvr_wreq *r = w->reqs; r; r = r->hh.next)
        h.inflight[h.ninflight++] = r->key;
    h.ended = malloc(KVR_WIRE_ENDED_MAX * sizeof *h.ended);
    /* the requests that ended since two beats ago, newest kept when over the cap; after a cut,
     * also those that ended from two beats before it: their done events may be lost with it */
    uint64_t now = kvr_now_ns(), since = now - 2 * w->cfg->heartbeat_ns;
    if (now < w->list_until && w->list_from < since)
        since = w->list_from;
    if (h.ended)
        h.nended = ended_since(w, since, h.ended);
    kvr_status st = kvr_wire_encode_heartbeat(&w->buf, &h);
    free(h.inflight);
    free(h.ended);
    return st;
}

void kvr_worker_heartbeat(struct kvr_worker *w)
{
    pthread_mutex_lock(&w->mu);
    atomic_store(&w->beat_wanted, false); /* this is the one asked for */
    if (!w->clashed && w->be)
        kvr__worker_emit(w, w->subj_hb, encode_heartbeat(w));
    kvr__worker_unlock(w);
}

void kvr__worker_beat_if_wanted(struct kvr_worker *w)
{
    if (!atomic_load_explicit(&w->beat_wanted, memory_order_relaxed) ||
        !atomic_exchange(&w->beat_wanted, false))
        return;
    /* cut: it would arrive late, listing stale requests; no engine: a beat asked for as the worker
     * stopped (kvr_worker_beat gave up), found by the link's last flush after the engine closed */
    if (!w->clashed && !w->cut && w->be)
        kvr__worker_emit(w, w->subj_hb, encode_heartbeat(w));
}

void kvr_worker_beat(struct kvr_worker *w)
{
    atomic_store(&w->beat_wanted, true);
    while (atomic_load(&w->beat_wanted) && !atomic_load(&w->stopping)) {
        if (pthread_mutex_trylock(&w->mu) == 0) {
            kvr__worker_unlock(w); /* sends it, unless another thread just did */
            return;
        }
        kvr_sleep_ns(KVR_NS_PER_MS); /* meanwhile whoever holds mu sends it as it lets go */
    }
}

void kvr_worker_set_draining(struct kvr_worker *w, bool refuse)
{
    pthread_mutex_lock(&w->mu);
    w->leaving = true;
    w->draining = w->draining || refuse;
    pthread_mutex_unlock(&w->mu);
}

void kvr_worker_on_hello(struct kvr_worker *w, const char *reply)
{
    pthread_mutex_lock(&w->mu);
    /* no engine: closing, nothing to answer for; never into a fleet's own subject */
    if (!w->clashed && w->be && kvr_reply_usable(reply, w->cfg->net.prefix))
        kvr__worker_emit(w, reply, encode_heartbeat(w));
    kvr__worker_unlock(w);
}

/* --- the id clash ---------------------------------------------------------------------------- */

bool kvr_worker_yields(uint64_t started_ns, uint64_t instance, uint64_t other_started_ns,
                       uint64_t other_instance)
{
    if (started_ns != other_started_ns)
        return started_ns > other_started_ns;
    return instance > other_instance;
}

/* Yield to the other instance: drop what is queued, publish nothing more, stop the threads. The
 * requests held are the other's too (it got the same forwards), so no done event frees them. */
static void yield(struct kvr_worker *w, const struct kvr_wire_heartbeat *h)
{
    kvr_log(KVR_LOG_ERROR, "worker_id_clash",
            "id=%" PRIu64 " instance=%016" PRIx64 " started_ns=%" PRIu64
            " other_instance=%016" PRIx64 " other_started_ns=%" PRIu64
            " action=yield requests_dropped=%u",
            w->cfg->id, w->instance, w->started_ns, h->instance, h->started_ns, w->nreqs);
    w->clashed = true;
    w->draining = true;
    w->stopping = true;
    kvr_outbox_free(&w->out);
    pthread_cond_broadcast(&w->cv);
}

void kvr_worker_on_heartbeat(struct kvr_worker *w, const void *data, size_t len)
{
    struct kvr_wire_heartbeat h;
    if (kvr_wire_decode_heartbeat(data, len, &h) != KVR_OK) {
        pthread_mutex_lock(&w->mu);
        w->c.bad_heartbeats++; /* on its own heartbeat subject: counted, dropped */
        pthread_mutex_unlock(&w->mu);
        return;
    }
    pthread_mutex_lock(&w->mu);
    if (h.info.id == w->cfg->id && h.instance != w->instance && !w->clashed) {
        if (kvr_worker_yields(w->started_ns, w->instance, h.started_ns, h.instance)) {
            yield(w, &h);
        } else if (w->clash_logged != h.instance) { /* the other yields: said once */
            w->clash_logged = h.instance;
            kvr_log(KVR_LOG_WARN, "worker_id_clash",
                    "id=%" PRIu64 " instance=%016" PRIx64 " other_instance=%016" PRIx64
                    " other_started_ns=%" PRIu64 " action=keep_serving",
                    w->cfg->id, w->instance, h.instance, h.started_ns);
        }
    }
    pthread_mutex_unlock(&w->mu);
    kvr_wire_heartbeat_free(&h);
}

bool kvr_worker_clashed(struct kvr_worker *w)
{
    return atomic_load(&w->clashed); /* the main thread asks every 20 ms: never behind mu */
}

/* --- connection cuts ------------------------------------------------------------------------- */

void kvr_worker_on_disconnected(struct kvr_worker *w)
{
    pthread_mutex_lock(&w->mu);
    w->cut = true;
    uint64_t now = kvr_now_ns();
    if (!w->cut_at) /* a second cut before the repeat: the repeat covers both */
        w->cut_at = now;
    if (now >= w->list_until) /* not still listing since an earlier cut */
        w->list_from = now - 2 * w->cfg->heartbeat_ns;
    w->list_until = UINT64_MAX;
    w->repeat_at = 0;
    pthread_mutex_unlock(&w->mu);
}

void kvr_worker_on_reconnected(struct kvr_worker *w)
{
    pthread_mutex_lock(&w->mu);
    w->cut = false;
    uint64_t now = kvr_now_ns();
    w->list_until = now + KVR_WK_LIST_AFTER_CUT_NS;
    if (w->cut_at) { /* clients reconnect too: give them a moment to subscribe again */
        w->repeat_at = now + KVR_WK_REPEAT_DELAY_NS;
        w->ask_at = now + KVR_WK_REPEAT_DELAY_NS / 2;
        kvr__worker_ask_rebind(w);
        pthread_cond_signal(&w->cv);
    }
    kvr__worker_unlock(w);
}

/* Queue one RebindAsk of keys[0..n) (n may be 0: nothing). */
static void ask(struct kvr_worker *w, uint64_t *keys, uint32_t n)
{
    if (!n)
        return;
    struct kvr_wire_rebind_ask a = {w->cfg->id, keys, n};
    kvr__worker_emit(w, w->subj_ask, kvr_wire_encode_rebind_ask(&w->buf, &a));
    w->c.rebind_asks++;
}

/* r's key into keys (a full batch asked for first) if r's client is still to hear from this
 * connection: a held stream (its next chunks, a first token that came after the asks included:
 * under allow_responses each needs the permission the rebind gives), or one the repeat covers. */
static void add_key(struct kvr_worker *w, const struct kvr_wreq *r, bool held, uint64_t *keys,
                    uint32_t *n)
{
    if (!held && !kvr__worker_repeats(r, w->cut_at))
        return;
    keys[(*n)++] = r->key;
    if (*n == KVR_WIRE_REBIND_MAX) {
        ask(w, keys, *n);
        *n = 0;
    }
}

void kvr__worker_ask_rebind(struct kvr_worker *w)
{
    uint64_t *keys = malloc(KVR_WIRE_REBIND_MAX * sizeof *keys);
    uint32_t n = 0;
    if (!keys || w->clashed) {
        w->c.dropped += !keys;
        free(keys);
        return;
    }
    for (struct kvr_wreq *r = w->kept; r; r = r->next)
        add_key(w, r, false, keys, &n);
    for (struct kvr_wreq *r = w->reqs; r; r = r->hh.next)
        add_key(w, r, true, keys, &n);
    ask(w, keys, n);
    free(keys);
}

/*
 * Under mu: the client resent key, which a router knew as ended here (or, after a forged done, a
 * stream still held): its stream again, from position 0, if it is still here whole and was not
 * repeated for a resend in the last KVR_WK_RESEND_GAP_NS nor KVR_WK_RESEND_MAX times already (so
 * a client resending in a loop costs at most that many copies of the stream, one a second). Only to
 * the reply the request came with, never to the rebind's.
 */
static void repeat_for_resend(struct kvr_worker *w, struct kvr_wreq *r, uint64_t now)
{
    if (!r || w->clashed || !kvr__worker_whole(r) || (!r->ended_at && !r->ntoks) ||
        r->resends >= KVR_WK_RESEND_MAX ||
        (r->resent_at && now - r->resent_at < KVR_WK_RESEND_GAP_NS)) {
        w->c.resend_refused++;
        return;
    }
    r->resent_at = now;
    r->resends++;
    kvr_log(KVR_LOG_DEBUG, "stream_repeated_for_resend", "key=%016" PRIx64 " tokens=%u ended=%s",
            r->key, r->ntoks, r->ended_at ? "true" : "false");
    kvr__worker_repeat(w, r);
    w->c.resend_repeats++;
}

void kvr_worker_on_rebind(struct kvr_worker *w, const void *data, size_t len)
{
    uint64_t key;
    bool again;
    kvr_status st = kvr_wire_decode_worker_rebind(data, len, &key, &again);
    uint64_t now = kvr_now_ns();
    pthread_mutex_lock(&w->mu);
    struct kvr_wreq *held = NULL, *kept = NULL;
    if (st == KVR_OK) {
        HASH_FIND(hh, w->reqs, &key, sizeof key, held);
        if (!held)
            HASH_FIND(hk, w->kept_by, &key, sizeof key, kept);
    }
    if (held || (st == KVR_OK && kvr_recent_find(&w->recent, key, now))) /* held, or ended */
        w->c.rebinds++;
    else
        w->c.rebinds_bad++; /* harmless: the server granted a right for a stream not here */
    if (st == KVR_OK && again)
        repeat_for_resend(w, held ? held : kept, now);
    kvr__worker_unlock(w);
}

/* --- the stop ------------------------------------------------------------------------------- */

uint32_t kvr_worker_held(struct kvr_worker *w)
{
    pthread_mutex_lock(&w->mu);
    /* a cut whose repeat is still to come counts too: what its streams sent last may be lost in
     * it, and what ended meanwhile waits in the connection's buffer */
    uint32_t n = w->nreqs + (w->cut_at && !w->clashed);
    pthread_mutex_unlock(&w->mu);
    return n;
}

void kvr_worker_stop(struct kvr_worker *w)
{
    pthread_mutex_lock(&w->mu);
    w->stopping = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

bool kvr_worker_stopping(struct kvr_worker *w)
{
    return atomic_load(&w->stopping); /* the heartbeat thread asks often: never behind mu */
}
