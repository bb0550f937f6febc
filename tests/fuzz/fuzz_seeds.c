/*
 * Seed corpora for the fuzz targets, written with the encoders so each target starts from valid
 * messages: fuzz_seeds DIR writes DIR/<target>/seed-<n> for every decoder target. Nothing binary
 * is committed; scripts/test.sh runs this before the fuzz targets.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codec.h"
#include "kvr/policy.h"

static const char *root;
static int failed;

static void put(const char *target, int n, const struct kvr_buf *b)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        failed = 1;
        return;
    }
    snprintf(path, sizeof path, "%s/%s/seed-%d", root, target, n);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b->data, 1, b->len, f) != b->len || fclose(f) != 0) {
        perror(path);
        failed = 1;
    }
}

static void check(kvr_status st, const char *what)
{
    if (st != KVR_OK) {
        fprintf(stderr, "fuzz_seeds: encoding %s: %s\n", what, kvr_status_str(st));
        failed = 1;
    }
}

static uint32_t tokens[64];

/* Three GenerateRequests: plain, with every override, with a long prompt; also wrapped. */
static void requests(void)
{
    struct kvr_buf b = {0}, w = {0};
    struct kvr_overrides all = {KVR_OV_POLICY | KVR_OV_OVERLAP_WEIGHT | KVR_OV_TEMPERATURE,
                                KVR_POLICY_CHWBL, 2.5, 0.5};
    struct kvr_overrides pol = {KVR_OV_POLICY, KVR_POLICY_SGLANG, 0, 0};
    const struct {
        const char *id;
        uint32_t n, max;
        const struct kvr_overrides *ov;
    } r[] = {{"req-1", 8, 4, NULL}, {"req-2", 12, 16, &all}, {"req-3", 64, 100, &pol}};
    for (int i = 0; i < 3; i++) {
        check(kvr_wire_encode_generate(&b, r[i].id, tokens, r[i].n, r[i].max, r[i].ov), "generate");
        put("generate", i, &b);
        check(kvr_wire_encode_worker_generate(&w, b.data, b.len, 1000 + (uint64_t)i, 2, "r1", 0),
              "worker_generate");
        put("worker_generate", i, &w);
        check(kvr_wire_encode_select_request(&w, b.data, b.len, i % 2 == 0), "select");
        put("select", i, &w);
    }
    kvr_buf_free(&b);
    kvr_buf_free(&w);
}

/* Worker events: responses, KV events, tokens, done, heartbeats. */
static void events(void)
{
    struct kvr_buf b = {0};
    check(kvr_wire_encode_chunk(&b, &(struct kvr_wire_chunk){.request_id = "req-1",
                                                             .tokens = tokens,
                                                             .ntokens = 3,
                                                             .worker_id = 7,
                                                             .cached_tokens = 32}),
          "response");
    put("response", 0, &b);
    check(kvr_wire_encode_chunk(&b, &(struct kvr_wire_chunk){.request_id = "req-1",
                                                             .final = true,
                                                             .error = KVR_ERR_OVERLOADED,
                                                             .worker_id = 0}),
          "response");
    put("response", 1, &b);
    struct kvr_kv_block blocks[4] = {{1, 0x1111}, {2, 0x2222}, {3, 0x3333}, {4, 0x4444}};
    uint64_t parent = 9, ids[3] = {1, 2, 3};
    check(kvr_wire_encode_stored(&b, 7, 1, NULL, blocks, 4), "stored");
    put("kv", 0, &b);
    check(kvr_wire_encode_stored(&b, 7, 2, &parent, blocks, 2), "stored");
    put("kv", 1, &b);
    check(kvr_wire_encode_removed(&b, 7, 3, ids, 3), "removed");
    put("kv", 2, &b);
    check(kvr_wire_encode_cleared(&b, 7, 4), "cleared");
    put("kv", 3, &b);
    check(kvr_wire_encode_tokens(&b, 7, 1000, KVR_WIRE_PREFILL_DONE), "tokens");
    put("tokens", 0, &b);
    check(kvr_wire_encode_tokens(&b, 7, 1000, KVR_WIRE_OUTPUT_BLOCK), "tokens");
    put("tokens", 1, &b);
    check(kvr_wire_encode_done(&b, 7, 1000, 0, 0), "done");
    put("done", 0, &b);
    check(kvr_wire_encode_done(&b, 7, 1001, KVR_ERR_WORKER_LOST, 0), "done");
    put("done", 1, &b);
    struct kvr_wire_event ev[3] = {
        {.kind = KVR_WIRE_EV_TOKENS}, {.kind = KVR_WIRE_EV_TOKENS}, {.kind = KVR_WIRE_EV_DONE}};
    ev[0].u.tokens = (struct kvr_wire_tokens){7, 1000, KVR_WIRE_PREFILL_DONE};
    ev[1].u.tokens = (struct kvr_wire_tokens){7, 1000, KVR_WIRE_OUTPUT_BLOCK};
    ev[2].u.done = (struct kvr_wire_done){7, 1000, 0, 17};
    check(kvr_wire_encode_batch(&b, 7, ev, 3), "batch");
    put("batch", 0, &b);
    check(kvr_wire_encode_batch(&b, 7, ev + 2, 1), "batch");
    put("batch", 1, &b);
    check(kvr_wire_encode_cancel(&b, "req-1", "_INBOX.x"), "cancel");
    put("cancel", 0, &b);
    struct kvr_wire_worker_cancel wc = {1000, KVR_ERR_CANCELLED, false};
    check(kvr_wire_encode_worker_cancel(&b, &wc, "r1"), "worker_cancel");
    put("worker_cancel", 0, &b);
    wc.reason = KVR_ERR_DEADLINE;
    wc.silent = true;
    check(kvr_wire_encode_worker_cancel(&b, &wc, "r1"), "worker_cancel");
    put("worker_cancel", 1, &b);
    struct kvr_wire_heartbeat h = {
        {7, 16, 4096, 2, 0.25, 0, false, false}, ids, 3, 1000, false, 9, 1, ids, 2, 42, 3};
    check(kvr_wire_encode_heartbeat(&b, &h), "heartbeat");
    put("heartbeat", 0, &b);
    h.ninflight = 0;
    h.draining = true;
    check(kvr_wire_encode_heartbeat(&b, &h), "heartbeat");
    put("heartbeat", 1, &b);
    kvr_buf_free(&b);
}

