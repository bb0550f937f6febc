/*
 * The router daemon's settings: one struct, its defaults set once in kvr_rd_config_default
 * beside it (the core's own settings come from kvr_router_config_default, overridden only where
 * a daemon differs from the simulator, each with its reason), the option table that fills it from
 * a config file, the environment and flags, and its validation. Start-up only; not thread-safe.
 */
#ifndef KVR_RD_CONFIG_H
#define KVR_RD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr/router.h"
#include "natscfg.h"
#include "opts.h"

/* bytes of a router id: letters, digits, '-' and '_' (it names subjects) */
#define KVR_RD_ID_MAX 64

struct kvr_rd_config {
    struct kvr_nats_config net;    /* where to connect, the subjects' prefix and namespace, logs */
    char id[KVR_OPT_STR_MAX];      /* router id; "" until checked: host-pid */
    struct kvr_router_config core; /* the routing core (policy, weights, bounds, timeouts) */
    uint32_t max_output_tokens;    /* larger max_tokens refused */
    uint64_t tick_ns;              /* housekeeping period */
    uint64_t warmup_ns;            /* at start, listen at most this long before serving */
    uint64_t hello_ns;             /* period of the hello to the other routers */
    uint64_t sync_timeout_ns;      /* wait this long (twice at most) for a peer's snapshot */
    uint64_t kv_replay_ns;         /* a resync whose index replaces this one's applies the KV
                                      events of this long before its ask again (kvlog.h) */
    uint64_t drain_timeout_ns;     /* on SIGTERM, settle queued requests for at most this long */
    uint64_t booking_ttl_ns;       /* a booked select never forwarded is dropped after this */
    uint64_t crossing_ns;          /* a resend this soon after an error answer crossed it (3 s;
                                      tests shorten it) */
    uint64_t heartbeat_min_ns;     /* a worker's announced heartbeat interval, clamped to these */
    uint64_t heartbeat_max_ns;     /* */
    uint64_t test_drop_gossip;     /* tests only: do not send every Nth decision (0: send all) */
    uint64_t test_stall_ns;        /* tests only: a message on router.stall holds the state lock
                                      this long (0: no such subject) */
    char metrics_addr[KVR_OPT_STR_MAX]; /* HOST:PORT of /metrics, /healthz, /readyz ("": none) */
    bool gossip;                        /* share decisions with the other routers */
};

void kvr_rd_config_default(struct kvr_rd_config *c);

/* The option table over c, into out (at least KVR_RD_OPTIONS entries); returns the count. */
#define KVR_RD_OPTIONS 42
size_t kvr_rd_config_options(struct kvr_rd_config *c, struct kvr_opt *out);

/*
 * Check what the table cannot: the id's characters (a default one is made from host and pid),
 * non-zero periods, the policy and subject lengths. KVR_OK, or KVR_ERR_INVALID with why filled.
 */
kvr_status kvr_rd_config_check(struct kvr_rd_config *c, char *why, size_t len);

#endif
