/*
 * Report writers. Numbers are printed with fixed precision so that equal results give byte-equal
 * files.
 */
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvr/policy.h"
#include "stats.h"

int kvr_mkdir_p(const char *dir)
{
    char path[4096];
    size_t len = strlen(dir);
    if (!len || len >= sizeof path)
        return -1;
    memcpy(path, dir, len + 1);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(path, 0777) && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(path, 0777) && errno != EEXIST ? -1 : 0;
}

void kvr_report_label(const struct kvr_report_meta *m, const struct kvr_sim_result *r, bool file,
                      char *buf, size_t len)
{
    const char *name = kvr_policy_name(r->policy);
    if (!m->replicas)
        snprintf(buf, len, "%s", name);
    else if (r->replicas <= 1)
        snprintf(buf, len, file ? "%s_n1" : "%s N=1", name);
    else if (file)
        snprintf(buf, len, "%s_n%u_%s", name, r->replicas, r->gossip ? "gossip" : "nogossip");
    else
        snprintf(buf, len, "%s N=%u %s", name, r->replicas, r->gossip ? "gossip" : "no-gossip");
}

static FILE *open_in(const char *dir, const char *name, const char *mode)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return NULL;
    return fopen(path, mode);
}

static void json_stat(FILE *f, const char *name, const struct kvr_stat *s, bool full)
{
    if (full)
        fprintf(f,
                "\"%s\": {\"mean\": %.3f, \"p50\": %.3f, \"p90\": %.3f, \"p99\": %.3f, "
                "\"max\": %.3f}",
                name, s->mean, s->p50, s->p90, s->p99, s->max);
    else
        fprintf(f, "\"%s\": {\"mean\": %.3f, \"p50\": %.3f, \"p99\": %.3f}", name, s->mean, s->p50,
                s->p99);
}

/* Why kvr_sim_result.failed requests failed. */
#define FAILED_REASON                                                                              \
    "prompt and output need more KV blocks than one engine holds: refused before the engine, "     \
    "as kvworker refuses them (capacity limit reached)"

static void json_result(FILE *f, const struct kvr_report_meta *m, const struct kvr_sim_result *r)
{
    fprintf(f, "    {\"policy\": \"%s\", \"load\": %.4g, ", kvr_policy_name(r->policy), r->load);
    json_stat(f, "ttft_ms", &r->ttft_ms, true);
    fprintf(f, ", ");
    json_stat(f, "itl_ms", &r->itl_ms, false);
    fprintf(f, ", ");
    json_stat(f, "itl_per_request_ms", &r->itl_request_ms, false);
    fprintf(f, ", ");
    json_stat(f, "e2e_ms", &r->e2e_ms, false);
    fprintf(f, ", ");
    json_stat(f, "queue_ms", &r->queue_ms, false);
    fprintf(f,
            ", \"hit_rate\": %.5f, \"hit_ceiling\": %.5f, \"hit_ceiling_capacity\": %.5f, "
            "\"hit_of_ceiling\": %.4f, \"hit_of_capacity_ceiling\": %.4f, "
            "\"throughput_tok_s\": %.2f, \"requests\": %u, \"finished\": %u, \"rejected\": %u, "
            "\"imbalance\": %.4f, \"preemptions\": %llu, \"evictions\": %llu, "
            "\"prediction_error\": {\"blocks\": %.2f, \"relative\": %.4f}, "
            "\"makespan_s\": %.3f, \"router_memory_max_bytes\": %llu, "
            "\"index_entries_max\": %llu, \"router_unknown_events\": %llu, "
            "\"index_max_entries\": %u, \"index_pruned\": %llu, \"index_pruned_live\": %llu, "
            "\"kv_event_blocks_applied\": %llu, \"kv_events_ignored\": %llu",
            r->hit_rate, m->hit_ceiling, m->hit_ceiling_capacity,
            m->hit_ceiling > 0 ? r->hit_rate / m->hit_ceiling : 0,
            m->hit_ceiling_capacity > 0 ? r->hit_rate / m->hit_ceiling_capacity : 0,
            r->throughput_tok_s, r->requests, r->finished, r->rejected, r->imbalance,
            (unsigned long long)r->preemptions, (unsigned long long)r->evictions,
            r->pred_err_blocks, r->pred_err_rel, r->makespan_s,
            (unsigned long long)r->router_memory_max, (unsigned long long)r->index_entries_max,
            (unsigned long long)r->router_unknown, r->index_bound,
            (unsigned long long)r->index_pruned, (unsigned long long)r->index_pruned_live,
            (unsigned long long)r->kv_applied, (unsigned long long)r->kv_ignored);
    if (r->failed)
        fprintf(f, ", \"failed\": %u, \"failed_reason\": \"%s\", \"failed_blocks_max\": %llu",
                r->failed, FAILED_REASON, (unsigned long long)r->failed_blocks);
    if (m->replicas)
        fprintf(f,
                ", \"replicas\": %u, \"gossip\": %s, \"decisions\": %llu, \"gossip_msgs\": %llu, "
                "\"gossip_bytes\": %llu, \"gossip_bytes_per_decision\": %.1f, "
                "\"gossip_imports\": %llu, \"early_events\": %llu, \"late_decisions\": %llu, "
                "\"prediction_error_worst_replica\": %.4f",
                r->replicas, r->gossip ? "true" : "false", (unsigned long long)r->decisions,
                (unsigned long long)r->gossip_msgs, (unsigned long long)r->gossip_bytes,
                r->decisions ? (double)r->gossip_bytes / r->decisions : 0,
                (unsigned long long)r->gossip_imports, (unsigned long long)r->early_events,
                (unsigned long long)r->late_decisions, r->pred_err_rel_worst);
    fprintf(f, "}");
}

