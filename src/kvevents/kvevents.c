/*
 * kvevents: the engines' KV-event batches, msgpack <-> struct kvr_kvev_batch (kvevents.h has the
 * layouts and the checks). Decoding is three steps: a structural pre-scan of the bytes (nesting,
 * every declared length against the bytes left, so msgpack-c never allocates for a length the
 * input cannot hold; kvevents_scan.c), msgpack_unpack into a zone, then a walk of the
 * msgpack_object tree that counts (limits) and fills the batch's three arrays. The only includer of
 * <msgpack.h>. Pure, no global state but the test hook's thread-local countdown.
 */
#include "kvevents.h"

#include <msgpack.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/hash.h"
#include "kvevents_internal.h"

#define HASH_BYTES_MAX 64

/* ---- test hook ------------------------------------------------------------------------------ */

static _Thread_local long fail_countdown = -1;

long kvr_kvev_fail_alloc(long n)
{
    long was = fail_countdown;
    fail_countdown = n;
    return was;
}

static void *alloc_array(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    if (fail_countdown >= 0 && fail_countdown-- == 0)
        return NULL;
    size_t bytes = n * size;
    return calloc(1, bytes ? bytes : 1);
}

/* ---- ids ------------------------------------------------------------------------------------ */

uint64_t kvr_kvev_id_of_bytes(const void *data, size_t len)
{
    return kvr_hash_bytes(data, len);
}

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

void kvr_kvev_digest_of(uint64_t id, uint8_t out[KVR_KVEV_DIGEST_LEN])
{
    put_be64(out, id);
    put_be64(out + 8, ~id);
    put_be64(out + 16, id);
    put_be64(out + 24, ~id);
}

uint64_t kvr_kvev_id_of_digest(uint64_t id)
{
    uint8_t d[KVR_KVEV_DIGEST_LEN];
    kvr_kvev_digest_of(id, d);
    return kvr_kvev_id_of_bytes(d, sizeof d);
}

/* ---- the walk ------------------------------------------------------------------------------- */

/* The fields of one event, wherever they came from (positions or names); NULL when absent. */
struct fields {
    const msgpack_object *hashes, *parent, *tokens, *block_size, *lora, *medium, *group, *extra,
        *kind, *meta, *salt;
};

static bool is_str(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
           memcmp(o->via.str.ptr, s, n) == 0;
}

enum tag { TAG_UNKNOWN = 0, TAG_STORED, TAG_REMOVED, TAG_CLEARED, TAG_BAD };

static enum tag tag_of(const msgpack_object *t)
{
    if (!t || t->type != MSGPACK_OBJECT_STR)
        return TAG_BAD;
    if (is_str(t, "BlockStored"))
        return TAG_STORED;
    if (is_str(t, "BlockRemoved"))
        return TAG_REMOVED;
    if (is_str(t, "AllBlocksCleared"))
        return TAG_CLEARED;
    return TAG_UNKNOWN;
}

/* A map event's keys and the field each fills (a key met twice: the last counts). */
static const struct {
    const char *key;
    size_t at; /* offsetof the field in struct fields */
} map_keys[] = {
    {"block_hashes", offsetof(struct fields, hashes)},
    {"parent_block_hash", offsetof(struct fields, parent)},
    {"token_ids", offsetof(struct fields, tokens)},
    {"block_size", offsetof(struct fields, block_size)},
    {"num_toks_per_block", offsetof(struct fields, block_size)}, /* the older name */
    {"lora_id", offsetof(struct fields, lora)},
    {"medium", offsetof(struct fields, medium)},
    {"group_idx", offsetof(struct fields, group)},
    {"extra_keys", offsetof(struct fields, extra)},
    {"kv_cache_spec_kind", offsetof(struct fields, kind)},
    {"cache_salt", offsetof(struct fields, salt)},
    {"metadata", offsetof(struct fields, meta)},
};

