/*
 * kvsim explain: a generated shared-prefix workload (ROUTING.md's seed set-up: a few long shared
 * prefixes, each prompt one of them plus unique tokens) routed through the decision pipeline in
 * virtual time, with a closed loop of clients. Workers are minimal stand-ins: after a request's
 * prefill they publish its blocks as Stored KV events (so the router's index learns what they
 * cache) and prefill done, then an output block every B tokens, then done. Prints the first
 * decisions with every candidate's overlap, predicted load and cost, then a summary per policy.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/hash.h"
#include "kvr/policy.h"
#include "kvr/rng.h"
#include "kvr/router.h"

int kvsim_explain(int argc, char **argv);

struct opts {
    uint32_t workers, requests, block_size, prefixes, prefix_tokens, unique_tokens, out_tokens;
    uint32_t concurrency, verbose;
    uint64_t seed;
    enum kvr_policy policies[KVR_POLICY_COUNT];
    int npolicies;
};

enum ev_kind { EV_PREFILL, EV_BLOCK, EV_DONE };

struct ev {
    uint64_t t;   /* virtual ns */
    uint64_t seq; /* insertion order, for ties */
    uint32_t req;
    enum ev_kind kind;
};

struct heap {
    struct ev *v;
    size_t n, cap;
    uint64_t next_seq;
};

static int ev_less(const struct ev *a, const struct ev *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static int heap_push(struct heap *h, uint64_t t, uint32_t req, enum ev_kind kind)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 256;
        struct ev *v = realloc(h->v, cap * sizeof *v);
        if (!v)
            return -1;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    h->v[i] = (struct ev){t, h->next_seq++, req, kind};
    while (i && ev_less(&h->v[i], &h->v[(i - 1) / 2])) {
        struct ev tmp = h->v[i];
        h->v[i] = h->v[(i - 1) / 2];
        h->v[(i - 1) / 2] = tmp;
        i = (i - 1) / 2;
    }
    return 0;
}

static struct ev heap_pop(struct heap *h)
{
    struct ev top = h->v[0];
    h->v[0] = h->v[--h->n];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && ev_less(&h->v[l], &h->v[m]))
            m = l;
        if (r < h->n && ev_less(&h->v[r], &h->v[m]))
            m = r;
        if (m == i)
            break;
        struct ev tmp = h->v[i];
        h->v[i] = h->v[m];
        h->v[m] = tmp;
        i = m;
    }
    return top;
}

struct req {
    uint32_t *tokens;
    uint32_t ntokens;
    uint32_t prefix;
    uint64_t worker;
    uint32_t out_done;
    uint32_t overlap;
};

struct run {
    const struct opts *o;
    struct kvr_router *r;
    struct req *reqs;
    struct heap heap;
    uint32_t issued, finished;
    uint64_t cached_tokens, prompt_tokens;
    uint32_t *per_worker;
    uint64_t *engine_next; /* per worker: next engine block id */
};

#define PREFILL_NS_PER_TOKEN 20000ull   /* 20 us per uncached prompt token */
#define DECODE_NS_PER_TOKEN  8000000ull /* 8 ms per output token */

static void make_prompts(const struct opts *o, struct req *reqs)
{
    struct kvr_rng rng;
    kvr_rng_seed(&rng, o->seed);
    for (uint32_t i = 0; i < o->requests; i++) {
        struct req *q = &reqs[i];
        q->prefix = (uint32_t)kvr_rng_below(&rng, o->prefixes);
        q->ntokens = o->prefix_tokens + o->unique_tokens;
        q->tokens = malloc((size_t)q->ntokens * sizeof *q->tokens);
        struct kvr_rng pr;
        kvr_rng_seed(&pr, 0x5eed0000ull + q->prefix);
        for (uint32_t t = 0; t < o->prefix_tokens; t++)
            q->tokens[t] = (uint32_t)kvr_rng_below(&pr, 32000);
        for (uint32_t t = o->prefix_tokens; t < q->ntokens; t++)
            q->tokens[t] = (uint32_t)kvr_rng_below(&rng, 32000);
    }
}

