/*
 * kvr_sim implementation: one event heap ordered by (time, insertion), so events at equal times
 * keep their order and a run is a pure function of its inputs. Engine publications travel to the
 * routers as heap events after the configured delay, each delivered to every replica in turn; the
 * client sees tokens at engine time. A replica's bookings are exported once its call returns (the
 * event callback must not call back into the router) and travel to the others as one heap event.
 */
#include "sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/hash.h"
#include "kvr/rng.h"
#include "grow.h"
#include "map.h"

enum ev_kind {
    EV_ARRIVAL,   /* arg: request index */
    EV_STEP_END,  /* worker */
    EV_STORED,    /* worker, payload: struct stored_msg */
    EV_REMOVED,   /* worker, payload: struct removed_msg */
    EV_PREFILL,   /* worker, arg: request id */
    EV_OUTBLK,    /* worker, arg: request id */
    EV_DONE,      /* worker, arg: request id */
    EV_HEARTBEAT, /* */
    EV_GOSSIP,    /* worker: the replica that booked, payload: struct gossip_msg */
};

struct ev {
    uint64_t t;
    uint64_t seq;
    uint64_t arg;
    void *payload;
    uint32_t kind;
    uint32_t worker;
};

struct stored_msg {
    bool has_parent;
    uint64_t parent;
    uint32_t n;
    struct kvr_kv_block blocks[];
};

struct removed_msg {
    uint32_t n;
    uint64_t ids[];
};

/* One booking on its way to the other replicas (rec.block_hashes points at hashes). */
struct gossip_msg {
    struct kvr_request_record rec;
    uint64_t hashes[];
};

/* A request's prompt hashes while it waits in the router's queue. */
struct pending {
    uint64_t *hashes; /* nblocks local, then nblocks seq */
    uint32_t nblocks;
};

#define ITL_BUCKETS 2400 /* 1 % wide buckets from 0.01 ms */

struct sim;

struct wctx {
    struct sim *s;
    uint32_t w;
};

/* One router replica and what the simulation keeps of it. */
struct replica {
    struct sim *s;
    uint32_t i;
    struct kvr_router *router;
    uint64_t *booked; /* requests it booked in the current call, to gossip once it returns */
    uint32_t nbooked, cap_booked;
    uint64_t sent;                /* gossip messages it sent (their seq) */
    double pred_abs, pred_actual; /* its prediction error, as the sim's totals */
};

struct sim {
    const struct kvr_workload *wl;
    const struct kvr_sim_config *cfg;
    struct replica *rep;
    uint32_t nrep;
    bool gossip;         /* more than one replica, and gossip on */
    struct kvr_rng pick; /* which replica a request reaches */
    struct kvr_engine **engines;
    struct wctx *wctx;
    bool *busy;
    uint32_t *per_worker; /* requests routed to each */
    struct ev *heap;
    size_t nheap, capheap;
    uint64_t next_seq;
    uint64_t now;
    kvr_status err; /* first failure, ends the run */
    /* requests */
    uint64_t *arrival; /* per request: when it reached the router */
    struct pending *pending;
    uint32_t next_issue; /* closed loop: next request to issue */
    uint32_t resolved;   /* finished + rejected */
    uint32_t *scratch_tok;
    uint32_t cap_tok;
    uint64_t *scratch_hash;
    uint32_t cap_hash;
    /* metrics */
    double *ttft, *e2e, *queue;
    uint32_t nfinished, rejected;
    uint64_t cached_tokens, prompt_tokens, output_tokens;
    uint64_t first_arrival, last_finish;
    uint64_t itl_hist[ITL_BUCKETS];
    double itl_sum, itl_max;
    uint64_t itl_n;
    double pred_abs, pred_actual;
    uint64_t pred_n;
    uint64_t index_max, memory_max;
    uint64_t decisions, gossip_msgs, gossip_bytes, gossip_imports;
};

static void fail(struct sim *s, kvr_status st)
{
    if (s->err == KVR_OK)
        s->err = st;
}

