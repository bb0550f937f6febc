/*
 * kvr_hset and kvr_walk implementation. Invariants: n counts the members in every form; the
 * fingerprint of a sparse or dense set is the XOR of kvr_mix64 over its members; a dense set's
 * bitmap and table hold exactly the same slots; a walk's tmp bitmap is all zero between steps
 * and its alive bitmap all zero between walks.
 */
#include "hset.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "kvr/rng.h"

#define EMPTY_SLOT UINT32_MAX

/* The set's form agrees with its size: inline holds at most one, sparse at most cap; empty
 * sets have fingerprint 0. */
static inline __attribute__((unused)) bool form_ok(const struct kvr_hset *s)
{
    if (s->n == 0 && s->fp != 0)
        return false;
    if (s->cap <= 1)
        return s->n <= 1;
    return s->cap == KVR_HSET_DENSE || s->n <= s->cap;
}

/* XOR of kvr_mix64 over pairs[0..n): what a set's fingerprint must be (debug checks). */
static inline __attribute__((unused)) uint64_t fp_of(const struct kvr_hpair *pairs, uint32_t n)
{
    uint64_t fp = 0;
    for (uint32_t i = 0; i < n; i++)
        fp ^= kvr_mix64(pairs[i].slot);
    return fp;
}

static size_t sparse_size(uint32_t cap)
{
    return (size_t)cap * sizeof(struct kvr_hpair);
}

/* Position of slot in a sparse array p[0..n), or n when absent. */
static uint32_t sparse_index(const struct kvr_hpair *p, uint32_t n, uint32_t slot)
{
    uint32_t i = 0;
    while (i < n && p[i].slot != slot)
        i++;
    return i;
}

static size_t dense_size(uint32_t words, uint32_t tcap)
{
    return sizeof(struct kvr_hdense) + (size_t)words * 8 + (size_t)tcap * sizeof(struct kvr_hpair);
}

static struct kvr_hpair *dense_table(const struct kvr_hdense *d)
{
    return (struct kvr_hpair *)(d->bits + d->words);
}

/*
 * Fibonacci hashing: the top bits of the product. (The low bits of slot * odd depend only on the
 * low bits of slot, and fleets often give the workers of one prefix slots with equal low bits:
 * those would all share a few homes and probe long runs.)
 */
static uint32_t dense_home(const struct kvr_hdense *d, uint32_t slot)
{
    return (slot * 0x9e3779b1u) >> (32 - (uint32_t)__builtin_ctz(d->tcap));
}

static bool dense_has(const struct kvr_hdense *d, uint32_t slot)
{
    uint32_t w = slot >> 6;
    return w < d->words && (d->bits[w] >> (slot & 63) & 1);
}

/* Position of member slot in the table. */
static uint32_t dense_pos(const struct kvr_hdense *d, uint32_t slot)
{
    const struct kvr_hpair *t = dense_table(d);
    uint32_t i = dense_home(d, slot);
    while (t[i].slot != slot)
        i = (i + 1) & (d->tcap - 1);
    return i;
}

static void dense_put(struct kvr_hdense *d, uint32_t slot, uint32_t val)
{
    struct kvr_hpair *t = dense_table(d);
    uint32_t i = dense_home(d, slot);
    while (t[i].slot != EMPTY_SLOT)
        i = (i + 1) & (d->tcap - 1);
    assert(!dense_has(d, slot)); /* the bitmap and the table hold the same slots */
    t[i].slot = slot;
    t[i].val = val;
    d->total += val;
    d->wsum += kvr_mix64(slot) * val;
    d->bits[slot >> 6] |= 1ull << (slot & 63);
}

static uint32_t tcap_for(uint32_t n)
{
    uint32_t cap = 64;
    while (cap * 3 < n * 4 + 4)
        cap *= 2;
    return cap;
}

