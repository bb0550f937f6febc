/*
 * Bad inputs on the subjects routers speak among themselves: kv.<ns>.router.gossip (decisions,
 * hellos), router.sync.<id> and router.lookup (SyncRequests), router.pages.<id> (SyncPages);
 * and the names an operator gives (--namespace, --prefix, --id). Counted as gossip_bad in
 * $SRV.STATS (data.replication) unless noted; each case is a row of docs/hostile-inputs.md.
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "fleet.h"
#include "kvrouter.pb-c.h"
#include "natscfg.h"
#include "sync.h"
#include "test_hostile_rig.h"
#include "timer.h"

TestSuite(hostile_fleet, .init = hr_setup, .fini = hr_teardown, .timeout = 60);

static void pack(struct kvr_buf *b, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    cr_assert(eq(int, kvr_buf_reserve(b, n + 1), KVR_OK));
    b->len = protobuf_c_message_pack(m, b->data);
}

/* data on the gossip subject counts one more gossip_bad and changes nothing. */
static void bad_gossip(const char *row, const void *data, size_t len)
{
    uint64_t before = hr_stat("data.replication.gossip_bad");
    size_t mark = hr_nsent;
    hr_on_gossip("peer", data, len);
    cr_assert(eq(u64, hr_stat("data.replication.gossip_bad"), before + 1), "%s", row);
    cr_assert(eq(sz, hr_nsent, mark), "%s: nothing published", row);
    cr_assert(eq(u32, hr_rd.pend.n, 0), "%s: nothing imported", row);
}

static uint64_t hashes[KVR_WIRE_DECISION_BLOCKS_MAX + 1]; /* 512 KB */

/* A Gossip decision from "peer" (epoch 5, seq 1) as the protobuf-c structs, to alter. */
static void decision(Kvrouter__V1__Gossip *g, Kvrouter__V1__Decision *d)
{
    *g = (Kvrouter__V1__Gossip)KVROUTER__V1__GOSSIP__INIT;
    *d = (Kvrouter__V1__Decision)KVROUTER__V1__DECISION__INIT;
    for (uint32_t i = 0; i <= KVR_WIRE_DECISION_BLOCKS_MAX; i++)
        hashes[i] = 0x1234567800000000ull + i;
    d->request_key = 4242;
    d->worker_id = 1;
    d->block_hashes = hashes;
    d->n_block_hashes = 2;
    d->prompt_tokens = 128;
    d->reply = "_INBOX.x";
    d->request_id = "c";
    d->origin = "peer";
    g->router_id = "peer";
    g->epoch = 5;
    g->seq = 1;
    g->body_case = KVROUTER__V1__GOSSIP__BODY_DECISION;
    g->decision = d;
}

Test(hostile_fleet, gossip_that_does_not_decode_or_is_over_a_cap_is_counted)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    uint8_t junk[32];
    memset(junk, 0xff, sizeof junk);
    bad_gossip("junk", junk, sizeof junk);
    bad_gossip("empty payload: no body", "", 0);
    Kvrouter__V1__Gossip g;
    Kvrouter__V1__Decision d;
    struct kvr_buf b = {0};
    decision(&g, &d);
    pack(&b, &g.base);
    bad_gossip("truncated", b.data, b.len - 4);
    char big[300];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    static const char *const rows[] = {
        "request key 0",        "worker 0",         "overlap over its blocks", "65,537 hashes",
        "request id 299 bytes", "origin 299 bytes", "reply 1,025 bytes",
    };
    char reply[1100] = "_INBOX.";
    memset(reply + 7, 'r', 1018);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        decision(&g, &d);
        d.request_key = i == 0 ? 0 : d.request_key;
        d.worker_id = i == 1 ? 0 : d.worker_id;
        d.overlap_blocks = i == 2 ? 3 : 0;
        d.n_block_hashes = i == 3 ? KVR_WIRE_DECISION_BLOCKS_MAX + 1 : 2;
        d.request_id = i == 4 ? big : d.request_id;
        d.origin = i == 5 ? big : d.origin;
        d.reply = i == 6 ? reply : d.reply;
        pack(&b, &g.base);
        bad_gossip(rows[i], b.data, b.len);
    }
    decision(&g, &d);
    g.body_case = KVROUTER__V1__GOSSIP__BODY__NOT_SET;
    pack(&b, &g.base);
    bad_gossip("a router id and no body", b.data, b.len);
    uint8_t *huge = calloc(1, KVR_WIRE_GOSSIP_MAX + 1);
    bad_gossip("over 659,456 bytes", huge, KVR_WIRE_GOSSIP_MAX + 1);
    free(huge);
    kvr_buf_free(&b);
}