static void push(struct sim *s, uint64_t t, enum ev_kind kind, uint32_t worker, uint64_t arg,
                 void *payload)
{
    if (s->nheap == s->capheap) {
        size_t cap = s->capheap ? s->capheap * 2 : 1024;
        struct ev *h = realloc(s->heap, cap * sizeof *h);
        if (!h) {
            free(payload);
            fail(s, KVR_ERR_NOMEM);
            return;
        }
        s->heap = h;
        s->capheap = cap;
    }
    struct ev e = {t, s->next_seq++, arg, payload, kind, worker};
    size_t i = s->nheap++;
    while (i) {
        size_t p = (i - 1) / 2;
        struct ev *q = &s->heap[p];
        if (q->t < e.t || (q->t == e.t && q->seq < e.seq))
            break;
        s->heap[i] = *q;
        i = p;
    }
    s->heap[i] = e;
}

static struct ev pop(struct sim *s)
{
    struct ev top = s->heap[0];
    struct ev last = s->heap[--s->nheap];
    size_t i = 0, n = s->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && (s->heap[c + 1].t < s->heap[c].t || (s->heap[c + 1].t == s->heap[c].t &&
                                                              s->heap[c + 1].seq < s->heap[c].seq)))
            c++;
        if (last.t < s->heap[c].t || (last.t == s->heap[c].t && last.seq < s->heap[c].seq))
            break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n)
        s->heap[i] = last;
    return top;
}

/* --- engine publications: delayed on their way to the router --------------------------------- */

static uint64_t deliver_at(const struct sim *s)
{
    return s->now + s->cfg->event_delay_ns;
}

static void on_stored(void *ctx, const uint64_t *parent, const struct kvr_kv_block *blocks,
                      size_t n)
{
    struct wctx *c = ctx;
    struct stored_msg *m = malloc(sizeof *m + n * sizeof *blocks);
    if (!m) {
        fail(c->s, KVR_ERR_NOMEM);
        return;
    }
    m->has_parent = parent != NULL;
    m->parent = parent ? *parent : 0;
    m->n = (uint32_t)n;
    memcpy(m->blocks, blocks, n * sizeof *blocks);
    push(c->s, deliver_at(c->s), EV_STORED, c->w, 0, m);
}

static void on_removed(void *ctx, const uint64_t *ids, size_t n)
{
    struct wctx *c = ctx;
    struct removed_msg *m = malloc(sizeof *m + n * sizeof *ids);
    if (!m) {
        fail(c->s, KVR_ERR_NOMEM);
        return;
    }
    m->n = (uint32_t)n;
    memcpy(m->ids, ids, n * sizeof *ids);
    push(c->s, deliver_at(c->s), EV_REMOVED, c->w, 0, m);
}

static void on_prefill(void *ctx, uint64_t id)
{
    struct wctx *c = ctx;
    push(c->s, deliver_at(c->s), EV_PREFILL, c->w, id, NULL);
}

static void on_outblk(void *ctx, uint64_t id)
{
    struct wctx *c = ctx;
    push(c->s, deliver_at(c->s), EV_OUTBLK, c->w, id, NULL);
}

static void on_gap(void *ctx, double gap)
{
    struct sim *s = ((struct wctx *)ctx)->s;
    int b = gap <= 0.01 ? 0 : (int)(log(gap / 0.01) / log(1.01));
    if (b >= ITL_BUCKETS)
        b = ITL_BUCKETS - 1;
    s->itl_hist[b]++;
    s->itl_sum += gap;
    s->itl_n++;
    if (gap > s->itl_max)
        s->itl_max = gap;
}

static void issue_next(struct sim *s);

static void on_done(void *ctx, const struct kvr_engine_result *res)
{
    struct wctx *c = ctx;
    struct sim *s = c->s;
    uint32_t i = (uint32_t)(res->id - 1);
    uint32_t k = s->nfinished++;
    s->ttft[k] = (double)(res->first_token - s->arrival[i]) / 1e6;
    s->e2e[k] = (double)(res->finished - s->arrival[i]) / 1e6;
    s->queue[k] = (double)(res->admitted - s->arrival[i]) / 1e6;
    s->cached_tokens += res->cached_tokens;
    s->prompt_tokens += res->isl;
    s->output_tokens += res->osl;
    if (res->finished > s->last_finish)
        s->last_finish = res->finished;
    s->resolved++;
    push(s, deliver_at(s), EV_DONE, c->w, res->id, NULL);
    issue_next(s);
}

/* --- routing and engines -----------------------------------------------------------------------
 */

