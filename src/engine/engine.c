/*
 * kvr_engine implementation. Invariants: a block is in exactly one of three states: blank (on the
 * blank stack), cached (hashed, unreferenced, in the LRU list) or referenced (refs > 0, held by
 * running requests, hashed or not). A hashed block is in the map under its hash, and no two blocks
 * share a hash. A running request holds ceil(kv tokens / B) blocks in order; its first nfull
 * blocks, once computed, carry its prompt's sequence hashes (or are unhashed duplicates). One
 * owner, one thread.
 */
#include "engine.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "map.h"

#define NS_PER_MS  1000000.0
#define GROW_FIRST 16u /* room a growable array starts with */

struct block {
    uint64_t hash;  /* sequence hash when hashed */
    uint32_t refs;  /* running requests holding it */
    uint32_t prev;  /* LRU neighbours (cached blocks only) */
    uint32_t next;  /* */
    uint8_t hashed; /* registered in the map */
};

struct ereq {
    uint64_t id;
    uint64_t *seq;      /* nfull sequence hashes, then nfull local hashes; owned */
    uint32_t nfull;     /* full prompt blocks */
    uint32_t isl, osl;  /* */
    uint32_t target;    /* tokens to compute before decoding: isl, or more after a preemption */
    uint32_t computed;  /* of target */
    uint32_t generated; /* output tokens produced */
    uint32_t *blocks;   /* held blocks, in sequence order; owned */
    uint32_t nblk, capblk;
    uint32_t sched;     /* tokens scheduled in the current step */
    bool decoding;      /* the prefill is complete */
    bool admitted_once; /* */
    bool first_done;    /* its first token was produced */
    uint32_t cached_tokens;
    uint32_t preemptions;
    uint64_t arrival, admitted, first_token, last_token;
    double itl_sum, itl_max;
};

struct deque {
    struct ereq **v; /* ring buffer */
    uint32_t head, n, cap;
};

struct kvr_engine {
    struct kvr_engine_config cfg;
    struct kvr_engine_sink sink;
    struct block *blocks;  /* num_blocks */
    uint32_t *blank;       /* stack of blank blocks */
    uint32_t nblank;       /* */
    uint32_t lru_head;     /* least recently used cached block, evicted first */
    uint32_t lru_tail;     /* */
    uint32_t ncached;      /* blocks in the LRU list */
    uint32_t nactive;      /* blocks with refs > 0 */
    struct kvr_map map;    /* hash -> block */
    struct deque waiting;  /* FIFO; preempted requests go back to the front */
    struct ereq **running; /* admission order */
    uint32_t nrunning, caprunning;
    uint32_t watermark_blocks;
    /* events of the current step, delivered at its end */
    uint64_t *removed;
    uint32_t nremoved, capremoved;
    uint64_t *outblk;
    uint32_t noutblk, capoutblk;
    struct kvr_kv_block *run; /* scratch for Stored runs */
    uint32_t caprun;
    bool in_step;
    uint64_t preemptions, evictions, steps, cancelled;
};

void kvr_engine_config_default(struct kvr_engine_config *c)
{
    c->num_blocks = 16384;
    c->block_size = 64;
    c->watermark = 0.01;
    c->max_batched_tokens = KVR_MODEL_BATCH_TOKENS;
    c->max_seqs = 256;
    c->speedup = 1.0;
    static const double prefill[3] = KVR_MODEL_PREFILL_MS, decode[3] = KVR_MODEL_DECODE_MS;
    memcpy(c->prefill_ms, prefill, sizeof prefill);
    memcpy(c->decode_ms, decode, sizeof decode);
}

