/*
 * kvr_buf implementation.
 */
#include "buf.h"

#include <stdlib.h>
#include <string.h>

kvr_status kvr_buf_reserve(struct kvr_buf *b, size_t cap)
{
    if (cap <= b->cap)
        return KVR_OK;
    size_t n = b->cap ? b->cap : 256;
    while (n < cap) {
        if (n > SIZE_MAX / 2)
            return KVR_ERR_NOMEM;
        n *= 2;
    }
    uint8_t *d = realloc(b->data, n);
    if (!d)
        return KVR_ERR_NOMEM;
    b->data = d;
    b->cap = n;
    return KVR_OK;
}

kvr_status kvr_buf_set(struct kvr_buf *b, const void *data, size_t len)
{
    kvr_status st = kvr_buf_reserve(b, len + 1);
    if (st != KVR_OK)
        return st;
    if (len)
        memcpy(b->data, data, len);
    b->len = len;
    return KVR_OK;
}

void kvr_buf_free(struct kvr_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}
