/*
 * How long one message holds the router's state mutex (issue 10: "no lock held over 1 ms by one
 * message"). The router daemon's handlers run on a state like kvrouter's (8 workers of 16,384
 * blocks, gossip on, a sink that publishes nothing), fed real protobuf bytes: for each kind, the
 * largest single message the decoders and the checks let through, and an ordinary one. The mutex
 * is timed exactly: the program is linked with --wrap=pthread_mutex_lock/unlock, and the wrappers
 * time every hold of the state's mutex (rd.mu) from acquired to released. A handler may take it
 * more than once (its step, then the flush); the figure is the longest single hold per message.
 * Prints, per case, the median and maximum over the repeats in microseconds, the ratio of the
 * median to the ordinary message's and whether the maximum is over 1 ms. A benchmark, not a test:
 * nothing is asserted. Usage: bench_hostile [--quick]
 */
#define _DEFAULT_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "clock.h"
#include "codec.h"
#include "events.h"
#include "fleet.h"
#include "intake.h"
#include "kvr/hash.h"
#include "kvr/rng.h"
#include "log.h"
#include "pending.h"
#include "state.h"
#include "sync.h"

/* --- the mutex, timed ------------------------------------------------------------------------ */

int __real_pthread_mutex_lock(pthread_mutex_t *m);
int __real_pthread_mutex_unlock(pthread_mutex_t *m);
int __wrap_pthread_mutex_lock(pthread_mutex_t *m);
int __wrap_pthread_mutex_unlock(pthread_mutex_t *m);

static pthread_mutex_t *watched; /* the state's mutex; the bench is single-threaded */
static uint64_t held_since, longest;

int __wrap_pthread_mutex_lock(pthread_mutex_t *m)
{
    int rc = __real_pthread_mutex_lock(m);
    if (m == watched)
        held_since = kvr_now_ns();
    return rc;
}

int __wrap_pthread_mutex_unlock(pthread_mutex_t *m)
{
    if (m == watched && held_since) {
        uint64_t d = kvr_now_ns() - held_since;
        longest = d > longest ? d : longest;
        held_since = 0;
    }
    return __real_pthread_mutex_unlock(m);
}

/* --- the router under test ------------------------------------------------------------------- */

#define WORKERS  8
#define CAPACITY 16384u /* kvworker's default pool, in 64-token blocks */

static struct kvr_rd_config cfg;
static struct kvr_rd rd;
static uint64_t serial = 1; /* makes every prompt, key and hash of the run new */

static kvr_status sink_nothing(void *ctx, const struct kvr_outmsg *m)
{
    (void)ctx;
    (void)m;
    return KVR_OK;
}

static void heartbeat(uint64_t wid, uint64_t capacity, const uint64_t *keys, uint32_t n)
{
    struct kvr_wire_heartbeat h = {
        .info = {.id = wid, .block_size = 64, .capacity_blocks = capacity},
        .inflight = (uint64_t *)keys,
        .ninflight = n,
        .interval_ms = 1000};
    struct kvr_buf b = {0};
    char subject[64];
    snprintf(subject, sizeof subject, "kv.default.ev.%" PRIu64 ".hb", wid);
    if (kvr_wire_encode_heartbeat(&b, &h) == KVR_OK)
        kvr_events_on_message(&rd, subject, b.data, b.len);
    kvr_buf_free(&b);
}

static void router_start(void)
{
    kvr_log_init("bench_hostile", KVR_LOG_ERROR);
    kvr_rd_config_default(&cfg);
    strcpy(cfg.id, "bench");
    if (kvr_rd_init(&rd, &cfg, (struct kvr_sink){.publish = sink_nothing, .ctx = NULL}) != KVR_OK ||
        kvr_fleet_create(&rd) != KVR_OK) {
        fprintf(stderr, "bench_hostile: no router state\n");
        exit(1);
    }
    rd.fleet->synced = true;
    rd.serving = true;
    watched = &rd.mu;
    for (uint64_t w = 1; w <= WORKERS; w++)
        heartbeat(w, CAPACITY, NULL, 0);
}

static void done(uint64_t wid, uint64_t key)
{
    struct kvr_buf b = {0};
    char subject[64];
    snprintf(subject, sizeof subject, "kv.default.ev.%" PRIu64 ".done", wid);
    if (kvr_wire_encode_done(&b, wid, key, KVR_OK, 1) == KVR_OK)
        kvr_events_on_message(&rd, subject, b.data, b.len);
    kvr_buf_free(&b);
}

/* Every request in flight ends (its worker's done), so each repeat starts from the same state. */
static void end_all(void)
{
    for (uint32_t guard = rd.pend.n + 1; rd.pend.head && guard; guard--) {
        const struct kvr_pending *p = rd.pend.head;
        done(p->worker_id ? p->worker_id : 1, p->key);
    }
}

