/*
 * The last KV event sequence number applied per worker, so a router notices KV events it never
 * got. Core NATS delivers at most once: a router whose connection stayed up can still miss
 * messages while the cluster reroutes (a server node restarting), and nothing else would tell it
 * that its index lacks what a worker stored or still holds what it removed. A jump in a worker's
 * event_seq opens a gap of the numbers skipped (`open`); a number up to KVR_KVSEQ_REORDER below
 * the highest seen is one of them arriving late (a worker's two threads publish out of order)
 * and closes one; further below, the worker restarted. A worker's heartbeat names its last
 * number sent, so a loss with no later number (the end of a burst) opens a gap too. So a loss is
 * what is still open a while later. Only events of known workers are noted (their ids checked by
 * then), at most KVR_KVSEQ_MAX workers (past it the table starts over: a loss may go unnoticed,
 * never a false one). Pure; under the router's state mutex.
 */
#ifndef KVR_RD_KVSEQ_H
#define KVR_RD_KVSEQ_H

#include <stdint.h>

#include "map.h"

#define KVR_KVSEQ_MAX     65536u /* workers noted at most */
#define KVR_KVSEQ_REORDER 1024u  /* numbers below the highest seen taken for late ones */

struct kvr_kvseq_worker {
    uint64_t seen; /* the highest event_seq received */
    uint64_t told; /* the highest its heartbeats named, or seen if higher */
};

struct kvr_kvseq {
    struct kvr_map at;          /* worker id -> index in w (slots NULL until the first note) */
    struct kvr_kvseq_worker *w; /* per noted worker */
    uint32_t n, cap;            /* */
    uint64_t missed;            /* KV events skipped over, in all (late ones included) */
    uint64_t gaps;              /* times some were */
    uint64_t late;              /* skipped ones that came after all */
    uint64_t open;              /* skipped ones not come yet (all workers; 0 after a snapshot) */
};

void kvr_kvseq_free(struct kvr_kvseq *s);

/* Worker wid's event seq came: how many of its events it skipped over (0: none, a repeat, a late
 * one, its first, or a restart). Out of memory: 0, and wid is not noted. */
uint64_t kvr_kvseq_note(struct kvr_kvseq *s, uint64_t wid, uint64_t seq);

/* Worker wid's heartbeat says the last KV event it sent is number seq: how many of its events up
 * to seq have not come (0: none, or wid is not noted yet). They are open like skipped ones, and
 * each closes when it comes; the loss of a worker's last events before it falls silent shows no
 * other way. Call it only when every event received before the heartbeat has been noted. */
uint64_t kvr_kvseq_announce(struct kvr_kvseq *s, uint64_t wid, uint64_t seq);

#endif
