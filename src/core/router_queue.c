/*
 * The router's request queue: requests that found every worker busy wait here, in arrival order,
 * each with a copy of its prompt's sequence hashes and a deadline. Draining (on every route and
 * tick) places them oldest first until one still finds every worker that could take it busy; a
 * request past its deadline is rejected (KVR_ERR_DEADLINE when it was the request's own, else
 * KVR_ERR_OVERLOADED), and every waiting request is rejected at once with KVR_ERR_NO_WORKERS when
 * no worker is left. Either outcome is reported as a PLACED or REJECTED event. A request with a
 * deadline of its own earlier than the head's leaves at that deadline from wherever it waits
 * (sweep_deadlines), not when the head does. Order is kept among requests that wait for any
 * worker: a new request waits whenever one of those does. A request that waits only for a worker
 * large enough, smaller ones being free (sized), holds up none behind it. Invariants: qlen counts
 * the list from qhead to qtail, and qhead is NULL exactly when qtail is; qids holds exactly the
 * listed ids; qsized counts the sized ones; no own deadline of a request behind the head is
 * before qown_min. Single-threaded: the router's state thread.
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
    bool sized;              /* its last try found the workers that hold it busy and smaller ones
                                free: it holds up no request behind it (counted in qsized) */
    struct queued *next;     /* FIFO */
};

#define DRAIN_PAST_MAX 16 /* requests waiting for a large worker one drain tries and passes */

static void free_queued(struct queued *q)
{
    free(q->seq);
    free(q);
}

/* Unlink q, which follows prev (NULL: q is the head), and forget its id; the caller frees it. */
static void unlink_queued(struct kvr_router *r, struct queued *prev, struct queued *q)
{
    if (prev)
        prev->next = q->next;
    else
        r->qhead = q->next;
    if (r->qtail == q)
        r->qtail = prev;
    r->qlen--;
    r->qsized -= q->sized;
    kvr_map_del(&r->qids, q->id);
    assert((r->qhead == NULL) == (r->qlen == 0) && r->qsized <= r->qlen);
}

static void set_sized(struct kvr_router *r, struct queued *q, bool sized)
{
    r->qsized = r->qsized - q->sized + sized;
    q->sized = sized;
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
    return kvr_map_get(&r->qids, id) != KVR_NIL; /* every route asks, the queue may be long */
}

bool kvr__router_unqueue(struct kvr_router *r, uint64_t id)
{
    if (!kvr__router_is_queued(r, id))
        return false;
    struct queued *prev = NULL;
    for (struct queued *q = r->qhead; q; prev = q, q = q->next) {
        if (q->id == id) {
            unlink_queued(r, prev, q);
            free_queued(q);
            return true;
        }
    }
    assert(!"a listed id is in the list");
    return false;
}

/* Reject q as what its wait ended in (st), counted and reported; then free it. */
static void reject(struct kvr_router *r, struct queued *q, kvr_status st)
{
    r->st.rejected++;
    r->st.overloaded += st == KVR_ERR_OVERLOADED;
    kvr__router_emit(r, KVR_EV_REJECTED, q->id, 0, st, NULL);
    free_queued(q);
}

/*
 * The head still waits: reject every request behind it whose own deadline has passed (the
 * queue timeout, the same for all, passes in arrival order, so only an own deadline can come
 * before the head's), and note the earliest own deadline left. A walk of the queue, only when an
 * own deadline has passed: each removes one request at least.
 */
static void sweep_deadlines(struct kvr_router *r, uint64_t now)
{
    if (now < r->qown_min)
        return;
    uint64_t next = UINT64_MAX;
    struct queued *prev = r->qhead;
    for (struct queued *q = prev->next; q; q = prev->next) {
        if (!q->own_deadline) {
            prev = q;
        } else if (q->deadline <= now) {
            unlink_queued(r, prev, q);
            reject(r, q, KVR_ERR_DEADLINE);
        } else {
            next = q->deadline < next ? q->deadline : next;
            prev = q;
        }
    }
    r->qown_min = next; /* the head's own deadline is the drain's to see */
}

/*
 * Oldest first. A request that still finds every worker that could take it busy stops the drain
 * (the order is kept), unless smaller workers were free for it (sized): only a worker large
 * enough will do, and those behind it are tried, DRAIN_PAST_MAX such requests passed at most.
 */
void kvr__router_drain(struct kvr_router *r, uint64_t now)
{
    struct queued *prev = NULL;
    uint32_t passed = 0;
    for (struct queued *q = r->qhead, *next; q; q = next) {
        next = q->next;
        struct kvr_overrides ov = q->ov;
        struct prompt p = {q->id, q->seq, q->nblocks, q->ntokens, q->first_hash,
                           &ov,   false,  0,          0,          q->max_tokens};
        struct kvr_decision d;
        kvr_status st = KVR_ERR_OVERLOADED;
        bool sized = false;
        if (q->deadline > now && kvr_active_count(&r->act) < r->cfg.max_inflight) {
            st = kvr__router_decide(r, &p, now, true, &d);
            sized = st == KVR_ERR_OVERLOADED && r->small_free > 0;
        }
        if (st == KVR_ERR_OVERLOADED && q->deadline > now) {
            set_sized(r, q, sized);
            if (!sized || ++passed >= DRAIN_PAST_MAX) {
                sweep_deadlines(r, now);
                return;
            }
            prev = q;
            continue;
        }
        if (st == KVR_ERR_OVERLOADED && q->own_deadline)
            st = KVR_ERR_DEADLINE;
        unlink_queued(r, prev, q);
        if (st != KVR_OK) {
            reject(r, q, st);
            continue;
        }
        r->st.decisions++;
        r->st.routed_blocks += d.prompt_blocks;
        r->st.routed_overlap += d.overlap_blocks;
        kvr__router_emit(r, KVR_EV_PLACED, q->id, d.worker_id, KVR_OK, &d);
        free_queued(q);
    }
    if (!r->qhead)
        r->qown_min = UINT64_MAX; /* none waits */
}

kvr_status kvr__router_enqueue(struct kvr_router *r, const struct prompt *p, uint64_t now,
                               bool sized)
{
    if (r->qlen >= r->cfg.queue_max)
        return KVR_ERR_OVERLOADED;
    struct queued *q = calloc(1, sizeof *q);
    if (!q || kvr_map_put(&r->qids, p->id, 0) != KVR_OK) {
        free(q);
        return KVR_ERR_NOMEM;
    }
    if (p->nblocks) {
        q->seq = malloc((size_t)p->nblocks * sizeof *q->seq);
        if (!q->seq) {
            kvr_map_del(&r->qids, p->id);
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
        r->qown_min = q->deadline < r->qown_min ? q->deadline : r->qown_min;
    }
    q->first_hash = p->first_hash;
    q->sized = sized;
    r->qsized += sized;
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
