/*
 * kvr_se_batcher implementation. Pending events keep offsets into the hash and token arrays
 * (which may move as they grow); the encoder's view is built at the flush.
 */
#include "batcher.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"

struct kvr_se_event {
    enum kvr_kvev_kind kind; /* */
    uint32_t hash_at, n;     /* hashes[hash_at .. hash_at + n) */
    uint32_t token_at;       /* Stored: tokens[token_at .. + n * block_size) */
    bool has_parent;         /* Stored */
    uint64_t parent;         /* */
    int group;               /* hybrid: its KV cache group (GROUP_SW, GROUP_FULL); else -1 */
};

#define GROUP_SW   0 /* hybrid: the sliding-window group, which evicts a block once stored */
#define GROUP_FULL 1 /* hybrid: the full-attention group, which evicts as the engine does */

kvr_status kvr_se_batcher_init(struct kvr_se_batcher *b, const struct kvr_kvev_encoding *how,
                               const struct kvr_se_batch_limits *lim, uint32_t block_size,
                               kvr_se_emit_fn emit, void *ctx)
{
    memset(b, 0, sizeof *b);
    b->how = *how;
    if (lim)
        b->lim = *lim;
    if (!b->lim.max_events)
        b->lim.max_events = KVR_KVEV_MAX_EVENTS;
    if (!b->lim.max_hashes)
        b->lim.max_hashes = KVR_KVEV_MAX_HASHES;
    if (!b->lim.max_tokens)
        b->lim.max_tokens = KVR_KVEV_MAX_TOKENS;
    b->block_size = block_size;
    b->emit = emit;
    b->ctx = ctx;
    return block_size && block_size <= b->lim.max_tokens ? KVR_OK : KVR_ERR_INVALID;
}

void kvr_se_batcher_free(struct kvr_se_batcher *b)
{
    free(b->ev);
    free(b->hashes);
    free(b->tokens);
    free(b->wire);
    kvr_buf_free(&b->out);
    memset(b, 0, sizeof *b);
}

void kvr_se_batcher_begin(struct kvr_se_batcher *b, double ts)
{
    b->ts = ts;
}

/* The encoder's view of the pending events. */
static bool view(struct kvr_se_batcher *b)
{
    if (!KVR_GROW(b->wire, b->capwire, b->nev, 16))
        return false;
    for (uint32_t i = 0; i < b->nev; i++) {
        const struct kvr_se_event *e = &b->ev[i];
        struct kvr_kvev_event *w = &b->wire[i];
        memset(w, 0, sizeof *w);
        w->kind = e->kind;
        w->hashes = e->n ? b->hashes + e->hash_at : NULL;
        w->nhashes = e->n;
        if (e->kind == KVR_KVEV_STORED) {
            w->has_parent = e->has_parent;
            w->parent = e->parent;
            w->ntokens = e->n * b->block_size;
            w->tokens = w->ntokens ? b->tokens + e->token_at : NULL;
            w->block_size = b->block_size;
        }
        if (e->kind != KVR_KVEV_CLEARED)
            memcpy(w->medium, "GPU", 4);
        w->has_group = e->group >= 0;
        w->group_idx = e->group;
        if (e->kind == KVR_KVEV_STORED && e->group >= 0) /* vLLM names it on a Stored */
            snprintf(w->spec_kind, sizeof w->spec_kind, "%s",
                     e->group == GROUP_SW ? "sliding_window" : "full_attention");
    }
    return true;
}

void kvr_se_batcher_flush(struct kvr_se_batcher *b)
{
    if (!b->nev)
        return;
    struct kvr_kvev_batch batch = {.ts = b->ts,
                                   .has_dp_rank = b->how.dp_rank,
                                   .dp_rank = b->dp_rank,
                                   .events = b->wire,
                                   .nevents = b->nev};
    kvr_status st = view(b) ? KVR_OK : KVR_ERR_NOMEM;
    batch.events = b->wire;
    if (st == KVR_OK)
        st = kvr_kvev_encode(&b->out, &batch, &b->how);
    if (st == KVR_OK)
        st = b->emit(b->ctx, b->out.data, b->out.len);
    if (st == KVR_OK) {
        b->batches++;
        b->events += b->nev;
    } else {
        b->failed++;
    }
    b->nev = b->nhashes = b->ntokens = 0;
}

