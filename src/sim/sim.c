/*
 * kvr_sim, the event loop (sim_int.h lists the other files): one event heap ordered by (time,
 * insertion), so events at equal times keep their order and a run is a pure function of its
 * inputs. Engine publications travel to the routers as heap events after the configured delay,
 * each delivered to every replica in turn (KV events only in event mode); the client sees tokens at
 * engine time. Invariant: virtual time never goes back (every event is pushed at or after now, and
 * the heap pops the earliest). Single-threaded: one run, one thread.
 */
#include "sim.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "kvr/hash.h"
#include "sim_int.h"

void kvr__sim_fail(struct sim *s, kvr_status st)
{
    if (s->err == KVR_OK)
        s->err = st;
}

void kvr__sim_push(struct sim *s, uint64_t t, enum ev_kind kind, uint32_t worker, uint64_t arg,
                   void *payload)
{
    assert(t >= s->now); /* nothing is scheduled in the past */
    struct ev e = {t, s->next_seq++, arg, payload, kind, worker};
    if (!ev_heap_push(&s->heap, e)) {
        free(payload);
        kvr__sim_fail(s, KVR_ERR_NOMEM);
    }
}

/* --- engine publications: delayed on their way to the router --------------------------------- */

static uint64_t deliver_at(const struct sim *s)
{
    return s->now + s->cfg->event_delay_ns;
}

/* Approximate mode: the engines publish no KV events (their lifecycle events still flow). */
static bool withheld(const struct sim *s)
{
    return s->cfg->router.approximate;
}

static void on_stored(void *ctx, const uint64_t *parent, const struct kvr_kv_block *blocks,
                      size_t n)
{
    struct wctx *c = ctx;
    if (withheld(c->s))
        return;
    struct stored_msg *m = malloc(sizeof *m + n * sizeof *blocks);
    if (!m) {
        kvr__sim_fail(c->s, KVR_ERR_NOMEM);
        return;
    }
    m->has_parent = parent != NULL;
    m->parent = parent ? *parent : 0;
    m->n = (uint32_t)n;
    memcpy(m->blocks, blocks, n * sizeof *blocks);
    kvr__sim_push(c->s, deliver_at(c->s), EV_STORED, c->w, 0, m);
}

static void on_removed(void *ctx, const uint64_t *ids, size_t n)
{
    struct wctx *c = ctx;
    if (withheld(c->s))
        return;
    struct removed_msg *m = malloc(sizeof *m + n * sizeof *ids);
    if (!m) {
        kvr__sim_fail(c->s, KVR_ERR_NOMEM);
        return;
    }
    m->n = (uint32_t)n;
    memcpy(m->ids, ids, n * sizeof *ids);
    kvr__sim_push(c->s, deliver_at(c->s), EV_REMOVED, c->w, 0, m);
}

static void on_prefill(void *ctx, uint64_t id)
{
    struct wctx *c = ctx;
    kvr__sim_push(c->s, deliver_at(c->s), EV_PREFILL, c->w, id, NULL);
}

static void on_outblk(void *ctx, uint64_t id)
{
    struct wctx *c = ctx;
    kvr__sim_push(c->s, deliver_at(c->s), EV_OUTBLK, c->w, id, NULL);
}

static void issue_next(struct sim *s);

/* Request i's record k (kvr_sim_config.per_request), served by worker w. */
static void record(struct sim *s, uint32_t k, uint32_t i, uint32_t w,
                   const struct kvr_engine_result *res)
{
    uint32_t gaps = res->osl > 1 ? res->osl - 1 : 0;
    s->per_request[k] = (struct kvr_sim_request){
        .index = i,
        .worker = w,
        .group = kvr_workload_group(s->wl, i),
        .isl = res->isl,
        .osl = res->osl,
        .cached_tokens = res->cached_tokens,
        .preemptions = res->preemptions,
        .arrival_ms = (double)s->arrival[i] / 1e6,
        .queue_ms = s->queue[k],
        .ttft_ms = s->ttft[k],
        .e2e_ms = s->e2e[k],
        .itl_mean_ms = gaps ? res->itl_sum_ms / gaps : 0,
        .itl_max_ms = res->itl_max_ms,
    };
}