/* --- cases ----------------------------------------------------------------------------------- */

struct result {
    double median_us, max_us;
    size_t bytes;
};

/* Run one message of a case: make its bytes into b (not timed), hand them to the handler (timed
 * by the mutex wrappers), clean up after it (not timed). */
struct kind {
    const char *name;
    void (*make)(struct kvr_buf *b, uint32_t size);
    void (*deliver)(const struct kvr_buf *b);
    void (*after)(void);
};

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static struct result measure(const struct kind *k, uint32_t size, int repeats)
{
    uint64_t *t = calloc((size_t)repeats, sizeof *t);
    struct kvr_buf b = {0};
    struct result r = {0};
    for (int i = 0; i < repeats; i++) {
        k->make(&b, size);
        r.bytes = b.len;
        longest = 0;
        k->deliver(&b);
        t[i] = longest;
        if (k->after)
            k->after();
    }
    qsort(t, (size_t)repeats, sizeof *t, cmp_u64);
    r.median_us = (double)t[repeats / 2] / 1e3;
    r.max_us = (double)t[repeats - 1] / 1e3;
    free(t);
    kvr_buf_free(&b);
    return r;
}

/* A request of n fresh tokens (a new prompt every time: nothing cached, every block new). */
static void make_generate(struct kvr_buf *b, uint32_t n)
{
    uint32_t *t = malloc((size_t)n * sizeof *t);
    for (uint32_t i = 0; i < n; i++)
        t[i] = (uint32_t)(kvr_mix64(serial * 1000003u + i) % 128000);
    char id[32];
    snprintf(id, sizeof id, "bench-%" PRIu64, serial++);
    kvr_wire_encode_generate(b, id, t, n, 16, NULL);
    free(t);
}

static void deliver_generate(const struct kvr_buf *b)
{
    kvr_intake_generate(&rd, "_INBOX.bench", b->data, b->len);
}

static void deliver_select(const struct kvr_buf *b)
{
    struct kvr_buf s = {0};
    if (kvr_wire_encode_select_request(&s, b->data, b->len, true) == KVR_OK)
        kvr_intake_select(&rd, "_INBOX.bench", s.data, s.len);
    kvr_buf_free(&s);
}

static uint64_t hashes[65536];

/* A peer's decision for worker 1 of n blocks, and as many output blocks (at most the capacity
 * of the worker it names, which is what the import allows). */
static void make_decision(struct kvr_buf *b, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        hashes[i] = kvr_mix64(serial * 65537u + i);
    struct kvr_request_record rec = {serial, 1, hashes, n, n * 64u, 0, true, n, 0};
    kvr_wire_encode_gossip_decision(b, "peer", 5, serial, &rec, "_INBOX.bench", "c", "peer", 1, 0);
    serial++;
}

static void deliver_gossip(const struct kvr_buf *b)
{
    kvr_fleet_on_gossip(&rd, "kv.default.router.gossip.peer", b->data, b->len);
}

/* A page of n decisions of 4 blocks each (n = 1: an ordinary repair). */
static void make_page(struct kvr_buf *b, uint32_t n)
{
    struct kvr_page pg;
    kvr_page_init(&pg);
    uint64_t h[4];
    for (uint32_t i = 0; i < n; i++, serial++) {
        for (int j = 0; j < 4; j++)
            h[j] = kvr_mix64(serial * 5u + (uint64_t)j);
        struct kvr_request_record rec = {serial, 1 + i % WORKERS, h, 4, 256, 0, true, 0, 0};
        kvr_page_add_decision(&pg, &rec, "_INBOX.bench", "c", "peer", 1, 0);
    }
    kvr_page_encode(&pg, b, false, 0);
    kvr_page_free(&pg);
}

/* A page of one decision of n blocks and n output blocks (n at most the worker's capacity). */
static void make_page_wide(struct kvr_buf *b, uint32_t n)
{
    struct kvr_page pg;
    kvr_page_init(&pg);
    for (uint32_t i = 0; i < n; i++)
        hashes[i] = kvr_mix64(serial * 65537u + i);
    struct kvr_request_record rec = {serial++, 1, hashes, n, n * 64u, 0, true, n, 0};
    kvr_page_add_decision(&pg, &rec, "_INBOX.bench", "c", "peer", 1, 0);
    kvr_page_encode(&pg, b, false, 0);
    kvr_page_free(&pg);
}

static void deliver_page(const struct kvr_buf *b)
{
    kvr_sync_on_page(&rd, b->data, b->len);
}

