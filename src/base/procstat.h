/*
 * This process's own figures for the process_* metrics every Prometheus exporter has: CPU
 * seconds (user and system, getrusage), resident memory (/proc/self/statm), open file
 * descriptors (/proc/self/fd) and the start time. Linux; thread-safe.
 */
#ifndef KVR_PROCSTAT_H
#define KVR_PROCSTAT_H

#include <stdint.h>

#include "prom.h"

struct kvr_procstat {
    double cpu_seconds;   /* user + system, all threads */
    uint64_t rss_bytes;   /* resident set; 0 when unknown */
    uint64_t open_fds;    /* 0 when unknown */
    double start_seconds; /* Unix seconds at kvr_procstat_start */
};

/* Note the process's start (call once, early in main). */
void kvr_procstat_start(void);
void kvr_procstat_read(struct kvr_procstat *out);
/* Just the CPU seconds (getrusage: no file opened). */
double kvr_procstat_cpu_seconds(void);

/* process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds,
 * process_start_time_seconds of s, into p. */
kvr_status kvr_prom_process(struct kvr_prom *p, const struct kvr_procstat *s);

#endif
