/*
 * The worker's metrics and readiness: the simulated engine's figures, or the adapter's (its
 * engine's KV events, streams and health).
 */
#define _DEFAULT_SOURCE
#include "metrics.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "../engine/engine.h"
#include "clock.h"

/* What a scrape shows, copied under mu. */
struct figures {
    uint64_t requests;                 /* the generate endpoint's */
    uint64_t by_code[KVR_REPLY_CODES]; /* its errors by kvr_status */
    struct kvr_prom_hist latency;      /* its handler's time */
    struct kvr_wk_counters c;          /* the worker's counters */
    uint32_t held;                     /* requests held */
    bool sim;                          /* the simulated engine (else the adapter) */
    struct kvr_engine_stats e;         /* the simulated engine's figures */
    struct kvr_wk_adapter_stats a;     /* the adapter's */
    uint64_t capacity;                 /* the KV pool, blocks */
    uint64_t outbox_dropped;           /* messages the outbox could not copy (memory) */
    uint64_t publish_failed;           /* publishes NATS refused */
};

/* mu within KVR_WK_LOCK_WAIT_NS, or false. */
static bool lock_soon(struct kvr_worker *w)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* pthread_mutex_timedlock's clock */
    uint64_t at = (uint64_t)ts.tv_sec * KVR_NS_PER_S + (uint64_t)ts.tv_nsec + KVR_WK_LOCK_WAIT_NS;
    ts = (struct timespec){(time_t)(at / KVR_NS_PER_S), (long)(at % KVR_NS_PER_S)};
    return pthread_mutex_timedlock(&w->mu, &ts) == 0;
}

static void counter(struct kvr_prom *p, const char *name, const char *help, uint64_t v)
{
    kvr_prom_counter(p, name, help, v);
}

static void gauge(struct kvr_prom *p, const char *name, const char *help, double v)
{
    kvr_prom_gauge(p, name, help, v);
}

static void endpoint(struct kvr_prom *p, const struct figures *f)
{
    counter(p, "kvworker_requests_total", "Forwards taken or refused on the generate endpoint.",
            f->requests);
    kvr_prom_family(p, "kvworker_errors_total", KVR_PROM_COUNTER,
                    "Errors by ErrorCode: refused forwards, cancels and deadlines told the client, "
                    "and those nobody could be told of.");
    for (int c = 1; c < KVR_REPLY_CODES; c++) {
        if (!f->by_code[c])
            continue;
        struct kvr_prom_label l = {"code", kvr_status_name((kvr_status)c) + 4};
        kvr_prom_u64(p, &l, 1, f->by_code[c]);
    }
    kvr_prom_family(p, "kvworker_request_seconds", KVR_PROM_HISTOGRAM,
                    "Time to take or refuse a forward (decode, check, hand to the engine).");
    kvr_prom_histogram(p, NULL, 0, &f->latency);
}

static void counters(struct kvr_prom *p, const struct figures *f)
{
    const struct kvr_wk_counters *c = &f->c;
    gauge(p, "kvworker_held_requests", "Requests held: in the engine, waiting or running.",
          f->held);
    counter(p, "kvworker_served_total", "Requests the engine finished.", c->served);
    counter(p, "kvworker_cancelled_total", "Requests ended by a router's cancel.", c->cancelled);
    counter(p, "kvworker_deadlines_total", "Requests ended by their deadline.", c->deadlines);
    counter(p, "kvworker_drain_cut_total",
            "Requests still held when the drain ran out of time, ended ERR_SHUTDOWN.",
            c->drain_cut);
    counter(p, "kvworker_duplicates_total",
            "Forwards dropped: the request was held or ended in the last 60 s.", c->duplicates);
    counter(p, "kvworker_repeats_total", "Streams repeated after the outgoing connection's cut.",
            c->repeats);
    counter(p, "kvworker_rebind_asks_total", "RebindAsks sent after a cut.", c->rebind_asks);
    counter(p, "kvworker_rebinds_total", "WorkerRebinds received for a stream kept here.",
            c->rebinds);
    counter(p, "kvworker_resend_repeats_total",
            "Streams repeated because their client resent the request (WorkerRebind repeat).",
            c->resend_repeats);
    counter(p, "kvworker_resend_refused_total",
            "Repeats for a resend refused: not kept here, or repeated less than 0.5 s ago.",
            c->resend_refused);
    counter(p, "kvworker_dropped_total", "Messages not made (out of memory).",
            c->dropped + f->outbox_dropped);
    counter(p, "kvworker_publish_failed_total",
            "Messages NATS refused to publish, lost: a connection cut past the client's reconnect "
            "buffer, or closed, or a payload over the server's limit.",
            f->publish_failed);
    counter(p, "kvworker_event_batches_total",
            "EventBatch messages sent (--event-batch-ms): lifecycle events sent together.",
            c->batches);
    counter(p, "kvworker_batched_events_total", "Lifecycle events sent in EventBatch messages.",
            c->batched_events);
    counter(p, "kvworker_engine_errors_total", "Requests the engine behind the adapter failed.",
            c->engine_errors);
}

