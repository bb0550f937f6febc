/*
 * kvr_kvev_decode (src/kvevents/kvevents.h): an engine's KV-event batch (msgpack, vLLM/SGLang).
 * Checks what kvevents.h promises: an error leaves the batch zeroed; a success obeys the limits
 * and the shape rules (a Stored event holds nhashes * block_size tokens, medium and kind are
 * printable C strings, only a Stored is salted) and survives kvr_kvev_encode in four forms,
 * decoding again to the same values (ids kept by the integer forms, medium dropped by the old
 * layout, group and kind kept by the map layout only); a tight decode succeeds only where the wide
 * one does, and must succeed when the batch fits; the same decode with one of its allocations
 * failing says KVR_ERR_NOMEM or what it said before. Any failed check aborts; ASan reports leaks
 * on every path.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvevents.h"
#include "kvevents_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static const struct kvr_kvev_limits tight = {4, 16, 64, 4096};

static bool zeroed(const struct kvr_kvev_batch *b)
{
    static const struct kvr_kvev_batch z;
    return memcmp(b, &z, sizeof z) == 0;
}

static void check_shape(const struct kvr_kvev_batch *b, const struct kvr_kvev_limits *lim)
{
    FUZZ_CHECK(b->nevents + b->unknown_events <= lim->max_events);
    FUZZ_CHECK(b->nevents == 0 || b->events);
    uint64_t nh = 0, nt = 0;
    for (uint32_t i = 0; i < b->nevents; i++) {
        const struct kvr_kvev_event *e = &b->events[i];
        FUZZ_CHECK(e->kind == KVR_KVEV_STORED || e->kind == KVR_KVEV_REMOVED ||
                   e->kind == KVR_KVEV_CLEARED);
        FUZZ_CHECK(e->nhashes == 0 || e->hashes);
        FUZZ_CHECK(e->ntokens == 0 || e->tokens);
        FUZZ_CHECK(memchr(e->medium, '\0', sizeof e->medium) != NULL);
        FUZZ_CHECK(memchr(e->spec_kind, '\0', sizeof e->spec_kind) != NULL);
        for (const char *k = e->spec_kind; *k; k++)
            FUZZ_CHECK(*k >= 0x20 && *k <= 0x7e);
        for (const char *m = e->medium; *m; m++)
            FUZZ_CHECK(*m >= 0x20 && *m <= 0x7e);
        if (e->kind == KVR_KVEV_STORED) {
            FUZZ_CHECK((uint64_t)e->nhashes * e->block_size == e->ntokens);
            FUZZ_CHECK(e->block_size > 0 || e->nhashes == 0);
        } else {
            FUZZ_CHECK(e->ntokens == 0 && !e->has_parent && !e->has_lora && !e->has_salt);
        }
        if (e->kind == KVR_KVEV_CLEARED)
            FUZZ_CHECK(e->nhashes == 0 && e->medium[0] == '\0' && !e->has_group &&
                       e->spec_kind[0] == '\0');
        nh += e->nhashes;
        nt += e->ntokens;
    }
    FUZZ_CHECK(nh <= lim->max_hashes && nt <= lim->max_tokens);
}

/* Whether batch b, decoded from data[0..size), is within lim: its counts, its bytes and its
 * msgpack objects (an event's unknown fields count there only). */
static bool fits(const struct kvr_kvev_batch *b, const uint8_t *data, size_t size,
                 const struct kvr_kvev_limits *lim)
{
    uint64_t nh = 0, nt = 0;
    for (uint32_t i = 0; i < b->nevents; i++) {
        nh += b->events[i].nhashes;
        nt += b->events[i].ntokens;
    }
    return b->nevents + b->unknown_events <= lim->max_events && nh <= lim->max_hashes &&
           nt <= lim->max_tokens && size <= lim->max_bytes &&
           kvr_kvev_prescan(data, size, kvr_kvev_max_objects(lim)) == KVR_OK;
}

