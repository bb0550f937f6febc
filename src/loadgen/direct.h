/*
 * kvbench --mode direct: a routed request's time to first token against the same request sent
 * straight to the engine behind the fleet's worker adapter (kvworker --engine openai), in one
 * run. --requests rounds (after --warmup rounds not counted), one request at a time; each round
 * sends one request through the fleet (<prefix>.<ns>.generate, as --mode load does) and one to
 * --engine-url's POST /v1/completions (kvr_oai, the engine's own model from /v1/models, the same
 * body options as the adapter's: token ids and continuous usage), alternating which goes first.
 * Every copy has a prompt of --prompt-tokens fresh random tokens, seeded from the run's start
 * time, so no prompt repeats and neither path finds a prefix the other left (cold prefill in
 * both). For each path: time to first token (from the send to the first chunk with a token),
 * end to end (to the final chunk; to the stream's end), tokens; then the ratios fleet/direct of
 * the TTFT mean, p50 and p90 and the differences of the mean and p50 (stats.h's quantile).
 *
 * The send time: the fleet's is taken just before the publish (the request already encoded),
 * the direct one's when kvr_oai_submit returned (the JSON body built), so building the body is
 * counted only where the adapter does it, in the fleet's figure.
 *
 * Prints a table and one key=value line; with --out, writes the figures to <out>/report.json.
 * Runs on the owner's thread; kvr_oai's thread only records the direct stream's chunks.
 */
#ifndef KVR_DIRECT_H
#define KVR_DIRECT_H

#include "bench_config.h"
#include "client.h"

/*
 * Measure through client and cfg->engine_url (both borrowed). The exit status: 0; 1 when a
 * measured request failed on either path (each printed), a path had no answer, the engine could
 * not be reached or the run stopped at --timeout-ms.
 */
int kvr_direct_run(const struct kvr_bench_config *cfg, struct kvr_client *client);

#endif