/* The tag and fields of an event (array or map); false when it is neither or has no tag. */
static bool event_fields(const msgpack_object *e, enum tag *tag, struct fields *f)
{
    memset(f, 0, sizeof *f);
    if (e->type == MSGPACK_OBJECT_ARRAY) {
        const msgpack_object_array *a = &e->via.array;
        if (a->size == 0)
            return false;
        *tag = tag_of(&a->ptr[0]);
        const msgpack_object *at[11] = {0};
        for (uint32_t i = 1; i < a->size && i < 11; i++)
            at[i] = &a->ptr[i];
        if (*tag == TAG_STORED) { /* BlockStored's field order */
            f->hashes = at[1];
            f->parent = at[2];
            f->tokens = at[3];
            f->block_size = at[4];
            f->lora = at[5];
            f->medium = at[6];
            /* at[7]: vLLM's lora_name (a string, not read), or SGLang's metadata map */
            if (at[7] && at[7]->type != MSGPACK_OBJECT_STR)
                f->meta = at[7];
            f->extra = at[8];
            f->group = at[9];
            f->kind = at[10];
        } else if (*tag == TAG_REMOVED) { /* no kind: vLLM names a group's kind on its Stored */
            f->hashes = at[1];
            f->medium = at[2];
            f->group = at[3];
        }
        return *tag != TAG_BAD;
    }
    if (e->type != MSGPACK_OBJECT_MAP)
        return false;
    const msgpack_object *type = NULL;
    for (uint32_t i = 0; i < e->via.map.size; i++) {
        const msgpack_object *k = &e->via.map.ptr[i].key, *v = &e->via.map.ptr[i].val;
        if (k->type != MSGPACK_OBJECT_STR)
            continue;
        if (is_str(k, "type"))
            type = v;
        for (size_t j = 0; j < sizeof map_keys / sizeof map_keys[0]; j++) {
            if (is_str(k, map_keys[j].key)) {
                *(const msgpack_object **)((char *)f + map_keys[j].at) = v;
                break;
            }
        }
    }
    *tag = tag_of(type);
    if (*tag == TAG_REMOVED) {
        struct fields r = {
            .hashes = f->hashes, .medium = f->medium, .group = f->group, .kind = f->kind};
        *f = r;
    } else if (*tag != TAG_STORED) {
        memset(f, 0, sizeof *f);
    }
    return *tag != TAG_BAD;
}

static bool is_nil(const msgpack_object *o)
{
    return !o || o->type == MSGPACK_OBJECT_NIL;
}

/* An array field (hashes, tokens): its length, 0 when absent; false when not an array. */
static bool array_len(const msgpack_object *o, uint32_t *n)
{
    *n = 0;
    if (!o)
        return true;
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return false;
    *n = o->via.array.size;
    return true;
}

static bool hash_of(const msgpack_object *o, uint64_t *id, uint32_t *seen)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        *id = o->via.u64;
        return true;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *id = (uint64_t)o->via.i64;
        *seen |= KVR_KVEV_SEEN_NEG_HASH;
        return true;
    case MSGPACK_OBJECT_BIN:
    case MSGPACK_OBJECT_STR: /* the same bytes: a bin and a str of them name one block */
        if (o->via.bin.size == 0 || o->via.bin.size > HASH_BYTES_MAX)
            return false;
        *id = kvr_kvev_id_of_bytes(o->via.bin.ptr, o->via.bin.size);
        *seen |= KVR_KVEV_SEEN_BYTES_HASH;
        return true;
    default:
        return false;
    }
}

static bool int_of(const msgpack_object *o, int64_t *v)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)INT64_MAX)
            return false;
        *v = (int64_t)o->via.u64;
        return true;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *v = o->via.i64;
        return true;
    }
    return false;
}

/* Stored: extra_keys, nil or one entry per block (nil: the block is keyed by its tokens alone).
 * ev->nplain: the blocks before the first with extra keys, or past the end of a short list; the
 * loop is bounded by the hashes counted, never by the list's own length. */
static bool extra_of(const msgpack_object *x, struct kvr_kvev_event *ev)
{
    if (is_nil(x))
        return true;
    if (x->type != MSGPACK_OBJECT_ARRAY)
        return false;
    uint32_t i = 0;
    while (i < ev->nhashes && i < x->via.array.size && is_nil(&x->via.array.ptr[i]))
        i++;
    ev->has_extra = i < ev->nhashes;
    ev->nplain = ev->has_extra ? i : 0;
    return true;
}

