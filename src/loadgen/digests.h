/*
 * kvbench's checks of a router fleet's consistency, against a running fleet:
 *
 * --mode digest: ask every router for its state digest (<prefix>.<ns>.router.digest), print each
 * answer as it came (one JSON object a line), and say on stderr whether they agree. An answer
 * that is not a JSON object with a 16-hex-digit "digest" is reported and counts as a
 * disagreement. Runs on the owner's thread (a synchronous subscription).
 *
 * --mode resend: is a request sent twice (the same bytes, inbox and request_id, as
 * docs/protocol.md allows at any moment) answered once? For each timing of the second copy (back
 * to back, 1 ms later, while the request waits in a router's queue, while it prefills, while it
 * decodes, after its final chunk) --trials requests, --concurrency of them in flight; each is
 * followed until --linger-ms after its final chunk and its resend. Prints a table per timing
 * (trials, how many were resent in the phase named, double answers, spurious finals, missing or
 * extra tokens, failures, requests two routers placed) and exits 1 if any trial was answered
 * twice, spuriously, with the wrong tokens, or not at all. The phases are seen, not guessed: the
 * routers' decisions on <prefix>.<ns>.router.gossip.* (kvr_watch) say a request was placed, and
 * their $SRV.STATS queue_len that the fleet is saturated; "queued" fills every worker's KV with
 * background requests (a quarter of a worker's capacity each) and cancels them once the trials
 * are resent. Runs on the owner's thread, which polls the trials every 200 us.
 */
#ifndef KVR_DIGESTS_H
#define KVR_DIGESTS_H

#include "bench_config.h"
#include "client.h"

/* Collect answers for --digest-wait-ms. The exit status: 0 when some answered and all agree. */
int kvr_digests_check(const struct kvr_bench_config *cfg, struct kvr_client *client);

/* The resend trials through client (both borrowed). The exit status: 0, 1 or 2 (no workers). */
int kvr_resend_run(const struct kvr_bench_config *cfg, struct kvr_client *client);

#endif
