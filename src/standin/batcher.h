/*
 * kvr_se_batcher: the KV events of one engine step made into vLLM event batches (kvevents.h's
 * encoder), handed to an emit function (the ZeroMQ publisher). Events of a step go together in
 * one batch, in the order the engine gave them; a step whose events would pass a subscriber's
 * limits (events, block hashes or token ids per batch: kvevents.h's KVR_KVEV_MAX_* unless
 * given) is cut into several batches, and a BlockStored too long for one batch into several
 * events, each piece's parent the last block of the piece before, so the chain stays whole.
 * Every Stored event carries its blocks' token ids, block_size, lora_id nil and medium "GPU".
 * A hybrid batcher plays vLLM serving a hybrid model (full attention beside sliding-window
 * layers): every block is stored by KV cache group 0 ("sliding_window") and group 1
 * ("full_attention"), each event naming its group_idx and each Stored its kind; group 0 then
 * removes it at once (a window shorter than a block: the earliest eviction there can be), group 1
 * when the engine evicts it. Only the map layout writes groups (kvevents.h).
 *
 * Memory: the pending step's events, at most one batch's worth before it is emitted. Pure data
 * apart from emit; one owner (kvengine's state mutex).
 */
#ifndef KVR_SE_BATCHER_H
#define KVR_SE_BATCHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "kvevents.h"
#include "kvr/status.h"

/* Where an encoded batch goes: payload[0..len) borrowed for the call. */
typedef kvr_status (*kvr_se_emit_fn)(void *ctx, const void *payload, size_t len);

struct kvr_se_batch_limits {
    uint32_t max_events; /* events per batch; 0: KVR_KVEV_MAX_EVENTS */
    uint32_t max_hashes; /* block hashes per batch; 0: KVR_KVEV_MAX_HASHES */
    uint32_t max_tokens; /* token ids per batch; 0: KVR_KVEV_MAX_TOKENS */
};

struct kvr_se_event; /* a pending event (batcher.c) */

struct kvr_se_batcher {
    struct kvr_kvev_encoding how;   /* the wire form */
    struct kvr_se_batch_limits lim; /* effective, no zero */
    bool hybrid;                    /* events of two KV cache groups (above); set after init */
    uint32_t dp_rank;               /* the batches' data_parallel_rank; set after init */
    uint32_t block_size;            /* tokens per block */
    kvr_se_emit_fn emit;            /* */
    void *ctx;                      /* emit's */
    double ts;                      /* the step's time, Unix seconds */
    struct kvr_se_event *ev;        /* pending events (owned) */
    uint32_t nev, capev;            /* */
    uint64_t *hashes;               /* their hashes (owned) */
    uint32_t nhashes, caphashes;    /* */
    uint32_t *tokens;               /* their tokens (owned) */
    uint32_t ntokens, captokens;    /* */
    struct kvr_kvev_event *wire;    /* the encoder's view of ev (owned scratch) */
    uint32_t capwire;               /* */
    struct kvr_buf out;             /* the encoded batch */
    uint64_t batches;               /* batches emitted */
    uint64_t events;                /* events in them */
    uint64_t failed;                /* batches lost: encoding or emit failed */
    uint64_t dropped;               /* blocks left out: no memory, or a block over the limits */
};

/* Set up b; how and lim are copied (lim may be NULL: the defaults). KVR_ERR_INVALID when a
 * block of block_size tokens could never fit a batch. */
kvr_status kvr_se_batcher_init(struct kvr_se_batcher *b, const struct kvr_kvev_encoding *how,
                               const struct kvr_se_batch_limits *lim, uint32_t block_size,
                               kvr_se_emit_fn emit, void *ctx);
void kvr_se_batcher_free(struct kvr_se_batcher *b);

/* A step begins at ts (Unix seconds): what follows until the flush is its batch. */
void kvr_se_batcher_begin(struct kvr_se_batcher *b, double ts);

/* n blocks stored, hashes[i] with tokens[i][0..block_size); parent the block before the first
 * (NULL at a sequence's start). All borrowed for the call. */
void kvr_se_batcher_stored(struct kvr_se_batcher *b, const uint64_t *parent, const uint64_t *hashes,
                           const uint32_t *const *tokens, uint32_t n);
/* n blocks removed (borrowed). */
void kvr_se_batcher_removed(struct kvr_se_batcher *b, const uint64_t *ids, uint32_t n);
/* The whole cache dropped. */
void kvr_se_batcher_cleared(struct kvr_se_batcher *b);

/* Emit what the step holds (nothing when it holds no event). */
void kvr_se_batcher_flush(struct kvr_se_batcher *b);

#endif
