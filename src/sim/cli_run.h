/*
 * kvsim run: simulate a workload through the routing core and N simulated engines, once per
 * policy and load (and, with --replicas, per count of router replicas with and without gossip),
 * and write report.json, report.md and plots into a directory. Its options are one kvr_opts
 * table bound straight to struct kvr_sim_config (with its engine and router configs), so each
 * default is the one set beside its struct and `kvsim run --help` prints it. Runs on the main
 * thread; the simulations run one after the other and are deterministic for a seed.
 */
#ifndef KVR_CLI_RUN_H
#define KVR_CLI_RUN_H

/* The subcommand: argv[0] is "run", then its options. Returns the exit status (0, 1 or 2). */
int kvr_cli_run_main(int argc, char **argv);

#endif