static kvr_status write_json(const char *dir, const struct kvr_report_meta *m,
                             const struct kvr_sim_result *res, size_t n)
{
    FILE *f = open_in(dir, "report.json", "w");
    if (!f)
        return KVR_ERR_IO;
    const struct kvr_sim_config *c = m->cfg;
    fprintf(f, "{\n  \"workload\": \"%s\",\n  \"workers\": %u,\n  \"seed\": %llu,\n", m->workload,
            m->workers, (unsigned long long)m->seed);
    fprintf(f, "  \"source\": \"%s\",\n  \"load_kind\": \"%s\",\n", m->source ? m->source : "kvsim",
            m->load_kind);
    if (c) {
        const struct kvr_engine_config *e = &c->engine;
        fprintf(f, "  \"block_size\": %u,\n", e->block_size);
        fprintf(f,
                "  \"engine\": {\"num_blocks\": %u, \"block_size\": %u, \"watermark\": %.4f, "
                "\"max_batched_tokens\": %u, \"max_seqs\": %u, \"speedup\": %.3f},\n",
                e->num_blocks, e->block_size, e->watermark, e->max_batched_tokens, e->max_seqs,
                e->speedup);
        const struct kvr_router_config *k = &c->router;
        fprintf(f,
                "  \"router\": {\"overlap_weight\": %.3f, \"temperature\": %.3f, \"approximate\": "
                "%s, \"busy_threshold\": %.3f, \"kv_cost\": \"%s\", \"stall_weight\": %.3f, "
                "\"cache_weight\": %.3f, \"share_weight\": %.3f, \"decode_weight\": %.3f, "
                "\"learn_output\": %s, \"prefill_window_s\": %.3f, \"tie_margin\": %.3f},\n",
                k->overlap_weight, k->temperature, k->approximate ? "true" : "false",
                k->busy_threshold, k->cost_model == KVR_COST_TIME ? "time" : "blocks",
                k->stall_weight, k->cache_weight, k->share_weight, k->decode_weight,
                k->learn_output ? "true" : "false", (double)k->prefill_window_ns / 1e9,
                k->tie_margin);
        if (c->client_max_tokens)
            fprintf(f, "  \"client_max_tokens\": %u,\n", c->client_max_tokens);
        fprintf(f, "  \"event_delay_ms\": %.3f,\n", c->event_delay_ns / 1e6);
        if (m->replicas)
            fprintf(f, "  \"gossip_delay_ms\": %.3f,\n", c->gossip_delay_ns / 1e6);
    }
    fprintf(f, "  \"hit_ceiling\": %.5f,\n  \"hit_ceiling_capacity\": %.5f,\n", m->hit_ceiling,
            m->hit_ceiling_capacity);
    if (m->hit_ceiling_trace > 0)
        fprintf(f, "  \"hit_ceiling_trace_doc\": %.4f,\n", m->hit_ceiling_trace);
    if (m->arrival_spread_ms > 0)
        fprintf(f, "  \"arrival_spread_ms\": %.3f,\n", m->arrival_spread_ms);
    fprintf(f, "  \"results\": [\n");
    for (size_t i = 0; i < n; i++) {
        json_result(f, m, &res[i]);
        fprintf(f, "%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    return fclose(f) ? KVR_ERR_IO : KVR_OK;
}

/* The metrics of the markdown tables: how to read one, whether lower is better, its precision,
 * and whether only a simulation has it. */
struct metric {
    const char *name;
    double (*get)(const struct kvr_sim_result *r);
    bool lower_better;
    bool fraction; /* printed with three decimals */
};

#define GETTER(fn, expr)                                                                           \
    static double fn(const struct kvr_sim_result *r)                                               \
    {                                                                                              \
        return (expr);                                                                             \
    }
GETTER(ttft_mean, r->ttft_ms.mean)
GETTER(ttft_p50, r->ttft_ms.p50)
GETTER(ttft_p90, r->ttft_ms.p90)
GETTER(ttft_p99, r->ttft_ms.p99)
GETTER(itl_mean, r->itl_ms.mean)
GETTER(itl_req_mean, r->itl_request_ms.mean)
GETTER(itl_p99, r->itl_ms.p99)
GETTER(e2e_mean, r->e2e_ms.mean)
GETTER(e2e_p99, r->e2e_ms.p99)
GETTER(hit, r->hit_rate)
GETTER(tput, r->throughput_tok_s)
#undef GETTER

static const struct metric metrics[] = {
    {"TTFT mean ms", ttft_mean, true, false},
    {"TTFT p50", ttft_p50, true, false},
    {"TTFT p90", ttft_p90, true, false},
    {"TTFT p99", ttft_p99, true, false},
    {"ITL mean ms", itl_mean, true, false},
    {"ITL/request mean ms", itl_req_mean, true, false},
    {"ITL p99", itl_p99, true, false},
    {"E2E mean ms", e2e_mean, true, false},
    {"E2E p99", e2e_p99, true, false},
    {"hit rate", hit, false, true},
    {"tok/s", tput, false, false},
};
#define NMETRICS (sizeof metrics / sizeof metrics[0])

/* The header cells of the metrics. */
static void md_header(FILE *f)
{
    for (size_t k = 0; k < NMETRICS; k++)
        fprintf(f, " %s |", metrics[k].name);
}

/* The separator row under them: a cell per metric, and more cells. */
static void md_rule(FILE *f, size_t more)
{
    fprintf(f, "\n|---|");
    for (size_t k = 0; k < NMETRICS; k++)
        fprintf(f, "---:|");
    for (size_t k = 0; k < more; k++)
        fprintf(f, "---:|");
    fprintf(f, "\n");
}

/* Why the requests of results at load failed, a line each (none when none failed). */
static void md_failed(FILE *f, const struct kvr_report_meta *m, const struct kvr_sim_result *res,
                      size_t n, double load)
{
    for (size_t i = 0; i < n; i++) {
        if (res[i].load != load || !res[i].failed)
            continue;
        char label[128];
        kvr_report_label(m, &res[i], false, label, sizeof label);
        fprintf(f, "\n%s: %u request%s failed (up to %llu KV blocks needed): " FAILED_REASON ".\n",
                label, res[i].failed, res[i].failed > 1 ? "s" : "",
                (unsigned long long)res[i].failed_blocks);
    }
}

static void md_load(FILE *f, const struct kvr_report_meta *m, const struct kvr_sim_result *res,
                    size_t n, double load)
{
    fprintf(f, "\n## %s = %g\n\n| policy |", m->load_kind, load);
    md_header(f);
    fprintf(f, " hit / ceiling | finished | rejected | imbalance | preempt | pred. err | "
               "pruned (live) |");
    md_rule(f, 7);
    double best[NMETRICS];
    bool have_base = false;
    for (size_t k = 0; k < NMETRICS; k++)
        best[k] = metrics[k].lower_better ? 1e300 : -1e300;
    for (size_t i = 0; i < n; i++) {
        const struct kvr_sim_result *r = &res[i];
        if (r->load != load)
            continue;
        char label[128];
        kvr_report_label(m, r, false, label, sizeof label);
        fprintf(f, "| %s |", label);
        for (size_t k = 0; k < NMETRICS; k++)
            fprintf(f, metrics[k].fraction ? " %.3f |" : " %.1f |", metrics[k].get(r));
        fprintf(f, " %.3f | %u | %u | %.2f | %llu | %.1f%% | %llu (%llu) |\n",
                m->hit_ceiling > 0 ? r->hit_rate / m->hit_ceiling : 0, r->finished, r->rejected,
                r->imbalance, (unsigned long long)r->preemptions, 100 * r->pred_err_rel,
                (unsigned long long)r->index_pruned, (unsigned long long)r->index_pruned_live);
        if (r->policy == KVR_POLICY_KV)
            continue;
        have_base = true;
        for (size_t k = 0; k < NMETRICS; k++) {
            double v = metrics[k].get(r);
            if (metrics[k].lower_better ? v < best[k] : v > best[k])
                best[k] = v;
        }
    }
    md_failed(f, m, res, n, load);
    if (!have_base)
        return;
    fprintf(f, "\nRatio to the best baseline (below 1 is better for times, above 1 for hit rate "
               "and tok/s):\n\n| policy |");
    md_header(f);
    md_rule(f, 0);
    for (size_t i = 0; i < n; i++) {
        if (res[i].load != load)
            continue;
        char label[128];
        kvr_report_label(m, &res[i], false, label, sizeof label);
        fprintf(f, "| %s |", label);
        for (size_t k = 0; k < NMETRICS; k++) {
            double v = metrics[k].get(&res[i]);
            fprintf(f, best[k] != 0 ? " %.3f |" : " - |", best[k] != 0 ? v / best[k] : 0);
        }
        fprintf(f, "\n");
    }
}

/* The one-router result of r's policy at r's load, or NULL. */
static const struct kvr_sim_result *single_router(const struct kvr_sim_result *res, size_t n,
                                                  const struct kvr_sim_result *r)
{
    for (size_t i = 0; i < n; i++)
        if (res[i].replicas <= 1 && res[i].policy == r->policy && res[i].load == r->load)
            return &res[i];
    return NULL;
}

/* v / ref, or "-" when there is no reference (ref = 0). */
static void md_ratio(FILE *f, double v, double ref)
{
    if (ref > 0)
        fprintf(f, " %.3f |", v / ref);
    else
        fprintf(f, " - |");
}

static void md_replicas(FILE *f, const struct kvr_report_meta *m, const struct kvr_sim_result *res,
                        size_t n, double load)
{
    fprintf(f,
            "\nRouter replicas: each request reaches one replica, drawn at random (a queue group); "
            "every replica sees every engine event; with gossip each booking reaches the others "
            "%.2f ms later. Ratios are to one router with the same policy; the prediction error "
            "is over every replica's samples, and the worst replica's; bytes are the Gossip "
            "message's wire size (src/sim/sim.c).\n\n",
            m->cfg ? m->cfg->gossip_delay_ns / 1e6 : 0.0);
    fprintf(f, "| policy | N | gossip | hit rate | hit / N=1 | TTFT p50 | TTFT p90 | p90 / N=1 | "
               "TTFT mean | mean / N=1 | pred. err | worst replica | msgs / decision | "
               "bytes / decision | early events | late decisions |\n"
               "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < n; i++) {
        const struct kvr_sim_result *r = &res[i], *one = single_router(res, n, r);
        if (r->load != load)
            continue;
        double dec = r->decisions ? (double)r->decisions : 1;
        fprintf(f, "| %s | %u | %s | %.3f |", kvr_policy_name(r->policy), r->replicas,
                r->replicas > 1 ? (r->gossip ? "on" : "off") : "-", r->hit_rate);
        md_ratio(f, r->hit_rate, one ? one->hit_rate : 0);
        fprintf(f, " %.1f | %.1f |", r->ttft_ms.p50, r->ttft_ms.p90);
        md_ratio(f, r->ttft_ms.p90, one ? one->ttft_ms.p90 : 0);
        fprintf(f, " %.1f |", r->ttft_ms.mean);
        md_ratio(f, r->ttft_ms.mean, one ? one->ttft_ms.mean : 0);
        fprintf(f, " %.1f%% | %.1f%% | %.2f | %.1f | %llu | %llu |\n", 100 * r->pred_err_rel,
                100 * r->pred_err_rel_worst, r->gossip_msgs / dec, r->gossip_bytes / dec,
                (unsigned long long)r->early_events, (unsigned long long)r->late_decisions);
    }
}

/* Distinct loads in order of first appearance; returns how many (at most max). */
static size_t loads_of(const struct kvr_sim_result *res, size_t n, double *out, size_t max)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bool seen = false;
        for (size_t j = 0; j < k; j++)
            seen |= out[j] == res[i].load;
        if (!seen && k < max)
            out[k++] = res[i].load;
    }
    return k;
}

