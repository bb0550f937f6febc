/*
 * The router daemon's shared state (struct kvr_rd): the routing core, the pending requests, the
 * outbox and the endpoints' reply counters, all behind one mutex, which every handler takes
 * around its whole read-decide-book step and releases before publishing (kvr_rd_flush sends the
 * outbox through the sink: NATS in the daemon, a recorder in unit tests and fuzz targets).
 *
 * The core reports outcomes (a queued request placed or rejected, a request failed or expired)
 * through a callback from inside the call that caused them, and must not be called back from
 * there. So the callback only records them (kvr_rd.deferred); place.c handles them once the core
 * call has returned (kvr_place_settle). Nothing calls the core from inside a core callback.
 *
 * Threads: nats.c's delivery threads and the timer thread; every field marked "under mu" is read
 * and written with mu held.
 */
#ifndef KVR_RD_STATE_H
#define KVR_RD_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "buf.h"
#include "codec.h"
#include "config.h"
#include "kept.h"
#include "kvr/router.h"
#include "outbox.h"
#include "pending.h"
#include "kvlog.h"
#include "kvseq.h"
#include "recent.h"
#include "reply.h"

struct kvr_fleet;          /* fleet.h: replication */
struct kvr_rd_incarnation; /* rebind.c: a worker's process */

/* What the daemon counts about its clients' requests beyond the endpoints' replies. */
struct kvr_rd_counts {
    uint64_t resends_after_end;    /* resends of requests that had ended (a repeat asked, or not) */
    uint64_t resends_worker_gone;  /* ... whose worker had left: answered ERR_WORKER_LOST */
    uint64_t resends_after_error;  /* resends that crossed an error answer (ignored) */
    uint64_t repeats_asked;        /* ... for which the worker was asked to repeat the stream */
    uint64_t cancels;              /* CancelRequests received */
    uint64_t cancels_sent;         /* WorkerCancels sent for them */
    uint64_t cancelled_queued;     /* cancelled while queued here */
    uint64_t cancelled_early;      /* answered "cancelled" on arrival: the cancel came first */
    uint64_t cancels_bad;          /* CancelRequests that did not decode */
    uint64_t conflicts;            /* two decisions for one request: the earlier stood */
    uint64_t superseded;           /* ... and this router's was the later one */
    uint64_t stale_events;         /* events from a worker the request is not booked on */
    uint64_t ends_from_heartbeats; /* requests ended by a heartbeat's list: their done was lost */
    uint64_t event_batches;        /* EventBatches applied */
    uint64_t batched_events;       /* the lifecycle events they carried */
    uint64_t forwards_failed;      /* forwards that could not be published */
    uint64_t bookings_expired;     /* booked selects never started */
    uint64_t rebinds_sent;         /* WorkerRebinds sent for a worker's RebindAsk */
    uint64_t rebinds_unknown;      /* keys it listed not booked on it here: skipped */
    uint64_t answers_refused;      /* $SRV and digest requests whose reply subject is the fleet's
                                      own or a system one (kvr_reply_usable): not answered */
};

/* A core event recorded by the callback, handled after the core call (kvr_place_settle). */
struct kvr_rd_deferred {
    enum kvr_event_kind kind; /* */
    uint64_t request_id;      /* */
    uint64_t worker_id;       /* */
    kvr_status status;        /* */
    uint32_t overlap_blocks;  /* PLACED: the decision's cached prefix */
};

/* A KV event held back while a snapshot is applied (replayed after it, in order). */
struct kvr_rd_held {
    uint64_t worker_id;
    uint8_t *data; /* owned */
    size_t len;
};

/* KV events held during a snapshot, at most, and their bytes; past either, applied at once */
#define KVR_RD_HELD_MAX       (1u << 20)
#define KVR_RD_HELD_BYTES_MAX (256u << 20)

#define KVR_RD_EARLY_CANCELS 16384u /* cancels before their request remembered, at most */
/* dones for requests this router did not hold remembered, at most: as many as the core keeps
 * events before their decision (early.h) */
#define KVR_RD_EARLY_DONES 65536u

