/*
 * kvr_fleet: the workers kvbench hears through their heartbeats (kv.<ns>.ev.*.hb), for the
 * hit-rate reference of a report and the worker hop mode calls directly. Every worker heard is
 * kept, in the order first heard (the list grows; a worker that memory could not hold is counted
 * in dropped). Written on nats.c's delivery thread under mu while discovering; read by the owner
 * after kvr_fleet_discover returns.
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

#endif
