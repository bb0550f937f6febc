/*
 * Issue 10's attacks on a live fleet (a real nats-server on 127.0.0.1, the real kvrouter and
 * kvworker), where the live fleet matters: forged gossip that would inject a PUB or lock the
 * router up, event subjects that name no worker, a request no worker can ever finish, forged
 * bookings that fill a worker, names refused at start, and (still open, fenced only by subject
 * permissions) a snapshot asked by anyone. A spy connection subscribed to ">" sees every
 * message on the server: nothing goes to a subject the attacker chose.
 */
#define _GNU_SOURCE /* memmem */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codec.h"
#include "harness.h"
#include "kvr/hash.h"
#include "kvrouter.pb-c.h"

static struct nats_srv srv;
static natsConnection *nc;

static void setup(void)
{
    h_setup(&srv, 1, &nc);
}

static void teardown(void)
{
    h_teardown(&nc);
}

TestSuite(hostile, .init = setup, .fini = teardown, .timeout = 120);

/* A counter of the (one) router's $SRV.STATS: its generate endpoint's, at path. */
static uint64_t router_stat(const char *path)
{
    json_t *stats = h_stats(nc, 3000);
    uint64_t v = h_json_u64(h_endpoint(stats, "generate"), path);
    json_decref(stats);
    return v;
}

/* Read the spy's messages for ms; how many there were, and how many went to subject evil... */
static int spy_read(natsSubscription *spy, int ms, int *evil, int *gossip)
{
    int n = 0;
    natsMsg *m = NULL;
    uint64_t end = h_now_ms() + (uint64_t)ms;
    while (h_now_ms() < end && natsSubscription_NextMsg(&m, spy, 50) == NATS_OK) {
        const char *s = natsMsg_GetSubject(m);
        n++;
        *evil += !strncmp(s, "evil", 4);
        *gossip += !strncmp(s, "kv.default.router.gossip.r1", 27);
        natsMsg_Destroy(m);
    }
    return n;
}

/* Forged gossip on a live router: ids and replies that would inject a PUB, a decision that would
 * hold its lock for 40 s. Nothing reaches "evil", each is counted, the next request is served. */
static void forge_gossip(void)
{
    struct kvr_buf b = {0};
    cr_assert(eq(int,
                 kvr_wire_encode_gossip_hello(&b, "x 0\r\n\r\nPUB evil 5\r\nhello", 5, 9, true),
                 KVR_OK));
    h_publish(nc, "kv.default.router.gossip.x", &b); /* its id is not its subject's */
    uint64_t h[2] = {11, 12};
    struct kvr_request_record rec = {4242, 1, h, 2, 128, 0, false, 0, 0};
    cr_assert(eq(int,
                 kvr_wire_encode_gossip_decision(
                     &b, "peer", 5, 1, &rec, "_INBOX.x\r\nPUB evil 3\r\nabc", "c", "peer", 1, 0),
                 KVR_OK));
    h_publish(nc, "kv.default.router.gossip.peer", &b);
    rec.request_id = 4243;
    cr_assert(eq(int,
                 kvr_wire_encode_gossip_decision(&b, "peer", 5, 2, &rec, "_INBOX.y", "c",
                                                 "evil\r\nPUB evil 1\r\nx", 1, 0),
                 KVR_OK));
    h_publish(nc, "kv.default.router.gossip.peer", &b);
    rec = (struct kvr_request_record){4244, 1, h, 2, 128, 0, true, UINT32_MAX, 0};
    cr_assert(eq(
        int, kvr_wire_encode_gossip_decision(&b, "peer", 5, 3, &rec, "_INBOX.z", "c", "peer", 1, 0),
        KVR_OK));
    h_publish(nc, "kv.default.router.gossip.peer", &b);
    kvr_buf_free(&b);
}

/* Worker 7's heartbeat on subjects whose worker id is no canonical number. */
static void forge_event_subjects(void)
{
    struct kvr_wire_heartbeat hb = {.info = {.id = 7, .block_size = 64, .capacity_blocks = 64},
                                    .interval_ms = 500};
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &hb), KVR_OK));
    h_publish(nc, "kv.default.ev.+7.hb", &b);
    h_publish(nc, "kv.default.ev.007.hb", &b);
    h_publish(nc, "kv.default.ev.-1.hb", &b);
    kvr_buf_free(&b);
}