static kvr_status write_md(const char *dir, const struct kvr_report_meta *m,
                           const struct kvr_sim_result *res, size_t n)
{
    FILE *f = open_in(dir, "report.md", "w");
    if (!f)
        return KVR_ERR_IO;
    fprintf(f, "# %s: %s, %u workers, seed %llu\n\n", m->source ? m->source : "kvsim", m->workload,
            m->workers, (unsigned long long)m->seed);
    if (m->cfg) {
        const struct kvr_engine_config *e = &m->cfg->engine;
        fprintf(f,
                "Engine: %u blocks of %u tokens, %u batched tokens, %u sequences, speed-up %.2f. "
                "Event delay %.2f ms.\n\n",
                e->num_blocks, e->block_size, e->max_batched_tokens, e->max_seqs, e->speedup,
                m->cfg->event_delay_ns / 1e6);
    }
    if (m->arrival_spread_ms > 0)
        fprintf(f,
                "Arrivals spread: each moved later by a uniform draw in [0, %g) ms of trace "
                "time.\n\n",
                m->arrival_spread_ms);
    fprintf(f,
            "Prefix-cache hit ceilings: one unbounded cache %.4f; one cache holding all %u "
            "workers' blocks %.4f",
            m->hit_ceiling, m->workers, m->hit_ceiling_capacity);
    if (m->hit_ceiling_trace > 0)
        fprintf(f, "; documented for the trace %.3f", m->hit_ceiling_trace);
    fprintf(f, ".\n");
    if (m->cfg)
        fprintf(f, "\nITL mean is over every inter-token gap, pooled (a long output weighs more); "
                   "ITL/request mean is the mean over requests of each one's mean gap.\n");
    double *loads = malloc((n ? n : 1) * sizeof *loads);
    if (!loads) {
        fclose(f);
        return KVR_ERR_NOMEM;
    }
    size_t nload = loads_of(res, n, loads, n);
    for (size_t k = 0; k < nload; k++) {
        md_load(f, m, res, n, loads[k]);
        if (m->replicas)
            md_replicas(f, m, res, n, loads[k]);
    }
    free(loads);
    if (m->replicas)
        fprintf(f, "\nPlots: `ttft_cdf_<load>.png` (TTFT distribution per policy and replica "
                   "count), `ttft_p90_vs_replicas.png`, `hit_vs_replicas.png`.\n");
    else
        fprintf(f, "\nPlots: `ttft_cdf_<load>.png` (TTFT distribution per policy), "
                   "`ttft_p90_vs_load.png`, `hit_vs_load.png`.\n");
    return fclose(f) ? KVR_ERR_IO : KVR_OK;
}

