/*
 * kvbench --mode load: replay a workload of BENCHMARKS.md through the routers
 * (<prefix>.<ns>.generate), one run per policy (a per-request policy override, so every run uses
 * the same routers and workers), and measure what a client feels: time to first token,
 * inter-token latency, end-to-end, throughput, prefix-cache hit (from the workers' answers),
 * errors. Prints one line per run (and a ratio line for the first two) and writes the same
 * report.json / report.md / plots as kvsim; with each run, the routers' own figures for it from
 * their $SRV.STATS before and after it (routers.h). Runs on the owner's thread (in open loop
 * with a thread of its own that resends stalled requests meanwhile); the client's callback sends
 * in closed loop, through this module's encoder.
 */
#ifndef KVR_REPLAY_H
#define KVR_REPLAY_H

#include "bench_config.h"
#include "client.h"

/* Replay cfg's workload through client (both borrowed). The exit status: 0, 1 or 2. */
int kvr_replay_run(const struct kvr_bench_config *cfg, struct kvr_client *client);

#endif
