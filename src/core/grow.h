/*
 * kvr_grow: make room for need items in a realloc'ed array of capacity *cap (doubling, from first
 * items when empty). Header-only; shared by the engine and the simulator.
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
    uint32_t n = *cap ? *cap : first;
    while (n < need)
        n *= 2;
    void *np = realloc(*p, (size_t)n * size);
    if (!np)
        return false;
    *p = np;
    *cap = n;
    return true;
}

#endif