kvr_status kvr_report_write(const char *dir, const struct kvr_report_meta *m,
                            const struct kvr_sim_result *res, size_t n)
{
    kvr_status st = write_json(dir, m, res, n);
    return st == KVR_OK ? write_md(dir, m, res, n) : st;
}

/* The TTFT distribution at each load: one line per policy (and replica set-up). */
static kvr_status plot_cdfs(FILE *gp, const char *dir, const struct kvr_report_meta *m,
                            const struct kvr_sim_result *res, size_t n, const double *loads,
                            size_t nl)
{
    for (size_t l = 0; l < nl; l++) {
        fprintf(gp,
                "set output 'ttft_cdf_%g.png'\nset title '%s, %u workers, %s %g: TTFT "
                "distribution'\nset xlabel 'TTFT (ms, log scale)'\nset ylabel 'fraction of "
                "requests'\nset logscale x\nplot",
                loads[l], m->workload, m->workers, m->load_kind, loads[l]);
        int lines = 0;
        for (size_t i = 0; i < n; i++) {
            if (res[i].load != loads[l] || !res[i].finished)
                continue;
            char label[128], name[256];
            kvr_report_label(m, &res[i], true, label, sizeof label);
            snprintf(name, sizeof name, "ttft_%g_%s.dat", loads[l], label);
            FILE *d = open_in(dir, name, "w");
            if (!d)
                return KVR_ERR_IO;
            uint32_t nf = res[i].finished, step = nf > 1000 ? nf / 1000 : 1;
            for (uint32_t k = 0; k < nf; k += step)
                fprintf(d, "%.3f %.5f\n",
                        res[i].ttft_sorted[k] > 0.001 ? res[i].ttft_sorted[k] : 0.001,
                        (double)(k + 1) / nf);
            fprintf(d, "%.3f 1\n", res[i].ttft_sorted[nf - 1]);
            fclose(d);
            kvr_report_label(m, &res[i], false, label, sizeof label);
            fprintf(gp, "%s '%s' using 1:2 with lines lt %d title '%s'", lines ? "," : "", name,
                    m->replicas ? lines + 1 : (int)res[i].policy + 1, label);
            lines++;
        }
        fprintf(gp, lines ? "\n" : " 1/0 notitle\n");
        fprintf(gp, "unset logscale x\n");
    }
    return KVR_OK;
}

