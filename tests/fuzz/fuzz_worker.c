/*
 * libFuzzer target: the simulated worker's request handler with NATS replaced by a discarding
 * sink. Each input is a sequence of `len:u16le payload[len]` WorkerGenerate messages given to a
 * fresh worker (a small engine), after which the engine runs every step it has, so accepted
 * requests go through prefill, decode and done.
 */
#include <stddef.h>
#include <stdint.h>

#include "clock.h"
#include "log.h"
#include "worker.h"

static kvr_status discard(void *ctx, const struct kvr_outmsg *m)
{
    (void)ctx;
    (void)m;
    return KVR_OK;
}

/* libFuzzer's entry point (it has no header). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct kvr_wk_config cfg;
    struct kvr_worker w;
    kvr_log_init("fuzz_worker", KVR_LOG_ERROR); /* a line per refusal would be most of the time */
    kvr_wk_config_default(&cfg);
    cfg.id = 3;
    cfg.engine.num_blocks = 256;
    cfg.engine.block_size = 16;
    cfg.engine.speedup = 1e6;
    cfg.max_prompt_tokens = 4096;
    cfg.max_output_tokens = 64;
    if (kvr_worker_init(&w, &cfg, (struct kvr_sink){discard, NULL}) != KVR_OK)
        __builtin_trap();
    while (size >= 2) {
        size_t n = (size_t)data[0] | (size_t)data[1] << 8;
        data += 2;
        size -= 2;
        n = n < size ? n : size;
        kvr_worker_on_generate(&w, "_INBOX.f", data, n);
        data += n;
        size -= n;
    }
    kvr_worker_heartbeat(&w);
    uint64_t now = kvr_now_ns();
    for (int steps = 0; steps < 100000; steps++) { /* virtual time: bounded */
        pthread_mutex_lock(&w.mu);
        uint64_t dur = kvr_engine_step_begin(w.eng, now);
        if (dur) {
            now += dur;
            kvr_engine_step_end(w.eng, now);
        }
        pthread_mutex_unlock(&w.mu);
        kvr_worker_flush(&w);
        if (!dur)
            break;
    }
    kvr_worker_free(&w);
    return 0;
}
