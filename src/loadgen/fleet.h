/*
 * What kvbench hears from the fleet besides its own streams.
 *
 * kvr_fleet: the workers heard through their heartbeats (kv.<ns>.ev.*.hb), for the hit-rate
 * reference of a report and the worker hop mode calls directly. Every worker heard is kept, in
 * the order first heard (the list grows; a worker that memory could not hold is counted in
 * dropped). Written on nats.c's delivery thread under mu while discovering; read by the owner
 * after kvr_fleet_discover returns.
 *
 * kvr_watch: per request key, the routers' decisions (kv.<ns>.router.gossip.*: which worker, when,
 * how many times) and the workers' done events (kv.<ns>.ev.*.done: when, with what status), for
 * the resend and cancel modes. The keys are the fleet's own (kvr_client_key), so kvbench matches
 * what the routers and workers publish without decoding their forwards. Slots are set by the
 * owner and filled on nats.c's delivery threads, all under mu.
 *
 * kvr_fleet_srv_stats: the routers' $SRV.STATS answers; kvr_fleet_queue_len: what they say is
 * waiting in their queues.
 */
#ifndef KVR_FLEET_H
#define KVR_FLEET_H

#include <pthread.h>
#include <stdint.h>

#include "util.h"

struct kvr_fleet {
    pthread_mutex_t mu;  /* what follows, while discovering */
    uint64_t *ids;       /* workers heard (not draining), in order, owned */
    uint32_t n, cap;     /* */
    uint64_t dropped;    /* workers heard but not recorded: memory was short */
    uint32_t block_size; /* the last new worker's block size */
    uint64_t capacity;   /* ... and KV capacity, blocks */
};

void kvr_fleet_init(struct kvr_fleet *f);
void kvr_fleet_free(struct kvr_fleet *f);

/*
 * Listen to the workers' heartbeats on nc for wait_ns (borrowed: nc, prefix, ns) and add the
 * workers heard to f. Returns the workers known; 0 also when the subscription failed.
 */
uint32_t kvr_fleet_discover(struct kvr_fleet *f, natsConnection *nc, const char *prefix,
                            const char *ns, uint64_t wait_ns);

/* One router's $SRV.STATS answer data[0..len) (not NUL-terminated; borrowed for the call). */
typedef void (*kvr_fleet_answer_fn)(void *ctx, const char *data, size_t len);

/*
 * Ask every router for $SRV.STATS.kvrouter (requests on pub, answers on sub, to inbox) and hand
 * each answer that comes within wait_ns to fn, on this thread. Returns how many came; 0 also when
 * the request could not be sent.
 */
uint32_t kvr_fleet_srv_stats(natsConnection *pub, natsConnection *sub, const char *inbox,
                             uint64_t wait_ns, kvr_fleet_answer_fn fn, void *ctx);

/* kvr_fleet_srv_stats: the sum of the answers' queue_len, and in *routers how many answered. */
uint64_t kvr_fleet_queue_len(natsConnection *pub, natsConnection *sub, const char *inbox,
                             uint64_t wait_ns, uint32_t *routers);

/* One watched request. Times are kvr_now_ns() of arrival here. */
struct kvr_watch_item {
    uint64_t key;       /* 0: not watched */
    uint64_t t_decided; /* the first decision gossiped for it */
    uint32_t decisions; /* decisions gossiped (two routers placing it: 2, or a re-placement) */
    uint64_t worker;    /* the first decision's worker */
    uint64_t worker2;   /* a later decision's other worker; 0: none */
    char origin[2][32]; /* the routers of the first two decisions (cut to 31 bytes) */
    uint64_t at[2];     /* ... when they say they decided (Unix ns) */
    uint64_t t_done;    /* the first done event */
    uint32_t dones;     /* done events */
    uint32_t status;    /* the first done event's kvr_status */
};

struct kvr_watch {
    pthread_mutex_t mu;           /* what follows */
    struct kvr_watch_item *items; /* n slots */
    uint32_t n;                   /* */
    uint32_t *map;                /* open addressing: key -> slot + 1 (0: empty), mask + 1 */
    uint32_t mask;                /* */
    natsSubscription *gossip;     /* kv.<ns>.router.gossip.* */
    natsSubscription *done;       /* kv.<ns>.ev.*.done */
    uint64_t decisions, doneev;   /* every decision and done event heard, watched or not */
};

/* n slots, and the subscriptions on nc (borrowed strings); KVR_OK or why not (w is then freed). */
kvr_status kvr_watch_start(struct kvr_watch *w, natsConnection *nc, const char *prefix,
                           const char *ns, uint32_t n);
/* Unsubscribe and free. */
void kvr_watch_stop(struct kvr_watch *w);
/* Watch key in slot i (cleared): once per slot, before the request goes out. */
void kvr_watch_set(struct kvr_watch *w, uint32_t i, uint64_t key);
/* A copy of slot i. */
struct kvr_watch_item kvr_watch_get(struct kvr_watch *w, uint32_t i);

#endif