/*
 * TTFT p90 and hit rate against load or replicas, one line per data block of file (columns: x,
 * TTFT p90, hit rate); titles[b] and lts[b] name and draw block b.
 */
static void plot_lines(FILE *gp, const struct kvr_report_meta *m, const char *file,
                       const char *xlabel, const char *titles[], const int *lts, int nblocks)
{
    const char *what[2][3] = {{"ttft_p90", "TTFT p90 (ms)", "2"},
                              {"hit", "prefix-cache hit rate", "3"}};
    const char *against = m->replicas ? "replicas" : "load";
    for (int k = 0; k < 2; k++) {
        fprintf(gp,
                "set output '%s_vs_%s.png'\nset title '%s, %u workers: %s against %s'\nset "
                "xlabel '%s'\nset ylabel '%s'\n%splot",
                what[k][0], against, m->workload, m->workers, what[k][1], against, xlabel,
                what[k][1], k == 0 ? "set logscale y\n" : "unset logscale y\n");
        for (int b = 0; b < nblocks; b++)
            fprintf(gp, "%s '%s' index %d using 1:%s with linespoints lt %d title '%s'",
                    b ? "," : "", file, b, what[k][2], lts[b], titles[b]);
        fprintf(gp, nblocks ? "\n" : " 1/0 notitle\n");
    }
}