struct kvr_engine *kvr_engine_create(const struct kvr_engine_config *cfg,
                                     const struct kvr_engine_sink *sink, kvr_status *st)
{
    kvr_status s = KVR_ERR_INVALID;
    struct kvr_engine *e = NULL;
    if (!cfg || cfg->num_blocks < 2 || cfg->num_blocks >= KVR_NIL || !cfg->block_size ||
        !cfg->max_batched_tokens || !cfg->max_seqs || !(cfg->speedup > 0) ||
        !(cfg->watermark >= 0 && cfg->watermark < 1))
        goto out;
    s = KVR_ERR_NOMEM;
    e = calloc(1, sizeof *e);
    if (!e)
        goto out;
    e->cfg = *cfg;
    if (sink)
        e->sink = *sink;
    e->blocks = calloc(cfg->num_blocks, sizeof *e->blocks);
    e->blank = malloc((size_t)cfg->num_blocks * sizeof *e->blank);
    if (!e->blocks || !e->blank || kvr_map_init(&e->map, cfg->num_blocks) != KVR_OK) {
        kvr_engine_destroy(e);
        e = NULL;
        goto out;
    }
    for (uint32_t i = 0; i < cfg->num_blocks; i++)
        e->blank[i] = cfg->num_blocks - 1 - i; /* block 0 is handed out first */
    e->nblank = cfg->num_blocks;
    e->lru_head = e->lru_tail = KVR_NIL;
    e->watermark_blocks = kvr_engine_watermark_blocks(cfg);
    s = KVR_OK;
out:
    if (st)
        *st = s;
    return e;
}

static void free_req(struct ereq *r)
{
    free(r->seq);
    free(r->blocks);
    free(r);
}

void kvr_engine_destroy(struct kvr_engine *e)
{
    if (!e)
        return;
    for (uint32_t i = 0; i < e->waiting.n; i++)
        free_req(e->waiting.v[(e->waiting.head + i) % e->waiting.cap]);
    for (uint32_t i = 0; i < e->nrunning; i++)
        free_req(e->running[i]);
    free(e->waiting.v);
    free(e->running);
    free(e->blocks);
    free(e->blank);
    free(e->removed);
    free(e->outblk);
    free(e->run);
    kvr_map_free(&e->map);
    free(e);
}

/* Room for one more in d: the ring grows in place, and its wrapped part moves past the old end. */
static bool deque_reserve(struct deque *d)
{
    uint32_t old = d->cap;
    if (!KVR_GROW(d->v, d->cap, d->n + 1, 64))
        return false;
    if (old && d->head + d->n > old) /* v[0..wrap) continued v[head..old): append it there */
        memcpy(d->v + old, d->v, (size_t)(d->head + d->n - old) * sizeof *d->v);
    return true;
}

static bool deque_push(struct deque *d, struct ereq *r, bool front)
{
    if (d->n == d->cap && !deque_reserve(d))
        return false;
    if (front) {
        d->head = (d->head + d->cap - 1) % d->cap;
        d->v[d->head] = r;
    } else {
        d->v[(d->head + d->n) % d->cap] = r;
    }
    d->n++;
    return true;
}

static struct ereq *deque_peek(const struct deque *d)
{
    return d->n ? d->v[d->head] : NULL;
}

static void deque_pop(struct deque *d)
{
    d->head = (d->head + 1) % d->cap;
    d->n--;
}

kvr_status kvr_engine_submit(struct kvr_engine *e, const struct kvr_engine_request *req,
                             uint64_t now)
{
    if (!req || !req->isl || !req->osl || req->nblocks > req->isl / e->cfg.block_size ||
        (req->nblocks && (!req->seq || !req->local)))
        return KVR_ERR_INVALID;
    struct ereq *r = calloc(1, sizeof *r);
    if (!r)
        return KVR_ERR_NOMEM;
    r->seq = malloc(2 * ((size_t)req->nblocks + 1) * sizeof *r->seq);
    if (!r->seq) {
        free(r);
        return KVR_ERR_NOMEM;
    }
    memcpy(r->seq, req->seq, (size_t)req->nblocks * sizeof *r->seq);
    memcpy(r->seq + req->nblocks, req->local, (size_t)req->nblocks * sizeof *r->seq);
    r->id = req->id;
    r->nfull = req->nblocks;
    r->isl = req->isl;
    r->osl = req->osl;
    r->target = req->isl;
    r->arrival = now;
    if (!deque_push(&e->waiting, r, false)) {
        free_req(r);
        return KVR_ERR_NOMEM;
    }
    return KVR_OK;
}

