/*
 * kvbench: load generator and client-side measurements for kvrouter on NATS (src/loadgen):
 *   --mode load    replay a workload through the routers, one run per policy (replay.h)
 *   --mode hop     what the router's NATS hop costs, and the highest routed rate (hop.h)
 *   --mode digest  do the routers' state digests agree? (digests.h)
 *   --mode resend  is a request sent twice answered once, whenever it is resent? (digests.h)
 *   --mode cancel  how fast does a cancel end a stream and free its worker? (hop.h)
 *   --mode direct  time to first token through the fleet against straight to the engine (direct.h)
 * This file only reads the options, creates the client, runs the mode and destroys the client.
 */
#include <stdio.h>

#include "../loadgen/bench_config.h"
#include "../loadgen/client.h"
#include "../loadgen/digests.h"
#include "../loadgen/direct.h"
#include "../loadgen/hop.h"
#include "../loadgen/replay.h"
#include "log.h"

int main(int argc, char **argv)
{
    static struct kvr_bench_config cfg; /* a few kB of option text */
    kvr_bench_config_default(&cfg);
    enum kvr_opts_result r = kvr_bench_config_parse(&cfg, argc, argv);
    if (r != KVR_OPTS_GO)
        return r == KVR_OPTS_EXIT ? 0 : 2;
    kvr_log_init("kvbench", (enum kvr_log_level)cfg.net.log_level);
    kvr_status st;
    struct kvr_client *client = kvr_client_create(&cfg.net, &st);
    if (!client) {
        fprintf(stderr, "kvbench: cannot connect to %s: %s\n", cfg.net.urls, kvr_status_str(st));
        kvr_client_shutdown();
        return 1;
    }
    int rc = cfg.mode == KVR_BENCH_HOP      ? kvr_hop_run(&cfg, client)
             : cfg.mode == KVR_BENCH_DIGEST ? kvr_digests_check(&cfg, client)
             : cfg.mode == KVR_BENCH_RESEND ? kvr_resend_run(&cfg, client)
             : cfg.mode == KVR_BENCH_CANCEL ? kvr_cancel_run(&cfg, client)
             : cfg.mode == KVR_BENCH_DIRECT ? kvr_direct_run(&cfg, client)
                                            : kvr_replay_run(&cfg, client);
    kvr_client_destroy(client);
    kvr_client_shutdown();
    return rc;
}