/* TTFT p90 and hit rate against load, one line per policy. */
static kvr_status plot_by_load(FILE *gp, const char *dir, const struct kvr_report_meta *m,
                               const struct kvr_sim_result *res, size_t n, const double *loads,
                               size_t nl)
{
    FILE *d = open_in(dir, "by_load.dat", "w");
    if (!d)
        return KVR_ERR_IO;
    const char *titles[KVR_POLICY_COUNT];
    int lts[KVR_POLICY_COUNT], nb = 0;
    for (int p = 0; p < KVR_POLICY_COUNT; p++) {
        bool used = false;
        for (size_t l = 0; l < nl; l++) {
            for (size_t i = 0; i < n; i++) {
                if (res[i].policy != (enum kvr_policy)p || res[i].load != loads[l])
                    continue;
                if (!used)
                    fprintf(d, "# %s\n", kvr_policy_name((enum kvr_policy)p));
                used = true;
                fprintf(d, "%g %.3f %.5f\n", loads[l], res[i].ttft_ms.p90, res[i].hit_rate);
            }
        }
        if (!used)
            continue;
        fprintf(d, "\n\n");
        titles[nb] = kvr_policy_name((enum kvr_policy)p);
        lts[nb++] = p + 1;
    }
    fclose(d);
    plot_lines(gp, m, "by_load.dat", m->load_kind, titles, lts, nb);
    return KVR_OK;
}

