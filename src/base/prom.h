/*
 * Prometheus text exposition (format 0.0.4) into a kvr_buf, and a fixed-bucket latency
 * histogram. Pure: no I/O, no clock, no locks.
 *
 * A writer (struct kvr_prom) appends families to a buffer: kvr_prom_family opens one (its HELP
 * and TYPE lines), then its samples follow (kvr_prom_u64, kvr_prom_f64, kvr_prom_histogram),
 * and kvr_prom_end says whether all of it is good. The first error sticks: every later call
 * returns it and writes nothing, so a daemon can write all its families and check once.
 *
 * Names are checked (KVR_ERR_INVALID: a programming error, never data): metric names match
 * [a-zA-Z_:][a-zA-Z0-9_:]* (the daemons use no ':', which Prometheus keeps for recording rules;
 * the engine stand-in writes vLLM's and SGLang's names, which have one), do not end in
 * _bucket, _sum or _count (the histogram's own), and a counter's ends in _total; label names
 * match [a-zA-Z_][a-zA-Z0-9_]*, do not start with "__", are not "le" or "quantile", and appear
 * once per sample; each family appears once per exposition; help text is required. Units are
 * the caller's (base units: _seconds, _bytes; promtool check metrics lints the rest).
 * Label values and help are data: they are escaped (backslash, double quote in values, newline)
 * and invalid UTF-8 becomes U+FFFD, so any bytes give a valid exposition.
 *
 * Numbers are printed in the C locale's format (the programs never call setlocale): integers
 * exactly, doubles as the shortest text that reads back to the same value, NaN, +Inf, -Inf.
 *
 * A writer and a histogram are plain data with one owner: the caller serialises their use
 * (e.g. observe under the lock that already guards the figures, or keep one histogram per
 * thread and merge them for a scrape).
 */
#ifndef KVR_PROM_H
#define KVR_PROM_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "kvr/status.h"

#define KVR_PROM_NAME_MAX 128 /* bytes in a metric or label name */

enum kvr_prom_type { KVR_PROM_COUNTER, KVR_PROM_GAUGE, KVR_PROM_HISTOGRAM };

struct kvr_prom_label {
    const char *name;  /* borrowed for the call: a valid label name */
    const char *value; /* borrowed for the call: any NUL-terminated bytes */
};

struct kvr_prom {
    struct kvr_buf *out;                /* borrowed for the writer's life: appended to */
    size_t start;                       /* out->len when the writer began */
    char family[KVR_PROM_NAME_MAX + 1]; /* the open family's name; "" before the first */
    enum kvr_prom_type type;            /* the open family's type */
    kvr_status st;                      /* the first error; every later call returns it */
};

/* Begin an exposition appended to out (its contents so far are kept). out must outlive p. */
void kvr_prom_begin(struct kvr_prom *p, struct kvr_buf *out);

/*
 * Open the family name of type with help (one line of text; both borrowed for the call): its
 * `# HELP` and `# TYPE` lines. KVR_ERR_INVALID for a bad name, an empty help, a family already
 * written by this writer; KVR_ERR_NOMEM.
 */
kvr_status kvr_prom_family(struct kvr_prom *p, const char *name, enum kvr_prom_type type,
                           const char *help);

/*
 * One sample of the open counter or gauge, with labels[0..n) (n may be 0, labels then NULL;
 * borrowed for the call). KVR_ERR_INVALID when no counter or gauge is open, for a bad or
 * repeated label name, a negative counter value; KVR_ERR_NOMEM.
 */
kvr_status kvr_prom_u64(struct kvr_prom *p, const struct kvr_prom_label *labels, size_t n,
                        uint64_t v);
kvr_status kvr_prom_f64(struct kvr_prom *p, const struct kvr_prom_label *labels, size_t n,
                        double v);

/* A family with one unlabelled sample: kvr_prom_family, then kvr_prom_u64 / kvr_prom_f64. */
kvr_status kvr_prom_counter(struct kvr_prom *p, const char *name, const char *help, uint64_t v);
kvr_status kvr_prom_gauge(struct kvr_prom *p, const char *name, const char *help, double v);

/* The first error of the exposition, KVR_OK when it is complete and valid. After an error out
 * holds a partial exposition: do not serve it. */
kvr_status kvr_prom_end(const struct kvr_prom *p);

/* --- latency histogram ----------------------------------------------------------------------- */

/* Upper bounds, 5 us .. 1 s (1-2.5-5 steps: a decision takes microseconds), and +Inf above. */
#define KVR_PROM_HIST_BUCKETS 17

/* The bounds in ns, ascending. */
extern const uint64_t kvr_prom_hist_le_ns[KVR_PROM_HIST_BUCKETS];

/*
 * Observations of a duration. Zero-initialise (that is also the reset); copy by assignment.
 * bucket[i] counts observations in (le[i-1], le[i]] (not cumulative: the exposition adds them
 * up), bucket[KVR_PROM_HIST_BUCKETS] those above the last bound.
 */
struct kvr_prom_hist {
    uint64_t bucket[KVR_PROM_HIST_BUCKETS + 1]; /* observations per bucket */
    uint64_t sum_ns;                            /* their sum, ns; saturates at UINT64_MAX */
};

/* Count one observation of ns nanoseconds. */
void kvr_prom_hist_observe(struct kvr_prom_hist *h, uint64_t ns);
/* Add src's observations to dst (dst and src may not be the same). */
void kvr_prom_hist_merge(struct kvr_prom_hist *dst, const struct kvr_prom_hist *src);
/* How many observations h holds. */
uint64_t kvr_prom_hist_count(const struct kvr_prom_hist *h);

/*
 * The open histogram's samples for h with labels[0..n) (borrowed for the call): name_bucket
 * with le="..." for every bound and "+Inf" (cumulative), name_sum (seconds), name_count.
 * KVR_ERR_INVALID when no histogram is open or for a bad label name; KVR_ERR_NOMEM.
 */
kvr_status kvr_prom_histogram(struct kvr_prom *p, const struct kvr_prom_label *labels, size_t n,
                              const struct kvr_prom_hist *h);

#endif