/* A decision with candidates, and an error. */
static void select_responses(void)
{
    struct kvr_buf b = {0};
    uint64_t ids[3] = {7, 8, 9};
    double costs[3] = {1.5, 2.5, 3.5};
    struct kvr_candidate cand[3] = {{.worker_id = 7, .overlap_blocks = 2, .cost = 1.5},
                                    {.worker_id = 8, .cost = 2.5, .busy = true},
                                    {.worker_id = 9, .inflight = 3, .cost = 3.5}};
    struct kvr_decision d = {.request_id = 1000,
                             .worker_id = 7,
                             .policy = KVR_POLICY_KV,
                             .overlap_blocks = 2,
                             .cost = 1.5,
                             .ncandidates = 3,
                             .worker_ids = ids,
                             .costs = costs,
                             .candidates = cand};
    check(kvr_wire_encode_select_response(&b, &d, 1000, KVR_OK, "r1", NULL), "select_response");
    put("select_response", 0, &b);
    check(kvr_wire_encode_select_response(&b, NULL, 0, KVR_ERR_NO_WORKERS, "r1", NULL),
          "select_response");
    put("select_response", 1, &b);
    kvr_buf_free(&b);
}

/* Replication: gossip, sync requests, pages. */
static void replicas(void)
{
    struct kvr_buf b = {0};
    uint64_t hashes[4] = {0xa1, 0xa2, 0xa3, 0xa4}, keys[2] = {1000, 1001};
    struct kvr_request_record rec = {1000, 7, hashes, 4, 64, 2, true, 3, 0};
    check(kvr_wire_encode_gossip_decision(&b, "r1", 5, 1, &rec, "_INBOX.x", "req-1", "r1", 0, 0),
          "gossip");
    put("gossip", 0, &b);
    check(kvr_wire_encode_gossip_hello(&b, "r2", 6, 9, true), "gossip");
    put("gossip", 1, &b);
    struct kvr_wire_queued q = {"_INBOX.q", "req-2", 123, 5000, true, KVR_ERR_OVERLOADED};
    check(kvr_wire_encode_gossip_queued(&b, "r2", 6, 9, &q), "gossip");
    put("gossip", 2, &b);
    struct kvr_wire_sync s = {"r1", true, NULL, 0, 0, 0, 5, 77};
    check(kvr_wire_encode_sync(&b, &s), "sync");
    put("sync", 0, &b);
    s = (struct kvr_wire_sync){"r2", false, keys, 2, 3, 9, 5, 78};
    check(kvr_wire_encode_sync(&b, &s), "sync");
    put("sync", 1, &b);
    struct kvr_page p;
    kvr_page_init(&p);
    struct kvr_index_record e1 = {7, 0xa1, true, 1, 0}, e2 = {8, 0xa2, false, 0, 5000000000ull};
    check(kvr_page_add_decision(&p, &rec, "_INBOX.x", "req-1", "r1", 0, 0), "page");
    check(kvr_page_add_entry(&p, &e1), "page");
    check(kvr_page_add_entry(&p, &e2), "page");
    check(kvr_page_encode(&p, &b, false, 77), "page");
    put("page", 0, &b);
    p.index_partial = true;
    check(kvr_page_encode(&p, &b, true, 77), "page");
    put("page", 1, &b);
    kvr_page_free(&p);
    kvr_buf_free(&b);
}