/* Every block is blank, cached or referenced, and counted as exactly one of them. */
static inline __attribute__((unused)) bool counts_ok(const struct kvr_engine *e)
{
    return (uint64_t)e->nblank + e->ncached + e->nactive == e->cfg.num_blocks;
}

static void lru_unlink(struct kvr_engine *e, uint32_t b)
{
    struct block *k = &e->blocks[b];
    assert(e->ncached > 0 && k->hashed); /* only cached (hashed) blocks are in the LRU */
    if (k->prev != KVR_NIL)
        e->blocks[k->prev].next = k->next;
    else
        e->lru_head = k->next;
    if (k->next != KVR_NIL)
        e->blocks[k->next].prev = k->prev;
    else
        e->lru_tail = k->prev;
    e->ncached--;
}

static void lru_append(struct kvr_engine *e, uint32_t b)
{
    struct block *k = &e->blocks[b];
    k->next = KVR_NIL;
    k->prev = e->lru_tail;
    if (e->lru_tail != KVR_NIL)
        e->blocks[e->lru_tail].next = b;
    else
        e->lru_head = b;
    e->lru_tail = b;
    e->ncached++;
}

static void note_removed(struct kvr_engine *e, uint64_t hash)
{
    if (KVR_GROW(e->removed, e->capremoved, e->nremoved + 1, GROW_FIRST))
        e->removed[e->nremoved++] = hash;
}

/* A block for new data: a blank one, else the least recently used cached one. */
static uint32_t alloc_block(struct kvr_engine *e)
{
    uint32_t b;
    if (e->nblank) {
        b = e->blank[--e->nblank];
        assert(e->blocks[b].refs == 0 && !e->blocks[b].hashed);
    } else if (e->lru_head != KVR_NIL) {
        b = e->lru_head;
        assert(kvr_map_get(&e->map, e->blocks[b].hash) == b); /* hashed: in the map under it */
        lru_unlink(e, b);
        kvr_map_del(&e->map, e->blocks[b].hash);
        note_removed(e, e->blocks[b].hash);
        e->blocks[b].hashed = 0;
        e->evictions++;
    } else {
        return KVR_NIL;
    }
    e->blocks[b].refs = 1;
    e->nactive++;
    return b;
}

static void ref_block(struct kvr_engine *e, uint32_t b)
{
    struct block *k = &e->blocks[b];
    assert(k->hashed || k->refs > 0); /* a cache hit is hashed; an unhashed block is held */
    if (k->refs++ == 0) {
        lru_unlink(e, b); /* a referenced block is never unhashed-and-unreferenced */
        e->nactive++;
    }
}

/* Drop a request's blocks, last first, so its tail is evicted before its head. */
static void release_blocks(struct kvr_engine *e, struct ereq *r)
{
    for (uint32_t i = r->nblk; i-- > 0;) {
        uint32_t b = r->blocks[i];
        struct block *k = &e->blocks[b];
        assert(k->refs > 0); /* r holds it */
        if (--k->refs)
            continue;
        e->nactive--;
        if (k->hashed)
            lru_append(e, b);
        else
            e->blank[e->nblank++] = b;
    }
    r->nblk = 0;
}

static bool push_block(struct ereq *r, uint32_t b)
{
    if (!KVR_GROW(r->blocks, r->capblk, r->nblk + 1, GROW_FIRST))
        return false;
    r->blocks[r->nblk++] = b;
    return true;
}

static void remove_running(struct kvr_engine *e, uint32_t i)
{
    memmove(e->running + i, e->running + i + 1, (size_t)(e->nrunning - i - 1) * sizeof *e->running);
    e->nrunning--;
}

/* Recompute preemption of the most recently admitted running request. */
static struct ereq *preempt_last(struct kvr_engine *e)
{
    struct ereq *v = e->running[e->nrunning - 1];
    e->nrunning--;
    release_blocks(e, v);
    v->computed = 0;
    v->sched = 0;
    v->decoding = false;
    v->target = v->isl + v->generated;
    v->preemptions++;
    e->preemptions++;
    deque_push(&e->waiting, v, true); /* on NOMEM the request is lost: the caller sees it */
    return v;
}