static void on_done(void *ctx, const struct kvr_engine_result *res)
{
    struct wctx *c = ctx;
    struct sim *s = c->s;
    uint32_t i = (uint32_t)(res->id - 1);
    uint32_t k = s->nfinished++;
    s->ttft[k] = (double)(res->first_token - s->arrival[i]) / 1e6;
    s->e2e[k] = (double)(res->finished - s->arrival[i]) / 1e6;
    s->queue[k] = (double)(res->admitted - s->arrival[i]) / 1e6;
    if (s->per_request)
        record(s, k, i, c->w, res);
    kvr__sim_request_itl(s, res);
    s->cached_tokens += res->cached_tokens;
    s->prompt_tokens += res->isl;
    s->output_tokens += res->osl;
    if (res->finished > s->last_finish)
        s->last_finish = res->finished;
    s->resolved++;
    kvr__sim_push(s, deliver_at(s), EV_DONE, c->w, res->id, NULL);
    issue_next(s);
}

/* --- routing and engines ---------------------------------------------------------------------- */

static void kick(struct sim *s, uint32_t w)
{
    if (s->busy[w])
        return;
    uint64_t dur = kvr_engine_step_begin(s->engines[w], s->now);
    if (dur) {
        s->busy[w] = true;
        kvr__sim_push(s, s->now + dur, EV_STEP_END, w, 0, NULL);
    }
}

/* Whether a closed loop has a next client's request to issue. */
static bool more_to_issue(const struct sim *s)
{
    return s->wl->reqs[0].arrival_ns == KVR_CLOSED_LOOP && s->next_issue < s->wl->nreqs;
}

/* A request resolved inside a call into the router (or a callback of one): the closed loop's next
 * request arrives as an event at the same time, since a callback must not call back into the
 * router (nor grow the scratch the call in progress still reads). */
static void issue_later(struct sim *s)
{
    if (more_to_issue(s))
        kvr__sim_push(s, s->now, EV_ARRIVAL, 0, s->next_issue++, NULL);
}

/*
 * The KV blocks request r needs of one engine, when it can never finish there (the engines are
 * alike); 0 when it can. As kvworker's fits_engine (src/worker/worker.c) counts them: its prompt
 * and output in the pool at once (the output as the max_tokens the client sends, or the request's
 * own output length when longer) within the pool less its free-block watermark (the engine admits
 * a chunk only while the watermark stays free, again after a preemption or with its prompt
 * cached: a first chunk that fits is not enough). A request within it finishes: the oldest running
 * request of an engine always gets its blocks, preempting the ones behind it.
 */
static uint64_t unfit_blocks(const struct sim *s, const struct kvr_wl_request *r)
{
    const struct kvr_engine_config *e = &s->cfg->engine;
    uint64_t B = e->block_size;
    uint64_t out = s->cfg->client_max_tokens > r->osl ? s->cfg->client_max_tokens : r->osl;
    uint64_t need = ((uint64_t)r->isl + out + B - 1) / B;
    return need + kvr_engine_watermark_blocks(e) > e->num_blocks ? need : 0;
}

/* Request i, sent to worker w, needs more of its KV pool than there is: the worker refuses it
 * before its engine sees it, and the routers hear of it as a done event. Counted as failed. */
static void refuse(struct sim *s, uint32_t i, uint32_t w, uint64_t need)
{
    s->failed++;
    s->resolved++;
    if (need > s->failed_blocks)
        s->failed_blocks = need;
    kvr__sim_push(s, deliver_at(s), EV_REFUSED, w, (uint64_t)i + 1, NULL);
    issue_later(s); /* from route() or inside a router call (a queued request placed) */
}

