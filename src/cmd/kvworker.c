/*
 * kvworker: a simulated inference worker on NATS (src/worker). Options, create, start, wait for
 * SIGTERM or SIGINT, drain (stop taking requests, finish the ones held), destroy. Exit status: 0
 * after a drain, 2 for a bad option, 1 when it could not serve: no connection, a connection lost
 * for good (nats_connection_lost), or its --id is another running process's (refused at start, or
 * yielded to the older of two started at once).
 */
#define _DEFAULT_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "link.h"
#include "log.h"
#include "procstat.h"
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
    char why[256]; /* an address check explains itself at length */
    if (kvr_wk_config_check(&cfg, why, sizeof why) != KVR_OK) {
        fprintf(stderr, "kvworker: %s\n", why);
        return 2;
    }
    kvr_procstat_start();
    kvr_log_init("kvworker", (enum kvr_log_level)cfg.net.log_level);
    kvr_signals_catch();
    kvr_status st = kvr_worker_init(&w, &cfg, (struct kvr_sink){.publish = discard, .ctx = NULL});
    if (st != KVR_OK) {
        fprintf(stderr, "kvworker: %s\n", kvr_status_str(st));
        kvr_worker_free(&w);
        return 2;
    }
    st = kvr_wk_link_start(&link, &w);
    bool clash = st == KVR_ERR_WORKER_ID_CLASH;
    if (st == KVR_OK) {
        kvr_log(KVR_LOG_INFO, "worker_started",
                "id=%" PRIu64 " instance=%016" PRIx64
                " subject=%s block_size=%u num_blocks=%u speedup=%g null=%d",
                cfg.id, w.instance, w.subj_gen, cfg.engine.block_size, cfg.engine.num_blocks,
                cfg.engine.speedup, cfg.null_mode);
        while (!kvr_signal_received() && !(clash = kvr_worker_clashed(&w)))
            kvr_sleep_ns(20 * KVR_NS_PER_MS);
        if (!clash) { /* a yielding worker drains nothing: the older instance serves it all */
            if (kvr_signals_failed()) /* a NATS connection lost for good */
                kvr_log(KVR_LOG_INFO, "worker_draining", "reason=nats_connection_lost");
            else
                kvr_log(KVR_LOG_INFO, "worker_draining", "signal=%d", kvr_signal_received());
            kvr_wk_link_drain(&link);
        }
    }
    bool settled = kvr_wk_link_close(&link);
    clash = clash || kvr_worker_clashed(&w); /* during the drain too */
    kvr_log(KVR_LOG_INFO, "worker_stopped", "served=%" PRIu64 " errors=%" PRIu64, w.c.served,
            w.generate.errors);
    if (settled) { /* else a handler may still read it all: the exit frees it */
        kvr_worker_free(&w);
        kvr_net_shutdown();
    }
    if (clash)
        fprintf(stderr,
                "kvworker: worker id %" PRIu64 " is used by another running process%s; "
                "give each worker its own --id\n",
                cfg.id, st == KVR_OK ? " that started first: this one stopped" : ": not started");
    return st == KVR_OK && !clash && !kvr_signals_failed() ? 0 : 1;
}
