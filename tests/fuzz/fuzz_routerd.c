/*
 * libFuzzer target: the router daemon's message handlers with NATS replaced by a discarding sink.
 * Each input is a sequence of messages, each `kind:u8 len:u16le payload[len]`. The low nibble of
 * kind picks the handler (modulo 10: generate, select, a worker event, gossip, a sync request, a
 * sync page, $SRV, digest, a timer tick), bits 4-5 the worker (1-4) or a variant, bits 6-7 the
 * worker event (kv, tokens, done, hb). Every input starts from a fresh router state that knows two
 * workers, so a crash, a leak or a sanitizer report is one input's doing.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "api.h"
#include "clock.h"
#include "log.h"
#include "codec.h"
#include "events.h"
#include "fleet.h"
#include "intake.h"
#include "state.h"
#include "sync.h"
#include "timer.h"

static kvr_status discard(void *ctx, const struct kvr_outmsg *m)
{
    (void)ctx;
    (void)m;
    return KVR_OK;
}

static void announce(struct kvr_rd *rd, uint64_t wid)
{
    struct kvr_wire_heartbeat h = {.info = {.id = wid, .block_size = 16, .capacity_blocks = 256},
                                   .interval_ms = 1000};
    struct kvr_buf b = {0};
    char subject[64];
    snprintf(subject, sizeof subject, "kv.default.ev.%llu.hb", (unsigned long long)wid);
    if (kvr_wire_encode_heartbeat(&b, &h) == KVR_OK)
        kvr_events_on_message(rd, subject, b.data, b.len);
    kvr_buf_free(&b);
}

/* A gossip message on the subject of the router id it names (any other is dropped at once). */
static void gossip_in(struct kvr_rd *rd, const uint8_t *p, size_t n)
{
    struct kvr_wire_gossip g;
    char subject[600] = "kv.default.router.gossip.?";
    if (kvr_wire_decode_gossip(p, n, &g) == KVR_OK) {
        snprintf(subject, sizeof subject, "kv.default.router.gossip.%s", g.router_id);
        kvr_wire_gossip_free(&g);
    }
    kvr_fleet_on_gossip(rd, subject, p, n);
}

static void one(struct kvr_rd *rd, const struct kvr_service *svc, uint8_t kind, const uint8_t *p,
                size_t n)
{
    static const char *const events[] = {"kv", "tokens", "done", "hb"};
    char subject[64];
    unsigned variant = (kind >> 4) & 3;
    switch ((kind & 15) % 11) {
    case 0:
        kvr_intake_generate(rd, "_INBOX.f", p, n);
        break;
    case 1:
        kvr_intake_select(rd, "_INBOX.f", p, n);
        break;
    case 2:
    case 3:
        /* worker 4's "hb" slot carries its rebind asks */
        snprintf(subject, sizeof subject, "kv.default.ev.%u.%s", 1u + variant,
                 (kind >> 6) == 3 && variant == 3 ? "rebind" : events[kind >> 6]);
        kvr_events_on_message(rd, subject, p, n);
        break;
    case 4:
        gossip_in(rd, p, n);
        break;
    case 5:
        kvr_sync_on_request(rd, "_INBOX.f", p, n);
        break;
    case 6:
        kvr_sync_on_page(rd, p, n);
        break;
    case 7:
        kvr_api_on_srv(rd, svc, variant & 1 ? "$SRV.STATS" : "$SRV.INFO.kvrouter", "_INBOX.f");
        break;
    case 8:
        kvr_api_on_digest(rd, "_INBOX.f");
        break;
    case 9:
        kvr_timer_tick(rd, kvr_now_ns(), !(variant & 2), variant & 1);
        break;
    case 10:
        kvr_intake_cancel(rd, p, n);
        break;
    }
}

/* libFuzzer's entry point (it has no header). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct kvr_rd_config cfg;
    struct kvr_rd rd;
    struct kvr_service svc;
    kvr_log_init("fuzz_routerd", KVR_LOG_ERROR); /* a line per refusal would be most of the time */
    kvr_rd_config_default(&cfg);
    strcpy(cfg.id, "fuzz");
    cfg.core.block_size = 16;
    cfg.core.seed = 1;
    cfg.core.max_inflight = 4096;
    cfg.core.index_max_entries = 65536;
    if (kvr_rd_init(&rd, &cfg, (struct kvr_sink){.publish = discard, .ctx = NULL}) != KVR_OK ||
        kvr_fleet_create(&rd) != KVR_OK)
        __builtin_trap();
    rd.fleet->synced = true;
    rd.serving = true;
    kvr_api_init(&svc, &rd);
    announce(&rd, 1);
    announce(&rd, 2);
    while (size >= 3) {
        uint8_t kind = data[0];
        size_t n = (size_t)data[1] | (size_t)data[2] << 8;
        data += 3;
        size -= 3;
        n = n < size ? n : size;
        one(&rd, &svc, kind, data, n);
        data += n;
        size -= n;
    }
    kvr_fleet_destroy(&rd);
    kvr_rd_free(&rd);
    return 0;
}