Test(hostile_fleet, gossip_checked_against_what_this_router_knows)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    uint64_t h[2] = {11, 12};
    struct kvr_request_record rec = {777, 9, h, 2, 128, 0, false, 0, 0}; /* worker 9: unknown */
    hr_gossip("peer", 5, 1, &rec, "_INBOX.x", "peer");
    cr_assert(eq(u64, hr_stat("data.replication.import_unknown_worker"), 1));
    rec.worker_id = 1;
    hr_gossip("peer", 5, 2, &rec, "_INBOX.x", "peer");
    hr_gossip("peer", 5, 3, &rec, "_INBOX.x", "peer"); /* the same decision again */
    cr_assert(eq(u64, hr_stat("data.replication.already_known"), 1));
    cr_assert(eq(u32, hr_rd.pend.n, 1));
    hr_hello("peer", 4, 9); /* an earlier incarnation */
    cr_assert(eq(u64, hr_stat("data.replication.gossip_stale"), 1));
    hr_log_begin();
    hr_hello("r1", 5, 1);                  /* this router's own id, another epoch */
    hr_hello("r1", hr_rd.fleet->epoch, 1); /* its own echo: nothing */
    const char *log = hr_log_end();
    cr_assert(eq(u64, hr_stat("data.replication.gossip_bad"), 1), "the clash counted once");
    cr_assert(not(eq(ptr, strstr(log, "router_id_clash"), NULL)), "and logged: %s", log);
}

Test(hostile_fleet, a_seq_from_far_ahead_asks_a_bounded_repair)
{
    hr_hello("peer", 5, 1);
    size_t mark = hr_nsent;
    hr_hello("peer", 5, UINT64_MAX); /* "I sent 2^64 - 1 decisions" */
    const struct hr_sent *m = NULL;
    cr_assert(eq(int, hr_count("kv.default.router.sync.peer", mark, &m), 1), "one question");
    struct kvr_wire_sync q;
    cr_assert(eq(int, kvr_wire_decode_sync(m->data, m->len, &q), KVR_OK));
    cr_assert(eq(u64, q.to_seq - q.from_seq + 1, 4096), "for the last 4,096 only");
    kvr_wire_sync_free(&q);
    cr_assert(eq(u64, hr_stat("data.replication.gaps"), 4096));
    uint64_t h[2] = {11, 12};
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    struct kvr_request_record rec = {888, 1, h, 2, 128, 0, false, 0, 0};
    hr_gossip("peer", 5, 1ull << 63, &rec, "_INBOX.x", "peer"); /* a decision from far ahead */
    cr_assert(eq(u32, hr_rd.pend.n, 1), "taken; the gap asked for");
    cr_assert(le(u64, hr_stat("data.replication.gaps"), 2 * 4096));
}

/* A SyncRequest q (with reply) to this router: it counts one more gossip_bad, answers nothing. */
static void bad_sync(const char *row, const char *reply, const void *data, size_t len)
{
    uint64_t before = hr_stat("data.replication.gossip_bad");
    size_t mark = hr_nsent;
    kvr_sync_on_request(&hr_rd, reply, data, len);
    cr_assert(eq(u64, hr_stat("data.replication.gossip_bad"), before + 1), "%s", row);
    cr_assert(eq(sz, hr_nsent, mark), "%s: nothing sent", row);
}

