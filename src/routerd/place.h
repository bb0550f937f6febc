/*
 * Placing requests on workers: forwarding a decided request to its worker
 * (kv.<ns>.worker.<id>.generate, the client's bytes wrapped with the router's key, expected
 * overlap and id, the client's reply subject kept), and handling what the core reported from
 * inside its last call (kvr_rd.deferred): a queued request placed (forward it, gossip it) or
 * rejected, a request failed or expired (place it again if it never started, at most
 * KVR_PLACE_MAX_AGAIN times, else tell its client through the fleet rules). Under the state mutex.
 */
#ifndef KVR_RD_PLACE_H
#define KVR_RD_PLACE_H

#include <stdint.h>

#include "state.h"

#define KVR_PLACE_MAX_AGAIN 2 /* times a request that never reached its worker is placed again */

/* The forward of request key could not be published (st): fail it now, logged. */
void kvr_place_forward_failed(struct kvr_rd *rd, uint64_t key, kvr_status st);

/*
 * Handle every deferred core event and every request to place again, until none is left (placing
 * again may queue more: each request is placed again at most KVR_PLACE_MAX_AGAIN times, so this
 * ends). Call after every core call that may report events.
 */
void kvr_place_settle(struct kvr_rd *rd);

/*
 * Under mu, when the router stops with requests still unplaced (queued for a worker, or waiting
 * to be placed again) after its drain timeout: answer each of its own with st and forget it,
 * so no client waits for an answer that would never come. Settle afterwards.
 */
void kvr_place_refuse_unplaced(struct kvr_rd *rd, kvr_status st);

#endif