/* A new dense set holding pairs[0..n), with bitmap room for slots below words * 64. */
static struct kvr_hdense *dense_build(const struct kvr_hpair *pairs, uint32_t n, uint32_t words,
                                      size_t *bytes)
{
    uint32_t tcap = tcap_for(n + 1);
    struct kvr_hdense *d = malloc(dense_size(words, tcap));
    if (!d)
        return NULL;
    *bytes += dense_size(words, tcap);
    d->words = words;
    d->tcap = tcap;
    d->refs = 1;
    d->total = 0;
    d->pad = 0;
    d->wsum = 0;
    memset(d->bits, 0, (size_t)words * 8);
    struct kvr_hpair *t = dense_table(d);
    for (uint32_t i = 0; i < tcap; i++)
        t[i].slot = EMPTY_SLOT;
    for (uint32_t i = 0; i < n; i++)
        dense_put(d, pairs[i].slot, pairs[i].val);
    return d;
}

/* The members of a dense set as pairs (in table order); out has room for all of them. */
static void dense_pairs(const struct kvr_hdense *d, struct kvr_hpair *out)
{
    const struct kvr_hpair *t = dense_table(d);
    uint32_t k = 0;
    for (uint32_t i = 0; i < d->tcap; i++)
        if (t[i].slot != EMPTY_SLOT)
            out[k++] = t[i];
}

static void dense_free(struct kvr_hdense *d, size_t *bytes)
{
    *bytes -= dense_size(d->words, d->tcap);
    free(d);
}

/* Drop s's reference to its dense set, freeing it with the last. */
static void dense_unshare(struct kvr_hdense *d, size_t *bytes)
{
    assert(d->refs > 0);
    if (--d->refs == 0)
        dense_free(d, bytes);
}

/* Copy s's shared dense set for s alone (the slow path of dense_own). */
__attribute__((noinline)) static kvr_status dense_copy(struct kvr_hset *s, size_t *bytes)
{
    struct kvr_hdense *d = s->u.dense;
    size_t size = dense_size(d->words, d->tcap);
    struct kvr_hdense *c = malloc(size);
    if (!c)
        return KVR_ERR_NOMEM;
    memcpy(c, d, size);
    *bytes += size;
    c->refs = 1;
    d->refs--;
    s->u.dense = c;
    return KVR_OK;
}

/* Make s's dense set its own before a change: a shared one is copied. */
static inline kvr_status dense_own(struct kvr_hset *s, size_t *bytes)
{
    return s->u.dense->refs == 1 ? KVR_OK : dense_copy(s, bytes);
}

void kvr_hset_share(struct kvr_hset *dst, const struct kvr_hset *src, size_t *bytes)
{
    assert(src->cap == KVR_HSET_DENSE && src->u.dense->refs < UINT32_MAX);
    if (dst->cap == KVR_HSET_DENSE && dst->u.dense == src->u.dense)
        return;
    src->u.dense->refs++;
    kvr_hset_release(dst, bytes);
    *dst = *src;
}

/* Rebuild s's dense set with bitmap room for words and a table sized for its members. */
static kvr_status dense_rebuild(struct kvr_hset *s, uint32_t words, size_t *bytes)
{
    struct kvr_hdense *d = s->u.dense;
    assert(d->refs == 1);
    struct kvr_hpair *tmp = malloc(((size_t)s->n + 1) * sizeof *tmp);
    if (!tmp)
        return KVR_ERR_NOMEM;
    dense_pairs(d, tmp);
    struct kvr_hdense *nd = dense_build(tmp, s->n, words, bytes);
    free(tmp);
    if (!nd)
        return KVR_ERR_NOMEM;
    dense_free(d, bytes);
    s->u.dense = nd;
    return KVR_OK;
}

void kvr__hset_prefetch_slot(const struct kvr_hset *s, uint32_t slot)
{
    if (s->cap != KVR_HSET_DENSE) { /* a find scans every line of the array */
        const char *p = (const char *)s->u.pairs;
        for (size_t off = 0; off < (size_t)s->n * sizeof *s->u.pairs; off += 64)
            __builtin_prefetch(p + off);
        return;
    }
    const struct kvr_hdense *d = s->u.dense;
    if (slot >> 6 < d->words) {
        const struct kvr_hpair *t = dense_table(d);
        uint32_t home = dense_home(d, slot);
        __builtin_prefetch(&d->bits[slot >> 6]);
        __builtin_prefetch(&t[home]);
        __builtin_prefetch(&t[(home + 8) & (d->tcap - 1)]); /* a probe run may cross a line */
    }
}