Test(hostile_fleet, sync_requests_that_are_bad_are_counted_and_unanswered)
{
    uint8_t junk[32];
    memset(junk, 0xff, sizeof junk);
    bad_sync("junk", "_INBOX.q", junk, sizeof junk);
    struct kvr_buf b = {0};
    struct kvr_wire_sync q = {.full = true};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    bad_sync("no reply subject", NULL, b.data, b.len);
    q = (struct kvr_wire_sync){.from_seq = 10, .to_seq = 9};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    bad_sync("a backwards range", "_INBOX.q", b.data, b.len);
    q = (struct kvr_wire_sync){.from_seq = 1, .to_seq = 2000000};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    bad_sync("a range of 2,000,000", "_INBOX.q", b.data, b.len);
    uint64_t *keys = calloc(KVR_WIRE_SYNC_KEYS_MAX + 1, sizeof *keys);
    for (uint32_t i = 0; i <= KVR_WIRE_SYNC_KEYS_MAX; i++)
        keys[i] = i + 1;
    q = (struct kvr_wire_sync){.keys = keys, .nkeys = KVR_WIRE_SYNC_KEYS_MAX + 1};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    bad_sync("65,537 keys", "_INBOX.q", b.data, b.len);
    char big[300];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    q = (struct kvr_wire_sync){.router_id = big, .full = true};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    bad_sync("router id 299 bytes", "_INBOX.q", b.data, b.len);
    q = (struct kvr_wire_sync){.router_id = "q", .full = true};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    bad_sync("a reply that is not the asker's pages subject", "_INBOX.q", b.data, b.len);
    const char *pages = "kv.default.router.pages.q";
    size_t mark = hr_nsent;
    q = (struct kvr_wire_sync){.router_id = "q", .keys = keys, .nkeys = 100}; /* unknown keys */
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    kvr_sync_on_request(&hr_rd, pages, b.data, b.len);
    q = (struct kvr_wire_sync){.router_id = "q", .from_seq = 1, .to_seq = 5, .epoch = 1};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK)); /* not this epoch */
    kvr_sync_on_request(&hr_rd, pages, b.data, b.len);
    cr_assert(eq(sz, hr_nsent, mark), "unknown keys, another epoch: silence");
    q = (struct kvr_wire_sync){
        .router_id = "q", .from_seq = 1, .to_seq = 1000000, .epoch = hr_rd.fleet->epoch};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    uint64_t t0 = hr_now();
    kvr_sync_on_request(&hr_rd, pages, b.data, b.len);
    cr_log_info("a repair of 1,000,000 seqs never sent: %.1f us", (double)(hr_now() - t0) / 1e3);
    cr_assert(eq(int, hr_count(pages, mark, NULL), 1), "the widest repair: one last page");
    free(keys);
    kvr_buf_free(&b);
}

/* The lookup subject (every router hears it) asks request keys only: a snapshot or a repair asked
 * there is bad and unanswered (every router of the fleet served it at once); keys are answered. */
Test(hostile_fleet, a_lookup_asks_keys_only)
{
    const char *pages = "kv.default.router.pages.q";
    struct kvr_buf b = {0};
    struct kvr_wire_sync q = {.router_id = "q", .full = true};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    kvr_sync_on_request(&hr_rd, pages, b.data, b.len);
    size_t mark = hr_nsent;
    cr_assert(gt(sz, mark, 0), "on the sync subject a snapshot is served");
    uint64_t before = hr_stat("data.replication.gossip_bad");
    kvr_sync_on_lookup(&hr_rd, pages, b.data, b.len);
    q = (struct kvr_wire_sync){
        .router_id = "q", .from_seq = 1, .to_seq = 5, .epoch = hr_rd.fleet->epoch};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    kvr_sync_on_lookup(&hr_rd, pages, b.data, b.len);
    cr_assert(eq(u64, hr_stat("data.replication.gossip_bad"), before + 2));
    cr_assert(eq(sz, hr_nsent, mark), "a snapshot or a range on lookup: nothing sent");
    uint64_t h[2] = {11, 12};
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    struct kvr_request_record rec = {777, 1, h, 2, 128, 0, false, 0, 0};
    hr_gossip("peer", 5, 1, &rec, "_INBOX.x", "peer");
    uint64_t key = 777;
    q = (struct kvr_wire_sync){.router_id = "q", .keys = &key, .nkeys = 1};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    kvr_sync_on_lookup(&hr_rd, pages, b.data, b.len);
    cr_assert(eq(int, hr_count(pages, mark, NULL), 1), "a key it holds: answered");
    kvr_buf_free(&b);
}

