/*
 * What the workers tell the router, and housekeeping: request lifecycle events (prefill done,
 * output block, done; those for requests not booked yet are kept as early events), heartbeats
 * that register workers and refresh their load, worker removal (its index entries go, its
 * in-flight requests fail), KV events into the prefix index, and the periodic tick (TTL expiry,
 * silent workers, the queue, the warning of pruned live entries); the index's bound follows the
 * capacities the workers announce (docs/architecture.md, "Index sizing"). Invariant: a slot is
 * given back to the registry only once all of its state is gone (no index entry, no in-flight
 * request), so a new worker in it starts clean. Single-threaded: the router's state thread; events
 * are emitted from inside these calls.
 */
#include "kvr/router.h"

#include <assert.h>

#include "router_int.h"

static kvr_status request_event(struct kvr_router *r, kvr_status st)
{
    if (st == KVR_ERR_UNKNOWN_REQUEST)
        r->st.unknown_request++;
    return st;
}

/* An event for a request this router has not booked (yet): keep it for its decision. */
static kvr_status early_event(struct kvr_router *r, kvr_status st, uint64_t request_id,
                              enum kvr_early_kind kind, uint64_t now)
{
    if (st == KVR_ERR_UNKNOWN_REQUEST && request_id) {
        kvr_early_note(&r->early, request_id, kind, now);
        r->st.early_events++;
    }
    return request_event(r, st);
}

kvr_status kvr_router_prefill_done(struct kvr_router *r, uint64_t request_id, uint64_t now)
{
    return early_event(r, kvr_active_prefill_done(&r->act, request_id, now), request_id,
                       KVR_EARLY_PREFILL, now);
}

kvr_status kvr_router_output_block(struct kvr_router *r, uint64_t request_id, uint64_t now)
{
    return early_event(r, kvr_active_output_block(&r->act, request_id, now), request_id,
                       KVR_EARLY_OUTBLOCK, now);
}

kvr_status kvr_router_finished(struct kvr_router *r, uint64_t request_id, uint64_t now,
                               uint32_t output_tokens)
{
    const struct kvr_active_req *q = kvr_active_find(&r->act, request_id);
    if (q && q->max_tokens) {
        kvr_outlen_add(&r->outlen, q->max_tokens, output_tokens);
        r->st.completions++;
        r->st.completion_tokens += output_tokens < q->max_tokens ? output_tokens : q->max_tokens;
        r->st.completion_limit += q->max_tokens;
    }
    return kvr_router_done_at(r, request_id, now);
}

uint32_t kvr_router_expected_output(const struct kvr_router *r, uint32_t max_tokens)
{
    return kvr_outlen_predict(&r->outlen, kvr__router_max_tokens(r, max_tokens));
}

void kvr_router_note_max_tokens(struct kvr_router *r, uint64_t request_id, uint32_t max_tokens)
{
    kvr_active_set_max_tokens(&r->act, request_id, kvr__router_max_tokens(r, max_tokens));
}

kvr_status kvr_router_done_at(struct kvr_router *r, uint64_t request_id, uint64_t now)
{
    return early_event(r, kvr_active_remove(&r->act, request_id), request_id, KVR_EARLY_DONE, now);
}

kvr_status kvr_router_cancel(struct kvr_router *r, uint64_t request_id)
{
    if (kvr__router_unqueue(r, request_id))
        return KVR_OK;
    return kvr_active_remove(&r->act, request_id);
}

kvr_status kvr_router_withdraw(struct kvr_router *r, uint64_t request_id)
{
    const struct kvr_active_req *q = kvr_active_find(&r->act, request_id);
    if (q)
        kvr__router_unnote_prefill(r, q);
    return kvr_router_cancel(r, request_id);
}

kvr_status kvr_router_done(struct kvr_router *r, uint64_t request_id)
{
    return kvr_router_done_at(r, request_id, r->last_now);
}

/* Register worker id in a new slot with scratch for it; NULL on failure (*st says why). */
static struct kvr_worker *join(struct kvr_router *r, const struct kvr_worker_info *info,
                               kvr_status *st)
{
    uint32_t slot;
    *st = kvr_registry_add(&r->reg, info->id, &slot);
    if (*st != KVR_OK)
        return NULL;
    *st = kvr__router_ensure_slots(r);
    if (*st == KVR_OK)
        *st = kvr_active_list(&r->act, slot);
    if (*st != KVR_OK) {
        kvr_registry_remove(&r->reg, slot);
        return NULL;
    }
    assert(r->act.w[slot].nreqs == 0 && kvr_index_worker_blocks(&r->ix, slot) == 0);
    r->act.w[slot].key = kvr_mix64(info->id); /* the digest's names for it (kvr_router_digest) */
    kvr_index_set_key(&r->ix, slot, kvr_mix64(info->id + 1));
    kvr_pshare_clear(&r->psh, slot); /* a slot's previous worker's prefills are not its own */
    struct kvr_worker *w = &r->reg.by_slot[slot];
    w->block_size = info->block_size;
    r->ring_dirty = true;
    r->st.workers_joined++;
    return w;
}

