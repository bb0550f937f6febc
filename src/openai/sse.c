/*
 * kvr_sse implementation. A line is classified from its first bytes (at most "data:", kept in
 * head): a data line's value goes straight into the event buffer, every other line is dropped
 * byte by byte, so only event data is ever stored.
 */
#include "sse.h"

#include <string.h>

#define SSE_DEFAULT_EVENT (1u << 20)
#define SSE_KEEP_BYTES    (64u * 1024u) /* event room kept between events; a larger one is freed */

enum line_kind {
    LINE_START, /* nothing seen on this line yet */
    LINE_HEAD,  /* a field name being read into head */
    LINE_DATA0, /* right after "data:": one space is dropped */
    LINE_DATA,  /* the rest of a data line's value */
    LINE_SKIP,  /* a comment or another field: dropped */
};

static const uint8_t utf8_bom[3] = {0xef, 0xbb, 0xbf};

void kvr_sse_init(struct kvr_sse *p, size_t max_event)
{
    memset(p, 0, sizeof *p);
    p->max_event = max_event ? max_event : SSE_DEFAULT_EVENT;
}

void kvr_sse_free(struct kvr_sse *p)
{
    kvr_buf_free(&p->data);
}

bool kvr_sse_pending(const struct kvr_sse *p)
{
    return p->have_data || p->line == LINE_DATA0 || p->line == LINE_DATA ||
           (p->line == LINE_HEAD && p->head_len);
}

static kvr_status data_append(struct kvr_sse *p, const uint8_t *s, size_t n)
{
    if (n > p->max_event || p->data.len > p->max_event - n)
        return KVR_ERR_TOO_LARGE;
    kvr_status st = kvr_buf_reserve(&p->data, p->data.len + n + 2); /* '\n' and NUL */
    if (st != KVR_OK)
        return st;
    memcpy(p->data.data + p->data.len, s, n);
    p->data.len += n;
    return KVR_OK;
}

/* Decide what a line is from its head: "data:" starts a value, anything else is dropped. */
static void head_classify(struct kvr_sse *p)
{
    if (p->head[0] == ':') {
        p->line = LINE_SKIP;
        return;
    }
    char *colon = memchr(p->head, ':', p->head_len);
    if (colon) {
        bool data = colon - p->head == 4 && memcmp(p->head, "data", 4) == 0;
        p->line = data ? LINE_DATA0 : LINE_SKIP;
    } else if (p->head_len >= 5 || memcmp(p->head, "data", p->head_len) != 0) {
        p->line = LINE_SKIP; /* a field name other than "data" */
    }
}

/* Bytes of the current line (no CR or LF among them). */
static kvr_status line_bytes(struct kvr_sse *p, const uint8_t *s, size_t n)
{
    while (n) {
        switch (p->line) {
        case LINE_START:
        case LINE_HEAD:
            p->line = LINE_HEAD;
            p->head[p->head_len++] = (char)*s++;
            n--;
            head_classify(p);
            break;
        case LINE_DATA0:
            p->line = LINE_DATA;
            if (*s == ' ')
                s++, n--;
            break;
        case LINE_DATA:
            return data_append(p, s, n);
        default:
            return KVR_OK; /* LINE_SKIP */
        }
    }
    return KVR_OK;
}

/* A line ended: a data line adds its "\n"; an empty line hands the event over. */
static kvr_status line_end(struct kvr_sse *p, kvr_sse_event_fn fn, void *ctx)
{
    enum line_kind k = p->line;
    bool bare_data = k == LINE_HEAD && p->head_len == 4 && memcmp(p->head, "data", 4) == 0;
    p->line = LINE_START;
    p->head_len = 0;
    if (k == LINE_DATA0 || k == LINE_DATA || bare_data) {
        p->have_data = true;
        /* the event handed over is data less its last "\n": an empty data line, which adds a
         * "\n" and nothing else, counts against the bound as any other byte */
        if (p->data.len > p->max_event)
            return KVR_ERR_TOO_LARGE;
        /* data_append reserved room for this byte (and the NUL) */
        if (kvr_buf_reserve(&p->data, p->data.len + 2) != KVR_OK)
            return KVR_ERR_NOMEM;
        p->data.data[p->data.len++] = '\n';
        return KVR_OK;
    }
    if (k != LINE_START || !p->have_data)
        return KVR_OK;
    size_t len = p->data.len - 1; /* the last "\n" */
    p->data.len = 0;
    p->have_data = false;
    if (len > p->max_event)
        return KVR_ERR_TOO_LARGE;
    p->data.data[len] = 0;
    if (!fn(ctx, (const char *)p->data.data, len))
        p->stopped = true;
    if (p->data.cap > SSE_KEEP_BYTES) /* one large event does not hold its room for good */
        kvr_buf_free(&p->data);
    return KVR_OK;
}

/* Skip a leading BOM; bytes that only looked like its start are fed as content. */
static kvr_status skip_bom(struct kvr_sse *p, const uint8_t *b, size_t n, size_t *used)
{
    size_t i = 0;
    while (p->bom < 3 && i < n && b[i] == utf8_bom[p->bom])
        p->bom++, i++;
    *used = i;
    if (p->bom == 3 || i == n)
        return KVR_OK;
    uint8_t k = p->bom;
    p->bom = 3;
    return line_bytes(p, utf8_bom, k);
}

kvr_status kvr_sse_feed(struct kvr_sse *p, const void *bytes, size_t n, kvr_sse_event_fn fn,
                        void *ctx)
{
    if (p->stopped)
        return KVR_ERR_INVALID;
    const uint8_t *b = bytes;
    size_t i = 0;
    kvr_status st = KVR_OK;
    if (p->bom < 3)
        st = skip_bom(p, b, n, &i);
    while (st == KVR_OK && i < n && !p->stopped) {
        if (p->after_cr) {
            p->after_cr = false;
            if (b[i] == '\n') {
                i++;
                continue;
            }
        }
        size_t j = i;
        while (j < n && b[j] != '\n' && b[j] != '\r')
            j++;
        if (j > i)
            st = line_bytes(p, b + i, j - i);
        if (st != KVR_OK || j == n)
            break;
        p->after_cr = b[j] == '\r';
        i = j + 1;
        st = line_end(p, fn, ctx);
    }
    if (st != KVR_OK)
        p->stopped = true;
    return st;
}
