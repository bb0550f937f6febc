/*
 * The simulated engine's settings as options (opts.h), shared by the programs that run it in real
 * time: kvworker and kvengine. kvsim has its own, written in virtual time.
 */
#include "engine_opts.h"

#include <string.h>

size_t kvr_engine_options(struct kvr_engine_config *e, struct kvr_opt *out)
{
    const struct kvr_opt t[KVR_ENGINE_OPTIONS] = {
        {.name = "block-size",
         .env = "KVR_BLOCK_SIZE",
         .type = KVR_OPT_U32,
         .ptr = &e->block_size,
         .help = "tokens per KV block",
         .min = 1,
         .max = 65536},
        {.name = "num-blocks",
         .env = "KVR_NUM_BLOCKS",
         .type = KVR_OPT_U32,
         .ptr = &e->num_blocks,
         .help = "KV pool size, blocks",
         .min = 16,
         .max = 1 << 30},
        {.name = "max-batched-tokens",
         .type = KVR_OPT_U32,
         .ptr = &e->max_batched_tokens,
         .help = "tokens per step",
         .min = 1,
         .max = 1 << 24},
        {.name = "max-seqs",
         .type = KVR_OPT_U32,
         .ptr = &e->max_seqs,
         .help = "sequences per step",
         .min = 1,
         .max = 1 << 20},
        {.name = "speedup",
         .env = "KVR_SPEEDUP",
         .type = KVR_OPT_DOUBLE,
         .ptr = &e->speedup,
         .help = "engine time is divided by this",
         .min = 1e-3,
         .max = 1e6},
    };
    memcpy(out, t, sizeof t);
    return KVR_ENGINE_OPTIONS;
}
