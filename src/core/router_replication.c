/*
 * What router replicas exchange (docs/architecture.md, "A fleet of routers"): a decision as a
 * record (export, import: booked exactly like a local decision, with the events that came before
 * it applied and a done's tombstone honoured), the index entries, anti-entropy against a worker's
 * own list of the requests it holds, and a digest of the state. Invariant: import is idempotent
 * (a known request is refused as a duplicate, one whose done came first stays refused), so a
 * decision may arrive by gossip, repair and snapshot alike. Single-threaded: the router's state
 * thread; the export callbacks must not call back into the router.
 */
#include "kvr/router.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "kvr/rng.h"
#include "router_int.h"

/* rec's worker, or NULL with why (*st) when rec could not be booked whatever this router holds. */
static struct kvr_worker *importable(struct kvr_router *r, const struct kvr_request_record *rec,
                                     kvr_status *st)
{
    *st = KVR_ERR_INVALID;
    if (!rec || rec->request_id == 0 || (rec->nblocks && !rec->block_hashes) ||
        rec->overlap_blocks > rec->nblocks)
        return NULL;
    struct kvr_worker *w = kvr_registry_find(&r->reg, rec->worker_id);
    if (!w) {
        *st = KVR_ERR_UNKNOWN_WORKER;
        return NULL;
    }
    /* a record from the wire: no request holds more blocks than its worker has, nor more than the
     * prompt and output limits allow (a capacity is from the wire too) */
    uint64_t cap = w->capacity_blocks ? w->capacity_blocks : 65536u; /* unknown: a prompt's worth */
    uint64_t bs = r->cfg.block_size;
    if (rec->output_blocks > cap || rec->nblocks > cap ||
        rec->nblocks > r->cfg.max_prompt_tokens / bs + 1 ||
        rec->output_blocks > r->cfg.max_output_tokens / bs + 2 ||
        rec->prompt_tokens > r->cfg.max_prompt_tokens)
        return NULL;
    *st = KVR_OK;
    return w;
}

kvr_status kvr_router_import_check(struct kvr_router *r, const struct kvr_request_record *rec)
{
    kvr_status st;
    importable(r, rec, &st);
    return st;
}

kvr_status kvr_router_import(struct kvr_router *r, const struct kvr_request_record *rec,
                             uint64_t now)
{
    kvr_status st;
    struct kvr_worker *w = importable(r, rec, &st);
    if (!w) {
        r->st.unknown_worker += st == KVR_ERR_UNKNOWN_WORKER;
        return st;
    }
    if (kvr_active_find(&r->act, rec->request_id)) {
        r->st.duplicate_request++;
        return KVR_ERR_DUPLICATE;
    }
    /* the bound holds whoever decided (peers' decisions, a booked select); one whose done came
     * first is not in flight: a tombstone, below */
    if (kvr_active_count(&r->act) >= r->cfg.max_inflight &&
        !kvr_early_done(&r->early, rec->request_id))
        return KVR_ERR_FULL;
    struct kvr_early_rec early;
    bool had_early = kvr_early_take(&r->early, rec->request_id, &early);
    uint32_t slot = kvr_registry_slot(&r->reg, w);
    if (had_early && early.done) { /* its done overtook it: it is over */
        /* keep the tombstone: the same decision may come again (gossip, then a snapshot) */
        kvr_early_note(&r->early, rec->request_id, KVR_EARLY_DONE, now);
        r->st.late_decisions++;
        if (!rec->prefill_done) /* its prefill ran, as its origin counted: so do we */
            kvr__router_note_prefill(r, slot, rec->prompt_tokens, rec->overlap_blocks, now);
        return KVR_ERR_DUPLICATE;
    }
    st = kvr__router_ensure_blocks(r, rec->nblocks);
    if (st != KVR_OK)
        return st;
    st = kvr__router_book(r, rec->request_id, slot, rec->block_hashes, r->nodes, 0, rec->nblocks,
                          rec->prompt_tokens, rec->overlap_blocks, now);
    if (st != KVR_OK)
        return st;
    r->st.decisions++;
    /* a decision as its origin sent it counts its prefill here as there, whatever events came
     * first, so replicas price alike (the tie margin lets two routers deciding one request on the
     * same state pick one worker); a repair or a snapshot of one whose prefill ran, at some time
     * the record does not say, does not */
    bool noted = !rec->prefill_done &&
                 kvr__router_note_prefill(r, slot, rec->prompt_tokens, rec->overlap_blocks, now);
    /* its max_tokens: its completion teaches learn_output here too */
    kvr_active_set_booked(&r->act, rec->request_id, kvr__router_max_tokens(r, rec->max_tokens),
                          noted);
    if (rec->prefill_done || (had_early && early.prefill_done))
        kvr_active_prefill_done(&r->act, rec->request_id, now);
    /* the record and the early events may both count the same blocks (a snapshot taken after
     * events this replica also saw): the larger count, never the sum */
    uint32_t out = rec->output_blocks;
    if (had_early && early.outblocks > out)
        out = early.outblocks;
    if (out)
        kvr_active_output_blocks(&r->act, rec->request_id, out, now);
    return KVR_OK;
}

