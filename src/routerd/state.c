/*
 * The router daemon's shared state.
 */
#define _DEFAULT_SOURCE
#include "state.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "clock.h"
#include "grow.h"
#include "log.h"

static bool rd_salted; /* the core's hash salt is set (first kvr_rd_init of the process) */

/* The core's callback: record, never act (the core must not be re-entered from here). */
static void on_core_event(void *ctx, const struct kvr_event *ev)
{
    struct kvr_rd *rd = ctx;
    if (!KVR_GROW(rd->deferred, rd->capdeferred, rd->ndeferred + 1, 64)) {
        rd->deferred_lost++;
        kvr_log(KVR_LOG_ERROR, "core_event_lost",
                "kind=%d request=%016llx reason=\"out of memory\"", (int)ev->kind,
                (unsigned long long)ev->request_id);
        return;
    }
    rd->deferred[rd->ndeferred++] =
        (struct kvr_rd_deferred){ev->kind, ev->request_id, ev->worker_id, ev->status,
                                 ev->decision ? ev->decision->overlap_blocks : 0};
}

kvr_status kvr_rd_init(struct kvr_rd *rd, const struct kvr_rd_config *cfg, struct kvr_sink sink)
{
    memset(rd, 0, sizeof *rd);
    rd->cfg = cfg;
    rd->sink = sink;
    pthread_mutex_init(&rd->mu, NULL);
    pthread_mutex_init(&rd->snap_mu, NULL);
    kvr_turns_init(&rd->turns);
    struct kvr_router_config c = cfg->core;
    c.seed = c.seed ? c.seed : kvr_realtime_ns();
    uint64_t salt = 0;
    if (getrandom(&salt, sizeof salt, 0) != (ssize_t)sizeof salt)
        salt = kvr_realtime_ns() * 0x9e3779b97f4a7c15ull; /* no entropy: at least not fixed */
    if (!rd_salted) { /* once per process: maps made earlier keep working */
        kvr_router_set_salt(salt);
        rd_salted = true;
    }
    c.max_output_tokens = cfg->max_output_tokens;
    c.on_event = on_core_event;
    c.event_ctx = rd;
    kvr_status st;
    rd->core = kvr_router_create(&c, &st);
    if (!rd->core)
        return st;
    /* every request the core holds, in flight or queued, plus orphans within their grace */
    kvr_pending_init(&rd->pend, c.max_inflight + c.queue_max + (1u << 16));
    kvr_recent_init(&rd->recent, KVR_RECENT_MAX, KVR_RECENT_TTL_NS);
    kvr_recent_init(&rd->early_cancels, KVR_RD_EARLY_CANCELS, KVR_RECENT_TTL_NS);
    kvr_recent_init(&rd->early_dones, KVR_RD_EARLY_DONES, KVR_RECENT_TTL_NS);
    kvr_kvlog_init(&rd->kvlog, cfg->kv_replay_ns, 0, 0);
    kvr_reply_init(&rd->generate, "generate", 0);
    kvr_reply_init(&rd->select, "select", 0);
    rd->select.router_id = cfg->id;
    rd->lim = (struct kvr_wire_limits){c.max_prompt_tokens, cfg->max_output_tokens};
    snprintf(rd->subj_worker, sizeof rd->subj_worker, "%s.%s.worker.", cfg->net.prefix,
             cfg->net.ns);
    snprintf(rd->subj_ev, sizeof rd->subj_ev, "%s.%s.ev.", cfg->net.prefix, cfg->net.ns);
    return kvr_kept_init(&rd->kept);
}

void kvr_rd_free(struct kvr_rd *rd)
{
    kvr_router_destroy(rd->core);
    kvr_pending_clear(&rd->pend);
    kvr_kept_free(&rd->kept);
    kvr_rd_procs_free(rd);
    kvr_recent_free(&rd->recent);
    kvr_recent_free(&rd->early_cancels);
    kvr_recent_free(&rd->early_dones);
    kvr_kvseq_free(&rd->kvseq);
    kvr_kvlog_free(&rd->kvlog);
    kvr_outbox_free(&rd->out);
    kvr_buf_free(&rd->buf);
    kvr_reply_free(&rd->generate);
    kvr_reply_free(&rd->select);
    for (uint32_t i = 0; i < rd->nheld; i++)
        free(rd->held[i].data);
    free(rd->held);
    free(rd->deferred);
    kvr_turns_destroy(&rd->turns);
    pthread_mutex_destroy(&rd->mu);
    pthread_mutex_destroy(&rd->snap_mu);
    memset(rd, 0, sizeof *rd);
}