static void kick(struct sim *s, uint32_t w)
{
    if (s->busy[w])
        return;
    uint64_t dur = kvr_engine_step_begin(s->engines[w], s->now);
    if (dur) {
        s->busy[w] = true;
        push(s, s->now + dur, EV_STEP_END, w, 0, NULL);
    }
}

static void submit(struct sim *s, uint32_t i, uint32_t w, const uint64_t *local,
                   const uint64_t *seq, uint32_t nblocks)
{
    const struct kvr_wl_request *r = &s->wl->reqs[i];
    struct kvr_engine_request er = {i + 1, seq, local, nblocks, r->isl, r->osl};
    kvr_status st = kvr_engine_submit(s->engines[w], &er, s->now);
    if (st != KVR_OK) {
        fail(s, st);
        return;
    }
    s->per_worker[w]++;
    kick(s, w);
}

static bool grow(void **p, uint32_t *cap, uint32_t need, size_t size)
{
    return kvr_grow(p, cap, need, size, 1024);
}

/* --- router replicas: each booking gossiped to the others ------------------------------------- */

/*
 * The wire size of the Gossip message kvrouter publishes for a booking (proto/kvrouter/v1:
 * Gossip{router_id, epoch, seq, Decision{request_key, worker_id, block_hashes (packed),
 * prompt_tokens, overlap_blocks, reply, request_id, origin}}), counted as protobuf encodes it:
 * one-byte tags, varints at their real length, zero fields left out. What the simulation does not
 * have is given a typical size: 64-bit hashes (request key, epoch) 10 bytes, router ids
 * ("host-pid") 12 bytes, the client's reply subject ("_INBOX.<22-char nuid>.<n>") 36, its request
 * id 16. So a decision of n blocks costs about 9.5 n + 125 bytes (the block hashes, random 64-bit
 * values, take 9 or 10 bytes each).
 */
#define WIRE_HASH       10
#define WIRE_ROUTER_ID  12
#define WIRE_REPLY      36
#define WIRE_REQUEST_ID 16

