/*
 * The attacks of issue 10 on the router daemon, each replayed through the handler that receives
 * it (real protobuf bytes, a recording sink that refuses to publish to anything that is not a
 * subject). For each, the test asserts what the code does today: refused and counted, bounded,
 * or, where the daemon cannot tell a forgery from the real thing, the effect the forgery has
 * (marked "still open": fenced only by subject permissions, docs/hostile-inputs.md).
 * Hash flooding is tests/unit/test_map.c (keys_aimed_at_one_slot_scatter_once_salted); here only
 * that the daemon salts. The worker's half is test_hostile_worker.c.
 */
#define _GNU_SOURCE /* memmem */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api.h"
#include "clock.h"
#include "events.h"
#include "fleet.h"
#include "intake.h"
#include "kvr/hash.h"
#include "natscfg.h"
#include "sync.h"
#include "test_hostile_rig.h"
#include "timer.h"

extern uint64_t kvr_map_salt; /* src/core/map.h: the salt every core hash table mixes keys with */

TestSuite(hostile, .init = hr_setup, .fini = hr_teardown, .timeout = 60);

/* Router ids that must never become a subject token or a raw log field. */
static const char *const evil_ids[] = {
    "x 0\r\n\r\nPUB evil 5\r\nhello",
    "evil\r\n",
    "a b",
    "r.1",
    "r*",
    ">",
    "r\t1",
    "\xff\xfe",
    "r1\x00hidden", /* the NUL ends it: "r1" is this router's own id, another epoch */
};

/* Two hellos from id: the second announces seqs never seen, so a peer would be asked for them on
 * router.sync.<id>. */
static void two_hellos(const char *id)
{
    hr_hello(id, 5, 1);
    hr_hello(id, 5, 9);
}

Test(hostile, injection_a_hello_whose_id_is_no_id_changes_nothing)
{
    char longest[300];
    memset(longest, 'a', sizeof longest);
    longest[64] = 0; /* one over KVR_RD_ID_MAX - 1: a subject token, but no router id here */
    hr_log_begin();
    size_t mark = hr_nsent;
    uint64_t n = sizeof evil_ids / sizeof evil_ids[0];
    for (size_t i = 0; i < n; i++)
        two_hellos(evil_ids[i]);
    two_hellos(longest);
    longest[64] = 'a';
    longest[257] = 0; /* over the codec's cap */
    two_hellos(longest);
    two_hellos("");
    const char *log = hr_log_end();
    cr_assert(eq(u32, hr_rd.fleet->npeers, 0), "no peer by any of those names");
    cr_assert(eq(u64, hr_stat("data.replication.gossip_bad"), 2 * (n + 3)));
    cr_assert(eq(sz, hr_nsent, mark), "nothing published: no repair asked of them");
    cr_assert(hr_log_lines_whole(log), "a log line was forged:\n%s", log);
    cr_assert(eq(ptr, strchr(log, '\r'), NULL), "a raw CR reached the log");
    two_hellos("r2"); /* the same under a real id: a peer, and a repair asked of it */
    cr_assert(eq(u32, hr_rd.fleet->npeers, 1));
    cr_assert(eq(int, hr_count("kv.default.router.sync.r2", mark, NULL), 1));
}