/* b decoded, encoded with how, decoded again into c: the same values, as the form keeps them. */
static void same(const struct kvr_kvev_batch *b, const struct kvr_kvev_batch *c,
                 const struct kvr_kvev_encoding *how)
{
    FUZZ_CHECK(memcmp(&b->ts, &c->ts, sizeof b->ts) == 0);
    FUZZ_CHECK(c->has_dp_rank == (how->dp_rank && b->has_dp_rank));
    FUZZ_CHECK(!c->has_dp_rank || c->dp_rank == b->dp_rank);
    FUZZ_CHECK(c->nevents == b->nevents && c->unknown_events == 0);
    bool ids = how->hashes != KVR_KVEV_HASH_BYTES32;
    for (uint32_t i = 0; i < b->nevents; i++) {
        const struct kvr_kvev_event *x = &b->events[i], *y = &c->events[i];
        FUZZ_CHECK(x->kind == y->kind && x->nhashes == y->nhashes);
        for (uint32_t k = 0; k < x->nhashes; k++)
            FUZZ_CHECK(y->hashes[k] == (ids ? x->hashes[k] : kvr_kvev_id_of_digest(x->hashes[k])));
        FUZZ_CHECK(x->has_parent == y->has_parent);
        FUZZ_CHECK(!x->has_parent ||
                   y->parent == (ids ? x->parent : kvr_kvev_id_of_digest(x->parent)));
        FUZZ_CHECK(x->ntokens == y->ntokens && x->block_size == y->block_size);
        FUZZ_CHECK(x->ntokens == 0 || memcmp(x->tokens, y->tokens, x->ntokens * 4) == 0);
        FUZZ_CHECK(x->has_lora == y->has_lora && (!x->has_lora || x->lora_id == y->lora_id));
        if (how->layout == KVR_KVEV_LAYOUT_OLD)
            FUZZ_CHECK(y->medium[0] == '\0');
        else
            FUZZ_CHECK(strcmp(x->medium, y->medium) == 0);
        if (how->layout == KVR_KVEV_LAYOUT_MAP && x->kind != KVR_KVEV_CLEARED)
            FUZZ_CHECK(x->has_group == y->has_group &&
                       (!x->has_group || x->group_idx == y->group_idx) &&
                       strcmp(x->spec_kind, y->spec_kind) == 0);
        else
            FUZZ_CHECK(!y->has_group && y->spec_kind[0] == '\0');
    }
}

static void round_trip(const struct kvr_kvev_batch *b)
{
    static const struct kvr_kvev_encoding forms[] = {
        {KVR_KVEV_HASH_UINT, KVR_KVEV_LAYOUT_NEW, true},
        {KVR_KVEV_HASH_INT, KVR_KVEV_LAYOUT_OLD, false},
        {KVR_KVEV_HASH_BYTES32, KVR_KVEV_LAYOUT_NEW, true},
        {KVR_KVEV_HASH_UINT, KVR_KVEV_LAYOUT_MAP, true},
    };
    /* wide enough for anything the default limits let in, in any form */
    const struct kvr_kvev_limits wide = {0, 0, 0, (size_t)1 << 30};
    struct kvr_buf buf = {0};
    for (size_t f = 0; f < sizeof forms / sizeof *forms; f++) {
        FUZZ_CHECK(kvr_kvev_encode(&buf, b, &forms[f]) == KVR_OK);
        struct kvr_kvev_batch c;
        FUZZ_CHECK(kvr_kvev_decode(buf.data, buf.len, &wide, &c) == KVR_OK);
        same(b, &c, &forms[f]);
        kvr_kvev_batch_free(&c);
    }
    kvr_buf_free(&buf);
}

static kvr_status decode_and_free(const uint8_t *data, size_t size)
{
    struct kvr_kvev_batch b;
    kvr_status st = kvr_kvev_decode(data, size, NULL, &b);
    if (st != KVR_OK)
        FUZZ_CHECK(zeroed(&b));
    kvr_kvev_batch_free(&b);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_kvev_limits dflt = {KVR_KVEV_MAX_EVENTS, KVR_KVEV_MAX_HASHES, KVR_KVEV_MAX_TOKENS,
                                   KVR_KVEV_MAX_BYTES};
    struct kvr_kvev_batch b;
    kvr_status st = kvr_kvev_decode(data, size, NULL, &b);
    FUZZ_CHECK(st == KVR_OK || st == KVR_ERR_MALFORMED || st == KVR_ERR_TOO_LARGE);
    if (st == KVR_OK) {
        check_shape(&b, &dflt);
        round_trip(&b);
    } else {
        FUZZ_CHECK(zeroed(&b));
    }

    struct kvr_kvev_batch t;
    kvr_status ts = kvr_kvev_decode(data, size, &tight, &t);
    if (ts == KVR_OK) {
        FUZZ_CHECK(st == KVR_OK);
        check_shape(&t, &tight);
        FUZZ_CHECK(t.nevents == b.nevents && t.unknown_events == b.unknown_events);
    } else {
        FUZZ_CHECK(zeroed(&t));
        FUZZ_CHECK(!(st == KVR_OK && fits(&b, data, size, &tight)));
        FUZZ_CHECK(st != KVR_OK || ts == KVR_ERR_TOO_LARGE);
    }
    kvr_kvev_batch_free(&t);
    kvr_kvev_batch_free(&b);

    uint32_t h = 2166136261u; /* FNV-1a: the input picks which allocation fails */
    for (size_t i = 0; i < size; i++)
        h = (h ^ data[i]) * 16777619u;
    kvr_kvev_fail_alloc((long)(h % 4));
    kvr_status again = decode_and_free(data, size);
    long left = kvr_kvev_fail_alloc(-1);
    FUZZ_CHECK(left == -1 ? again == KVR_ERR_NOMEM : again == st);
    return 0;
}
