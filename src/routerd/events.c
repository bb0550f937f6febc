/*
 * Worker events.
 */
#define _DEFAULT_SOURCE
#include "events.h"

#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "fleet.h"
#include "log.h"
#include "stats.h"
#include "place.h"
#include "rebind.h"

/* Under mu: apply one KV event; a first application is also noted (kvseq) and logged (kvlog). */
static kvr_status apply_kv(struct kvr_rd *rd, uint64_t wid, const void *data, size_t len,
                           bool again)
{
    struct kvr_wire_kv e;
    kvr_status st = kvr_wire_decode_kv(data, len, &e);
    if (st != KVR_OK)
        return st;
    if (e.worker_id != wid)
        st = KVR_ERR_INVALID; /* a worker speaks for itself only */
    else if (e.kind == KVR_WIRE_STORED)
        st = kvr_router_kv_stored(rd->core, wid, e.has_parent ? &e.parent : NULL, e.blocks,
                                  e.nblocks);
    else if (e.kind == KVR_WIRE_REMOVED)
        st = kvr_router_kv_removed(rd->core, wid, e.ids, e.nids);
    else
        st = kvr_router_kv_cleared(rd->core, wid);
    /* numbered by a known worker, applied or not (a stored run whose parent this index
     * evicted is skipped, yet came): a jump is events missed on the way (timer.c) */
    if (st != KVR_ERR_INVALID && st != KVR_ERR_UNKNOWN_WORKER && !again) {
        if (kvr_kvseq_note(&rd->kvseq, wid, e.event_seq))
            rd->kv_gap = true;
        if (rd->cfg->gossip && rd->cfg->kv_replay_ns) /* else no resync ever replays it */
            kvr_kvlog_add(&rd->kvlog, wid, e.event_seq, kvr_now_ns(), data, len);
    }
    kvr_wire_kv_free(&e);
    return st;
}

kvr_status kvr_events_apply_kv(struct kvr_rd *rd, uint64_t wid, const void *data, size_t len)
{
    return apply_kv(rd, wid, data, len, false);
}

kvr_status kvr_events_apply_kv_again(struct kvr_rd *rd, uint64_t wid, const void *data, size_t len)
{
    return apply_kv(rd, wid, data, len, true);
}

static void log_join(const struct kvr_rd *rd, uint64_t wid, const struct kvr_wire_heartbeat *h,
                     kvr_status st, bool known, bool was_approximate)
{
    if (st == KVR_OK && h->info.approximate && !was_approximate && !rd->cfg->core.approximate)
        kvr_log(KVR_LOG_WARN, "worker_without_kv_events",
                "worker=%" PRIu64 " action=\"its engine publishes no KV events: this router "
                "learns its cache from its own decisions (approximate mode for it)\" "
                "hint=\"start the engine with KV events (docs/engines.md)\"",
                wid);
    else if (st == KVR_OK && !h->info.approximate && was_approximate && known)
        kvr_log(KVR_LOG_INFO, "worker_kv_events_back", "worker=%" PRIu64, wid);
    if (st == KVR_OK && !known)
        kvr_log(KVR_LOG_INFO, "worker_joined",
                "worker=%" PRIu64 " block_size=%u capacity_blocks=%" PRIu64, wid,
                h->info.block_size, h->info.capacity_blocks);
    else if (st == KVR_ERR_BLOCK_SIZE && !known)
        kvr_log(KVR_LOG_ERROR, "worker_refused",
                "worker=%" PRIu64 " block_size=%u router_block_size=%u", wid, h->info.block_size,
                rd->cfg->core.block_size);
}

/*
 * Under mu: whether an event of worker wid about pending request p is stale (counted): p is
 * placed on another worker now, or on none while it waits to be placed again. It comes from a
 * copy stopped in favour of another worker's, or from a worker the request left that found the
 * forward in its queue late.
 */
static bool stale(struct kvr_rd *rd, const struct kvr_pending *p, uint64_t wid)
{
    if (!p || p->worker_id == wid || (p->origin && p->queued_notice))
        return false; /* (a peer's queued request: its worker's events may beat its decision) */
    rd->n.stale_events++;
    return true;
}

