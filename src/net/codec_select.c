/*
 * kvr_wire's select answer (codec.h): SelectResponse, encoded by the router that decided and
 * decoded by a client (kvbench). A fleet can have more workers than one NATS message can list, so
 * the answer lists at most KVR_WIRE_CANDIDATES_LISTED of them, those a client falling back from
 * the chosen worker would want first, and says how many were weighed. Pure and thread-safe.
 */
#include <stdlib.h>

#include "codec.h"
#include "codec_internal.h"
#include "kvr/policy.h"
#include "kvrouter.pb-c.h" /* generated from proto/kvrouter/v1/kvrouter.proto */

/* Field numbers the wire-level counts need (proto/kvrouter/v1/kvrouter.proto). */
#define SELECT_RESPONSE_CANDIDATES 4 /* SelectResponse.candidates */

struct priced {
    double cost;
    uint32_t i; /* its index in the decision's arrays */
};

/* Cheapest first; equal costs (and NaN, last) in registry order. */
static int by_cost(const void *pa, const void *pb)
{
    const struct priced *a = pa, *b = pb;
    if (a->cost < b->cost || (a->cost == a->cost && b->cost != b->cost))
        return -1;
    if (a->cost > b->cost || (b->cost == b->cost && a->cost != a->cost))
        return 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

/*
 * order[0..*k): the indices of d's candidates to list. All of them, in registry order, when they
 * fit; else the chosen worker's, then the cheapest others (registry order when d has no costs).
 */
static kvr_status listed(const struct kvr_decision *d, uint32_t *order, uint32_t *k)
{
    uint32_t n = d->ncandidates, chosen = n;
    if (n <= KVR_WIRE_CANDIDATES_LISTED) {
        for (uint32_t i = 0; i < n; i++)
            order[i] = i;
        *k = n;
        return KVR_OK;
    }
    for (uint32_t i = 0; i < n && chosen == n; i++)
        if (d->worker_ids[i] == d->worker_id)
            chosen = i;
    struct priced *p = kvr_codec_array(n, sizeof *p);
    if (!p)
        return KVR_ERR_NOMEM;
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (i != chosen)
            p[m++] = (struct priced){d->costs ? d->costs[i] : 0, i};
    if (d->costs)
        qsort(p, m, sizeof *p, by_cost);
    *k = 0;
    if (chosen < n)
        order[(*k)++] = chosen;
    for (uint32_t j = 0; *k < KVR_WIRE_CANDIDATES_LISTED; j++)
        order[(*k)++] = p[j].i;
    free(p);
    return KVR_OK;
}

static kvr_status fill_candidates(Kvrouter__V1__SelectResponse *m, const struct kvr_decision *d,
                                  Kvrouter__V1__Candidate **cand)
{
    uint32_t room =
        d->ncandidates < KVR_WIRE_CANDIDATES_LISTED ? d->ncandidates : KVR_WIRE_CANDIDATES_LISTED;
    uint32_t *order = kvr_codec_array(room, sizeof *order), k = 0;
    *cand = kvr_codec_array(room, sizeof **cand);
    Kvrouter__V1__Candidate **ptrs = kvr_codec_array(room, sizeof *ptrs);
    kvr_status st = order && *cand && ptrs ? listed(d, order, &k) : KVR_ERR_NOMEM;
    for (uint32_t j = 0; st == KVR_OK && j < k; j++) {
        uint32_t i = order[j];
        Kvrouter__V1__Candidate c = KVROUTER__V1__CANDIDATE__INIT;
        c.worker_id = d->worker_ids[i];
        c.cost = d->costs ? d->costs[i] : 0; /* NULL: not every worker was priced */
        if (d->candidates) {
            c.overlap_blocks = d->candidates[i].overlap_blocks;
            c.prefill_tokens = d->candidates[i].prefill_tokens;
            c.decode_blocks = d->candidates[i].decode_blocks;
            c.inflight = d->candidates[i].inflight;
            c.busy = d->candidates[i].busy;
            c.too_small = d->candidates[i].too_small;
        }
        (*cand)[j] = c;
        ptrs[j] = &(*cand)[j];
    }
    free(order);
    if (st != KVR_OK) {
        free(ptrs);
        return st;
    }
    m->candidates = ptrs;
    m->n_candidates = k;
    m->weighed = d->ncandidates;
    return KVR_OK;
}

kvr_status kvr_wire_encode_select_response(struct kvr_buf *b, const struct kvr_decision *d,
                                           uint64_t key, kvr_status error, const char *router_id,
                                           const char *detail)
{
    Kvrouter__V1__SelectResponse m = KVROUTER__V1__SELECT_RESPONSE__INIT;
    char text[KVR_ERROR_TEXT_MAX + 1];
    Kvrouter__V1__Candidate *cand = NULL;
    m.router_id = (char *)(router_id ? router_id : "");
    m.error_code = (Kvrouter__V1__ErrorCode)error;
    m.error = error == KVR_OK ? "" : kvr_codec_error_text(text, sizeof text, error, detail);
    kvr_status st = KVR_OK;
    if (error == KVR_OK && d) {
        m.worker_id = d->worker_id;
        m.overlap_blocks = d->overlap_blocks;
        m.cost = d->cost;
        m.request_key = key;
        m.policy = (char *)kvr_policy_name(d->policy);
        st = fill_candidates(&m, d, &cand);
    }
    if (st == KVR_OK)
        st = kvr_codec_pack(b, &m.base);
    free(cand);
    free(m.candidates);
    return st;
}

kvr_status kvr_wire_decode_select_response(const void *buf, size_t len, uint64_t *worker_id,
                                           uint32_t *overlap, uint32_t *ncandidates,
                                           uint32_t *error_code, uint64_t *key)
{
    struct kvr_codec_alloc a;
    kvr_status why;
    const struct kvr_codec_caps caps = {KVR_WIRE_SELECT_RESPONSE_MAX, SELECT_RESPONSE_CANDIDATES, 0,
                                        KVR_WIRE_CANDIDATES_MAX};
    Kvrouter__V1__SelectResponse *m = kvr_codec_unpack_capped(
        &a, &kvrouter__v1__select_response__descriptor, buf, len, &caps, &why);
    if (!m)
        return why;
    *worker_id = m->worker_id;
    *overlap = m->overlap_blocks;
    *ncandidates = (uint32_t)m->n_candidates;
    *error_code = m->error_code;
    *key = m->request_key;
    kvrouter__v1__select_response__free_unpacked(m, &a.pc);
    return KVR_OK;
}
