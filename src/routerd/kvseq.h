/*
 * The last KV event sequence number applied per worker, so a router notices KV events it never
 * got. Core NATS delivers at most once: a router whose connection stayed up can still miss
 * messages while the cluster reroutes (a server node restarting), and nothing else would tell it
 * that its index lacks what a worker stored or still holds what it removed. A jump in a worker's
 * event_seq opens a gap of the numbers skipped (`open`); a worker's heartbeat names its last
 * number sent, so a loss with no later number (the end of a burst) opens one too. A number up to
 * KVR_KVSEQ_REORDER below the highest received is one of them arriving late (a worker's two
 * threads publish out of order) when it is one of that worker's missing numbers (a bitmap of the
 * window below the highest), and closes it; a repeat closes nothing, nor does one worker's late
 * number another's gap. Further below, the worker restarted. So a loss is what is still open a
 * while later; a skipped number that falls out of the window stays open (it can no longer come
 * late). Only events of known workers are noted (their ids checked by then), at most
 * KVR_KVSEQ_MAX workers (past it the table starts over: a loss may go unnoticed, never a false
 * one). Pure; under the router's state mutex.
 */
#ifndef KVR_RD_KVSEQ_H
#define KVR_RD_KVSEQ_H

#include <stdint.h>

#include "map.h"

#define KVR_KVSEQ_MAX     65536u /* workers noted at most */
#define KVR_KVSEQ_REORDER 1024u  /* numbers below the highest seen taken for late ones */

#define KVR_KVSEQ_WORDS (KVR_KVSEQ_REORDER / 64u)

struct kvr_kvseq_worker {
    uint64_t seen;    /* the highest event_seq received */
    uint64_t told;    /* the highest its heartbeats named, or seen if higher */
    uint64_t settled; /* numbers up to it are not watched (before its first, or a snapshot's) */
    uint64_t missing[KVR_KVSEQ_WORDS]; /* bit n % REORDER: number n of [seen - REORDER, seen)
                                          is open (128 bytes a worker, 8 MiB at most) */
};

struct kvr_kvseq {
    struct kvr_map at;          /* worker id -> index in w (slots NULL until the first note) */
    struct kvr_kvseq_worker *w; /* per noted worker */
    uint32_t n, cap;            /* */
    uint64_t missed;            /* KV events skipped over, in all (late ones included) */
    uint64_t gaps;              /* times some were */
    uint64_t late;              /* skipped ones that came after all */
    uint64_t open;              /* skipped ones not come yet, all workers (kvr_kvseq_settle) */
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

/* The highest number of worker wid's KV events known missed here: one its heartbeat named that
 * has not come, or one still open in the window of late ones; when numbers left that window since
 * the last snapshot (an open one among them is not known any more), the window's floor. 0: none
 * (or wid not noted). */
uint64_t kvr_kvseq_last_missing(const struct kvr_kvseq *s, uint64_t wid);

/* A snapshot covers every open number (or a loss is let go): none is open any more, and one that
 * comes late after all closes nothing. */
void kvr_kvseq_settle(struct kvr_kvseq *s);

#endif