Test(hostile, injection_a_decision_whose_reply_or_origin_is_no_name_is_dropped)
{
    static const char *const replies[] = {
        "_INBOX.x\r\nPUB evil 3\r\nabc",
        "_INBOX.*",
        "_INBOX.>",
        "a b",
        "_INBOX..x",
        ".x",
        "x.",
        "\xff",
    };
    static const char *const origins[] = {"evil one", "o\r\n", "o.1", "", "*", ">"};
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    uint64_t h[2] = {11, 12}, seq = 0;
    hr_log_begin();
    size_t mark = hr_nsent;
    size_t nr = sizeof replies / sizeof replies[0], no = sizeof origins / sizeof origins[0];
    for (size_t i = 0; i < nr; i++) {
        struct kvr_request_record rec = {100 + i, 1, h, 2, 128, 0, false, 0, 0};
        hr_gossip("peer", 5, ++seq, &rec, replies[i], "peer");
    }
    for (size_t i = 0; i < no; i++) {
        struct kvr_request_record rec = {200 + i, 1, h, 2, 128, 0, false, 0, 0};
        hr_gossip("peer", 5, ++seq, &rec, "_INBOX.fine", origins[i]);
    }
    const char *log = hr_log_end();
    cr_assert(eq(u32, hr_rd.pend.n, 0), "none is pending: none could ever be answered");
    cr_assert(eq(u64, hr_stat("data.replication.gossip_bad"), nr + no));
    cr_assert(eq(u64, hr_stat("data.replication.imported"), 0));
    cr_assert(eq(sz, hr_nsent, mark));
    cr_assert(hr_log_lines_whole(log), "a log line was forged:\n%s", log);
    struct kvr_request_record ok = {300, 1, h, 2, 128, 0, false, 0, 0};
    hr_gossip("peer", 5, ++seq, &ok, "_INBOX.fine", "peer");
    cr_assert(eq(u32, hr_rd.pend.n, 1), "a good one is imported");
}

/* The time one gossip message took in its handler (lock included), in microseconds. */
static double gossip_us(const struct kvr_request_record *rec)
{
    uint64_t t0 = hr_now();
    hr_gossip("forger", 5, 1, rec, "_INBOX.f", "forger");
    return (double)(hr_now() - t0) / 1e3;
}

Test(hostile, lockup_a_decision_is_bounded_by_its_workers_capacity_and_the_output_limit)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    uint64_t h[2] = {11, 12}, blocks = 0;
    struct kvr_request_record rec = {99, 1, h, 2, 128, 0, true, UINT32_MAX, 0};
    double us = gossip_us(&rec); /* once a 2^32-step loop under the lock (~40 s) */
    cr_assert(eq(u64, hr_stat("data.replication.gossip_bad"), 1));
    kvr_router_worker_load(hr_rd.core, 1, &blocks, NULL, NULL);
    cr_assert(eq(u64, blocks, 0), "no phantom blocks");
    rec.output_blocks = 7; /* --max-output-tokens 256 of 64-token blocks: 6 at most */
    gossip_us(&rec);
    cr_assert(eq(u64, hr_stat("data.replication.gossip_bad"), 2));
    rec.output_blocks = 6; /* as many as the limit allows: taken, and that is all */
    double full_us = gossip_us(&rec);
    kvr_router_worker_load(hr_rd.core, 1, &blocks, NULL, NULL);
    cr_assert(eq(u64, blocks, 6 + 2), "its output blocks and its two prompt blocks");
    hr_heartbeat(2, 4, NULL, 0, 1000); /* a worker of 4 blocks: its capacity binds first */
    rec = (struct kvr_request_record){100, 2, h, 2, 128, 0, true, 5, 0};
    gossip_us(&rec);
    cr_assert(eq(u64, hr_stat("data.replication.gossip_bad"), 3));
    cr_log_info("decision, output_blocks 2^32-1: %.1f us (refused); 6 (the limit): %.1f us", us,
                full_us);
}

