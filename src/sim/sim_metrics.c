/*
 * What a simulation run measures, and the result it returns: latencies of finished requests
 * (TTFT, end to end, queueing), every inter-token gap (pooled) and each request's mean gap (the
 * per-request ITL), summarised with the base library's one quantile definition; cache hits,
 * throughput, balance, the engines' preemptions and evictions, the routers' prediction error and
 * their replication counters. Invariant: the per-request samples hold exactly nfinished values, the
 * gap sample every gap the engines reported. Single-threaded: one run, one thread.
 */
#include "grow.h"
#include "sim.h"
#include "sim_int.h"
#include "stats.h"

/*
 * Every gap is kept, so its quantiles are the same v[floor(q (n - 1))] of the sorted sample as
 * every other figure of the project's reports; a histogram would save the memory (8 bytes per
 * output token: 33 MB for the whole conversation trace) at the price of a second definition.
 */
void kvr__sim_token_gap(void *ctx, double gap_ms)
{
    struct sim *s = ((struct wctx *)ctx)->s;
    if (s->nitl == UINT32_MAX) { /* the sample's bound (32 GB of gaps): count + 1 would wrap */
        kvr__sim_fail(s, KVR_ERR_FULL);
        return;
    }
    if (!KVR_GROW(s->itl, s->cap_itl, s->nitl + 1, 4096)) {
        kvr__sim_fail(s, KVR_ERR_NOMEM);
        return;
    }
    s->itl[s->nitl++] = gap_ms;
}

/* Room for every request was made at set-up: at most one value per finished request. */
void kvr__sim_request_itl(struct sim *s, const struct kvr_engine_result *res)
{
    if (res->osl > 1)
        s->itl_req[s->nitl_req++] = res->itl_sum_ms / (res->osl - 1);
}

/* How the workers shared the requests, and what their engines did. */
static void collect_workers(const struct sim *s, struct kvr_sim_result *out)
{
    uint32_t maxw = 0, total = 0;
    for (uint32_t w = 0; w < s->cfg->workers; w++) {
        total += s->per_worker[w];
        maxw = s->per_worker[w] > maxw ? s->per_worker[w] : maxw;
    }
    out->imbalance = total ? maxw / ((double)total / s->cfg->workers) : 0;
    for (uint32_t w = 0; w < s->cfg->workers; w++) {
        struct kvr_engine_stats es;
        kvr_engine_stats(s->engines[w], &es);
        out->preemptions += es.preemptions;
        out->evictions += es.evictions;
    }
}

/* What the routers predicted and exchanged. */
static void collect_routers(const struct sim *s, struct kvr_sim_result *out)
{
    out->pred_err_blocks = s->pred_n ? s->pred_abs / s->pred_n : 0;
    out->pred_err_rel = s->pred_actual > 0 ? s->pred_abs / s->pred_actual : 0;
    for (uint32_t k = 0; k < s->nrep; k++) {
        const struct replica *rp = &s->rep[k];
        struct kvr_router_stats rs;
        kvr_router_stats(rp->router, &rs);
        out->router_unknown += rs.unknown_request + rs.unknown_worker + rs.index.unknown_parent;
        out->early_events += rs.early_events;
        out->late_decisions += rs.late_decisions;
        out->index_pruned += rs.index.pruned;
        out->index_pruned_live += rs.index.pruned_live;
        out->kv_applied += rs.index.stored_blocks + rs.index.removed_blocks;
        out->kv_ignored += rs.kv_ignored;
        out->index_bound = rs.index_max;
        double rel = rp->pred_actual > 0 ? rp->pred_abs / rp->pred_actual : 0;
        if (rel > out->pred_err_rel_worst)
            out->pred_err_rel_worst = rel;
    }
    if (s->nrep > 1) /* events for a peer's requests are expected there */
        out->router_unknown -= out->early_events;
    out->index_entries_max = s->index_max;
    out->router_memory_max = s->memory_max;
    out->replicas = s->nrep;
    out->gossip = s->gossip;
    out->decisions = s->decisions;
    out->gossip_msgs = s->gossip_msgs;
    out->gossip_bytes = s->gossip_bytes;
    out->gossip_imports = s->gossip_imports;
}

void kvr__sim_collect(struct sim *s, struct kvr_sim_result *out)
{
    uint32_t n = s->nfinished;
    out->policy = s->cfg->router.policy;
    out->requests = s->wl->nreqs;
    out->finished = n;
    out->rejected = s->rejected;
    out->failed = s->failed;
    out->failed_blocks = s->failed_blocks;
    out->ttft_ms = kvr_stat_of(s->ttft, n); /* sorts them: ttft_sorted */
    out->e2e_ms = kvr_stat_of(s->e2e, n);
    out->queue_ms = kvr_stat_of(s->queue, n);
    out->itl_ms = kvr_stat_of(s->itl, s->nitl);
    out->itl_request_ms = kvr_stat_of(s->itl_req, s->nitl_req);
    out->ttft_sorted = s->ttft;
    s->ttft = NULL;
    out->per_request = s->per_request;
    s->per_request = NULL;
    out->hit_rate = s->prompt_tokens ? (double)s->cached_tokens / s->prompt_tokens : 0;
    out->makespan_s =
        s->last_finish > s->first_arrival ? (double)(s->last_finish - s->first_arrival) / 1e9 : 0;
    out->throughput_tok_s = out->makespan_s > 0 ? s->output_tokens / out->makespan_s : 0;
    collect_workers(s, out);
    collect_routers(s, out);
}
