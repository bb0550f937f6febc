/*
 * kvengine: the engine stand-in (src/standin). kvrouter's simulated engine in real time behind a
 * real engine's interfaces: the OpenAI-compatible HTTP API (completions streamed as Server-Sent
 * Events, /v1/models, /health, /metrics) and KV-cache events as vLLM msgpack batches over
 * ZeroMQ. Options, create, wait for SIGTERM or SIGINT, drain (stop taking requests, finish or
 * abort what runs), destroy. Exit status: 0 after a drain, 2 for a bad option, 1 when it could
 * not start (an address in use, say).
 */
#include "procstat.h"
#include <stdio.h>

#include "log.h"
#include "signals.h"
#include "standin.h"

int main(int argc, char **argv)
{
    static struct kvr_se_config cfg;
    struct kvr_opt table[KVR_SE_OPTIONS];
    kvr_se_config_default(&cfg);
    size_t n = kvr_se_config_options(&cfg, table);
    enum kvr_opts_result rc = kvr_opts_parse(
        table, n, argc, argv, "kvengine",
        "An LLM engine stand-in: kvrouter's simulated engine behind the OpenAI-compatible HTTP "
        "API and vLLM's ZeroMQ KV events.");
    if (rc != KVR_OPTS_GO)
        return rc == KVR_OPTS_EXIT ? 0 : 2;
    char why[512];
    if (kvr_se_config_check(&cfg, why, sizeof why) != KVR_OK) {
        fprintf(stderr, "kvengine: %s\n", why);
        return 2;
    }
    kvr_procstat_start();
    kvr_log_init("kvengine", (enum kvr_log_level)cfg.log_level);
    kvr_signals_catch();
    struct kvr_standin *s = NULL;
    kvr_status st = kvr_standin_create(&cfg, &s, why, sizeof why);
    if (st != KVR_OK) {
        kvr_log(KVR_LOG_ERROR, "start_failed", "error=\"%s\"", why);
        fprintf(stderr, "kvengine: %s\n", why);
        return st == KVR_ERR_INVALID ? 2 : 1;
    }
    kvr_log(KVR_LOG_INFO, "engine_started",
            "model=%s block_size=%u num_blocks=%u speedup=%g max_model_len=%u", cfg.model,
            cfg.engine.block_size, cfg.engine.num_blocks, cfg.engine.speedup, cfg.max_model_len);
    int sig = kvr_signals_wait();
    kvr_log(KVR_LOG_INFO, "engine_draining", "signal=%d", sig);
    unsigned aborted = kvr_standin_drain(s);
    kvr_standin_destroy(s);
    kvr_log(KVR_LOG_INFO, "engine_stopped", "aborted=%u", aborted);
    return 0;
}
