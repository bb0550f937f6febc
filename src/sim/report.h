/*
 * kvsim's reports: report.json (every figure, for machines), report.md (tables with each metric's
 * ratio to the best baseline, for people), and the plots (TTFT distribution per policy at each
 * load, TTFT p90 and hit rate against load), drawn by gnuplot from data files it also leaves
 * behind. The JSON and markdown depend only on the results, so equal runs give equal files.
 */
#ifndef KVR_REPORT_H
#define KVR_REPORT_H

#include <stdio.h>

#include "sim.h"

struct kvr_report_meta {
    const char *source; /* "kvsim" or "kvbench" (NULL: kvsim) */
    const char *workload;
    uint32_t workers;
    uint64_t seed;
    const char *load_kind;            /* "rate_scale" or "concurrency" */
    const struct kvr_sim_config *cfg; /* the simulation's settings; NULL for measurements */
    double hit_ceiling;               /* one unbounded cache */
    double hit_ceiling_capacity;      /* one cache holding every worker's capacity */
    double hit_ceiling_trace;         /* the trace's documented ceiling, 0 when none */
    double arrival_spread_ms;         /* arrivals spread over this (kvr_workload_spread); 0: none */
    bool replicas;                    /* the results compare router replicas: each says how many
                                         and whether they gossiped, and report.md has their table */
};

/*
 * What a result is called in tables and plots: its policy, and with replicas also "N=4 gossip" or
 * "N=4 no-gossip" (one replica: "N=1"). file: the same as a file-name part ("kv_n4_gossip").
 */
void kvr_report_label(const struct kvr_report_meta *m, const struct kvr_sim_result *r, bool file,
                      char *buf, size_t len);

/* Create dir and its missing parents (like mkdir -p); 0 on success. */
int kvr_mkdir_p(const char *dir);

/* Write report.json and report.md into dir (which must exist). */
kvr_status kvr_report_write(const char *dir, const struct kvr_report_meta *m,
                            const struct kvr_sim_result *res, size_t n);

/*
 * Write the plot data and plots.gp into dir and run gnuplot on it. Returns KVR_ERR_IO, with the
 * data and script left in place, when gnuplot is missing or fails.
 */
kvr_status kvr_report_plots(const char *dir, const struct kvr_report_meta *m,
                            const struct kvr_sim_result *res, size_t n);

/* requests.csv in dir (--per-request), its header written; NULL when it cannot be (errno). */
FILE *kvr_report_requests_open(const char *dir);

/*
 * Result r's per-request records as lines of requests.csv (the run named as the report's file
 * names have it), then freed: written as each run ends, a sweep holds one run's at a time. A
 * figure a measurement does not know (NaN, KVR_SIM_UNKNOWN) is an empty field. KVR_OK, or
 * KVR_ERR_IO when the file could not be written.
 */
kvr_status kvr_report_requests_write(FILE *f, const struct kvr_report_meta *m,
                                     struct kvr_sim_result *r);

#endif
