/*
 * kvr_se_blocks: the tokens of the KV blocks kvengine knows, by sequence hash. The simulated
 * engine names a block only by hashes (its engine id is the block's sequence hash), while a
 * BlockStored event on the wire carries the block's token ids; so every full prompt block of a
 * request submitted is referenced here with its tokens, from submission to the request's end,
 * and a block the engine stored is kept (marked cached) until the engine removes it or clears
 * the cache. An entry lives exactly while it is referenced or cached, so the table holds at most
 * the pool's cached blocks plus the blocks of the requests in flight.
 *
 * Pure data; one owner (kvengine's state mutex).
 */
#ifndef KVR_SE_BLOCKS_H
#define KVR_SE_BLOCKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr/status.h"

struct kvr_se_block; /* one entry (blocks.c) */

struct kvr_se_blocks {
    struct kvr_se_block *head; /* uthash by seq; the table owns its entries */
    uint32_t block_size;       /* tokens per block */
    uint32_t n;                /* entries */
    uint32_t ncached;          /* of which stored by the engine and not removed */
    uint64_t untracked;        /* Stored blocks whose tokens were not known (not published) */
    uint64_t unknown_removed;  /* Removed blocks that were not cached here */
};

void kvr_se_blocks_init(struct kvr_se_blocks *t, uint32_t block_size);
void kvr_se_blocks_free(struct kvr_se_blocks *t);

/* Reference the nblocks blocks seq[i] with tokens tokens[i * block_size ..] (a request's full
 * prompt blocks; both borrowed). KVR_ERR_NOMEM takes none. */
kvr_status kvr_se_blocks_ref(struct kvr_se_blocks *t, const uint64_t *seq, const uint32_t *tokens,
                             uint32_t nblocks);
/* Drop the references of kvr_se_blocks_ref (the request ended). */
void kvr_se_blocks_unref(struct kvr_se_blocks *t, const uint64_t *seq, uint32_t nblocks);

/* The engine stored block seq: its block_size tokens (owned by the table, valid until the next
 * call that changes it), the entry kept as cached; NULL when unknown (counted in untracked). */
const uint32_t *kvr_se_blocks_stored(struct kvr_se_blocks *t, uint64_t seq);
/* The engine removed block seq (an eviction); unknown ones are counted. */
void kvr_se_blocks_removed(struct kvr_se_blocks *t, uint64_t seq);
/* The engine's cache was dropped: no entry is cached any more. */
void kvr_se_blocks_cleared(struct kvr_se_blocks *t);

#endif
