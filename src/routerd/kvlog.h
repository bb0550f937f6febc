/*
 * The KV events this router applied in the last moment, kept to be applied again after a resync
 * replaces its index with a peer's. The peer's snapshot shows the events the peer had applied when
 * it answered; one this router applied just before it asked may not have reached the peer yet
 * (another path through the cluster, a busier router), and the index that had it is gone. A stored
 * or removed event sets what one worker holds of some blocks (a cleared one, all of them), so
 * applying again, in their order, a worker's events after the snapshot leaves every block they
 * touched as its last event says, whether the snapshot had it or not: as long as none of that
 * worker's events after the first replayed was missed here. So the asker marks, when it asks,
 * which to replay (kvr_kvlog_mark: sync.c takes those numbered above the last one it knows it
 * missed, and none from before a cut of its events connection).
 *
 * A ring of copies of the messages as they came, at most KVR_KVLOG_EVENTS of them and
 * KVR_KVLOG_BYTES of payload (the oldest go first), none older than the window at the time of the
 * newest. Pure; under the router's state mutex.
 */
#ifndef KVR_RD_KVLOG_H
#define KVR_RD_KVLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVR_KVLOG_EVENTS 8192u
#define KVR_KVLOG_BYTES  (8u << 20)

struct kvr_kvlog_event {
    uint64_t worker_id; /* the worker of its subject */
    uint64_t seq;       /* its event_seq */
    uint64_t t;         /* when it was applied (ns, the router's clock) */
    uint8_t *data;      /* the message, owned */
    size_t len;         /* */
    bool replay;        /* marked to be applied again (kvr_kvlog_mark) */
};

struct kvr_kvlog {
    struct kvr_kvlog_event *ev; /* ring of max_events slots (NULL until the first) */
    uint32_t max_events;        /* */
    uint32_t head, n;           /* the oldest's slot; how many */
    size_t bytes, max_bytes;    /* payload kept; its bound */
    uint64_t window_ns;         /* older than this behind the newest: let go */
    uint64_t dropped;           /* let go for room before the window passed (or out of memory) */
};

/* An empty log keeping window_ns, at most max_events and max_bytes (0: the defaults above). */
void kvr_kvlog_init(struct kvr_kvlog *l, uint64_t window_ns, uint32_t max_events, size_t max_bytes);
void kvr_kvlog_free(struct kvr_kvlog *l);

/* Keep a copy of worker_id's event number seq, data[0..len), applied at t (not before the last
 * one's), unmarked. False when it could not be kept (larger than the bound, out of memory: counted
 * in dropped). */
bool kvr_kvlog_add(struct kvr_kvlog *l, uint64_t worker_id, uint64_t seq, uint64_t t,
                   const void *data, size_t len);

/* Mark to be applied again each event kept applied at from or later that keep (when not NULL)
 * says yes to; unmark every other. How many are marked. */
uint32_t kvr_kvlog_mark(struct kvr_kvlog *l, uint64_t from,
                        bool (*keep)(void *ctx, const struct kvr_kvlog_event *e), void *ctx);

/* fn for each marked event, oldest first, unmarking it; how many. fn must not add. */
uint32_t kvr_kvlog_replay(struct kvr_kvlog *l,
                          void (*fn)(void *ctx, const struct kvr_kvlog_event *e), void *ctx);

#endif
