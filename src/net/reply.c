/*
 * kvr_reply implementation.
 */
#include "reply.h"

#include <inttypes.h>
#include <stdio.h>

#include "clock.h"
#include "codec.h"
#include "log.h"

void kvr_reply_init(struct kvr_reply *r, const char *endpoint, uint64_t worker_id)
{
    *r = (struct kvr_reply){.endpoint = endpoint, .worker_id = worker_id};
}

void kvr_reply_free(struct kvr_reply *r)
{
    kvr_buf_free(&r->buf);
}

void kvr_reply_count(struct kvr_reply *r, uint64_t elapsed_ns)
{
    r->requests++;
    r->processing_ns += elapsed_ns;
    kvr_prom_hist_observe(&r->latency, elapsed_ns);
}

bool kvr_log_gate_pass(struct kvr_log_gate *g, uint64_t *left)
{
    uint64_t now = kvr_now_ns();
    if (now - g->second_ns >= KVR_NS_PER_S) {
        g->second_ns = now;
        g->lines = 0;
    }
    if (g->lines >= KVR_REPLY_LOG_PER_S) {
        g->suppressed++;
        return false;
    }
    g->lines++;
    *left = g->suppressed;
    g->suppressed = 0;
    return true;
}

static void count_error(struct kvr_reply *r, kvr_status st, bool dropped, const char *request_id)
{
    r->errors++;
    r->dropped += dropped;
    r->by_code[(unsigned)st < KVR_REPLY_CODES ? (unsigned)st : KVR_ERR_INVALID]++;
    r->last = st;
    enum kvr_log_level level = dropped ? KVR_LOG_WARN : KVR_LOG_INFO;
    uint64_t n;
    if (!kvr_log_enabled(level) || !kvr_log_gate_pass(&r->log, &n))
        return;
    char id[128], left[40] = "";
    if (n)
        snprintf(left, sizeof left, " suppressed=%" PRIu64, n);
    kvr_log(level, dropped ? "request_dropped" : "request_refused",
            "endpoint=%s request=\"%s\" error=\"%s\" code=%d%s%s", r->endpoint,
            kvr_log_safe(id, sizeof id, request_id ? request_id : ""), kvr_status_str(st), (int)st,
            dropped ? " reason=\"no reply subject\"" : "", left);
}

void kvr_reply_fail(struct kvr_reply *r, struct kvr_outbox *out, const char *reply,
                    const char *request_id, kvr_status st, const struct kvr_reply_why *why)
{
    bool can = reply && *reply;
    count_error(r, st, !can, request_id);
    if (!can)
        return;
    struct kvr_wire_chunk c = {.request_id = request_id,
                               .final = true,
                               .error = st,
                               .worker_id = why && why->worker_id ? why->worker_id : r->worker_id,
                               .position = why ? why->position : 0,
                               .cached_tokens = why ? why->cached_tokens : 0,
                               .detail = why ? why->detail : NULL};
    if (kvr_wire_encode_chunk(&r->buf, &c) == KVR_OK)
        kvr_outbox_add(out, reply, r->buf.data, r->buf.len, st);
    else
        r->dropped++; /* out of memory: the client will resend */
}

void kvr_reply_refuse(struct kvr_reply *r, struct kvr_outbox *out, const char *reply,
                      const struct kvr_wire_request *q, kvr_status st)
{
    char detail[128];
    struct kvr_reply_why why = {.detail = kvr_wire_request_why(q, st, detail, sizeof detail)};
    kvr_reply_fail(r, out, reply, q->request_id, st, &why);
}

void kvr_reply_error(struct kvr_reply *r, struct kvr_outbox *out, const char *reply,
                     const char *request_id, kvr_status st)
{
    kvr_reply_fail(r, out, reply, request_id, st, NULL);
}

void kvr_reply_select(struct kvr_reply *r, struct kvr_outbox *out, const char *reply,
                      const struct kvr_decision *d, uint64_t key, kvr_status st, const char *detail)
{
    bool can = reply && *reply;
    if (st != KVR_OK)
        count_error(r, st, !can, NULL);
    if (!can)
        return;
    if (kvr_wire_encode_select_response(&r->buf, st == KVR_OK ? d : NULL, key, st, r->router_id,
                                        detail) == KVR_OK)
        kvr_outbox_add(out, reply, r->buf.data, r->buf.len, st);
    else
        r->dropped++;
}