Test(hostile, forged_gossip_injects_nothing_and_holds_no_lock)
{
    natsConnection *spy_nc = h_connect(srv.url);
    natsSubscription *spy = NULL;
    cr_assert(eq(int, natsConnection_SubscribeSync(&spy, spy_nc, ">"), NATS_OK));
    natsSubscription_SetPendingLimits(spy, -1, -1);
    cr_assert(eq(int, natsConnection_Flush(spy_nc), NATS_OK));
    h_worker(srv.url, "1", 10, 200, NULL);
    h_router(srv.url, "r1", H_ARGS("--hello-ms", "200"));
    h_until_served(nc, H_GEN, 1, 20000);
    forge_gossip();
    forge_event_subjects();
    natsConnection_Flush(nc);
    uint64_t t0 = h_now_ms();
    struct h_result r = h_ask(nc, H_GEN, "after", 3, 0, 256, 4, 10000);
    cr_assert(r.final && r.error_code == 0, "served after the forgeries (error %u)", r.error_code);
    cr_log_info("the request after the forged gossip: first token %llu ms, done %llu ms",
                (unsigned long long)r.first_ms, (unsigned long long)(h_now_ms() - t0));
    int evil = 0, gossip = 0;
    int n = spy_read(spy, 700, &evil, &gossip);
    cr_assert(eq(int, evil, 0), "a message went to an attacker's subject");
    cr_assert(gt(int, gossip, 0), "the spy sees the router's own gossip (%d messages)", n);
    cr_assert(eq(u64, router_stat("data.replication.gossip_bad"), 4), "each forgery counted");
    cr_assert(eq(u64, router_stat("data.replication.imported"), 0));
    cr_assert(eq(u64, router_stat("data.bad_events"), 3), "the three subjects counted");
    cr_assert(eq(u64, router_stat("data.workers"), 1), "no worker 7");
    h_sub_close(spy_nc, spy);
    natsConnection_Destroy(spy_nc);
    h_end();
}

Test(hostile, a_request_no_worker_can_finish_is_refused_with_its_figures)
{
    h_worker(srv.url, "1", 10, 200, NULL); /* 16,384 blocks of 64 tokens */
    h_router(srv.url, "r1", NULL);
    h_until_served(nc, H_GEN, 1, 20000);
    /* 990,000 prompt tokens and 65,536 out: one NATS message, within the router's limits */
    struct h_result r = h_ask(nc, H_GEN, "unfinishable", 1, 0, 990000, 65536, 20000);
    cr_assert(r.final, "answered");
    cr_assert(eq(u32, r.error_code, KVR_ERR_FULL));
    cr_assert(r.error_header, "with the service error headers");
    cr_assert(eq(u64, r.worker_id, 1), "by the worker");
    r = h_ask(nc, H_GEN, "next", 2, 0, 256, 4, 10000);
    cr_assert(r.final && r.error_code == 0, "the worker serves on (error %u)", r.error_code);
    uint64_t inflight = 1; /* the done events follow the final chunks: a moment later */
    for (int i = 0; i < 100 && inflight; i++, h_sleep_ms(20))
        inflight = router_stat("data.inflight");
    cr_assert(eq(u64, inflight, 0), "both bookings freed by the worker's done events");
    h_end();
}

Test(hostile, forged_bookings_that_fill_a_worker_go_with_its_heartbeats)
{
    h_worker(srv.url, "1", 10, 200, H_ARGS("--num-blocks", "64")); /* capacity 64 blocks */
    h_router(srv.url, "r1", NULL);
    h_until_served(nc, H_GEN, 1, 20000);
    uint64_t h[1] = {11};
    struct kvr_request_record rec = {4242, 1, h, 1, 64, 0, true, 63, 0}; /* all 64 blocks */
    struct kvr_buf b = {0};
    cr_assert(eq(int,
                 kvr_wire_encode_gossip_decision(&b, "forger", 5, 1, &rec, "_INBOX.nobody", "c",
                                                 "forger", 1, 0),
                 KVR_OK));
    h_publish(nc, "kv.default.router.gossip.forger", &b);
    kvr_buf_free(&b);
    natsConnection_Flush(nc);
    h_sleep_ms(50);
    cr_assert(eq(u64, router_stat("data.replication.imported"), 1), "the forgery is taken");
    struct h_result r = h_ask(nc, H_GEN, "real", 1, 0, 128, 4, 10000);
    cr_assert(r.final && r.error_code == 0, "served (error %u)", r.error_code);
    cr_log_info("a request behind a forged booking of the whole worker: first token %llu ms",
                (unsigned long long)r.first_ms);
    cr_assert(eq(u64, router_stat("data.replication.reconciled"), 1),
              "dropped: the worker's heartbeats never listed it");
    h_end();
}

