/*
 * relay_floor: what a router's NATS hop costs with no router in it, the floor under
 * router_cpu_us_per_request (docs/benchmarks.md, "The router's CPU per routed request").
 *
 * It takes the router's place for kvbench --mode hop against one kvworker --null: it connects
 * as kvrouter does (kvr_connect: SendAsap, two connections, requests and events), takes the
 * client's generates in the router's queue group, wraps each in the WorkerGenerate envelope the
 * router sends (kvr_wire_encode_worker_generate, a fresh key each) and publishes it to the worker,
 * and takes every worker event on <prefix>.<ns>.ev.> and drops it. It decodes nothing, hashes
 * nothing, books nothing: the CPU it spends per request is nats.c's (the reader thread, the
 * hand-off to the delivery thread, the message allocation), libc's and the kernel's (a write per
 * forward). bench/router_cpu.sh runs it in the router's place with FLOOR=1 and measures it from
 * /proc.
 *
 * With --loop, both connections are read by one thread of its own (src/net/loop.h) and both
 * subscriptions are synchronous, taken right after each read: the floor with no hand-off from
 * nats.c's reader thread to a delivery thread (kvrouter does this for its generates).
 *
 * usage: relay_floor --nats URL [--worker ID] [--loop]   (namespace "default", prefix "kv";
 * SIGTERM ends it)
 * Prints msg=relay_started once subscribed, and msg=relay_stopped forwards=N events=M at the end.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nats/nats.h>

#include "codec.h"
#include "loop.h"
#include "util.h"

struct relay {
    natsConnection *nc_req, *nc_ev;
    char subj_worker[256];
    struct kvr_buf buf; /* the generate callback's alone: one subscription, one thread */
    uint64_t key;
    atomic_uint_fast64_t forwards, events, failed;
    struct kvr_loop loop;                        /* --loop: reads both connections */
    _Atomic(natsSubscription *) gen_sub, ev_sub; /* --loop: set once subscribed */
};

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static void forward(struct relay *r, natsMsg *msg)
{
    if (kvr_wire_encode_worker_generate(&r->buf, natsMsg_GetData(msg),
                                        (size_t)natsMsg_GetDataLength(msg), ++r->key, 0, "floor",
                                        0) == KVR_OK &&
        natsConnection_PublishRequest(r->nc_req, r->subj_worker, natsMsg_GetReply(msg), r->buf.data,
                                      (int)r->buf.len) == NATS_OK)
        atomic_fetch_add(&r->forwards, 1);
    else
        atomic_fetch_add(&r->failed, 1);
    natsMsg_Destroy(msg);
}

static void on_generate(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc;
    (void)sub;
    forward(ctx, msg);
}

static void on_event(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc;
    (void)sub;
    struct relay *r = ctx;
    atomic_fetch_add(&r->events, 1);
    natsMsg_Destroy(msg);
}

/* --loop: the loop thread, after each read. */
static void take(void *ctx)
{
    struct relay *r = ctx;
    natsSubscription *gen = atomic_load(&r->gen_sub), *ev = atomic_load(&r->ev_sub);
    natsMsg *msg;
    while (gen && natsSubscription_NextMsg(&msg, gen, 0) == NATS_OK)
        forward(r, msg);
    while (ev && natsSubscription_NextMsg(&msg, ev, 0) == NATS_OK) {
        atomic_fetch_add(&r->events, 1);
        natsMsg_Destroy(msg);
    }
}

