/*
 * kvr_fleet implementation.
 */
#include "fleet.h"

#include <stdbool.h>
#include <string.h>

#include "client.h"
#include "codec.h"
#include "grow.h"

void kvr_fleet_init(struct kvr_fleet *f)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
}

void kvr_fleet_free(struct kvr_fleet *f)
{
    free(f->ids);
    f->ids = NULL;
    f->n = f->cap = 0;
    pthread_mutex_destroy(&f->mu);
}

/* Under mu: add worker w, if new and not draining. */
static void add_worker(struct kvr_fleet *f, const struct kvr_worker_info *w)
{
    for (uint32_t i = 0; i < f->n; i++)
        if (f->ids[i] == w->id)
            return;
    if (w->draining)
        return;
    if (f->n == UINT32_MAX || !KVR_GROW(f->ids, f->cap, f->n + 1, 16)) {
        f->dropped++;
        return;
    }
    f->ids[f->n++] = w->id;
    f->block_size = w->block_size;
    f->capacity = w->capacity_blocks;
}

static void on_heartbeat(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc;
    (void)sub;
    struct kvr_fleet *f = ctx;
    struct kvr_wire_heartbeat h;
    if (kvr_wire_decode_heartbeat(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), &h) ==
        KVR_OK) {
        pthread_mutex_lock(&f->mu);
        add_worker(f, &h.info);
        pthread_mutex_unlock(&f->mu);
        kvr_wire_heartbeat_free(&h);
    }
    natsMsg_Destroy(msg);
}

uint32_t kvr_fleet_discover(struct kvr_fleet *f, natsConnection *nc, const char *prefix,
                            const char *ns, uint64_t wait_ns)
{
    char subj[256];
    natsSubscription *hb = NULL;
    if (!kvr_subject(subj, sizeof subj, prefix, ns, "ev.*.hb") ||
        natsConnection_Subscribe(&hb, nc, subj, on_heartbeat, f) != NATS_OK)
        return 0;
    kvr_sleep_ns(wait_ns);
    kvr_client_unsubscribe(hb);
    pthread_mutex_lock(&f->mu);
    uint32_t n = f->n;
    if (f->dropped)
        kvr_log(KVR_LOG_WARN, "fleet_dropped", "workers=%llu (out of memory)",
                (unsigned long long)f->dropped);
    pthread_mutex_unlock(&f->mu);
    return n;
}