/* Under mu: a tokens event t of worker wid (decoded, its worker id checked). */
static kvr_status apply_tokens(struct kvr_rd *rd, uint64_t wid, const struct kvr_wire_tokens *t,
                               uint64_t now)
{
    struct kvr_pending *p = kvr_pending_find(&rd->pend, t->key);
    if (stale(rd, p, wid)) /* its bytes must not go as if it started */
        return KVR_OK;
    if (t->kind != KVR_WIRE_PREFILL_DONE)
        return kvr_router_output_block(rd->core, t->key, now);
    if (p) { /* it started: it will not be placed again, nor expire as a booking */
        kvr_pending_started(p);
        p->book_expires = 0;
    }
    return kvr_router_prefill_done(rd->core, t->key, now);
}

static kvr_status tokens(struct kvr_rd *rd, uint64_t wid, const void *data, size_t len,
                         uint64_t now)
{
    struct kvr_wire_tokens t;
    kvr_status st = kvr_wire_decode_tokens(data, len, &t);
    if (st != KVR_OK)
        return st;
    if (t.worker_id != wid)
        return KVR_ERR_INVALID;
    return apply_tokens(rd, wid, &t, now);
}

/* Under mu: worker wid ended request key with status, having streamed output tokens (its done
 * event; or its heartbeat's list of ended requests when the event was lost: output 0, not known).
 */
static kvr_status end_request(struct kvr_rd *rd, uint64_t wid, uint64_t key, kvr_status status,
                              uint32_t output, uint64_t now)
{
    struct kvr_pending *p = kvr_pending_find(&rd->pend, key);
    if (stale(rd, p, wid)) /* ended here, it would be lost while the core still holds it */
        return KVR_OK;
    if (p) {
        kvr_rebind_keep(rd, p, now); /* its final may be repeated after a cut */
        kvr_pending_drop(&rd->pend, p);
    }
    /* its worker sent the client its final chunk: a resend from now on is ignored. Not so when it
     * was stopped in favour of another worker's copy (ERR_SUPERSEDED), whose decision this router
     * has not heard yet: that one is still on (its decision arrives as new); after a worker's
     * refusal (shutting down, out of memory, its engine's error) its client was told and may try
     * again, 3 s later: one sooner crossed the error (kvr_fleet_answered). Nor when the fleet
     * had answered it with an error already (its worker written off while cut off, the done
     * sent before it heard the stop and flushed when its connection came back): that error was
     * its client's final, and the same request 3 s later a new attempt, not a resend to ignore.
     * The end of a request this router did not hold and knows no end of (a peer's whose decision
     * is still on its way, or a key made up by whoever may publish on this worker's subjects) is
     * remembered apart: a flood of dones for made-up keys evicts only its like, never the ends of
     * the requests this router held (whose resends would be generated a second time) */
    struct kvr_recent *t = &rd->recent;
    const struct kvr_recent_item *r = p ? NULL : kvr_rd_ended(rd, key, now, &t);
    bool answered = r && r->kind == KVR_RECENT_FAILED;
    if (!answered && status == KVR_OK)
        kvr_recent_put(t, key, KVR_RECENT_ENDED, KVR_OK, false, now);
    else if (!answered && status != KVR_ERR_SUPERSEDED) /* cancelled, deadline: as ended */
        kvr_fleet_answered_in(t, key, status, now);
    kvr_log(KVR_LOG_DEBUG, "request_ended",
            "key=%016" PRIx64 " worker=%" PRIu64 " status=%d known=%s", key, wid, (int)status,
            p ? "true" : "false");
    if (status == KVR_OK && output) /* what its max_tokens was likely to mean */
        return kvr_router_finished(rd->core, key, now, output);
    return kvr_router_done_at(rd->core, key, now);
}

/* Freed load may place waiting requests; workers are judged at what the timer last found
 * applied, not at now: heartbeats may still wait behind these events. */
static void place_waiting(struct kvr_rd *rd, uint64_t now)
{
    if (kvr_router_queue_len(rd->core))
        kvr_router_tick_heard(rd->core, now, rd->events_heard_ns);
}

/* Under mu: end_request, then what the freed load lets go. */
static kvr_status ended(struct kvr_rd *rd, uint64_t wid, uint64_t key, kvr_status status,
                        uint32_t output, uint64_t now)
{
    kvr_status st = end_request(rd, wid, key, status, output, now);
    place_waiting(rd, now);
    return st;
}