/* Room for one more event of kind with up to want blocks: how many blocks fit (0: flush first).
 */
static uint32_t room(const struct kvr_se_batcher *b, enum kvr_kvev_kind kind, uint32_t want)
{
    if (b->nev >= b->lim.max_events)
        return 0;
    uint32_t n = b->lim.max_hashes - b->nhashes;
    if (kind == KVR_KVEV_STORED) {
        uint32_t t = (b->lim.max_tokens - b->ntokens) / b->block_size;
        n = t < n ? t : n;
    }
    return want < n ? want : n;
}

/* A new pending event of kind with n blocks: its record, the arrays grown for it; NULL when
 * memory ran out. */
static struct kvr_se_event *push(struct kvr_se_batcher *b, enum kvr_kvev_kind kind, uint32_t n,
                                 int group)
{
    uint32_t nt = kind == KVR_KVEV_STORED ? n * b->block_size : 0;
    if (!KVR_GROW(b->ev, b->capev, b->nev + 1, 16) ||
        !KVR_GROW(b->hashes, b->caphashes, b->nhashes + n, 64) ||
        (nt && !KVR_GROW(b->tokens, b->captokens, b->ntokens + nt, 1024)))
        return NULL;
    struct kvr_se_event *e = &b->ev[b->nev++];
    *e = (struct kvr_se_event){kind, b->nhashes, n, b->ntokens, false, 0, group};
    b->nhashes += n;
    b->ntokens += nt;
    return e;
}

/*
 * Add an event of kind over hashes[0..n) (and tokens, for Stored) of KV cache group (-1: none),
 * cut into pieces that fit a batch, flushing full batches on the way. Blocks that could not go
 * in (memory) are counted as dropped.
 */
static void add(struct kvr_se_batcher *b, enum kvr_kvev_kind kind, int group,
                const uint64_t *parent, const uint64_t *hashes, const uint32_t *const *tokens,
                uint32_t n)
{
    uint32_t done = 0;
    for (;;) {
        uint32_t k = room(b, kind, n - done);
        if (b->nev >= b->lim.max_events || (n > done && !k)) {
            if (!b->nev)
                break; /* nothing fits even an empty batch */
            kvr_se_batcher_flush(b);
            continue;
        }
        struct kvr_se_event *e = push(b, kind, k, group);
        if (!e)
            break;
        const uint64_t *p = done ? &hashes[done - 1] : parent;
        e->has_parent = p != NULL;
        e->parent = p ? *p : 0;
        if (k)
            memcpy(b->hashes + e->hash_at, hashes + done, (size_t)k * sizeof *hashes);
        for (uint32_t i = 0; kind == KVR_KVEV_STORED && i < k; i++)
            memcpy(b->tokens + e->token_at + (size_t)i * b->block_size, tokens[done + i],
                   (size_t)b->block_size * sizeof(uint32_t));
        done += k;
        if (done >= n)
            break;
    }
    b->dropped += n - done;
}

void kvr_se_batcher_stored(struct kvr_se_batcher *b, const uint64_t *parent, const uint64_t *hashes,
                           const uint32_t *const *tokens, uint32_t n)
{
    if (!n)
        return;
    if (!b->hybrid) {
        add(b, KVR_KVEV_STORED, -1, parent, hashes, tokens, n);
        return;
    }
    add(b, KVR_KVEV_STORED, GROUP_SW, parent, hashes, tokens, n);
    add(b, KVR_KVEV_STORED, GROUP_FULL, parent, hashes, tokens, n);
    add(b, KVR_KVEV_REMOVED, GROUP_SW, NULL, hashes, NULL, n); /* its window past them */
}

void kvr_se_batcher_removed(struct kvr_se_batcher *b, const uint64_t *ids, uint32_t n)
{
    if (n)
        add(b, KVR_KVEV_REMOVED, b->hybrid ? GROUP_FULL : -1, NULL, ids, NULL, n);
}

void kvr_se_batcher_cleared(struct kvr_se_batcher *b)
{
    add(b, KVR_KVEV_CLEARED, -1, NULL, NULL, NULL, 0);
}
