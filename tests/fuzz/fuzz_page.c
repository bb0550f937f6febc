/*
 * kvr_wire_decode_page: a SyncPage (a snapshot's or repair's decisions and index entries). The
 * first decode copies every record it is handed into a kvr_page and a list; the page is encoded
 * and decoded again, and the second decode must hand the same records in the same order. A page
 * with any bad record is refused whole: no callback runs, *last is false and *token 0.
 */
#include "fuzz.h"

struct ctx {
    struct kvr_page page;
    struct kvr_wire_decision *dec; /* owned copies */
    struct kvr_index_record *ent;
    size_t ndec, nent, capdec, capent;
    size_t idec, ient; /* second pass: records compared so far */
    int second;
};

static char *copy_str(const char *s)
{
    char *d = strdup(s ? s : "");
    FUZZ_CHECK(d);
    return d;
}

static void keep_decision(struct ctx *c, const struct kvr_wire_decision *d)
{
    if (c->ndec == c->capdec) {
        c->capdec = c->capdec ? c->capdec * 2 : 16;
        c->dec = realloc(c->dec, c->capdec * sizeof *c->dec);
        FUZZ_CHECK(c->dec);
    }
    struct kvr_wire_decision *k = &c->dec[c->ndec++];
    *k = *d;
    uint64_t *h = malloc(((size_t)d->rec.nblocks + 1) * sizeof *h);
    FUZZ_CHECK(h);
    if (d->rec.nblocks)
        memcpy(h, d->rec.block_hashes, d->rec.nblocks * sizeof *h);
    k->rec.block_hashes = h;
    k->reply = copy_str(d->reply);
    k->request_id = copy_str(d->request_id);
    k->origin = copy_str(d->origin);
    FUZZ_CHECK(kvr_page_add_decision(&c->page, &d->rec, d->reply, d->request_id, d->origin, 0, 0) ==
               KVR_OK);
}

static void on_decision(void *ctx, const struct kvr_wire_decision *d)
{
    struct ctx *c = ctx;
    fuzz_check_decision(d);
    if (!c->second) {
        keep_decision(c, d);
        return;
    }
    FUZZ_CHECK(c->idec < c->ndec);
    fuzz_same_decision(&c->dec[c->idec++], d);
}

static void on_entry(void *ctx, const struct kvr_index_record *e)
{
    struct ctx *c = ctx;
    FUZZ_CHECK(e->worker_id != 0);
    if (c->second) {
        FUZZ_CHECK(c->ient < c->nent);
        const struct kvr_index_record *k = &c->ent[c->ient++];
        FUZZ_CHECK(k->worker_id == e->worker_id && k->seq == e->seq);
        FUZZ_CHECK(k->has_engine == e->has_engine && k->engine_id == e->engine_id);
        FUZZ_CHECK(k->ttl_left_ns == e->ttl_left_ns);
        return;
    }
    if (c->nent == c->capent) {
        c->capent = c->capent ? c->capent * 2 : 16;
        c->ent = realloc(c->ent, c->capent * sizeof *c->ent);
        FUZZ_CHECK(c->ent);
    }
    c->ent[c->nent++] = *e;
    FUZZ_CHECK(kvr_page_add_entry(&c->page, e) == KVR_OK);
}

static kvr_status decode_and_free(const uint8_t *data, size_t size)
{
    struct kvr_wire_page_head head;
    return kvr_wire_decode_page(data, size, NULL, NULL, NULL, &head);
}

static bool same_head(const struct kvr_wire_page_head *a, const struct kvr_wire_page_head *b)
{
    return a->last == b->last && a->token == b->token && a->index_partial == b->index_partial;
}

static void round_trip(struct ctx *c, const struct kvr_wire_page_head *head)
{
    struct kvr_buf b = {0};
    c->page.index_partial = head->index_partial;
    FUZZ_CHECK(kvr_page_encode(&c->page, &b, head->last, head->token) == KVR_OK);
    c->second = 1;
    struct kvr_wire_page_head again = {!head->last, ~head->token, !head->index_partial};
    FUZZ_CHECK(kvr_wire_decode_page(b.data, b.len, on_decision, on_entry, c, &again) == KVR_OK);
    FUZZ_CHECK(same_head(head, &again));
    FUZZ_CHECK(c->idec == c->ndec && c->ient == c->nent);
    kvr_buf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_wire_page_head head = {true, 1, true}, head2 = head;
    /* without callbacks: only the header fields */
    kvr_status plain = kvr_wire_decode_page(data, size, NULL, NULL, NULL, &head);
    struct ctx c = {0};
    kvr_page_init(&c.page);
    kvr_status st = kvr_wire_decode_page(data, size, on_decision, on_entry, &c, &head2);
    FUZZ_CHECK(st == plain);
    FUZZ_CHECK(same_head(&head, &head2));
    if (st == KVR_OK)
        round_trip(&c, &head);
    else
        FUZZ_CHECK(c.ndec == 0 && c.nent == 0 && !head.last && head.token == 0 &&
                   !head.index_partial);
    for (size_t i = 0; i < c.ndec; i++)
        kvr_wire_decision_free(&c.dec[i]);
    free(c.dec);
    free(c.ent);
    kvr_page_free(&c.page);
    fuzz_fail_alloc(data, size, st, decode_and_free);
    return 0;
}