/* One line saying why the chosen worker won, from the candidates' figures. */
static void print_why(const struct kvr_decision *d, uint32_t block_size)
{
    const struct kvr_candidate *chosen = NULL, *runner = NULL, *deepest = NULL;
    for (uint32_t c = 0; d->candidates && c < d->ncandidates; c++) {
        const struct kvr_candidate *k = &d->candidates[c];
        if (k->worker_id == d->worker_id)
            chosen = k;
        else if (!runner || k->cost < runner->cost)
            runner = k;
        if (!deepest || k->overlap_blocks > deepest->overlap_blocks)
            deepest = k;
    }
    if (!chosen)
        return;
    printf("    why: ");
    if (d->policy != KVR_POLICY_KV)
        printf("policy %s chose it (kv cost %.1f)", kvr_policy_name(d->policy), chosen->cost);
    else if (!runner || runner->cost == chosen->cost)
        printf("lowest cost %.1f, tied; ties go to the fewest cached blocks, then a seeded draw",
               chosen->cost);
    else
        printf("lowest cost %.1f (next: worker %" PRIu64 " at %.1f)", chosen->cost,
               runner->worker_id, runner->cost);
    if (chosen->overlap_blocks)
        printf("; its cache holds the first %u blocks, saving %" PRIu64 " prefill tokens",
               chosen->overlap_blocks, (uint64_t)chosen->overlap_blocks * block_size);
    if (deepest && deepest->overlap_blocks > chosen->overlap_blocks)
        printf("; worker %" PRIu64 " caches more (%u blocks) but is busier (%" PRIu64
               " prefill tokens, %" PRIu64 " blocks in use)",
               deepest->worker_id, deepest->overlap_blocks, deepest->prefill_tokens,
               deepest->decode_blocks);
    printf("\n");
}

static void print_decision(const struct run *run, uint32_t i, const struct kvr_decision *d)
{
    const struct req *q = &run->reqs[i];
    printf("request %u (prefix %u, %u tokens, %u blocks) -> worker %" PRIu64
           " [%s]: overlap %u blocks, cost %.1f\n",
           i, q->prefix, d->prompt_tokens, d->prompt_blocks, d->worker_id,
           kvr_policy_name(d->policy), d->overlap_blocks, d->cost);
    for (uint32_t c = 0; d->candidates && c < d->ncandidates; c++) {
        const struct kvr_candidate *k = &d->candidates[c];
        printf("    %c worker %-3" PRIu64 " overlap %4u  prefill %7" PRIu64 " tok  decode %6" PRIu64
               " blk  inflight %3u  cost %9.1f%s\n",
               k->worker_id == d->worker_id ? '*' : ' ', k->worker_id, k->overlap_blocks,
               k->prefill_tokens, k->decode_blocks, k->inflight, k->cost, k->busy ? "  busy" : "");
    }
    print_why(d, run->o->block_size);
}

static int issue(struct run *run, uint64_t now)
{
    const struct opts *o = run->o;
    uint32_t i = run->issued++;
    struct req *q = &run->reqs[i];
    struct kvr_request rq = {.id = i + 1,
                             .tokens = q->tokens,
                             .ntokens = q->ntokens,
                             .max_tokens = o->out_tokens,
                             .explain = i < o->verbose};
    struct kvr_decision d;
    kvr_status st = kvr_router_route(run->r, &rq, now, &d);
    if (st != KVR_OK) {
        fprintf(stderr, "kvsim explain: request %u refused: %s\n", i, kvr_status_str(st));
        return -1;
    }
    if (i < o->verbose)
        print_decision(run, i, &d);
    q->worker = d.worker_id;
    q->overlap = d.overlap_blocks;
    run->per_worker[d.worker_id - 1]++;
    uint64_t cached = (uint64_t)d.overlap_blocks * o->block_size;
    run->cached_tokens += cached;
    run->prompt_tokens += q->ntokens;
    uint64_t prefill = (q->ntokens - cached) * PREFILL_NS_PER_TOKEN;
    return heap_push(&run->heap, now + prefill, i, EV_PREFILL);
}