/* Under mu, which it releases: the outbox's messages taken (its counters stay), published after
 * the lock in their turn (the loop, the timer and the delivery threads publish in the order
 * they left mu: a forward before its cancel, gossip decisions in sequence); the tagged ones that
 * failed appended to failed (every failure is counted in the sink's). */
static void take_and_send(struct kvr_rd *rd, struct kvr_outbox_failures *failed)
{
    struct kvr_outbox local = {rd->out.v, rd->out.n, rd->out.cap, 0};
    if (!local.n) {
        pthread_mutex_unlock(&rd->mu); /* nothing to send: the array is kept for the next */
        return;
    }
    rd->out.v = NULL;
    rd->out.n = rd->out.cap = 0;
    uint64_t turn = kvr_turns_take(&rd->turns);
    pthread_mutex_unlock(&rd->mu);
    kvr_turns_flush(&rd->turns, turn, &local, &rd->sink, failed);
    kvr_outbox_free(&local);
}

/* Under mu, which it releases: publish what the outbox holds; every failed forward is placed
 * again (at the next tick) or answered, and a few rounds send the answers. What the last round's
 * failures add (answers, or forwards other threads queued meanwhile) stays in the outbox for the
 * next flush (a tick at most): every failure is handled, and the rounds stay bounded while
 * other threads keep adding. */
static void send_rounds(struct kvr_rd *rd)
{
    struct kvr_outbox_failures failed = {0};
    for (int round = 0; round < 4; round++) {
        failed.n = 0;
        take_and_send(rd, &failed);
        if (!failed.n || !rd->forward_failed)
            break;
        pthread_mutex_lock(&rd->mu);
        for (uint32_t i = 0; i < failed.n; i++)
            rd->forward_failed(rd, failed.v[i].tag, failed.v[i].st);
        if (round == 3)
            pthread_mutex_unlock(&rd->mu);
    }
    kvr_outbox_failures_free(&failed);
}

void kvr_rd_flush(struct kvr_rd *rd)
{
    pthread_mutex_lock(&rd->mu);
    send_rounds(rd);
}

void kvr_rd_unlock_flush(struct kvr_rd *rd)
{
    send_rounds(rd);
}

const struct kvr_recent_item *kvr_rd_ended(struct kvr_rd *rd, uint64_t key, uint64_t now,
                                           struct kvr_recent **in)
{
    struct kvr_recent *t = &rd->recent;
    const struct kvr_recent_item *r = kvr_recent_find(t, key, now);
    if (!r)
        r = kvr_recent_find(t = &rd->early_dones, key, now);
    if (in)
        *in = t;
    return r;
}

bool kvr_rd_hold(struct kvr_rd *rd, uint64_t worker_id, const void *data, size_t len)
{
    /* one over the wire's bound is refused when applied, so is not copied (nor one past the
     * hold's bounds: anyone may publish on a worker's subject while a snapshot is applied) */
    if (!rd->holding || len > KVR_WIRE_KV_MAX)
        return false;
    uint8_t *copy = rd->nheld < KVR_RD_HELD_MAX && len <= KVR_RD_HELD_BYTES_MAX - rd->held_bytes
                        ? malloc(len ? len : 1)
                        : NULL;
    if (!copy || !KVR_GROW(rd->held, rd->capheld, rd->nheld + 1, 1024)) {
        free(copy);
        rd->held_dropped++; /* applied now instead: at worst a stale entry until evicted */
        return false;
    }
    if (len)
        memcpy(copy, data, len);
    rd->held[rd->nheld++] = (struct kvr_rd_held){worker_id, copy, len};
    rd->held_bytes += len;
    return true;
}