Test(hostile, lockup_a_decision_is_bounded_by_the_prompt_limit_and_blocks)
{
    hr_heartbeat(1, 8, NULL, 0, 1000);
    uint64_t h[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    struct kvr_request_record rec = {77, 1, h, 9, 576, 0, false, 0, 0}; /* 9 blocks, it has 8 */
    gossip_us(&rec);
    rec =
        (struct kvr_request_record){78, 1, h, 2, 8193, 0, false, 0, 0}; /* over the prompt limit */
    gossip_us(&rec);
    hr_heartbeat(2, 0, NULL, 0, 1000); /* no capacity announced: a prompt's worth, 65,536 */
    rec = (struct kvr_request_record){79, 2, h, 2, 128, 0, false, 65537, 0};
    gossip_us(&rec);
    cr_assert(eq(u64, hr_stat("data.replication.gossip_bad"), 3));
    cr_assert(eq(u32, hr_rd.pend.n, 0));
}

Test(hostile, lockup_a_sync_page_decision_is_bounded_the_same_way)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    uint64_t h[2] = {11, 12};
    struct kvr_request_record rec = {99, 1, h, 2, 128, 0, true, UINT32_MAX, 0};
    struct kvr_page pg;
    struct kvr_buf b = {0};
    kvr_page_init(&pg);
    cr_assert(eq(int, kvr_page_add_decision(&pg, &rec, "_INBOX.f", "f", "forger", 1, 0), KVR_OK));
    cr_assert(eq(int, kvr_page_encode(&pg, &b, true, 0), KVR_OK));
    uint64_t t0 = hr_now();
    kvr_sync_on_page(&hr_rd, b.data, b.len);
    double us = (double)(hr_now() - t0) / 1e3;
    cr_assert(eq(u64, hr_stat("data.replication.gossip_bad"), 1), "the page's decision refused");
    cr_assert(eq(u64, hr_stat("data.replication.imported"), 0));
    uint64_t blocks = 9;
    kvr_router_worker_load(hr_rd.core, 1, &blocks, NULL, NULL);
    cr_assert(eq(u64, blocks, 0));
    cr_log_info("sync page, output_blocks 2^32-1: %.1f us", us);
    kvr_page_free(&pg);
    kvr_buf_free(&b);
}

/* Once open: the bound was the capacity the worker's heartbeat announces, a value from the wire
 * too; a forged heartbeat announcing 2^40 blocks lifted it, and the next decision's output blocks
 * were looped over one by one under the lock. Now the prompt and output limits bound it too, and
 * output blocks are added in one step. */
Test(hostile, a_capacity_from_the_wire_does_not_lift_the_bound)
{
    hr_heartbeat(1, 1ull << 40, NULL, 0, 1000); /* forged: no pool has 2^40 blocks */
    uint64_t h[2] = {11, 12}, blocks = 0;
    struct kvr_request_record rec = {99, 1, h, 2, 128, 0, true, 1u << 18, 0};
    double us = gossip_us(&rec);
    kvr_router_worker_load(hr_rd.core, 1, &blocks, NULL, NULL);
    cr_assert(eq(u64, hr_stat("data.replication.gossip_bad"), 1), "refused");
    cr_assert(eq(u64, blocks, 0), "no phantom blocks");
    cr_log_info("2^18 output blocks under a 2^40-block capacity: refused in %.1f us", us);
}

/* The salt another process's daemon state drew: this very test, run alone in a child (this
 * binary, --filter), writes it to a file instead of checking. */
static uint64_t salt_of_another_process(void)
{
    char self[4096], out[] = "/tmp/kvr_salt_XXXXXX";
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1); /* valgrind: the client's */
    cr_assert(gt(sz, (size_t)(n > 0 ? n : 0), 0), "readlink /proc/self/exe");
    self[n] = 0;
    int fd = mkstemp(out);
    cr_assert(fd >= 0);
    close(fd);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (!pid) { /* a clean environment: none of the test runner's own (its child would take
                 * itself for one of the runner's workers) */
        char var[64];
        snprintf(var, sizeof var, "KVR_TEST_SALT_OUT=%s", out);
        char *const env[] = {var, NULL};
        int null = open("/dev/null", O_WRONLY); /* its report is the file */
        if (null >= 0) {
            dup2(null, 1);
            dup2(null, 2);
        }
        execle(self, self, "--filter=hostile/hash_flooding_the_daemon_salts_its_tables", "--jobs=1",
               (char *)NULL, env);
        _exit(127);
    }
    int st = 0;
    cr_assert(eq(int, waitpid(pid, &st, 0), pid));
    bool ran = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    cr_assert(ran, "the child run failed: status %#x", st);
    FILE *f = fopen(out, "r");
    unsigned long long v = 0;
    int got = f ? fscanf(f, "%llu", &v) : 0;
    if (f)
        fclose(f);
    unlink(out);
    cr_assert(eq(int, got, 1), "the child wrote no salt");
    return (uint64_t)v;
}

