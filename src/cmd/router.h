/*
 * The kvrouter daemon's state, shared by its intake and worker events (kvrouter.c) and its
 * replication with the other routers of the fleet (replica.c). Everything marked "under mu" is
 * read and written with r->mu held; messages made under it go out through r->out after release.
 */
#ifndef KVR_CMD_ROUTER_H
#define KVR_CMD_ROUTER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <nats/nats.h>
#include <uthash.h>

#include "codec.h"
#include "kvr/router.h"
#include "outbox.h"
#include "opts.h"
#include "util.h"

struct opts {
    char nats[KVR_OPT_STR_MAX];
    char ns[KVR_OPT_STR_MAX];
    char prefix[KVR_OPT_STR_MAX];
    char id[KVR_OPT_STR_MAX];
    char policy[KVR_OPT_STR_MAX];
    char cost[KVR_OPT_STR_MAX];
    char log_level[KVR_OPT_STR_MAX];
    uint32_t block_size, max_prompt_tokens, max_output_tokens, queue_max, tick_ms;
    uint64_t queue_timeout_ms, worker_timeout_ms, request_ttl_s, seed, warmup_ms;
    uint64_t hello_ms, sync_timeout_ms, test_drop_gossip;
    double overlap_weight, cache_weight, temperature, busy_threshold;
    bool approximate, gossip;
};

/* Another router of the fleet, as its gossip shows it. Kept for the process's life (bounded). */
struct peer {
    char id[KVR_OPT_STR_MAX];
    uint64_t epoch;    /* its incarnation (start time); a larger one is a restart */
    uint64_t next_seq; /* the next decision seq expected from it */
    uint64_t heard_ns; /* its last message; silent for 3.5 hellos = gone */
    bool serving;      /* it takes requests */
    UT_hash_handle hh; /* by id */
};

/* A request in flight that some router of the fleet decided. */
struct pending {
    uint64_t key;             /* the fleet-wide id: XXH3 of reply subject and client id */
    char *reply;              /* the client's reply subject; NULL for booked selects */
    char *request_id;         /* the client's id */
    uint8_t *raw;             /* the client's GenerateRequest, kept until its first token (to place
                               * it again if it never reaches its worker); origin only */
    size_t rawlen;            /* */
    uint64_t worker_id;       /* 0 while queued */
    uint32_t attempts;        /* placements after the first */
    uint64_t orphan_at;       /* failed while its origin was silent: answer at this time (0: no) */
    kvr_status orphan_status; /* */
    struct peer *origin;      /* the router that decided it; NULL: this one */
    UT_hash_handle hh;        /* by key; the router owns the item */
};

struct endpoint_stats {
    const char *name;       /* generate, select */
    char subject[256];      /* */
    uint64_t requests;      /* */
    uint64_t errors;        /* */
    uint64_t processing_ns; /* */
    char last_error[128];   /* */
};

/* A KV event held back while a snapshot is applied (replayed after it, in order). */
struct held_event {
    uint64_t worker_id;
    uint8_t *data;
    size_t len;
};

struct ring_slot {
    uint64_t seq, key;
};

/* Replication state and counters (all under mu). */
struct replica {
    uint64_t epoch;          /* this incarnation */
    uint64_t seq;            /* the last decision seq sent */
    struct ring_slot *ring;  /* seq -> request key of the last KVR_RING decisions, for repairs */
    struct peer *peers;      /* by id */
    uint32_t npeers;         /* */
    bool synced;             /* the snapshot is applied (or there was nobody to ask) */
    bool syncing;            /* a snapshot is being received */
    uint64_t sync_token;     /* the snapshot request's token */
    uint64_t sync_deadline;  /* give up (and go on with what gossip brings) */
    bool resync;             /* a later snapshot: it replaces the index on its first page */
    uint64_t resyncs;        /* snapshots asked after a disconnection */
    struct held_event *held; /* KV events held during the snapshot */
    size_t nheld, capheld;   /* */
    uint64_t next_hello_ns;  /* */
    uint64_t tokens;         /* request tokens handed out */
    uint64_t decided;        /* bookings this router made */
    uint64_t sent, sent_bytes, dropped_by_knob;      /* decisions gossiped */
    uint64_t received, received_bytes, bad, stale;   /* gossip from peers */
    uint64_t imported, late, unknown_worker;         /* decisions applied from peers */
    uint64_t gaps, repairs_asked, repaired, lookups; /* recovery */
    uint64_t pages_sent, pages_received, snapshots_served, held_dropped;
    uint64_t resends;              /* generate requests for a key already in flight: absorbed */
    uint64_t *orphans;             /* keys of failed requests whose origin is silent */
    uint32_t norphans, caporphans; /* */
    uint64_t orphans_answered;     /* */
    uint64_t sync_ms;              /* how long it took from the request */
    char subj_gossip[256], subj_sync[256], subj_lookup[256], subj_pages[256], subj_digest[256];
};

