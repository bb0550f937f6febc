/*
 * The last KV event sequence number per worker.
 */
#include "kvseq.h"

#include <stdlib.h>

#include "grow.h"

void kvr_kvseq_free(struct kvr_kvseq *s)
{
    if (s->at.groups)
        kvr_map_free(&s->at);
    free(s->last);
    *s = (struct kvr_kvseq){0};
}

/* Forget every worker (the table is full): the next event of each is its first. */
static void start_over(struct kvr_kvseq *s)
{
    kvr_map_free(&s->at); /* slots NULL: the next note initialises it again */
    s->n = 0;
}

uint64_t kvr_kvseq_note(struct kvr_kvseq *s, uint64_t wid, uint64_t seq)
{
    uint32_t i = s->at.groups ? kvr_map_get(&s->at, wid) : KVR_NIL;
    if (i == KVR_NIL) {
        if (s->n >= KVR_KVSEQ_MAX)
            start_over(s);
        if ((!s->at.groups && kvr_map_init(&s->at, 16) != KVR_OK) ||
            !KVR_GROW(s->last, s->cap, s->n + 1, 16) || kvr_map_put(&s->at, wid, s->n) != KVR_OK)
            return 0;
        s->last[s->n++] = seq;
        return 0;
    }
    uint64_t last = s->last[i];
    if (seq == last)
        return 0; /* a repeat */
    if (seq < last) {
        if (last - seq > KVR_KVSEQ_REORDER)
            s->last[i] = seq; /* a restarted worker, counting from 1 again */
        else if (s->open) {   /* one that was skipped, late */
            s->open--;
            s->late++;
        }
        return 0;
    }
    s->last[i] = seq;
    uint64_t skipped = seq - last - 1;
    if (skipped) {
        s->missed += skipped;
        s->open += skipped;
        s->gaps++;
    }
    return skipped;
}