/* The salt is drawn per process (getrandom): a fixed one, even non-zero, is one an attacker can
 * aim keys at. Two processes' salts differ (equal by chance with probability 2^-64). */
Test(hostile, hash_flooding_the_daemon_salts_its_tables)
{
    const char *out = getenv("KVR_TEST_SALT_OUT");
    if (out) { /* the child of the run below: report, nothing else */
        FILE *f = fopen(out, "w");
        cr_assert(f != NULL);
        fprintf(f, "%llu\n", (unsigned long long)kvr_map_salt);
        cr_assert(eq(int, fclose(f), 0));
        return;
    }
    cr_assert(ne(u64, kvr_map_salt, 0), "keys from the wire are mixed with a random salt "
                                        "(the flood itself: test_map.c)");
    uint64_t other = salt_of_another_process();
    cr_assert(ne(u64, other, 0), "the other process salted too");
    cr_assert(ne(u64, other, kvr_map_salt),
              "two daemons drew the same salt (%llu): it is fixed, not random",
              (unsigned long long)other);
}

/* Still open: a heartbeat is believed. A forged one announcing one block makes a live worker
 * full (every request waits) until its real heartbeat; "draining", the same. */
Test(hostile, still_open_a_forged_heartbeat_makes_a_worker_look_full_until_its_next)
{
    hr_heartbeat(1, 64, NULL, 0, 1000);
    hr_generate("_INBOX.a", "runs", 1, 128, 8); /* 2 of its 64 blocks */
    hr_heartbeat(1, 1, NULL, 0, 1000);          /* forged: "1 block" */
    hr_generate("_INBOX.a", "waits", 2, 128, 8);
    cr_assert(eq(int, hr_count("kv.default.worker.1.generate", 0, NULL), 1), "not forwarded");
    cr_assert(eq(u32, kvr_router_queue_len(hr_rd.core), 1), "it waits");
    hr_heartbeat(1, 64, NULL, 0, 1000); /* the worker's own */
    kvr_timer_tick(&hr_rd, hr_now(), true, false);
    cr_assert(eq(int, hr_count("kv.default.worker.1.generate", 0, NULL), 2), "then it goes");
    struct kvr_wire_heartbeat d = {.info = {.id = 1, .block_size = 64, .capacity_blocks = 64},
                                   .interval_ms = 1000,
                                   .draining = true};
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&b, &d), KVR_OK));
    hr_event("kv.default.ev.1.hb", b.data, b.len); /* forged: "shutting down" */
    kvr_buf_free(&b);
    size_t mark = hr_nsent;
    hr_generate("_INBOX.b", "held", 3, 64, 8);
    cr_assert(eq(int, hr_count("kv.default.worker.1.generate", mark, NULL), 0),
              "not forwarded: it waits for a worker that takes requests");
    cr_assert(eq(int, hr_count("_INBOX.b", mark, NULL), 0), "and no error");
    cr_assert(eq(u32, kvr_router_queue_len(hr_rd.core), 1));
    hr_heartbeat(1, 64, NULL, 0, 1000);
    kvr_timer_tick(&hr_rd, hr_now(), true, false);
    cr_assert(eq(int, hr_count("kv.default.worker.1.generate", mark, NULL), 1));
}

/* A forged decision booking a worker full is the worker's own heartbeats' to undo: it does not
 * list the request, so after two strikes the booking is dropped (bounded: ~3 intervals). */
