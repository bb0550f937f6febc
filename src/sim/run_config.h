/*
 * The settings of one `kvsim run`: struct kvr_sim_config (engines, router, delays, load) plus
 * what only the command has (workload, lists to compare, where the report goes), and its option
 * table. Each option writes straight into its field, so the defaults are kvr_sim_config_default's
 * (which takes the engine's and the router's from theirs) and --help prints them. The lists
 * (--policies, --sweep, --replicas) are text in the table and parsed after it. Used at start-up,
 * on the main thread.
 */
#ifndef KVR_RUN_CONFIG_H
#define KVR_RUN_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr/policy.h"
#include "opts.h"
#include "sim.h"

#define KVR_RUN_MAX_LOADS 32 /* values in a --sweep or --replicas list; more are refused */

/* --gossip: which settings run (bits; the option's value index plus one). */
enum { KVR_RUN_GOSSIP_ON = 1, KVR_RUN_GOSSIP_OFF = 2 };

struct kvr_run_config {
    struct kvr_sim_config sim;          /* engines, router, delays, workers, the one load */
    char workload[KVR_OPT_STR_MAX];     /* required: a kvr_workload_known name */
    char out[KVR_OPT_STR_MAX];          /* report directory */
    char trace[KVR_OPT_STR_MAX];        /* trace file; "": found by the workload's name */
    char policies[KVR_OPT_STR_MAX];     /* comma-separated, or "all" */
    char sweep[KVR_OPT_STR_MAX];        /* load values, comma-separated; "": the one load */
    char replica_list[KVR_OPT_STR_MAX]; /* router counts, comma-separated; "": one router */
    uint32_t requests;                  /* generated: how many; traces: the first N; 0: all */
    uint32_t max_tokens;                /* every output length (kvbench's too); 0: the workload's */
    uint64_t spread_ns;                 /* open loop: arrivals spread over [0, this) */
    int gossip;                         /* --gossip: 0 on, 1 off, 2 both */
    bool quiet;                         /* no progress lines */
    /* parsed from the text above by kvr_run_config_parse */
    enum kvr_policy policy[KVR_POLICY_COUNT]; /* the policies, in order */
    size_t npolicies;                         /* */
    double loads[KVR_RUN_MAX_LOADS];          /* --sweep */
    size_t nloads;                            /* 0: not given */
    uint32_t replicas[KVR_RUN_MAX_LOADS];     /* --replicas, each 1..KVR_SIM_MAX_REPLICAS */
    size_t nreplicas;                         /* 0: one router, no replica table */
    unsigned gossip_runs;                     /* KVR_RUN_GOSSIP_* bits of --gossip */
};

/* Fill c with the defaults (the simulator loses no request: its router queue is unbounded). */
void kvr_run_config_default(struct kvr_run_config *c);

/*
 * Apply the config file, the environment and argv (argv[0] is the subcommand's name), then check
 * and parse the lists. KVR_OPTS_BAD has been reported on stderr.
 */
enum kvr_opts_result kvr_run_config_parse(struct kvr_run_config *c, int argc, char **argv);

#endif
