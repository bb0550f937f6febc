/*
 * The router's operator API.
 */
#define _DEFAULT_SOURCE
#include "api.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fleet.h"
#include "procstat.h"
#include "subject.h"

void kvr_api_init(struct kvr_service *s, struct kvr_rd *rd)
{
    char subject[256];
    const struct kvr_rd_config *c = rd->cfg;
    kvr_service_init(s, KVR_RD_SERVICE_NAME, KVR_RD_SERVICE_VERSION,
                     "KV-cache-aware LLM request router", "router_id", c->id);
    /* what a client needs to know before it sends anything (docs/protocol.md, "Limits") */
    kvr_service_meta(s, "namespace", c->net.ns);
    kvr_service_meta(s, "prefix", c->net.prefix);
    kvr_service_meta_u64(s, "block_size", c->core.block_size);
    kvr_service_meta_u64(s, "max_prompt_tokens", c->core.max_prompt_tokens);
    kvr_service_meta_u64(s, "max_output_tokens", c->max_output_tokens);
    kvr_service_meta_u64(s, "max_request_bytes", rd->max_request_bytes);
    kvr_service_meta_u64(s, "max_request_id_bytes", KVR_REQUEST_ID_MAX);
    kvr_service_meta_u64(s, "max_reply_bytes", KVR_REPLY_MAX);
    kvr_service_meta_u64(s, "queue_timeout_ms", c->core.queue_timeout_ns / 1000000u);
    kvr_service_meta_u64(s, "booking_ttl_ms", c->booking_ttl_ns / 1000000u);
    kvr_subject(subject, sizeof subject, rd->cfg->net.prefix, rd->cfg->net.ns, "generate");
    kvr_service_add(s, "generate", subject, "kvrouter", &rd->generate);
    kvr_subject(subject, sizeof subject, rd->cfg->net.prefix, rd->cfg->net.ns, "select");
    kvr_service_add(s, "select", subject, "kvrouter", &rd->select);
}

/* Under mu: the core's figures and the daemon's own counters. */
static json_t *core_data(struct kvr_rd *rd)
{
    struct kvr_router_stats s;
    kvr_router_stats(rd->core, &s);
    json_t *o = json_object();
    const struct {
        const char *name;
        uint64_t value;
    } v[] = {
        {"decisions", s.decisions},
        {"rejected", s.rejected},
        {"overloaded", s.overloaded},
        {"queued", s.queued},
        {"workers", s.workers},
        {"inflight", s.inflight},
        {"queue_len", s.queue_len},
        {"index_entries", s.index_entries},
        {"nodes", s.nodes},
        {"active_blocks", s.active_blocks},
        {"memory_bytes", s.memory_bytes},
        {"completions", s.completions},
        {"completion_tokens", s.completion_tokens},
        {"completion_limit_tokens", s.completion_limit},
        {"failed_requests", s.failed_requests},
        {"unknown_request_events", s.unknown_request},
        {"unknown_worker_events", s.unknown_worker},
        {"bad_events", rd->ev_errors},
        {"kv_events_missed", rd->kvseq.missed},
        {"kv_event_gaps", rd->kvseq.gaps},
        {"kv_resyncs", rd->kv_resyncs},
        {"worker_announces_asked", rd->announces},
        {"workers_refused_block_size", s.bad_block_size},
        {"kv_unknown_parent", s.index.unknown_parent},
        {"kv_unknown_block", s.index.unknown_block},
        {"workers_joined", s.workers_joined},
        {"workers_left", s.workers_left},
        {"placed_again", rd->placed_again},
        {"pending", rd->pend.n},
        {"pending_full", rd->pend.full},
        {"outbox_dropped", rd->out.dropped},
        {"publish_failed", atomic_load_explicit(&rd->sink.failed, memory_order_relaxed)},
        {"core_events_lost", rd->deferred_lost},
        {"resends_after_end", rd->n.resends_after_end},
        {"resends_worker_gone", rd->n.resends_worker_gone},
        {"resends_after_error", rd->n.resends_after_error},
        {"repeats_asked", rd->n.repeats_asked},
        {"cancels", rd->n.cancels},
        {"cancels_sent", rd->n.cancels_sent},
        {"cancels_bad", rd->n.cancels_bad},
        {"answers_refused", rd->n.answers_refused},
        {"cancelled_queued", rd->n.cancelled_queued},
        {"cancelled_early", rd->n.cancelled_early},
        {"forwards_failed", rd->n.forwards_failed},
        {"bookings_expired", rd->n.bookings_expired},
        {"recent", rd->recent.n},
        {"recent_evicted", rd->recent.evicted},
        {"early_cancels", rd->early_cancels.n},
        {"early_cancels_evicted", rd->early_cancels.evicted},
        {"early_dones", rd->early_dones.n},
        {"early_dones_evicted", rd->early_dones.evicted},
        {"stalls", rd->stalls},
        {"ends_from_heartbeats", rd->n.ends_from_heartbeats},
        {"event_batches", rd->n.event_batches},
        {"batched_events", rd->n.batched_events},
    };
    for (size_t i = 0; o && i < sizeof v / sizeof v[0]; i++)
        kvr_json_u64(o, v[i].name, v[i].value);
    if (o) /* the process's CPU, for kvbench's per-run figures */
        json_object_set_new(o, "cpu_seconds", json_real(kvr_procstat_cpu_seconds()));
    json_t *rep = json_object();
    if (o && rep) {
        kvr_fleet_stats(rd, rep);
        json_object_set_new(o, "replication", rep);
    } else {
        json_decref(rep);
    }
    return o;
}

/* text to reply (freed): never into the fleet's own subjects nor a system one, whoever asks (a
 * reply subject is the asker's to choose; docs/security.md). */
static void publish_text(struct kvr_rd *rd, const char *reply, char *text)
{
    bool asked = reply && *reply;
    if (asked && !kvr_reply_usable(reply, rd->cfg->net.prefix)) {
        pthread_mutex_lock(&rd->mu);
        rd->n.answers_refused++;
        pthread_mutex_unlock(&rd->mu);
    } else if (asked && text) {
        struct kvr_outmsg m = {
            .subject = (char *)reply, .data = (uint8_t *)text, .len = strlen(text)};
        if (rd->sink.publish(rd->sink.ctx, &m) != KVR_OK)
            atomic_fetch_add_explicit(&rd->sink.failed, 1, memory_order_relaxed);
    }
    free(text);
}

void kvr_api_on_srv(struct kvr_rd *rd, const struct kvr_service *s, const char *subject,
                    const char *reply)
{
    pthread_mutex_lock(&rd->mu);
    bool stats = !strncmp(subject, "$SRV.STATS", 10);
    char *text = kvr_service_answer(s, subject, stats ? core_data(rd) : NULL);
    pthread_mutex_unlock(&rd->mu);
    publish_text(rd, reply, text);
}

void kvr_api_on_digest(struct kvr_rd *rd, const char *reply)
{
    json_t *o = json_object();
    pthread_mutex_lock(&rd->mu);
    if (o) {
        json_object_set_new(o, "router_id", json_string(rd->cfg->id));
        kvr_fleet_stats(rd, o);
    }
    pthread_mutex_unlock(&rd->mu);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    publish_text(rd, reply, text);
}
