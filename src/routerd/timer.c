/*
 * The router's housekeeping.
 */
#define _DEFAULT_SOURCE
#include "timer.h"

#include <stdatomic.h>

#include <inttypes.h>

#include "clock.h"
#include "log.h"

#include "fleet.h"
#include "intake.h"
#include "place.h"
#include "sync.h"

/* The time a handler's queue is judged at, from what it applied up to heard (0: cannot tell):
 * never later than now, never more than KVR_TIMER_BEHIND_MAX_NS before it (a handler stuck for
 * good: judged by the clock). */
static uint64_t judged_at(uint64_t now, uint64_t heard)
{
    if (!heard || heard >= now)
        return now;
    return now - heard > KVR_TIMER_BEHIND_MAX_NS ? now - KVR_TIMER_BEHIND_MAX_NS : heard;
}

/* Under mu: how far behind the worker events' handler runs; logged once per episode. */
static uint64_t events_heard(struct kvr_rd *rd, uint64_t now, uint64_t heard)
{
    heard = judged_at(now, heard);
    uint64_t behind = now - heard;
    rd->events_behind_ns = behind;
    rd->events_heard_ns = heard;
    if (behind > rd->events_behind_max_ns)
        rd->events_behind_max_ns = behind;
    if (behind >= KVR_TIMER_BEHIND_NS && !rd->events_behind) {
        rd->events_behind = true;
        kvr_log(KVR_LOG_WARN, "events_behind",
                "ms=%" PRIu64 " why=\"worker events wait in the router's queue: workers are "
                "judged by what was applied\"",
                (uint64_t)(behind / KVR_NS_PER_MS));
    } else if (behind < KVR_TIMER_BEHIND_NS / 2 && rd->events_behind) {
        rd->events_behind = false;
        kvr_log(KVR_LOG_INFO, "events_caught_up", "max_ms=%" PRIu64,
                (uint64_t)(rd->events_behind_max_ns / KVR_NS_PER_MS));
        rd->events_behind_max_ns = 0;
    }
    return heard;
}

/* Under mu, events connection up: ask every worker to announce itself, when due. A router that
 * starts after its workers (or missed them while cut off) would otherwise know a worker only from
 * its next periodic heartbeat (--heartbeat-ms); each worker answers with one at once. */
static void announce(struct kvr_rd *rd, uint64_t now)
{
    if (!rd->announces_left || now < rd->announce_at)
        return;
    rd->announces_left--;
    rd->announce_at = now + KVR_TIMER_ANNOUNCE_GAP_NS;
    char subject[560];
    snprintf(subject, sizeof subject, "%sannounce", rd->subj_worker);
    kvr_outbox_add(&rd->out, subject, "", 0, KVR_OK);
    rd->announces++;
}

void kvr_timer_announce(struct kvr_rd *rd, uint64_t now)
{
    rd->announces_left = KVR_TIMER_ANNOUNCES;
    rd->announce_at = now;
    announce(rd, now);
}

void kvr_timer_tick(struct kvr_rd *rd, uint64_t now, bool events_up, bool events_cut)
{
    kvr_timer_tick_seen(rd, now, &(struct kvr_timer_seen){events_up, events_cut, 0, 0});
}

/*
 * Under mu, events connection up: the catch-up from a peer that is due. After a cut or a stall
 * (resync_at set by the caller), or for KV events a worker numbered that never came (kv_gap):
 * those wait 250 ms for the peers' view to settle, at most one per 10 s, and are called off when
 * every skipped event came late meanwhile (a worker's threads publish out of order). A snapshot
 * asked covers every gap so far; with nobody to ask, the gap stays counted and is let go.
 */