struct kvr_rd {
    const struct kvr_rd_config *cfg; /* must outlive the state */
    pthread_mutex_t mu;              /* */
    pthread_mutex_t snap_mu;         /* held while a snapshot is served (sync.c): its walks use
                                        each list's one cursor, so one snapshot at a time,
                                        whichever thread asks; taken before mu */
    struct kvr_sink sink;            /* where kvr_rd_flush publishes */
    /* a forward kvr_rd_flush could not publish (under mu; NULL: ignored): place.c's */
    void (*forward_failed)(struct kvr_rd *rd, uint64_t key, kvr_status st);
    struct kvr_router *core;          /* under mu */
    struct kvr_pending_table pend;    /* under mu */
    struct kvr_recent recent;         /* requests that ended or failed; under mu */
    struct kvr_recent early_cancels;  /* cancels before their request, under mu: apart, so a
                                         flood of cancels (anyone's to send, each router hears
                                         all) evicts only its like, never what ended */
    struct kvr_recent early_dones;    /* dones (and refusals) of requests this router did not
                                         hold: a peer's whose decision is still on its way, or
                                         made up; under mu: apart from `recent`, so a flood of
                                         dones for made-up keys evicts only its like */
    struct kvr_rd_counts n;           /* under mu */
    uint64_t max_request_bytes;       /* a request its forward cannot carry is refused (0: no
                                         check); from the connection's max_payload */
    struct kvr_outbox out;            /* under mu */
    struct kvr_turns turns;           /* its batches go out in the order they left mu */
    struct kvr_buf buf;               /* encoding scratch, under mu */
    struct kvr_reply generate;        /* the generate endpoint's answers and counters, under mu */
    struct kvr_reply select;          /* the select endpoint's, under mu */
    struct kvr_log_gate cancel_log;   /* cancel_dropped lines (anyone's to cause), under mu */
    struct kvr_log_gate event_log;    /* event_dropped lines, under mu */
    struct kvr_log_gate gossip_log;   /* gossip_dropped lines, under mu */
    struct kvr_wire_limits lim;       /* decoding limits (constant after init) */
    struct kvr_fleet *fleet;          /* replication (fleet.c), under mu */
    struct kvr_kept kept;             /* ended requests' reply subjects (rebinds), under mu */
    struct kvr_rd_incarnation *procs; /* the workers' processes, by id (rebind.c), under mu */
    uint32_t nprocs;                  /* */
    struct kvr_rd_deferred *deferred; /* core events to handle, under mu */
    uint32_t ndeferred, capdeferred;  /* */
    uint64_t deferred_lost;           /* core events lost to memory shortage (logged) */
    struct kvr_rd_held *held;         /* KV events held during a snapshot, under mu */
    uint32_t nheld, capheld;          /* */
    size_t held_bytes;                /* their bytes */
    bool holding;                     /* a snapshot is being applied: hold KV events */
    uint64_t held_dropped;            /* KV events applied at once: the hold was full */
    struct kvr_kvlog kvlog;           /* the last moment's KV events applied, under mu: a resync
                                         whose index replaces this one applies them again */
    uint64_t kv_cut_ns;               /* the events connection came back from a cut (or the
                                         router from a stall) then: none applied before is
                                         applied again (timer thread, under mu) */
    uint64_t ev_errors;               /* malformed or unknown worker events, under mu */
    uint64_t placed_again;            /* requests placed again (lost on the way), under mu */
    uint32_t hb_interval_ms;          /* the longest heartbeat interval announced, under mu */
    bool serving;                     /* it takes requests (joined the queue group), under mu */
    bool blind;                       /* the events connection is down (timer thread only) */
    uint64_t last_tick;               /* the previous tick (timer thread only) */
    uint64_t stalls;                  /* ticks far later than due: the router was stopped */
    _Atomic uint64_t alive_ns;        /* the last tick that got the mutex (monotonic ns; read
                                         without it by the readiness probe) */
    uint64_t resync_at;               /* catch up from a peer then (0: no; timer thread only) */
    uint32_t catch_up_tries;          /* catch-ups that found no peer to ask, in a row */
    uint32_t announces_left;          /* asks to announce still to send, under mu */
    uint64_t announce_at;             /* the next one's time, under mu */
    uint64_t announces;               /* asks sent, under mu */
    bool resync_kv;                   /* ... for KV events missed, not a cut (timer thread only) */
    struct kvr_kvseq kvseq;           /* the workers' KV event numbers applied, under mu */
    bool kv_gap;                      /* KV events missed since the last tick, under mu */
    uint64_t kv_resync_ns;            /* the last catch-up for missed KV events (timer.c) */
    uint64_t kv_resyncs;              /* snapshots asked for missed KV events */
    uint64_t events_behind_ns;        /* how far behind the events' handler ran at the last tick,
                                         under mu (timer.c) */
    uint64_t events_heard_ns;         /* the events received by then were applied at the last
                                         tick (0: no tick yet), under mu */
    uint64_t events_behind_max_ns;    /* the most in this episode */
    bool events_behind;               /* logged as behind, not yet caught up */
    char subj_worker[528];            /* "<prefix>.<ns>.worker." */
    char subj_ev[528];                /* "<prefix>.<ns>.ev." */
};

/* Set up rd for cfg (borrowed, must outlive it) publishing through sink: the core and tables. */
kvr_status kvr_rd_init(struct kvr_rd *rd, const struct kvr_rd_config *cfg, struct kvr_sink sink);
void kvr_rd_free(struct kvr_rd *rd);

/* Publish what the outbox holds (takes and releases mu; call without it); forwards that fail go
 * to rd->forward_failed, and what that queues is published too. */
void kvr_rd_flush(struct kvr_rd *rd);
/* The same from inside mu, which it releases first (one lock round less per message): the end of
 * a handler's critical section. */
void kvr_rd_unlock_flush(struct kvr_rd *rd);

/* Free the workers' processes known (rebind.c, whose kvr_rebind_worker_seen records them). */
void kvr_rd_procs_free(struct kvr_rd *rd);

/*
 * Under mu: what this router remembers of the end of request key at now (kvr_recent.h): in
 * rd->recent (the requests it held or answered), else in rd->early_dones (dones of requests it
 * did not hold); NULL when neither. *in (when in is not NULL): the table it was found in, for
 * kvr_recent_age, or rd->early_dones when neither (where the end of a request this router did
 * not hold goes). Borrowed until the next put into that table.
 */
const struct kvr_recent_item *kvr_rd_ended(struct kvr_rd *rd, uint64_t key, uint64_t now,
                                           struct kvr_recent **in);

/* Under mu: hold a KV event back while a snapshot is applied; false when not holding. */
bool kvr_rd_hold(struct kvr_rd *rd, uint64_t worker_id, const void *data, size_t len);

#endif