/* A framed message for the handler targets: kind, length (u16 le), bytes. */
static void frame(struct kvr_buf *seq, int kind, const struct kvr_buf *m)
{
    size_t at = seq->len, n = m->len > 0xffff ? 0xffff : m->len;
    check(kvr_buf_reserve(seq, at + (kind >= 0) + 2 + n), "frame");
    if (kind >= 0)
        seq->data[at++] = (uint8_t)kind;
    seq->data[at++] = (uint8_t)(n & 0xff);
    seq->data[at++] = (uint8_t)(n >> 8);
    memcpy(seq->data + at, m->data, n);
    seq->len = at + n;
}

enum {
    H_GENERATE = 0,
    H_SELECT = 1,
    H_EVENT = 2,
    H_GOSSIP = 4,
    H_SYNC = 5,
    H_PAGE = 6,
    H_SRV = 7,
    H_DIGEST = 8,
    H_TICK = 9,
    H_CANCEL = 10
};
enum { EV_KV = 0, EV_TOKENS = 1, EV_DONE = 2, EV_HB = 3 };

#define EVENT(worker, ev) (H_EVENT | ((worker)-1) << 4 | (ev) << 6)

/* Sequences of messages for fuzz_routerd and fuzz_worker (framing: see those targets). */
static void handlers(void)
{
    struct kvr_buf seq = {0}, m = {0}, w = {0}, none = {0};
    struct kvr_kv_block blocks[2] = {{0xb1, 0xc1}, {0xb2, 0xc2}};
    check(kvr_buf_reserve(&none, 1), "none");
    check(kvr_wire_encode_generate(&m, "req-1", tokens, 40, 4, NULL), "generate");
    frame(&seq, H_GENERATE, &m);
    check(kvr_wire_encode_stored(&w, 1, 1, NULL, blocks, 2), "kv");
    frame(&seq, EVENT(1, EV_KV), &w);
    check(kvr_wire_encode_tokens(&w, 1, 1000, KVR_WIRE_PREFILL_DONE), "tokens");
    frame(&seq, EVENT(1, EV_TOKENS), &w);
    check(kvr_wire_encode_done(&w, 1, 1000, 0, 0), "done");
    frame(&seq, EVENT(1, EV_DONE), &w);
    frame(&seq, H_TICK, &none);
    put("routerd", 0, &seq);
    seq.len = 0;
    uint64_t hashes[2] = {0xa1, 0xa2};
    struct kvr_request_record rec = {1000, 2, hashes, 2, 40, 1, false, 0, 0};
    check(
        kvr_wire_encode_gossip_decision(&w, "peer", 5, 1, &rec, "_INBOX.x", "req-9", "peer", 0, 0),
        "gossip");
    frame(&seq, H_GOSSIP, &w);
    check(kvr_wire_encode_gossip_hello(&w, "peer", 5, 3, true), "gossip");
    frame(&seq, H_GOSSIP, &w);
    struct kvr_wire_sync s = {"peer", true, NULL, 0, 0, 0, 5, 77};
    check(kvr_wire_encode_sync(&w, &s), "sync");
    frame(&seq, H_SYNC, &w);
    frame(&seq, H_SRV | 1 << 4, &none);
    frame(&seq, H_DIGEST, &none);
    put("routerd", 1, &seq);
    seq.len = 0;
    check(kvr_wire_encode_select_request(&w, m.data, m.len, true), "select");
    frame(&seq, H_SELECT, &w);
    put("routerd", 2, &seq);
    seq.len = 0;
    frame(&seq, H_GENERATE, &m);
    check(kvr_wire_encode_cancel(&w, "req-1", "_INBOX.f"), "cancel");
    frame(&seq, H_CANCEL, &w);
    frame(&seq, H_GENERATE, &m);
    put("routerd", 3, &seq);
    seq.len = 0;
    check(kvr_wire_encode_worker_generate(&w, m.data, m.len, 1000, 0, "r1", 0), "worker_generate");
    frame(&seq, -1, &w);
    frame(&seq, -1, &w);
    put("worker", 0, &seq);
    kvr_buf_free(&seq);
    kvr_buf_free(&m);
    kvr_buf_free(&w);
    kvr_buf_free(&none);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_seeds DIR\n");
        return 2;
    }
    root = argv[1];
    if (mkdir(root, 0755) != 0 && errno != EEXIST) {
        perror(root);
        return 1;
    }
    for (uint32_t i = 0; i < 64; i++)
        tokens[i] = i * 2654435761u % 50000;
    requests();
    events();
    select_responses();
    replicas();
    handlers();
    return failed;
}
