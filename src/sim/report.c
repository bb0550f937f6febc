/*
 * Report writers. Numbers are printed with fixed precision so that equal results give byte-equal
 * files.
 */
#include "report.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvr/policy.h"

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

static FILE *open_in(const char *dir, const char *name, const char *mode)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return NULL;
    return fopen(path, mode);
}

static void json_stat(FILE *f, const char *name, const struct kvr_sim_stat *s, bool full)
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

static void json_result(FILE *f, const struct kvr_report_meta *m, const struct kvr_sim_result *r)
{
    fprintf(f, "    {\"policy\": \"%s\", \"load\": %.4g, ", kvr_policy_name(r->policy), r->load);
    json_stat(f, "ttft_ms", &r->ttft_ms, true);
    fprintf(f, ", ");
    json_stat(f, "itl_ms", &r->itl_ms, false);
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
            "\"index_entries_max\": %llu, \"router_unknown_events\": %llu}",
            r->hit_rate, m->hit_ceiling, m->hit_ceiling_capacity,
            m->hit_ceiling > 0 ? r->hit_rate / m->hit_ceiling : 0,
            m->hit_ceiling_capacity > 0 ? r->hit_rate / m->hit_ceiling_capacity : 0,
            r->throughput_tok_s, r->requests, r->finished, r->rejected, r->imbalance,
            (unsigned long long)r->preemptions, (unsigned long long)r->evictions,
            r->pred_err_blocks, r->pred_err_rel, r->makespan_s,
            (unsigned long long)r->router_memory_max, (unsigned long long)r->index_entries_max,
            (unsigned long long)r->router_unknown);
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
        fprintf(f,
                "  \"router\": {\"overlap_weight\": %.3f, \"temperature\": %.3f, \"approximate\": "
                "%s, \"busy_threshold\": %.3f},\n",
                c->router.overlap_weight, c->router.temperature,
                c->router.approximate ? "true" : "false", c->router.busy_threshold);
        fprintf(f, "  \"event_delay_ms\": %.3f,\n", c->event_delay_ns / 1e6);
    }
    fprintf(f, "  \"hit_ceiling\": %.5f,\n  \"hit_ceiling_capacity\": %.5f,\n", m->hit_ceiling,
            m->hit_ceiling_capacity);
    if (m->hit_ceiling_trace > 0)
        fprintf(f, "  \"hit_ceiling_trace_doc\": %.4f,\n", m->hit_ceiling_trace);
    fprintf(f, "  \"results\": [\n");
    for (size_t i = 0; i < n; i++) {
        json_result(f, m, &res[i]);
        fprintf(f, "%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    return fclose(f) ? KVR_ERR_IO : KVR_OK;
}

/* The metrics of the markdown tables: how to read one, and whether lower is better. */
struct metric {
    const char *name;
    double (*get)(const struct kvr_sim_result *r);
    bool lower_better;
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
GETTER(itl_p99, r->itl_ms.p99)
GETTER(e2e_mean, r->e2e_ms.mean)
GETTER(e2e_p99, r->e2e_ms.p99)
GETTER(hit, r->hit_rate)
GETTER(tput, r->throughput_tok_s)
#undef GETTER

static const struct metric metrics[] = {
    {"TTFT mean ms", ttft_mean, true}, {"TTFT p50", ttft_p50, true},
    {"TTFT p90", ttft_p90, true},      {"TTFT p99", ttft_p99, true},
    {"ITL mean ms", itl_mean, true},   {"ITL p99", itl_p99, true},
    {"E2E mean ms", e2e_mean, true},   {"E2E p99", e2e_p99, true},
    {"hit rate", hit, false},          {"tok/s", tput, false},
};
#define NMETRICS (sizeof metrics / sizeof metrics[0])

static void md_load(FILE *f, const struct kvr_report_meta *m, const struct kvr_sim_result *res,
                    size_t n, double load)
{
    fprintf(f, "\n## %s = %g\n\n| policy |", m->load_kind, load);
    for (size_t k = 0; k < NMETRICS; k++)
        fprintf(f, " %s |", metrics[k].name);
    fprintf(f, " hit / ceiling | finished | rejected | imbalance | preempt | pred. err |\n|---|");
    for (size_t k = 0; k < NMETRICS + 6; k++)
        fprintf(f, "---:|");
    fprintf(f, "\n");
    double best[NMETRICS];
    bool have_base = false;
    for (size_t k = 0; k < NMETRICS; k++)
        best[k] = metrics[k].lower_better ? 1e300 : -1e300;
    for (size_t i = 0; i < n; i++) {
        const struct kvr_sim_result *r = &res[i];
        if (r->load != load)
            continue;
        fprintf(f, "| %s |", kvr_policy_name(r->policy));
        for (size_t k = 0; k < NMETRICS; k++)
            fprintf(f, k == 8 ? " %.3f |" : " %.1f |", metrics[k].get(r));
        fprintf(f, " %.3f | %u | %u | %.2f | %llu | %.1f%% |\n",
                m->hit_ceiling > 0 ? r->hit_rate / m->hit_ceiling : 0, r->finished, r->rejected,
                r->imbalance, (unsigned long long)r->preemptions, 100 * r->pred_err_rel);
        if (r->policy == KVR_POLICY_KV)
            continue;
        have_base = true;
        for (size_t k = 0; k < NMETRICS; k++) {
            double v = metrics[k].get(r);
            if (metrics[k].lower_better ? v < best[k] : v > best[k])
                best[k] = v;
        }
    }
    if (!have_base)
        return;
    fprintf(f, "\nRatio to the best baseline (below 1 is better for times, above 1 for hit rate "
               "and tok/s):\n\n| policy |");
    for (size_t k = 0; k < NMETRICS; k++)
        fprintf(f, " %s |", metrics[k].name);
    fprintf(f, "\n|---|");
    for (size_t k = 0; k < NMETRICS; k++)
        fprintf(f, "---:|");
    fprintf(f, "\n");
    for (size_t i = 0; i < n; i++) {
        if (res[i].load != load)
            continue;
        fprintf(f, "| %s |", kvr_policy_name(res[i].policy));
        for (size_t k = 0; k < NMETRICS; k++) {
            double v = metrics[k].get(&res[i]);
            fprintf(f, best[k] != 0 ? " %.3f |" : " - |", best[k] != 0 ? v / best[k] : 0);
        }
        fprintf(f, "\n");
    }
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
    fprintf(f,
            "Prefix-cache hit ceilings: one unbounded cache %.4f; one cache holding all %u "
            "workers' blocks %.4f",
            m->hit_ceiling, m->workers, m->hit_ceiling_capacity);
    if (m->hit_ceiling_trace > 0)
        fprintf(f, "; documented for the trace %.3f", m->hit_ceiling_trace);
    fprintf(f, ".\n");
    double done[64];
    size_t nload = 0;
    for (size_t i = 0; i < n; i++) {
        bool seen = false;
        for (size_t k = 0; k < nload; k++)
            seen |= done[k] == res[i].load;
        if (seen || nload == 64)
            continue;
        done[nload++] = res[i].load;
        md_load(f, m, res, n, res[i].load);
    }
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

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

kvr_status kvr_report_plots(const char *dir, const struct kvr_report_meta *m,
                            const struct kvr_sim_result *res, size_t n)
{
    double loads[64];
    size_t nl = loads_of(res, n, loads, 64);
    qsort(loads, nl, sizeof *loads, cmp_double);
    FILE *gp = open_in(dir, "plots.gp", "w");
    if (!gp)
        return KVR_ERR_IO;
    fprintf(gp, "set terminal pngcairo size 1000,640 noenhanced\nset grid\nset key bottom right\n");
    /* one fixed style per policy, the same in every plot; kv drawn thick and black */
    static const char *colors[KVR_POLICY_COUNT] = {"#000000", "#e69f00", "#56b4e9",
                                                   "#009e73", "#f0e442", "#0072b2",
                                                   "#d55e00", "#cc79a7", "#999999"};
    for (int p = 0; p < KVR_POLICY_COUNT; p++)
        fprintf(gp, "set linetype %d lc rgb '%s' lw %d dt %d\n", p + 1, colors[p], p ? 2 : 3,
                p < 5 ? 1 : 2);
    for (size_t l = 0; l < nl; l++) { /* TTFT distribution per policy at this load */
        fprintf(gp,
                "set output 'ttft_cdf_%g.png'\nset title '%s, %u workers, %s %g: TTFT "
                "distribution'\nset xlabel 'TTFT (ms, log scale)'\nset ylabel 'fraction of "
                "requests'\nset logscale x\nplot",
                loads[l], m->workload, m->workers, m->load_kind, loads[l]);
        bool first = true;
        for (size_t i = 0; i < n; i++) {
            if (res[i].load != loads[l] || !res[i].finished)
                continue;
            char name[256];
            snprintf(name, sizeof name, "ttft_%g_%s.dat", loads[l], kvr_policy_name(res[i].policy));
            FILE *d = open_in(dir, name, "w");
            if (!d) {
                fclose(gp);
                return KVR_ERR_IO;
            }
            uint32_t nf = res[i].finished, step = nf > 1000 ? nf / 1000 : 1;
            for (uint32_t k = 0; k < nf; k += step)
                fprintf(d, "%.3f %.5f\n",
                        res[i].ttft_sorted[k] > 0.001 ? res[i].ttft_sorted[k] : 0.001,
                        (double)(k + 1) / nf);
            fprintf(d, "%.3f 1\n", res[i].ttft_sorted[nf - 1]);
            fclose(d);
            fprintf(gp, "%s '%s' using 1:2 with lines lt %d title '%s'", first ? "" : ",", name,
                    (int)res[i].policy + 1, kvr_policy_name(res[i].policy));
            first = false;
        }
        fprintf(gp, first ? " 1/0 notitle\n" : "\n");
        fprintf(gp, "unset logscale x\n");
    }
    /* TTFT p90 and hit rate against load, one line per policy */
    FILE *d = open_in(dir, "by_load.dat", "w");
    if (!d) {
        fclose(gp);
        return KVR_ERR_IO;
    }
    bool used[KVR_POLICY_COUNT] = {false};
    for (int p = 0; p < KVR_POLICY_COUNT; p++) {
        for (size_t l = 0; l < nl; l++) {
            for (size_t i = 0; i < n; i++) {
                if (res[i].policy != (enum kvr_policy)p || res[i].load != loads[l])
                    continue;
                if (!used[p])
                    fprintf(d, "# %s\n", kvr_policy_name((enum kvr_policy)p));
                used[p] = true;
                fprintf(d, "%g %.3f %.5f\n", loads[l], res[i].ttft_ms.p90, res[i].hit_rate);
            }
        }
        if (used[p])
            fprintf(d, "\n\n");
    }
    fclose(d);
    const char *what[2][3] = {{"ttft_p90_vs_load.png", "TTFT p90 (ms)", "2"},
                              {"hit_vs_load.png", "prefix-cache hit rate", "3"}};
    for (int k = 0; k < 2; k++) {
        fprintf(gp,
                "set output '%s'\nset title '%s, %u workers: %s against load'\nset xlabel "
                "'%s'\nset ylabel '%s'\n%splot",
                what[k][0], m->workload, m->workers, what[k][1], m->load_kind, what[k][1],
                k == 0 ? "set logscale y\n" : "unset logscale y\n");
        int idx = 0;
        bool first = true;
        for (int p = 0; p < KVR_POLICY_COUNT; p++) {
            if (!used[p])
                continue;
            fprintf(gp, "%s 'by_load.dat' index %d using 1:%s with linespoints lt %d title '%s'",
                    first ? "" : ",", idx++, what[k][2], p + 1,
                    kvr_policy_name((enum kvr_policy)p));
            first = false;
        }
        fprintf(gp, first ? " 1/0 notitle\n" : "\n");
    }
    if (fclose(gp))
        return KVR_ERR_IO;
    char cmd[4200];
    if ((size_t)snprintf(cmd, sizeof cmd, "cd '%s' && gnuplot plots.gp 2>gnuplot.log", dir) >=
        sizeof cmd)
        return KVR_ERR_IO;
    return system(cmd) == 0 ? KVR_OK : KVR_ERR_IO;
}