Test(hostile, forged_decisions_filling_a_worker_go_with_its_heartbeats)
{
    hr_cfg.heartbeat_min_ns = 1 * KVR_NS_PER_MS;
    hr_cfg.max_output_tokens = 8192; /* 63 output blocks are within the limit */
    kvr_fleet_destroy(&hr_rd);
    kvr_rd_free(&hr_rd);
    hr_start();
    hr_heartbeat(1, 64, NULL, 0, 20);
    uint64_t h[1] = {11};
    struct kvr_request_record rec = {4242, 1, h, 1, 64, 0, true, 63, 0}; /* 64 blocks: all it has */
    hr_gossip("forger", 5, 1, &rec, "_INBOX.nobody", "forger");
    hr_generate("_INBOX.a", "real", 1, 128, 8);
    cr_assert(eq(u32, kvr_router_queue_len(hr_rd.core), 1), "the real request waits");
    kvr_sleep_ns(45 * KVR_NS_PER_MS); /* past two intervals: the first strike */
    hr_heartbeat(1, 64, NULL, 0, 20);
    kvr_sleep_ns(25 * KVR_NS_PER_MS); /* half that later: the second */
    hr_heartbeat(1, 64, NULL, 0, 20);
    kvr_timer_tick(&hr_rd, hr_now(), true, false);
    cr_assert(eq(u64, hr_stat("data.replication.reconciled"), 1), "the forged booking is dropped");
    cr_assert(eq(int, hr_count("kv.default.worker.1.generate", 0, NULL), 1), "the real one goes");
}

/* Gossip's router id must be its subject's last token (so publish permissions can fence each
 * router to its own subject). Within that, a forged hello with a later epoch on a router's own
 * subject makes the real router's gossip stale, but only while the forger keeps talking: once it
 * has been silent for 3.5 hellos, the real router's older epoch is taken again. */
Test(hostile, a_newer_epoch_under_another_routers_id_holds_while_its_forger_talks)
{
    hr_cfg.hello_ns = 20 * KVR_NS_PER_MS; /* silent after 70 ms */
    kvr_fleet_destroy(&hr_rd);
    kvr_rd_free(&hr_rd);
    hr_start();
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    uint64_t h[2] = {11, 12};
    hr_hello("r2", 100, 0);
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, "r2", UINT64_MAX, 0, true), KVR_OK));
    hr_on_gossip("r3", b.data, b.len); /* r2's id on r3's subject: refused */
    cr_assert(eq(u64, hr_stat("data.replication.gossip_bad"), 1));
    hr_on_gossip("r2", b.data, b.len); /* forged on r2's own subject: taken */
    kvr_buf_free(&b);
    struct kvr_request_record rec = {501, 1, h, 2, 128, 0, false, 0, 0};
    hr_gossip("r2", 100, 1, &rec, "_INBOX.c", "r2"); /* the real router's, at once */
    cr_assert(eq(u64, hr_stat("data.replication.gossip_stale"), 1), "taken for stale");
    cr_assert(eq(u64, hr_stat("data.replication.imported"), 0));
    kvr_sleep_ns(100 * KVR_NS_PER_MS); /* the forger is silent */
    rec.request_id = 502;
    hr_gossip("r2", 100, 2, &rec, "_INBOX.c", "r2");
    cr_assert(eq(u64, hr_stat("data.replication.peer_epochs_back"), 1));
    cr_assert(eq(u64, hr_stat("data.replication.imported"), 1), "the real router heard again");
}

/* Once open: anyone could ask for a snapshot, which lists every client's reply subject and id.
 * Now a snapshot goes only to the pages subject of the router that asks (which permissions fence).
 */
Test(hostile, a_snapshot_goes_to_a_routers_own_pages_subject_only)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    hr_generate("_INBOX.victim.7", "secret-id", 1, 128, 8);
    struct kvr_wire_sync q = {.full = true, .token = 5};
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    size_t mark = hr_nsent;
    uint64_t bad = hr_stat("data.replication.gossip_bad");
    kvr_sync_on_request(&hr_rd, "_INBOX.attacker", b.data, b.len);
    q.router_id = "r9"; /* a router's id, but not its subject */
    cr_assert(eq(int, kvr_wire_encode_sync(&b, &q), KVR_OK));
    kvr_sync_on_request(&hr_rd, "_INBOX.attacker", b.data, b.len);
    cr_assert(eq(sz, hr_nsent, mark), "nothing to the attacker");
    cr_assert(eq(u64, hr_stat("data.replication.gossip_bad"), bad + 2), "counted");
    cr_assert(eq(u64, hr_stat("data.replication.snapshots_served"), 0));
    kvr_sync_on_request(&hr_rd, "kv.default.router.pages.r9", b.data, b.len);
    const struct hr_sent *m = NULL;
    cr_assert(eq(int, hr_count("kv.default.router.pages.r9", mark, &m), 1), "a router's: served");
    cr_assert(not(eq(ptr, memmem(m->data, m->len, "_INBOX.victim.7", 15), NULL)));
    kvr_buf_free(&b);
}

