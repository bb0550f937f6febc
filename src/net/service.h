/*
 * kvr_service: the NATS service API (ADR-32: $SRV.PING, $SRV.INFO, $SRV.STATS, each also as
 * $SRV.<verb>.<name> and $SRV.<verb>.<name>.<id>) answered by hand, since nats.c's micro service
 * framework cannot take our queue groups and two connections (NATS-NOTES.md). Answers are built
 * with jansson, so no JSON is ever cut short or malformed. Endpoint counters come from each
 * endpoint's kvr_reply; the caller holds the lock that covers them.
 */
#ifndef KVR_SERVICE_H
#define KVR_SERVICE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "reply.h"

#define KVR_SERVICE_MAX_ENDPOINTS 4
#define KVR_SERVICE_MAX_META      16 /* metadata pairs */

struct kvr_service_endpoint {
    const char *name;              /* "generate" */
    char subject[256];             /* */
    const char *queue_group;       /* NULL: none */
    const struct kvr_reply *stats; /* its counters (borrowed; must outlive the service) */
};

struct kvr_service {
    const char *name;                           /* "kvrouter" (borrowed) */
    const char *version;                        /* */
    const char *description;                    /* */
    char id[32];                                /* this instance: unique per process */
    const char *meta_key[KVR_SERVICE_MAX_META]; /* metadata keys (borrowed literals) */
    char meta_value[KVR_SERVICE_MAX_META][128]; /* ... their values */
    uint32_t nmeta;                             /* */
    uint64_t started_ns;                        /* realtime, for "started" */
    struct kvr_service_endpoint ep[KVR_SERVICE_MAX_ENDPOINTS];
    uint32_t nep;
};

/*
 * name, version, description and meta_key borrowed (string literals); meta_value copied (it also
 * seeds the instance id, unique per process).
 */
void kvr_service_init(struct kvr_service *s, const char *name, const char *version,
                      const char *description, const char *meta_key, const char *meta_value);
/* Add a metadata pair (key borrowed, value copied); KVR_ERR_FULL past KVR_SERVICE_MAX_META. */
kvr_status kvr_service_meta(struct kvr_service *s, const char *key, const char *value);
/* The same with a number as its value. */
kvr_status kvr_service_meta_u64(struct kvr_service *s, const char *key, uint64_t value);
/* Add an endpoint (stats borrowed). KVR_ERR_FULL past KVR_SERVICE_MAX_ENDPOINTS. */
kvr_status kvr_service_add(struct kvr_service *s, const char *name, const char *subject,
                           const char *queue_group, const struct kvr_reply *stats);

/* The three subjects to subscribe to, into subj[i] (each len bytes). */
void kvr_service_subjects(const struct kvr_service *s, char subj[3][256]);

/*
 * The answer to a message on subject ($SRV.<verb>...), as malloc'ed JSON text (free it), or NULL
 * for a verb it does not know. data (STATS only; taken, may be NULL) becomes the first endpoint's
 * "data" object.
 */
char *kvr_service_answer(const struct kvr_service *s, const char *subject, json_t *data);

/* The largest integer every JSON reader holds exactly (JavaScript's Number.MAX_SAFE_INTEGER). */
#define KVR_JSON_SAFE_MAX ((1ull << 53) - 1)

/* Set key to an unsigned value in obj: a JSON integer up to KVR_JSON_SAFE_MAX, else the decimal
 * digits as a string (the router's epoch, a nanosecond time, is one), so no reader loses digits. */
void kvr_json_u64(json_t *obj, const char *key, uint64_t v);

/* The error counts of r by status name, as a new object. */
json_t *kvr_json_errors(const struct kvr_reply *r);

#endif
