/*
 * libFuzzer target: the simulated worker's handlers with NATS replaced by a discarding sink. Each
 * input is a sequence of `len:u16le payload[len & 0x3fff]` frames given to a fresh worker (a small
 * engine); the top two bits of len pick what the payload is for: 0 kvr_worker_on_generate (a
 * WorkerGenerate, so plain `len payload` sequences are forwards), 1 kvr_worker_on_cancel, 2
 * kvr_worker_on_heartbeat (a heartbeat on its own subject: the clash rule), 3 a control byte per
 * payload byte (mod 4: one engine step, a cut of the outgoing connection, its return, a tick a
 * minute later so that deadlines pass). At the end the engine runs every step it has, so accepted
 * requests go through prefill, decode and done, and a clock far ahead ends what has a deadline.
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

/* One engine step in virtual time; false when idle. */
static bool step(struct kvr_worker *w, uint64_t *now)
{
    pthread_mutex_lock(&w->mu);
    uint64_t dur = kvr_engine_step_begin(w->eng, *now);
    if (dur) {
        *now += dur;
        kvr_engine_step_end(w->eng, *now);
    }
    pthread_mutex_unlock(&w->mu);
    kvr_worker_flush(w);
    return dur != 0;
}

static void control(struct kvr_worker *w, const uint8_t *p, size_t n, uint64_t *now)
{
    for (size_t i = 0; i < n; i++) {
        switch (p[i] % 4) {
        case 0:
            step(w, now);
            break;
        case 1:
            kvr_worker_on_disconnected(w);
            break;
        case 2:
            kvr_worker_on_reconnected(w);
            break;
        default:
            *now += 60 * KVR_NS_PER_S;
            kvr_worker_tick(w, *now);
        }
    }
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
    if (kvr_worker_init(&w, &cfg, (struct kvr_sink){.publish = discard, .ctx = NULL}) != KVR_OK)
        __builtin_trap();
    uint64_t now = kvr_now_ns();
    while (size >= 2) {
        unsigned kind = data[1] >> 6;
        size_t n = (size_t)data[0] | (size_t)(data[1] & 0x3f) << 8;
        data += 2;
        size -= 2;
        n = n < size ? n : size;
        if (kind == 0)
            kvr_worker_on_generate(&w, "_INBOX.f", data, n);
        else if (kind == 1)
            kvr_worker_on_cancel(&w, data, n);
        else if (kind == 2)
            kvr_worker_on_heartbeat(&w, data, n);
        else
            control(&w, data, n, &now);
        data += n;
        size -= n;
    }
    kvr_worker_heartbeat(&w);
    kvr_worker_on_hello(&w, "_INBOX.hello");
    for (int steps = 0; steps < 100000 && step(&w, &now); steps++) /* virtual time: bounded */
        ;
    kvr_worker_tick(&w, now + 3600 * KVR_NS_PER_S);
    kvr_worker_free(&w);
    return 0;
}