/* Once open: a subject with a token more than kv.<ns>.ev.<id>.<kind> was taken as the worker of
 * its next-to-last token, so a worker allowed to publish on kv.<ns>.ev.1.> spoke for worker 7 on
 * kv.<ns>.ev.1.7.hb. Now it is a bad event, dropped. */
Test(hostile, a_worker_cannot_speak_for_another_through_a_longer_subject)
{
    h_worker(srv.url, "1", 10, 200, NULL);
    h_router(srv.url, "r1", NULL);
    h_until_served(nc, H_GEN, 1, 20000);
    struct kvr_wire_heartbeat hb = {.info = {.id = 7, .block_size = 64, .capacity_blocks = 64},
                                    .interval_ms = 500};
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &hb), KVR_OK));
    h_publish(nc, "kv.default.ev.1.7.hb", &b); /* under worker 1's subjects */
    kvr_buf_free(&b);
    natsConnection_Flush(nc);
    uint64_t bad = 0;
    for (int i = 0; i < 100 && !bad; i++, h_sleep_ms(20))
        bad = router_stat("data.bad_events");
    cr_assert(eq(u64, bad, 1), "dropped, counted");
    cr_assert(eq(u64, router_stat("data.workers"), 1), "no worker 7");
    h_end();
}

/* A $SRV request whose reply is one of the fleet's own subjects is not answered there by a
 * worker (a client may publish $SRV requests): it answered on its own events subject, which every
 * router then decoded and counted as bad. */
Test(hostile, a_workers_srv_answer_never_goes_into_the_fleets_subjects)
{
    h_worker(srv.url, "1", 10, 200, NULL);
    natsSubscription *sub = NULL;
    cr_assert(eq(int, natsConnection_SubscribeSync(&sub, nc, "kv.default.ev.1.kv"), NATS_OK));
    natsMsg *m = NULL;
    /* an inbox is answered (so the worker serves $SRV by now) */
    natsStatus s = NATS_TIMEOUT;
    for (int i = 0; i < 100 && s != NATS_OK; i++) /* no responders, at once, until it starts */
        if ((s = natsConnection_RequestString(&m, nc, "$SRV.PING.kvworker", "", 200)) != NATS_OK)
            h_sleep_ms(100);
    cr_assert(eq(int, s, NATS_OK), "the worker answers $SRV.PING: %s", natsStatus_GetText(s));
    natsMsg_Destroy(m);
    cr_assert(
        eq(int,
           natsConnection_PublishRequestString(nc, "$SRV.PING.kvworker", "kv.default.ev.1.kv", ""),
           NATS_OK));
    natsConnection_Flush(nc);
    m = NULL;
    cr_assert(eq(int, natsSubscription_NextMsg(&m, sub, 500), NATS_TIMEOUT),
              "no answer on the worker's events subject");
    natsMsg_Destroy(m);
    h_sub_close(nc, sub);
    h_end();
}

/* The router's key of a client request: the hash of "<reply>\0<id>" (docs/protocol.md). */
static uint64_t key_of(const char *reply, const char *id)
{
    char buf[512];
    size_t a = strlen(reply), b = strlen(id);
    cr_assert(lt(sz, a + b + 1, sizeof buf));
    memcpy(buf, reply, a);
    buf[a] = 0;
    memcpy(buf + a + 1, id, b);
    uint64_t k = kvr_hash_bytes(buf, a + 1 + b);
    return k ? k : 1;
}

/* Forged EventBatches that would end a request booked on worker 2: worker 2's batch on worker
 * 1's subject, worker 1's batch carrying worker 2's done, and one over the event cap. Each is
 * dropped whole and counted, and the booking stands until the request really ends. */