/*
 * Give running request r (at position i) blocks up to need, preempting from the back when the pool
 * is dry. Returns false when r itself was preempted.
 */
static bool ensure_blocks(struct kvr_engine *e, struct ereq *r, uint32_t need, bool decode)
{
    while (r->nblk < need) {
        uint32_t b = alloc_block(e);
        if (b == KVR_NIL) {
            if (preempt_last(e) == r)
                return false;
            continue;
        }
        if (!push_block(r, b)) {
            e->blocks[b].refs = 0;
            e->nactive--;
            e->blank[e->nblank++] = b;
            return false;
        }
        if (decode && KVR_GROW(e->outblk, e->capoutblk, e->noutblk + 1, GROW_FIRST))
            e->outblk[e->noutblk++] = r->id;
    }
    return true;
}

static uint32_t div_up(uint32_t a, uint32_t b)
{
    return (a + b - 1) / b;
}

/* Consecutive prompt blocks of r in the prefix cache, leaving at least one token to compute. */
static uint32_t cache_hits(const struct kvr_engine *e, const struct ereq *r)
{
    uint32_t max = (r->target - 1) / e->cfg.block_size;
    if (max > r->nfull)
        max = r->nfull;
    uint32_t h = 0;
    while (h < max && kvr_map_get(&e->map, r->seq[h]) != KVR_NIL)
        h++;
    return h;
}

/* Try to admit the head of the waiting queue with `budget` tokens; returns tokens scheduled. */
static uint32_t admit(struct kvr_engine *e, struct ereq *r, uint32_t budget, uint64_t now)
{
    uint32_t B = e->cfg.block_size;
    uint32_t h = cache_hits(e, r);
    uint32_t chunk = r->target - h * B;
    if (chunk > budget)
        chunk = budget;
    uint32_t need = div_up(h * B + chunk, B) - h;
    uint32_t lru_hits = 0;
    for (uint32_t i = 0; i < h; i++)
        lru_hits += e->blocks[kvr_map_get(&e->map, r->seq[i])].refs == 0;
    uint64_t avail = (uint64_t)e->nblank + e->ncached - lru_hits;
    if (avail < (uint64_t)need + e->watermark_blocks)
        return 0;
    if (!KVR_GROW(e->running, e->caprunning, e->nrunning + 1, GROW_FIRST))
        return 0;
    for (uint32_t i = 0; i < h; i++) {
        uint32_t b = kvr_map_get(&e->map, r->seq[i]);
        if (!push_block(r, b))
            goto undo;
        ref_block(e, b);
    }
    for (uint32_t i = 0; i < need; i++) {
        uint32_t b = alloc_block(e); /* cannot fail: avail was checked */
        if (b == KVR_NIL || !push_block(r, b)) {
            if (b != KVR_NIL) {
                e->blocks[b].refs = 0;
                e->nactive--;
                e->blank[e->nblank++] = b;
            }
            goto undo;
        }
    }
    r->computed = h * B;
    r->sched = chunk;
    if (!r->admitted_once) {
        r->admitted_once = true;
        r->admitted = now;
        r->cached_tokens = h * B;
    }
    e->running[e->nrunning++] = r;
    return chunk;
undo:
    release_blocks(e, r);
    return 0;
}

static double poly(const double *c, double x)
{
    return c[0] + c[1] * x + c[2] * x * x;
}