/* The adapter's: its engine's KV events, streams and health. */
static void adapter(struct kvr_prom *p, const struct figures *f)
{
    const struct kvr_wk_adapter_stats *a = &f->a;
    gauge(p, "kvworker_engine_capacity_blocks", "The engine's KV pool, blocks (0: unknown).",
          (double)f->capacity);
    gauge(p, "kvworker_adapter_engine_up", "1 while the engine answers.", a->down ? 0 : 1);
    gauge(p, "kvworker_adapter_kv_events",
          "1 while the engine's KV events are taken (0: routers learn its cache from decisions).",
          a->no_events ? 0 : 1);
    gauge(p, "kvworker_adapter_streams", "Streams open to the engine.", (double)a->streams);
    counter(p, "kvworker_adapter_engine_downs_total", "Times the engine stopped answering.",
            a->engine_downs);
    counter(p, "kvworker_adapter_engine_metrics_failed_total",
            "Reads of the engine's /metrics that failed (a status, no sample) while it answered: "
            "the heartbeats keep the last load read.",
            a->metrics_failed);
    counter(p, "kvworker_adapter_kv_batches_total", "KV-event batches applied.", a->kv_batches);
    counter(p, "kvworker_adapter_kv_stored_blocks_total", "Blocks the engine announced stored.",
            a->kv_stored_blocks);
    counter(p, "kvworker_adapter_kv_removed_blocks_total", "Blocks the engine announced removed.",
            a->kv_removed_blocks);
    counter(p, "kvworker_adapter_kv_cleared_total", "AllBlocksCleared events from the engine.",
            a->kv_cleared);
    counter(p, "kvworker_adapter_kv_resets_total",
            "Cache states lost (a gap not filled, an engine restart): cleared in the routers.",
            a->kv_resets);
    counter(p, "kvworker_adapter_kv_other_rank_batches_total",
            "KV-event batches of another data-parallel rank than --engine-dp-rank, skipped.",
            a->kv_other_rank);
    counter(p, "kvworker_adapter_kv_gaps_total", "Sequence gaps in the engine's KV events.",
            a->kv_gaps);
    counter(p, "kvworker_adapter_kv_gaps_filled_total", "Gaps filled from the replay socket.",
            a->kv_gaps_filled);
    counter(p, "kvworker_adapter_kv_bad_total", "KV-event messages that did not decode.",
            a->kv_bad);
    gauge(p, "kvworker_adapter_kv_gap_fill_seconds",
          "The last gap filled: from seeing it to delivering past it (0: none yet).",
          (double)a->kv_gap_fill_ns / 1e9);
    kvr_prom_family(p, "kvworker_adapter_kv_skipped_blocks_total", KVR_PROM_COUNTER,
                    "Blocks skipped: of a LoRA adapter, on another medium than the GPU, at another "
                    "block size, with extra_keys (or chained after a block with them), of a KV "
                    "cache group not followed (a hybrid model's other than full attention), "
                    "stored with a cache_salt (SGLang).");
    struct kvr_prom_label l[] = {{"why", "lora"},       {"why", "medium"}, {"why", "block_size"},
                                 {"why", "extra_keys"}, {"why", "group"},  {"why", "salt"}};
    uint64_t v[] = {a->kv_skipped_lora,  a->kv_skipped_medium, a->kv_bad_block_size,
                    a->kv_skipped_extra, a->kv_skipped_group,  a->kv_skipped_salt};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        kvr_prom_u64(p, &l[i], 1, v[i]);
    counter(p, "kvworker_adapter_chunks_without_token_ids_total",
            "Engine chunks that came without token ids (text only).", a->chunks_without_ids);
    kvr_prom_family(p, "kvworker_adapter_client_cpu_seconds_total", KVR_PROM_COUNTER,
                    "CPU time of the adapter's HTTP client thread.");
    kvr_prom_f64(p, NULL, 0, (double)a->client_cpu_ns / 1e9);
}

