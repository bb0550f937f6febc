/*
 * A fleet of routers on a three-node NATS cluster (127.0.0.1, free ports): the replicas agree, and
 * survive the loss of a router, a worker, a server node and of gossip messages. Every test starts
 * its own cluster and processes; clients send requests the way a fleet's clients do (a resend
 * with the same id when nothing came for a while).
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "harness.h"

#define GEN   H_GEN
#define NODES 3
#define HELLO "500" /* routers' --hello-ms */

static struct nats_srv node[NODES];
static natsConnection *nc; /* the clients' connection, on node 0 */

static void setup(void)
{
    h_setup(node, NODES, &nc);
}

static void teardown(void)
{
    h_teardown(&nc);
}

TestSuite(replicas, .init = setup, .fini = teardown, .timeout = 120);

/* All three nodes' URLs, node i's first (the process prefers it and fails over to the others). */
static const char *urls(int i)
{
    return h_urls(node, NODES, i);
}

/* Routers r1..r3, one on each node (r1 with flag value when flag is not NULL); pids into pid. */
static void three_routers(pid_t pid[3], const char *flag, const char *value)
{
    static const char *const ids[3] = {"r1", "r2", "r3"};
    for (int i = 0; i < 3; i++) {
        pid_t p =
            h_router(urls(i), ids[i],
                     H_ARGS("--hello-ms", HELLO, i == 0 ? flag : NULL, i == 0 ? value : NULL));
        if (pid)
            pid[i] = p;
    }
}

/* Workers 1..n, worker w on node w % NODES, a beat every beat_ms; pids into pid (or NULL). */
static void workers(int n, int speedup, int beat_ms, pid_t *pid)
{
    for (int w = 1; w <= n; w++) {
        char id[12];
        snprintf(id, sizeof id, "%d", w);
        pid_t p = h_worker(urls(w % NODES), id, speedup, beat_ms, NULL);
        if (pid)
            pid[w - 1] = p;
    }
}

struct load {
    struct h_req *q;
    int n;
    int ok, errors, lost, resent, duplicated;
};

static void send_batch(struct load *l, int from, int to, const char *tag)
{
    for (int i = from; i < to; i++) {
        char id[48];
        snprintf(id, sizeof id, "%s-%d", tag, i);
        /* 320-token prompts sharing their first 256 tokens, 8 tokens out */
        cr_assert(h_send(nc, GEN, &l->q[i], id, 5000 + (uint32_t)i, 256, 320, 8));
    }
}

static void collect_all(struct load *l, int resend_ms)
{
    for (int i = 0; i < l->n; i++) {
        struct h_req *q = &l->q[i];
        bool final = h_collect_resend(nc, GEN, q, resend_ms, 4, 30000, 100);
        l->lost += !final;
        if (!final) /* which one, for the routers' and workers' logs */
            fprintf(stderr,
                    "  request %d lost: %u chunks, %u tokens, from worker %llu, %u resends\n", i,
                    q->res.chunks, q->res.tokens, (unsigned long long)q->res.worker_id, q->resends);
        l->errors += final && q->res.error_code != 0;
        if (final && q->res.error_code)
            fprintf(stderr, "  request %d: error %u (%s)\n", i, q->res.error_code,
                    kvr_status_str((kvr_status)q->res.error_code));
        l->ok += final && q->res.error_code == 0;
        l->resent += q->resends;
        l->duplicated += q->extra != 0;
    }
}

