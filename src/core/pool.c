/*
 * kvr_pool implementation: a free list threaded through the first four bytes of freed items.
 */
#define _DEFAULT_SOURCE /* madvise */
#include "pool.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE_PAGE (2u << 20)

void *kvr_big_alloc(size_t size)
{
    if (size < HUGE_PAGE)
        return malloc(size);
    void *p = NULL;
    if (posix_memalign(&p, HUGE_PAGE, size))
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, size / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE); /* advice only: failure is fine */
#endif
    return p;
}

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

uint32_t kvr_pool_alloc(struct kvr_pool *p)
{
    uint32_t h;
    if (p->free_head != KVR_NIL) {
        h = p->free_head;
        memcpy(&p->free_head, kvr_pool_get(p, h), sizeof p->free_head);
    } else {
        if (p->next == KVR_NIL)
            return KVR_NIL;
        uint32_t c = p->next >> KVR_POOL_SHIFT;
        if (c == p->nchunks) {
            unsigned char **chunks = realloc(p->chunks, (c + 1) * sizeof *chunks);
            if (!chunks)
                return KVR_NIL;
            p->chunks = chunks;
            chunks[c] = kvr_big_alloc((size_t)KVR_POOL_CHUNK * p->item_size);
            if (!chunks[c])
                return KVR_NIL;
            p->nchunks++;
        }
        h = p->next++;
    }
    p->live++;
    return h;
}

void kvr_pool_put(struct kvr_pool *p, uint32_t h)
{
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
    k->next = KVR_NIL;
    k->prev = l->tail;
    if (l->tail != KVR_NIL)
        link_of(p, off, l->tail)->next = h;
    else
        l->head = h;
    l->tail = h;
}

void kvr_list_unlink(struct kvr_list *l, const struct kvr_pool *p, size_t off, uint32_t h)
{
    struct kvr_link *k = link_of(p, off, h);
    if (k->prev != KVR_NIL)
        link_of(p, off, k->prev)->next = k->next;
    else
        l->head = k->next;
    if (k->next != KVR_NIL)
        link_of(p, off, k->next)->prev = k->prev;
    else
        l->tail = k->prev;
}
