/*
 * kvbench's timings of the request path, against a running fleet:
 *
 * --mode hop, against --null workers: the same 1,024-token request routed and sent straight to
 * one worker, alternating (50 warm-up rounds, then --requests of each), then the highest rate one
 * router sustains with --hop-window requests in flight for --hop-seconds. Ends with one key=value
 * line (routed_p50_us=... routed_max_rps=...).
 *
 * --mode cancel: how fast a cancel frees the worker. --trials long requests (fresh 512-token
 * prompts, --max-tokens or 16,384 tokens out), one at a time; after --cancel-after tokens a
 * CancelRequest goes to <prefix>.<ns>.cancel, and kvbench measures the time from it to the final
 * chunk (ERR_CANCELLED expected), to the worker's DoneEvent for the request (on
 * <prefix>.<ns>.ev.*.done, matched by the fleet's request key, which kvbench computes as the
 * routers do: kvr_client_key), and the chunks that still came after it. Prints p50/p99/max of
 * both times (the project's quantile, stats.h) and the chunk counts; exits 1 if a request did not
 * end cancelled.
 *
 * Both run on the owner's thread.
 */
#ifndef KVR_HOP_H
#define KVR_HOP_H

#include "bench_config.h"
#include "client.h"

/* Measure through client (both borrowed). The exit status: 0, or 1 when a phase had a failure (an
 * error, a timeout, a request never answered) or a side never answered. */
int kvr_hop_run(const struct kvr_bench_config *cfg, struct kvr_client *client);

/* The cancel timings through client (both borrowed). The exit status: 0 or 1. */
int kvr_cancel_run(const struct kvr_bench_config *cfg, struct kvr_client *client);

#endif
