/*
 * Replication among the routers of a fleet, its bookkeeping half (docs/architecture.md, "A fleet
 * of routers"): the peers, gossip (each booking this router makes goes out as one Gossip message
 * with (router id, epoch, seq); a hello every hello period carries the last seq), importing
 * peers' decisions, seq gaps asked to be repaired, anti-entropy from worker heartbeats, and who
 * answers a client whose request failed (its origin; when the origin is silent, the live router
 * with the smallest id, after a grace period). Snapshots and repairs travel in sync.c.
 *
 * Invariants: at most KVR_FLEET_MAX_PEERS peers, each kept while a pending request points at it
 * (when the table is full, of those none points at, the one silent the longest is forgotten); a
 * peer's epoch only grows; seqs this router sent are kept in a ring of KVR_FLEET_RING for repairs.
 * Everything here runs under the state mutex.
 */
#ifndef KVR_RD_FLEET_H
#define KVR_RD_FLEET_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>
#include <uthash.h>

#include "codec.h"
#include "state.h"

#define KVR_FLEET_RING      65536u /* decisions an origin can still repair */
#define KVR_FLEET_MAX_PEERS 1024u  /* routers remembered */

/* Another router of the fleet, as its gossip shows it. */
struct kvr_peer {
    char id[KVR_RD_ID_MAX]; /* */
    uint64_t epoch;         /* its incarnation (start time); a larger one is a restart */
    uint64_t next_seq;      /* the next decision seq expected from it */
    uint64_t heard_ns;      /* its last message; silent for 3.5 hellos = gone */
    bool serving;           /* it takes requests */
    bool named;             /* a pending request names it as origin (evict_one's pass) */
    UT_hash_handle hh;      /* by id */
};

struct kvr_fleet_ring_slot {
    uint64_t seq, key;
};

struct kvr_fleet {
    uint64_t epoch;                   /* this incarnation */
    uint64_t seq;                     /* the last decision seq sent */
    struct kvr_fleet_ring_slot *ring; /* seq -> request key of the last decisions */
    struct kvr_peer *peers;           /* by id */
    uint32_t npeers;                  /* */
    uint64_t next_hello_ns;           /* */
    uint64_t tokens;                  /* question tokens handed out */
    bool synced;                      /* the snapshot is applied (or nobody could be asked) */
    bool syncing;                     /* a snapshot is awaited */
    bool resync;                      /* a later snapshot: it replaces the index on arrival */
    bool keep_index;                  /* ... unless its sender's index has holes too (sync.c) */
    uint32_t partial_answers;         /* snapshots in a row whose index had holes (sync.c) */
    uint64_t resync_retry_at;         /* ask another peer then (0: no) */
    bool took_holes;                  /* the last snapshot taken in had holes (sync.c) */
    uint64_t sync_token;              /* the awaited snapshot's token */
    uint64_t sync_asked_ns;           /* when it was asked (kvr_now_ns) */
    bool replay_kv;                   /* its index replaced this one's: apply the KV events of the
                                         moment before the ask again (kvlog.h) */
    uint64_t sync_deadline;           /* give up then (gossip and heartbeats fill in) */
    uint64_t sync_ms;                 /* how long the start-up snapshot took */
    char subj_gossip[256], subj_sync[256], subj_lookup[256], subj_pages[256], subj_digest[256];
    char subj_gossip_all[256]; /* router.gossip.*: every router's */
    uint64_t epochs_back;      /* a peer's older epoch taken back: its newer one fell silent */
    uint64_t heard_ns;         /* gossip that reached the router by then is applied (0: by now), the
                                  time peers' silence is judged at (timer.c, backlog.h) */
    uint64_t behind_ns;        /* how far behind the gossip handler ran at the last tick */
    /* counters */
    uint64_t decided, sent, sent_bytes, dropped_by_knob;   /* decisions gossiped */
    uint64_t received, received_bytes, bad, stale;         /* gossip from peers */
    uint64_t imported, late, unknown_worker, lost;         /* decisions applied from peers */
    uint64_t gaps, repairs_asked, repaired, lookups;       /* recovery */
    uint64_t pages_sent, pages_received, snapshots_served; /* */
    uint64_t resends, resyncs, orphans_answered;           /* */
    uint64_t snapshots_served_partial, resyncs_kept_index; /* indexes with holes (sync.c) */
    uint64_t snapshots_served_cut; /* ... served so: the walk stopped (the state kept changing) */
    uint64_t snapshots_incomplete; /* ... taken as they came (a cut walk; at start-up any) */
    uint64_t kv_replayed;          /* KV events applied again after a resync replaced the index */
    uint64_t placed_anew;     /* a peer's own decision replaced by its placing again elsewhere */
    uint64_t reconcile_waits; /* heartbeats whose worker had forwards waiting: nothing judged */
    uint64_t queued_sent;     /* Queued notices sent (queued here, released unplaced) */
    uint64_t queued_heard;    /* peers' queued requests held here (their resends absorbed) */
    uint64_t queued_released; /* ... forgotten as their origin released them unplaced */
    uint64_t peers_evicted;   /* silent ones, the table full */
    uint64_t import_failed;   /* decisions not booked here: no memory, max_inflight */
    uint64_t import_failed_logged; /* import_failed at the last decision_not_imported line */
    uint64_t import_failed_log_ns; /* when that line was written (at most one per 10 s) */
};