static void submit(struct sim *s, uint32_t i, uint32_t w, const uint64_t *local,
                   const uint64_t *seq, uint32_t nblocks)
{
    const struct kvr_wl_request *r = &s->wl->reqs[i];
    uint64_t need = unfit_blocks(s, r);
    if (need) {
        refuse(s, i, w, need);
        return;
    }
    struct kvr_engine_request er = {i + 1, seq, local, nblocks, r->isl, r->osl};
    kvr_status st = kvr_engine_submit(s->engines[w], &er, s->now);
    if (st != KVR_OK) {
        kvr__sim_fail(s, st);
        return;
    }
    s->per_worker[w]++;
    kick(s, w);
}

/* Housekeeping on one replica: it may place queued requests. */
static void tick(struct replica *rp)
{
    kvr_router_tick(rp->router, rp->s->now);
    kvr__sim_gossip_out(rp);
}

static void reject(struct sim *s)
{
    s->rejected++;
    s->resolved++;
    issue_next(s);
}

/* A request the router rejected from its queue, inside a call into it. */
static void reject_later(struct sim *s)
{
    s->rejected++;
    s->resolved++;
    issue_later(s);
}

static void route(struct sim *s, uint32_t i)
{
    const struct kvr_wl_request *r = &s->wl->reqs[i];
    uint32_t B = s->cfg->router.block_size;
    uint32_t nb = r->isl / B;
    s->arrival[i] = s->now;
    if (s->first_arrival == UINT64_MAX)
        s->first_arrival = s->now;
    uint64_t nhash = 2 * (uint64_t)nb + 2; /* past 32 bits at block size 1 and 2^31 tokens */
    if (nhash > UINT32_MAX) { /* the router's bound on prompts is far below: refused as too long */
        reject(s);
        return;
    }
    if (!KVR_GROW(s->scratch_tok, s->cap_tok, r->isl, 1024) ||
        !KVR_GROW(s->scratch_hash, s->cap_hash, (uint32_t)nhash, 1024)) {
        kvr__sim_fail(s, KVR_ERR_NOMEM);
        return;
    }
    kvr_workload_tokens(s->wl, i, s->scratch_tok);
    uint64_t *local = s->scratch_hash, *seq = s->scratch_hash + nb;
    kvr_hash_prompt(s->scratch_tok, r->isl, B, local, seq);
    struct kvr_request q = {.id = i + 1,
                            .tokens = s->scratch_tok,
                            .ntokens = r->isl,
                            .max_tokens =
                                s->cfg->client_max_tokens ? s->cfg->client_max_tokens : r->osl,
                            .seq_hashes = seq}; /* hashed once, for the engine too */
    struct kvr_decision d;
    struct replica *rp = &s->rep[s->nrep > 1 ? kvr_rng_below(&s->pick, s->nrep) : 0];
    kvr_status st = kvr_router_route(rp->router, &q, s->now, &d);
    if (st == KVR_OK && !d.queued) {
        kvr__sim_booked(rp, q.id);
        submit(s, i, (uint32_t)(d.worker_id - 1), local, seq, nb);
    } else if (st == KVR_OK) {
        struct pending *p = &s->pending[i];
        p->hashes = calloc(2 * (size_t)nb + 1, sizeof *p->hashes);
        if (!p->hashes) {
            kvr__sim_fail(s, KVR_ERR_NOMEM);
            return;
        }
        memcpy(p->hashes, s->scratch_hash, 2 * (size_t)nb * sizeof *p->hashes);
        p->nblocks = nb;
    } else {
        reject(s);
    }
    kvr__sim_gossip_out(rp); /* also what the route placed from the queue */
}

static void issue_next(struct sim *s)
{
    if (more_to_issue(s))
        route(s, s->next_issue++);
}

/* A replica's own reports: queued requests placed or rejected, requests failed. */
static void on_router_event(void *ctx, const struct kvr_event *ev)
{
    struct replica *rp = ctx;
    struct sim *s = rp->s;
    if (ev->kind != KVR_EV_PLACED && ev->kind != KVR_EV_REJECTED)
        return;
    uint32_t i = (uint32_t)(ev->request_id - 1);
    struct pending *p = &s->pending[i];
    if (ev->kind == KVR_EV_PLACED) {
        kvr__sim_booked(rp, ev->request_id);
        submit(s, i, (uint32_t)(ev->worker_id - 1), p->hashes, p->hashes + p->nblocks, p->nblocks);
    }
    free(p->hashes);
    p->hashes = NULL;
    if (ev->kind == KVR_EV_REJECTED)
        reject_later(s);
}

