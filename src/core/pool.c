/*
 * kvr_pool implementation: a free list threaded through the first four bytes of freed items.
 * Invariants: live + (items on the free list) == next; every handle on the free list is below
 * next; the chunks array holds a chunk for every handle below next.
 */
#include "pool.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "bigmem.h"
#include "grow.h"

void kvr_pool_init(struct kvr_pool *p, size_t item_size)
{
    memset(p, 0, sizeof *p);
    p->item_size = (uint32_t)(item_size < 4 ? 4 : item_size);
    p->free_head = KVR_NIL;
}

void kvr_pool_free(struct kvr_pool *p)
{
    for (uint32_t i = 0; i < p->nchunks; i++)
        free(p->chunks[i]);
    free(p->chunks);
    size_t size = p->item_size;
    kvr_pool_init(p, size);
}

/* The chunk for handles from next on: the slow path, kept out of kvr_pool_alloc's way. */
__attribute__((noinline)) static bool add_chunk(struct kvr_pool *p)
{
    uint32_t c = p->nchunks;
    if (!KVR_GROW(p->chunks, p->cap_chunks, c + 1, 8))
        return false;
    p->chunks[c] = kvr_bigmem_alloc((size_t)KVR_POOL_CHUNK * p->item_size);
    if (!p->chunks[c])
        return false;
    p->nchunks++;
    return true;
}

uint32_t kvr_pool_alloc(struct kvr_pool *p)
{
    uint32_t h;
    if (p->free_head != KVR_NIL) {
        h = p->free_head;
        assert(h < p->next && p->live < p->next);
        memcpy(&p->free_head, kvr_pool_get(p, h), sizeof p->free_head);
    } else {
        if (p->next == KVR_NIL)
            return KVR_NIL;
        if (p->next >> KVR_POOL_SHIFT == p->nchunks && !add_chunk(p))
            return KVR_NIL;
        h = p->next++;
    }
    p->live++;
    return h;
}

void kvr_pool_put(struct kvr_pool *p, uint32_t h)
{
    assert(h < p->next && p->live > 0); /* a handed-out handle, and something live to return */
    memcpy(kvr_pool_get(p, h), &p->free_head, sizeof p->free_head);
    p->free_head = h;
    p->live--;
}

size_t kvr_pool_bytes(const struct kvr_pool *p)
{
    return (size_t)p->nchunks * KVR_POOL_CHUNK * p->item_size + p->nchunks * sizeof(void *);
}

static struct kvr_link *link_of(const struct kvr_pool *p, size_t off, uint32_t h)
{
    return (struct kvr_link *)((unsigned char *)kvr_pool_get(p, h) + off);
}

void kvr_list_append(struct kvr_list *l, const struct kvr_pool *p, size_t off, uint32_t h)
{
    struct kvr_link *k = link_of(p, off, h);
    assert((l->head == KVR_NIL) == (l->tail == KVR_NIL));
    k->next = KVR_NIL;
    k->prev = l->tail;
    if (l->tail != KVR_NIL)
        link_of(p, off, l->tail)->next = h;
    else
        l->head = h;
    l->tail = h;
    /* a walk at the list's end goes on with what comes: among it, its next item moved to the tail
     * again (unlinked at the tail, it sent the cursor to the end) */
    if (l->cursor == KVR_NIL)
        l->cursor = h;
}

void kvr_list_unlink(struct kvr_list *l, const struct kvr_pool *p, size_t off, uint32_t h)
{
    struct kvr_link *k = link_of(p, off, h);
    assert(k->prev != KVR_NIL || l->head == h); /* h is in l: its ends agree with its links */
    assert(k->next != KVR_NIL || l->tail == h);
    if (l->cursor == h) /* a walk's next item leaves: the walk goes on from its successor */
        l->cursor = k->next;
    if (k->prev != KVR_NIL)
        link_of(p, off, k->prev)->next = k->next;
    else
        l->head = k->next;
    if (k->next != KVR_NIL)
        link_of(p, off, k->next)->prev = k->prev;
    else
        l->tail = k->prev;
}

void kvr_list_insert_before(struct kvr_list *l, const struct kvr_pool *p, size_t off, uint32_t at,
                            uint32_t h)
{
    struct kvr_link *k = link_of(p, off, h), *a = link_of(p, off, at);
    assert(a->prev != KVR_NIL || l->head == at); /* at is in l */
    k->next = at;
    k->prev = a->prev;
    if (a->prev != KVR_NIL)
        link_of(p, off, a->prev)->next = h;
    else
        l->head = h;
    a->prev = h;
}