/* Connect both connections and subscribe: on nats.c's threads, or (loop) on r->loop's. */
static natsStatus listen_all(struct relay *r, const struct kvr_nats_config *cfg, const char *gen,
                             const char *ev, bool loop, natsSubscription **sub_gen,
                             natsSubscription **sub_ev)
{
    if (!loop) {
        if (kvr_connect(cfg, "relay-floor", &r->nc_req) != KVR_OK ||
            kvr_connect(cfg, "relay-floor-events", &r->nc_ev) != KVR_OK)
            return NATS_CONNECTION_CLOSED;
        natsStatus s = natsConnection_Subscribe(sub_ev, r->nc_ev, ev, on_event, r);
        return s == NATS_OK ? natsConnection_QueueSubscribe(sub_gen, r->nc_req, gen, "kvrouter",
                                                            on_generate, r)
                            : s;
    }
    if (kvr_loop_start(&r->loop, 100 * 1000000ull, take, r) != KVR_OK ||
        kvr_connect_loop(cfg, "relay-floor", &r->loop, &r->nc_req) != KVR_OK ||
        kvr_connect_loop(cfg, "relay-floor-events", &r->loop, &r->nc_ev) != KVR_OK)
        return NATS_CONNECTION_CLOSED;
    natsStatus s = natsConnection_SubscribeSync(sub_ev, r->nc_ev, ev);
    if (s == NATS_OK)
        s = natsConnection_QueueSubscribeSync(sub_gen, r->nc_req, gen, "kvrouter");
    if (s == NATS_OK) {
        atomic_store(&r->ev_sub, *sub_ev);
        atomic_store(&r->gen_sub, *sub_gen);
        kvr_loop_wake(&r->loop);
    }
    return s;
}

int main(int argc, char **argv)
{
    struct kvr_nats_config cfg;
    kvr_nats_config_default(&cfg, KVR_LOG_WARN);
    uint64_t worker = 1;
    bool loop = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--loop")) {
            loop = true;
        } else if (i + 1 < argc && !strcmp(argv[i], "--nats")) {
            snprintf(cfg.urls, sizeof cfg.urls, "%s", argv[++i]);
        } else if (i + 1 < argc && !strcmp(argv[i], "--worker")) {
            worker = strtoull(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: relay_floor --nats URL [--worker ID] [--loop]\n");
            return 2;
        }
    }
    struct relay r;
    memset(&r, 0, sizeof r);
    char gen[256], ev[256], suffix[64];
    snprintf(suffix, sizeof suffix, "worker.%" PRIu64 ".generate", worker);
    if (!kvr_subject(r.subj_worker, sizeof r.subj_worker, cfg.prefix, cfg.ns, suffix) ||
        !kvr_subject(gen, sizeof gen, cfg.prefix, cfg.ns, "generate") ||
        !kvr_subject(ev, sizeof ev, cfg.prefix, cfg.ns, "ev.>"))
        return 2;
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    natsSubscription *sub_gen = NULL, *sub_ev = NULL;
    if (listen_all(&r, &cfg, gen, ev, loop, &sub_gen, &sub_ev) != NATS_OK ||
        natsSubscription_SetPendingLimits(sub_ev, -1, -1) != NATS_OK ||
        natsSubscription_SetPendingLimits(sub_gen, -1, -1) != NATS_OK ||
        natsConnection_Flush(r.nc_ev) != NATS_OK || natsConnection_Flush(r.nc_req) != NATS_OK) {
        fprintf(stderr, "relay_floor: cannot connect or subscribe at %s\n", cfg.urls);
        return 1;
    }
    printf("msg=relay_started generate=%s worker=%s loop=%s\n", gen, r.subj_worker,
           loop ? "true" : "false");
    fflush(stdout);
    while (!stop)
        pause();
    kvr_loop_stop(&r.loop); /* (not started without --loop) */
    natsSubscription_Unsubscribe(sub_gen);
    natsSubscription_Unsubscribe(sub_ev);
    natsSubscription_Destroy(sub_gen);
    natsSubscription_Destroy(sub_ev);
    kvr_conn_destroy(r.nc_req);
    kvr_conn_destroy(r.nc_ev);
    kvr_loop_free(&r.loop);
    kvr_buf_free(&r.buf);
    printf("msg=relay_stopped forwards=%" PRIu64 " events=%" PRIu64 " failed=%" PRIu64 "\n",
           (uint64_t)r.forwards, (uint64_t)r.events, (uint64_t)r.failed);
    nats_Close();
    return 0;
}
