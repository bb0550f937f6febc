/* UTF-8 checks (utf8.h). */
#include "utf8.h"

#include <string.h>

size_t kvr_utf8_len(const unsigned char *s, size_t avail, bool *partial)
{
    if (partial)
        *partial = false;
    if (!avail)
        return 0;
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t n;
    unsigned min, cp;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2, min = 0x80, cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3, min = 0x800, cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4, min = 0x10000, cp = c & 0x07;
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if (i == avail) {
            /* cut: valid so far only if what is there could still make an allowed code point */
            unsigned lo = cp << (6 * (n - i)), hi = lo | ((1u << (6 * (n - i))) - 1);
            if (partial)
                *partial = hi >= min && lo <= 0x10ffff && !(lo >= 0xd800 && hi <= 0xdfff);
            return 0;
        }
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

kvr_status kvr_utf8_clean(struct kvr_buf *out, const char *in, size_t n, size_t *kept)
{
    /* at most 3 bytes out per byte in (U+FFFD), and the NUL */
    if (n > (SIZE_MAX - out->len - 1) / 3)
        return KVR_ERR_TOO_LARGE;
    kvr_status st = kvr_buf_reserve(out, out->len + 3 * n + 1);
    if (st != KVR_OK)
        return st;
    const unsigned char *u = (const unsigned char *)in;
    uint8_t *o = out->data + out->len;
    size_t i = 0;
    while (i < n) {
        bool partial;
        size_t k = kvr_utf8_len(u + i, n - i, &partial);
        if (partial) /* the rest starts a character the next piece completes */
            break;
        if (k == 0) {
            memcpy(o, KVR_UTF8_REPLACEMENT, 3);
            o += 3;
            k = 1;
        } else if (!(k == 1 && u[i] == 0)) {
            memcpy(o, u + i, k);
            o += k;
        }
        i += k;
    }
    *o = 0;
    out->len = (size_t)(o - out->data);
    *kept = n - i;
    return KVR_OK;
}
