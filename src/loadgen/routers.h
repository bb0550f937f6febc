/*
 * The routers' own figures for one kvbench run, from their $SRV.STATS.kvrouter answers (parsed
 * with jansson): asked before and after the run, each router's difference, summed over routers.
 * A router is told apart by its service id and start time; one new or restarted during the run
 * (or whose counters went back) counts from zero. Routers of another namespace or prefix on the
 * same NATS (their metadata says) are left out. Runs on the owner's thread.
 */
#ifndef KVR_ROUTERS_H
#define KVR_ROUTERS_H

#include <stdint.h>
#include <stdio.h>

#include "client.h"
#include "reply.h"

#define KVR_ROUTERS_MAX     256                   /* routers told apart in one poll */
#define KVR_ROUTERS_WAIT_NS (250ull * 1000000ull) /* how long their answers are collected */

/* One router's answer. */
struct kvr_router_fig {
    char id[64];                      /* its service id (its --id), cut to 63 bytes */
    char started[48];                 /* its service's start, RFC 3339 */
    uint64_t decisions;               /* routed and booked there (not its peers', imported) */
    uint64_t errors[KVR_REPLY_CODES]; /* by kvr_status, over its endpoints; [0]: unknown codes */
    double cpu_seconds;               /* its process's CPU, user + system (0: not reported) */
    uint64_t gossip_bytes;            /* gossip it sent */
    uint64_t gaps, repaired;          /* decisions of its peers it missed, and got again */
};

/* Every router's answer to one ask. */
struct kvr_routers_poll {
    struct kvr_router_fig r[KVR_ROUTERS_MAX]; /* n of them */
    uint32_t n;                               /* */
    uint32_t ignored;                         /* answers past KVR_ROUTERS_MAX, malformed, or a
                                                 second one of a router (id, started) */
};

/* One run's figures, summed over the routers that answered after it. */
struct kvr_routers_run {
    uint32_t answered;                /* routers that answered after the run */
    uint32_t before;                  /* ... and before it */
    uint32_t fresh;                   /* of the first, those counted from zero: new or restarted */
    uint64_t decisions;               /* */
    uint64_t errors[KVR_REPLY_CODES]; /* by kvr_status; [0]: codes this kvbench does not know */
    double cpu_seconds;               /* */
    uint64_t gossip_bytes;            /* sent */
    uint64_t gaps, repaired;          /* peers' decisions missed (a gap in their seqs), repaired */
};

/* Ask the routers of cfg's namespace (through c's connections) and collect their answers for
 * KVR_ROUTERS_WAIT_NS into out. */
void kvr_routers_poll(struct kvr_client *c, const char *prefix, const char *ns,
                      struct kvr_routers_poll *out);

/* The run between before and after, into out. */
void kvr_routers_diff(const struct kvr_routers_poll *before, const struct kvr_routers_poll *after,
                      struct kvr_routers_run *out);

/* "2 answered  decisions=1200 errors=none cpu_s=0.84 gossip_bytes=1.2 MB gossip_gaps=0
 * repaired=0" into buf; returns buf. */
const char *kvr_routers_format(const struct kvr_routers_run *r, char *buf, size_t len);
/* The errors as "none" or "ERR_NO_WORKERS:3,ERR_OVERLOADED:1" into buf; returns buf. */
const char *kvr_routers_errors(const struct kvr_routers_run *r, char *buf, size_t len);
/* bytes as "812 B", "1.2 kB", "1.2 MB", "3.4 GB" (powers of 1000) into buf; returns buf. */
const char *kvr_routers_bytes(uint64_t bytes, char *buf, size_t len);
/* The figures as JSON object members ("routers_answered": 2, ..., "errors": {...}) into f. */
void kvr_routers_json(FILE *f, const struct kvr_routers_run *r);

#endif
