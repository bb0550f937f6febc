/*
 * kvworker: a simulated inference worker on NATS (src/worker). Options, create, start, wait for
 * SIGTERM or SIGINT, drain (stop taking requests, finish the ones held), destroy.
 */
#define _DEFAULT_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "link.h"
#include "log.h"
#include "signals.h"
#include "util.h"

static kvr_status discard(void *ctx, const struct kvr_outmsg *m)
{
    return KVR_ERR_IO; /* nothing is sent before the connection exists */
}

int main(int argc, char **argv)
{
    static struct kvr_wk_config cfg;
    static struct kvr_worker w;
    static struct kvr_wk_link link;
    struct kvr_opt table[KVR_WK_OPTIONS];
    kvr_wk_config_default(&cfg);
    size_t n = kvr_wk_config_options(&cfg, table);
    enum kvr_opts_result rc = kvr_opts_parse(table, n, argc, argv, "kvworker",
                                             "A simulated LLM inference worker on NATS.");
    if (rc != KVR_OPTS_GO)
        return rc == KVR_OPTS_EXIT ? 0 : 2;
    char why[160];
    if (kvr_wk_config_check(&cfg, why, sizeof why) != KVR_OK) {
        fprintf(stderr, "kvworker: %s\n", why);
        return 2;
    }
    kvr_log_init("kvworker", (enum kvr_log_level)cfg.net.log_level);
    kvr_signals_catch();
    kvr_status st = kvr_worker_init(&w, &cfg, (struct kvr_sink){discard, NULL});
    if (st != KVR_OK) {
        fprintf(stderr, "kvworker: %s\n", kvr_status_str(st));
        kvr_worker_free(&w);
        return 2;
    }
    st = kvr_wk_link_start(&link, &w);
    if (st == KVR_OK) {
        kvr_log(KVR_LOG_INFO, "worker_started",
                "id=%" PRIu64 " subject=%s block_size=%u num_blocks=%u speedup=%g null=%d", cfg.id,
                w.subj_gen, cfg.engine.block_size, cfg.engine.num_blocks, cfg.engine.speedup,
                cfg.null_mode);
        int sig = kvr_signals_wait();
        kvr_log(KVR_LOG_INFO, "worker_draining", "signal=%d", sig);
        kvr_wk_link_drain(&link);
    }
    kvr_wk_link_close(&link);
    kvr_log(KVR_LOG_INFO, "worker_stopped", "served=%" PRIu64 " errors=%" PRIu64, w.served,
            w.generate.errors);
    kvr_worker_free(&w);
    kvr_net_shutdown();
    return st == KVR_OK ? 0 : 1;
}
