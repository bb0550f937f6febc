/*
 * kvr_sse: an incremental parser of Server-Sent Events (the text/event-stream format of the
 * WHATWG HTML standard), as OpenAI-compatible engines stream completions. Bytes go in split
 * anywhere; lines end with CRLF, LF or CR; `data:` lines of one event are joined with "\n" (one
 * space after the colon dropped) and the event is handed over at the blank line that ends it;
 * comment lines (`:`) and the other fields (event, id, retry) are ignored; a leading UTF-8 BOM
 * is skipped. An event whose data passes max_event bytes, or a line longer than max_event plus
 * a field name, is an error (KVR_ERR_TOO_LARGE) and nothing is allocated past that bound;
 * comment lines are never buffered, and the room of an event over 64 KiB is freed once it is
 * handed over (a stream keeps what its usual events need, not its largest). Pure and
 * single-threaded: one parser per stream.
 */
#ifndef KVR_SSE_H
#define KVR_SSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "kvr/status.h"

/*
 * Called once per complete event with its data (len bytes, NUL-terminated at len, borrowed
 * until it returns); an event without any data line is not handed over. Return false to stop:
 * kvr_sse_feed then returns at once (KVR_OK) and the parser takes no more input.
 */
typedef bool (*kvr_sse_event_fn)(void *ctx, const char *data, size_t len);

struct kvr_sse {
    struct kvr_buf data; /* the current event's data, lines joined by "\n" */
    size_t max_event;    /* bytes of data in one event, at most */
    char head[8];        /* the start of the current line while its field is unknown */
    uint8_t head_len;    /* bytes in head (at most 5: "data:") */
    uint8_t line;        /* what the current line is (enum in sse.c) */
    uint8_t bom;         /* bytes of a leading BOM matched so far; 3 once past the start */
    bool after_cr;       /* the last byte was a CR: an LF right after belongs to it */
    bool have_data;      /* a data line was seen in the current event */
    bool stopped;        /* the callback said stop, or an error: no more input */
};

/* A parser for events of at most max_event bytes (0: 1 MiB). Nothing is allocated yet. */
void kvr_sse_init(struct kvr_sse *p, size_t max_event);
void kvr_sse_free(struct kvr_sse *p);

/*
 * Parse bytes[0..n), calling fn for every event completed. KVR_OK (also when fn stopped it),
 * KVR_ERR_TOO_LARGE (over the bound), KVR_ERR_NOMEM; after an error or a stop every further
 * call returns KVR_ERR_INVALID without looking at its input.
 */
kvr_status kvr_sse_feed(struct kvr_sse *p, const void *bytes, size_t n, kvr_sse_event_fn fn,
                        void *ctx);

/* Whether the parser holds part of an event (data lines not yet ended by a blank line). */
bool kvr_sse_pending(const struct kvr_sse *p);

#endif
