/*
 * kvsim explain: a generated shared-prefix workload (ROUTING.md's seed set-up: a few long shared
 * prefixes, each prompt one of them plus unique tokens) routed through the decision pipeline in
 * virtual time with a closed loop of clients, printing the first decisions with every candidate's
 * overlap, predicted load and cost, then a summary per policy. Runs on the main thread; every
 * policy gets a fresh router over the same prompts.
 */
#ifndef KVR_CLI_EXPLAIN_H
#define KVR_CLI_EXPLAIN_H

/* The subcommand: argv[0] is "explain", then its options. Returns the exit status (0, 1 or 2). */
int kvr_cli_explain_main(int argc, char **argv);

#endif