/* A SyncPage with the given decisions and entries, as bytes. */
static void page(struct kvr_buf *b, Kvrouter__V1__Decision **d, size_t nd,
                 Kvrouter__V1__IndexEntry **e, size_t ne, uint64_t token)
{
    Kvrouter__V1__SyncPage p = KVROUTER__V1__SYNC_PAGE__INIT;
    p.decisions = d;
    p.n_decisions = nd;
    p.entries = e;
    p.n_entries = ne;
    p.token = token;
    pack(b, &p.base);
}

static void bad_page(const char *row, const void *data, size_t len)
{
    uint64_t before = hr_stat("data.replication.gossip_bad");
    kvr_sync_on_page(&hr_rd, data, len);
    cr_assert(eq(u64, hr_stat("data.replication.gossip_bad"), before + 1), "%s", row);
    cr_assert(eq(u64, hr_stat("data.index_entries"), 0), "%s: no entry taken", row);
}

Test(hostile_fleet, pages_with_one_bad_record_are_refused_whole)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    hr_rd.fleet->syncing = true; /* a snapshot awaited: pages' entries are taken */
    hr_rd.fleet->sync_token = 77;
    uint8_t junk[32];
    memset(junk, 0xff, sizeof junk);
    bad_page("junk", junk, sizeof junk);
    Kvrouter__V1__Gossip g;
    Kvrouter__V1__Decision good, zero, *ds[2] = {&good, &zero};
    decision(&g, &good);
    decision(&g, &zero);
    zero.request_key = 0;
    struct kvr_buf b = {0};
    page(&b, ds, 2, NULL, 0, 77);
    bad_page("a decision with key 0 beside a good one", b.data, b.len);
    cr_assert(eq(u32, hr_rd.pend.n, 0), "the good one is not taken either");
    Kvrouter__V1__IndexEntry e = KVROUTER__V1__INDEX_ENTRY__INIT, *es = &e;
    e.seq = 99;
    e.ttl_left_ms = 1000; /* worker 0 */
    page(&b, NULL, 0, &es, 1, 77);
    bad_page("an entry of worker 0", b.data, b.len);
    e.worker_id = 1;
    e.ttl_left_ms = UINT64_MAX / 1000000 + 1; /* nanoseconds would wrap */
    page(&b, NULL, 0, &es, 1, 77);
    bad_page("ttl_left_ms * 1e6 over 2^64", b.data, b.len);
    e.ttl_left_ms = 1000;
    Kvrouter__V1__IndexEntry **many = calloc(KVR_WIRE_PAGE_ITEMS_MAX + 1, sizeof *many);
    for (uint32_t i = 0; i <= KVR_WIRE_PAGE_ITEMS_MAX; i++)
        many[i] = &e;
    page(&b, NULL, 0, many, KVR_WIRE_PAGE_ITEMS_MAX + 1, 77);
    bad_page("65,537 entries", b.data, b.len);
    free(many);
    uint8_t *huge = calloc(1, KVR_WIRE_PAGE_MAX + 1);
    bad_page("over 8 MiB", huge, KVR_WIRE_PAGE_MAX + 1);
    free(huge);
    good.reply = "_INBOX.*";
    page(&b, ds, 1, NULL, 0, 77);
    bad_page("a decision whose reply is a wildcard", b.data, b.len);
    kvr_buf_free(&b);
}

/* Once open: an imported TTL entry's time left was taken as it came: the longest wrapped and
 * expired at once, a 31-year one outlived everything behind it. Now it is clamped to this
 * router's own TTL (120 s). */
