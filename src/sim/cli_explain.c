/*
 * kvsim explain. Workers are minimal stand-ins: after a request's prefill they publish its blocks
 * as Stored KV events (so the router's index learns what they cache) and prefill done, then an
 * output block every B tokens, then done. The events wait in one KVR_HEAP_DEFINE heap ordered by
 * (virtual time, push order), so every run of the same options prints the same lines. Options
 * come from one kvr_opts table; --policies is a list checked after it.
 */
#include "cli_explain.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/engine.h"
#include "heap.h"
#include "kvr/hash.h"
#include "kvr/policy.h"
#include "kvr/rng.h"
#include "kvr/router.h"
#include "opts.h"

struct explain_config {
    uint32_t workers;                         /* stand-in workers */
    uint32_t requests;                        /* requests per policy */
    uint32_t block_size;                      /* tokens per KV block */
    uint32_t capacity_blocks;                 /* the stand-in workers' KV capacity */
    uint32_t prefixes;                        /* shared prefixes the prompts draw from */
    uint32_t prefix_tokens;                   /* tokens of each prefix */
    uint32_t unique_tokens;                   /* tokens after it, unique to each prompt */
    uint32_t out_tokens;                      /* output tokens per request */
    uint32_t concurrency;                     /* closed-loop clients */
    uint32_t verbose;                         /* decisions explained (the first N) */
    uint64_t seed;                            /* prompts and routers */
    char policies[KVR_OPT_STR_MAX];           /* comma-separated, each run in turn */
    enum kvr_policy policy[KVR_POLICY_COUNT]; /* ... parsed */
    int npolicies;                            /* */
};

static void explain_config_default(struct explain_config *c)
{
    memset(c, 0, sizeof *c);
    c->workers = 8;
    c->requests = 200;
    struct kvr_engine_config ec; /* the engine's defaults, for its blocks and pool */
    kvr_engine_config_default(&ec);
    c->block_size = ec.block_size;
    c->capacity_blocks = ec.num_blocks;
    c->prefixes = 10;
    c->prefix_tokens = 3500;
    c->unique_tokens = 3500;
    c->out_tokens = 100;
    c->concurrency = 20;
    c->verbose = 6;
    c->seed = 1;
    snprintf(c->policies, sizeof c->policies, "kv,round_robin");
}

enum ev_kind { EV_PREFILL, EV_BLOCK, EV_DONE };

struct ev {
    uint64_t t;   /* virtual ns */
    uint64_t seq; /* push order, for ties */
    uint32_t req;
    enum ev_kind kind;
};

static bool ev_less(const struct ev *a, const struct ev *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

KVR_HEAP_DEFINE(ev_heap, struct ev, ev_less)

struct req {
    uint32_t *tokens;
    uint32_t ntokens;
    uint32_t prefix;
    uint64_t worker;
    uint32_t out_done;
    uint32_t overlap;
};

struct run {
    const struct explain_config *o;
    struct kvr_router *r;
    struct req *reqs;
    struct ev_heap heap;
    uint64_t next_seq; /* events pushed, for ties */
    uint32_t issued, finished;
    uint64_t cached_tokens, prompt_tokens;
    uint32_t *per_worker;
};

static int push(struct run *run, uint64_t t, uint32_t req, enum ev_kind kind)
{
    return ev_heap_push(&run->heap, (struct ev){t, run->next_seq++, req, kind}) ? 0 : -1;
}

#define PREFILL_NS_PER_TOKEN 20000ull   /* 20 us per uncached prompt token */
#define DECODE_NS_PER_TOKEN  8000000ull /* 8 ms per output token */

/* Every request's prompt: one of the shared prefixes, then unique tokens; -1 if memory is short. */
static int make_prompts(const struct explain_config *o, struct req *reqs)
{
    struct kvr_rng rng;
    kvr_rng_seed(&rng, o->seed);
    for (uint32_t i = 0; i < o->requests; i++) {
        struct req *q = &reqs[i];
        q->prefix = (uint32_t)kvr_rng_below(&rng, o->prefixes);
        q->ntokens = o->prefix_tokens + o->unique_tokens;
        q->tokens = malloc((size_t)q->ntokens * sizeof *q->tokens);
        if (!q->tokens)
            return -1;
        struct kvr_rng pr;
        kvr_rng_seed(&pr, 0x5eed0000ull + q->prefix);
        for (uint32_t t = 0; t < o->prefix_tokens; t++)
            q->tokens[t] = (uint32_t)kvr_rng_below(&pr, 32000);
        for (uint32_t t = o->prefix_tokens; t < q->ntokens; t++)
            q->tokens[t] = (uint32_t)kvr_rng_below(&rng, 32000);
    }
    return 0;
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
               k->prefill_tokens, k->decode_blocks, k->inflight, k->cost,
               k->too_small ? "  too small"
               : k->busy    ? "  busy"
                            : "");
    }
    print_why(d, run->o->block_size);
}

