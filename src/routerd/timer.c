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

void kvr_timer_tick(struct kvr_rd *rd, uint64_t now, bool events_up, bool events_cut)
{
    pthread_mutex_lock(&rd->mu);
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
    } else {
        if (rd->blind || events_cut) {
            rd->blind = false;
            rd->resync_at = now + KVR_TIMER_CATCH_UP_NS;
            kvr_router_excuse_silence(rd->core, now);
        }
        if (rd->resync_at && now >= rd->resync_at) {
            rd->resync_at = 0;
            kvr_sync_resync(rd);
        }
        kvr_router_tick(rd->core, now);
        kvr_intake_expire_bookings(rd, now);
        kvr_place_settle(rd);
    }
    kvr_sync_tick(rd, now);
    kvr_fleet_tick(rd, now); /* hellos even when blind: its requests are still in good hands */
    kvr_recent_expire(&rd->recent, now);
    pthread_mutex_unlock(&rd->mu);
    kvr_rd_flush(rd);
}