static void engine(struct kvr_prom *p, const struct figures *f)
{
    const struct kvr_engine_stats *e = &f->e;
    gauge(p, "kvworker_engine_running_requests", "Requests the engine admitted.", e->running);
    gauge(p, "kvworker_engine_waiting_requests", "Requests queued in the engine.", e->waiting);
    gauge(p, "kvworker_engine_active_blocks", "KV blocks referenced by running requests.",
          e->active_blocks);
    gauge(p, "kvworker_engine_cached_blocks", "Unreferenced KV blocks still holding a prefix.",
          e->cached_blocks);
    gauge(p, "kvworker_engine_capacity_blocks", "The KV pool, blocks.", f->capacity);
    gauge(p, "kvworker_engine_kv_usage_ratio", "Active blocks over the pool, 0 to 1.", e->kv_usage);
    counter(p, "kvworker_engine_preemptions_total", "Requests preempted (recomputed later).",
            e->preemptions);
    counter(p, "kvworker_engine_evictions_total", "Cached blocks evicted.", e->evictions);
    counter(p, "kvworker_engine_steps_total", "Engine steps run.", e->steps);
}

kvr_status kvr_wk_metrics(struct kvr_worker *w, struct kvr_prom *p)
{
    struct figures f;
    if (!lock_soon(w))
        return KVR_ERR_TIMEOUT; /* the worker is stuck: 503, and /readyz says so */
    f.requests = w->generate.requests;
    for (int c = 0; c < KVR_REPLY_CODES; c++)
        f.by_code[c] = w->generate.by_code[c];
    f.latency = w->generate.latency;
    f.c = w->c;
    f.held = w->nreqs;
    f.sim = w->eng != NULL;
    if (f.sim)
        kvr_engine_stats(w->eng, &f.e);
    else
        kvr__wk_adapter_stats(w, &f.a);
    f.capacity = w->capacity;
    f.outbox_dropped = w->out.dropped;
    f.publish_failed = atomic_load_explicit(&w->sink.failed, memory_order_relaxed);
    pthread_mutex_unlock(&w->mu);
    endpoint(p, &f);
    counters(p, &f);
    if (f.sim)
        engine(p, &f);
    else
        adapter(p, &f);
    return kvr_prom_end(p);
}

bool kvr_wk_ready(struct kvr_worker *w, char *why, size_t len)
{
    uint64_t turn = atomic_load_explicit(&w->engine_ns, memory_order_relaxed), now = kvr_now_ns();
    if (!turn) {
        snprintf(why, len, "starting: the engine thread has not run yet");
        return false;
    }
    if (now > turn && now - turn > KVR_WK_ENGINE_STALL_NS) {
        snprintf(why, len, "the engine thread has not run for %" PRIu64 " ms",
                 (uint64_t)((now - turn) / KVR_NS_PER_MS));
        return false;
    }
    if (!lock_soon(w)) {
        snprintf(why, len, "the worker's lock is held over %llu ms",
                 (unsigned long long)(KVR_WK_LOCK_WAIT_NS / KVR_NS_PER_MS));
        return false;
    }
    const char *no = w->clashed         ? "yielded: another process serves its worker id"
                     : w->engine_why[0] ? w->engine_why
                     : !w->serving ? "not serving yet (asking whether its id is free, subscribing)"
                     : w->draining ? "draining: finishing the requests it holds"
                                   : NULL;
    if (no)
        snprintf(why, len, "%s", no);
    pthread_mutex_unlock(&w->mu);
    return !no;
}