Test(hostile, an_answer_never_goes_into_the_fleets_own_subjects)
{
    /* a client may publish $SRV requests (deploy/least-privilege.conf) and anyone on the digest
     * subject: their reply subject is theirs to choose, so the fleet's own are refused there as
     * for a generate */
    struct kvr_service svc;
    kvr_api_init(&svc, &hr_rd);
    static const char *const bad[] = {"kv.default.worker.1.generate", "kv.default.router.gossip.r1",
                                      "kv.default.worker.announce", "$SYS.REQ.SERVER.PING"};
    size_t mark = hr_nsent;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvr_api_on_srv(&hr_rd, &svc, "$SRV.PING", bad[i]);
        kvr_api_on_srv(&hr_rd, &svc, "$SRV.STATS.kvrouter", bad[i]);
        kvr_api_on_digest(&hr_rd, bad[i]);
    }
    cr_assert(eq(sz, hr_nsent, mark), "%zu answers into the fleet's subjects", hr_nsent - mark);
    cr_assert(eq(u64, hr_stat("data.answers_refused"), 12));
    kvr_api_on_srv(&hr_rd, &svc, "$SRV.PING", "_INBOX.ops.1");
    kvr_api_on_digest(&hr_rd, "_INBOX.ops.2");
    cr_assert(eq(int, hr_count("_INBOX.ops.1", mark, NULL), 1), "an inbox is answered");
    cr_assert(eq(int, hr_count("_INBOX.ops.2", mark, NULL), 1));
}

Test(hostile, lying_heartbeats_are_taken_within_bounds)
{
    hr_cfg.heartbeat_min_ns = 50 * KVR_NS_PER_MS; /* the defaults */
    hr_cfg.heartbeat_max_ns = 10 * KVR_NS_PER_S;
    kvr_fleet_destroy(&hr_rd);
    kvr_rd_free(&hr_rd);
    hr_start();
    hr_heartbeat(7, 4096, NULL, 0, UINT32_MAX); /* a worker nobody runs, "every 49 days" */
    hr_heartbeat(8, 4096, NULL, 0, 500);        /* a live worker ... */
    hr_heartbeat(8, 4096, NULL, 0, 1);          /* ... and a forged beat: "every 1 ms" */
    hr_heartbeat(9, 4096, NULL, 0, 0);          /* no interval: the router's --worker-timeout */
    uint64_t t = hr_now();
    kvr_timer_tick(&hr_rd, t, true, false);
    kvr_timer_tick(&hr_rd, t + 100 * KVR_NS_PER_MS, true, false);
    cr_assert(eq(int, kvr_router_worker_load(hr_rd.core, 8, NULL, NULL, NULL), KVR_OK),
              "a known worker's timeout never shrinks");
    uint64_t ms = 500;
    for (; ms <= 3500; ms += 500) /* ticks on time, no stall */
        kvr_timer_tick(&hr_rd, t + ms * KVR_NS_PER_MS, true, false);
    cr_assert(
        eq(int, kvr_router_worker_load(hr_rd.core, 9, NULL, NULL, NULL), KVR_ERR_UNKNOWN_WORKER),
        "no interval: gone after 3.2 s");
    for (; ms <= 33000; ms += 500)
        kvr_timer_tick(&hr_rd, t + ms * KVR_NS_PER_MS, true, false);
    cr_assert(
        eq(int, kvr_router_worker_load(hr_rd.core, 7, NULL, NULL, NULL), KVR_ERR_UNKNOWN_WORKER),
        "gone after 3.2 times the longest interval taken (10 s)");
    cr_assert(eq(u64, hr_stat("data.workers_left"), 3));
}
