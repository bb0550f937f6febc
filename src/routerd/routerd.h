/*
 * kvr_routerd: the router daemon as a whole, for its main: create it from a checked config,
 * start it (connect, listen to the fleet, warm up, take a peer's snapshot, join the request
 * queue group, start the timer), drain it on SIGTERM (stop taking requests, settle the queued
 * ones; forwarded requests belong to their workers), destroy it.
 */
#ifndef KVR_ROUTERD_H
#define KVR_ROUTERD_H

#include <stdbool.h>

#include "config.h"
#include "kvr/status.h"

struct kvr_routerd;

/* cfg must outlive the daemon (borrowed). NULL with *st when the core cannot be made. */
struct kvr_routerd *kvr_routerd_create(const struct kvr_rd_config *cfg, kvr_status *st);
kvr_status kvr_routerd_start(struct kvr_routerd *d);
void kvr_routerd_drain(struct kvr_routerd *d);
/* Close and free; false when a handler still ran after the link's wait: then d is left to the
 * exit (nothing it holds is freed, nats.c is not shut down either). */
bool kvr_routerd_destroy(struct kvr_routerd *d);

#endif
