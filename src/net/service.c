/*
 * kvr_service implementation.
 */
#define _DEFAULT_SOURCE
#include "service.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "kvr/hash.h"

void kvr_service_init(struct kvr_service *s, const char *name, const char *version,
                      const char *description, const char *meta_key, const char *meta_value)
{
    memset(s, 0, sizeof *s);
    s->name = name;
    s->version = version;
    s->description = description;
    kvr_service_meta(s, meta_key, meta_value);
    s->started_ns = kvr_realtime_ns();
    snprintf(s->id, sizeof s->id, "%016" PRIx64,
             kvr_hash_bytes(meta_value, strlen(meta_value)) ^ s->started_ns);
}

kvr_status kvr_service_meta(struct kvr_service *s, const char *key, const char *value)
{
    if (s->nmeta == KVR_SERVICE_MAX_META)
        return KVR_ERR_FULL;
    s->meta_key[s->nmeta] = key;
    snprintf(s->meta_value[s->nmeta], sizeof s->meta_value[0], "%s", value);
    s->nmeta++;
    return KVR_OK;
}

kvr_status kvr_service_meta_u64(struct kvr_service *s, const char *key, uint64_t value)
{
    char v[24];
    snprintf(v, sizeof v, "%" PRIu64, value);
    return kvr_service_meta(s, key, v);
}

kvr_status kvr_service_add(struct kvr_service *s, const char *name, const char *subject,
                           const char *queue_group, const struct kvr_reply *stats)
{
    if (s->nep == KVR_SERVICE_MAX_ENDPOINTS)
        return KVR_ERR_FULL;
    struct kvr_service_endpoint *e = &s->ep[s->nep++];
    e->name = name;
    snprintf(e->subject, sizeof e->subject, "%s", subject);
    e->queue_group = queue_group;
    e->stats = stats;
    return KVR_OK;
}

void kvr_service_subjects(const struct kvr_service *s, char subj[3][256])
{
    snprintf(subj[0], 256, "$SRV.*");
    snprintf(subj[1], 256, "$SRV.*.%s", s->name);
    snprintf(subj[2], 256, "$SRV.*.%s.%s", s->name, s->id);
}

void kvr_json_u64(json_t *obj, const char *key, uint64_t v)
{
    if (v <= KVR_JSON_SAFE_MAX) {
        json_object_set_new(obj, key, json_integer((json_int_t)v));
        return;
    }
    char text[24]; /* past 2^53 - 1 a JavaScript number loses digits: a decimal string */
    snprintf(text, sizeof text, "%" PRIu64, v);
    json_object_set_new(obj, key, json_string(text));
}

json_t *kvr_json_errors(const struct kvr_reply *r)
{
    json_t *o = json_object();
    for (unsigned c = 1; o && c < KVR_REPLY_CODES; c++)
        if (r->by_code[c])
            kvr_json_u64(o, kvr_status_name((kvr_status)c) + 4, r->by_code[c]); /* ERR_...: the
                                                                                 proto's names */
    return o;
}

static json_t *common(const struct kvr_service *s, const char *type)
{
    char t[64];
    snprintf(t, sizeof t, "io.nats.micro.v1.%s", type);
    json_t *o = json_pack("{s:s, s:s, s:s, s:s}", "type", t, "name", s->name, "id", s->id,
                          "version", s->version);
    json_t *meta = json_object();
    for (uint32_t i = 0; meta && i < s->nmeta; i++)
        json_object_set_new(meta, s->meta_key[i], json_string(s->meta_value[i]));
    if (o && meta)
        json_object_set_new(o, "metadata", meta);
    else
        json_decref(meta);
    return o;
}

static json_t *endpoint_info(const struct kvr_service_endpoint *e)
{
    json_t *o = json_pack("{s:s, s:s, s:n}", "name", e->name, "subject", e->subject, "metadata");
    if (o && e->queue_group)
        json_object_set_new(o, "queue_group", json_string(e->queue_group));
    return o;
}

static json_t *endpoint_stats(const struct kvr_service_endpoint *e)
{
    json_t *o = endpoint_info(e);
    const struct kvr_reply *r = e->stats;
    if (!o || !r)
        return o;
    kvr_json_u64(o, "num_requests", r->requests);
    kvr_json_u64(o, "num_errors", r->errors);
    json_object_set_new(o, "last_error", json_string(r->errors ? kvr_status_str(r->last) : ""));
    kvr_json_u64(o, "processing_time", r->processing_ns);
    kvr_json_u64(o, "average_processing_time", r->requests ? r->processing_ns / r->requests : 0);
    kvr_json_u64(o, "dropped", r->dropped);
    json_object_set_new(o, "errors_by_code", kvr_json_errors(r));
    return o;
}

static json_t *endpoints(const struct kvr_service *s, bool stats, json_t *data)
{
    json_t *a = json_array();
    for (uint32_t i = 0; a && i < s->nep; i++) {
        json_t *e = stats ? endpoint_stats(&s->ep[i]) : endpoint_info(&s->ep[i]);
        if (e && stats && i == 0 && data) {
            json_object_set(e, "data", data);
        }
        json_array_append_new(a, e);
    }
    return a;
}

char *kvr_service_answer(const struct kvr_service *s, const char *subject, json_t *data)
{
    const char *verb = strncmp(subject, "$SRV.", 5) ? "" : subject + 5;
    size_t k = strcspn(verb, ".");
    json_t *o = NULL;
    if (k == 4 && !memcmp(verb, "PING", 4)) {
        o = common(s, "ping_response");
    } else if (k == 4 && !memcmp(verb, "INFO", 4)) {
        o = common(s, "info_response");
        if (o) {
            json_object_set_new(o, "description", json_string(s->description));
            json_object_set_new(o, "endpoints", endpoints(s, false, NULL));
        }
    } else if (k == 5 && !memcmp(verb, "STATS", 5)) {
        o = common(s, "stats_response");
        char started[64];
        kvr_rfc3339(started, sizeof started, s->started_ns);
        if (o) {
            json_object_set_new(o, "started", json_string(started));
            json_object_set_new(o, "endpoints", endpoints(s, true, data));
        }
    }
    json_decref(data);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return text;
}
