/*
 * The routers' own figures for a run.
 */
#include "routers.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "fleet.h"

struct poll_ctx {
    struct kvr_routers_poll *out;
    const char *prefix, *ns;
};

/* A counter: an integer, or the decimal string a router writes past 2^53; 0 otherwise. */
static uint64_t u64_val(const json_t *v)
{
    if (json_is_integer(v))
        return json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) : 0;
    const char *s = json_string_value(v);
    return s ? strtoull(s, NULL, 10) : 0;
}

static uint64_t u64_of(const json_t *o, const char *key)
{
    return u64_val(json_object_get(o, key));
}

/* o's string member key into buf ("" when there is none). */
static void str_of(const json_t *o, const char *key, char *buf, size_t len)
{
    const char *s = json_string_value(json_object_get(o, key));
    snprintf(buf, len, "%s", s ? s : "");
}

/* The kvr_status named name ("ERR_TIMEOUT"), 0 when this kvbench does not know it. */
static int code_of(const char *name)
{
    for (int c = 1; c < KVR_REPLY_CODES; c++)
        if (!strcmp(kvr_status_name((kvr_status)c) + 4, name))
            return c;
    return 0;
}

/* Whether the answer's metadata places it in another fleet than ours. */
static bool elsewhere(const json_t *root, const struct poll_ctx *p)
{
    const json_t *meta = json_object_get(root, "metadata");
    const char *ns = json_string_value(json_object_get(meta, "namespace"));
    const char *prefix = json_string_value(json_object_get(meta, "prefix"));
    return (ns && strcmp(ns, p->ns)) || (prefix && strcmp(prefix, p->prefix));
}

/* The figures of answer root into r (zeroed). */
static void read_answer(const json_t *root, struct kvr_router_fig *r)
{
    str_of(root, "id", r->id, sizeof r->id);
    str_of(root, "started", r->started, sizeof r->started);
    const json_t *eps = json_object_get(root, "endpoints");
    for (size_t i = 0; i < json_array_size(eps); i++) {
        json_t *ep = json_array_get(eps, i), *data = json_object_get(ep, "data"), *n;
        const char *name;
        json_object_foreach(json_object_get(ep, "errors_by_code"), name, n)
        {
            r->errors[code_of(name)] += u64_val(n);
        }
        if (!json_is_object(data))
            continue;
        /* decisions made there ("decisions" counts its peers' too, imported) */
        const json_t *rep = json_object_get(data, "replication");
        r->decisions += u64_of(rep ? rep : data, rep ? "decided" : "decisions");
        r->cpu_seconds += json_number_value(json_object_get(data, "cpu_seconds"));
        r->gossip_bytes += u64_of(rep, "gossip_bytes");
        r->gaps += u64_of(rep, "gaps");
        r->repaired += u64_of(rep, "repaired");
    }
}

/* Whether out already holds an answer of the router (id, started) that root names. */
static bool heard(const struct kvr_routers_poll *out, const json_t *root)
{
    struct kvr_router_fig a;
    str_of(root, "id", a.id, sizeof a.id);
    str_of(root, "started", a.started, sizeof a.started);
    for (uint32_t i = 0; i < out->n; i++)
        if (!strcmp(out->r[i].id, a.id) && !strcmp(out->r[i].started, a.started))
            return true;
    return false;
}

/* An answer: read, or counted in ignored when it is malformed, past KVR_ROUTERS_MAX, or a second
 * one of a router already heard (the same id and start: one process answering twice, or two that
 * cannot be told apart; counting it would add its figures twice). */
static void on_answer(void *ctx, const char *data, size_t len)
{
    struct poll_ctx *p = ctx;
    struct kvr_routers_poll *out = p->out;
    json_t *root = json_loadb(data, len, 0, NULL);
    bool bad = !json_is_object(root) || !json_string_value(json_object_get(root, "id")) ||
               out->n == KVR_ROUTERS_MAX;
    if (bad || (!elsewhere(root, p) && heard(out, root)))
        out->ignored++;
    else if (!elsewhere(root, p))
        read_answer(root, memset(&out->r[out->n++], 0, sizeof out->r[0]));
    json_decref(root);
}

void kvr_routers_poll(struct kvr_client *c, const char *prefix, const char *ns,
                      struct kvr_routers_poll *out)
{
    struct poll_ctx p = {out, prefix, ns};
    char inbox[192];
    out->n = out->ignored = 0;
    if (kvr_client_ask_inbox(c, inbox, sizeof inbox))
        kvr_fleet_srv_stats(c->nc_pub, c->nc_sub, inbox, KVR_ROUTERS_WAIT_NS, on_answer, &p);
}

/* Whether a's counters can follow b's (same router, no counter went back). */
static bool follows(const struct kvr_router_fig *a, const struct kvr_router_fig *b)
{
    if (a->decisions < b->decisions || a->gossip_bytes < b->gossip_bytes ||
        a->cpu_seconds < b->cpu_seconds || a->gaps < b->gaps || a->repaired < b->repaired)
        return false;
    for (int c = 0; c < KVR_REPLY_CODES; c++)
        if (a->errors[c] < b->errors[c])
            return false;
    return true;
}