static uint32_t varint_len(uint64_t v)
{
    uint32_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* A length-delimited field of len bytes, with its tag and length. */
static uint32_t delimited(uint32_t len)
{
    return 1 + varint_len(len) + len;
}

/* A varint field, left out when zero. */
static uint32_t varint_field(uint64_t v)
{
    return v ? 1 + varint_len(v) : 0;
}

static uint32_t gossip_size(const struct kvr_request_record *rec, uint64_t seq)
{
    uint32_t hashes = 0;
    for (uint32_t b = 0; b < rec->nblocks; b++)
        hashes += varint_len(rec->block_hashes[b]);
    uint32_t d = 1 + WIRE_HASH + varint_field(rec->worker_id) +
                 (rec->nblocks ? delimited(hashes) : 0) + varint_field(rec->prompt_tokens) +
                 varint_field(rec->overlap_blocks) + delimited(WIRE_REPLY) +
                 delimited(WIRE_REQUEST_ID) + delimited(WIRE_ROUTER_ID);
    return delimited(WIRE_ROUTER_ID) + 1 + WIRE_HASH + varint_field(seq) + delimited(d);
}

/* rp booked request id: it goes out as gossip once the call into rp returns (gossip_out). */
static void booked(struct replica *rp, uint64_t id)
{
    struct sim *s = rp->s;
    s->decisions++;
    if (!s->gossip)
        return;
    if (!grow((void **)&rp->booked, &rp->cap_booked, rp->nbooked + 1, sizeof *rp->booked)) {
        fail(s, KVR_ERR_NOMEM);
        return;
    }
    rp->booked[rp->nbooked++] = id;
}

/* Export what rp booked during its last call and send it to the other replicas. */
static void gossip_out(struct replica *rp)
{
    struct sim *s = rp->s;
    for (uint32_t k = 0; k < rp->nbooked; k++) {
        struct kvr_request_record rec;
        if (kvr_router_export(rp->router, rp->booked[k], &rec) != KVR_OK)
            continue; /* nothing ends inside the call that booked it */
        struct gossip_msg *m = malloc(sizeof *m + (size_t)rec.nblocks * sizeof *m->hashes);
        if (!m) {
            fail(s, KVR_ERR_NOMEM);
            break;
        }
        m->rec = rec;
        memcpy(m->hashes, rec.block_hashes, (size_t)rec.nblocks * sizeof *m->hashes);
        m->rec.block_hashes = m->hashes;
        s->gossip_msgs++;
        s->gossip_bytes += gossip_size(&m->rec, ++rp->sent);
        push(s, s->now + s->cfg->gossip_delay_ns, EV_GOSSIP, rp->i, 0, m);
    }
    rp->nbooked = 0;
}

/* Housekeeping on one replica: it may place queued requests. */
static void tick(struct replica *rp)
{
    kvr_router_tick(rp->router, rp->s->now);
    gossip_out(rp);
}

static void reject(struct sim *s)
{
    s->rejected++;
    s->resolved++;
    issue_next(s);
}

static void route(struct sim *s, uint32_t i)
{
    const struct kvr_wl_request *r = &s->wl->reqs[i];
    uint32_t B = s->cfg->router.block_size;
    uint32_t nb = r->isl / B;
    if (!grow((void **)&s->scratch_tok, &s->cap_tok, r->isl, sizeof *s->scratch_tok) ||
        !grow((void **)&s->scratch_hash, &s->cap_hash, 2 * nb + 2, sizeof *s->scratch_hash)) {
        fail(s, KVR_ERR_NOMEM);
        return;
    }
    s->arrival[i] = s->now;
    if (s->first_arrival == UINT64_MAX)
        s->first_arrival = s->now;
    kvr_workload_tokens(s->wl, i, s->scratch_tok);
    uint64_t *local = s->scratch_hash, *seq = s->scratch_hash + nb;
    kvr_hash_prompt(s->scratch_tok, r->isl, B, local, seq);
    struct kvr_request q = {
        .id = i + 1, .tokens = s->scratch_tok, .ntokens = r->isl, .max_tokens = r->osl};
    struct kvr_decision d;
    struct replica *rp = &s->rep[s->nrep > 1 ? kvr_rng_below(&s->pick, s->nrep) : 0];
    kvr_status st = kvr_router_route(rp->router, &q, s->now, &d);
    if (st == KVR_OK && !d.queued) {
        booked(rp, q.id);
        submit(s, i, (uint32_t)(d.worker_id - 1), local, seq, nb);
    } else if (st == KVR_OK) {
        struct pending *p = &s->pending[i];
        p->hashes = malloc((2 * (size_t)nb + 1) * sizeof *p->hashes);
        if (!p->hashes) {
            fail(s, KVR_ERR_NOMEM);
            return;
        }
        memcpy(p->hashes, s->scratch_hash, 2 * (size_t)nb * sizeof *p->hashes);
        p->nblocks = nb;
    } else {
        reject(s);
    }
    gossip_out(rp); /* also what the route placed from the queue */
}

static void issue_next(struct sim *s)
{
    if (s->wl->reqs[0].arrival_ns != KVR_CLOSED_LOOP || s->next_issue >= s->wl->nreqs)
        return;
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
        booked(rp, ev->request_id);
        submit(s, i, (uint32_t)(ev->worker_id - 1), p->hashes, p->hashes + p->nblocks, p->nblocks);
    }
    free(p->hashes);
    p->hashes = NULL;
    if (ev->kind == KVR_EV_REJECTED)
        reject(s);
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
        for (uint32_t k = 0; k < s->nrep; k++)
            deliver(s, &s->rep[k], e);
        break;
    case EV_HEARTBEAT:
        heartbeat(s);
        if (s->resolved < s->wl->nreqs)
            push(s, s->now + s->cfg->heartbeat_ns, EV_HEARTBEAT, 0, 0, NULL);
        break;
    }
    free(e->payload);
}