/* Distinct replica counts, ascending; returns how many (at most max). */
static size_t replicas_of(const struct kvr_sim_result *res, size_t n, uint32_t *out, size_t max)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < k && out[j] < res[i].replicas)
            j++;
        if ((j < k && out[j] == res[i].replicas) || k == max)
            continue;
        memmove(out + j + 1, out + j, (k - j) * sizeof *out);
        out[j] = res[i].replicas;
        k++;
    }
    return k;
}

/* The data rows of one line of the replica plots (one per replica count); rows with N > 1. */
static int replica_rows(FILE *d, const struct kvr_sim_result *res, size_t n, const uint32_t *reps,
                        size_t nr, enum kvr_policy p, double load, bool gossip)
{
    int rows = 0;
    for (size_t r = 0; r < nr; r++) {
        for (size_t i = 0; i < n; i++) {
            const struct kvr_sim_result *x = &res[i];
            if (x->policy != p || x->load != load || x->replicas != reps[r] ||
                (x->replicas > 1 && x->gossip != gossip))
                continue;
            fprintf(d, "%u %.3f %.5f\n", x->replicas, x->ttft_ms.p90, x->hit_rate);
            rows += x->replicas > 1;
            break;
        }
    }
    return rows;
}

/*
 * TTFT p90 and hit rate against the replica count: a line per load, policy and gossip setting,
 * each starting at the one router.
 */
static kvr_status plot_by_replicas(FILE *gp, const char *dir, const struct kvr_report_meta *m,
                                   const struct kvr_sim_result *res, size_t n, const double *loads,
                                   size_t nl)
{
    size_t most = nl * KVR_POLICY_COUNT * 2 + 1; /* lines at most */
    uint32_t *reps = malloc((n ? n : 1) * sizeof *reps);
    char(*names)[96] = malloc(most * sizeof *names);
    const char **titles = malloc(most * sizeof *titles);
    int *lts = malloc(most * sizeof *lts), nb = 0;
    FILE *d = reps && names && titles && lts ? open_in(dir, "by_replicas.dat", "w") : NULL;
    size_t nr = d ? replicas_of(res, n, reps, n) : 0;
    for (size_t l = 0; d && l < nl; l++) {
        for (int p = 0; p < KVR_POLICY_COUNT; p++) {
            for (int g = 1; g >= 0; g--) {
                if (!replica_rows(d, res, n, reps, nr, (enum kvr_policy)p, loads[l], g))
                    continue;
                fprintf(d, "\n\n");
                snprintf(names[nb], sizeof names[nb], "%s, %s %g, %s",
                         kvr_policy_name((enum kvr_policy)p), m->load_kind, loads[l],
                         g ? "gossip" : "no gossip");
                titles[nb] = names[nb];
                lts[nb] = nb + 1;
                nb++;
            }
        }
    }
    kvr_status st = d ? KVR_OK : KVR_ERR_IO;
    if (d) {
        fclose(d);
        fprintf(gp, "set logscale x 2\n");
        plot_lines(gp, m, "by_replicas.dat", "router replicas", titles, lts, nb);
        fprintf(gp, "unset logscale x\n");
    }
    free(reps);
    free(names);
    free(titles);
    free(lts);
    return st;
}

