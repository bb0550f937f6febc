/*
 * The Prometheus text format, read (promtext.h). A cursor walks the line; each token is checked
 * against the format's grammar before anything is taken from it.
 */
#include "promtext.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct cursor {
    const char *p, *end;
};

static void blanks(struct cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t'))
        c->p++;
}

static bool name_char(char ch, bool first, bool colon)
{
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' || (colon && ch == ':'))
        return true;
    return !first && ch >= '0' && ch <= '9';
}

/* A metric name (colons allowed) or a label name; false when none starts here. */
static bool take_name(struct cursor *c, bool colon, const char **name, size_t *len)
{
    const char *s = c->p;
    if (s == c->end || !name_char(*s, true, colon))
        return false;
    while (c->p < c->end && name_char(*c->p, false, colon))
        c->p++;
    *name = s;
    *len = (size_t)(c->p - s);
    return true;
}

/* A quoted label value, unescaped into *out (advanced past it). */
static bool take_value(struct cursor *c, char **out, const char **val, size_t *len)
{
    if (c->p == c->end || *c->p != '"')
        return false;
    c->p++;
    char *o = *out;
    *val = o;
    while (c->p < c->end && *c->p != '"') {
        char ch = *c->p++;
        if (ch == '\\') {
            if (c->p == c->end)
                return false;
            ch = *c->p++;
            if (ch == 'n')
                ch = '\n';
            else if (ch != '\\' && ch != '"')
                return false;
        }
        *o++ = ch;
    }
    if (c->p == c->end)
        return false;
    c->p++; /* the closing quote */
    *len = (size_t)(o - *val);
    *out = o;
    return true;
}

static bool take_labels(struct cursor *c, char *scratch, struct kvr_promtext_sample *out)
{
    c->p++; /* '{' */
    for (;;) {
        blanks(c);
        if (c->p < c->end && *c->p == '}') {
            c->p++;
            return true;
        }
        if (out->n_labels == KVR_PROMTEXT_LABELS_MAX)
            return false;
        struct kvr_promtext_label *l = &out->labels[out->n_labels++];
        if (!take_name(c, false, &l->name, &l->name_len))
            return false;
        blanks(c);
        if (c->p == c->end || *c->p++ != '=')
            return false;
        blanks(c);
        if (!take_value(c, &scratch, &l->value, &l->value_len))
            return false;
        blanks(c);
        if (c->p < c->end && *c->p == ',')
            c->p++;
        else if (c->p == c->end || *c->p != '}')
            return false;
    }
}

/* The next blank-delimited token. */
static size_t take_token(struct cursor *c, const char **tok)
{
    *tok = c->p;
    while (c->p < c->end && *c->p != ' ' && *c->p != '\t')
        c->p++;
    return (size_t)(c->p - *tok);
}

static bool parse_value(const char *tok, size_t n, double *out)
{
    char buf[64];
    if (n == 0 || n >= sizeof buf)
        return false;
    memcpy(buf, tok, n);
    buf[n] = 0;
    if (strcmp(buf, "NaN") == 0) {
        *out = NAN;
        return true;
    }
    if (strcmp(buf, "+Inf") == 0 || strcmp(buf, "Inf") == 0 || strcmp(buf, "-Inf") == 0) {
        *out = buf[0] == '-' ? -INFINITY : INFINITY;
        return true;
    }
    if (strspn(buf, "0123456789.eE+-") != n)
        return false; /* no hex, no words */
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    if (end != buf + n || errno == ERANGE)
        return false;
    *out = v;
    return true;
}

static bool parse_timestamp(const char *tok, size_t n, int64_t *out)
{
    size_t i = tok[0] == '-';
    if (n == i || n > 20)
        return false;
    int64_t v = 0;
    for (; i < n; i++) {
        if (tok[i] < '0' || tok[i] > '9' || v > (INT64_MAX - 9) / 10)
            return false;
        v = v * 10 + (tok[i] - '0');
    }
    *out = tok[0] == '-' ? -v : v;
    return true;
}

kvr_status kvr_promtext_line(const char *line, size_t len, char *scratch,
                             struct kvr_promtext_sample *out, bool *is_sample)
{
    *is_sample = false;
    if (len > KVR_PROMTEXT_LINE_MAX)
        return KVR_ERR_TOO_LARGE;
    struct cursor c = {line, line + len};
    blanks(&c);
    if (c.p == c.end || *c.p == '#')
        return KVR_OK;
    out->n_labels = 0;
    out->has_timestamp = false;
    if (!take_name(&c, true, &out->name, &out->name_len))
        return KVR_ERR_MALFORMED;
    const char *before = c.p;
    blanks(&c);
    if (c.p < c.end && *c.p == '{') {
        if (!take_labels(&c, scratch, out))
            return KVR_ERR_MALFORMED;
        before = c.p;
        blanks(&c);
    }
    if (c.p == before)
        return KVR_ERR_MALFORMED; /* the value must be set apart */
    const char *tok;
    size_t n = take_token(&c, &tok);
    if (!parse_value(tok, n, &out->value))
        return KVR_ERR_MALFORMED;
    blanks(&c);
    if (c.p < c.end) {
        n = take_token(&c, &tok);
        if (!parse_timestamp(tok, n, &out->timestamp_ms))
            return KVR_ERR_MALFORMED;
        out->has_timestamp = true;
        blanks(&c);
    }
    if (c.p != c.end)
        return KVR_ERR_MALFORMED;
    *is_sample = true;
    return KVR_OK;
}

kvr_status kvr_promtext_parse(const char *text, size_t len, kvr_promtext_fn fn, void *ctx,
                              uint32_t *samples, uint32_t *bad)
{
    *samples = 0;
    *bad = 0;
    char *scratch = malloc(KVR_PROMTEXT_LINE_MAX);
    struct kvr_promtext_sample *s = malloc(sizeof *s);
    if (!scratch || !s) {
        free(scratch);
        free(s);
        return KVR_ERR_NOMEM;
    }
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *eol = nl ? nl : end;
        size_t n = (size_t)(eol - p);
        if (n && p[n - 1] == '\r')
            n--;
        bool is_sample = false;
        kvr_status st = kvr_promtext_line(p, n, scratch, s, &is_sample);
        if (st != KVR_OK) {
            (*bad)++;
        } else if (is_sample) {
            (*samples)++;
            fn(ctx, s);
        }
        p = nl ? nl + 1 : end;
    }
    free(scratch);
    free(s);
    return KVR_OK;
}

bool kvr_promtext_label_is(const struct kvr_promtext_label *l, const char *name)
{
    return strlen(name) == l->name_len && memcmp(l->name, name, l->name_len) == 0;
}
