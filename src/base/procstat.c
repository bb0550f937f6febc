/*
 * This process's own figures.
 */
#define _DEFAULT_SOURCE
#include "procstat.h"

#include <dirent.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

#include "clock.h"

static double started; /* Unix seconds; 0 until kvr_procstat_start */

void kvr_procstat_start(void)
{
    if (!started)
        started = (double)kvr_realtime_ns() / 1e9;
}

static uint64_t count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    uint64_t n = 0;
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n ? n - 1 : 0; /* less the one opendir holds */
}

double kvr_procstat_cpu_seconds(void)
{
    struct rusage u;
    if (getrusage(RUSAGE_SELF, &u))
        return 0;
    return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec / 1e6 +
           (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec / 1e6;
}

void kvr_procstat_read(struct kvr_procstat *out)
{
    *out =
        (struct kvr_procstat){.start_seconds = started, .cpu_seconds = kvr_procstat_cpu_seconds()};
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0, resident = 0;
    if (f && fscanf(f, "%llu %llu", &pages, &resident) == 2)
        out->rss_bytes = (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
    if (f)
        fclose(f);
    out->open_fds = count_fds();
}

kvr_status kvr_prom_process(struct kvr_prom *p, const struct kvr_procstat *s)
{
    kvr_prom_family(p, "process_cpu_seconds_total", KVR_PROM_COUNTER,
                    "User and system CPU time spent in seconds.");
    kvr_prom_f64(p, NULL, 0, s->cpu_seconds);
    kvr_prom_gauge(p, "process_resident_memory_bytes", "Resident memory size in bytes.",
                   (double)s->rss_bytes);
    kvr_prom_gauge(p, "process_open_fds", "Number of open file descriptors.", (double)s->open_fds);
    kvr_prom_gauge(p, "process_start_time_seconds",
                   "Start time of the process since unix epoch in seconds.", s->start_seconds);
    return kvr_prom_end(p);
}