/*
 * Worker w now announces capacity blocks: its clamped share of the index's bound changes, and the
 * bound follows (a lower one prunes at once, counted). O(1): the registry keeps the sum.
 */
static void size_index(struct kvr_router *r, struct kvr_worker *w, uint64_t capacity)
{
    kvr_registry_set_index_blocks(&r->reg, kvr_registry_slot(&r->reg, w),
                                  kvr_index_counted_blocks(&r->cfg, capacity));
    kvr_index_set_bound(&r->ix, kvr_index_bound(&r->cfg, r->reg.index_blocks));
}

kvr_status kvr_router_worker_seen(struct kvr_router *r, const struct kvr_worker_info *info,
                                  uint64_t now)
{
    if (!info || info->id == 0)
        return KVR_ERR_INVALID;
    if (info->block_size != r->cfg.block_size) {
        r->st.bad_block_size++;
        return KVR_ERR_BLOCK_SIZE;
    }
    struct kvr_worker *w = kvr_registry_find(&r->reg, info->id);
    if (!w) {
        kvr_status st;
        w = join(r, info, &st);
        if (!w)
            return st;
    }
    if (w->capacity_blocks != info->capacity_blocks)
        size_index(r, w, info->capacity_blocks);
    w->capacity_blocks = info->capacity_blocks;
    w->inv_capacity = info->capacity_blocks ? 1.0 / (double)info->capacity_blocks : 0.0;
    w->waiting = info->waiting;
    w->kv_usage = info->kv_usage;
    if (info->timeout_ns > w->timeout_ns) /* never shorter while it is known: one message cannot
                                             make a live worker time out */
        w->timeout_ns = info->timeout_ns;
    w->draining = info->draining;
    w->approximate = info->approximate;
    kvr_registry_sync_hot(&r->reg, kvr_registry_slot(&r->reg, w), r->cfg.busy_threshold);
    if (now > w->last_seen)
        w->last_seen = now;
    return KVR_OK;
}

void kvr__router_on_drop(void *ctx, uint64_t request_id, uint32_t slot)
{
    struct fail_ctx *f = ctx;
    uint64_t wid = f->worker_id;
    if (!wid && slot < f->r->reg.nslots)
        wid = f->r->reg.by_slot[slot].id;
    if (f->kind == KVR_EV_FAILED)
        f->r->st.failed_requests++;
    else
        f->r->st.expired_requests++;
    kvr__router_emit(f->r, f->kind, request_id, wid, f->status, NULL);
}

static void remove_worker(struct kvr_router *r, uint32_t slot)
{
    uint64_t id = r->reg.by_slot[slot].id;
    struct fail_ctx f = {r, id, KVR_EV_FAILED, KVR_ERR_WORKER_LOST};
    kvr_index_clear_worker(&r->ix, slot);
    kvr_active_drop_worker(&r->act, slot, kvr__router_on_drop, &f);
    assert(r->act.w[slot].nreqs == 0 && r->act.w[slot].blocks == 0 && r->act.w[slot].prefill == 0 &&
           kvr_index_worker_blocks(&r->ix, slot) == 0);
    kvr_active_unlist(&r->act, slot);
    kvr_registry_remove(&r->reg, slot);
    kvr_index_set_bound(&r->ix, kvr_index_bound(&r->cfg, r->reg.index_blocks));
    r->ring_dirty = true;
    r->st.workers_left++;
    kvr__router_emit(r, KVR_EV_WORKER_LEFT, 0, id, KVR_ERR_WORKER_LOST, NULL);
}

kvr_status kvr_router_worker_remove(struct kvr_router *r, uint64_t worker_id)
{
    struct kvr_worker *w = kvr_registry_find(&r->reg, worker_id);
    if (!w) {
        r->st.unknown_worker++;
        return KVR_ERR_UNKNOWN_WORKER;
    }
    remove_worker(r, kvr_registry_slot(&r->reg, w));
    return KVR_OK;
}

static struct kvr_worker *event_worker(struct kvr_router *r, uint64_t worker_id)
{
    struct kvr_worker *w = kvr_registry_find(&r->reg, worker_id);
    if (!w)
        r->st.unknown_worker++;
    return w;
}