Test(replicas, three_routers_under_load_end_with_equal_digests)
{
    three_routers(NULL, NULL, NULL);
    workers(4, 20, 500, NULL);
    h_until_served(nc, GEN, 3, 15000);
    struct load l = {calloc(120, sizeof(struct h_req)), 120, 0, 0, 0, 0, 0};
    send_batch(&l, 0, 120, "agree");
    collect_all(&l, 3000);
    cr_assert(eq(int, l.ok, 120), "ok=%d errors=%d lost=%d", l.ok, l.errors, l.lost);
    cr_assert(eq(int, l.duplicated, 0));
    struct h_digest a[H_MAX_ROUTERS];
    int64_t took = h_until_agree(nc, 3, 10000, 50, a);
    cr_assert(took >= 0, "the replicas' digests never agreed");
    uint64_t sent = 0, bytes = 0, decisions = 0, imported = 0, known = 0;
    for (int i = 0; i < 3; i++) {
        sent += h_stat(&a[i], "gossip_sent");
        bytes += h_stat(&a[i], "gossip_bytes");
        decisions += h_stat(&a[i], "decided");
        imported += h_stat(&a[i], "imported");
        known += h_stat(&a[i], "already_known");
        cr_assert(gt(u64, h_stat(&a[i], "gossip_sent"), 0), "%s decided nothing", a[i].id);
    }
    cr_assert(eq(u64, sent, decisions), "one gossip message per decision");
    /* each of the 120 decisions reached both peers (as gossip, or after its done overtook it) */
    cr_assert(ge(u64, imported + known, 2 * 120), "imported %llu + known %llu",
              (unsigned long long)imported, (unsigned long long)known);
    fprintf(stderr,
            "replicas: digests equal %lld ms after the load; %llu decisions, %llu gossip "
            "messages, %.0f bytes per decision\n",
            (long long)took, (unsigned long long)decisions, (unsigned long long)sent,
            sent ? (double)bytes / (double)sent : 0.0);
    free(l.q);
    h_end();
}

Test(replicas, a_router_killed_under_load_loses_no_request)
{
    pid_t r[3];
    three_routers(r, NULL, NULL);
    workers(4, 10, 500, NULL);
    h_until_served(nc, GEN, 3, 15000);
    struct load l = {calloc(150, sizeof(struct h_req)), 150, 0, 0, 0, 0, 0};
    send_batch(&l, 0, 50, "kill");
    h_sleep_ms(100);
    send_batch(&l, 50, 100, "kill");
    h_signal(r[1], SIGKILL); /* with requests in its hands */
    send_batch(&l, 100, 150, "kill");
    collect_all(&l, 1500);
    fprintf(stderr, "kill -9: %d ok, %d explicit errors, %d lost, %d resends, %d duplicated\n",
            l.ok, l.errors, l.lost, l.resent, l.duplicated);
    cr_assert(eq(int, l.lost, 0), "every client got its tokens or an error");
    cr_assert(eq(int, l.duplicated, 0), "nobody got two answers");
    struct h_digest a[H_MAX_ROUTERS];
    cr_assert(h_until_agree(nc, 2, 10000, 50, a) >= 0, "the survivors' digests never agreed");
    free(l.q);
    h_end();
}

Test(replicas, a_router_started_under_load_converges)
{
    three_routers(NULL, NULL, NULL);
    workers(4, 10, 500, NULL);
    h_until_served(nc, GEN, 3, 15000);
    const char *bench[] = {"--nats",      urls(0),      "--workload", "seed",          "--requests",
                           "400",         "--policies", "kv",         "--concurrency", "4",
                           "--log-level", "error",      NULL};
    pid_t b = h_spawn("kvbench", bench);
    h_sleep_ms(1500);
    uint64_t t0 = h_now_ms();
    h_router(urls(1), "r4", H_ARGS("--hello-ms", HELLO));
    struct h_digest a[H_MAX_ROUTERS];
    int64_t took = h_until_agree(nc, 4, 20000, 20, a);
    bool under_load = !h_exited(b);
    cr_assert(took >= 0, "the new router never agreed with the others");
    fprintf(stderr, "a new router agreed with the fleet %llu ms after it started (%s)\n",
            (unsigned long long)(h_now_ms() - t0),
            under_load ? "the load still running" : "after the load");
    cr_assert(eq(int, h_wait(b, 60000), 0), "kvbench failed");
    cr_assert(h_until_agree(nc, 4, 10000, 50, a) >= 0);
    cr_assert(gt(u64,
                 h_stat(&a[0], "snapshots_served") + h_stat(&a[1], "snapshots_served") +
                     h_stat(&a[2], "snapshots_served") + h_stat(&a[3], "snapshots_served"),
                 0));
    h_end();
}