uint32_t *kvr_hset_find(struct kvr_hset *s, uint32_t slot)
{
    if (s->cap <= 1)
        return s->n && s->u.one.slot == slot ? &s->u.one.val : NULL;
    if (s->cap != KVR_HSET_DENSE) {
        uint32_t i = sparse_index(s->u.pairs, s->n, slot);
        return i < s->n ? &s->u.pairs[i].val : NULL;
    }
    struct kvr_hdense *d = s->u.dense;
    if (!dense_has(d, slot))
        return NULL;
    return &dense_table(d)[dense_pos(d, slot)].val;
}

/* Sparse with n members (room for one more) plus (slot, val) becomes dense. */
static kvr_status to_dense(struct kvr_hset *s, uint32_t slot, uint32_t val, size_t *bytes)
{
    struct kvr_hpair *p = s->u.pairs;
    uint32_t n = s->n;
    p[n].slot = slot;
    p[n].val = val;
    n++;
    uint32_t top = 0;
    for (uint32_t i = 0; i < n; i++)
        top = p[i].slot > top ? p[i].slot : top;
    struct kvr_hdense *d = dense_build(p, n, top / 64 + 1, bytes);
    if (!d)
        return KVR_ERR_NOMEM;
    s->fp ^= kvr_mix64(slot);
    assert(s->fp == fp_of(p, n));
    *bytes -= sparse_size(s->cap);
    free(s->u.pairs);
    s->u.dense = d;
    s->cap = KVR_HSET_DENSE;
    s->n = n;
    return KVR_OK;
}

static kvr_status dense_add(struct kvr_hset *s, uint32_t slot, uint32_t val, size_t *bytes)
{
    kvr_status own = dense_own(s, bytes);
    if (own != KVR_OK)
        return own;
    struct kvr_hdense *d = s->u.dense;
    uint32_t w = slot >> 6;
    if (w >= d->words || (s->n + 1) * 4 > d->tcap * 3) {
        kvr_status st = dense_rebuild(s, w >= d->words ? w + 1 : d->words, bytes);
        if (st != KVR_OK)
            return st;
        d = s->u.dense;
    }
    dense_put(d, slot, val);
    s->fp ^= kvr_mix64(slot);
    s->n++;
    return KVR_OK;
}

/*
 * Whether a sparse set turns dense as slot joins it. An index set does at KVR_HSET_DENSE_AT
 * members. An act set (act) does at KVR_HSET_ACT_DENSE_AT already when its bitmap is small (two
 * words a member at most, so fleets up to 64 workers a member): dense act sets are shared along a
 * path (kvr_hset_share), sparse ones are changed block by block.
 */
static bool dense_due(const struct kvr_hset *s, uint32_t slot, bool act)
{
    uint32_t n = s->n + 1, top = slot;
    if (n >= KVR_HSET_DENSE_AT)
        return true;
    if (!act || n < KVR_HSET_ACT_DENSE_AT)
        return false;
    for (uint32_t i = 0; i < s->n; i++)
        top = s->u.pairs[i].slot > top ? s->u.pairs[i].slot : top;
    return top / 64 + 1 <= 2 * n;
}

/* Whether a dense set of n members (after a deletion) turns sparse: an index set under
 * KVR_HSET_SPARSE_AT members; an act set under KVR_HSET_ACT_SPARSE_AT, or under
 * KVR_HSET_SPARSE_AT when its bitmap is over four words a member. */
static bool sparse_due(const struct kvr_hset *s, bool act)
{
    if (!act)
        return s->n < KVR_HSET_SPARSE_AT;
    return s->n < KVR_HSET_ACT_SPARSE_AT ||
           (s->n < KVR_HSET_SPARSE_AT && s->u.dense->words > 4 * s->n);
}