static kvr_status done(struct kvr_rd *rd, uint64_t wid, const void *data, size_t len, uint64_t now)
{
    struct kvr_wire_done d;
    kvr_status st = kvr_wire_decode_done(data, len, &d);
    if (st != KVR_OK)
        return st;
    if (d.worker_id != wid)
        return KVR_ERR_INVALID;
    return ended(rd, wid, d.key, (kvr_status)d.status, d.output_tokens, now);
}

/* Under mu: a batch of lifecycle events of wid, applied in order as if each had come alone; the
 * whole batch is refused when any of it does not decode or names another worker. */
static kvr_status batch(struct kvr_rd *rd, uint64_t wid, const void *data, size_t len, uint64_t now)
{
    struct kvr_wire_batch b;
    kvr_status st = kvr_wire_decode_batch(data, len, &b);
    if (st != KVR_OK)
        return st;
    if (b.worker_id != wid) {
        kvr_wire_batch_free(&b);
        return KVR_ERR_INVALID;
    }
    bool freed = false;
    for (uint32_t i = 0; i < b.n; i++) {
        const struct kvr_wire_event *e = &b.ev[i];
        if (e->kind == KVR_WIRE_EV_TOKENS) {
            apply_tokens(rd, wid, &e->u.tokens, now);
        } else {
            end_request(rd, wid, e->u.done.key, (kvr_status)e->u.done.status,
                        e->u.done.output_tokens, now);
            freed = true;
        }
    }
    if (freed) /* once for the batch: its dones are one moment's */
        place_waiting(rd, now);
    rd->n.event_batches++;
    rd->n.batched_events += b.n;
    kvr_wire_batch_free(&b);
    return KVR_OK;
}

/* Under mu: the requests a heartbeat of wid lists as ended whose done this router never heard
 * (lost while a connection was cut): ended now, so none is taken for "never reached its worker". */
static void ended_listed(struct kvr_rd *rd, uint64_t wid, const uint64_t *keys, uint32_t n,
                         uint64_t now)
{
    for (uint32_t i = 0; i < n; i++) {
        const struct kvr_pending *p = kvr_pending_find(&rd->pend, keys[i]);
        if (p && p->worker_id == wid) {
            rd->n.ends_from_heartbeats++;
            ended(rd, wid, keys[i], KVR_OK, 0, now);
        }
    }
}

/*
 * A heartbeat decoded into *h, its held keys sorted (kvr_router_reconcile then needs no sort of
 * its own): the work that needs no state, done before the mutex is taken. KVR_OK, or why not.
 */
static kvr_status heartbeat_decode(const void *data, size_t len, struct kvr_wire_heartbeat *h)
{
    kvr_status st = kvr_wire_decode_heartbeat(data, len, h);
    if (st == KVR_OK)
        kvr_sort_u64(h->inflight, h->ninflight);
    return st;
}

/* Under mu: worker wid's heartbeat h (decoded with status st; freed here). */
static kvr_status heartbeat(struct kvr_rd *rd, uint64_t wid, struct kvr_wire_heartbeat *hb,
                            kvr_status st, uint64_t now)
{
    if (st != KVR_OK)
        return st;
    struct kvr_wire_heartbeat h = *hb;
    if (h.info.id != wid) {
        kvr_wire_heartbeat_free(&h);
        return KVR_ERR_INVALID;
    }
    /* a worker is lost after 3.2 of its intervals, within bounds: an interval from the wire
     * neither keeps a phantom worker for good nor drops a live one at once */
    uint64_t lo = rd->cfg->heartbeat_min_ns / KVR_NS_PER_MS,
             hi = rd->cfg->heartbeat_max_ns / KVR_NS_PER_MS;
    uint64_t ms = h.interval_ms < lo ? lo : h.interval_ms > hi ? hi : h.interval_ms;
    h.info.timeout_ns = h.interval_ms ? ms * 3200000ull : 0;
    h.info.draining = h.draining;
    bool known = kvr_router_worker_load(rd->core, wid, NULL, NULL, NULL) == KVR_OK;
    bool was_approximate = kvr_router_worker_approximate(rd->core, wid);
    st = kvr_router_worker_seen(rd->core, &h.info, now);
    if (st == KVR_OK) {
        kvr_rebind_worker_seen(rd, wid, h.instance, now);
        if (h.interval_ms && ms > rd->hb_interval_ms)
            rd->hb_interval_ms = (uint32_t)ms;
        ended_listed(rd, wid, h.ended, h.nended, now);
        /* judged by the interval within bounds, as for its silence (a 1 ms interval, real or
         * forged, gave a forward still on its way 2 ms before it was placed again) */
        kvr_fleet_reconcile(rd, wid, h.inflight, h.ninflight, h.interval_ms ? (uint32_t)ms : 0,
                            h.forwards_waiting, now);
        /* its last KV events lost show only here (nothing numbered comes after them); KV events
         * held for a snapshot are noted when replayed, so none is announced meanwhile */
        if (!rd->holding && kvr_kvseq_announce(&rd->kvseq, wid, h.last_event_seq))
            rd->kv_gap = true;
    }
    log_join(rd, wid, &h, st, known, was_approximate);
    kvr_wire_heartbeat_free(&h);
    return st;
}

