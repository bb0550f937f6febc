/*
 * kvr_bigmem implementation: posix_memalign to the huge-page size, then madvise; a smaller request
 * to the cache line. The advice may fail (no THP in the kernel, or disabled); the memory is just
 * as good without it.
 */
#define _DEFAULT_SOURCE /* madvise */
#include "bigmem.h"

#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_PAGE  (2u << 20)
#define CACHE_LINE 64u

void *kvr_bigmem_alloc(size_t size)
{
    void *p = NULL;
    if (posix_memalign(&p, size < HUGE_PAGE ? CACHE_LINE : HUGE_PAGE, size))
        return NULL;
    if (size < HUGE_PAGE)
        return p;
#ifdef MADV_HUGEPAGE
    madvise(p, size / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE); /* advice only: failure is fine */
#endif
    return p;
}