Test(replicas, dropped_gossip_is_repaired)
{
    three_routers(NULL, "--test-drop-gossip", "4"); /* every 4th decision of r1 is never sent */
    workers(3, 20, 500, NULL);
    h_until_served(nc, GEN, 3, 15000);
    struct load l = {calloc(90, sizeof(struct h_req)), 90, 0, 0, 0, 0, 0};
    send_batch(&l, 0, 90, "drop");
    collect_all(&l, 3000);
    cr_assert(eq(int, l.ok, 90));
    struct h_digest a[H_MAX_ROUTERS];
    /* within three worker heartbeats (500 ms): the next decision or hello shows the gap */
    int64_t took = h_until_agree(nc, 3, 10000, 20, a);
    cr_assert(took >= 0, "never repaired");
    uint64_t dropped = 0, repaired = 0, gaps = 0;
    for (int i = 0; i < 3; i++) {
        dropped += h_stat(&a[i], "gossip_dropped_by_test_knob");
        repaired += h_stat(&a[i], "repaired");
        gaps += h_stat(&a[i], "gaps");
    }
    cr_assert(gt(u64, dropped, 0));
    cr_assert(ge(u64, gaps, 2 * dropped), "both peers saw every gap");
    fprintf(stderr,
            "dropped gossip: %llu decisions not sent, %llu gaps seen, %llu repaired; "
            "digests equal %lld ms after the load\n",
            (unsigned long long)dropped, (unsigned long long)gaps, (unsigned long long)repaired,
            (long long)took);
    free(l.q);
    h_end();
}

Test(replicas, a_killed_worker_is_dropped_by_every_replica)
{
    three_routers(NULL, NULL, NULL);
    pid_t w[3];
    workers(3, 1, 500, w);
    h_until_served(nc, GEN, 3, 15000);
    struct h_req q[9];
    uint64_t wid[9];
    for (int i = 0; i < 9; i++) { /* long generations at real speed */
        char id[32];
        snprintf(id, sizeof id, "long-%d", i);
        cr_assert(h_send(nc, GEN, &q[i], id, 700 + (uint32_t)i, 0, 512, 3000));
    }
    for (int i = 0; i < 9; i++)
        wid[i] = h_first_worker(&q[i], 5000);
    uint64_t victim = wid[0];
    cr_assert(victim >= 1 && victim <= 3);
    h_signal(w[victim - 1], SIGKILL);
    int failed = 0;
    for (int i = 0; i < 9; i++) {
        if (wid[i] != victim) {
            h_sub_close(q[i].nc, q[i].sub);
            continue;
        }
        cr_assert(h_collect_resend(nc, GEN, &q[i], 60000, 0, 10000, 1500),
                  "request %d on the dead worker got no answer", i);
        cr_assert(eq(u32, q[i].res.error_code, KVR_ERR_WORKER_LOST));
        cr_assert(eq(u32, q[i].extra, 0), "one router answered, once");
        failed++;
    }
    struct h_digest a[H_MAX_ROUTERS];
    cr_assert(h_until_agree(nc, 3, 10000, 50, a) >= 0);
    for (int i = 0; i < 3; i++)
        cr_assert(eq(u64, h_stat(&a[i], "workers"), 2), "%s still has the dead worker", a[i].id);
    fprintf(stderr, "killed worker: %d clients got 'worker lost' once\n", failed);
    h_end();
}

Test(replicas, a_server_node_restart_is_survived)
{
    three_routers(NULL, NULL, NULL); /* r2 is on the node that restarts: it moves to another */
    /* beats at the default period (1 s): the routers lose a worker silent for 3.2 periods, and
     * the worker on the stopping node writes its beats into a socket the node no longer serves
     * until the node closes it, which took 1.6 s (3.2 periods of 500 ms) on a loaded CI run */
    workers(3, 20, 1000, NULL);
    h_until_served(nc, GEN, 3, 15000);
    struct load l = {calloc(120, sizeof(struct h_req)), 120, 0, 0, 0, 0, 0};
    send_batch(&l, 0, 40, "restart");
    int port = node[1].port;
    h_nats_stop(&node[1]);
    send_batch(&l, 40, 80, "restart");
    cr_assert(h_nats_start_node(&node[1], port, "n2", &node[0]), "node 2 did not come back");
    cr_assert(h_cluster_wait(node, NODES, 10000));
    send_batch(&l, 80, 120, "restart");
    collect_all(&l, 2000);
    fprintf(stderr, "node restart: %d ok, %d errors, %d lost, %d resends\n", l.ok, l.errors, l.lost,
            l.resent);
    cr_assert(eq(int, l.lost, 0));
    cr_assert(eq(int, l.ok, 120));
    struct h_digest a[H_MAX_ROUTERS];
    cr_assert(h_until_agree(nc, 3, 15000, 50, a) >= 0, "the routers disagree after the restart");
    free(l.q);
    h_end();
}