/* The answer of the router a is, in before, if it is the same process; NULL otherwise. */
static const struct kvr_router_fig *earlier(const struct kvr_routers_poll *before,
                                            const struct kvr_router_fig *a)
{
    for (uint32_t i = 0; i < before->n; i++) {
        const struct kvr_router_fig *b = &before->r[i];
        if (!strcmp(a->id, b->id) && !strcmp(a->started, b->started))
            return follows(a, b) ? b : NULL;
    }
    return NULL;
}

void kvr_routers_diff(const struct kvr_routers_poll *before, const struct kvr_routers_poll *after,
                      struct kvr_routers_run *out)
{
    static const struct kvr_router_fig zero;
    memset(out, 0, sizeof *out);
    out->answered = after->n;
    out->before = before->n;
    for (uint32_t i = 0; i < after->n; i++) {
        const struct kvr_router_fig *a = &after->r[i], *b = earlier(before, a);
        if (!b) {
            b = &zero;
            out->fresh++;
        }
        out->decisions += a->decisions - b->decisions;
        out->gossip_bytes += a->gossip_bytes - b->gossip_bytes;
        out->gaps += a->gaps - b->gaps;
        out->repaired += a->repaired - b->repaired;
        out->cpu_seconds += a->cpu_seconds - b->cpu_seconds;
        for (int c = 0; c < KVR_REPLY_CODES; c++)
            out->errors[c] += a->errors[c] - b->errors[c];
    }
}

const char *kvr_routers_errors(const struct kvr_routers_run *r, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = 0;
    for (int c = 1; c <= KVR_REPLY_CODES; c++) {
        int k = c % KVR_REPLY_CODES; /* the unknown codes ([0]) last */
        if (!r->errors[k] || at >= len)
            continue;
        int n = snprintf(buf + at, len - at, "%s%s:%" PRIu64, at ? "," : "",
                         k ? kvr_status_name((kvr_status)k) + 4 : "other", r->errors[k]);
        at += n > 0 ? (size_t)n : 0;
    }
    if (!buf[0])
        snprintf(buf, len, "none");
    return buf;
}

const char *kvr_routers_bytes(uint64_t bytes, char *buf, size_t len)
{
    static const char *const unit[] = {"kB", "MB", "GB", "TB"};
    if (bytes < 1000) {
        snprintf(buf, len, "%" PRIu64 " B", bytes);
        return buf;
    }
    double v = (double)bytes / 1000;
    int u = 0;
    while (v >= 999.95 && u < 3) {
        v /= 1000;
        u++;
    }
    snprintf(buf, len, "%.1f %s", v, unit[u]);
    return buf;
}

/* The routers that answered before the run and not after it (or, restarted or with counters gone
 * back, not as the same process): every answer after it matched at most one before it. */
static uint32_t gone_of(const struct kvr_routers_run *r)
{
    uint32_t same = r->answered - r->fresh;
    return r->before > same ? r->before - same : 0;
}

const char *kvr_routers_format(const struct kvr_routers_run *r, char *buf, size_t len)
{
    char errs[512], bytes[32], notes[128] = "";
    if (!r->answered) {
        snprintf(buf, len, "none answered $SRV.STATS.kvrouter");
        return buf;
    }
    uint32_t gone = gone_of(r);
    if (r->fresh || gone)
        snprintf(notes, sizeof notes,
                 " (%u before the run, %u of them not heard after it; %u counted from start)",
                 r->before, gone, r->fresh);
    snprintf(buf, len,
             "%u answered%s  decisions=%" PRIu64 " errors=%s cpu_s=%.2f gossip_bytes=%s"
             " gossip_gaps=%" PRIu64 " repaired=%" PRIu64,
             r->answered, notes, r->decisions, kvr_routers_errors(r, errs, sizeof errs),
             r->cpu_seconds, kvr_routers_bytes(r->gossip_bytes, bytes, sizeof bytes), r->gaps,
             r->repaired);
    return buf;
}

void kvr_routers_json(FILE *f, const struct kvr_routers_run *r)
{
    fprintf(f,
            "\"routers_answered\": %u, \"routers_before\": %u, \"routers_from_start\": %u, "
            "\"decisions\": %" PRIu64 ", \"cpu_seconds\": %.6f, \"gossip_bytes\": %" PRIu64
            ", \"gossip_gaps\": %" PRIu64 ", \"gossip_repaired\": %" PRIu64 ", \"errors\": {",
            r->answered, r->before, r->fresh, r->decisions, r->cpu_seconds, r->gossip_bytes,
            r->gaps, r->repaired);
    for (int c = 1, any = 0; c <= KVR_REPLY_CODES; c++) {
        int k = c % KVR_REPLY_CODES;
        if (r->errors[k])
            fprintf(f, "%s\"%s\": %" PRIu64, any++ ? ", " : "",
                    k ? kvr_status_name((kvr_status)k) + 4 : "other", r->errors[k]);
    }
    fprintf(f, "}");
}