/* A page of n index entries, taken while a snapshot is awaited. */
static void make_entries(struct kvr_buf *b, uint32_t n)
{
    struct kvr_page pg;
    kvr_page_init(&pg);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t seq = kvr_mix64(serial++);
        struct kvr_index_record e = {1 + i % WORKERS, seq, true, serial, 0};
        kvr_page_add_entry(&pg, &e);
    }
    kvr_page_encode(&pg, b, false, 77);
    kvr_page_free(&pg);
}

static void deliver_entries(const struct kvr_buf *b)
{
    rd.fleet->syncing = true;
    rd.fleet->sync_token = 77;
    kvr_sync_on_page(&rd, b->data, b->len);
    rd.fleet->syncing = false;
}

static void clear_index(void)
{
    pthread_mutex_lock(&rd.mu);
    kvr_router_index_clear(rd.core);
    pthread_mutex_unlock(&rd.mu);
}

/* A peer's full snapshot request, the index first filled with n entries spread over the workers
 * (Stored events of 4,096 blocks at most, as workers send them; not timed): serving it walks
 * every entry and every request in flight. */
static void make_snapshot_ask(struct kvr_buf *b, uint32_t n)
{
    struct kvr_kv_block *blk = malloc((size_t)KVR_WIRE_STORED_BLOCKS_MAX * sizeof *blk);
    struct kvr_buf ev = {0};
    for (uint32_t at = 0, w = 1; at < n; w = w % WORKERS + 1) {
        uint32_t k = n - at < KVR_WIRE_STORED_BLOCKS_MAX ? n - at : KVR_WIRE_STORED_BLOCKS_MAX;
        for (uint32_t i = 0; i < k; i++)
            blk[i] = (struct kvr_kv_block){serial * 100000u + i, kvr_mix64(serial * 7u + i)};
        if (kvr_wire_encode_stored(&ev, w, serial++, NULL, blk, k) == KVR_OK) {
            char subject[64];
            snprintf(subject, sizeof subject, "kv.default.ev.%" PRIu32 ".kv", w);
            kvr_events_on_message(&rd, subject, ev.data, ev.len);
        }
        at += k;
    }
    free(blk);
    kvr_buf_free(&ev);
    struct kvr_wire_sync q = {.router_id = "peer", .full = true, .token = serial++};
    kvr_wire_encode_sync(b, &q);
}

static void deliver_snapshot_ask(const struct kvr_buf *b)
{
    kvr_sync_on_request(&rd, "kv.default.router.pages.peer", b->data, b->len);
}

/* A digest request (its payload is not read), the index first filled as for a snapshot. */
static void deliver_digest_ask(const struct kvr_buf *b)
{
    (void)b;
    kvr_api_on_digest(&rd, "_INBOX.bench");
}

/* Worker 1's heartbeat listing n keys in flight it holds (fresh keys nobody knows) and n / 4 it
 * ended, at most the caps. */
static void make_heartbeat(struct kvr_buf *b, uint32_t n)
{
    uint32_t nended = n / 4 < KVR_WIRE_ENDED_MAX ? n / 4 : KVR_WIRE_ENDED_MAX;
    uint64_t *keys = malloc(((size_t)n + nended + 1) * sizeof *keys);
    for (uint32_t i = 0; i < n + nended; i++)
        keys[i] = kvr_mix64(serial++);
    struct kvr_wire_heartbeat h = {.info = {.id = 1, .block_size = 64, .capacity_blocks = CAPACITY},
                                   .inflight = keys,
                                   .ninflight = n,
                                   .ended = keys + n,
                                   .nended = nended,
                                   .interval_ms = 1000};
    kvr_wire_encode_heartbeat(b, &h);
    free(keys);
}

static void deliver_event(const struct kvr_buf *b, const char *kind)
{
    char subject[64];
    snprintf(subject, sizeof subject, "kv.default.ev.1.%s", kind);
    kvr_events_on_message(&rd, subject, b->data, b->len);
}

static void deliver_heartbeat(const struct kvr_buf *b)
{
    deliver_event(b, "hb");
}

/* Worker 1's Stored event of n new blocks (a chain, no parent). */
static void make_stored(struct kvr_buf *b, uint32_t n)
{
    struct kvr_kv_block *blk = malloc((size_t)n * sizeof *blk);
    for (uint32_t i = 0; i < n; i++)
        blk[i] = (struct kvr_kv_block){serial * 100000u + i, kvr_mix64(serial * 7u + i)};
    kvr_wire_encode_stored(b, 1, serial++, NULL, blk, n);
    free(blk);
}

static void deliver_kv(const struct kvr_buf *b)
{
    deliver_event(b, "kv");
}

/* --- the report ------------------------------------------------------------------------------ */

