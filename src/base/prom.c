/*
 * Prometheus text exposition and the latency histogram. The writer keeps out->data
 * NUL-terminated after what it appended, so it can look back for a family's TYPE line.
 */
#include "prom.h"
#include "utf8.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const uint64_t kvr_prom_hist_le_ns[KVR_PROM_HIST_BUCKETS] = {
    5000,    10000,    25000,    50000,    100000,    250000,    500000,    1000000,    2500000,
    5000000, 10000000, 25000000, 50000000, 100000000, 250000000, 500000000, 1000000000,
};

/* The same bounds as le label values (in seconds). */
static const char *const hist_le_text[KVR_PROM_HIST_BUCKETS + 1] = {
    "5e-06", "1e-05", "2.5e-05", "5e-05", "0.0001", "0.00025", "0.0005", "0.001", "0.0025",
    "0.005", "0.01",  "0.025",   "0.05",  "0.1",    "0.25",    "0.5",    "1",     "+Inf",
};

static const char *const type_names[] = {"counter", "gauge", "histogram"};

/* --- output ---------------------------------------------------------------------------------- */

static kvr_status fail(struct kvr_prom *p, kvr_status st)
{
    if (p->st == KVR_OK)
        p->st = st;
    return p->st;
}

static void put(struct kvr_prom *p, const char *s, size_t n)
{
    if (p->st != KVR_OK)
        return;
    struct kvr_buf *b = p->out;
    if (n > SIZE_MAX - b->len - 1 || kvr_buf_reserve(b, b->len + n + 1) != KVR_OK) {
        fail(p, KVR_ERR_NOMEM);
        return;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

static void put_str(struct kvr_prom *p, const char *s)
{
    put(p, s, strlen(s));
}

/* s escaped: backslash and newline always, the double quote when quote; bad UTF-8 as U+FFFD. */
static void put_escaped(struct kvr_prom *p, const char *s, bool quote)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t run = 0; /* bytes of u[0..run) that go out unchanged */
    while (u[run]) {
        unsigned char c = u[run];
        size_t n = kvr_utf8_len(u + run, 4, NULL);
        const char *esc = NULL;
        if (c == '\\')
            esc = "\\\\";
        else if (c == '\n')
            esc = "\\n";
        else if (c == '"' && quote)
            esc = "\\\"";
        else if (n == 0)
            esc = "\xef\xbf\xbd";
        if (!esc) {
            run += n;
            continue;
        }
        put(p, (const char *)u, run);
        put_str(p, esc);
        u += run + 1;
        run = 0;
    }
    put(p, (const char *)u, run);
}

static void put_u64(struct kvr_prom *p, uint64_t v)
{
    char t[24];
    int n = snprintf(t, sizeof t, "%" PRIu64, v);
    put(p, t, (size_t)n);
}

/* The shortest of %.15g, %.16g, %.17g that reads back as v; NaN, +Inf, -Inf by name. */
static void put_f64(struct kvr_prom *p, double v)
{
    if (isnan(v)) {
        put_str(p, "NaN");
        return;
    }
    if (isinf(v)) {
        put_str(p, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    char t[32];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(t, sizeof t, "%.*g", prec, v);
        if (strtod(t, NULL) == v)
            break;
    }
    put_str(p, t);
}

/* --- names ----------------------------------------------------------------------------------- */

/* A metric name ([a-zA-Z_:][a-zA-Z0-9_:]*; the colon is for recording rules, and engines such as
 * vLLM use it) when colon, else a label name (no colon). */
static bool is_name(const char *s, bool colon)
{
    size_t n = strlen(s);
    if (n == 0 || n > KVR_PROM_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool alpha =
            (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
        if (!alpha && !(i > 0 && c >= '0' && c <= '9'))
            return false;
    }
    return true;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static bool metric_name_ok(const char *name, enum kvr_prom_type type)
{
    if (!name || !is_name(name, true))
        return false;
    if (ends_with(name, "_bucket") || ends_with(name, "_sum") || ends_with(name, "_count"))
        return false;
    return type != KVR_PROM_COUNTER || ends_with(name, "_total");
}

static bool labels_ok(const struct kvr_prom_label *labels, size_t n)
{
    if (n && !labels)
        return false;
    for (size_t i = 0; i < n; i++) {
        const char *name = labels[i].name;
        if (!name || !labels[i].value || !is_name(name, false) || !strncmp(name, "__", 2) ||
            !strcmp(name, "le") || !strcmp(name, "quantile"))
            return false;
        for (size_t j = 0; j < i; j++) {
            if (!strcmp(labels[j].name, name))
                return false;
        }
    }
    return true;
}

/* Whether this writer already wrote the TYPE line of name. */
static bool written(const struct kvr_prom *p, const char *name)
{
    if (p->out->len == p->start)
        return false;
    char pat[KVR_PROM_NAME_MAX + 16];
    snprintf(pat, sizeof pat, "\n# TYPE %s ", name);
    return strstr((const char *)p->out->data + p->start, pat) != NULL;
}

/* --- the writer ------------------------------------------------------------------------------ */

void kvr_prom_begin(struct kvr_prom *p, struct kvr_buf *out)
{
    memset(p, 0, sizeof *p);
    p->out = out;
    p->start = out->len;
}

kvr_status kvr_prom_family(struct kvr_prom *p, const char *name, enum kvr_prom_type type,
                           const char *help)
{
    if (p->st != KVR_OK)
        return p->st;
    if ((unsigned)type > KVR_PROM_HISTOGRAM || !metric_name_ok(name, type) || !help || !*help ||
        written(p, name))
        return fail(p, KVR_ERR_INVALID);
    put_str(p, "# HELP ");
    put_str(p, name);
    put_str(p, " ");
    put_escaped(p, help, false);
    put_str(p, "\n# TYPE ");
    put_str(p, name);
    put_str(p, " ");
    put_str(p, type_names[type]);
    put_str(p, "\n");
    if (p->st == KVR_OK) {
        memcpy(p->family, name, strlen(name) + 1);
        p->type = type;
    }
    return p->st;
}

/* name{labels,extra="value"} with the extra label when extra is not NULL. */
static void put_series(struct kvr_prom *p, const char *suffix, const struct kvr_prom_label *labels,
                       size_t n, const char *extra, const char *extra_value)
{
    put_str(p, p->family);
    put_str(p, suffix);
    if (n == 0 && !extra)
        return;
    put_str(p, "{");
    for (size_t i = 0; i < n; i++) {
        if (i)
            put_str(p, ",");
        put_str(p, labels[i].name);
        put_str(p, "=\"");
        put_escaped(p, labels[i].value, true);
        put_str(p, "\"");
    }
    if (extra) {
        put_str(p, n ? "," : "");
        put_str(p, extra);
        put_str(p, "=\"");
        put_str(p, extra_value);
        put_str(p, "\"");
    }
    put_str(p, "}");
}

/* Whether a counter or gauge sample may be written now. */
static bool scalar_open(const struct kvr_prom *p, const struct kvr_prom_label *labels, size_t n)
{
    return p->family[0] && p->type != KVR_PROM_HISTOGRAM && labels_ok(labels, n);
}

kvr_status kvr_prom_u64(struct kvr_prom *p, const struct kvr_prom_label *labels, size_t n,
                        uint64_t v)
{
    if (p->st != KVR_OK)
        return p->st;
    if (!scalar_open(p, labels, n))
        return fail(p, KVR_ERR_INVALID);
    put_series(p, "", labels, n, NULL, NULL);
    put_str(p, " ");
    put_u64(p, v);
    put_str(p, "\n");
    return p->st;
}

kvr_status kvr_prom_f64(struct kvr_prom *p, const struct kvr_prom_label *labels, size_t n, double v)
{
    if (p->st != KVR_OK)
        return p->st;
    if (!scalar_open(p, labels, n) || (p->type == KVR_PROM_COUNTER && v < 0))
        return fail(p, KVR_ERR_INVALID);
    put_series(p, "", labels, n, NULL, NULL);
    put_str(p, " ");
    put_f64(p, v);
    put_str(p, "\n");
    return p->st;
}

kvr_status kvr_prom_counter(struct kvr_prom *p, const char *name, const char *help, uint64_t v)
{
    if (kvr_prom_family(p, name, KVR_PROM_COUNTER, help) != KVR_OK)
        return p->st;
    return kvr_prom_u64(p, NULL, 0, v);
}

kvr_status kvr_prom_gauge(struct kvr_prom *p, const char *name, const char *help, double v)
{
    if (kvr_prom_family(p, name, KVR_PROM_GAUGE, help) != KVR_OK)
        return p->st;
    return kvr_prom_f64(p, NULL, 0, v);
}

kvr_status kvr_prom_end(const struct kvr_prom *p)
{
    return p->st;
}

/* --- histogram ------------------------------------------------------------------------------- */

void kvr_prom_hist_observe(struct kvr_prom_hist *h, uint64_t ns)
{
    size_t i = 0;
    while (i < KVR_PROM_HIST_BUCKETS && ns > kvr_prom_hist_le_ns[i])
        i++;
    h->bucket[i]++;
    h->sum_ns = ns > UINT64_MAX - h->sum_ns ? UINT64_MAX : h->sum_ns + ns;
}

void kvr_prom_hist_merge(struct kvr_prom_hist *dst, const struct kvr_prom_hist *src)
{
    for (size_t i = 0; i <= KVR_PROM_HIST_BUCKETS; i++)
        dst->bucket[i] += src->bucket[i];
    uint64_t s = src->sum_ns;
    dst->sum_ns = s > UINT64_MAX - dst->sum_ns ? UINT64_MAX : dst->sum_ns + s;
}

uint64_t kvr_prom_hist_count(const struct kvr_prom_hist *h)
{
    uint64_t n = 0;
    for (size_t i = 0; i <= KVR_PROM_HIST_BUCKETS; i++)
        n += h->bucket[i];
    return n;
}

kvr_status kvr_prom_histogram(struct kvr_prom *p, const struct kvr_prom_label *labels, size_t n,
                              const struct kvr_prom_hist *h)
{
    if (p->st != KVR_OK)
        return p->st;
    if (!p->family[0] || p->type != KVR_PROM_HISTOGRAM || !h || !labels_ok(labels, n))
        return fail(p, KVR_ERR_INVALID);
    uint64_t cum = 0;
    for (size_t i = 0; i <= KVR_PROM_HIST_BUCKETS; i++) {
        cum += h->bucket[i];
        put_series(p, "_bucket", labels, n, "le", hist_le_text[i]);
        put_str(p, " ");
        put_u64(p, cum);
        put_str(p, "\n");
    }
    put_series(p, "_sum", labels, n, NULL, NULL);
    put_str(p, " ");
    put_f64(p, (double)h->sum_ns / 1e9);
    put_str(p, "\n");
    put_series(p, "_count", labels, n, NULL, NULL);
    put_str(p, " ");
    put_u64(p, cum);
    put_str(p, "\n");
    return p->st;
}