kvr_status kvr_router_book(struct kvr_router *r, uint64_t request_id, uint64_t worker_id,
                           const uint64_t *block_hashes, uint32_t nblocks, uint32_t prompt_tokens,
                           uint32_t overlap_blocks, uint64_t now)
{
    struct kvr_request_record rec = {
        request_id, worker_id, block_hashes, nblocks, prompt_tokens, overlap_blocks, false, 0, 0};
    return kvr_router_import(r, &rec, now);
}

static void fill_record(struct kvr_router *r, const struct kvr_active_req *q,
                        struct kvr_request_record *out)
{
    /* short of memory, the record goes without its hashes (a peer books it as a bare request) */
    uint32_t n = KVR_GROW(r->export_hashes, r->cap_export, q->nnodes, 64) ? q->nnodes : 0;
    for (uint32_t i = 0; i < n; i++)
        r->export_hashes[i] = kvr_blocktab_node(&r->tab, q->nodes[i])->seq;
    uint32_t partial = q->prompt_tokens % r->cfg.block_size ? 1 : 0;
    out->request_id = q->id;
    out->worker_id = r->reg.by_slot[q->slot].id;
    out->block_hashes = r->export_hashes;
    out->nblocks = n;
    out->prompt_tokens = q->prompt_tokens;
    out->overlap_blocks = q->overlap < n ? q->overlap : n;
    out->prefill_done = q->prefill == 0;
    out->output_blocks = q->extra > partial ? q->extra - partial : 0;
    out->max_tokens = q->max_tokens;
}

kvr_status kvr_router_export(struct kvr_router *r, uint64_t request_id,
                             struct kvr_request_record *out)
{
    const struct kvr_active_req *q = kvr_active_find(&r->act, request_id);
    if (!q)
        return KVR_ERR_UNKNOWN_REQUEST;
    fill_record(r, q, out);
    return KVR_OK;
}

struct export_ctx {
    struct kvr_router *r;
    void (*fn)(void *, const struct kvr_request_record *);
    void *ctx;
};

static void export_one(void *ctx, const struct kvr_active_req *q)
{
    struct export_ctx *x = ctx;
    struct kvr_request_record rec;
    fill_record(x->r, q, &rec);
    x->fn(x->ctx, &rec);
}

void kvr_router_export_begin(struct kvr_router *r)
{
    kvr_active_walk_begin(&r->act);
    kvr_index_walk_begin(&r->ix);
}

uint32_t kvr_router_export_requests_some(struct kvr_router *r,
                                         void (*fn)(void *ctx,
                                                    const struct kvr_request_record *rec),
                                         void *ctx, uint32_t max)
{
    struct export_ctx x = {r, fn, ctx};
    return kvr_active_walk(&r->act, export_one, &x, max);
}

void kvr_router_export_requests(struct kvr_router *r,
                                void (*fn)(void *ctx, const struct kvr_request_record *rec),
                                void *ctx)
{
    struct export_ctx x = {r, fn, ctx};
    kvr_active_each(&r->act, export_one, &x);
}

struct index_export_ctx {
    struct kvr_router *r;
    void (*fn)(void *, const struct kvr_index_record *);
    void *ctx;
    uint64_t now;
};

static void export_entry(void *ctx, uint32_t slot, uint64_t seq, bool has_engine,
                         uint64_t engine_id, uint64_t expires)
{
    struct index_export_ctx *x = ctx;
    struct kvr_index_record rec = {x->r->reg.by_slot[slot].id, seq, has_engine, engine_id,
                                   !has_engine && expires > x->now ? expires - x->now : 0};
    if (has_engine || rec.ttl_left_ns)
        x->fn(x->ctx, &rec);
}

uint32_t kvr_router_export_index_some(struct kvr_router *r,
                                      void (*fn)(void *ctx, const struct kvr_index_record *rec),
                                      void *ctx, uint64_t now, uint32_t max)
{
    struct index_export_ctx x = {r, fn, ctx, now};
    return kvr_index_walk(&r->ix, export_entry, &x, max);
}

void kvr_router_export_index(struct kvr_router *r,
                             void (*fn)(void *ctx, const struct kvr_index_record *rec), void *ctx,
                             uint64_t now)
{
    struct index_export_ctx x = {r, fn, ctx, now};
    kvr_index_each(&r->ix, export_entry, &x);
}