/* kvr_hset_add, for an act set (kvr__hset_ref) or not. */
static kvr_status add_with(struct kvr_hset *s, uint32_t slot, uint32_t val, bool act, size_t *bytes)
{
    assert(form_ok(s));
    if (s->cap <= 1) {
        if (s->n == 0) {
            s->u.one.slot = slot;
            s->u.one.val = val;
            s->fp = kvr_mix64(slot);
            s->n = 1;
            s->cap = 1;
            return KVR_OK;
        }
        struct kvr_hpair *sp = malloc(sparse_size(4));
        if (!sp)
            return KVR_ERR_NOMEM;
        *bytes += sparse_size(4);
        s->fp ^= kvr_mix64(slot);
        sp[0] = s->u.one;
        sp[1].slot = slot;
        sp[1].val = val;
        s->u.pairs = sp;
        s->cap = 4;
        s->n = 2;
        return KVR_OK;
    }
    if (s->cap == KVR_HSET_DENSE)
        return dense_add(s, slot, val, bytes);
    if (s->n < s->cap && dense_due(s, slot, act))
        return to_dense(s, slot, val, bytes);
    if (s->n == s->cap) {
        uint32_t old = s->cap;
        if (!KVR_GROW(s->u.pairs, s->cap, s->n + 1, 4))
            return KVR_ERR_NOMEM;
        *bytes += sparse_size(s->cap) - sparse_size(old);
        if (dense_due(s, slot, act))
            return to_dense(s, slot, val, bytes);
    }
    struct kvr_hpair *sp = s->u.pairs;
    sp[s->n].slot = slot;
    sp[s->n].val = val;
    s->fp ^= kvr_mix64(slot);
    s->n++;
    return KVR_OK;
}

kvr_status kvr_hset_add(struct kvr_hset *s, uint32_t slot, uint32_t val, size_t *bytes)
{
    return add_with(s, slot, val, false, bytes);
}

/* Shrink a sparse array that has become small: inline for one member, else a smaller array. */
static void sparse_shrink(struct kvr_hset *s, size_t *bytes)
{
    struct kvr_hpair *sp = s->u.pairs;
    if (s->n <= 1) {
        struct kvr_hpair one = sp[0];
        *bytes -= sparse_size(s->cap);
        free(sp);
        s->u.one = one;
        s->cap = 1;
        return;
    }
    if (s->cap > 4 && s->n * 4 <= s->cap) {
        uint32_t cap = s->cap / 2;
        struct kvr_hpair *np = realloc(sp, sparse_size(cap));
        if (np) {
            *bytes -= sparse_size(s->cap) - sparse_size(cap);
            s->u.pairs = np;
            s->cap = cap;
        }
    }
}

/* Delete the member at position i of a sparse set. */
static void sparse_del_at(struct kvr_hset *s, uint32_t i, size_t *bytes)
{
    struct kvr_hpair *sp = s->u.pairs;
    s->fp ^= kvr_mix64(sp[i].slot);
    sp[i] = sp[--s->n];
    sparse_shrink(s, bytes);
}

/* A dense set that fell below KVR_HSET_SPARSE_AT members becomes sparse. */
static void to_sparse(struct kvr_hset *s, size_t *bytes)
{
    struct kvr_hdense *d = s->u.dense;
    assert(d->refs == 1);
    uint32_t cap = 4;
    while (cap < s->n * 2)
        cap *= 2;
    struct kvr_hpair *sp = malloc(sparse_size(cap));
    if (!sp)
        return; /* stays dense: correct, only larger */
    *bytes += sparse_size(cap);
    dense_pairs(d, sp);
    dense_free(d, bytes);
    s->u.pairs = sp;
    s->cap = cap;
    assert(s->fp == fp_of(sp, s->n));
    sparse_shrink(s, bytes);
}

