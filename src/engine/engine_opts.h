/*
 * The simulated engine's settings as command-line options (block size, pool, step budgets,
 * speed-up), for the programs that run it in real time.
 */
#ifndef KVR_ENGINE_OPTS_H
#define KVR_ENGINE_OPTS_H

#include <stddef.h>

#include "engine.h"
#include "opts.h"

#define KVR_ENGINE_OPTIONS 5

/* The options over e (which must outlive them) into out[KVR_ENGINE_OPTIONS]; returns how many. */
size_t kvr_engine_options(struct kvr_engine_config *e, struct kvr_opt *out);

#endif