/* The worker finished request i's prefill: it now caches the prompt's blocks. */
static void publish_stored(struct run *run, uint32_t i)
{
    const struct opts *o = run->o;
    const struct req *q = &run->reqs[i];
    uint32_t nb = q->ntokens / o->block_size;
    uint64_t *hashes = malloc(2 * ((size_t)nb + 1) * sizeof *hashes);
    struct kvr_kv_block *blocks = malloc(((size_t)nb + 1) * sizeof *blocks);
    if (hashes && blocks) {
        uint64_t *local = hashes, *seq = hashes + nb + 1;
        kvr_hash_prompt(q->tokens, q->ntokens, o->block_size, local, seq);
        /* the stand-in engine names its blocks by their sequence hash, so blocks it already
         * holds keep their ids and the event re-announces them harmlessly */
        for (uint32_t b = 0; b < nb; b++)
            blocks[b] = (struct kvr_kv_block){seq[b], local[b]};
        kvr_router_kv_stored(run->r, q->worker, NULL, blocks, nb);
    }
    free(hashes);
    free(blocks);
}

static int simulate(struct run *run)
{
    const struct opts *o = run->o;
    for (uint32_t c = 0; c < o->concurrency && run->issued < o->requests; c++)
        if (issue(run, 0))
            return -1;
    while (run->heap.n) {
        struct ev e = heap_pop(&run->heap);
        struct req *q = &run->reqs[e.req];
        uint64_t id = e.req + 1;
        switch (e.kind) {
        case EV_PREFILL:
            publish_stored(run, e.req);
            kvr_router_prefill_done(run->r, id, e.t);
            if (heap_push(&run->heap, e.t + DECODE_NS_PER_TOKEN, e.req, EV_BLOCK))
                return -1;
            break;
        case EV_BLOCK:
            q->out_done++;
            if ((q->ntokens + q->out_done) % o->block_size == 1)
                kvr_router_output_block(run->r, id, e.t);
            if (q->out_done < o->out_tokens) {
                if (heap_push(&run->heap, e.t + DECODE_NS_PER_TOKEN, e.req, EV_BLOCK))
                    return -1;
            } else if (heap_push(&run->heap, e.t, e.req, EV_DONE)) {
                return -1;
            }
            break;
        case EV_DONE:
            kvr_router_done(run->r, id);
            run->finished++;
            if (run->issued < o->requests && issue(run, e.t))
                return -1;
            break;
        }
    }
    return 0;
}

static int run_policy(const struct opts *o, enum kvr_policy policy, struct req *reqs)
{
    struct kvr_router_config cfg;
    kvr_router_config_default(&cfg);
    cfg.block_size = o->block_size;
    cfg.policy = policy;
    cfg.seed = o->seed;
    kvr_status st;
    struct run run = {.o = o, .reqs = reqs};
    run.r = kvr_router_create(&cfg, &st);
    run.per_worker = calloc(o->workers, sizeof *run.per_worker);
    if (!run.r || !run.per_worker) {
        fprintf(stderr, "kvsim explain: %s\n", kvr_status_str(st));
        free(run.per_worker);
        kvr_router_destroy(run.r);
        return -1;
    }
    for (uint32_t w = 1; w <= o->workers; w++) {
        struct kvr_worker_info info = {.id = w,
                                       .block_size = o->block_size,
                                       .capacity_blocks = 16384,
                                       .waiting = 0,
                                       .kv_usage = 0.0};
        kvr_router_worker_seen(run.r, &info, 0);
    }
    printf("== policy %s: %u workers, %u requests, concurrency %u, %u prefixes of %u tokens + "
           "%u unique, block size %u\n",
           kvr_policy_name(policy), o->workers, o->requests, o->concurrency, o->prefixes,
           o->prefix_tokens, o->unique_tokens, o->block_size);
    for (uint32_t i = 0; i < o->requests; i++)
        reqs[i].out_done = 0;
    int rc = simulate(&run);
    struct kvr_router_stats s;
    kvr_router_stats(run.r, &s);
    double hit = run.prompt_tokens ? (double)run.cached_tokens / run.prompt_tokens : 0;
    uint32_t maxw = 0;
    for (uint32_t w = 0; w < o->workers; w++)
        maxw = run.per_worker[w] > maxw ? run.per_worker[w] : maxw;
    double mean = (double)run.issued / o->workers;
    printf("summary policy=%s finished=%u prefix_hit=%.3f imbalance=%.2f index_entries=%u "
           "nodes=%u inflight_left=%u memory_bytes=%zu\n",
           kvr_policy_name(policy), run.finished, hit, mean ? maxw / mean : 0.0, s.index_entries,
           s.nodes, s.inflight, s.memory_bytes);
    printf("requests per worker:");
    for (uint32_t w = 0; w < o->workers; w++)
        printf(" %u", run.per_worker[w]);
    printf("\n\n");
    free(run.per_worker);
    free(run.heap.v);
    kvr_router_destroy(run.r);
    return rc;
}