Test(hostile_fleet, an_imported_ttl_is_bounded_by_the_routers_own)
{
    hr_cfg.core.approximate = true;
    hr_cfg.core.worker_timeout_ns = 0;
    kvr_fleet_destroy(&hr_rd);
    kvr_rd_free(&hr_rd);
    hr_start();
    hr_heartbeat(1, 4096, NULL, 0, 0); /* no interval: never timed out (worker_timeout 0) */
    hr_rd.fleet->syncing = true;
    hr_rd.fleet->sync_token = 77;
    Kvrouter__V1__IndexEntry e = KVROUTER__V1__INDEX_ENTRY__INIT, *es = &e;
    e.worker_id = 1;
    e.seq = 0xaaaa;
    e.ttl_left_ms = UINT64_MAX / 1000000; /* the longest taken */
    struct kvr_buf b = {0};
    page(&b, NULL, 0, &es, 1, 77);
    kvr_sync_on_page(&hr_rd, b.data, b.len);
    kvr_router_tick(hr_rd.core, hr_now());
    cr_assert(eq(u64, hr_stat("data.index_entries"), 1), "taken, and not expired at once");
    e.seq = 0xbbbb;
    e.ttl_left_ms = 1000000000000ull; /* 31 years */
    page(&b, NULL, 0, &es, 1, 77);
    kvr_sync_on_page(&hr_rd, b.data, b.len);
    e.seq = 0xcccc; /* a page of another token: its entries are not the snapshot's */
    page(&b, NULL, 0, &es, 1, 78);
    kvr_sync_on_page(&hr_rd, b.data, b.len);
    hr_generate("_INBOX.a", "approx", 1, 128, 8); /* its 2 blocks: TTL entries of 120 s */
    cr_assert(eq(u64, hr_stat("data.index_entries"), 4));
    kvr_router_tick(hr_rd.core, hr_now() + 121 * KVR_NS_PER_S);
    cr_assert(eq(u64, hr_stat("data.index_entries"), 0), "all gone after 120 s");
    kvr_buf_free(&b);
}

Test(hostile_fleet, made_up_router_ids_hold_the_peer_table_only_while_they_talk)
{
    hr_cfg.hello_ns = 100 * KVR_NS_PER_MS; /* silent after 350 ms */
    kvr_fleet_destroy(&hr_rd);
    kvr_rd_free(&hr_rd);
    hr_start();
    for (uint32_t i = 0; i < KVR_FLEET_MAX_PEERS; i++) { /* 1,024 hellos under made-up ids */
        char id[32];
        snprintf(id, sizeof id, "fake-%u", i);
        hr_hello(id, 5, 0);
    }
    cr_assert(eq(u64, hr_stat("data.replication.peers"), KVR_FLEET_MAX_PEERS));
    hr_hello("real-router", 7, 0); /* while they all still talk: not heard */
    cr_assert(eq(u64, hr_stat("data.replication.gossip_bad"), 1));
    cr_assert(eq(u64, hr_stat("data.replication.peers_evicted"), 0));
    kvr_sleep_ns(400 * KVR_NS_PER_MS);
    hr_hello("real-router", 7, 0);
    cr_assert(eq(u64, hr_stat("data.replication.peers_evicted"), 1), "a silent one goes");
    struct kvr_peer *p = NULL;
    HASH_FIND_STR(hr_rd.fleet->peers, "real-router", p);
    cr_assert(not(eq(ptr, p, NULL)), "and the real router is heard");
}

Test(hostile_fleet, a_decision_whose_origin_finds_no_room_is_not_taken_as_this_routers)
{
    /* every peer slot a live router's: a page bringing a decision of one more router could not
     * name its origin, and took it as this router's own (answering its client twice over) */
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    for (uint32_t i = 0; i < KVR_FLEET_MAX_PEERS; i++) {
        char id[32];
        snprintf(id, sizeof id, "p%u", i);
        hr_hello(id, 5, 0);
    }
    Kvrouter__V1__Gossip g;
    Kvrouter__V1__Decision d, *ds = &d;
    decision(&g, &d);
    d.origin = "rx"; /* heard of nowhere else: no slot */
    struct kvr_buf b = {0};
    page(&b, &ds, 1, NULL, 0, 0);
    uint64_t failed = hr_stat("data.replication.import_failed");
    kvr_sync_on_page(&hr_rd, b.data, b.len);
    cr_assert(eq(ptr, kvr_pending_find(&hr_rd.pend, 4242), NULL), "taken as this router's");
    cr_assert(eq(u64, hr_stat("data.replication.import_failed"), failed + 1), "counted");
    /* its origin with room (one of the peers known): taken, as that peer's */
    d.origin = "p7";
    page(&b, &ds, 1, NULL, 0, 0);
    kvr_sync_on_page(&hr_rd, b.data, b.len);
    struct kvr_pending *q = kvr_pending_find(&hr_rd.pend, 4242);
    cr_assert(not(eq(ptr, q, NULL)));
    cr_assert(q->origin && !strcmp(q->origin->id, "p7"), "the peer's");
    kvr_buf_free(&b);
}

