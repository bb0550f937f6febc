/*
 * Replication, its transfer half: snapshots, repairs and lookups, served and received. A new or
 * reconnected router asks one serving peer (kv.<ns>.router.sync.<peer>) for everything in flight
 * and the index; KV events are held back meanwhile (kvr_rd_hold) and replayed after it, in order.
 * A seq gap asks the origin for the decisions it still holds in that range; a heartbeat listing
 * unknown keys asks every peer (kv.<ns>.router.lookup). Answers come in pages of at most
 * SYNC_PAGE_BYTES to kv.<ns>.router.pages.<this router>. Runs under the state mutex except where
 * noted.
 */
#ifndef KVR_RD_SYNC_H
#define KVR_RD_SYNC_H

#include <stdbool.h>
#include <stddef.h>

#include "state.h"

/* A SyncRequest on this router's sync subject (takes mu; publishes). */
void kvr_sync_on_request(struct kvr_rd *rd, const char *reply, const void *data, size_t len);
/* The same on the lookup subject: request keys only (a snapshot or a range asked there is bad). */
void kvr_sync_on_lookup(struct kvr_rd *rd, const char *reply, const void *data, size_t len);

/* A SyncPage on this router's pages subject (takes mu; publishes). */
void kvr_sync_on_page(struct kvr_rd *rd, const void *data, size_t len);

/*
 * At start, after the warm-up (without mu; blocks): ask a serving peer for a snapshot and wait
 * (sync_timeout, twice at most) until it is applied; with nobody to ask, go on at once. An answer
 * whose index has holes is taken as it came, and a peer asked again 1 s later (kvr_sync_tick).
 */
void kvr_sync_start(struct kvr_rd *rd);

/* Under mu: the events connection came back, or KV events were missed (reason, logged): take a
 * snapshot again (its index replaces ours, unless the peer's has holes too: then ours is kept;
 * either way, as when its walk was cut short and its last page says so, a peer is asked again
 * 1 s later, three answers with holes in a row at most). false: nobody to ask (gossip off, no
 * serving peer, a snapshot already coming). */
bool kvr_sync_resync(struct kvr_rd *rd, const char *reason);

/* Under mu: a resync that got no answer in time is given up (gossip and heartbeats fill in); one
 * answered with an index with holes is asked again when due. */
void kvr_sync_tick(struct kvr_rd *rd, uint64_t now);

#endif
