/*
 * kvbench --mode digest: ask every router for its state digest (<prefix>.<ns>.router.digest),
 * print each answer as it came (one JSON object a line), and say on stderr whether they agree.
 * An answer that is not a JSON object with a 16-hex-digit "digest" is reported and counts as a
 * disagreement. Runs on the owner's thread (a synchronous subscription).
 */
#ifndef KVR_DIGESTS_H
#define KVR_DIGESTS_H

#include "bench_config.h"
#include "client.h"

/* Collect answers for --digest-wait-ms. The exit status: 0 when some answered and all agree. */
int kvr_digests_check(const struct kvr_bench_config *cfg, struct kvr_client *client);

#endif