Test(hostile_fleet, names_from_the_command_line_are_one_token_each)
{
    static const char *const bad_ns[] = {"*", ">", "a.b", "a b", "", "a\r\nb", "\x01"};
    char why[256];
    for (size_t i = 0; i < sizeof bad_ns / sizeof bad_ns[0] + 1; i++) {
        struct kvr_nats_config c;
        kvr_nats_config_default(&c, KVR_LOG_INFO);
        if (i < sizeof bad_ns / sizeof bad_ns[0])
            snprintf(c.ns, sizeof c.ns, "%s", bad_ns[i]);
        else
            memset(c.ns, 'n', 65), c.ns[65] = 0; /* over 64 bytes */
        why[0] = 0;
        cr_assert(eq(int, kvr_nats_config_check(&c, why, sizeof why), KVR_ERR_INVALID),
                  "--namespace \"%s\"", c.ns);
        cr_assert(not(eq(ptr, strstr(why, "--namespace"), NULL)), "%s", why);
    }
    struct kvr_nats_config c;
    kvr_nats_config_default(&c, KVR_LOG_INFO);
    strcpy(c.prefix, "kv.*");
    cr_assert(eq(int, kvr_nats_config_check(&c, why, sizeof why), KVR_ERR_INVALID), "--prefix");
    static const char *const bad_ids[] = {"a.b", "r 1", "r*", ">", "r\n"};
    for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
        struct kvr_rd_config rc;
        kvr_rd_config_default(&rc);
        snprintf(rc.id, sizeof rc.id, "%s", bad_ids[i]);
        cr_assert(eq(int, kvr_rd_config_check(&rc, why, sizeof why), KVR_ERR_INVALID),
                  "--id \"%s\"", bad_ids[i]);
        cr_assert(not(eq(ptr, strstr(why, "--id"), NULL)), "%s", why);
    }
    struct kvr_rd_config rc; /* a worker's announced interval is clamped between the two */
    kvr_rd_config_default(&rc);
    rc.heartbeat_min_ns = rc.heartbeat_max_ns + 1;
    cr_assert(eq(int, kvr_rd_config_check(&rc, why, sizeof why), KVR_ERR_INVALID));
    cr_assert(not(eq(ptr, strstr(why, "--heartbeat-min-ms"), NULL)), "%s", why);
}

/*
 * Every decision carries one hash per prompt block, and a peer decodes at most
 * KVR_WIRE_DECISION_BLOCKS_MAX of them: a router was started with any --max-prompt-tokens up to
 * 2^24 and --block-size down to 1, and then gossiped the decision of each prompt past that many
 * blocks in a message every peer refused (at block size 64 and 4,194,368 tokens: 65,537 hashes,
 * 622 KB, KVR_ERR_TOO_LARGE, so its peers never knew of the booking, and a snapshot page holding
 * it was refused whole). Such a configuration is refused at start; what is taken fits.
 */