static int issue(struct run *run, uint64_t now)
{
    const struct explain_config *o = run->o;
    uint32_t i = run->issued++;
    struct req *q = &run->reqs[i];
    struct kvr_request rq = {.id = i + 1,
                             .tokens = q->tokens,
                             .ntokens = q->ntokens,
                             .max_tokens = o->out_tokens,
                             .explain = i < o->verbose};
    struct kvr_decision d;
    kvr_status st = kvr_router_route(run->r, &rq, now, &d);
    if (st != KVR_OK || d.queued) {
        fprintf(stderr, "kvsim explain: request %u %s: %s\n", i, st ? "refused" : "queued",
                kvr_status_str(st));
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
    return push(run, now + prefill, i, EV_PREFILL);
}

/* The worker finished request i's prefill: it now caches the prompt's blocks. */
static void publish_stored(struct run *run, uint32_t i)
{
    const struct explain_config *o = run->o;
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
    const struct explain_config *o = run->o;
    for (uint32_t c = 0; c < o->concurrency && run->issued < o->requests; c++)
        if (issue(run, 0))
            return -1;
    while (run->heap.n) {
        struct ev e = ev_heap_pop(&run->heap);
        struct req *q = &run->reqs[e.req];
        uint64_t id = e.req + 1;
        switch (e.kind) {
        case EV_PREFILL:
            publish_stored(run, e.req);
            kvr_router_prefill_done(run->r, id, e.t);
            if (push(run, e.t + DECODE_NS_PER_TOKEN, e.req, EV_BLOCK))
                return -1;
            break;
        case EV_BLOCK:
            q->out_done++;
            if ((q->ntokens + q->out_done) % o->block_size == 1)
                kvr_router_output_block(run->r, id, e.t);
            if (q->out_done < o->out_tokens) {
                if (push(run, e.t + DECODE_NS_PER_TOKEN, e.req, EV_BLOCK))
                    return -1;
            } else if (push(run, e.t, e.req, EV_DONE)) {
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

static int run_policy(const struct explain_config *o, enum kvr_policy policy, struct req *reqs)
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
    if (run.r && !run.per_worker)
        st = KVR_ERR_NOMEM;
    if (!run.r || !run.per_worker) {
        fprintf(stderr, "kvsim explain: %s\n", kvr_status_str(st));
        free(run.per_worker);
        kvr_router_destroy(run.r);
        return -1;
    }
    for (uint32_t w = 1; w <= o->workers; w++) {
        struct kvr_worker_info info = {.id = w,
                                       .block_size = o->block_size,
                                       .capacity_blocks = o->capacity_blocks,
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
    ev_heap_free(&run.heap);
    kvr_router_destroy(run.r);
    return rc;
}

static int parse_policies(struct explain_config *c)
{
    c->npolicies = 0;
    for (const char *s = c->policies; *s;) {
        size_t len = strcspn(s, ",");
        enum kvr_policy p;
        if (kvr_policy_parse(s, len, &p) || c->npolicies == KVR_POLICY_COUNT) {
            fprintf(stderr, "kvsim explain: unknown policy '%.*s'\n", (int)len, s);
            return -1;
        }
        c->policy[c->npolicies++] = p;
        s += len + (s[len] == ',');
    }
    return c->npolicies ? 0 : -1;
}

/* A whole-number option of the table: its name, field, accepted range and help. */
#define U32(opt, field, lo, hi, text)                                                              \
    {                                                                                              \
        .name = opt, .type = KVR_OPT_U32, .ptr = &c->field, .help = text, .min = lo, .max = hi     \
    }

static enum kvr_opts_result parse_options(struct explain_config *c, int argc, char **argv)
{
    const struct kvr_opt table[] = {
        U32("workers", workers, 1, 4096, "stand-in workers (1 to 4096)"),
        U32("requests", requests, 0, 1u << 20, "requests per policy (up to 2^20)"),
        U32("block-size", block_size, 1, 4096, "tokens per KV block (1 to 4096)"),
        U32("prefixes", prefixes, 1, 1u << 20, "shared prefixes the prompts draw from"),
        U32("prefix-tokens", prefix_tokens, 0, 1u << 18, "tokens of each shared prefix"),
        U32("unique-tokens", unique_tokens, 0, 1u << 18, "unique tokens after the prefix"),
        U32("output-tokens", out_tokens, 1, 1u << 16, "output tokens per request (1 to 2^16)"),
        U32("concurrency", concurrency, 1, 1u << 20, "closed-loop clients"),
        U32("verbose", verbose, 0, 1u << 20, "explain the first N decisions"),
        {.name = "seed", .type = KVR_OPT_U64, .ptr = &c->seed, .help = "seeds prompts and routers"},
        {.name = "policies",
         .type = KVR_OPT_STR,
         .ptr = c->policies,
         .help = "policies to run, comma-separated"},
        {.name = "policy",
         .type = KVR_OPT_STR,
         .ptr = c->policies,
         .help = "the same as --policies"},
    };
    return kvr_opts_parse(table, sizeof table / sizeof table[0], argc, argv, "kvsim explain",
                          "Route a generated shared-prefix workload through the decision pipeline "
                          "and print\neach decision and the candidates' costs behind it.");
}

#undef U32

int kvr_cli_explain_main(int argc, char **argv)
{
    struct explain_config c;
    explain_config_default(&c);
    enum kvr_opts_result r = parse_options(&c, argc, argv);
    if (r != KVR_OPTS_GO)
        return r == KVR_OPTS_EXIT ? 0 : 2;
    if (parse_policies(&c))
        return 2;
    if (c.prefix_tokens + c.unique_tokens == 0) {
        fprintf(stderr, "kvsim explain: the prompt length (--prefix-tokens + --unique-tokens) "
                        "must be positive\n");
        return 2;
    }
    struct req *reqs = calloc(c.requests ? c.requests : 1, sizeof *reqs);
    if (!reqs)
        return 1;
    int rc = make_prompts(&c, reqs);
    if (rc)
        fprintf(stderr, "kvsim explain: out of memory\n");
    for (int p = 0; p < c.npolicies && rc == 0; p++)
        rc = run_policy(&c, c.policy[p], reqs);
    for (uint32_t i = 0; i < c.requests; i++)
        free(reqs[i].tokens);
    free(reqs);
    return rc ? 1 : 0;
}