/* Delete member slot, which sits at table position hole, of an act set or not (sparse_due). */
static void dense_del_at(struct kvr_hset *s, uint32_t slot, uint32_t hole, bool act, size_t *bytes)
{
    struct kvr_hdense *d = s->u.dense;
    struct kvr_hpair *t = dense_table(d);
    uint32_t mask = d->tcap - 1;
    assert(t[hole].slot == slot && d->refs == 1);
    d->total -= t[hole].val;
    d->wsum -= kvr_mix64(slot) * t[hole].val;
    for (uint32_t j = (hole + 1) & mask; t[j].slot != EMPTY_SLOT; j = (j + 1) & mask) {
        uint32_t home = dense_home(d, t[j].slot);
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            t[hole] = t[j];
            hole = j;
        }
    }
    t[hole].slot = EMPTY_SLOT;
    d->bits[slot >> 6] &= ~(1ull << (slot & 63));
    s->fp ^= kvr_mix64(slot);
    s->n--;
    if (sparse_due(s, act))
        to_sparse(s, bytes);
    else if (d->tcap > 64 && s->n * 8 < d->tcap)
        dense_rebuild(s, d->words, bytes); /* on failure it simply stays larger */
}

bool kvr_hset_del(struct kvr_hset *s, uint32_t slot, size_t *bytes)
{
    assert(form_ok(s));
    if (s->cap <= 1) {
        if (s->n == 0 || s->u.one.slot != slot)
            return false;
        assert(s->fp == kvr_mix64(slot));
        kvr__hset_empty(s);
        return true;
    }
    if (s->cap == KVR_HSET_DENSE) {
        if (!dense_has(s->u.dense, slot))
            return false;
        if (dense_own(s, bytes) != KVR_OK)
            return false; /* no memory to copy a shared set: it keeps the member */
        dense_del_at(s, slot, dense_pos(s->u.dense, slot), false, bytes);
        return true;
    }
    uint32_t i = sparse_index(s->u.pairs, s->n, slot);
    if (i == s->n)
        return false;
    sparse_del_at(s, i, bytes);
    return true;
}

kvr_status kvr__hset_ref(struct kvr_hset *s, uint32_t slot, bool *added, size_t *bytes)
{
    assert(form_ok(s));
    uint32_t *val = NULL;
    if (s->cap <= 1) {
        val = s->n && s->u.one.slot == slot ? &s->u.one.val : NULL;
    } else if (s->cap != KVR_HSET_DENSE) {
        uint32_t i = sparse_index(s->u.pairs, s->n, slot);
        val = i < s->n ? &s->u.pairs[i].val : NULL;
    } else if (dense_has(s->u.dense, slot)) {
        kvr_status own = dense_own(s, bytes);
        if (own != KVR_OK)
            return own;
        val = &dense_table(s->u.dense)[dense_pos(s->u.dense, slot)].val;
        s->u.dense->total++;
        s->u.dense->wsum += kvr_mix64(slot);
    }
    *added = val == NULL;
    if (val) {
        assert(*val > 0 && *val < UINT32_MAX); /* a member holds at least one reference */
        ++*val;
        return KVR_OK;
    }
    return add_with(s, slot, 1, true, bytes);
}

bool kvr__hset_unref(struct kvr_hset *s, uint32_t slot, size_t *bytes)
{
    assert(form_ok(s));
    if (s->cap <= 1) {
        assert(s->n == 1 && s->u.one.slot == slot && s->u.one.val > 0);
        if (s->n == 0 || s->u.one.slot != slot)
            return false; /* not a member: nothing changes */
        if (--s->u.one.val)
            return false;
        kvr__hset_empty(s);
        return true;
    }
    if (s->cap == KVR_HSET_DENSE) {
        assert(dense_has(s->u.dense, slot)); /* slot is a member; if not, nothing changes */
        if (!dense_has(s->u.dense, slot))
            return false;
        if (dense_own(s, bytes) != KVR_OK)
            return false; /* no memory for a ~1 KB copy of a shared set: the reference stays
                             counted, so the block looks one request busier on slot until the
                             set is copied or freed */
        struct kvr_hdense *d = s->u.dense;
        d->total--;
        d->wsum -= kvr_mix64(slot);
        uint32_t pos = dense_pos(d, slot);
        assert(dense_table(d)[pos].val > 0);
        if (--dense_table(d)[pos].val)
            return false;
        dense_del_at(s, slot, pos, true, bytes);
        return true;
    }
    struct kvr_hpair *sp = s->u.pairs;
    uint32_t i = sparse_index(sp, s->n, slot);
    assert(i < s->n && sp[i].val > 0); /* slot is a member; if not, nothing changes */
    if (i == s->n)
        return false;
    if (--sp[i].val)
        return false;
    sparse_del_at(s, i, bytes);
    return true;
}

