/*
 * The router's housekeeping.
 */
#include "timer.h"

#include "fleet.h"
#include "intake.h"
#include "place.h"
#include "sync.h"

void kvr_timer_tick(struct kvr_rd *rd, uint64_t now, bool events_up, bool events_cut)
{
    pthread_mutex_lock(&rd->mu);
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