static int parse_opt(const char *name, const char *val, uint64_t max, uint64_t *out)
{
    char *end;
    unsigned long long v = val ? strtoull(val, &end, 10) : 0;
    if (!val || !*val || *end || *val == '-' || v > max) {
        fprintf(stderr, "kvsim explain: %s needs an integer up to %" PRIu64 "\n", name, max);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_policies(const char *s, struct opts *o)
{
    o->npolicies = 0;
    while (*s) {
        size_t len = strcspn(s, ",");
        enum kvr_policy p;
        if (kvr_policy_parse(s, len, &p) || o->npolicies == KVR_POLICY_COUNT) {
            fprintf(stderr, "kvsim explain: unknown policy '%.*s'\n", (int)len, s);
            return -1;
        }
        o->policies[o->npolicies++] = p;
        s += len + (s[len] == ',');
    }
    return o->npolicies ? 0 : -1;
}

int kvsim_explain(int argc, char **argv)
{
    struct opts o = {.workers = 8,
                     .requests = 200,
                     .block_size = 64,
                     .prefixes = 10,
                     .prefix_tokens = 3500,
                     .unique_tokens = 3500,
                     .out_tokens = 100,
                     .concurrency = 20,
                     .verbose = 6,
                     .seed = 1,
                     .policies = {KVR_POLICY_KV, KVR_POLICY_ROUND_ROBIN},
                     .npolicies = 2};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t x;
        uint32_t *dst = NULL;
        uint64_t max = 1u << 20;
        if (!strcmp(a, "--policy") || !strcmp(a, "--policies")) {
            if (!v || parse_policies(v, &o))
                return 2;
            i++;
            continue;
        }
        if (!strcmp(a, "--seed")) {
            if (parse_opt(a, v, UINT64_MAX, &o.seed))
                return 2;
            i++;
            continue;
        }
        if (!strcmp(a, "--workers"))
            dst = &o.workers, max = 4096;
        else if (!strcmp(a, "--requests"))
            dst = &o.requests;
        else if (!strcmp(a, "--block-size"))
            dst = &o.block_size, max = 4096;
        else if (!strcmp(a, "--prefixes"))
            dst = &o.prefixes;
        else if (!strcmp(a, "--prefix-tokens"))
            dst = &o.prefix_tokens, max = 1u << 18;
        else if (!strcmp(a, "--unique-tokens"))
            dst = &o.unique_tokens, max = 1u << 18;
        else if (!strcmp(a, "--output-tokens"))
            dst = &o.out_tokens, max = 1u << 16;
        else if (!strcmp(a, "--concurrency"))
            dst = &o.concurrency;
        else if (!strcmp(a, "--verbose"))
            dst = &o.verbose;
        else {
            fprintf(stderr, "kvsim explain: unknown argument '%s'\n", a);
            return 2;
        }
        if (parse_opt(a, v, max, &x))
            return 2;
        *dst = (uint32_t)x;
        i++;
    }
    if (!o.workers || !o.block_size || !o.prefixes || !o.concurrency || !o.out_tokens ||
        o.prefix_tokens + o.unique_tokens == 0) {
        fprintf(stderr, "kvsim explain: workers, block size, prefixes, concurrency, output "
                        "tokens and prompt length must be positive\n");
        return 2;
    }
    struct req *reqs = calloc(o.requests ? o.requests : 1, sizeof *reqs);
    if (!reqs)
        return 1;
    make_prompts(&o, reqs);
    int rc = 0;
    for (int p = 0; p < o.npolicies && rc == 0; p++)
        rc = run_policy(&o, o.policies[p], reqs);
    for (uint32_t i = 0; i < o.requests; i++)
        free(reqs[i].tokens);
    free(reqs);
    return rc ? 1 : 0;
}
