/*
 * Reply subjects of requests that ended, kept a while.
 */
#include "kept.h"

#include <stdlib.h>
#include <string.h>

kvr_status kvr_kept_init(struct kvr_kept *k)
{
    memset(k, 0, sizeof *k);
    k->slots = calloc(KVR_KEPT_MAX, sizeof *k->slots);
    if (!k->slots || kvr_map_init(&k->at, KVR_KEPT_MAX) != KVR_OK) {
        free(k->slots);
        k->slots = NULL;
        return KVR_ERR_NOMEM;
    }
    return KVR_OK;
}

static void release(struct kvr_kept *k, struct kvr_kept_item *it)
{
    if (!it->key)
        return;
    kvr_map_del(&k->at, it->key);
    k->bytes -= it->bytes;
    free(it->reply);
    memset(it, 0, sizeof *it);
}

void kvr_kept_free(struct kvr_kept *k)
{
    for (uint32_t i = 0; k->slots && i < KVR_KEPT_MAX; i++)
        release(k, &k->slots[i]);
    free(k->slots);
    if (k->at.groups)
        kvr_map_free(&k->at);
    memset(k, 0, sizeof *k);
}

void kvr_kept_put(struct kvr_kept *k, uint64_t key, uint64_t worker_id, char *reply, uint64_t now)
{
    if (!k->slots || !key) {
        free(reply);
        return;
    }
    uint32_t was = kvr_map_get(&k->at, key);
    if (was != KVR_NIL)
        release(k, &k->slots[was]); /* the same key ended twice (a resend after an error final) */
    uint32_t slot = k->next;
    k->next = (k->next + 1) % KVR_KEPT_MAX;
    if (k->span == KVR_KEPT_MAX)
        k->oldest = k->next; /* the ring is full: slot was the oldest, the next one is now */
    else
        k->span++;
    release(k, &k->slots[slot]);
    if (kvr_map_put(&k->at, key, slot) != KVR_OK) { /* sized for every slot at init: no growth */
        free(reply);
        return;
    }
    uint32_t bytes = (uint32_t)strlen(reply) + 1;
    k->slots[slot] = (struct kvr_kept_item){
        .key = key, .worker_id = worker_id, .at = now, .reply = reply, .bytes = bytes};
    k->bytes += bytes;
    /* over the budget: release the oldest first (never the one just kept: the budget is far
     * above one reply subject). Each slot is passed once per trip of next around the ring. */
    while (k->bytes > KVR_KEPT_BYTES && k->oldest != slot) {
        release(k, &k->slots[k->oldest]);
        k->oldest = (k->oldest + 1) % KVR_KEPT_MAX;
        k->span--;
    }
}

const struct kvr_kept_item *kvr_kept_find(const struct kvr_kept *k, uint64_t key)
{
    uint32_t slot = k->slots ? kvr_map_get(&k->at, key) : KVR_NIL;
    return slot == KVR_NIL ? NULL : &k->slots[slot];
}