static struct kvr_stat stat_of(double *v, uint32_t n)
{
    struct kvr_stat st = {0, 0, 0, 0, 0};
    if (!n)
        return st;
    double sum = 0;
    for (uint32_t i = 0; i < n; i++)
        sum += v[i];
    st.mean = sum / n;
    st.p50 = v[(size_t)(0.50 * (n - 1))];
    st.p90 = v[(size_t)(0.90 * (n - 1))];
    st.p99 = v[(size_t)(0.99 * (n - 1))];
    st.max = v[n - 1];
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double itl_quantile(const struct sim *s, double q)
{
    uint64_t want = (uint64_t)(q * (double)s->itl_n), acc = 0;
    for (int b = 0; b < ITL_BUCKETS; b++) {
        acc += s->itl_hist[b];
        if (acc > want)
            return 0.01 * pow(1.01, b + 0.5);
    }
    return s->itl_max;
}

static void collect(struct sim *s, struct kvr_sim_result *out)
{
    uint32_t n = s->nfinished;
    qsort(s->ttft, n, sizeof *s->ttft, cmp_double);
    qsort(s->e2e, n, sizeof *s->e2e, cmp_double);
    qsort(s->queue, n, sizeof *s->queue, cmp_double);
    out->policy = s->cfg->router.policy;
    out->requests = s->wl->nreqs;
    out->finished = n;
    out->rejected = s->rejected;
    out->ttft_ms = stat_of(s->ttft, n);
    out->e2e_ms = stat_of(s->e2e, n);
    out->queue_ms = stat_of(s->queue, n);
    out->itl_ms.mean = s->itl_n ? s->itl_sum / s->itl_n : 0;
    out->itl_ms.p50 = s->itl_n ? itl_quantile(s, 0.50) : 0;
    out->itl_ms.p90 = s->itl_n ? itl_quantile(s, 0.90) : 0;
    out->itl_ms.p99 = s->itl_n ? itl_quantile(s, 0.99) : 0;
    out->itl_ms.max = s->itl_max;
    out->ttft_sorted = s->ttft;
    s->ttft = NULL;
    out->hit_rate = s->prompt_tokens ? (double)s->cached_tokens / s->prompt_tokens : 0;
    out->makespan_s =
        s->last_finish > s->first_arrival ? (double)(s->last_finish - s->first_arrival) / 1e9 : 0;
    out->throughput_tok_s = out->makespan_s > 0 ? s->output_tokens / out->makespan_s : 0;
    uint32_t maxw = 0, total = 0;
    for (uint32_t w = 0; w < s->cfg->workers; w++) {
        total += s->per_worker[w];
        maxw = s->per_worker[w] > maxw ? s->per_worker[w] : maxw;
    }
    out->imbalance = total ? maxw / ((double)total / s->cfg->workers) : 0;
    for (uint32_t w = 0; w < s->cfg->workers; w++) {
        struct kvr_engine_stats es;
        kvr_engine_stats(s->engines[w], &es);
        out->preemptions += es.preemptions;
        out->evictions += es.evictions;
    }
    out->pred_err_blocks = s->pred_n ? s->pred_abs / s->pred_n : 0;
    out->pred_err_rel = s->pred_actual > 0 ? s->pred_abs / s->pred_actual : 0;
    for (uint32_t k = 0; k < s->nrep; k++) {
        const struct replica *rp = &s->rep[k];
        struct kvr_router_stats rs;
        kvr_router_stats(rp->router, &rs);
        out->router_unknown += rs.unknown_request + rs.unknown_worker + rs.index.unknown_parent;
        out->early_events += rs.early_events;
        out->late_decisions += rs.late_decisions;
        double rel = rp->pred_actual > 0 ? rp->pred_abs / rp->pred_actual : 0;
        if (rel > out->pred_err_rel_worst)
            out->pred_err_rel_worst = rel;
    }
    if (s->nrep > 1) /* events for a peer's requests are expected there */
        out->router_unknown -= out->early_events;
    out->index_entries_max = s->index_max;
    out->router_memory_max = s->memory_max;
    out->replicas = s->nrep;
    out->gossip = s->gossip;
    out->decisions = s->decisions;
    out->gossip_msgs = s->gossip_msgs;
    out->gossip_bytes = s->gossip_bytes;
    out->gossip_imports = s->gossip_imports;
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
    s->engines = calloc(nw, sizeof *s->engines);
    s->wctx = calloc(nw, sizeof *s->wctx);
    s->busy = calloc(nw, sizeof *s->busy);
    s->per_worker = calloc(nw, sizeof *s->per_worker);
    s->rep = calloc(s->nrep, sizeof *s->rep);
    if (!s->arrival || !s->pending || !s->ttft || !s->e2e || !s->queue || !s->engines || !s->wctx ||
        !s->busy || !s->per_worker || !s->rep)
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
        struct kvr_engine_sink sink = {&s->wctx[i], on_stored, on_removed, on_prefill,
                                       on_outblk,   on_gap,    NULL,       on_done};
        s->engines[i] = kvr_engine_create(&cfg->engine, &sink, &st);
        if (!s->engines[i])
            return st;
    }
    heartbeat(s); /* every worker announces itself before the first request */
    return KVR_OK;
}

