/*
 * kvr_engine: a simulated vLLM-like inference engine (ROUTING.md section 6), pure C in virtual
 * time, deterministic. It has a KV pool of N blocks with prefix caching (blocks of finished
 * requests stay cached, keyed by sequence hash, until evicted in LRU order), a FIFO waiting queue
 * admitted under a free-block watermark, per-step token and sequence budgets, chunked prefill, one
 * decode token per running request per step, and recompute preemption when the pool runs dry. A
 * step lasts prefill(T) + decode(u) ms (T new prompt tokens in the step, u the KV utilisation;
 * the decode term only when some request decodes), divided by a speed-up factor.
 *
 * It publishes exactly what a real engine would, through the sink: Stored (parent-chained, engine
 * ids = sequence hashes) and Removed KV events, prefill done (first token), an output block each
 * time a decoding request takes a new block, and done. Every event of a step is delivered at the
 * step's end, in order.
 *
 * Driving it: kvr_engine_submit() queues a request; kvr_engine_step_begin(now) schedules the next
 * step and returns its duration (0 when there is nothing to do); kvr_engine_step_end(now) applies
 * it and emits its events. kvr_engine_cancel() ends a request early, at any moment outside a sink
 * callback (between a step's begin and end too); kvr_engine_progress() reads one, from anywhere.
 * Not thread-safe; one owner.
 */
#ifndef KVR_ENGINE_H
#define KVR_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr/router.h"
#include "kvr/status.h"

struct kvr_engine_config {
    uint32_t num_blocks;         /* KV pool size, blocks */
    uint32_t block_size;         /* tokens per block */
    double watermark;            /* fraction of the pool admission keeps free */
    uint32_t max_batched_tokens; /* token budget of a step */
    uint32_t max_seqs;           /* sequences in a step */
    double speedup;              /* step times are divided by this */
    double prefill_ms[3];        /* prefill(T) = [0] + [1] T + [2] T^2, ms */
    double decode_ms[3];         /* decode(u) = max(1, [0] + [1] u + [2] u^2), ms */
};

void kvr_engine_config_default(struct kvr_engine_config *c);

/* The blocks admission keeps free (the watermark): a request holding more than the pool less
 * these is never admitted (again, after a preemption or with its prompt cached). */
static inline uint32_t kvr_engine_watermark_blocks(const struct kvr_engine_config *c)
{
    return (uint32_t)(c->watermark * c->num_blocks);
}

/* A request as the engine receives it; arrays are copied. */
struct kvr_engine_request {
    uint64_t id;
    const uint64_t *seq;   /* sequence hashes of the prompt's full blocks */
    const uint64_t *local; /* their local hashes (for Stored events) */
    uint32_t nblocks;      /* full prompt blocks */
    uint32_t isl;          /* prompt tokens */
    uint32_t osl;          /* output tokens to generate (>= 1) */
};

/* What a finished request reports. Times in ns. */
struct kvr_engine_result {
    uint64_t id;
    uint64_t arrival;       /* submitted */
    uint64_t admitted;      /* first scheduled */
    uint64_t first_token;   /* end of the step that finished its prefill */
    uint64_t finished;      /* end of the step that produced its last token */
    uint32_t isl, osl;      /* */
    uint32_t cached_tokens; /* prompt tokens found in the prefix cache at first admission */
    uint32_t preemptions;   /* times it was preempted */
    double itl_sum_ms;      /* sum of its inter-token gaps */
    double itl_max_ms;      /* the largest gap */
};

/* Where the engine's publications go; every callback may be NULL. Called inside step_end. */
struct kvr_engine_sink {
    void *ctx;
    void (*stored)(void *ctx, const uint64_t *parent, const struct kvr_kv_block *blocks, size_t n);
    void (*removed)(void *ctx, const uint64_t *ids, size_t n);
    void (*prefill_done)(void *ctx, uint64_t id);
    void (*output_block)(void *ctx, uint64_t id);
    void (*token_gap)(void *ctx, double gap_ms); /* every inter-token gap, for distributions */
    void (*token)(void *ctx, uint64_t id);       /* a decode step produced one token of id */
    void (*done)(void *ctx, const struct kvr_engine_result *res);
};

struct kvr_engine;

struct kvr_engine *kvr_engine_create(const struct kvr_engine_config *cfg,
                                     const struct kvr_engine_sink *sink, kvr_status *st);
void kvr_engine_destroy(struct kvr_engine *e);

/* Queue a request at time now. KVR_ERR_INVALID for an empty prompt or no output. */
kvr_status kvr_engine_submit(struct kvr_engine *e, const struct kvr_engine_request *req,
                             uint64_t now);

/* Schedule the next step at now; returns its duration in ns, 0 when idle. */
uint64_t kvr_engine_step_begin(struct kvr_engine *e, uint64_t now);

/* Finish the step begun last, at now (its end); emits the step's events. */
void kvr_engine_step_end(struct kvr_engine *e, uint64_t now);

struct kvr_engine_stats {
    uint32_t waiting;       /* requests queued */
    uint32_t running;       /* requests admitted */
    uint32_t active_blocks; /* blocks referenced by running requests */
    uint32_t cached_blocks; /* unreferenced blocks still holding a prefix */
    uint64_t preemptions;   /* total */
    uint64_t evictions;     /* cached blocks evicted */
    uint64_t steps;         /* steps run */
    uint64_t cancelled;     /* requests ended early by kvr_engine_cancel */
    double kv_usage;        /* active_blocks / num_blocks */
};

void kvr_engine_stats(const struct kvr_engine *e, struct kvr_engine_stats *out);

/*
 * End request id now, wherever it is: taken out of the waiting queue or the running set, its
 * blocks released as a finished request's are (cached prompt blocks stay cached, the rest go back
 * blank), and nothing more is emitted for it (no token, output block or done, even from the step
 * in progress). KVR_ERR_UNKNOWN_REQUEST when the engine does not hold it. Not from inside a sink
 * callback.
 */
kvr_status kvr_engine_cancel(struct kvr_engine *e, uint64_t id);

/* Where a request held by the engine stands. */
struct kvr_engine_progress {
    bool running;           /* admitted (else waiting, perhaps after a preemption) */
    uint32_t cached_tokens; /* prompt tokens found in the prefix cache at first admission */
    uint32_t generated;     /* output tokens produced so far */
};

/* Read request id into *out; false when the engine does not hold it. Read-only, so a sink callback
 * may call it (prefill_done reads the cached prefix this way). */
bool kvr_engine_progress(const struct kvr_engine *e, uint64_t id, struct kvr_engine_progress *out);

#endif