/* A cache_salt value: nil (or absent) is none; a string, of any length, salts the event
 * (SGLang keys every salt that is not None apart, "" too); anything else is malformed. */
static bool salt_value(const msgpack_object *o, bool *salted)
{
    if (is_nil(o))
        return true;
    if (o->type != MSGPACK_OBJECT_STR)
        return false;
    *salted = true;
    return true;
}

/* Stored: SGLang's cache_salt, a field of its map events, or in a metadata map ({"cache_salt",
 * "session_id", ...}: other keys ignored) at BlockStored's array position 7 or under "metadata".
 * Metadata nil or absent is none; neither nil nor a map is malformed. The salt is never kept:
 * ev->has_salt only. */
static bool salt_of(const struct fields *f, struct kvr_kvev_event *ev)
{
    if (!salt_value(f->salt, &ev->has_salt))
        return false;
    const msgpack_object *m = f->meta;
    if (is_nil(m))
        return true;
    if (m->type != MSGPACK_OBJECT_MAP)
        return false;
    for (uint32_t i = 0; i < m->via.map.size; i++)
        if (is_str(&m->via.map.ptr[i].key, "cache_salt") &&
            !salt_value(&m->via.map.ptr[i].val, &ev->has_salt))
            return false;
    return true;
}

/* A text field (medium, kv_cache_spec_kind): nil or absent leaves out[] empty; a string is kept
 * up to cap - 1 bytes, longer ones cut, every byte that is not printable ASCII made a '?' (a NUL
 * among them too, so the text compares whole: "GPU\0x" is not "GPU"); false when it is not a
 * string. */
