/*
 * kvbench's settings: one struct, its defaults (kvr_bench_config_default, the only place they
 * are written) and its option table, so --help and --print-config show them. Parsed at start-up
 * on the main thread, read-only afterwards.
 */
#ifndef KVR_BENCH_CONFIG_H
#define KVR_BENCH_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/policy.h"
#include "natscfg.h"
#include "opts.h"

/* --mode */
enum kvr_bench_mode {
    KVR_BENCH_LOAD = 0,   /* replay a workload through the routers, one run per policy */
    KVR_BENCH_HOP = 1,    /* what the router's NATS hop costs, and the highest routed rate */
    KVR_BENCH_DIGEST = 2, /* do the routers' state digests agree? */
    KVR_BENCH_RESEND = 3, /* is a request sent twice answered once, whenever it is resent? */
    KVR_BENCH_CANCEL = 4, /* how fast does a cancel end the stream and free the worker? */
    KVR_BENCH_DIRECT = 5, /* time to first token through the fleet against straight to the engine */
};

struct kvr_bench_config {
    struct kvr_nats_config net;     /* where to connect, the subjects, logs */
    int mode;                       /* enum kvr_bench_mode */
    char workload[KVR_OPT_STR_MAX]; /* a kvr_workload_known name */
    char trace[KVR_OPT_STR_MAX];    /* trace file; "" : traces/<workload>_trace.jsonl */
    char policies[KVR_OPT_STR_MAX]; /* load: one run per policy, comma-separated */
    char out[KVR_OPT_STR_MAX];      /* load, direct: report directory; "": no report */
    bool per_request;               /* load: requests.csv in out, a line per request answered */
    uint32_t requests;              /* load: 0 is the workload's default; hop: 0 is 2,000;
                                       direct: rounds, 0 is 200 */
    uint32_t concurrency;           /* load, closed loop: clients */
    double rate_scale;              /* load, open loop: arrival-rate factor */
    uint32_t max_tokens;            /* load: every output length; 0: the workload's (cancel:
                                       the long requests', 0: 16,384) */
    uint64_t seed;                  /* load: the workload's seed (each run adds to it) */
    uint32_t workers;               /* hit-rate reference: fleet size; 0: from heartbeats */
    uint32_t num_blocks;            /* ... blocks per worker */
    uint32_t block_size;            /* ... tokens per block */
    uint64_t timeout_ns;            /* load: a run gives up after this long */
    uint64_t resend_ns;             /* load: resend a request silent this long; 0: never */
    uint64_t worker_id;             /* hop: the worker to call directly; 0: the first heard */
    uint32_t hop_window;            /* hop: requests in flight in the max-rate phase */
    uint64_t hop_ns;                /* hop: how long the max-rate phase lasts */
    uint64_t digest_wait_ns;        /* digest: how long answers are collected */
    uint32_t trials;                /* resend: trials per timing; cancel: requests cancelled */
    uint32_t cancel_after;          /* cancel: tokens received before the cancel goes out */
    uint64_t linger_ns;             /* load, resend, cancel: listen this long after the end */
    char engine[KVR_OPT_STR_MAX];   /* direct: the engine's base URL, http://host:port */
    uint32_t prompt_tokens;         /* direct: every prompt's length, tokens */
    uint32_t warmup;                /* direct: rounds sent first and not counted */
    /* parsed from the text above by kvr_bench_config_parse */
    enum kvr_policy policy[KVR_POLICY_COUNT]; /* --policies, in order */
    size_t npolicies;                         /* */
};

void kvr_bench_config_default(struct kvr_bench_config *c);

/*
 * Apply the config file, the environment and argv to c (which holds the defaults), then check
 * what the table cannot (the workload's name, the policies) and fill in the trace's default path.
 * KVR_OPTS_BAD has been reported on stderr.
 */
enum kvr_opts_result kvr_bench_config_parse(struct kvr_bench_config *c, int argc, char **argv);

#endif