kvr_status kvr_report_plots(const char *dir, const struct kvr_report_meta *m,
                            const struct kvr_sim_result *res, size_t n)
{
    double *loads = malloc((n ? n : 1) * sizeof *loads);
    if (!loads)
        return KVR_ERR_NOMEM;
    size_t nl = loads_of(res, n, loads, n);
    kvr_sort_doubles(loads, nl);
    FILE *gp = open_in(dir, "plots.gp", "w");
    if (!gp) {
        free(loads);
        return KVR_ERR_IO;
    }
    fprintf(gp, "set terminal pngcairo size 1000,640 noenhanced\nset grid\nset key bottom right\n");
    /* one fixed style per policy, the same in every plot; kv drawn thick and black */
    static const char *colors[KVR_POLICY_COUNT] = {"#000000", "#e69f00", "#56b4e9",
                                                   "#009e73", "#f0e442", "#0072b2",
                                                   "#d55e00", "#cc79a7", "#999999"};
    for (int p = 0; p < KVR_POLICY_COUNT; p++)
        fprintf(gp, "set linetype %d lc rgb '%s' lw %d dt %d\n", p + 1, colors[p], p ? 2 : 3,
                p < 5 ? 1 : 2);
    kvr_status st = plot_cdfs(gp, dir, m, res, n, loads, nl);
    if (st == KVR_OK)
        st = m->replicas ? plot_by_replicas(gp, dir, m, res, n, loads, nl)
                         : plot_by_load(gp, dir, m, res, n, loads, nl);
    free(loads);
    if (fclose(gp) || st != KVR_OK)
        return KVR_ERR_IO;
    char cmd[4200];
    if ((size_t)snprintf(cmd, sizeof cmd, "cd '%s' && gnuplot plots.gp 2>gnuplot.log", dir) >=
        sizeof cmd)
        return KVR_ERR_IO;
    return system(cmd) == 0 ? KVR_OK : KVR_ERR_IO;
}

FILE *kvr_report_requests_open(const char *dir)
{
    FILE *f = open_in(dir, "requests.csv", "w");
    if (f)
        fprintf(f, "run,load,request,group,worker,arrival_ms,isl,osl,cached_tokens,preemptions,"
                   "queue_ms,ttft_ms,e2e_ms,itl_mean_ms,itl_max_ms\n");
    return f;
}

/* ",%.3f", or "," for a figure not known. */
static void csv_ms(FILE *f, double v)
{
    if (isnan(v))
        fputc(',', f);
    else
        fprintf(f, ",%.3f", v);
}

kvr_status kvr_report_requests_write(FILE *f, const struct kvr_report_meta *m,
                                     struct kvr_sim_result *r)
{
    char label[128];
    kvr_report_label(m, r, true, label, sizeof label);
    for (uint32_t i = 0; r->per_request && i < r->finished; i++) {
        const struct kvr_sim_request *q = &r->per_request[i];
        fprintf(f, "%s,%g,%u,", label, r->load, q->index);
        if (q->group != KVR_SIM_NO_GROUP)
            fprintf(f, "%llu", (unsigned long long)q->group);
        fprintf(f, ",%llu", (unsigned long long)q->worker);
        csv_ms(f, q->arrival_ms);
        fprintf(f, ",%u,%u,%u,", q->isl, q->osl, q->cached_tokens);
        if (q->preemptions != KVR_SIM_UNKNOWN)
            fprintf(f, "%u", q->preemptions);
        csv_ms(f, q->queue_ms);
        csv_ms(f, q->ttft_ms);
        csv_ms(f, q->e2e_ms);
        csv_ms(f, q->itl_mean_ms);
        csv_ms(f, q->itl_max_ms);
        fputc('\n', f);
    }
    free(r->per_request);
    r->per_request = NULL;
    return fflush(f) || ferror(f) ? KVR_ERR_IO : KVR_OK;
}
