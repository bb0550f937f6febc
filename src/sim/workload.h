/*
 * Workloads of BENCHMARKS.md for the simulator: the generated `seed` set-up (and its varied-ISL
 * and varied-OSL variants), `burst` (groups of 16 requests sharing a long prefix arriving within
 * 1 ms), and the Mooncake traces `conversation` and `synthetic`, whose 512-token hash ids expand to
 * deterministic token ids (equal ids give equal tokens, so prefix sharing survives hashing).
 * Tokens are produced on demand from a request's description, so a whole trace costs a few
 * bytes per block in memory. Pure apart from kvr_workload_load_trace, which reads a file.
 */
#ifndef KVR_WORKLOAD_H
#define KVR_WORKLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "kvr/status.h"

#define KVR_TRACE_BLOCK 512u /* tokens per Mooncake hash id */
#define KVR_CLOSED_LOOP UINT64_MAX
/* Output tokens of a trace record, at most (as --max-tokens). */
#define KVR_WL_MAX_OUTPUT 1000000u

enum kvr_workload_kind {
    KVR_WL_SEED,     /* shared prefixes, fixed lengths, closed loop */
    KVR_WL_SEED_ISL, /* ... varied prompt length */
    KVR_WL_SEED_OSL, /* ... varied output length */
    KVR_WL_BURST,    /* groups of 16 sharing a prefix, within 1 ms */
    KVR_WL_TRACE,    /* a Mooncake trace */
};

struct kvr_wl_request {
    uint64_t arrival_ns; /* at load 1; KVR_CLOSED_LOOP for closed-loop workloads */
    uint32_t isl;        /* prompt tokens */
    uint32_t osl;        /* output tokens */
    uint32_t family;     /* generated: prefix family; trace: offset of its ids in the id pool */
    uint32_t nids;       /* trace: hash ids */
    uint32_t prefix;     /* generated: prefix tokens */
};

struct kvr_workload {
    enum kvr_workload_kind kind;
    const char *name;            /* as given on the command line */
    struct kvr_wl_request *reqs; /* owned */
    uint32_t nreqs;
    uint32_t *ids; /* trace hash id pool, owned */
    uint64_t nids;
    uint64_t seed; /* every generated token and length comes from it */
};

/* The prefix group of request i: a generated workload's family, a trace's first hash id
 * (UINT64_MAX for a trace record without one). */
uint64_t kvr_workload_group(const struct kvr_workload *w, uint32_t i);

/* Generated workloads: n requests (0: the workload's default) from seed. */
kvr_status kvr_workload_generate(struct kvr_workload *w, const char *name, uint32_t n,
                                 uint64_t seed);

/*
 * A Mooncake trace (JSON lines with timestamp, input_length, output_length, hash_ids), at most n
 * requests (0: all). Timestamps (ms) are taken relative to the earliest, so the first request
 * arrives at 0 whatever the trace's epoch (the Mooncake traces start at 0). On a malformed line,
 * *bad_line receives its number and KVR_ERR_MALFORMED is returned; on an output_length over
 * KVR_WL_MAX_OUTPUT, KVR_ERR_MAX_TOKENS_TOO_LARGE.
 */
kvr_status kvr_workload_load_trace(struct kvr_workload *w, const char *name, const char *path,
                                   uint32_t n, uint64_t seed, uint64_t *bad_line);

void kvr_workload_free(struct kvr_workload *w);

/*
 * Spread open-loop arrivals: each moves later by a uniform draw in [0, spread_ns) from the
 * workload's seed, and the requests are sorted by arrival again. For traces with coarse timestamps
 * (the conversation trace's are multiples of about 3 s, so about ten requests share each one):
 * spread over that step, they arrive in some order within it instead of at the same instant.
 * Closed-loop workloads are left alone.
 */
void kvr_workload_spread(struct kvr_workload *w, uint64_t spread_ns);

/* The prompt of request i: its isl token ids into out (room for isl). */
void kvr_workload_tokens(const struct kvr_workload *w, uint32_t i, uint32_t *out);

/* Whether name is a known workload, and whether it is a trace. */
bool kvr_workload_known(const char *name, bool *is_trace);

#endif
