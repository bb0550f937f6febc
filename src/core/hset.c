/*
 * kvr_hset and kvr_walk implementation. Invariants: n counts the members in every form; a dense
 * set's prefix counts and packed values always match its bitmap; a walk's tmp bitmap is all zero
 * between steps and its alive bitmap all zero between walks.
 */
#include "hset.h"

#include <stdlib.h>
#include <string.h>

static uint32_t *dense_cum(const struct kvr_hdense *d)
{
    return (uint32_t *)(d->bits + d->words);
}

static uint32_t *dense_vals(const struct kvr_hdense *d)
{
    return dense_cum(d) + d->words;
}

static size_t dense_size(uint32_t words, uint32_t vcap)
{
    return sizeof(struct kvr_hdense) + (size_t)words * 12 + (size_t)vcap * 4;
}

static uint32_t dense_rank(const struct kvr_hdense *d, uint32_t slot)
{
    uint32_t w = slot >> 6;
    uint64_t below = (1ull << (slot & 63)) - 1;
    return dense_cum(d)[w] + (uint32_t)__builtin_popcountll(d->bits[w] & below);
}

static bool dense_has(const struct kvr_hdense *d, uint32_t slot)
{
    uint32_t w = slot >> 6;
    return w < d->words && (d->bits[w] >> (slot & 63) & 1);
}

/* A new dense set holding the n members of src (in slot order), with room for more. */
static struct kvr_hdense *dense_build(const struct kvr_hpair *sorted, uint32_t n, uint32_t words,
                                      uint32_t vcap, size_t *bytes)
{
    struct kvr_hdense *d = calloc(1, dense_size(words, vcap));
    if (!d)
        return NULL;
    *bytes += dense_size(words, vcap);
    d->words = words;
    d->vcap = vcap;
    uint32_t *vals = dense_vals(d);
    for (uint32_t i = 0; i < n; i++) {
        d->bits[sorted[i].slot >> 6] |= 1ull << (sorted[i].slot & 63);
        vals[i] = sorted[i].val;
    }
    uint32_t *cum = dense_cum(d);
    uint32_t acc = 0;
    for (uint32_t w = 0; w < words; w++) {
        cum[w] = acc;
        acc += (uint32_t)__builtin_popcountll(d->bits[w]);
    }
    return d;
}

/* Members of a dense set as pairs in slot order; out has room for d's members. */
static void dense_pairs(const struct kvr_hdense *d, struct kvr_hpair *out)
{
    const uint32_t *vals = dense_vals(d);
    uint32_t k = 0;
    for (uint32_t w = 0; w < d->words; w++) {
        for (uint64_t b = d->bits[w]; b; b &= b - 1) {
            out[k].slot = w * 64 + (uint32_t)__builtin_ctzll(b);
            out[k].val = vals[k];
            k++;
        }
    }
}

static void dense_free(struct kvr_hdense *d, size_t *bytes)
{
    *bytes -= dense_size(d->words, d->vcap);
    free(d);
}

static int cmp_pair(const void *a, const void *b)
{
    uint32_t x = ((const struct kvr_hpair *)a)->slot, y = ((const struct kvr_hpair *)b)->slot;
    return (x > y) - (x < y);
}

uint32_t *kvr_hset_find(struct kvr_hset *s, uint32_t slot)
{
    if (s->cap <= 1)
        return s->n && s->u.one.slot == slot ? &s->u.one.val : NULL;
    if (s->cap != KVR_HSET_DENSE) {
        struct kvr_hpair *p = s->u.pairs;
        for (uint32_t i = 0; i < s->n; i++)
            if (p[i].slot == slot)
                return &p[i].val;
        return NULL;
    }
    struct kvr_hdense *d = s->u.dense;
    if (!dense_has(d, slot))
        return NULL;
    return &dense_vals(d)[dense_rank(d, slot)];
}

static kvr_status to_dense(struct kvr_hset *s, uint32_t slot, uint32_t val, size_t *bytes)
{
    struct kvr_hpair *p = s->u.pairs;
    uint32_t n = s->n;
    p[n].slot = slot; /* the caller guaranteed room for one more pair */
    p[n].val = val;
    n++;
    qsort(p, n, sizeof *p, cmp_pair);
    uint32_t words = p[n - 1].slot / 64 + 1;
    struct kvr_hdense *d = dense_build(p, n, words, n * 2, bytes);
    if (!d)
        return KVR_ERR_NOMEM;
    *bytes -= (size_t)s->cap * sizeof *p;
    free(p);
    s->u.dense = d;
    s->cap = KVR_HSET_DENSE;
    s->n = n;
    return KVR_OK;
}

