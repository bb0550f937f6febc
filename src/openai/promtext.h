/*
 * kvr_promtext: a strict reader of the Prometheus text exposition format (version 0.0.4), line
 * by line: `name{label="value",...} value [timestamp]`, label values unescaped (\\, \", \n;
 * any other escape is an error), comments and blank lines skipped, values as Go writes them
 * (decimal, NaN, +Inf, -Inf; no hex). No Debian C library reads this format. Bounded: a line of
 * at most KVR_PROMTEXT_LINE_MAX bytes and KVR_PROMTEXT_LABELS_MAX labels. Pure, thread-safe
 * (the state is the caller's).
 */
#ifndef KVR_PROMTEXT_H
#define KVR_PROMTEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr/status.h"

#define KVR_PROMTEXT_LINE_MAX   16384 /* bytes in a line, at most */
#define KVR_PROMTEXT_LABELS_MAX 64    /* labels on a sample, at most */

struct kvr_promtext_label {
    const char *name; /* into the line, not NUL-terminated */
    size_t name_len;
    const char *value; /* unescaped, into the scratch, not NUL-terminated */
    size_t value_len;
};

struct kvr_promtext_sample {
    const char *name; /* into the line, not NUL-terminated */
    size_t name_len;
    uint32_t n_labels;
    struct kvr_promtext_label labels[KVR_PROMTEXT_LABELS_MAX];
    double value;
    bool has_timestamp;
    int64_t timestamp_ms;
};

/*
 * One line (line[0..len), no line end) into *out: KVR_OK with *is_sample false for a comment or
 * a blank line; KVR_ERR_MALFORMED; KVR_ERR_TOO_LARGE (len over KVR_PROMTEXT_LINE_MAX). scratch
 * must hold len bytes; out points into line and scratch.
 */
kvr_status kvr_promtext_line(const char *line, size_t len, char *scratch,
                             struct kvr_promtext_sample *out, bool *is_sample);

/* Called for every sample of a text; borrowed until it returns. */
typedef void (*kvr_promtext_fn)(void *ctx, const struct kvr_promtext_sample *s);

/*
 * Every line of text[0..len) (LF or CRLF ends), fn called per sample; *samples and *bad count
 * the sample lines and the lines that failed (skipped). KVR_OK, or KVR_ERR_NOMEM.
 */
kvr_status kvr_promtext_parse(const char *text, size_t len, kvr_promtext_fn fn, void *ctx,
                              uint32_t *samples, uint32_t *bad);

/* Whether the label name of l is name (NUL-terminated). */
bool kvr_promtext_label_is(const struct kvr_promtext_label *l, const char *name);

#endif