static void heartbeat(struct sim *s)
{
    for (uint32_t w = 0; w < s->cfg->workers; w++) {
        struct kvr_engine_stats es;
        kvr_engine_stats(s->engines[w], &es);
        struct kvr_worker_info info = {.id = w + 1,
                                       .block_size = s->cfg->engine.block_size,
                                       .capacity_blocks = s->cfg->engine.num_blocks,
                                       .waiting = es.waiting,
                                       .kv_usage = es.kv_usage};
        for (uint32_t k = 0; k < s->nrep; k++) {
            struct replica *rp = &s->rep[k];
            kvr_router_worker_seen(rp->router, &info, s->now);
            uint64_t predicted;
            if (kvr_router_worker_load(rp->router, w + 1, &predicted, NULL, NULL) == KVR_OK) {
                double err = fabs((double)predicted - (double)es.active_blocks);
                s->pred_abs += err;
                s->pred_actual += es.active_blocks;
                s->pred_n++;
                rp->pred_abs += err;
                rp->pred_actual += es.active_blocks;
            }
        }
    }
    for (uint32_t k = 0; k < s->nrep; k++) {
        struct kvr_router_stats rs;
        kvr_router_stats(s->rep[k].router, &rs);
        if (rs.index_entries > s->index_max)
            s->index_max = rs.index_entries;
        if (rs.memory_bytes > s->memory_max)
            s->memory_max = rs.memory_bytes;
    }
    for (uint32_t k = 0; k < s->nrep; k++)
        tick(&s->rep[k]);
}

/* What reaches the routers: an engine's publication, or a peer's booking. */
static void deliver(struct sim *s, struct replica *rp, const struct ev *e)
{
    struct kvr_router *r = rp->router;
    uint64_t wid = (uint64_t)e->worker + 1;
    switch ((enum ev_kind)e->kind) {
    case EV_STORED: {
        const struct stored_msg *m = e->payload;
        kvr_router_kv_stored(r, wid, m->has_parent ? &m->parent : NULL, m->blocks, m->n);
        break;
    }
    case EV_REMOVED: {
        const struct removed_msg *m = e->payload;
        kvr_router_kv_removed(r, wid, m->ids, m->n);
        break;
    }
    case EV_PREFILL:
        kvr_router_prefill_done(r, e->arg, s->now);
        tick(rp);
        break;
    case EV_OUTBLK:
        kvr_router_output_block(r, e->arg, s->now);
        break;
    case EV_DONE:
        kvr_router_finished(r, e->arg, s->now, s->wl->reqs[e->arg - 1].osl);
        tick(rp);
        break;
    case EV_REFUSED: /* no output: nothing to learn of its max_tokens */
        kvr_router_done_at(r, e->arg, s->now);
        tick(rp);
        break;
    case EV_GOSSIP: /* the replica that booked it (worker) already has it */
        if (rp->i != e->worker &&
            kvr_router_import(r, &((const struct gossip_msg *)e->payload)->rec, s->now) == KVR_OK)
            s->gossip_imports++;
        break;
    default:
        break;
    }
}

/*
 * Whether anything is left to happen but heartbeats: an event due (an arrival, a step's end, a
 * delivery), or a request in a router's queue (a later tick places or rejects it, within the queue
 * timeout). Otherwise the requests still unresolved sit in engines that will never run them (an
 * engine moves only at a step, and none is due; unfit_blocks keeps out the requests known to), and
 * heartbeats would pass the time for ever: they stop, and the run ends with them unresolved.
 */
static bool can_progress(const struct sim *s)
{
    if (s->heap.n)
        return true;
    for (uint32_t k = 0; k < s->nrep; k++)
        if (kvr_router_queue_len(s->rep[k].router))
            return true;
    return false;
}

