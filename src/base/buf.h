/*
 * kvr_buf: a growable byte buffer. Zero-initialise, reuse (encoders replace its contents), free
 * with kvr_buf_free. One owner at a time; no locking.
 */
#ifndef KVR_BUF_H
#define KVR_BUF_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/status.h"

struct kvr_buf {
    uint8_t *data; /* owned */
    size_t len;    /* bytes in use */
    size_t cap;    /* bytes allocated */
};

/* Make room for cap bytes in all (len is kept). KVR_ERR_NOMEM leaves b as it was. */
kvr_status kvr_buf_reserve(struct kvr_buf *b, size_t cap);
/* Replace the contents with a copy of data[0..len). */
kvr_status kvr_buf_set(struct kvr_buf *b, const void *data, size_t len);
void kvr_buf_free(struct kvr_buf *b);

#endif
