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
    return k->slots ? KVR_OK : KVR_ERR_NOMEM;
}

static void release(struct kvr_kept *k, struct kvr_kept_item *it)
{
    if (!it->key)
        return;
    HASH_DEL(k->head, it);
    free(it->reply);
    memset(it, 0, sizeof *it);
}

void kvr_kept_free(struct kvr_kept *k)
{
    for (uint32_t i = 0; k->slots && i < KVR_KEPT_MAX; i++)
        release(k, &k->slots[i]);
    free(k->slots);
    memset(k, 0, sizeof *k);
}

void kvr_kept_put(struct kvr_kept *k, uint64_t key, uint64_t worker_id, char *reply, uint64_t now)
{
    struct kvr_kept_item *it = NULL;
    if (!k->slots || !key) {
        free(reply);
        return;
    }
    HASH_FIND(hh, k->head, &key, sizeof key, it);
    if (it)
        release(k, it); /* the same key ended twice (a resend after an error final) */
    it = &k->slots[k->next];
    k->next = (k->next + 1) % KVR_KEPT_MAX;
    release(k, it);
    *it = (struct kvr_kept_item){.key = key, .worker_id = worker_id, .at = now, .reply = reply};
    HASH_ADD(hh, k->head, key, sizeof it->key, it);
}

const struct kvr_kept_item *kvr_kept_find(const struct kvr_kept *k, uint64_t key)
{
    struct kvr_kept_item *it = NULL;
    HASH_FIND(hh, k->head, &key, sizeof key, it);
    return it;
}
