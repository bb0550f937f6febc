/*
 * kvr_se_blocks implementation: a uthash table of entries with their tokens inline.
 */
#include "blocks.h"

#include <stdlib.h>
#include <string.h>

/* A failed allocation inside uthash leaves the item out (and says so) instead of exiting. */
#define HASH_NONFATAL_OOM         1
#define uthash_nonfatal_oom(item) (add_failed = true)
#include <uthash.h>

struct kvr_se_block {
    uint64_t seq;      /* the block's sequence hash: the engine's id for it */
    uint32_t refs;     /* requests in flight holding it in their prompt */
    bool cached;       /* stored by the engine, not removed since */
    UT_hash_handle hh; /* in the table, by seq */
    uint32_t tokens[]; /* block_size */
};

void kvr_se_blocks_init(struct kvr_se_blocks *t, uint32_t block_size)
{
    memset(t, 0, sizeof *t);
    t->block_size = block_size;
}

static void drop(struct kvr_se_blocks *t, struct kvr_se_block *b)
{
    HASH_DEL(t->head, b);
    t->n--;
    free(b);
}

void kvr_se_blocks_free(struct kvr_se_blocks *t)
{
    struct kvr_se_block *b, *tmp;
    HASH_ITER(hh, t->head, b, tmp)
    {
        drop(t, b);
    }
    t->ncached = 0;
}

static struct kvr_se_block *find(const struct kvr_se_blocks *t, uint64_t seq)
{
    struct kvr_se_block *b = NULL;
    HASH_FIND(hh, t->head, &seq, sizeof seq, b);
    return b;
}

/* b lost a reference or its cached mark: freed when it has neither. */
static void settle(struct kvr_se_blocks *t, struct kvr_se_block *b)
{
    if (!b->refs && !b->cached)
        drop(t, b);
}

kvr_status kvr_se_blocks_ref(struct kvr_se_blocks *t, const uint64_t *seq, const uint32_t *tokens,
                             uint32_t nblocks)
{
    size_t bytes = (size_t)t->block_size * sizeof(uint32_t);
    for (uint32_t i = 0; i < nblocks; i++) {
        struct kvr_se_block *b = find(t, seq[i]);
        bool add_failed = false;
        if (!b && (b = malloc(sizeof *b + bytes))) {
            b->seq = seq[i];
            b->refs = 0;
            b->cached = false;
            memcpy(b->tokens, tokens + (size_t)i * t->block_size, bytes);
            HASH_ADD(hh, t->head, seq, sizeof b->seq, b);
            if (add_failed) {
                free(b);
                b = NULL;
            } else {
                t->n++;
            }
        }
        if (!b) {
            kvr_se_blocks_unref(t, seq, i);
            return KVR_ERR_NOMEM;
        }
        b->refs++;
    }
    return KVR_OK;
}

void kvr_se_blocks_unref(struct kvr_se_blocks *t, const uint64_t *seq, uint32_t nblocks)
{
    for (uint32_t i = 0; i < nblocks; i++) {
        struct kvr_se_block *b = find(t, seq[i]);
        if (b && b->refs) {
            b->refs--;
            settle(t, b);
        }
    }
}

const uint32_t *kvr_se_blocks_stored(struct kvr_se_blocks *t, uint64_t seq)
{
    struct kvr_se_block *b = find(t, seq);
    if (!b) {
        t->untracked++;
        return NULL;
    }
    if (!b->cached) {
        b->cached = true;
        t->ncached++;
    }
    return b->tokens;
}

void kvr_se_blocks_removed(struct kvr_se_blocks *t, uint64_t seq)
{
    struct kvr_se_block *b = find(t, seq);
    if (!b || !b->cached) {
        t->unknown_removed++;
        return;
    }
    b->cached = false;
    t->ncached--;
    settle(t, b);
}

void kvr_se_blocks_cleared(struct kvr_se_blocks *t)
{
    struct kvr_se_block *b, *tmp;
    HASH_ITER(hh, t->head, b, tmp)
    {
        if (b->cached) {
            b->cached = false;
            t->ncached--;
            settle(t, b);
        }
    }
}