/* Create rd->fleet (subjects from rd->cfg). */
kvr_status kvr_fleet_create(struct kvr_rd *rd);
void kvr_fleet_destroy(struct kvr_rd *rd);

bool kvr_fleet_peer_alive(const struct kvr_rd *rd, const struct kvr_peer *p, uint64_t now);
/* A live peer that serves (so it has the fleet's state), a different one from call to call. */
struct kvr_peer *kvr_fleet_serving_peer(struct kvr_rd *rd, uint64_t now);

/* Ask subject a question q (a SyncRequest) to be answered on this router's pages subject. */
void kvr_fleet_ask(struct kvr_rd *rd, const char *subject, struct kvr_wire_sync *q);
/* The same, of peer p directly (kv.<ns>.router.sync.<its id>). */
void kvr_fleet_ask_peer(struct kvr_rd *rd, const struct kvr_peer *p, struct kvr_wire_sync *q);

/* This router booked p: gossip it. */
void kvr_fleet_decided(struct kvr_rd *rd, const struct kvr_pending *p);

/*
 * This router queued p (no worker has room): tell the peers, so that one that receives its
 * client's resend absorbs it instead of placing a second copy (which served the request while
 * this router's copy timed out as overloaded: an error and a stream for one request).
 */
void kvr_fleet_queued(struct kvr_rd *rd, struct kvr_pending *p);
/* p leaves this router's queue unplaced, its client answered with st: if the peers were told it
 * was queued, they forget it and remember that answer (kvr_fleet_answered). */
void kvr_fleet_unqueued(struct kvr_rd *rd, struct kvr_pending *p, kvr_status st);
/*
 * Under mu: the fleet answered request key with the error st (this router or its origin): a
 * resend within cfg->crossing_ns of now crossed that answer on its way and is ignored; later it
 * is a new attempt (docs/protocol.md). After ERR_CANCELLED and ERR_DEADLINE a resend is ignored
 * for as long as an ended request's.
 */
void kvr_fleet_answered(struct kvr_rd *rd, uint64_t key, kvr_status st, uint64_t now);
/* The same into table t (rd->recent for kvr_fleet_answered; a worker's refusal of a request
 * this router did not hold goes into rd->early_dones, events.c). */
void kvr_fleet_answered_in(struct kvr_recent *t, uint64_t key, kvr_status st, uint64_t now);

/* Under mu: peer's Queued notice q, heard at now (queued.c). */
void kvr_fleet_on_queued(struct kvr_rd *rd, const struct kvr_peer *peer,
                         const struct kvr_wire_queued *q, uint64_t now);

/* A peer's decision d (gossip, snapshot, repair): book it and keep who answers for it. */
void kvr_fleet_import(struct kvr_rd *rd, const struct kvr_wire_decision *d, uint64_t now,
                      bool repair);

/*
 * p failed (its worker died, or it never reached it) with st. Its origin tells the client; when
 * the origin is silent, the live router with the smallest id does, after a grace period in which
 * the origin may come back and place it again. p is dropped (or kept for that grace period).
 */
void kvr_fleet_failed(struct kvr_rd *rd, struct kvr_pending *p, kvr_status st);

/* A worker heartbeat listing the requests it holds (anti-entropy), with `waiting` forwards it
 * received and has not taken yet (any request it does not list may be among them). */
void kvr_fleet_reconcile(struct kvr_rd *rd, uint64_t worker_id, const uint64_t *keys, uint32_t n,
                         uint32_t interval_ms, uint32_t waiting, uint64_t now);

/* Periodic work: hellos, orphans whose grace is over. */
void kvr_fleet_tick(struct kvr_rd *rd, uint64_t now);

/* A message on a gossip subject (<prefix>.<ns>.router.gossip.<router id>): its router id must be
 * the subject's last token, so a server's publish permissions can fence each router to its own
 * id (takes mu; publishes). */
void kvr_fleet_on_gossip(struct kvr_rd *rd, const char *subject, const void *data, size_t len);

/* The replication counters and the state digest, as members of obj. */
void kvr_fleet_stats(struct kvr_rd *rd, json_t *obj);

#endif
