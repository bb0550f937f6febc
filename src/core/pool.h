/*
 * kvr_pool: fixed-size items addressed by u32 handles, allocated from 32768-item chunks that never
 * move, so an item's address is stable for its life and growth never copies. Freed items go to
 * a free list and are reused first; memory is bounded by the peak number of live items.
 * Single-threaded, like its owner.
 */
#ifndef KVR_POOL_H
#define KVR_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "map.h"

#define KVR_POOL_SHIFT 15u
#define KVR_POOL_CHUNK (1u << KVR_POOL_SHIFT)

struct kvr_pool {
    unsigned char **chunks; /* nchunks chunks of KVR_POOL_CHUNK items, owned */
    uint32_t nchunks;       /* chunks allocated */
    uint32_t cap_chunks;    /* room in chunks */
    uint32_t item_size;     /* bytes per item, at least 4 */
    uint32_t next;          /* handles below this have been handed out at least once */
    uint32_t free_head;     /* first free handle, KVR_NIL when none */
    uint32_t live;          /* items currently allocated */
};

void kvr_pool_init(struct kvr_pool *p, size_t item_size);
void kvr_pool_free(struct kvr_pool *p);

/* A new item (contents undefined), or KVR_NIL when out of memory or handles. */
uint32_t kvr_pool_alloc(struct kvr_pool *p);

/* Return an item; h must be live. */
void kvr_pool_put(struct kvr_pool *p, uint32_t h);

static inline void *kvr_pool_get(const struct kvr_pool *p, uint32_t h)
{
    return p->chunks[h >> KVR_POOL_SHIFT] + (size_t)(h & (KVR_POOL_CHUNK - 1)) * p->item_size;
}

/* Hint the cache that item h will be read soon. A handle never handed out is skipped, so a hint
 * computed from stale data never reads past the chunk table. */
static inline void kvr_pool_prefetch(const struct kvr_pool *p, uint32_t h)
{
    if (h < p->next)
        __builtin_prefetch(kvr_pool_get(p, h));
}

size_t kvr_pool_bytes(const struct kvr_pool *p);

/*
 * Intrusive doubly-linked lists of pool items: an item embeds a struct kvr_link at byte offset
 * off (offsetof), and a list names its ends by handle. O(1) append and unlink; an item may sit in
 * several lists through several links. A list also keeps one cursor for a walk that the list may
 * change between its steps (a snapshot served in slices): the next item the walk visits. Unlinking
 * that item moves the cursor on to its successor, and an item appended while the cursor is at the
 * end becomes the next, so the walk visits every item that stays in the list throughout (or is
 * moved to its tail: the walk's next item may be the tail itself) at least once, and the items
 * appended meanwhile (an item already visited and moved to the tail: twice) until its caller ends
 * it. Nothing else reads the cursor: a walk begins by setting it.
 */
struct kvr_link {
    uint32_t prev; /* KVR_NIL at the head */
    uint32_t next; /* KVR_NIL at the tail */
};

struct kvr_list {
    uint32_t head;   /* oldest item, KVR_NIL when empty */
    uint32_t tail;   /* newest item */
    uint32_t cursor; /* the next item of the walk in progress (KVR_NIL: at the end) */
};

static inline void kvr_list_init(struct kvr_list *l)
{
    l->head = l->tail = l->cursor = KVR_NIL;
}

void kvr_list_append(struct kvr_list *l, const struct kvr_pool *p, size_t off, uint32_t h);
void kvr_list_unlink(struct kvr_list *l, const struct kvr_pool *p, size_t off, uint32_t h);
/* Link h (in no list) just before item at of l; a walk visits it or not, as any item added. */
void kvr_list_insert_before(struct kvr_list *l, const struct kvr_pool *p, size_t off, uint32_t at,
                            uint32_t h);

#endif
