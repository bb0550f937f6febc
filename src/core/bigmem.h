/*
 * kvr_bigmem: memory for the core's large, randomly accessed arrays (hash table slots, pool
 * chunks). A request of at least 2 MiB is aligned to 2 MiB and offered to the kernel for
 * transparent huge pages, which saves a TLB miss on nearly every random access once a table
 * outgrows the TLB's reach; smaller ones are aligned to a 64-byte cache line (kvr_map's groups
 * each fill one). Invariant: whatever it returns is freed
 * with free(). It sits below kvr_map and kvr_pool, which both use it and neither of which it
 * knows. Stateless and thread-safe.
 */
#ifndef KVR_BIGMEM_H
#define KVR_BIGMEM_H

#include <stddef.h>

/* size bytes (contents undefined), or NULL when memory is short. Free with free(). */
void *kvr_bigmem_alloc(size_t size);

#endif