Test(hostile_fleet, a_prompt_limit_past_what_a_decision_carries_is_refused_at_start)
{
    static const struct {
        uint32_t block_size, max_prompt_tokens;
        bool ok;
    } cases[] = {
        {64, 1u << 20, true},                                /* the defaults: 16,384 blocks */
        {16, 1u << 20, true},                                /* engines.md's: 65,536 */
        {64, KVR_WIRE_DECISION_BLOCKS_MAX * 64, true},       /* 65,536 */
        {64, KVR_WIRE_DECISION_BLOCKS_MAX * 64 + 64, false}, /* 65,537 */
        {1, 1u << 20, false},                                /* SGLang's own page size */
        {64, 1u << 24, false},                               /* the option's largest */
    };
    struct kvr_buf b = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct kvr_rd_config rc;
        kvr_rd_config_default(&rc);
        rc.core.block_size = cases[i].block_size;
        rc.core.max_prompt_tokens = cases[i].max_prompt_tokens;
        char why[256] = "";
        kvr_status st = kvr_rd_config_check(&rc, why, sizeof why);
        cr_assert(eq(int, st, cases[i].ok ? KVR_OK : KVR_ERR_INVALID), "block size %u, %u tokens",
                  cases[i].block_size, cases[i].max_prompt_tokens);
        if (!cases[i].ok) {
            cr_assert(not(eq(ptr, strstr(why, "--max-prompt-tokens"), NULL)), "%s", why);
            continue;
        }
        /* the decision of the longest prompt taken is one a peer takes */
        uint32_t n = cases[i].max_prompt_tokens / cases[i].block_size;
        uint64_t *h = calloc(n, sizeof *h);
        cr_assert(h != NULL);
        struct kvr_request_record rec = {77, 5, h, n, cases[i].max_prompt_tokens, 0, false, 0, 8};
        cr_assert(eq(
            int, kvr_wire_encode_gossip_decision(&b, "r2", 1, 1, &rec, "_INBOX.x", "c", "r2", 1, 0),
            KVR_OK));
        struct kvr_wire_gossip g;
        cr_assert(eq(int, kvr_wire_decode_gossip(b.data, b.len, &g), KVR_OK), "%u hashes", n);
        kvr_wire_gossip_free(&g);
        free(h);
    }
    kvr_buf_free(&b);
}

/*
 * A flood of Queued notices (a forger on the gossip subjects: one per made-up client id) holds at
 * most 65,536 pending entries (the rest counted, not kept), so the table keeps room for real
 * requests; each is forgotten once its wait and four hellos are over.
 */
Test(hostile_fleet, a_flood_of_queued_notices_is_bounded_and_forgotten_after_its_wait)
{
    hr_cfg.hello_ns = 10 * KVR_NS_PER_MS;
    kvr_fleet_destroy(&hr_rd);
    kvr_rd_free(&hr_rd);
    hr_start();
    hr_heartbeat(1, 4096, NULL, 0, 60000);
    uint32_t held = 65536, n = held + 100;
    struct kvr_buf b = {0};
    for (uint32_t i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "flood-%u", i);
        struct kvr_wire_queued q = {"_INBOX.flood", id, 1, 1, false, KVR_OK};
        cr_assert(eq(int, kvr_wire_encode_gossip_queued(&b, "forger", 5, 0, &q), KVR_OK));
        hr_on_gossip("forger", b.data, b.len);
    }
    kvr_buf_free(&b);
    cr_assert(eq(u32, hr_rd.pend.n, held), "at most 65,536 held");
    cr_assert(lt(u32, hr_rd.pend.n, hr_rd.pend.max), "the table keeps room");
    cr_assert(eq(u64, hr_stat("data.replication.queued_heard"), held));
    cr_assert(eq(u64, hr_stat("data.replication.imported_unanswerable"), 100), "the rest counted");
    hr_generate("_INBOX.a", "real", 1, 128, 8);
    cr_assert(eq(int, hr_count("kv.default.worker.1.generate", 0, NULL), 1), "a real one routed");
    kvr_sleep_ns(60 * KVR_NS_PER_MS); /* 1 ms and four 10 ms hellos */
    hr_hello("forger", 5, 0);         /* alive: its notices are dropped, not answered */
    kvr_timer_tick(&hr_rd, hr_now(), true, false);
    cr_assert(eq(u32, hr_rd.pend.n, 1), "forgotten after their wait (the real one is in flight)");
    cr_assert(eq(u32, hr_rd.pend.nnotices, 0));
    cr_assert(eq(int, hr_count("_INBOX.flood", 0, NULL), 0), "nobody answered for the forger");
}

static void count_decision(void *ctx, const struct kvr_wire_decision *d)
{
    (void)d;
    ++*(uint32_t *)ctx;
}

/* The decisions in the pages sent to subject since mark. */
static uint32_t decisions_sent(const char *subject, size_t mark)
{
    uint32_t n = 0;
    for (size_t i = mark; i < hr_nsent; i++) {
        struct kvr_wire_page_head head;
        if (!strcmp(hr_sent[i].subject, subject))
            cr_assert(eq(int,
                         kvr_wire_decode_page(hr_sent[i].data, hr_sent[i].len, count_decision, NULL,
                                              &n, &head),
                         KVR_OK));
    }
    return n;
}

