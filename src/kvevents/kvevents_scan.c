/*
 * kvevents' structural pre-scan of a msgpack payload (kvevents_internal.h): nesting, every declared
 * length against the bytes left and the count of objects, read from the bytes alone before
 * msgpack-c allocates anything. Pure, no state; needs no <msgpack.h>.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvevents.h"
#include "kvevents_internal.h"

#define PRESCAN_DEPTH 16 /* deepest nesting accepted (msgpack-c's own limit is 32) */

static uint64_t rd_be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* What follows a marker byte 0xc0..0xdf: n bytes of value or length, read as `as` (a fixext's n
 * counts its type byte and its data). */
enum as { AS_BAD, AS_VALUE, AS_BYTES, AS_EXT, AS_ARRAY, AS_MAP };
static const struct {
    uint8_t n;  /* bytes after the marker: the value, or the length of what follows */
    uint8_t as; /* enum as */
} marker[32] = {
    [0x00] = {0, AS_VALUE},  [0x01] = {0, AS_BAD},   [0x02] = {0, AS_VALUE}, [0x03] = {0, AS_VALUE},
    [0x04] = {1, AS_BYTES},  [0x05] = {2, AS_BYTES}, [0x06] = {4, AS_BYTES}, [0x07] = {1, AS_EXT},
    [0x08] = {2, AS_EXT},    [0x09] = {4, AS_EXT},   [0x0a] = {4, AS_VALUE}, [0x0b] = {8, AS_VALUE},
    [0x0c] = {1, AS_VALUE},  [0x0d] = {2, AS_VALUE}, [0x0e] = {4, AS_VALUE}, [0x0f] = {8, AS_VALUE},
    [0x10] = {1, AS_VALUE},  [0x11] = {2, AS_VALUE}, [0x12] = {4, AS_VALUE}, [0x13] = {8, AS_VALUE},
    [0x14] = {2, AS_VALUE},  [0x15] = {3, AS_VALUE}, [0x16] = {5, AS_VALUE}, [0x17] = {9, AS_VALUE},
    [0x18] = {17, AS_VALUE}, [0x19] = {1, AS_BYTES}, [0x1a] = {2, AS_BYTES}, [0x1b] = {4, AS_BYTES},
    [0x1c] = {2, AS_ARRAY},  [0x1d] = {4, AS_ARRAY}, [0x1e] = {2, AS_MAP},   [0x1f] = {4, AS_MAP},
};

/* One object's header at p[*i]: the bytes of its body to skip, or its elements when a container
 * (*count, maps counting keys and values); false when it does not fit or is no msgpack. */
static bool header(const uint8_t *p, size_t len, size_t *i, uint64_t *skip, uint64_t *count)
{
    uint8_t c = p[(*i)++];
    *skip = *count = 0;
    if (c <= 0x7f || c >= 0xe0)
        return true; /* fixint */
    if (c <= 0x8f) {
        *count = 2u * (c & 0x0f);
        return true;
    }
    if (c <= 0x9f) {
        *count = c & 0x0f;
        return true;
    }
    if (c <= 0xbf) {
        *skip = c & 0x1f;
        return true;
    }
    int n = marker[c - 0xc0].n, as = marker[c - 0xc0].as;
    if (as == AS_BAD || len - *i < (size_t)n)
        return false;
    if (as == AS_VALUE) {
        *i += (size_t)n;
        return true;
    }
    uint64_t v = rd_be(p + *i, n);
    *i += (size_t)n;
    if (as == AS_BYTES)
        *skip = v;
    else if (as == AS_EXT)
        *skip = v + 1; /* the type byte, then the data */
    else
        *count = as == AS_MAP ? 2 * v : v;
    return true;
}

/*
 * Walk the msgpack bytes without building anything: exactly one complete object, no trailing
 * bytes, nesting at most PRESCAN_DEPTH, and at every container the elements still owed (over the
 * whole stack) no more than the bytes left, since each needs one byte at least. So msgpack-c
 * never allocates for more elements than the input has bytes, nor for more than max_objects.
 */
kvr_status kvr_kvev_prescan(const uint8_t *p, size_t len, uint64_t max_objects)
{
    uint64_t left[PRESCAN_DEPTH + 1]; /* elements still owed at each open level */
    int depth = 0;
    uint64_t owed = 1; /* elements owed over the whole stack, the top-level object included */
    uint64_t objects = 0;
    size_t i = 0;
    left[0] = 1;
    while (owed > 0) {
        uint64_t skip, count;
        if (i >= len || !header(p, len, &i, &skip, &count) || skip > len - i)
            return KVR_ERR_MALFORMED;
        if (++objects > max_objects)
            return KVR_ERR_TOO_LARGE;
        i += (size_t)skip;
        left[depth]--; /* this object is done: it was owed by the level it is in */
        owed--;
        if (count > 0) {
            if (depth == PRESCAN_DEPTH || owed + count > len - i)
                return KVR_ERR_MALFORMED;
            left[++depth] = count;
            owed += count;
        }
        while (depth > 0 && left[depth] == 0)
            depth--;
    }
    return i == len ? KVR_OK : KVR_ERR_MALFORMED;
}
