/*
 * kvbench --mode hop, against --null workers: the same 1,024-token request routed and sent
 * straight to one worker, alternating (50 warm-up rounds, then --requests of each), then the
 * highest rate one router sustains with --hop-window requests in flight for --hop-seconds. Ends
 * with one key=value line (routed_p50_us=... routed_max_rps=...). Runs on the owner's thread.
 */
#ifndef KVR_HOP_H
#define KVR_HOP_H

#include "bench_config.h"
#include "client.h"

/* Measure through client (both borrowed). The exit status: 0, or 1 when a side never answered. */
int kvr_hop_run(const struct kvr_bench_config *cfg, struct kvr_client *client);

#endif