/*
 * A router configured approximate keeps one truth, its decisions' TTL guesses: an event entry
 * would never expire and would outrank them, and the engines' event streams are what the operator
 * said not to trust. So Stored and Removed are counted and dropped (KVR_OK: not the sender's
 * fault).
 */
static bool ignore_kv(struct kvr_router *r)
{
    if (r->cfg.approximate)
        r->st.kv_ignored++;
    return r->cfg.approximate;
}

kvr_status kvr_router_kv_stored(struct kvr_router *r, uint64_t worker_id, const uint64_t *parent,
                                const struct kvr_kv_block *blocks, size_t n)
{
    struct kvr_worker *w = event_worker(r, worker_id);
    if (!w)
        return KVR_ERR_UNKNOWN_WORKER;
    if (ignore_kv(r))
        return KVR_OK;
    return kvr_index_stored(&r->ix, kvr_registry_slot(&r->reg, w), parent, blocks, n);
}

kvr_status kvr_router_kv_removed(struct kvr_router *r, uint64_t worker_id,
                                 const uint64_t *engine_ids, size_t n)
{
    struct kvr_worker *w = event_worker(r, worker_id);
    if (!w)
        return KVR_ERR_UNKNOWN_WORKER;
    if (ignore_kv(r))
        return KVR_OK;
    return kvr_index_removed(&r->ix, kvr_registry_slot(&r->reg, w), engine_ids, n);
}

kvr_status kvr_router_kv_cleared(struct kvr_router *r, uint64_t worker_id)
{
    struct kvr_worker *w = event_worker(r, worker_id);
    if (!w)
        return KVR_ERR_UNKNOWN_WORKER;
    kvr_index_clear_worker(&r->ix, kvr_registry_slot(&r->reg, w));
    return KVR_OK;
}

/* Remove every worker silent for longer than its timeout at now (the time up to which every
 * event that reached the router is applied). */
static void remove_silent(struct kvr_router *r, uint64_t now)
{
    for (uint32_t i = 0; i < r->reg.nlive;) {
        uint32_t slot = r->reg.order[i];
        const struct kvr_worker *w = &r->reg.by_slot[slot];
        uint64_t timeout = w->timeout_ns ? w->timeout_ns : r->cfg.worker_timeout_ns;
        if (timeout && w->last_seen + timeout <= now)
            remove_worker(r, slot); /* the next worker moves into position i */
        else
            i++;
    }
}

/* Tell the owner, at most once per index_warn_ns, that entries the engines hold were pruned. */
static void warn_pruned(struct kvr_router *r, uint64_t now)
{
    uint64_t pruned;
    if (r->cfg.index_warn && r->cfg.index_warn_ns &&
        kvr_index_prune_report(&r->ix, now, r->cfg.index_warn_ns, &pruned))
        r->cfg.index_warn(r->cfg.index_warn_ctx, pruned, r->ix.cfg.max_entries,
                          r->cfg.index_max_entries == 0);
}

void kvr_router_tick(struct kvr_router *r, uint64_t now)
{
    kvr_router_tick_heard(r, now, now);
}

void kvr_router_tick_queue(struct kvr_router *r, uint64_t now)
{
    r->last_now = now;
    kvr__router_drain(r, now);
}

void kvr_router_tick_heard(struct kvr_router *r, uint64_t now, uint64_t heard)
{
    r->last_now = now;
    warn_pruned(r, now);
    kvr_index_expire(&r->ix, now);
    kvr_early_expire(&r->early, now);
    if (r->cfg.request_ttl_ns && now >= r->cfg.request_ttl_ns) {
        struct fail_ctx f = {r, 0, KVR_EV_EXPIRED, KVR_ERR_TIMEOUT};
        kvr_active_expire(&r->act, now - r->cfg.request_ttl_ns, kvr__router_on_drop, &f);
    }
    remove_silent(r, heard < now ? heard : now);
    kvr_router_tick_queue(r, now);
}

void kvr_router_excuse_silence(struct kvr_router *r, uint64_t now)
{
    for (uint32_t i = 0; i < r->reg.nlive; i++) {
        struct kvr_worker *w = &r->reg.by_slot[r->reg.order[i]];
        if (w->last_seen < now)
            w->last_seen = now;
    }
}

void kvr_router_index_clear(struct kvr_router *r)
{
    for (uint32_t i = 0; i < r->reg.nlive; i++)
        kvr_index_clear_worker(&r->ix, r->reg.order[i]);
}