/* A worker beats as soon as it is back from a cut, not a period later: routers lose a worker
 * silent for 3.2 periods, and a node's stop can take most of them before the cut is seen. Its
 * period here is a minute, so only that beat can arrive within the wait. */
Test(replicas, a_worker_beats_as_soon_as_its_node_is_gone)
{
    natsSubscription *hb = NULL;
    cr_assert(eq(int, natsConnection_SubscribeSync(&hb, nc, "kv.default.ev.1.hb"), NATS_OK));
    cr_assert(eq(int, natsConnection_Flush(nc), NATS_OK));
    h_worker(urls(1), "1", 20, 60000, NULL); /* on node 1 first; the clients are on node 0 */
    natsMsg *m = NULL;
    cr_assert(eq(int, natsSubscription_NextMsg(&m, hb, 10000), NATS_OK), "the first beat");
    natsMsg_Destroy(m);
    uint64_t t0 = h_now_ms();
    h_nats_stop(&node[1]);
    cr_assert(eq(int, natsSubscription_NextMsg(&m, hb, 15000), NATS_OK),
              "no beat after the worker moved to another node");
    natsMsg_Destroy(m);
    fprintf(stderr, "node stop: the worker beat again %llu ms after it began\n",
            (unsigned long long)(h_now_ms() - t0));
    h_sub_close(nc, hb);
    h_end();
}

Test(replicas, bad_replication_messages_are_counted_and_dropped)
{
    h_router(urls(0), "r1", H_ARGS("--hello-ms", HELLO));
    h_worker(urls(0), "1", 20, 500, NULL);
    h_until_served(nc, GEN, 1, 15000);
    const char junk[] = "\xff\xff\xff not protobuf";
    natsConnection_Publish(nc, "kv.default.router.gossip.stranger", junk, sizeof junk);
    natsConnection_PublishRequest(nc, "kv.default.router.sync.r1", "_INBOX.nobody", junk,
                                  sizeof junk);
    natsConnection_PublishRequest(nc, "kv.default.router.lookup", "_INBOX.nobody", junk,
                                  sizeof junk);
    natsConnection_Publish(nc, "kv.default.router.pages.r1", junk, sizeof junk);
    /* well-formed, but about a worker nobody knows, from a peer nobody knows */
    struct kvr_buf b = {0};
    uint64_t h[2] = {1, 2};
    struct kvr_request_record rec = {4242, 99, h, 2, 128, 0, false, 0, 0};
    cr_assert(eq(int,
                 kvr_wire_encode_gossip_decision(&b, "stranger", 1, 1, &rec, "_INBOX.x", "id",
                                                 "stranger", 0, 0),
                 KVR_OK));
    natsConnection_Publish(nc, "kv.default.router.gossip.stranger", b.data, (int)b.len);
    /* a full snapshot is served to the pages subject of the router that asks, only */
    struct kvr_wire_sync q = {.router_id = "stranger", .full = true, .token = 7};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    natsMsg *page = NULL;
    cr_assert(not(eq(int,
                     natsConnection_Request(&page, nc, "kv.default.router.sync.r1", b.data,
                                            (int)b.len, 500),
                     NATS_OK)),
              "no page to an inbox");
    natsSubscription *pages = NULL;
    cr_assert(eq(int, natsConnection_SubscribeSync(&pages, nc, "kv.default.router.pages.stranger"),
                 NATS_OK));
    natsConnection_PublishRequest(nc, "kv.default.router.sync.r1",
                                  "kv.default.router.pages.stranger", b.data, (int)b.len);
    cr_assert(eq(int, natsSubscription_NextMsg(&page, pages, 5000), NATS_OK),
              "a snapshot page came back");
    h_sub_close(nc, pages);
    struct kvr_wire_page_head head;
    cr_assert(eq(int,
                 kvr_wire_decode_page(natsMsg_GetData(page), (size_t)natsMsg_GetDataLength(page),
                                      NULL, NULL, NULL, &head),
                 KVR_OK));
    cr_assert(head.last);
    cr_assert(eq(u64, head.token, 7));
    cr_assert(not(head.index_partial), "a router with all its events serves a whole index");
    natsMsg_Destroy(page);
    kvr_buf_free(&b);
    h_sleep_ms(300);
    struct h_digest a[H_MAX_ROUTERS];
    cr_assert(eq(int, h_digests(nc, a, H_MAX_ROUTERS, 300), 1));
    cr_assert(ge(u64, h_stat(&a[0], "gossip_bad"), 5), "%s", a[0].json);
    cr_assert(eq(u64, h_stat(&a[0], "import_unknown_worker"), 1));
    cr_assert(eq(u64, h_stat(&a[0], "requests"), 0), "nothing booked on an unknown worker");
    struct h_req r;
    cr_assert(h_send(nc, GEN, &r, "still-serving", 77, 0, 64, 2));
    cr_assert(h_collect(&r, 5000) && r.res.error_code == 0, "the router still serves");
    h_end();
}