uint64_t kvr_engine_step_begin(struct kvr_engine *e, uint64_t now)
{
    uint32_t B = e->cfg.block_size;
    uint32_t budget = e->cfg.max_batched_tokens;
    uint64_t prefill_tokens = 0;
    uint32_t ndecode = 0;
    e->in_step = false;
    for (uint32_t i = 0; i < e->nrunning && budget; i++) {
        struct ereq *r = e->running[i];
        if (r->decoding) {
            if (!ensure_blocks(e, r, div_up(r->isl + r->generated, B), true))
                continue; /* r was preempted; whoever took its place is at i+... */
            r->sched = 1;
            budget--;
            ndecode++;
        } else {
            uint32_t chunk = r->target - r->computed;
            if (chunk > budget)
                chunk = budget;
            if (!ensure_blocks(e, r, div_up(r->computed + chunk, B), false))
                continue;
            r->sched = chunk;
            budget -= chunk;
            prefill_tokens += chunk;
        }
    }
    while (budget && e->nrunning < e->cfg.max_seqs) {
        struct ereq *r = deque_peek(&e->waiting);
        if (!r)
            break;
        uint32_t got = admit(e, r, budget, now);
        if (!got)
            break; /* FIFO: the head waits, and so does everyone behind it */
        deque_pop(&e->waiting);
        budget -= got;
        prefill_tokens += got;
    }
    double ms = 0;
    if (prefill_tokens)
        ms += poly(e->cfg.prefill_ms, (double)prefill_tokens);
    if (ndecode) {
        double d = poly(e->cfg.decode_ms, (double)e->nactive / e->cfg.num_blocks);
        ms += d < 1.0 ? 1.0 : d;
    }
    assert(counts_ok(e));
    if (ms <= 0)
        return 0;
    e->in_step = true;
    e->steps++;
    uint64_t ns = (uint64_t)llround(ms * NS_PER_MS / e->cfg.speedup);
    return ns ? ns : 1;
}

/* Register r's prompt blocks completed by this step and publish them as Stored runs. */
static void store_blocks(struct kvr_engine *e, struct ereq *r, uint32_t from, uint32_t to)
{
    if (to > r->nfull)
        to = r->nfull;
    if (from >= to || !KVR_GROW(e->run, e->caprun, to - from, GROW_FIRST))
        return;
    const uint64_t *local = r->seq + r->nfull;
    uint32_t n = 0, start = from;
    for (uint32_t i = from; i <= to; i++) {
        bool stored = false;
        if (i < to) {
            struct block *k = &e->blocks[r->blocks[i]];
            if (!k->hashed && kvr_map_get(&e->map, r->seq[i]) == KVR_NIL &&
                kvr_map_put(&e->map, r->seq[i], r->blocks[i]) == KVR_OK) {
                k->hashed = 1;
                k->hash = r->seq[i];
                e->run[n++] = (struct kvr_kv_block){r->seq[i], local[i]};
                stored = true;
            }
        }
        if (!stored) { /* the run ends: publish it */
            if (n && e->sink.stored)
                e->sink.stored(e->sink.ctx, start ? &r->seq[start - 1] : NULL, e->run, n);
            n = 0;
            start = i + 1;
        }
    }
}

static void finish(struct kvr_engine *e, uint32_t i, uint64_t now)
{
    struct ereq *r = e->running[i];
    remove_running(e, i);
    release_blocks(e, r);
    if (e->sink.done) {
        struct kvr_engine_result res = {
            r->id,  r->arrival,       r->admitted,    r->first_token, now,       r->isl,
            r->osl, r->cached_tokens, r->preemptions, r->itl_sum,     r->itl_max};
        e->sink.done(e->sink.ctx, &res);
    }
    free_req(r);
}

static void token(struct kvr_engine *e, struct ereq *r, uint64_t now)
{
    double gap = (double)(now - r->last_token) / NS_PER_MS;
    r->itl_sum += gap;
    if (gap > r->itl_max)
        r->itl_max = gap;
    r->last_token = now;
    if (e->sink.token_gap)
        e->sink.token_gap(e->sink.ctx, gap);
    if (e->sink.token)
        e->sink.token(e->sink.ctx, r->id);
}

