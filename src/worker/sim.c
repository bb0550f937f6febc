/*
 * The simulated engine behind kvworker (src/engine, run in real time by the engine thread): the
 * backend that hashes a request's prompt and submits it, steps the engine, and turns its sink's
 * callbacks into the worker's streams and events. Under the worker's mutex throughout.
 */
#include <stdlib.h>

#include "kvr/hash.h"
#include "worker.h"

static void on_stored(void *ctx, const uint64_t *parent, const struct kvr_kv_block *b, size_t n)
{
    kvr__worker_stored(ctx, parent, b, n);
}

static void on_removed(void *ctx, const uint64_t *ids, size_t n)
{
    kvr__worker_removed(ctx, ids, n);
}

/* r's next token, made up from its key and position (the simulation has no model). */
static void next_token(struct kvr_worker *w, struct kvr_wreq *r)
{
    uint32_t tok = (uint32_t)((r->key + r->produced) % 32000);
    kvr__worker_tokens(w, r, &tok, 1, NULL, 0);
}

static void on_prefill(void *ctx, uint64_t id)
{
    struct kvr_worker *w = ctx;
    kvr__worker_prefill(w, id);
    struct kvr_wreq *r = kvr__worker_find(w, id);
    struct kvr_engine_progress p;
    if (!r)
        return;
    if (kvr_engine_progress(w->eng, id, &p))
        r->cached_tokens = p.cached_tokens;
    next_token(w, r); /* the prefill's own token: the first chunk */
}

static void on_token(void *ctx, uint64_t id)
{
    struct kvr_worker *w = ctx;
    struct kvr_wreq *r = kvr__worker_find(w, id);
    if (r)
        next_token(w, r);
}

static void on_outblk(void *ctx, uint64_t id)
{
    kvr__worker_output_block(ctx, id);
}

static void on_done(void *ctx, const struct kvr_engine_result *res)
{
    struct kvr_worker *w = ctx;
    struct kvr_wreq *r = kvr__worker_find(w, res->id);
    if (r)
        r->cached_tokens = res->cached_tokens;
    kvr__worker_finished(w, res->id, NULL);
}

/* The prompt's block hashes (its chained ones, then the local ones), before the mutex. */
static void prepare(struct kvr_worker *w, const struct kvr_wire_request *q,
                    struct kvr_wk_prep *prep)
{
    uint32_t bs = w->cfg->engine.block_size, nb = q->ntokens / bs;
    uint64_t *h = malloc((2 * (size_t)nb + 1) * sizeof *h);
    if (h)
        kvr_hash_prompt(q->tokens, q->ntokens, bs, h, h + nb);
    prep->data = h;
    prep->st = h ? KVR_OK : KVR_ERR_NOMEM;
}

static kvr_status submit(struct kvr_worker *w, struct kvr_wreq *r, const struct kvr_wire_request *q,
                         struct kvr_wk_prep *prep, uint64_t now)
{
    if (prep->st != KVR_OK)
        return prep->st;
    uint32_t nb = q->ntokens / w->cfg->engine.block_size;
    const uint64_t *h = prep->data;
    struct kvr_engine_request er = {r->key, h + nb, h, nb, q->ntokens, q->max_tokens};
    return kvr_engine_submit(w->eng, &er, now); /* the worker frees the hashes */
}

static void cancel(struct kvr_worker *w, uint64_t key)
{
    kvr_engine_cancel(w->eng, key);
}

static uint64_t step_begin(struct kvr_worker *w, uint64_t now)
{
    return kvr_engine_step_begin(w->eng, now);
}

static void step_end(struct kvr_worker *w, uint64_t now)
{
    kvr_engine_step_end(w->eng, now);
}

static void load(struct kvr_worker *w, struct kvr_worker_info *info)
{
    struct kvr_engine_stats es;
    kvr_engine_stats(w->eng, &es);
    info->waiting = es.waiting;
    info->kv_usage = es.kv_usage;
    info->capacity_blocks = w->cfg->engine.num_blocks;
}

static void destroy(struct kvr_worker *w)
{
    kvr_engine_destroy(w->eng);
    w->eng = NULL;
}

static const struct kvr_wk_backend sim = {"sim",      prepare,  submit, cancel,
                                          step_begin, step_end, load,   destroy};

kvr_status kvr__wk_sim_open(struct kvr_worker *w)
{
    struct kvr_engine_sink es = {w,         on_stored, on_removed, on_prefill,
                                 on_outblk, NULL,      on_token,   on_done};
    kvr_status st;
    w->eng = kvr_engine_create(&w->cfg->engine, &es, &st);
    if (!w->eng)
        return st;
    w->be = &sim;
    w->capacity = w->cfg->engine.num_blocks;
    return KVR_OK;
}