Test(hostile, a_batch_cannot_end_another_workers_requests)
{
    h_worker(srv.url, "1", 1, 200, NULL); /* real time: a request stays in flight for seconds */
    h_worker(srv.url, "2", 1, 200, NULL);
    h_router(srv.url, "r1", NULL);
    h_until_served(nc, H_GEN, 1, 20000);
    h_sleep_ms(500);
    struct h_req q[4];
    char id[4][24];
    int on2 = -1, sent = 0;
    for (int i = 0; i < 4 && on2 < 0; i++, sent++) {
        snprintf(id[i], sizeof id[i], "long-%d", i);
        cr_assert(h_send(nc, H_GEN, &q[i], id[i], 1000 * (uint32_t)i, 0, 256, 300));
        if (h_first_worker(&q[i], 10000) == 2)
            on2 = i;
    }
    cr_assert(ge(int, on2, 0), "a request on worker 2");
    uint64_t key = key_of(q[on2].inbox, id[on2]);
    uint64_t inflight = router_stat("data.inflight");
    cr_assert(eq(u64, inflight, (uint64_t)sent), "each request booked");
    struct kvr_wire_event ev = {.kind = KVR_WIRE_EV_DONE};
    ev.u.done = (struct kvr_wire_done){2, key, 0, 0};
    struct kvr_buf b = {0};
    struct kvr_wire_event pair[2] = {ev, ev};
    cr_assert(eq(int, kvr_wire_encode_batch(&b, 2, pair, 2), KVR_OK));
    h_publish(nc, "kv.default.ev.1.batch", &b); /* worker 2's batch on worker 1's subject */
    Kvrouter__V1__DoneEvent d = KVROUTER__V1__DONE_EVENT__INIT;
    d.worker_id = 2;
    d.request_key = key;
    Kvrouter__V1__LifecycleEvent le = KVROUTER__V1__LIFECYCLE_EVENT__INIT, *lp[2] = {&le, &le};
    le.event_case = KVROUTER__V1__LIFECYCLE_EVENT__EVENT_DONE;
    le.done = &d;
    Kvrouter__V1__EventBatch m = KVROUTER__V1__EVENT_BATCH__INIT;
    m.worker_id = 1; /* the subject's worker, carrying another's event */
    m.n_events = 2;
    m.events = lp;
    cr_assert(eq(int, kvr_buf_reserve(&b, protobuf_c_message_get_packed_size(&m.base)), KVR_OK));
    b.len = protobuf_c_message_pack(&m.base, b.data);
    h_publish(nc, "kv.default.ev.1.batch", &b);
    /* over the cap: two full batches of worker 2 back to back merge into 512 events */
    static struct kvr_wire_event many[KVR_WIRE_BATCH_MAX];
    for (uint32_t i = 0; i < KVR_WIRE_BATCH_MAX; i++)
        many[i] = ev;
    cr_assert(eq(int, kvr_wire_encode_batch(&b, 2, many, KVR_WIRE_BATCH_MAX), KVR_OK));
    size_t one = b.len;
    cr_assert(eq(int, kvr_buf_reserve(&b, 2 * one), KVR_OK));
    memcpy(b.data + one, b.data, one);
    b.len = 2 * one;
    h_publish(nc, "kv.default.ev.2.batch", &b);
    kvr_buf_free(&b);
    natsConnection_Flush(nc);
    uint64_t bad = 0;
    for (int i = 0; i < 100 && bad < 3; i++, h_sleep_ms(20))
        bad = router_stat("data.bad_events");
    cr_assert(eq(u64, bad, 3), "each forgery dropped and counted");
    cr_assert(eq(u64, router_stat("data.event_batches"), 0), "none applied");
    cr_assert(eq(u64, router_stat("data.inflight"), inflight), "the booking stands");
    for (int i = 0; i < sent; i++) {
        cr_assert(h_collect(&q[i], 60000), "request %d finishes", i);
        cr_assert(eq(u32, q[i].res.tokens, 300));
    }
    h_end();
}

/* The program's log of our n-th process called name, into buf. */
static const char *log_of(const char *name, int n, char *buf, size_t len)
{
    char path[256];
    snprintf(path, sizeof path, "/tmp/kvr_it_%d_%s_%d.log", (int)getpid(), name, n);
    FILE *f = fopen(path, "r");
    size_t got = f ? fread(buf, 1, len - 1, f) : 0;
    if (f)
        fclose(f);
    buf[got] = 0;
    return buf;
}