static bool text_of(const msgpack_object *o, char *out, size_t cap)
{
    if (is_nil(o))
        return true;
    if (o->type != MSGPACK_OBJECT_STR)
        return false;
    size_t n = o->via.str.size < cap - 1 ? o->via.str.size : cap - 1;
    memcpy(out, o->via.str.ptr, n);
    out[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if (out[i] < 0x20 || out[i] > 0x7e)
            out[i] = '?';
    return true;
}

/* Fill one known event from its fields; hashes and tokens are written at *hp and *tp. */
static kvr_status fill_event(enum tag tag, const struct fields *f, struct kvr_kvev_event *ev,
                             uint64_t *hp, uint32_t *tp, uint32_t *seen)
{
    uint32_t nh = 0, nt = 0;
    if (!array_len(f->hashes, &nh) || !array_len(f->tokens, &nt))
        return KVR_ERR_MALFORMED;
    ev->kind = tag == TAG_STORED    ? KVR_KVEV_STORED
               : tag == TAG_REMOVED ? KVR_KVEV_REMOVED
                                    : KVR_KVEV_CLEARED;
    if (tag == TAG_CLEARED)
        return KVR_OK;
    ev->nhashes = nh;
    ev->hashes = nh ? hp : NULL;
    for (uint32_t i = 0; i < nh; i++)
        if (!hash_of(&f->hashes->via.array.ptr[i], &hp[i], seen))
            return KVR_ERR_MALFORMED;
    if (!text_of(f->medium, ev->medium, sizeof ev->medium) ||
        !text_of(f->kind, ev->spec_kind, sizeof ev->spec_kind))
        return KVR_ERR_MALFORMED;
    if (!is_nil(f->group)) {
        if (!int_of(f->group, &ev->group_idx))
            return KVR_ERR_MALFORMED;
        ev->has_group = true;
    }
    if (tag == TAG_REMOVED)
        return KVR_OK;

    if (!is_nil(f->parent)) {
        if (!hash_of(f->parent, &ev->parent, seen))
            return KVR_ERR_MALFORMED;
        ev->has_parent = true;
    }
    ev->ntokens = nt;
    ev->tokens = nt ? tp : NULL;
    for (uint32_t i = 0; i < nt; i++) {
        const msgpack_object *t = &f->tokens->via.array.ptr[i];
        if (t->type != MSGPACK_OBJECT_POSITIVE_INTEGER || t->via.u64 > UINT32_MAX)
            return KVR_ERR_MALFORMED;
        tp[i] = (uint32_t)t->via.u64;
    }
    uint64_t bs;
    if (f->block_size) {
        if (f->block_size->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
            f->block_size->via.u64 > UINT32_MAX)
            return KVR_ERR_MALFORMED;
        bs = f->block_size->via.u64;
    } else {
        bs = nh ? nt / nh : 0;
    }
    if ((uint64_t)nh * bs != nt || (bs == 0 && (nh || nt)))
        return KVR_ERR_MALFORMED;
    ev->block_size = (uint32_t)bs;
    if (!is_nil(f->lora)) {
        if (!int_of(f->lora, &ev->lora_id))
            return KVR_ERR_MALFORMED;
        ev->has_lora = true;
    }
    return extra_of(f->extra, ev) && salt_of(f, ev) ? KVR_OK : KVR_ERR_MALFORMED;
}

/* The batch's own fields: ts, the events array, the rank (NULL when absent). */
static bool batch_fields(const msgpack_object *root, const msgpack_object **ts,
                         const msgpack_object **events, const msgpack_object **rank, uint32_t *seen)
{
    *ts = *events = *rank = NULL;
    if (root->type == MSGPACK_OBJECT_ARRAY) {
        const msgpack_object_array *a = &root->via.array;
        if (a->size < 2)
            return false;
        *ts = &a->ptr[0];
        *events = &a->ptr[1];
        if (a->size >= 3)
            *rank = &a->ptr[2];
    } else if (root->type == MSGPACK_OBJECT_MAP) {
        *seen |= KVR_KVEV_SEEN_MAP_BATCH;
        for (uint32_t i = 0; i < root->via.map.size; i++) {
            const msgpack_object *k = &root->via.map.ptr[i].key, *v = &root->via.map.ptr[i].val;
            if (is_str(k, "ts"))
                *ts = v;
            else if (is_str(k, "events"))
                *events = v;
            else if (is_str(k, "data_parallel_rank"))
                *rank = v;
        }
        if (!*ts || !*events)
            return false;
    } else {
        return false;
    }
    return (*events)->type == MSGPACK_OBJECT_ARRAY;
}

static bool ts_of(const msgpack_object *o, double *ts)
{
    switch (o->type) {
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        *ts = o->via.f64;
        return true;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        *ts = (double)o->via.u64;
        return true;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *ts = (double)o->via.i64;
        return true;
    default:
        return false;
    }
}

static kvr_status walk(const msgpack_object *root, const struct kvr_kvev_limits *lim,
                       struct kvr_kvev_batch *out)
{
    const msgpack_object *ts, *events, *rank;
    if (!batch_fields(root, &ts, &events, &rank, &out->seen) || !ts_of(ts, &out->ts))
        return KVR_ERR_MALFORMED;
    if (!is_nil(rank)) {
        if (!int_of(rank, &out->dp_rank))
            return KVR_ERR_MALFORMED;
        out->has_dp_rank = true;
    }
    const msgpack_object_array *ea = &events->via.array;
    if (ea->size > lim->max_events)
        return KVR_ERR_TOO_LARGE;

    /* First pass: tags, shapes and the totals the limits bound. */
    uint64_t nh = 0, nt = 0;
    uint32_t known = 0;
    for (uint32_t i = 0; i < ea->size; i++) {
        enum tag tag;
        struct fields f;
        if (!event_fields(&ea->ptr[i], &tag, &f))
            return KVR_ERR_MALFORMED;
        if (tag == TAG_UNKNOWN) {
            out->unknown_events++;
            continue;
        }
        if (ea->ptr[i].type == MSGPACK_OBJECT_MAP)
            out->seen |= KVR_KVEV_SEEN_MAP_EVENTS;
        uint32_t h, t;
        if (!array_len(f.hashes, &h) || !array_len(f.tokens, &t))
            return KVR_ERR_MALFORMED;
        nh += h;
        nt += t;
        known++;
    }
    if (nh > lim->max_hashes || nt > lim->max_tokens)
        return KVR_ERR_TOO_LARGE;

    /* Second pass: fill. */
    if (known) {
        out->events = alloc_array(known, sizeof *out->events);
        if (!out->events)
            return KVR_ERR_NOMEM;
    }
    if (nh) {
        out->hash_store = alloc_array((size_t)nh, sizeof *out->hash_store);
        if (!out->hash_store)
            return KVR_ERR_NOMEM;
    }
    if (nt) {
        out->token_store = alloc_array((size_t)nt, sizeof *out->token_store);
        if (!out->token_store)
            return KVR_ERR_NOMEM;
    }
    size_t ho = 0, to = 0; /* offsets into the stores (NULL when empty: no pointer arithmetic) */
    for (uint32_t i = 0; i < ea->size; i++) {
        enum tag tag;
        struct fields f;
        event_fields(&ea->ptr[i], &tag, &f);
        if (tag == TAG_UNKNOWN)
            continue;
        struct kvr_kvev_event *ev = &out->events[out->nevents++];
        uint64_t *hp = out->hash_store ? out->hash_store + ho : NULL;
        uint32_t *tp = out->token_store ? out->token_store + to : NULL;
        kvr_status st = fill_event(tag, &f, ev, hp, tp, &out->seen);
        if (st != KVR_OK)
            return st;
        ho += ev->nhashes;
        to += ev->ntokens;
    }
    return KVR_OK;
}

static void limits_or_defaults(const struct kvr_kvev_limits *in, struct kvr_kvev_limits *l)
{
    l->max_events = in && in->max_events ? in->max_events : KVR_KVEV_MAX_EVENTS;
    l->max_hashes = in && in->max_hashes ? in->max_hashes : KVR_KVEV_MAX_HASHES;
    l->max_tokens = in && in->max_tokens ? in->max_tokens : KVR_KVEV_MAX_TOKENS;
    l->max_bytes = in && in->max_bytes ? in->max_bytes : KVR_KVEV_MAX_BYTES;
}

/* msgpack-c builds 24 bytes an object before the walk can count events, hashes and tokens: the
 * objects are bounded by what a batch within the limits holds (an event's fields and their small
 * lists, a hash as one object or two, a token one), so a batch of tiny objects cannot cost 24
 * times its bytes */
uint64_t kvr_kvev_max_objects(const struct kvr_kvev_limits *lim)
{
    struct kvr_kvev_limits l;
    limits_or_defaults(lim, &l);
    return (uint64_t)l.max_events * 32 + (uint64_t)l.max_hashes * 2 + (uint64_t)l.max_tokens + 64;
}

kvr_status kvr_kvev_decode(const void *data, size_t len, const struct kvr_kvev_limits *lim,
                           struct kvr_kvev_batch *out)
{
    if (!out)
        return KVR_ERR_INVALID;
    memset(out, 0, sizeof *out);
    if (!data && len > 0)
        return KVR_ERR_INVALID;
    struct kvr_kvev_limits l;
    limits_or_defaults(lim, &l);
    if (len > l.max_bytes)
        return KVR_ERR_TOO_LARGE;
    if (len == 0)
        return KVR_ERR_MALFORMED;
    kvr_status pre = kvr_kvev_prescan(data, len, kvr_kvev_max_objects(&l));
    if (pre != KVR_OK)
        return pre;

    msgpack_zone zone;
    if (!msgpack_zone_init(&zone, 4096))
        return KVR_ERR_NOMEM;
    msgpack_object root;
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack(data, len, &off, &zone, &root);
    kvr_status st;
    if (r == MSGPACK_UNPACK_SUCCESS && off == len)
        st = walk(&root, &l, out);
    else if (r == MSGPACK_UNPACK_NOMEM_ERROR)
        st = KVR_ERR_NOMEM;
    else
        st = KVR_ERR_MALFORMED;
    msgpack_zone_destroy(&zone);
    if (st != KVR_OK)
        kvr_kvev_batch_free(out);
    return st;
}

void kvr_kvev_batch_free(struct kvr_kvev_batch *b)
{
    if (!b)
        return;
    free(b->events);
    free(b->hash_store);
    free(b->token_store);
    memset(b, 0, sizeof *b);
}

/* ---- the encoder ---------------------------------------------------------------------------- */

struct sink {
    struct kvr_buf *b;
    bool nomem;
};

static int sink_write(void *data, const char *buf, size_t len)
{
    struct sink *s = data;
    if (s->nomem)
        return -1;
    if (len > SIZE_MAX - s->b->len) {
        s->nomem = true;
        return -1;
    }
    size_t need = s->b->len + len;
    if (need > s->b->cap) {
        size_t cap = s->b->cap ? s->b->cap : 256;
        while (cap < need)
            cap = cap > SIZE_MAX / 2 ? need : cap * 2;
        if (kvr_buf_reserve(s->b, cap) != KVR_OK) {
            s->nomem = true;
            return -1;
        }
    }
    memcpy(s->b->data + s->b->len, buf, len);
    s->b->len += len;
    return 0;
}

static void pack_cstr(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_hash(msgpack_packer *pk, uint64_t h, enum kvr_kvev_hash_form form)
{
    if (form == KVR_KVEV_HASH_UINT) {
        msgpack_pack_uint64(pk, h);
    } else if (form == KVR_KVEV_HASH_INT) {
        msgpack_pack_int64(pk, (int64_t)h);
    } else {
        uint8_t d[KVR_KVEV_DIGEST_LEN];
        kvr_kvev_digest_of(h, d);
        msgpack_pack_bin(pk, sizeof d);
        msgpack_pack_bin_body(pk, d, sizeof d);
    }
}

static void pack_hashes(msgpack_packer *pk, const struct kvr_kvev_event *e,
                        enum kvr_kvev_hash_form form)
{
    msgpack_pack_array(pk, e->nhashes);
    for (uint32_t i = 0; i < e->nhashes; i++)
        pack_hash(pk, e->hashes[i], form);
}

/* A text field of cap bytes (medium, kv_cache_spec_kind): nil when empty. */
static void pack_text(msgpack_packer *pk, const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);
    if (n == 0) {
        msgpack_pack_nil(pk);
        return;
    }
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_stored_values(msgpack_packer *pk, const struct kvr_kvev_event *e,
                               enum kvr_kvev_hash_form form, bool with_keys)
{
    if (with_keys)
        pack_cstr(pk, "block_hashes");
    pack_hashes(pk, e, form);
    if (with_keys)
        pack_cstr(pk, "parent_block_hash");
    if (e->has_parent)
        pack_hash(pk, e->parent, form);
    else
        msgpack_pack_nil(pk);
    if (with_keys)
        pack_cstr(pk, "token_ids");
    msgpack_pack_array(pk, e->ntokens);
    for (uint32_t i = 0; i < e->ntokens; i++)
        msgpack_pack_uint32(pk, e->tokens[i]);
    if (with_keys)
        pack_cstr(pk, "block_size");
    msgpack_pack_uint32(pk, e->block_size);
    if (with_keys)
        pack_cstr(pk, "lora_id");
    if (e->has_lora)
        msgpack_pack_int64(pk, e->lora_id);
    else
        msgpack_pack_nil(pk);
}

/* A map event's group keys: "group_idx" when has_group, "kv_cache_spec_kind" when spec_kind is
 * not "" (vLLM's order); group_keys counts them. */
static size_t group_keys(const struct kvr_kvev_event *e)
{
    return (e->has_group ? 1u : 0u) + (e->spec_kind[0] ? 1u : 0u);
}

static void pack_group(msgpack_packer *pk, const struct kvr_kvev_event *e)
{
    if (e->has_group) {
        pack_cstr(pk, "group_idx");
        msgpack_pack_int64(pk, e->group_idx);
    }
    if (e->spec_kind[0]) {
        pack_cstr(pk, "kv_cache_spec_kind");
        pack_text(pk, e->spec_kind, sizeof e->spec_kind);
    }
}

static kvr_status pack_event(msgpack_packer *pk, const struct kvr_kvev_event *e,
                             const struct kvr_kvev_encoding *how)
{
    if (e->nhashes && !e->hashes)
        return KVR_ERR_INVALID;
    if (e->kind == KVR_KVEV_STORED && e->ntokens && !e->tokens)
        return KVR_ERR_INVALID;
    bool map = how->layout == KVR_KVEV_LAYOUT_MAP;
    bool old = how->layout == KVR_KVEV_LAYOUT_OLD;
    switch (e->kind) {
    case KVR_KVEV_STORED:
        if (map) {
            msgpack_pack_map(pk, 8 + group_keys(e));
            pack_cstr(pk, "type");
            pack_cstr(pk, "BlockStored");
            pack_stored_values(pk, e, how->hashes, true);
            pack_cstr(pk, "medium");
            pack_text(pk, e->medium, sizeof e->medium);
            pack_cstr(pk, "lora_name");
            msgpack_pack_nil(pk);
            pack_group(pk, e);
        } else {
            msgpack_pack_array(pk, old ? 6 : 7);
            pack_cstr(pk, "BlockStored");
            pack_stored_values(pk, e, how->hashes, false);
            if (!old)
                pack_text(pk, e->medium, sizeof e->medium);
        }
        return KVR_OK;
    case KVR_KVEV_REMOVED:
        if (map) {
            msgpack_pack_map(pk, 3 + group_keys(e));
            pack_cstr(pk, "type");
            pack_cstr(pk, "BlockRemoved");
            pack_cstr(pk, "block_hashes");
            pack_hashes(pk, e, how->hashes);
            pack_cstr(pk, "medium");
            pack_text(pk, e->medium, sizeof e->medium);
            pack_group(pk, e);
        } else {
            msgpack_pack_array(pk, old ? 2 : 3);
            pack_cstr(pk, "BlockRemoved");
            pack_hashes(pk, e, how->hashes);
            if (!old)
                pack_text(pk, e->medium, sizeof e->medium);
        }
        return KVR_OK;
    case KVR_KVEV_CLEARED:
        if (map) {
            msgpack_pack_map(pk, 1);
            pack_cstr(pk, "type");
        } else {
            msgpack_pack_array(pk, 1);
        }
        pack_cstr(pk, "AllBlocksCleared");
        return KVR_OK;
    }
    return KVR_ERR_INVALID;
}

kvr_status kvr_kvev_encode(struct kvr_buf *out, const struct kvr_kvev_batch *b,
                           const struct kvr_kvev_encoding *how)
{
    static const struct kvr_kvev_encoding dflt = {KVR_KVEV_HASH_UINT, KVR_KVEV_LAYOUT_NEW, false};
    if (!out || !b || (b->nevents && !b->events))
        return KVR_ERR_INVALID;
    if (!how)
        how = &dflt;
    if ((unsigned)how->hashes > KVR_KVEV_HASH_BYTES32 ||
        (unsigned)how->layout > KVR_KVEV_LAYOUT_MAP)
        return KVR_ERR_INVALID;
    for (uint32_t i = 0; i < b->nevents; i++) {
        enum kvr_kvev_kind k = b->events[i].kind;
        if (k != KVR_KVEV_STORED && k != KVR_KVEV_REMOVED && k != KVR_KVEV_CLEARED)
            return KVR_ERR_INVALID;
    }
    out->len = 0;
    struct sink s = {out, false};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &s, sink_write);
    msgpack_pack_array(&pk, how->dp_rank ? 3 : 2);
    msgpack_pack_double(&pk, b->ts);
    msgpack_pack_array(&pk, b->nevents);
    for (uint32_t i = 0; i < b->nevents; i++) {
        kvr_status st = pack_event(&pk, &b->events[i], how);
        if (st != KVR_OK) {
            out->len = 0;
            return st;
        }
    }
    if (how->dp_rank) {
        if (b->has_dp_rank)
            msgpack_pack_int64(&pk, b->dp_rank);
        else
            msgpack_pack_nil(&pk);
    }
    if (s.nomem) {
        out->len = 0;
        return KVR_ERR_NOMEM;
    }
    return KVR_OK;
}