/* Router r2's full snapshot, asked every 20 ms for ms as a router "asker" would: the answers'
 * last pages counted by what they say of r2's index. */
static void poll_snapshots(int ms, int *partial, int *whole)
{
    natsSubscription *pages = NULL;
    cr_assert(eq(int, natsConnection_SubscribeSync(&pages, nc, "kv.default.router.pages.asker"),
                 NATS_OK));
    cr_assert(eq(int, natsConnection_Flush(nc), NATS_OK));
    struct kvr_buf b = {0};
    uint64_t asked_until = h_now_ms() + (uint64_t)ms, end = asked_until + 500;
    for (uint64_t token = 1; h_now_ms() < end; token++) {
        if (h_now_ms() < asked_until) {
            struct kvr_wire_sync q = {.router_id = "asker", .full = true, .token = token};
            cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
            natsConnection_PublishRequest(nc, "kv.default.router.sync.r2",
                                          "kv.default.router.pages.asker", b.data, (int)b.len);
        }
        natsMsg *page = NULL;
        while (natsSubscription_NextMsg(&page, pages, 20) == NATS_OK) {
            struct kvr_wire_page_head head;
            cr_assert(
                eq(int,
                   kvr_wire_decode_page(natsMsg_GetData(page), (size_t)natsMsg_GetDataLength(page),
                                        NULL, NULL, NULL, &head),
                   KVR_OK));
            *partial += head.last && head.index_partial;
            *whole += head.last && !head.index_partial;
            natsMsg_Destroy(page);
        }
    }
    kvr_buf_free(&b);
    h_sub_close(nc, pages);
}

Test(replicas, a_router_catching_up_serves_its_snapshot_marked_partial)
{
    h_router(urls(0), "r1", H_ARGS("--hello-ms", HELLO));
    pid_t r2 = h_router(urls(0), "r2", H_ARGS("--hello-ms", HELLO));
    h_worker(urls(0), "1", 20, 500, NULL);
    h_until_served(nc, GEN, 2, 15000);
    for (int i = 0; i < 4; i++) { /* an index to serve */
        char id[32];
        snprintf(id, sizeof id, "fill-%d", i);
        struct h_result r = h_ask(nc, GEN, id, 900 + (uint32_t)i, 0, 256, 2, 10000);
        cr_assert(r.final && r.error_code == 0);
    }
    int partial = 0, whole = 0;
    poll_snapshots(300, &partial, &whole);
    cr_assert(eq(int, partial, 0), "every event applied: whole");
    cr_assert(gt(int, whole, 0));
    /* stopped for longer than a second: on waking it catches up from r1 (250 ms later) */
    h_signal(r2, SIGSTOP);
    h_sleep_ms(1300);
    h_signal(r2, SIGCONT);
    partial = whole = 0;
    poll_snapshots(1500, &partial, &whole);
    fprintf(stderr, "r2 after a stop: %d snapshots served marked partial, then %d whole\n", partial,
            whole);
    cr_assert(gt(int, partial, 0), "its catch-up due: its snapshots say its index has holes");
    cr_assert(gt(int, whole, 0), "caught up: whole again");
    struct h_digest a[H_MAX_ROUTERS];
    cr_assert(h_until_agree(nc, 2, 10000, 50, a) >= 0);
    for (int i = 0; i < 2; i++)
        if (!strcmp(a[i].id, "r2")) {
            cr_assert(ge(u64, h_stat(&a[i], "resyncs"), 1), "%s", a[i].json);
            cr_assert(eq(u64, h_stat(&a[i], "snapshots_served_partial"), (uint64_t)partial));
        }
    h_end();
}
