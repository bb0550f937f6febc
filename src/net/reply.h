/*
 * kvr_reply: the only way an error reaches a client, for the router and the worker alike. One
 * kvr_reply per endpoint (generate, select, a worker's generate) encodes the answer (the final
 * GenerateResponse chunk with error_code, or a SelectResponse), queues it with the NATS service
 * error headers (Nats-Service-Error, Nats-Service-Error-Code), counts the error by code for
 * $SRV.STATS and logs it (the client's request id made safe for a log line). A request that
 * names no reply subject cannot be answered: it is counted and logged as dropped. Anyone may
 * publish bad requests: at most KVR_REPLY_LOG_PER_S such lines a second are written per endpoint,
 * the next one written saying how many were left out (suppressed=N); every one is counted.
 * Not thread-safe: the owner's lock covers it (the daemons' state mutex).
 */
#ifndef KVR_REPLY_H
#define KVR_REPLY_H

#include <stdbool.h>
#include <stdint.h>

#include "buf.h"
#include "kvr/router.h"
#include "kvr/status.h"
#include "outbox.h"
#include "prom.h"

/* KVR_REPLY_CODES: one more than the largest status value (codes are appended in order). */
#define KVR_REPLY_SLOT(name, value, text) KVR_REPLY_SLOT_##name = value,
enum kvr_reply_slots { KVR_STATUS_LIST(KVR_REPLY_SLOT) KVR_REPLY_CODES };
#undef KVR_REPLY_SLOT

#define KVR_REPLY_LOG_PER_S 10 /* request_refused and request_dropped lines a second, at most */

/* Lines of one kind that anyone can cause, one per message: at most KVR_REPLY_LOG_PER_S a second
 * are written, the next one written saying how many were left out. Zeroed to start; not
 * thread-safe: the owner's lock covers it. */
struct kvr_log_gate {
    uint64_t second_ns;  /* when the second whose lines `lines` counts began */
    uint32_t lines;      /* lines written in it */
    uint64_t suppressed; /* lines left out since the last one written */
};

/* Whether one more line may be written now: then *left is how many were left out since the last
 * one written (and the count starts again); else this one is counted as left out. */
bool kvr_log_gate_pass(struct kvr_log_gate *g, uint64_t *left);

struct kvr_reply {
    const char *endpoint;              /* "generate", "select": logs and stats (borrowed) */
    uint64_t worker_id;                /* set in the chunks a worker sends; 0 for a router */
    const char *router_id;             /* named in a router's select answers (borrowed) */
    uint64_t requests;                 /* answered or refused through this endpoint */
    uint64_t errors;                   /* every error, answered or dropped */
    uint64_t dropped;                  /* errors nobody could be told of (no reply subject) */
    uint64_t by_code[KVR_REPLY_CODES]; /* errors by kvr_status */
    uint64_t processing_ns;            /* time spent deciding, for $SRV.STATS */
    struct kvr_prom_hist latency;      /* ... and its distribution, for the metrics */
    kvr_status last;                   /* the last error */
    struct kvr_log_gate log;           /* request_refused and request_dropped lines */
    struct kvr_buf buf;                /* encoding scratch (owned) */
};

void kvr_reply_init(struct kvr_reply *r, const char *endpoint, uint64_t worker_id);
void kvr_reply_free(struct kvr_reply *r);

/* Count one request handled in elapsed_ns (errors are counted by the calls below). */
void kvr_reply_count(struct kvr_reply *r, uint64_t elapsed_ns);

/* What a failed request's final chunk says beyond its code. */
struct kvr_reply_why {
    uint64_t worker_id;     /* the worker that failed (0: the endpoint's own id) */
    uint32_t position;      /* tokens the client got before it */
    uint32_t cached_tokens; /* a worker's: the prompt tokens it had cached */
    const char *detail;     /* NULL, or the figures ("9 tokens, the limit is 8") */
};

/*
 * Client request_id (may be NULL) at subject reply failed with st (not KVR_OK): queue its final
 * chunk into out, count, log. reply NULL or empty: counted as dropped. why may be NULL.
 */
void kvr_reply_fail(struct kvr_reply *r, struct kvr_outbox *out, const char *reply,
                    const char *request_id, kvr_status st, const struct kvr_reply_why *why);
struct kvr_wire_request; /* codec.h */

/* Request q (as its decoder left it) refused with st: kvr_reply_fail with the figures of the limit
 * it passed, if any (kvr_wire_request_why). */
void kvr_reply_refuse(struct kvr_reply *r, struct kvr_outbox *out, const char *reply,
                      const struct kvr_wire_request *q, kvr_status st);

/* The same with nothing more to say. */
void kvr_reply_error(struct kvr_reply *r, struct kvr_outbox *out, const char *reply,
                     const char *request_id, kvr_status st);

/* A select's answer: the decision (st KVR_OK, d set) or the error (detail: NULL or its figures),
 * into out; errors counted. */
void kvr_reply_select(struct kvr_reply *r, struct kvr_outbox *out, const char *reply,
                      const struct kvr_decision *d, uint64_t key, kvr_status st,
                      const char *detail);

#endif