static kvr_status dense_add(struct kvr_hset *s, uint32_t slot, uint32_t val, size_t *bytes)
{
    struct kvr_hdense *d = s->u.dense;
    uint32_t w = slot >> 6;
    if (w >= d->words || s->n == d->vcap) {
        uint32_t words = w >= d->words ? w + 1 : d->words;
        struct kvr_hpair *tmp = malloc(((size_t)s->n + 1) * sizeof *tmp);
        if (!tmp)
            return KVR_ERR_NOMEM;
        dense_pairs(d, tmp);
        struct kvr_hdense *nd = dense_build(tmp, s->n, words, (s->n + 1) * 2, bytes);
        free(tmp);
        if (!nd)
            return KVR_ERR_NOMEM;
        dense_free(d, bytes);
        s->u.dense = d = nd;
    }
    uint32_t *vals = dense_vals(d);
    uint32_t r = dense_rank(d, slot);
    memmove(vals + r + 1, vals + r, (size_t)(s->n - r) * sizeof *vals);
    vals[r] = val;
    d->bits[w] |= 1ull << (slot & 63);
    uint32_t *cum = dense_cum(d);
    for (uint32_t i = w + 1; i < d->words; i++)
        cum[i]++;
    s->n++;
    return KVR_OK;
}

kvr_status kvr_hset_add(struct kvr_hset *s, uint32_t slot, uint32_t val, size_t *bytes)
{
    if (s->cap <= 1) {
        if (s->n == 0) {
            s->u.one.slot = slot;
            s->u.one.val = val;
            s->n = 1;
            s->cap = 1;
            return KVR_OK;
        }
        struct kvr_hpair *p = malloc(4 * sizeof *p);
        if (!p)
            return KVR_ERR_NOMEM;
        *bytes += 4 * sizeof *p;
        p[0] = s->u.one;
        p[1].slot = slot;
        p[1].val = val;
        s->u.pairs = p;
        s->cap = 4;
        s->n = 2;
        return KVR_OK;
    }
    if (s->cap == KVR_HSET_DENSE)
        return dense_add(s, slot, val, bytes);
    if (s->n + 1 >= KVR_HSET_DENSE_AT && s->n < s->cap)
        return to_dense(s, slot, val, bytes);
    if (s->n == s->cap) {
        uint32_t cap = s->cap * 2;
        struct kvr_hpair *p = realloc(s->u.pairs, (size_t)cap * sizeof *p);
        if (!p)
            return KVR_ERR_NOMEM;
        *bytes += (size_t)(cap - s->cap) * sizeof *p;
        s->u.pairs = p;
        s->cap = cap;
        if (s->n + 1 >= KVR_HSET_DENSE_AT)
            return to_dense(s, slot, val, bytes);
    }
    s->u.pairs[s->n].slot = slot;
    s->u.pairs[s->n].val = val;
    s->n++;
    return KVR_OK;
}

/* Shrink a sparse array that has become small: inline for one member, else a smaller array. */
static void sparse_shrink(struct kvr_hset *s, size_t *bytes)
{
    struct kvr_hpair *p = s->u.pairs;
    if (s->n <= 1) {
        struct kvr_hpair one = p[0];
        *bytes -= (size_t)s->cap * sizeof *p;
        free(p);
        s->u.one = one;
        s->cap = 1;
        return;
    }
    if (s->cap > 4 && s->n * 4 <= s->cap) {
        uint32_t cap = s->cap / 2;
        struct kvr_hpair *np = realloc(p, (size_t)cap * sizeof *p);
        if (np) {
            *bytes -= (size_t)(s->cap - cap) * sizeof *p;
            s->u.pairs = np;
            s->cap = cap;
        }
    }
}