void kvr__hset_release(struct kvr_hset *s, size_t *bytes)
{
    if (s->cap == KVR_HSET_DENSE) {
        dense_unshare(s->u.dense, bytes);
    } else if (s->cap > 1) {
        *bytes -= sparse_size(s->cap);
        free(s->u.pairs);
    }
    kvr__hset_empty(s);
}

void kvr_hset_iter_init(struct kvr_hset_iter *it, const struct kvr_hset *s)
{
    it->s = s;
    it->i = 0;
}

uint32_t kvr_hset_slots(const struct kvr_hset *s, uint32_t *out)
{
    if (s->cap <= 1) {
        if (s->n)
            out[0] = s->u.one.slot;
        return s->n;
    }
    if (s->cap != KVR_HSET_DENSE) {
        for (uint32_t i = 0; i < s->n; i++)
            out[i] = s->u.pairs[i].slot;
        return s->n;
    }
    const struct kvr_hdense *d = s->u.dense;
    uint32_t n = 0;
    for (uint32_t i = 0; i < d->words; i++)
        for (uint64_t b = d->bits[i]; b; b &= b - 1)
            out[n++] = i * 64 + (uint32_t)__builtin_ctzll(b);
    assert(n == s->n);
    return n;
}

bool kvr_hset_next(struct kvr_hset_iter *it, uint32_t *slot, uint32_t *val)
{
    const struct kvr_hset *s = it->s;
    const struct kvr_hpair *p;
    if (s->cap <= 1) {
        if (it->i >= s->n)
            return false;
        p = &s->u.one;
        it->i++;
    } else if (s->cap != KVR_HSET_DENSE) {
        if (it->i >= s->n)
            return false;
        p = &s->u.pairs[it->i++];
    } else {
        const struct kvr_hdense *d = s->u.dense;
        const struct kvr_hpair *t = dense_table(d);
        while (it->i < d->tcap && t[it->i].slot == EMPTY_SLOT)
            it->i++;
        if (it->i >= d->tcap)
            return false;
        p = &t[it->i++];
    }
    *slot = p->slot;
    *val = p->val;
    return true;
}

kvr_status kvr_walk_reserve(struct kvr_walk *w, uint32_t nslots)
{
    uint32_t words = (nslots + 63) / 64;
    if (words <= w->words)
        return KVR_OK;
    uint64_t *alive = calloc(words, sizeof *alive);
    uint64_t *tmp = calloc(words, sizeof *tmp);
    uint32_t *nz = calloc(words, sizeof *nz);
    if (!alive || !tmp || !nz) {
        free(alive);
        free(tmp);
        free(nz);
        return KVR_ERR_NOMEM;
    }
    free(w->alive);
    free(w->tmp);
    free(w->nz);
    w->alive = alive;
    w->tmp = tmp;
    w->nz = nz;
    w->words = words;
    w->nnz = 0;
    return KVR_OK;
}

void kvr_walk_free(struct kvr_walk *w)
{
    free(w->alive);
    free(w->tmp);
    free(w->nz);
    memset(w, 0, sizeof *w);
}

/* Whether v[0..n) is all zero (a debug check, once per walk). */
static inline __attribute__((unused)) bool all_zero(const uint64_t *v, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (v[i])
            return false;
    return true;
}

static void walk_set(struct kvr_walk *w, uint32_t slot)
{
    uint32_t i = slot >> 6;
    if (i >= w->words)
        return;
    if (!w->alive[i])
        w->nz[w->nnz++] = i;
    w->alive[i] |= 1ull << (slot & 63);
}

