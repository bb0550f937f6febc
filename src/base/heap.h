/*
 * KVR_HEAP_DEFINE(name, type, less): a binary min-heap of `type` values ordered by
 * `less(const type *a, const type *b)`, generated as static inline functions (typed, no copies
 * through void pointers, so the simulator's event loop stays fast):
 *
 *     struct name { type *v; uint32_t n, cap; };   zero-initialised = empty
 *     bool name##_push(struct name *h, type x);    false when memory is short (h unchanged)
 *     type name##_pop(struct name *h);             the least; h must not be empty
 *     void name##_free(struct name *h);
 *
 * Invariant: v[(i - 1) / 2] is never greater than v[i]. Not thread-safe; one owner.
 */
#ifndef KVR_HEAP_H
#define KVR_HEAP_H

#include <assert.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "grow.h"

#define KVR_HEAP_DEFINE(name, type, less)                                                          \
    struct name {                                                                                  \
        type *v;                                                                                   \
        uint32_t n, cap;                                                                           \
    };                                                                                             \
    static inline bool name##_push(struct name *h, type x)                                         \
    {                                                                                              \
        if (h->n == UINT32_MAX || !KVR_GROW(h->v, h->cap, h->n + 1, 256))                          \
            return false;                                                                          \
        uint32_t i = h->n++;                                                                       \
        while (i && less(&x, &h->v[(i - 1) / 2])) {                                                \
            h->v[i] = h->v[(i - 1) / 2];                                                           \
            i = (i - 1) / 2;                                                                       \
        }                                                                                          \
        h->v[i] = x;                                                                               \
        return true;                                                                               \
    }                                                                                              \
    static inline type name##_pop(struct name *h)                                                  \
    {                                                                                              \
        assert(h->n > 0);                                                                          \
        type top = h->v[0], last = h->v[--h->n];                                                   \
        uint32_t i = 0, n = h->n;                                                                  \
        for (;;) {                                                                                 \
            uint64_t c = 2 * (uint64_t)i + 1; /* no wrap past 2^31 entries */                      \
            if (c >= n)                                                                            \
                break;                                                                             \
            if (c + 1 < n && less(&h->v[c + 1], &h->v[c]))                                         \
                c++;                                                                               \
            if (!less(&h->v[c], &last))                                                            \
                break;                                                                             \
            h->v[i] = h->v[c];                                                                     \
            i = (uint32_t)c;                                                                       \
        }                                                                                          \
        if (n)                                                                                     \
            h->v[i] = last;                                                                        \
        return top;                                                                                \
    }                                                                                              \
    static inline void name##_free(struct name *h)                                                 \
    {                                                                                              \
        free(h->v);                                                                                \
        h->v = NULL;                                                                               \
        h->n = h->cap = 0;                                                                         \
    }

#endif