static void catch_up(struct kvr_rd *rd, uint64_t now)
{
    if (rd->kv_gap && !rd->resync_at &&
        (!rd->kv_resync_ns || now - rd->kv_resync_ns >= KVR_TIMER_KV_RESYNC_NS)) {
        rd->kv_resync_ns = now;
        rd->resync_at = now + KVR_TIMER_CATCH_UP_NS;
        rd->resync_kv = true;
    }
    if (!rd->resync_at || now < rd->resync_at)
        return;
    rd->resync_at = 0;
    if (rd->resync_kv && !rd->kvseq.open) {
        rd->kv_gap = false; /* they all came, late */
        return;
    }
    bool asked = kvr_sync_resync(rd, rd->resync_kv ? "kv events missed" : "connection back");
    if (!asked && HASH_COUNT(rd->fleet->peers) && rd->catch_up_tries < KVR_TIMER_CATCH_UP_TRIES) {
        /* peers, but none to ask now: after a server node's restart each may be catching up
         * itself (not serving) or not heard again yet; given up at once, a router whose node
         * restarted kept 1 index entry for good where its peers had 129 (a clean-clone CI run) */
        rd->catch_up_tries++;
        rd->resync_at = now + KVR_TIMER_CATCH_UP_NS;
        return;
    }
    rd->catch_up_tries = 0;
    if (!asked && !rd->resync_kv && HASH_COUNT(rd->fleet->peers))
        kvr_log(KVR_LOG_WARN, "catch_up_skipped",
                "why=\"no peer served a snapshot for 10 s after the connection came back: the "
                "index fills in from KV events\"");
    if (rd->resync_kv)
        kvr_log(KVR_LOG_WARN, "kv_events_missed",
                "missed=%" PRIu64 " open=%" PRIu64 " gaps=%" PRIu64 " action=\"%s\"",
                rd->kvseq.missed, rd->kvseq.open, rd->kvseq.gaps,
                asked ? "snapshot from a peer" : "none: no peer to take a snapshot from");
    if (asked || rd->resync_kv) {
        rd->kv_gap = false;
        kvr_kvseq_settle(&rd->kvseq);
    }
    rd->kv_resyncs += asked && rd->resync_kv;
}

void kvr_timer_tick_seen(struct kvr_rd *rd, uint64_t now, const struct kvr_timer_seen *seen)
{
    bool events_up = seen->events_up, events_cut = seen->events_cut;
    pthread_mutex_lock(&rd->mu);
    uint64_t heard = events_heard(rd, now, seen->events_heard);
    if (rd->fleet) { /* 0 stays 0: peers are then judged at the clock of each question */
        uint64_t g = judged_at(now, seen->gossip_heard);
        rd->fleet->heard_ns = seen->gossip_heard ? g : 0;
        rd->fleet->behind_ns = now - g;
    }
    atomic_store_explicit(&rd->alive_ns, now, memory_order_relaxed);
    uint64_t late = rd->last_tick && now > rd->last_tick ? now - rd->last_tick : 0;
    rd->last_tick = now;
    if (late > KVR_TIMER_STALL_NS + rd->cfg->tick_ns) {
        /* stopped for a while: what it missed is in its sockets, not lost, but no worker should
         * be judged by a silence that was the router's own; catch up from a peer too */
        rd->stalls++;
        kvr_router_excuse_silence(rd->core, now);
        events_cut = true;
        kvr_log(KVR_LOG_WARN, "router_stalled", "ms=%" PRIu64, (uint64_t)(late / KVR_NS_PER_MS));
    }
    if (!events_up) {
        rd->blind = true; /* no worker can be heard: judge none of them meanwhile */
        /* but the queue's timeouts and deadlines run on its own clock: a request waits no longer
         * for a worker because this router cannot hear them (it was answered only once the
         * events came back) */
        kvr_router_tick_queue(rd->core, now);
    } else {
        if (rd->blind || events_cut) {
            rd->blind = false;
            rd->kv_cut_ns = now; /* what came before the cut is not replayed over what it lost */
            rd->resync_at = now + KVR_TIMER_CATCH_UP_NS;
            kvr_timer_announce(rd, now); /* workers may have come meanwhile */
            rd->resync_kv = false;
            kvr_router_excuse_silence(rd->core, now);
        }
        catch_up(rd, now);
        announce(rd, now);
        kvr_router_tick_heard(rd->core, now, heard);
        kvr_intake_expire_bookings(rd, now);
    }
    kvr_pending_tick(&rd->pend); /* forwards lost to the connection go again, blind or not */
    kvr_place_settle(rd);
    kvr_sync_tick(rd, now);
    kvr_fleet_tick(rd, now); /* hellos even when blind: its requests are still in good hands */
    kvr_recent_expire(&rd->recent, now);
    kvr_recent_expire(&rd->early_cancels, now);
    kvr_recent_expire(&rd->early_dones, now);
    pthread_mutex_unlock(&rd->mu);
    kvr_rd_flush(rd);
}
