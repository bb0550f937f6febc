/*
 * Rebinds after a worker's cut.
 */
#define _DEFAULT_SOURCE
#include "rebind.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>

#include "codec.h"

/* A worker's process as this router knows it: since when (monotonic ns) it is the one heard. */
struct kvr_rd_incarnation {
    uint64_t wid, instance, since;
    UT_hash_handle hh;
};

static void forget(struct kvr_rd *rd, struct kvr_rd_incarnation *it)
{
    HASH_DEL(rd->procs, it);
    free(it);
    rd->nprocs--;
}

void kvr_rebind_worker_seen(struct kvr_rd *rd, uint64_t wid, uint64_t instance, uint64_t now)
{
    struct kvr_rd_incarnation *it, *tmp;
    HASH_FIND(hh, rd->procs, &wid, sizeof wid, it);
    if (it) {
        if (it->instance != instance) {
            it->instance = instance;
            it->since = now;
        }
        return;
    }
    if (rd->nprocs >= rd->cfg->core.max_workers) /* a worker's leave lost: the gone go */
        HASH_ITER(hh, rd->procs, it, tmp)
        {
            if (kvr_router_worker_load(rd->core, it->wid, NULL, NULL, NULL) != KVR_OK)
                forget(rd, it);
        }
    if (rd->nprocs >= rd->cfg->core.max_workers || !(it = malloc(sizeof *it)))
        return; /* (its resends then judged by the registry alone) */
    *it = (struct kvr_rd_incarnation){.wid = wid, .instance = instance, .since = now};
    HASH_ADD(hh, rd->procs, wid, sizeof it->wid, it);
    rd->nprocs++;
}

void kvr_rebind_worker_left(struct kvr_rd *rd, uint64_t wid)
{
    struct kvr_rd_incarnation *it;
    HASH_FIND(hh, rd->procs, &wid, sizeof wid, it);
    if (it)
        forget(rd, it);
}

void kvr_rd_procs_free(struct kvr_rd *rd)
{
    struct kvr_rd_incarnation *it, *tmp;
    HASH_ITER(hh, rd->procs, it, tmp)
    {
        forget(rd, it);
    }
}

/* Whether worker wid is still the process that ended a request at `at`: in the fleet, and heard
 * from the same process since (none recorded: the registry alone says). */
static bool still_there(struct kvr_rd *rd, uint64_t wid, uint64_t at)
{
    if (kvr_router_worker_load(rd->core, wid, NULL, NULL, NULL) == KVR_ERR_UNKNOWN_WORKER)
        return false; /* (a pending request's worker is known: it leaves with the requests on it
                         failed) */
    struct kvr_rd_incarnation *it;
    HASH_FIND(hh, rd->procs, &wid, sizeof wid, it);
    return !it || it->since <= at;
}

void kvr_rebind_keep(struct kvr_rd *rd, struct kvr_pending *p, uint64_t now)
{
    if (!p->reply || !p->worker_id)
        return; /* a booked select's client forwards it, and resends renew the right */
    kvr_kept_put(&rd->kept, p->key, p->worker_id, p->reply, now);
    p->reply = NULL;
}

/* The reply subject of key if it is (or just was) booked on wid here, else NULL. */
static const char *reply_of(struct kvr_rd *rd, uint64_t wid, uint64_t key, uint64_t now)
{
    const struct kvr_pending *p = kvr_pending_find(&rd->pend, key);
    if (p)
        return p->worker_id == wid ? p->reply : NULL;
    const struct kvr_kept_item *it = kvr_kept_find(&rd->kept, key);
    return it && it->worker_id == wid && now - it->at <= KVR_REBIND_KEPT_NS ? it->reply : NULL;
}

/* The subject of worker wid's rebinds into subject[len]. */
static void rebind_subject(const struct kvr_rd *rd, uint64_t wid, char *subject, size_t len)
{
    snprintf(subject, len, "%s%" PRIu64 ".rebind", rd->subj_worker, wid);
}

enum kvr_repeat kvr_rebind_repeat(struct kvr_rd *rd, const struct kvr_pending *p, uint64_t key,
                                  const char *reply, uint64_t now, uint64_t *gone)
{
    uint64_t wid = 0;
    const struct kvr_kept_item *it = p ? NULL : kvr_kept_find(&rd->kept, key);
    if (p && p->reply && !strcmp(p->reply, reply)) {
        wid = p->worker_id; /* 0 while queued: nothing streamed yet */
    } else if (it && now - it->at <= KVR_REPEAT_KEPT_NS && !strcmp(it->reply, reply)) {
        wid = it->worker_id;
        if (!still_there(rd, wid, it->at)) {
            *gone = wid;
            return KVR_REPEAT_GONE;
        }
    }
    if (!wid)
        return KVR_REPEAT_NONE;
    char subject[600];
    rebind_subject(rd, wid, subject, sizeof subject);
    if (kvr_wire_encode_worker_rebind(&rd->buf, key, rd->cfg->id, true) != KVR_OK) {
        rd->out.dropped++;
        return KVR_REPEAT_NONE;
    }
    kvr_outbox_add_request(&rd->out, subject, reply, rd->buf.data, rd->buf.len);
    rd->n.repeats_asked++;
    return KVR_REPEAT_ASKED;
}

kvr_status kvr_rebind_on_ask(struct kvr_rd *rd, uint64_t wid, const void *data, size_t len,
                             uint64_t now)
{
    struct kvr_wire_rebind_ask a;
    kvr_status st = kvr_wire_decode_rebind_ask(data, len, &a);
    if (st != KVR_OK)
        return st;
    if (a.worker_id != wid) {
        kvr_wire_rebind_ask_free(&a);
        return KVR_ERR_INVALID; /* a worker speaks for itself only */
    }
    char subject[600];
    rebind_subject(rd, wid, subject, sizeof subject);
    for (uint32_t i = 0; i < a.nkeys; i++) {
        const char *reply = reply_of(rd, wid, a.keys[i], now);
        if (!reply) {
            rd->n.rebinds_unknown++;
            continue;
        }
        if (kvr_wire_encode_worker_rebind(&rd->buf, a.keys[i], rd->cfg->id, false) == KVR_OK) {
            kvr_outbox_add_request(&rd->out, subject, reply, rd->buf.data, rd->buf.len);
            rd->n.rebinds_sent++;
        } else {
            rd->out.dropped++;
        }
    }
    kvr_wire_rebind_ask_free(&a);
    return KVR_OK;
}
