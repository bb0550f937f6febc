/*
 * The simulated worker's NATS link.
 */
#define _DEFAULT_SOURCE
#include "link.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "util.h"

static void on_generate(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    struct kvr_wk_link *l = ctx;
    kvr_worker_on_generate(l->w, natsMsg_GetReply(msg), natsMsg_GetData(msg),
                           (size_t)natsMsg_GetDataLength(msg));
    natsMsg_Destroy(msg);
}

static void on_srv(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    struct kvr_wk_link *l = ctx;
    const char *reply = natsMsg_GetReply(msg);
    pthread_mutex_lock(&l->w->mu);
    char *text = kvr_service_answer(&l->svc, natsMsg_GetSubject(msg), NULL);
    pthread_mutex_unlock(&l->w->mu);
    if (text && reply && *reply)
        natsConnection_PublishString(nc, reply, text);
    free(text);
    natsMsg_Destroy(msg);
}

static void *engine_thread(void *arg)
{
    struct kvr_wk_link *l = arg;
    kvr_worker_run_engine(l->w);
    nats_ReleaseThreadMemory();
    return NULL;
}

static bool connected(const struct kvr_wk_link *l)
{
    return natsConnection_Status(l->nc_out) == NATS_CONN_STATUS_CONNECTED &&
           natsConnection_Status(l->nc_in) == NATS_CONN_STATUS_CONNECTED;
}

static void *heartbeat_thread(void *arg)
{
    struct kvr_wk_link *l = arg;
    uint64_t period = l->w->cfg->heartbeat_ns;
    while (!kvr_worker_stopping(l->w)) {
        /* one buffered while disconnected would arrive late and list stale requests: skip it */
        if (connected(l))
            kvr_worker_heartbeat(l->w);
        for (uint64_t slept = 0; slept < period && !kvr_worker_stopping(l->w);
             slept += 10 * KVR_NS_PER_MS)
            kvr_sleep_ns(10 * KVR_NS_PER_MS);
    }
    nats_ReleaseThreadMemory();
    return NULL;
}

static kvr_status subscribe(struct kvr_wk_link *l)
{
    natsStatus s = natsConnection_Subscribe(&l->sub, l->nc_in, l->w->subj_gen, on_generate, l);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(l->sub, -1, -1);
    char srv[3][256];
    kvr_service_subjects(&l->svc, srv);
    for (int i = 0; i < 3 && s == NATS_OK; i++)
        s = natsConnection_Subscribe(&l->sub_srv[i], l->nc_in, srv[i], on_srv, l);
    if (s == NATS_OK)
        s = natsConnection_Flush(l->nc_in);
    if (s != NATS_OK)
        kvr_log(KVR_LOG_ERROR, "subscribe_failed", "subject=%s error=\"%s\"", l->w->subj_gen,
                natsStatus_GetText(s));
    return kvr_nats_status(s);
}

kvr_status kvr_wk_link_start(struct kvr_wk_link *l, struct kvr_worker *w)
{
    memset(l, 0, sizeof *l);
    l->w = w;
    char id[32];
    snprintf(id, sizeof id, "%" PRIu64, w->cfg->id);
    kvr_service_init(&l->svc, "kvworker", "0.2.0", "simulated LLM inference worker", "worker_id",
                     id);
    kvr_service_add(&l->svc, "generate", w->subj_gen, NULL, &w->generate);
    snprintf(l->name_in, sizeof l->name_in, "kvworker-%" PRIu64 "-in", w->cfg->id);
    snprintf(l->name_out, sizeof l->name_out, "kvworker-%" PRIu64, w->cfg->id);
    kvr_status st = kvr_connect(w->cfg->net.urls, l->name_in, &l->nc_in);
    if (st == KVR_OK)
        st = kvr_connect(w->cfg->net.urls, l->name_out, &l->nc_out);
    if (st != KVR_OK)
        return st;
    w->sink = kvr_nats_sink(l->nc_out);
    if ((st = subscribe(l)) != KVR_OK)
        return st;
    if (pthread_create(&l->engine, NULL, engine_thread, l))
        return KVR_ERR_NOMEM;
    if (pthread_create(&l->heartbeat, NULL, heartbeat_thread, l)) {
        kvr_worker_stop(w);
        pthread_join(l->engine, NULL);
        return KVR_ERR_NOMEM;
    }
    l->threads = true;
    return KVR_OK;
}

void kvr_wk_link_drain(struct kvr_wk_link *l)
{
    kvr_worker_set_draining(l->w);
    natsSubscription_Drain(l->sub);
    natsSubscription_WaitForDrainCompletion(l->sub, 5000);
    if (connected(l))
        kvr_worker_heartbeat(l->w); /* routers stop sending here */
    uint64_t deadline = kvr_now_ns() + l->w->cfg->drain_timeout_ns;
    uint32_t left;
    while ((left = kvr_worker_held(l->w)) && kvr_now_ns() <= deadline)
        kvr_sleep_ns(20 * KVR_NS_PER_MS);
    if (left)
        kvr_log(KVR_LOG_WARN, "drain_timeout", "requests_left=%u", left);
    kvr_worker_flush(l->w);
}

void kvr_wk_link_close(struct kvr_wk_link *l)
{
    if (l->threads) {
        kvr_worker_stop(l->w);
        pthread_join(l->engine, NULL);
        pthread_join(l->heartbeat, NULL);
    }
    kvr_worker_flush(l->w);
    if (l->nc_out)
        natsConnection_FlushTimeout(l->nc_out, 2000);
    natsSubscription *subs[] = {l->sub, l->sub_srv[0], l->sub_srv[1], l->sub_srv[2]};
    for (int i = 0; i < 4; i++) {
        if (subs[i]) {
            natsSubscription_Unsubscribe(subs[i]);
            natsSubscription_Destroy(subs[i]);
        }
    }
    natsConnection_Destroy(l->nc_in);
    natsConnection_Destroy(l->nc_out);
    memset(l, 0, sizeof *l);
}