Test(hostile, names_that_are_no_subject_token_are_refused_at_start)
{
    char buf[4096];
    pid_t p = h_router(srv.url, "r1", H_ARGS("--namespace", "*"));
    cr_assert(eq(int, h_wait(p, 5000), 2), "kvrouter --namespace '*' exits 2");
    cr_assert(not(eq(ptr, strstr(log_of("kvrouter", 1, buf, sizeof buf), "--namespace"), NULL)),
              "%s", buf);
    p = h_worker(srv.url, "1", 10, 200, H_ARGS("--namespace", "a.>"));
    cr_assert(eq(int, h_wait(p, 5000), 2), "kvworker --namespace 'a.>' exits 2");
    p = h_router(srv.url, "r 1", NULL);
    cr_assert(eq(int, h_wait(p, 5000), 2), "kvrouter --id 'r 1' exits 2");
    cr_assert(not(eq(ptr, strstr(log_of("kvrouter", 2, buf, sizeof buf), "--id"), NULL)), "%s",
              buf);
    h_end();
}

/* Once open: anyone could ask a router for its snapshot, whose pages list every in-flight
 * client's reply subject and request id. Now pages go only to the asking router's own pages
 * subject (which permissions fence to routers). */
Test(hostile, a_snapshot_is_not_served_to_an_inbox)
{
    h_worker(srv.url, "1", 1, 200, NULL); /* real time: the request stays in flight */
    h_router(srv.url, "r1", NULL);
    h_until_served(nc, H_GEN, 1, 20000);
    struct h_req victim;
    cr_assert(h_send(nc, H_GEN, &victim, "secret-id", 4, 0, 256, 500));
    cr_assert(ne(u64, h_first_worker(&victim, 5000), 0), "the victim's stream started");
    struct kvr_wire_sync q = {.router_id = "r9", .full = true, .token = 5};
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    natsMsg *m = NULL;
    cr_assert(not(eq(int,
                     natsConnection_Request(&m, nc, "kv.default.router.sync.r1", b.data, (int)b.len,
                                            1000),
                     NATS_OK)),
              "no answer to a stranger's inbox");
    cr_assert(ge(u64, router_stat("data.replication.gossip_bad"), 1), "counted");
    cr_assert(eq(u64, router_stat("data.replication.snapshots_served"), 0));
    kvr_buf_free(&b);
    h_sub_close(victim.nc, victim.sub);
    h_end();
}

/* A flood of asks to announce (anyone allowed to publish there: without the permissions of
 * security.md, any client) costs each worker at most one heartbeat per 100 ms, and the last ask
 * is still answered. */
Test(hostile, a_flood_of_announce_asks_costs_a_worker_ten_heartbeats_a_second)
{
    natsSubscription *hb = NULL;
    cr_assert(eq(int, natsConnection_SubscribeSync(&hb, nc, "kv.default.ev.1.hb"), NATS_OK));
    cr_assert(eq(int, natsConnection_Flush(nc), NATS_OK));
    h_worker(srv.url, "1", 50, 60000, NULL);
    natsMsg *m = NULL;
    cr_assert(eq(int, natsSubscription_NextMsg(&m, hb, 10000), NATS_OK), "its first heartbeat");
    natsMsg_Destroy(m);
    uint64_t t0 = h_now_ms();
    int asks = 0;
    while (h_now_ms() - t0 < 1000) { /* a second of asks, 2,000 of them or so */
        cr_assert(
            eq(int, natsConnection_PublishString(nc, "kv.default.worker.announce", ""), NATS_OK));
        if (++asks % 100 == 0)
            h_sleep_ms(50);
    }
    cr_assert(eq(int, natsConnection_Flush(nc), NATS_OK));
    h_sleep_ms(300); /* the last ask's answer */
    int beats = 0;
    while (natsSubscription_NextMsg(&m, hb, 10) == NATS_OK) {
        natsMsg_Destroy(m);
        beats++;
    }
    cr_assert(ge(int, beats, 2), "the asks were answered (%d heartbeats for %d asks)", beats, asks);
    cr_assert(le(int, beats, 14), "at most one heartbeat per 100 ms (%d for %d asks)", beats, asks);
    h_sub_close(nc, hb);
    h_end();
}