/* Remember the set just intersected; returns whether it equals the previous one. */
static bool walk_same(struct kvr_walk *w, const struct kvr_hset *s)
{
    uint64_t fp = kvr_hset_fp(s);
    bool same = fp == w->last_fp && s->n == w->last_n;
    w->last_fp = fp;
    w->last_n = s->n;
    return same;
}

void kvr_walk_start(struct kvr_walk *w, const struct kvr_hset *first)
{
    assert(w->nnz == 0); /* alive is all zero between walks */
    w->deepest = 0;
    walk_same(w, first);
    if (first->cap <= 1) {
        if (first->n)
            walk_set(w, first->u.one.slot);
    } else if (first->cap != KVR_HSET_DENSE) {
        for (uint32_t i = 0; i < first->n; i++)
            walk_set(w, first->u.pairs[i].slot);
    } else {
        const struct kvr_hdense *d = first->u.dense;
        uint32_t words = d->words < w->words ? d->words : w->words;
        for (uint32_t i = 0; i < words; i++) {
            if (d->bits[i]) {
                w->alive[i] = d->bits[i];
                w->nz[w->nnz++] = i;
            }
        }
    }
}

/* Drop bits of alive word nz[k] that are not in keep; returns whether the word emptied. */
static bool walk_keep(struct kvr_walk *w, uint32_t k, uint64_t keep, uint32_t depth, uint32_t *out)
{
    uint32_t i = w->nz[k];
    uint64_t a = w->alive[i];
    for (uint64_t gone = a & ~keep; gone; gone &= gone - 1)
        out[i * 64 + (uint32_t)__builtin_ctzll(gone)] = depth;
    w->alive[i] = a & keep;
    return (a & keep) == 0;
}

static void walk_mark(struct kvr_walk *w, uint32_t slot)
{
    uint32_t i = slot >> 6;
    uint64_t b = 1ull << (slot & 63);
    if (i < w->words && (w->alive[i] & b))
        w->tmp[i] |= b;
}

static void walk_step(struct kvr_walk *w, const struct kvr_hset *s, uint32_t depth, uint32_t *out)
{
    if (walk_same(w, s))
        return; /* alive is a subset of the previous set, which equals this one */
    if (s->cap == KVR_HSET_DENSE) {
        const struct kvr_hdense *d = s->u.dense;
        for (uint32_t k = 0; k < w->nnz;) {
            uint32_t i = w->nz[k];
            uint64_t keep = i < d->words ? d->bits[i] : 0;
            if (walk_keep(w, k, keep, depth, out))
                w->nz[k] = w->nz[--w->nnz];
            else
                k++;
        }
        return;
    }
    if (s->cap <= 1) {
        if (s->n)
            walk_mark(w, s->u.one.slot);
    } else {
        for (uint32_t j = 0; j < s->n; j++)
            walk_mark(w, s->u.pairs[j].slot);
    }
    for (uint32_t k = 0; k < w->nnz;) {
        uint32_t i = w->nz[k];
        uint64_t keep = w->tmp[i];
        w->tmp[i] = 0;
        if (walk_keep(w, k, keep, depth, out))
            w->nz[k] = w->nz[--w->nnz];
        else
            k++;
    }
}

void kvr_walk_step(struct kvr_walk *w, const struct kvr_hset *s, uint32_t depth, uint32_t *out)
{
    bool alive = w->nnz != 0;
    walk_step(w, s, depth, out);
    if (alive && w->nnz == 0)
        w->deepest = depth; /* the last workers dropped out here: none reaches deeper */
}

void kvr_walk_finish(struct kvr_walk *w, uint32_t depth, uint32_t *out)
{
    if (w->nnz)
        w->deepest = depth;
    for (uint32_t k = 0; k < w->nnz; k++) {
        uint32_t i = w->nz[k];
        for (uint64_t b = w->alive[i]; b; b &= b - 1)
            out[i * 64 + (uint32_t)__builtin_ctzll(b)] = depth;
        w->alive[i] = 0;
    }
    w->nnz = 0;
    assert(all_zero(w->alive, w->words) && all_zero(w->tmp, w->words));
}