static void teardown(struct sim *s)
{
    while (s->nheap)
        free(pop(s).payload);
    free(s->heap);
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
    free(s->scratch_tok);
    free(s->scratch_hash);
}

void kvr_sim_config_default(struct kvr_sim_config *c)
{
    memset(c, 0, sizeof *c);
    c->workers = 8;
    kvr_engine_config_default(&c->engine);
    kvr_router_config_default(&c->router);
    c->router.block_size = c->engine.block_size;
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
                push(&s, (uint64_t)((double)w->reqs[i].arrival_ns / cfg->rate_scale), EV_ARRIVAL, 0,
                     i, NULL);
        }
        push(&s, cfg->heartbeat_ns, EV_HEARTBEAT, 0, 0, NULL);
        uint32_t reported = 0;
        while (s.nheap && s.resolved < w->nreqs && s.err == KVR_OK) {
            struct ev e = pop(&s);
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
            collect(&s, out);
    }
    teardown(&s);
    return st;
}

void kvr_sim_result_free(struct kvr_sim_result *r)
{
    free(r->ttft_sorted);
    r->ttft_sorted = NULL;
}

kvr_status kvr_sim_hit_ceiling(const struct kvr_workload *w, uint32_t block_size,
                               uint64_t capacity_blocks, double *out)
{
    struct kvr_map map; /* seq -> LRU slot */
    struct lru {
        uint64_t seq;
        uint32_t prev, next;
    } *slots = NULL;
    uint32_t nslots = 0, cap = 0, head = KVR_NIL, tail = KVR_NIL;
    uint32_t *tok = NULL, cap_tok = 0;
    uint64_t *seq = NULL;
    uint32_t cap_seq = 0;
    uint64_t hits = 0, total = 0;
    kvr_status st = kvr_map_init(&map, 1 << 16);
    for (uint32_t i = 0; st == KVR_OK && i < w->nreqs; i++) {
        uint32_t isl = w->reqs[i].isl, nb = isl / block_size;
        if (!grow((void **)&tok, &cap_tok, isl, sizeof *tok) ||
            !grow((void **)&seq, &cap_seq, nb + 1, sizeof *seq)) {
            st = KVR_ERR_NOMEM;
            break;
        }
        kvr_workload_tokens(w, i, tok);
        kvr_hash_prompt(tok, isl, block_size, NULL, seq);
        uint32_t h = 0;
        while (h < nb && kvr_map_get(&map, seq[h]) != KVR_NIL)
            h++;
        hits += (uint64_t)h * block_size;
        total += isl;
        for (uint32_t b = 0; b < nb && st == KVR_OK; b++) { /* touch or insert, as most recent */
            uint32_t k = kvr_map_get(&map, seq[b]);
            if (k == KVR_NIL) {
                if (capacity_blocks && nslots >= capacity_blocks) { /* evict the LRU block */
                    k = head;
                    head = slots[k].next;
                    if (head != KVR_NIL)
                        slots[head].prev = KVR_NIL;
                    else
                        tail = KVR_NIL;
                    kvr_map_del(&map, slots[k].seq);
                } else {
                    if (!grow((void **)&slots, &cap, nslots + 1, sizeof *slots)) {
                        st = KVR_ERR_NOMEM;
                        break;
                    }
                    k = nslots++;
                }
                slots[k].seq = seq[b];
                st = kvr_map_put(&map, seq[b], k);
            } else {
                if (slots[k].prev != KVR_NIL)
                    slots[slots[k].prev].next = slots[k].next;
                else
                    head = slots[k].next;
                if (slots[k].next != KVR_NIL)
                    slots[slots[k].next].prev = slots[k].prev;
                else
                    tail = slots[k].prev;
            }
            slots[k].next = KVR_NIL;
            slots[k].prev = tail;
            if (tail != KVR_NIL)
                slots[tail].next = k;
            else
                head = k;
            tail = k;
        }
    }
    *out = total ? (double)hits / total : 0;
    kvr_map_free(&map);
    free(slots);
    free(tok);
    free(seq);
    return st;
}