kvr_status kvr_router_import_index(struct kvr_router *r, const struct kvr_index_record *rec,
                                   uint64_t now)
{
    struct kvr_worker *w = kvr_registry_find(&r->reg, rec->worker_id);
    if (!w) {
        r->st.unknown_worker++;
        return KVR_ERR_UNKNOWN_WORKER;
    }
    /* a TTL from the wire: no longer than this router's own (an entry that outlived it would
     * stall the expiry of those behind it), and no sum that wraps */
    uint64_t ttl = rec->ttl_left_ns < r->cfg.index_ttl_ns ? rec->ttl_left_ns : r->cfg.index_ttl_ns;
    return kvr_index_import(&r->ix, kvr_registry_slot(&r->reg, w), rec->seq, rec->has_engine,
                            rec->engine_id, now + ttl);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static bool holds(const uint64_t *sorted, uint32_t n, uint64_t key)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (sorted[mid] < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && sorted[lo] == key;
}

/*
 * Mark or collect (into victims, room for the worker's requests) the requests of slot booked more
 * than grace before now that the worker's sorted list keys[0..n) does not hold: a first miss
 * marks, a second at least grace/2 later collects. Returns how many were collected.
 */
static uint32_t strike(struct kvr_router *r, uint32_t slot, const uint64_t *sorted, uint32_t n,
                       uint64_t now, uint64_t grace, uint64_t *victims)
{
    uint32_t nvictims = 0;
    for (uint32_t h = r->act.w[slot].reqs.head; h != KVR_NIL;) {
        struct kvr_active_req *q = kvr_pool_get(&r->act.reqs, h);
        assert(q->slot == slot); /* the worker's list holds its own requests only */
        h = q->wl.next;
        if (holds(sorted, n, q->id) || q->booked_ns + grace >= now)
            q->missed_ns = 0;
        else if (!q->missed_ns)
            q->missed_ns = now; /* first strike */
        else if (now - q->missed_ns >= grace / 2)
            victims[nvictims++] = q->id;
    }
    return nvictims;
}

uint32_t kvr_router_reconcile(struct kvr_router *r, uint64_t worker_id, const uint64_t *keys,
                              uint32_t n, uint64_t now, uint64_t grace, uint64_t *unknown,
                              uint32_t *nunknown, uint32_t max)
{
    *nunknown = 0;
    struct kvr_worker *w = kvr_registry_find(&r->reg, worker_id);
    if (!w)
        return 0;
    uint32_t k = 1;
    while (k < n && keys[k - 1] <= keys[k])
        k++;
    uint64_t *copy = NULL; /* keys sorted here, unless they came so (kvrouter sorts them first) */
    if (k < n) {
        if (!(copy = malloc((size_t)n * sizeof *copy)))
            return 0;
        memcpy(copy, keys, (size_t)n * sizeof *copy);
        qsort(copy, n, sizeof *copy, cmp_u64);
    }
    const uint64_t *sorted = copy ? copy : keys;
    uint32_t slot = kvr_registry_slot(&r->reg, w), dropped = 0;
    /* collect first: dropping while walking the worker's list would unlink under our feet */
    uint32_t cap = r->act.w[slot].nreqs;
    uint64_t *victims = cap ? malloc((size_t)cap * sizeof *victims) : NULL;
    uint32_t nvictims = victims ? strike(r, slot, sorted, n, now, grace, victims) : 0;
    assert(nvictims <= cap);
    struct fail_ctx f = {r, worker_id, KVR_EV_EXPIRED, KVR_ERR_NOT_DELIVERED};
    for (uint32_t i = 0; i < nvictims; i++)
        dropped += kvr_active_drop(&r->act, victims[i], kvr__router_on_drop, &f) == KVR_OK;
    r->st.reconciled += dropped;
    for (uint32_t i = 0; i < n && *nunknown < max; i++)
        if (!kvr_active_find(&r->act, keys[i]) && kvr_map_get(&r->early.ids, keys[i]) == KVR_NIL)
            unknown[(*nunknown)++] = keys[i];
    free(victims);
    free(copy);
    return dropped;
}

/* The requests' and the index's parts are kept as they change (kvr_active and kvr_index's
 * digest, each item named by its worker's key, set when the worker joins): a digest costs a pass
 * over the workers, not over the state (a walk of the index cost ~6 ns an entry under the router's
 * mutex, on every $SRV.STATS anyone may ask). */
void kvr_router_digest(struct kvr_router *r, struct kvr_digest *out)
{
    memset(out, 0, sizeof *out);
    for (uint32_t i = 0; i < r->reg.nlive; i++)
        out->workers ^= kvr_mix64(r->reg.by_slot[r->reg.order[i]].id);
    out->nworkers = r->reg.nlive;
    out->requests = r->act.digest;
    out->nrequests = kvr_active_count(&r->act);
    out->index = r->ix.digest;
    out->nentries = kvr_index_entries(&r->ix);
    out->combined = kvr_mix64(out->workers ^ kvr_mix64(out->requests ^ kvr_mix64(out->index)));
}
