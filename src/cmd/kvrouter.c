/*
 * kvrouter: the KV-cache-aware router daemon (src/routerd). Options, create, start, wait for
 * SIGTERM or SIGINT (or a NATS connection lost for good: exit status 1), drain, destroy.
 */
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "procstat.h"
#include "signals.h"
#include "util.h"
#include "routerd.h"

int main(int argc, char **argv)
{
    static struct kvr_rd_config cfg;
    struct kvr_opt table[KVR_RD_OPTIONS];
    kvr_rd_config_default(&cfg);
    size_t n = kvr_rd_config_options(&cfg, table);
    enum kvr_opts_result rc =
        kvr_opts_parse(table, n, argc, argv, "kvrouter", "The KV-cache-aware LLM request router.");
    if (rc != KVR_OPTS_GO)
        return rc == KVR_OPTS_EXIT ? 0 : 2;
    char why[256];
    if (kvr_rd_config_check(&cfg, why, sizeof why) != KVR_OK) {
        fprintf(stderr, "kvrouter: %s\n", why);
        return 2;
    }
    kvr_procstat_start();
    kvr_log_init("kvrouter", (enum kvr_log_level)cfg.net.log_level);
    kvr_signals_catch();
    kvr_status st;
    struct kvr_routerd *d = kvr_routerd_create(&cfg, &st);
    if (!d) {
        fprintf(stderr, "kvrouter: %s\n", kvr_status_str(st));
        return 2;
    }
    st = kvr_routerd_start(d);
    if (st == KVR_OK) {
        kvr_log(KVR_LOG_INFO, "router_started", "id=%s namespace=%s block_size=%u", cfg.id,
                cfg.net.ns, cfg.core.block_size);
        int sig = kvr_signals_wait();
        if (sig == KVR_STOP_FAILED) /* a NATS connection lost for good (nats_connection_lost) */
            kvr_log(KVR_LOG_INFO, "router_draining", "reason=nats_connection_lost");
        else
            kvr_log(KVR_LOG_INFO, "router_draining", "signal=%d", sig);
        kvr_routerd_drain(d);
    }
    if (kvr_routerd_destroy(d)) /* else a handler may still run: the exit ends it */
        kvr_net_shutdown();
    return st == KVR_OK && !kvr_signals_failed() ? 0 : 1;
}