/* Under mu: one worker event (a heartbeat comes decoded: heartbeat_decode). */
static kvr_status apply(struct kvr_rd *rd, uint64_t wid, const char *kind, const void *data,
                        size_t len)
{
    uint64_t now = kvr_now_ns();
    if (!strcmp(kind, "kv"))
        return kvr_rd_hold(rd, wid, data, len) ? KVR_OK : kvr_events_apply_kv(rd, wid, data, len);
    if (!strcmp(kind, "tokens"))
        return tokens(rd, wid, data, len, now);
    if (!strcmp(kind, "done"))
        return done(rd, wid, data, len, now);
    if (!strcmp(kind, "batch"))
        return batch(rd, wid, data, len, now);
    if (!strcmp(kind, "rebind"))
        return kvr_rebind_on_ask(rd, wid, data, len, now);
    return KVR_ERR_MALFORMED;
}

bool kvr_events_bad(kvr_status st)
{
    return st == KVR_ERR_MALFORMED || st == KVR_ERR_INVALID || st == KVR_ERR_TOO_LARGE;
}

bool kvr_events_parse_subject(const char *ev_prefix, const char *subject, uint64_t *worker_id,
                              const char **kind)
{
    size_t k = strlen(ev_prefix);
    if (strncmp(subject, ev_prefix, k))
        return false;
    const char *start = subject + k, *dot = strchr(start, '.');
    if (!dot || strchr(dot + 1, '.') || !dot[1])
        return false; /* exactly <prefix>.<ns>.ev.<id>.<kind>: no token more, none less */
    size_t n = (size_t)(dot - start);
    char digits[24];
    if (n == 0 || n >= sizeof digits || start[0] == '0')
        return false;
    for (size_t i = 0; i < n; i++)
        if (start[i] < '0' || start[i] > '9')
            return false;
    memcpy(digits, start, n);
    digits[n] = 0;
    char *end;
    unsigned long long id = strtoull(digits, &end, 10);
    if (*end || id == 0 || id == ULLONG_MAX)
        return false;
    *worker_id = id;
    *kind = dot + 1;
    return true;
}

void kvr_events_on_message(struct kvr_rd *rd, const char *subject, const void *data, size_t len)
{
    uint64_t wid = 0;
    const char *kind = NULL;
    kvr_status st = KVR_ERR_MALFORMED, hb_st = KVR_OK;
    bool counted = false;
    bool ours = kvr_events_parse_subject(rd->subj_ev, subject, &wid, &kind); /* no state */
    bool hb = ours && !strcmp(kind, "hb");
    struct kvr_wire_heartbeat h;
    if (hb) /* a heartbeat may list 65,536 keys: decoded and sorted before the mutex */
        hb_st = heartbeat_decode(data, len, &h);
    pthread_mutex_lock(&rd->mu);
    if (ours) {
        st = hb ? heartbeat(rd, wid, &h, hb_st, kvr_now_ns()) : apply(rd, wid, kind, data, len);
        kvr_place_settle(rd);
    }
    counted = kvr_events_bad(st);
    rd->ev_errors += counted;
    /* whoever may publish on the events subjects could write a line per message */
    uint64_t left = 0;
    bool logged = counted && kvr_log_gate_pass(&rd->event_log, &left);
    kvr_rd_unlock_flush(rd);
    if (logged) {
        char safe[160];
        kvr_log(KVR_LOG_WARN, "event_dropped", "subject=\"%s\" error=\"%s\" suppressed=%" PRIu64,
                kvr_log_safe(safe, sizeof safe, subject), kvr_status_str(st), left);
    }
}
