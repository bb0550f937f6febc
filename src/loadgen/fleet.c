/*
 * kvr_fleet, kvr_watch and the queue poll. The routers' $SRV.STATS answers are parsed with
 * jansson.
 */
#include "fleet.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
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

/* The "queue_len" of a router's $SRV.STATS answer data[0..len) (its generate endpoint's data). */
static uint64_t queue_len_of(const char *data, size_t len)
{
    json_t *root = json_loadb(data, len, 0, NULL);
    json_t *eps = json_object_get(root, "endpoints");
    uint64_t q = 0;
    for (size_t i = 0; i < json_array_size(eps); i++) {
        json_t *v = json_object_get(json_object_get(json_array_get(eps, i), "data"), "queue_len");
        q += json_is_integer(v) ? (uint64_t)json_integer_value(v) : 0;
    }
    json_decref(root);
    return q;
}

uint32_t kvr_fleet_srv_stats(natsConnection *pub, natsConnection *sub, const char *inbox,
                             uint64_t wait_ns, kvr_fleet_answer_fn fn, void *ctx)
{
    natsSubscription *s = NULL;
    uint32_t n = 0;
    if (natsConnection_SubscribeSync(&s, sub, inbox) != NATS_OK ||
        natsConnection_Flush(sub) != NATS_OK ||
        natsConnection_PublishRequest(pub, "$SRV.STATS.kvrouter", inbox, "", 0) != NATS_OK) {
        natsSubscription_Destroy(s);
        return 0;
    }
    uint64_t end = kvr_now_ns() + wait_ns;
    for (uint64_t now = kvr_now_ns(); now < end; now = kvr_now_ns()) {
        natsMsg *m = NULL;
        if (natsSubscription_NextMsg(&m, s, (int64_t)((end - now) / KVR_NS_PER_MS + 1)) != NATS_OK)
            break;
        fn(ctx, natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m));
        n++;
        natsMsg_Destroy(m);
    }
    natsSubscription_Destroy(s);
    return n;
}

static void add_queue_len(void *ctx, const char *data, size_t len)
{
    *(uint64_t *)ctx += queue_len_of(data, len);
}

uint64_t kvr_fleet_queue_len(natsConnection *pub, natsConnection *sub, const char *inbox,
                             uint64_t wait_ns, uint32_t *routers)
{
    uint64_t q = 0;
    *routers = kvr_fleet_srv_stats(pub, sub, inbox, wait_ns, add_queue_len, &q);
    return q;
}

/* Under mu: the slot watching key, or NULL. */
static struct kvr_watch_item *find(struct kvr_watch *w, uint64_t key)
{
    for (uint32_t h = (uint32_t)(key ^ key >> 32) & w->mask;; h = (h + 1) & w->mask) {
        uint32_t s = w->map[h];
        if (!s)
            return NULL;
        if (w->items[s - 1].key == key)
            return &w->items[s - 1];
    }
}

static void on_gossip(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc;
    (void)sub;
    struct kvr_watch *w = ctx;
    uint64_t now = kvr_now_ns();
    struct kvr_wire_gossip g;
    if (kvr_wire_decode_gossip(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), &g) ==
        KVR_OK) {
        if (g.kind == KVR_WIRE_GOSSIP_DECISION) {
            pthread_mutex_lock(&w->mu);
            w->decisions++;
            struct kvr_watch_item *it = find(w, g.d.rec.request_id);
            if (it && it->decisions < 2) {
                snprintf(it->origin[it->decisions], sizeof it->origin[0], "%s", g.d.origin);
                it->at[it->decisions] = g.d.decided_ns;
            }
            if (it && !it->decisions++) {
                it->t_decided = now;
                it->worker = g.d.rec.worker_id;
            } else if (it && g.d.rec.worker_id != it->worker) {
                it->worker2 = g.d.rec.worker_id;
            }
            pthread_mutex_unlock(&w->mu);
        }
        kvr_wire_gossip_free(&g);
    }
    natsMsg_Destroy(msg);
}

static void on_done(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc;
    (void)sub;
    struct kvr_watch *w = ctx;
    uint64_t now = kvr_now_ns();
    struct kvr_wire_done d;
    if (kvr_wire_decode_done(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), &d) ==
        KVR_OK) {
        pthread_mutex_lock(&w->mu);
        w->doneev++;
        struct kvr_watch_item *it = find(w, d.key);
        if (it && !it->dones++) {
            it->t_done = now;
            it->status = d.status;
        }
        pthread_mutex_unlock(&w->mu);
    }
    natsMsg_Destroy(msg);
}

kvr_status kvr_watch_start(struct kvr_watch *w, natsConnection *nc, const char *prefix,
                           const char *ns, uint32_t n)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    uint32_t size = 16;
    while (size < 2 * (uint64_t)n && size < (1u << 31))
        size *= 2;
    w->n = n;
    w->mask = size - 1;
    w->items = calloc(n ? n : 1, sizeof *w->items);
    w->map = calloc(size, sizeof *w->map);
    char gossip[256], done[256];
    kvr_status st = w->items && w->map ? KVR_OK : KVR_ERR_NOMEM;
    if (st == KVR_OK && (!kvr_subject(gossip, sizeof gossip, prefix, ns, "router.gossip.*") ||
                         !kvr_subject(done, sizeof done, prefix, ns, "ev.*.done")))
        st = KVR_ERR_INVALID;
    if (st == KVR_OK)
        st = kvr_nats_status(natsConnection_Subscribe(&w->gossip, nc, gossip, on_gossip, w));
    if (st == KVR_OK)
        st = kvr_nats_status(natsConnection_Subscribe(&w->done, nc, done, on_done, w));
    if (st == KVR_OK)
        st = kvr_nats_status(natsSubscription_SetPendingLimits(w->gossip, -1, -1));
    if (st == KVR_OK)
        st = kvr_nats_status(natsConnection_Flush(nc));
    if (st != KVR_OK)
        kvr_watch_stop(w);
    return st;
}

void kvr_watch_stop(struct kvr_watch *w)
{
    kvr_client_unsubscribe(w->gossip);
    kvr_client_unsubscribe(w->done);
    free(w->items);
    free(w->map);
    pthread_mutex_destroy(&w->mu);
    memset(w, 0, sizeof *w);
}

void kvr_watch_set(struct kvr_watch *w, uint32_t i, uint64_t key)
{
    pthread_mutex_lock(&w->mu);
    if (i < w->n && !w->items[i].key && key && !find(w, key)) {
        uint32_t h = (uint32_t)(key ^ key >> 32) & w->mask;
        while (w->map[h])
            h = (h + 1) & w->mask;
        w->map[h] = i + 1;
        w->items[i] = (struct kvr_watch_item){.key = key};
    }
    pthread_mutex_unlock(&w->mu);
}

struct kvr_watch_item kvr_watch_get(struct kvr_watch *w, uint32_t i)
{
    struct kvr_watch_item it = {0};
    pthread_mutex_lock(&w->mu);
    if (i < w->n)
        it = w->items[i];
    pthread_mutex_unlock(&w->mu);
    return it;
}