struct row {
    const struct kind *kind;
    const char *what;
    uint32_t ordinary, worst; /* sizes passed to make */
};

static const struct kind k_generate = {"generate", make_generate, deliver_generate, end_all};
static const struct kind k_select = {"select (booked)", make_generate, deliver_select, end_all};
static const struct kind k_decision = {"gossip decision", make_decision, deliver_gossip, end_all};
static const struct kind k_page = {"sync page (decisions)", make_page, deliver_page, end_all};
static const struct kind k_wide = {"sync page (1 wide decision)", make_page_wide, deliver_page,
                                   end_all};
static const struct kind k_entries = {"sync page (entries)", make_entries, deliver_entries,
                                      clear_index};
static const struct kind k_heartbeat = {"heartbeat", make_heartbeat, deliver_heartbeat, NULL};
static const struct kind k_stored = {"kv stored", make_stored, deliver_kv, clear_index};
static const struct kind k_snapshot = {"sync request (snapshot)", make_snapshot_ask,
                                       deliver_snapshot_ask, clear_index};
static const struct kind k_digest = {"digest request", make_snapshot_ask, deliver_digest_ask,
                                     clear_index};

static const struct row rows[] = {
    {&k_generate, "tokens: 512 / 1,048,576 (the prompt limit)", 512, 1u << 20},
    {&k_select, "tokens: 512 / 1,048,576", 512, 1u << 20},
    {&k_decision, "blocks + output blocks: 8 / 16,384 (the worker's capacity)", 8, CAPACITY},
    {&k_wide, "blocks + output blocks: 8 / 16,384", 8, CAPACITY},
    {&k_page, "decisions: 1 / 512 (the decoder's cap, as routers cut pages)", 1,
     KVR_WIRE_PAGE_ITEMS_MAX},
    {&k_entries, "entries: 8 / 512 (the decoder's cap)", 8, KVR_WIRE_PAGE_ITEMS_MAX},
    {&k_heartbeat, "keys held: 8 / 65,536 (+ ended: 2 / 16,384)", 8, 65536},
    {&k_stored, "blocks: 8 / 4,096 (the decoder's cap)", 8, KVR_WIRE_STORED_BLOCKS_MAX},
    {&k_snapshot, "index entries served: 512 / 131,072 (8 x 16,384: every block cached)", 512,
     WORKERS *CAPACITY},
    {&k_digest, "index entries digested: 512 / 131,072", 512, WORKERS *CAPACITY},
};

static void report(const struct row *r, int repeats_ordinary, int repeats_worst)
{
    struct result o = measure(r->kind, r->ordinary, repeats_ordinary);
    struct result w = measure(r->kind, r->worst, repeats_worst);
    double ratio = o.median_us > 0 ? w.median_us / o.median_us : 0;
    double per_item_ns = w.median_us * 1e3 / r->worst; /* what 1 ms holds, in items */
    printf("%-28s %-60s ordinary %7.1f us (max %7.1f, %zu B) | worst %9.1f us (max %9.1f, "
           "%zu B) | x%.0f | %.0f ns/item, %.0f items/ms%s\n",
           r->kind->name, r->what, o.median_us, o.max_us, o.bytes, w.median_us, w.max_us, w.bytes,
           ratio, per_item_ns, 1e6 / per_item_ns, w.max_us > 1000 ? " | OVER 1 ms" : "");
}

/* Once open: a capacity from a forged heartbeat lifted the decision bound. A decision of 2^20
 * output blocks under a 2^40-block capacity: now refused by the output limit. */
static void report_open(void)
{
    heartbeat(1, 1ull << 40, NULL, 0);
    struct kvr_buf b = {0};
    uint64_t h[2] = {serial, serial + 1};
    struct kvr_request_record rec = {serial++, 1, h, 2, 128, 0, true, 1u << 20, 0};
    kvr_wire_encode_gossip_decision(&b, "peer", 5, serial, &rec, "_INBOX.bench", "c", "peer", 1, 0);
    longest = 0;
    deliver_gossip(&b);
    end_all();
    kvr_buf_free(&b);
    heartbeat(1, CAPACITY, NULL, 0);
    printf("a decision of 2^20 output blocks for a worker whose forged heartbeat announced 2^40 "
           "blocks (refused by the output limit): held the lock %.1f us\n",
           (double)longest / 1e3);
}

int main(int argc, char **argv)
{
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    router_start();
    printf("longest single hold of the router's mutex per message, median and max over repeats "
           "(%s)\n",
           quick ? "--quick" : "full");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        report(&rows[i], quick ? 50 : 500, quick ? 3 : 15);
    report_open();
    kvr_fleet_destroy(&rd);
    kvr_rd_free(&rd);
    return 0;
}