static void handle(struct sim *s, struct ev *e)
{
    switch ((enum ev_kind)e->kind) {
    case EV_ARRIVAL:
        route(s, (uint32_t)e->arg);
        break;
    case EV_STEP_END: /* requests that arrive during step_end's callbacks just queue */
        kvr_engine_step_end(s->engines[e->worker], s->now);
        s->busy[e->worker] = false;
        kick(s, e->worker);
        break;
    case EV_STORED:
    case EV_REMOVED:
    case EV_PREFILL:
    case EV_OUTBLK:
    case EV_DONE:
    case EV_GOSSIP:
    case EV_REFUSED:
        for (uint32_t k = 0; k < s->nrep; k++)
            deliver(s, &s->rep[k], e);
        break;
    case EV_HEARTBEAT:
        heartbeat(s);
        if (s->resolved < s->wl->nreqs && can_progress(s))
            kvr__sim_push(s, s->now + s->cfg->heartbeat_ns, EV_HEARTBEAT, 0, 0, NULL);
        break;
    }
    free(e->payload);
}

static kvr_status setup(struct sim *s, const struct kvr_workload *w,
                        const struct kvr_sim_config *cfg)
{
    memset(s, 0, sizeof *s);
    s->wl = w;
    s->cfg = cfg;
    s->first_arrival = UINT64_MAX;
    uint32_t n = w->nreqs, nw = cfg->workers;
    s->nrep = cfg->replicas ? cfg->replicas : 1;
    s->gossip = s->nrep > 1 && cfg->gossip;
    if (!n || !nw || cfg->engine.block_size != cfg->router.block_size || !(cfg->rate_scale > 0) ||
        !cfg->heartbeat_ns || s->nrep > KVR_SIM_MAX_REPLICAS)
        return KVR_ERR_INVALID;
    s->arrival = calloc(n, sizeof *s->arrival);
    s->pending = calloc(n, sizeof *s->pending);
    s->ttft = calloc(n, sizeof *s->ttft);
    s->e2e = calloc(n, sizeof *s->e2e);
    s->queue = calloc(n, sizeof *s->queue);
    s->itl_req = calloc(n, sizeof *s->itl_req);
    s->engines = calloc(nw, sizeof *s->engines);
    s->wctx = calloc(nw, sizeof *s->wctx);
    s->busy = calloc(nw, sizeof *s->busy);
    s->per_worker = calloc(nw, sizeof *s->per_worker);
    s->rep = calloc(s->nrep, sizeof *s->rep);
    if (cfg->per_request && !(s->per_request = calloc(n, sizeof *s->per_request)))
        return KVR_ERR_NOMEM;
    if (!s->arrival || !s->pending || !s->ttft || !s->e2e || !s->queue || !s->itl_req ||
        !s->engines || !s->wctx || !s->busy || !s->per_worker || !s->rep)
        return KVR_ERR_NOMEM;
    kvr_rng_seed(&s->pick, cfg->router.seed ^ 0x7265706c69636173ull); /* "replicas" */
    kvr_status st;
    for (uint32_t k = 0; k < s->nrep; k++) { /* replica 0 is the single router, seed and all */
        struct replica *rp = &s->rep[k];
        struct kvr_router_config rc = cfg->router;
        rc.on_event = on_router_event;
        rc.event_ctx = rp;
        rc.seed = k ? kvr_mix64(cfg->router.seed + k) : cfg->router.seed;
        rp->s = s;
        rp->i = k;
        rp->router = kvr_router_create(&rc, &st);
        if (!rp->router)
            return st;
    }
    for (uint32_t i = 0; i < nw; i++) {
        s->wctx[i] = (struct wctx){s, i};
        struct kvr_engine_sink sink = {&s->wctx[i], on_stored,          on_removed, on_prefill,
                                       on_outblk,   kvr__sim_token_gap, NULL,       on_done};
        s->engines[i] = kvr_engine_create(&cfg->engine, &sink, &st);
        if (!s->engines[i])
            return st;
    }
    heartbeat(s); /* every worker announces itself before the first request */
    return KVR_OK;
}

