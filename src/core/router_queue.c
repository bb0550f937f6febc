/*
 * The router's request queue: requests that found every worker busy wait here, in arrival order,
 * each with a copy of its prompt's sequence hashes and a deadline. Draining (on every route and
 * tick) places them oldest first until one still finds every worker busy; a request past its
 * deadline is rejected (KVR_ERR_DEADLINE when it was the request's own, else KVR_ERR_OVERLOADED),
 * and every waiting request is rejected at once with KVR_ERR_NO_WORKERS when no worker is left.
 * Either outcome is reported as a PLACED or REJECTED event. Invariant:
 * qlen counts the list from qhead to qtail, and qhead is NULL exactly when qtail is. FIFO order is
 * never broken: a new request waits whenever others do. Single-threaded: the router's state
 * thread.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "router_int.h"

struct queued {
    uint64_t id;             /* request id */
    uint64_t deadline;       /* ns after which it is rejected */
    bool own_deadline;       /* the request's own deadline (not the queue timeout) */
    uint64_t first_hash;     /* chwbl key */
    uint64_t *seq;           /* its sequence hashes, owned */
    uint32_t nblocks;        /* */
    uint32_t ntokens;        /* */
    uint32_t max_tokens;     /* */
    struct kvr_overrides ov; /* */
    struct queued *next;     /* FIFO */
};

static void free_queued(struct queued *q)
{
    free(q->seq);
    free(q);
}

void kvr__router_queue_free(struct kvr_router *r)
{
    while (r->qhead) {
        struct queued *q = r->qhead;
        r->qhead = q->next;
        free_queued(q);
    }
    r->qtail = NULL;
    r->qlen = 0;
}

bool kvr__router_is_queued(const struct kvr_router *r, uint64_t id)
{
    for (const struct queued *q = r->qhead; q; q = q->next)
        if (q->id == id)
            return true;
    return false;
}

bool kvr__router_unqueue(struct kvr_router *r, uint64_t id)
{
    struct queued *prev = NULL;
    for (struct queued *q = r->qhead; q; prev = q, q = q->next) {
        if (q->id != id)
            continue;
        if (prev)
            prev->next = q->next;
        else
            r->qhead = q->next;
        if (r->qtail == q)
            r->qtail = prev;
        r->qlen--;
        assert((r->qhead == NULL) == (r->qlen == 0));
        free_queued(q);
        return true;
    }
    return false;
}

/* Unlink the oldest waiting request; the caller frees it. */
static struct queued *pop_head(struct kvr_router *r)
{
    struct queued *q = r->qhead;
    assert(q && r->qlen > 0);
    r->qhead = q->next;
    if (!r->qhead)
        r->qtail = NULL;
    r->qlen--;
    assert((r->qhead == NULL) == (r->qlen == 0));
    return q;
}

void kvr__router_drain(struct kvr_router *r, uint64_t now)
{
    while (r->qhead) {
        struct queued *q = r->qhead;
        struct kvr_overrides ov = q->ov;
        struct prompt p = {q->id, q->seq, q->nblocks, q->ntokens, q->first_hash,
                           &ov,   false,  0,          0,          q->max_tokens};
        struct kvr_decision d;
        kvr_status st = KVR_ERR_OVERLOADED;
        if (q->deadline > now && kvr_active_count(&r->act) < r->cfg.max_inflight)
            st = kvr__router_decide(r, &p, now, true, &d);
        if (st == KVR_ERR_OVERLOADED && q->deadline > now)
            return;
        if (st == KVR_ERR_OVERLOADED && q->own_deadline)
            st = KVR_ERR_DEADLINE;
        if (st != KVR_OK) {
            r->st.rejected++;
            r->st.overloaded += st == KVR_ERR_OVERLOADED;
        }
        pop_head(r);
        if (st == KVR_OK) {
            r->st.decisions++;
            r->st.routed_blocks += d.prompt_blocks;
            r->st.routed_overlap += d.overlap_blocks;
            kvr__router_emit(r, KVR_EV_PLACED, q->id, d.worker_id, KVR_OK, &d);
        } else {
            kvr__router_emit(r, KVR_EV_REJECTED, q->id, 0, st, NULL);
        }
        free_queued(q);
    }
}

kvr_status kvr__router_enqueue(struct kvr_router *r, const struct prompt *p, uint64_t now)
{
    if (r->qlen >= r->cfg.queue_max)
        return KVR_ERR_OVERLOADED;
    struct queued *q = calloc(1, sizeof *q);
    if (!q)
        return KVR_ERR_NOMEM;
    if (p->nblocks) {
        q->seq = malloc((size_t)p->nblocks * sizeof *q->seq);
        if (!q->seq) {
            free(q);
            return KVR_ERR_NOMEM;
        }
        memcpy(q->seq, p->seq, (size_t)p->nblocks * sizeof *q->seq);
    }
    q->id = p->id;
    q->deadline = now + r->cfg.queue_timeout_ns;
    if (p->deadline && p->deadline < q->deadline) {
        q->deadline = p->deadline;
        q->own_deadline = true;
    }
    q->first_hash = p->first_hash;
    q->nblocks = p->nblocks;
    q->ntokens = p->ntokens;
    q->max_tokens = p->max_tokens;
    if (p->ov)
        q->ov = *p->ov;
    if (r->qtail)
        r->qtail->next = q;
    else
        r->qhead = q;
    r->qtail = q;
    r->qlen++;
    r->st.queued++;
    return KVR_OK;
}