/* A lookup naming one key 65,536 times (the wire's bound; routers ask 256 keys at most): every
 * router built a record per copy under its mutex, a long prompt's (16,384 blocks) 147 KB each,
 * 9.6 GB of pages for one 512 KB message. Each key is answered once. */
Test(hostile_fleet, a_lookup_answers_each_key_once)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    uint64_t h[2] = {11, 12};
    struct kvr_request_record rec = {777, 1, h, 2, 128, 0, false, 0, 0};
    hr_gossip("peer", 5, 1, &rec, "_INBOX.x", "peer");
    uint64_t *keys = malloc(KVR_WIRE_SYNC_KEYS_MAX * sizeof *keys);
    for (uint32_t i = 0; i < KVR_WIRE_SYNC_KEYS_MAX; i++)
        keys[i] = i % 2 ? 777 : 778 + i; /* 777 half the time, else keys nobody holds */
    struct kvr_wire_sync q = {.router_id = "q", .keys = keys, .nkeys = KVR_WIRE_SYNC_KEYS_MAX};
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    const char *pages = "kv.default.router.pages.q";
    size_t mark = hr_nsent;
    kvr_sync_on_lookup(&hr_rd, pages, b.data, b.len);
    cr_assert(eq(u32, decisions_sent(pages, mark), 1), "one record for the one key it holds");
    mark = hr_nsent;
    kvr_sync_on_request(&hr_rd, pages, b.data, b.len);
    cr_assert(eq(u32, decisions_sent(pages, mark), 1), "on its sync subject the same");
    free(keys);
    kvr_buf_free(&b);
}

/* With the peer table full of silent ids, the one silent the longest still the origin of a
 * request: one of the others goes, and a new router is heard (the oldest alone was tried, so the
 * table stayed full while that request lasted). */
Test(hostile_fleet, a_silent_peer_that_a_request_names_keeps_no_new_router_out)
{
    hr_cfg.hello_ns = 100 * KVR_NS_PER_MS; /* silent after 350 ms */
    kvr_fleet_destroy(&hr_rd);
    kvr_rd_free(&hr_rd);
    hr_start();
    hr_heartbeat(1, 4096, NULL, 0, 60000);
    uint64_t h[2] = {11, 12};
    struct kvr_request_record rec = {777, 1, h, 2, 128, 0, false, 0, 0};
    hr_gossip("old-router", 5, 1, &rec, "_INBOX.x", "old-router"); /* in flight, its origin's */
    for (uint32_t i = 1; i < KVR_FLEET_MAX_PEERS; i++) {
        char id[32];
        snprintf(id, sizeof id, "fake-%u", i);
        hr_hello(id, 5, 0);
    }
    cr_assert(eq(u64, hr_stat("data.replication.peers"), KVR_FLEET_MAX_PEERS));
    kvr_sleep_ns(400 * KVR_NS_PER_MS); /* all silent now */
    hr_hello("real-router", 7, 0);
    cr_assert(eq(u64, hr_stat("data.replication.peers_evicted"), 1), "a silent one goes");
    struct kvr_peer *p = NULL;
    HASH_FIND_STR(hr_rd.fleet->peers, "real-router", p);
    cr_assert(not(eq(ptr, p, NULL)), "and the real router is heard");
    HASH_FIND_STR(hr_rd.fleet->peers, "old-router", p);
    cr_assert(not(eq(ptr, p, NULL)), "the request's origin is kept");
    cr_assert(eq(ptr, (void *)kvr_pending_find(&hr_rd.pend, 777)->origin, p));
}

/* The same for gossip that does not decode: a line each, 1,001 for 1,001, before. */
static void junk_gossip(void *ctx)
{
    (void)ctx;
    hr_on_gossip("peer", rec_junk, sizeof rec_junk);
}

Test(hostile_fleet, a_flood_of_junk_gossip_is_logged_in_few_lines)
{
    uint64_t before = hr_stat("data.replication.gossip_bad");
    rec_log_flood(junk_gossip, NULL, "test_hostile", "msg=gossip_dropped");
    cr_assert(eq(u64, hr_stat("data.replication.gossip_bad"), before + 1001), "every one counted");
}