static void dense_del(struct kvr_hset *s, uint32_t slot, size_t *bytes)
{
    struct kvr_hdense *d = s->u.dense;
    uint32_t w = slot >> 6;
    uint32_t *vals = dense_vals(d);
    uint32_t r = dense_rank(d, slot);
    memmove(vals + r, vals + r + 1, (size_t)(s->n - r - 1) * sizeof *vals);
    d->bits[w] &= ~(1ull << (slot & 63));
    uint32_t *cum = dense_cum(d);
    for (uint32_t i = w + 1; i < d->words; i++)
        cum[i]--;
    s->n--;
    if (s->n >= KVR_HSET_SPARSE_AT)
        return;
    uint32_t cap = 4;
    while (cap < s->n * 2)
        cap *= 2;
    struct kvr_hpair *p = malloc((size_t)cap * sizeof *p);
    if (!p)
        return; /* stays dense: correct, only larger */
    *bytes += (size_t)cap * sizeof *p;
    dense_pairs(d, p);
    dense_free(d, bytes);
    s->u.pairs = p;
    s->cap = cap;
    sparse_shrink(s, bytes);
}

bool kvr_hset_del(struct kvr_hset *s, uint32_t slot, size_t *bytes)
{
    if (s->cap <= 1) {
        if (s->n == 0 || s->u.one.slot != slot)
            return false;
        s->n = 0;
        s->cap = 0;
        return true;
    }
    if (s->cap == KVR_HSET_DENSE) {
        if (!dense_has(s->u.dense, slot))
            return false;
        dense_del(s, slot, bytes);
        return true;
    }
    struct kvr_hpair *p = s->u.pairs;
    for (uint32_t i = 0; i < s->n; i++) {
        if (p[i].slot == slot) {
            p[i] = p[--s->n];
            sparse_shrink(s, bytes);
            return true;
        }
    }
    return false;
}

void kvr_hset_release(struct kvr_hset *s, size_t *bytes)
{
    if (s->cap == KVR_HSET_DENSE) {
        dense_free(s->u.dense, bytes);
    } else if (s->cap > 1) {
        *bytes -= (size_t)s->cap * sizeof(struct kvr_hpair);
        free(s->u.pairs);
    }
    s->n = 0;
    s->cap = 0;
}

void kvr_hset_iter_init(struct kvr_hset_iter *it, const struct kvr_hset *s)
{
    it->s = s;
    it->i = 0;
    it->bits = 0;
    it->word = 0;
    if (s->cap == KVR_HSET_DENSE && s->n)
        it->bits = s->u.dense->bits[0];
}

bool kvr_hset_next(struct kvr_hset_iter *it, uint32_t *slot, uint32_t *val)
{
    const struct kvr_hset *s = it->s;
    if (s->cap <= 1) {
        if (it->i >= s->n)
            return false;
        it->i++;
        *slot = s->u.one.slot;
        *val = s->u.one.val;
        return true;
    }
    if (s->cap != KVR_HSET_DENSE) {
        if (it->i >= s->n)
            return false;
        *slot = s->u.pairs[it->i].slot;
        *val = s->u.pairs[it->i].val;
        it->i++;
        return true;
    }
    const struct kvr_hdense *d = s->u.dense;
    if (it->i >= s->n)
        return false;
    while (!it->bits) {
        it->word++;
        it->bits = d->bits[it->word];
    }
    *slot = it->word * 64 + (uint32_t)__builtin_ctzll(it->bits);
    *val = dense_vals(d)[it->i];
    it->bits &= it->bits - 1;
    it->i++;
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

static void walk_set(struct kvr_walk *w, uint32_t slot)
{
    uint32_t i = slot >> 6;
    if (i >= w->words)
        return;
    if (!w->alive[i])
        w->nz[w->nnz++] = i;
    w->alive[i] |= 1ull << (slot & 63);
}

void kvr_walk_start(struct kvr_walk *w, const struct kvr_hset *first)
{
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

void kvr_walk_step(struct kvr_walk *w, const struct kvr_hset *s, uint32_t depth, uint32_t *out)
{
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

void kvr_walk_finish(struct kvr_walk *w, uint32_t depth, uint32_t *out)
{
    for (uint32_t k = 0; k < w->nnz; k++) {
        uint32_t i = w->nz[k];
        for (uint64_t b = w->alive[i]; b; b &= b - 1)
            out[i * 64 + (uint32_t)__builtin_ctzll(b)] = depth;
        w->alive[i] = 0;
    }
    w->nnz = 0;
}