static void teardown(struct sim *s)
{
    while (s->heap.n)
        free(ev_heap_pop(&s->heap).payload);
    ev_heap_free(&s->heap);
    if (s->pending)
        for (uint32_t i = 0; i < s->wl->nreqs; i++)
            free(s->pending[i].hashes);
    for (uint32_t i = 0; s->engines && i < s->cfg->workers; i++)
        kvr_engine_destroy(s->engines[i]);
    for (uint32_t k = 0; s->rep && k < s->nrep; k++) {
        kvr_router_destroy(s->rep[k].router);
        free(s->rep[k].booked);
    }
    free(s->rep);
    free(s->engines);
    free(s->wctx);
    free(s->busy);
    free(s->per_worker);
    free(s->arrival);
    free(s->pending);
    free(s->ttft);
    free(s->e2e);
    free(s->queue);
    free(s->itl_req);
    free(s->per_request);
    free(s->scratch_tok);
    free(s->scratch_hash);
    free(s->itl);
}

void kvr_sim_config_default(struct kvr_sim_config *c)
{
    memset(c, 0, sizeof *c);
    c->workers = 8;
    kvr_engine_config_default(&c->engine);
    kvr_router_config_default(&c->router);
    c->router.block_size = c->engine.block_size;
    c->router.tie_margin = KVR_TIE_MARGIN; /* as kvrouter runs */
    c->event_delay_ns = 1000000;
    c->heartbeat_ns = 100000000;
    c->rate_scale = 1.0;
    c->concurrency = 20;
    c->replicas = 1;
    c->gossip = true;
    c->gossip_delay_ns = 1000000;
}

kvr_status kvr_sim_run(const struct kvr_workload *w, const struct kvr_sim_config *cfg,
                       struct kvr_sim_result *out)
{
    struct sim s;
    memset(out, 0, sizeof *out);
    kvr_status st = setup(&s, w, cfg);
    if (st == KVR_OK) {
        bool closed = w->reqs[0].arrival_ns == KVR_CLOSED_LOOP;
        out->load = closed ? cfg->concurrency : cfg->rate_scale;
        if (closed) {
            for (uint32_t c = 0; c < cfg->concurrency && s.next_issue < w->nreqs; c++)
                issue_next(&s);
        } else {
            for (uint32_t i = 0; i < w->nreqs; i++)
                kvr__sim_push(&s, (uint64_t)((double)w->reqs[i].arrival_ns / cfg->rate_scale),
                              EV_ARRIVAL, 0, i, NULL);
        }
        kvr__sim_push(&s, cfg->heartbeat_ns, EV_HEARTBEAT, 0, 0, NULL);
        uint32_t reported = 0;
        while (s.heap.n && s.resolved < w->nreqs && s.err == KVR_OK) {
            struct ev e = ev_heap_pop(&s.heap);
            assert(e.t >= s.now); /* the heap order: time never goes back */
            s.now = e.t;
            handle(&s, &e);
            if (cfg->progress && s.resolved >= reported + 256) {
                reported = s.resolved;
                cfg->progress(cfg->progress_ctx, s.resolved, w->nreqs, s.now);
            }
        }
        if (s.err == KVR_OK && s.resolved < w->nreqs)
            s.err = KVR_ERR_TIMEOUT; /* the event queue ran dry with requests unresolved */
        st = s.err;
        if (st == KVR_OK)
            kvr__sim_collect(&s, out);
        if (st == KVR_ERR_TIMEOUT) { /* how far it got, for the error */
            out->requests = w->nreqs;
            out->finished = s.nfinished;
            out->rejected = s.rejected;
            out->failed = s.failed;
        }
    }
    teardown(&s);
    return st;
}

void kvr_sim_result_free(struct kvr_sim_result *r)
{
    free(r->ttft_sorted);
    r->ttft_sorted = NULL;
    free(r->per_request);
    r->per_request = NULL;
}