struct router {
    struct opts o;
    natsConnection *nc_req, *nc_ev;
    natsSubscription *sub_gen, *sub_sel, *sub_ev, *sub_srv[3];
    natsSubscription *sub_gossip, *sub_pages, *sub_lookup, *sub_digest, *sub_sync;
    pthread_mutex_t mu;
    struct kvr_router *core;     /* under mu */
    struct pending *pend;        /* under mu */
    struct kvr_outbox out;       /* under mu */
    struct kvr_buf buf;          /* under mu */
    struct endpoint_stats ep[2]; /* under mu */
    struct replica rep;          /* under mu */
    uint64_t ev_errors;          /* malformed or unknown events, under mu */
    uint64_t *again;             /* requests to place again (lost on the way), under mu */
    uint32_t nagain, capagain;   /* */
    uint64_t placed_again;       /* */
    uint32_t hb_interval_ms;     /* the longest heartbeat interval the workers announce, under mu */
    bool stopping;               /* the timer thread exits */
    bool blind;                  /* the events connection is down (timer thread only) */
    uint64_t reconnects;         /* of the events connection, as last seen (timer thread only) */
    uint64_t resync_at;          /* catch up at this time (0: no need; timer thread only) */
    uint64_t started_real;       /* for $SRV.STATS */
    char instance[64];           /* $SRV id */
    char prefix_worker[256];     /* "<prefix>.<ns>.worker." */
    char name_req[300];          /* connection names (they outlive the connections) */
    char name_ev[300];           /* */
};

/* kvrouter.c */
struct pending *pending_find(struct router *r, uint64_t key);
void pending_free(struct pending *p);
void pending_drop(struct router *r, struct pending *p);
void queue_error(struct router *r, const char *reply, const char *request_id, kvr_status st);
kvr_status apply_kv_event(struct router *r, uint64_t worker_id, const void *data, size_t len);
void flush(struct router *r);

/* replica.c: set up (before subscribing), subscribe, learn the fleet's state, tear down. */
kvr_status replica_init(struct router *r);
natsStatus replica_subscribe(struct router *r);
/* At start, after the warm-up: ask a peer for a snapshot and wait (bounded) until it is applied. */
void replica_sync(struct router *r);
void replica_free(struct router *r);

/* Under mu: gossip the booking of key (this router decided it). */
void replica_decided(struct router *r, const struct pending *p);
/*
 * Under mu: p failed (its worker died, or it never reached it). Its origin tells the client; when
 * the origin is silent, the live router with the smallest id does, after a grace period in which
 * the origin may come back and place it again. p is dropped (or kept for that grace period).
 */
void replica_failed(struct router *r, struct pending *p, kvr_status st);
/* Under mu: a worker heartbeat listing the requests it holds (anti-entropy). */
void replica_reconcile(struct router *r, uint64_t worker_id, const uint64_t *keys, uint32_t n,
                       uint32_t interval_ms, uint64_t now);
/* Under mu: hold a KV event back while a snapshot is applied; false when not syncing. */
bool replica_hold_event(struct router *r, uint64_t worker_id, const void *data, size_t len);
/* Under mu: this router's connection came back: ask a peer for what it missed meanwhile. */
void replica_resync(struct router *r);
/* Under mu: periodic work (hellos, sync timeout). */
void replica_tick(struct router *r, uint64_t now);
/* Under mu: the replication part of $SRV.STATS (a JSON object's members, no braces). */
int replica_stats_json(struct router *r, char *buf, size_t len);

#endif
