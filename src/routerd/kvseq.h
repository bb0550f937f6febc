/*
 * The last KV event sequence number applied per worker, so a router notices KV events it never
 * got. Core NATS delivers at most once: a router whose connection stayed up can still miss
 * messages while the cluster reroutes (a server node restarting), and nothing else would tell it
 * that its index lacks what a worker stored or still holds what it removed. A jump in a worker's
 * event_seq is such a loss; a lower or equal number is a restarted worker or a repeat (no loss).
 * Only workers whose events were applied are noted (their ids checked by then), at most
 * KVR_KVSEQ_MAX of them (past it the table starts over: a loss may go unnoticed, never a false
 * one). Pure; under the router's state mutex.
 */
#ifndef KVR_RD_KVSEQ_H
#define KVR_RD_KVSEQ_H

#include <stdint.h>

#include "map.h"

#define KVR_KVSEQ_MAX 65536u /* workers noted at most */

struct kvr_kvseq {
    struct kvr_map at; /* worker id -> index in last (slots NULL until the first note) */
    uint64_t *last;    /* the last event_seq applied, per noted worker */
    uint32_t n, cap;   /* */
    uint64_t missed;   /* KV events skipped over, in all */
    uint64_t gaps;     /* times some were */
};

void kvr_kvseq_free(struct kvr_kvseq *s);

/* Worker wid's event seq was applied: how many of its events were skipped just before it (0: none,
 * a repeat, its first, or a restart). Out of memory: 0, and wid is not noted. */
uint64_t kvr_kvseq_note(struct kvr_kvseq *s, uint64_t wid, uint64_t seq);

#endif
