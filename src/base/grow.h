/*
 * kvr_grow: the one growable array of the project. Makes room for `need` items in a realloc'ed
 * array of capacity *cap (doubling, from `first` items when empty). On failure (memory, or a
 * capacity past UINT32_MAX items or SIZE_MAX bytes) the array and *cap are left as they were and
 * false is returned, so a caller can drop and count what did not fit. Header-only, no state.
 */
#ifndef KVR_GROW_H
#define KVR_GROW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

static inline bool kvr_grow(void **p, uint32_t *cap, uint32_t need, size_t size, uint32_t first)
{
    if (need <= *cap)
        return true;
    uint64_t n = *cap ? *cap : (first ? first : 1);
    while (n < need)
        n *= 2;
    if (n > UINT32_MAX)
        n = UINT32_MAX;
    if (size && n > SIZE_MAX / size)
        return false;
    void *np = realloc(*p, (size_t)n * size);
    if (!np)
        return false;
    *p = np;
    *cap = (uint32_t)n;
    return true;
}

/* KVR_GROW(array, cap, need, first): kvr_grow for a typed array pointer. */
#define KVR_GROW(arr, cap, need, first)                                                            \
    kvr_grow((void **)&(arr), &(cap), (need), sizeof *(arr), (first))

#endif