void kvr_engine_step_end(struct kvr_engine *e, uint64_t now)
{
    if (!e->in_step)
        return;
    e->in_step = false;
    uint32_t B = e->cfg.block_size;
    if (e->nremoved && e->sink.removed)
        e->sink.removed(e->sink.ctx, e->removed, e->nremoved);
    e->nremoved = 0;
    /* blocks taken for output this step: announced before any of those requests can finish */
    for (uint32_t k = 0; k < e->noutblk; k++)
        if (e->sink.output_block)
            e->sink.output_block(e->sink.ctx, e->outblk[k]);
    e->noutblk = 0;
    for (uint32_t i = 0; i < e->nrunning;) {
        struct ereq *r = e->running[i];
        uint32_t sched = r->sched;
        r->sched = 0;
        if (!sched) {
            i++;
            continue;
        }
        if (!r->decoding) {
            uint32_t before = r->computed / B;
            r->computed += sched;
            store_blocks(e, r, before, r->computed / B);
            if (r->computed < r->target) {
                i++;
                continue;
            }
            r->decoding = true;
            if (!r->first_done) {
                r->first_done = true;
                r->first_token = r->last_token = now;
                r->generated = 1;
                if (e->sink.prefill_done)
                    e->sink.prefill_done(e->sink.ctx, r->id);
            } else { /* recomputed up to its last token: that position yields the next */
                r->generated++;
                token(e, r, now);
            }
        } else {
            r->generated++;
            token(e, r, now);
        }
        if (r->generated >= r->osl)
            finish(e, i, now);
        else
            i++;
    }
    assert(counts_ok(e));
}

void kvr_engine_stats(const struct kvr_engine *e, struct kvr_engine_stats *out)
{
    out->waiting = e->waiting.n;
    out->running = e->nrunning;
    out->active_blocks = e->nactive;
    out->cached_blocks = e->ncached;
    out->preemptions = e->preemptions;
    out->evictions = e->evictions;
    out->steps = e->steps;
    out->cancelled = e->cancelled;
    out->kv_usage = (double)e->nactive / e->cfg.num_blocks;
}

/* Where request id is: *running tells which list, the return value its index (in the waiting
 * queue, from the head); -1 when it is in neither. */
static int64_t locate(const struct kvr_engine *e, uint64_t id, bool *running)
{
    for (uint32_t i = 0; i < e->nrunning; i++) {
        if (e->running[i]->id == id) {
            *running = true;
            return i;
        }
    }
    for (uint32_t i = 0; i < e->waiting.n; i++) {
        if (e->waiting.v[(e->waiting.head + i) % e->waiting.cap]->id == id) {
            *running = false;
            return i;
        }
    }
    return -1;
}

/* Take the request at position pos out of d (the ones behind it move up one). */
static void deque_remove(struct deque *d, uint32_t pos)
{
    for (uint32_t i = pos; i + 1 < d->n; i++)
        d->v[(d->head + i) % d->cap] = d->v[(d->head + i + 1) % d->cap];
    d->n--;
}

kvr_status kvr_engine_cancel(struct kvr_engine *e, uint64_t id)
{
    bool running = false;
    int64_t at = locate(e, id, &running);
    if (at < 0)
        return KVR_ERR_UNKNOWN_REQUEST;
    struct ereq *r;
    if (running) {
        r = e->running[at];
        remove_running(e, (uint32_t)at);
        release_blocks(e, r); /* blocks taken for the step in progress go back too */
    } else {
        r = e->waiting.v[(e->waiting.head + (uint32_t)at) % e->waiting.cap];
        deque_remove(&e->waiting, (uint32_t)at); /* a waiting request holds no blocks */
    }
    uint32_t k = 0; /* the step in progress announces no output block for it */
    for (uint32_t i = 0; i < e->noutblk; i++)
        if (e->outblk[i] != id)
            e->outblk[k++] = e->outblk[i];
    e->noutblk = k;
    free_req(r);
    e->cancelled++;
    assert(counts_ok(e));
    return KVR_OK;
}

bool kvr_engine_progress(const struct kvr_engine *e, uint64_t id, struct kvr_engine_progress *out)
{
    bool running = false;
    int64_t at = locate(e, id, &running);
    if (at < 0)
        return false;
    const struct ereq *r =
        running ? e->running[at] : e->waiting.v[(e->waiting.head + (uint32_t)at) % e->waiting.cap];
    *out = (struct kvr_engine_progress){running, r->cached_tokens, r->generated};
    return true;
}
