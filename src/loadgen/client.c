/*
 * kvr_client implementation.
 */
#include "client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "codec.h"
#include "grow.h"
#include "kvr/hash.h"

/* What the inbox subscriptions may hold undelivered: past it nats.c drops what comes (counted,
 * kvr_contract.dropped), so a flood on the inbox cannot grow kvbench's memory without bound. */
#define KVR_CLIENT_PENDING_BYTES (512 << 20)

/* decide()'s status for a stream given up with holes: KVR_ERR_INTERRUPTED, its holes counted. */
#define KVR_INTERRUPTED_PENDING UINT32_MAX

/* Under mu: wait on cv for at most ns. */
static void timed_wait(struct kvr_client *c, uint64_t ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the cv's clock: a wall clock's step stalls no wait */
    uint64_t t = (uint64_t)ts.tv_nsec + ns;
    ts.tv_sec += (time_t)(t / KVR_NS_PER_S);
    ts.tv_nsec = (long)(t % KVR_NS_PER_S);
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
}

/* Under mu: a gap of ms in request q's stream. */
static void add_gap(struct kvr_client *c, const struct kvr_client_req *q, double ms)
{
    uint32_t n = c->ngaps;
    if (n == UINT32_MAX || !KVR_GROW(c->gaps, c->capgaps, n + 1, 1024) ||
        !KVR_GROW(c->gap_req, c->capgap_req, n + 1, 1024)) {
        c->gaps_dropped++;
        return;
    }
    c->gaps[n] = ms;
    c->gap_req[n] = (uint32_t)(q - c->reqs);
    c->ngaps++;
}

/* Under mu: the positions below end that q holds from its stream's worker. */
static uint32_t held(const struct kvr_client_req *q, uint32_t end)
{
    uint32_t n = q->have < end ? q->have : end;
    for (uint32_t k = 0; k < q->nheld && q->held[k][0] < end; k++)
        n += (q->held[k][1] < end ? q->held[k][1] : end) - q->held[k][0];
    return n;
}

/* Under mu: [a, b) held above q->have, merged into the sorted ranges. */
static void hold(struct kvr_client_req *q, uint32_t a, uint32_t b)
{
    uint32_t k = 0;
    while (k < q->nheld && q->held[k][1] < a)
        k++;
    if (k < q->nheld && q->held[k][0] <= b) { /* overlaps or touches range k: widen it */
        q->held[k][0] = a < q->held[k][0] ? a : q->held[k][0];
        q->held[k][1] = b > q->held[k][1] ? b : q->held[k][1];
        while (k + 1 < q->nheld && q->held[k + 1][0] <= q->held[k][1]) { /* and swallow */
            q->held[k][1] = q->held[k + 1][1] > q->held[k][1] ? q->held[k + 1][1] : q->held[k][1];
            memmove(q->held[k + 1], q->held[k + 2], (q->nheld - k - 2) * sizeof q->held[0]);
            q->nheld--;
        }
        return;
    }
    if (q->nheld == KVR_CLIENT_HOLES)
        return; /* no room: those positions count as missing, unless a repeat covers them */
    memmove(q->held[k + 1], q->held[k], (q->nheld - k) * sizeof q->held[0]);
    q->held[k][0] = a;
    q->held[k][1] = b;
    q->nheld++;
}

/* Where chunk r's tokens end: position + tokens (a position too large for that: the last one). */
static uint32_t end_of(const struct kvr_wire_response *r)
{
    return r->position > UINT32_MAX - r->ntokens ? UINT32_MAX : r->position + r->ntokens;
}

/*
 * Under mu: chunk r of the stream's own worker, kept by position (docs/protocol.md): what it
 * covers anew is added, a chunk above what is held waits for its hole to fill. The new tokens.
 */
static uint32_t take(struct kvr_client_req *q, const struct kvr_wire_response *r, uint64_t now)
{
    uint32_t a = r->position, b = end_of(r), before = held(q, UINT32_MAX);
    q->max_end = b > q->max_end ? b : q->max_end;
    if (a > q->have) {
        q->gap = true;
        if (b > a)
            hold(q, a, b);
    } else if (b > q->have) {
        q->have = b;
    }
    while (q->nheld && q->held[0][0] <= q->have) { /* a hole filled */
        q->have = q->held[0][1] > q->have ? q->held[0][1] : q->have;
        memmove(q->held[0], q->held[1], (q->nheld - 1) * sizeof q->held[0]);
        q->nheld--;
    }
    if (q->max_end <= q->have)
        q->t_hole = 0;
    else if (!q->t_hole)
        q->t_hole = now ? now : 1;
    return held(q, UINT32_MAX) - before;
}

/* Under mu: what the answer keeps of a chunk adding fresh tokens (or, text alone, text: a
 * stream without token ids) at now, until it is decided. The first token is position 0's (or
 * the text's): tokens held above a hole before it are not a first token a client could show. */
static void keep(struct kvr_client *c, struct kvr_client_req *q, const struct kvr_wire_response *r,
                 uint32_t fresh, bool text, uint64_t now)
{
    if (fresh || text) {
        if (!q->t_first && (q->have || text))
            q->t_first = now;
        else if (q->t_first)
            add_gap(c, q, (double)(now - q->t_last) / 1e6);
        q->t_last = now;
        q->ntok += fresh;
        if (c->wake_tokens && q->ntok >= c->wake_tokens && q->ntok - fresh < c->wake_tokens)
            pthread_cond_broadcast(&c->cv);
    }
    if (r->cached_tokens)
        q->cached = r->cached_tokens;
}

/* Under mu: final chunk r (own: of the stream's worker) at now; the first, a repeat or another. */
static void final_seen(struct kvr_client_req *q, const struct kvr_wire_response *r, bool own,
                       uint64_t now)
{
    uint32_t end = end_of(r);
    q->finals++;
    if (!q->t_end) {
        q->t_end = now;
        q->final_worker = r->worker_id;
        q->final_end = own ? end : 0;
        q->final_code = r->error_code;
        q->stopped = own && r->error_code == KVR_OK && !strcmp(r->finish_reason, "stop");
    } else if (own && r->worker_id == q->final_worker && r->position == 0 && end == q->final_end &&
               r->error_code == q->final_code) {
        q->repeat_finals++; /* a repeat after a cut connection: one chunk from 0, final again */
    } else {
        q->late_error = r->error_code;
    }
    q->failed_final |= r->error_code != KVR_OK;
}

/*
 * Under mu: q is decided at now with status st (own: by its stream's worker, whose tokens are
 * then checked against max_tokens); in closed loop the request to send next.
 */
static int64_t decide(struct kvr_client *c, struct kvr_client_req *q, uint32_t st, bool own,
                      uint64_t now)
{
    uint32_t got = q->final_end;
    if (st == KVR_INTERRUPTED_PENDING) {
        q->missing += got - held(q, got); /* what the holes left out */
        st = KVR_ERR_INTERRUPTED;
    }
    bool whole = q->stopped || (got == 0 && q->text_only); /* its total need not be max_tokens */
    if (st == KVR_OK && own && q->expect && got < q->expect && !whole) {
        q->missing += q->expect - got; /* "length", short of max_tokens */
        st = KVR_ERR_INTERRUPTED;
    }
    q->done = true;
    q->error = st;
    q->t_final = now;
    if (!q->t_last)
        q->t_last = now;
    c->ndone++;
    pthread_cond_broadcast(&c->cv);
    return c->closed && c->next < c->n ? (int64_t)c->next++ : -1;
}

/* The later of two times. */
static uint64_t later(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

/* How long ago t was at now; 0 when t is later (a chunk recorded while mu was let go, after now
 * was read). */
static uint64_t ago(uint64_t now, uint64_t t)
{
    return now > t ? now - t : 0;
}

/* Under mu: q's stream, ended 2 s ago with positions still missing, is decided interrupted. */
static int64_t expire(struct kvr_client *c, struct kvr_client_req *q, uint64_t now)
{
    if (q->done || !q->t_end || ago(now, q->t_end) < 2 * KVR_NS_PER_S)
        return -1;
    return decide(c, q, KVR_INTERRUPTED_PENDING, true, now);
}

/*
 * Under mu: chunk r of request q, received at now, checked against the contract (client.h);
 * in closed loop the request to send next.
 */
static int64_t record(struct kvr_client *c, struct kvr_client_req *q,
                      const struct kvr_wire_response *r, uint64_t now)
{
    q->heard = true;
    if (q->t_cancel && !r->final)
        q->after_cancel++;
    uint64_t w = r->worker_id;
    if (w && !q->worker)
        q->worker = w;
    bool own = !w || w == q->worker;
    uint32_t fresh = 0;
    bool text = false; /* text alone at position 0: progress of a stream without token ids */
    if (own) {
        fresh = take(q, r, now);
        text = r->ntext && !r->ntokens && !r->position && !q->have;
        q->text_only |= text;
    } else { /* a second stream: its tokens are never part of the answer */
        q->worker2 = w;
        q->tokens2 += r->ntokens;
    }
    if (fresh && q->failed_final)
        q->spurious = true;
    if (r->final)
        final_seen(q, r, own, now);
    if (q->done)
        return -1;
    keep(c, q, r, fresh, text, now);
    if (r->final && !own) /* a second worker's final decides, as for a client trusting it */
        return decide(c, q, r->error_code, false, now);
    bool complete = q->t_end && q->have >= q->final_end;
    return complete ? decide(c, q, q->final_code, true, now) : -1;
}

/* The i of "<inbox>.<batch>.<i>" when batch is this one's and i a record; else UINT32_MAX. */
static uint32_t index_of(const struct kvr_client *c, const char *subject)
{
    size_t k = strlen(c->inbox);
    if (strncmp(subject, c->inbox, k) || subject[k] != '.')
        return UINT32_MAX;
    char *end = NULL;
    unsigned long b = strtoul(subject + k + 1, &end, 10);
    if (*end != '.' || b != c->batch)
        return UINT32_MAX;
    unsigned long i = strtoul(end + 1, NULL, 10);
    return i < c->n ? (uint32_t)i : UINT32_MAX;
}

/* Responses for "<inbox>.<batch>.<i>", on nats.c's delivery thread. */
static void on_chunk(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc;
    (void)sub;
    struct kvr_client *c = ctx;
    uint64_t now = kvr_now_ns();
    struct kvr_wire_response r;
    bool noresp = natsMsg_IsNoResponders(msg);
    kvr_status st = KVR_OK;
    if (noresp) /* not a GenerateResponse: NATS's own "no responders", no router listened */
        r = (struct kvr_wire_response){.final = true, .error_code = KVR_ERR_NOT_DELIVERED};
    else
        st = kvr_wire_decode_response(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), &r);
    int64_t next = -1;
    pthread_mutex_lock(&c->mu);
    uint32_t i = index_of(c, natsMsg_GetSubject(msg));
    if (st != KVR_OK)
        c->bad_chunks++;
    else if (i != UINT32_MAX && c->reqs[i].sent) {
        c->reqs[i].no_responders |= noresp;
        next = record(c, &c->reqs[i], &r, now);
    }
    pthread_mutex_unlock(&c->mu);
    natsMsg_Destroy(msg);
    if (st == KVR_OK && !noresp)
        kvr_wire_response_free(&r);
    if (next >= 0)
        kvr_client_send(c, (uint32_t)next);
}

static void on_asked(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc, (void)sub, (void)ctx;
    natsMsg_Destroy(msg); /* the ask's own subscription has its copy */
}

/*
 * The client's subscriptions, made before anything is sent: in a cluster, interest in a
 * subscription made just before its request can reach the other nodes after a fast answer from
 * one of them does, which they then drop (docs/protocol.md). So the chunks come on one wildcard
 * made here, and the asks' per-call subscriptions (digests, stats) sit under a second one, whose
 * copies are dropped.
 */
static kvr_status subscribe(struct kvr_client *c)
{
    char wild[sizeof c->inbox + 2], asked[sizeof c->ask_prefix + 2];
    snprintf(wild, sizeof wild, "%s.>", c->inbox);
    snprintf(asked, sizeof asked, "%s.>", c->ask_prefix);
    natsStatus s = natsConnection_Subscribe(&c->sub, c->nc_sub, wild, on_chunk, c);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(c->sub, -1, KVR_CLIENT_PENDING_BYTES);
    if (s == NATS_OK)
        s = natsConnection_Subscribe(&c->ask_hold, c->nc_sub, asked, on_asked, c);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(c->ask_hold, -1, KVR_CLIENT_PENDING_BYTES);
    if (s == NATS_OK)
        s = natsConnection_Flush(c->nc_sub);
    return kvr_nats_status(s);
}

/* Messages of the inbox subscription nats.c dropped since it was made (its pending bound). */
static uint64_t inbox_dropped(const struct kvr_client *c)
{
    int64_t n = 0;
    return c->sub && natsSubscription_GetDropped(c->sub, &n) == NATS_OK && n > 0 ? (uint64_t)n : 0;
}

/* "<prefix>.<nuid>" into buf. */
static kvr_status new_inbox(const char *prefix, char *buf, size_t len)
{
    natsInbox *inbox = NULL;
    kvr_status s = kvr_nats_status(natsInbox_Create(&inbox));
    if (s == KVR_OK && (size_t)snprintf(buf, len, "%s.%s", prefix, inbox + 7) >= len)
        s = KVR_ERR_INVALID; /* inbox + 7: the nuid, after "_INBOX." */
    natsInbox_Destroy(inbox);
    return s;
}

struct kvr_client *kvr_client_create(const struct kvr_nats_config *net, kvr_status *st)
{
    const char *prefix = net->prefix, *ns = net->ns;
    struct kvr_client *c = calloc(1, sizeof *c);
    if (!c) {
        *st = KVR_ERR_NOMEM;
        return NULL;
    }
    pthread_mutex_init(&c->send_mu, NULL);
    pthread_mutex_init(&c->mu, NULL);
    kvr_cond_init_monotonic(&c->cv);
    kvr_status s = kvr_subject(c->subj_gen, sizeof c->subj_gen, prefix, ns, "generate") &&
                           kvr_subject(c->subj_cancel, sizeof c->subj_cancel, prefix, ns, "cancel")
                       ? KVR_OK
                       : KVR_ERR_INVALID;
    if (s == KVR_OK)
        s = new_inbox(net->inbox_prefix[0] ? net->inbox_prefix : "_INBOX", c->ask_prefix,
                      sizeof c->ask_prefix);
    if (s == KVR_OK)
        s = new_inbox(net->inbox_prefix[0] ? net->inbox_prefix : "_KVB", c->inbox, sizeof c->inbox);
    if (s == KVR_OK)
        s = kvr_connect(net, "kvbench", &c->nc_pub);
    if (s == KVR_OK)
        s = kvr_connect(net, "kvbench-inbox", &c->nc_sub);
    if (s == KVR_OK)
        s = subscribe(c);
    *st = s;
    if (s != KVR_OK) {
        kvr_client_destroy(c);
        return NULL;
    }
    return c;
}

bool kvr_client_ask_inbox(const struct kvr_client *c, char *buf, size_t len)
{
    return new_inbox(c->ask_prefix, buf, len) == KVR_OK;
}

void kvr_client_unsubscribe(natsSubscription *sub)
{
    if (!sub)
        return;
    if (natsSubscription_DrainTimeout(sub, 1000) != NATS_OK ||
        natsSubscription_WaitForDrainCompletion(sub, 2000) != NATS_OK)
        natsSubscription_Unsubscribe(sub);
    natsSubscription_Destroy(sub);
}

void kvr_client_destroy(struct kvr_client *c)
{
    if (!c)
        return;
    kvr_client_unsubscribe(c->sub);
    natsSubscription_Destroy(c->ask_hold);
    kvr_conn_destroy(c->nc_pub);
    kvr_conn_destroy(c->nc_sub);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->send_mu);
    free(c->reqs);
    free(c->gaps);
    free(c->gap_req);
    kvr_buf_free(&c->buf);
    free(c);
}

void kvr_client_shutdown(void)
{
    nats_CloseAndWait(5000); /* its threads ended before exit (kvr_net_shutdown) */
}

kvr_status kvr_client_begin(struct kvr_client *c, uint32_t n, bool closed,
                            kvr_client_encode_fn encode, void *ctx, uint64_t gaps_hint)
{
    pthread_mutex_lock(&c->send_mu);
    c->encode = encode;
    c->encode_ctx = ctx;
    pthread_mutex_unlock(&c->send_mu);
    uint64_t dropped = inbox_dropped(c); /* not under mu: nats.c takes the subscription's lock */
    pthread_mutex_lock(&c->mu);
    kvr_status st = KVR_OK;
    uint32_t hint = gaps_hint < UINT32_MAX ? (uint32_t)gaps_hint : UINT32_MAX;
    if (!KVR_GROW(c->reqs, c->cap, n, 64) || !KVR_GROW(c->gaps, c->capgaps, hint, 1024) ||
        !KVR_GROW(c->gap_req, c->capgap_req, hint, 1024)) {
        st = KVR_ERR_NOMEM;
        n = 0;
    }
    if (n)
        memset(c->reqs, 0, (size_t)n * sizeof *c->reqs);
    c->n = n;
    c->batch++;
    c->next = c->ndone = c->ngaps = c->wake_tokens = 0;
    c->bad_chunks = 0;
    c->gaps_dropped = 0;
    c->dropped_before = dropped;
    c->closed = closed;
    pthread_mutex_unlock(&c->mu);
    return st;
}

void kvr_client_end(struct kvr_client *c)
{
    pthread_mutex_lock(&c->send_mu);
    c->encode = NULL;
    c->encode_ctx = NULL;
    pthread_mutex_unlock(&c->send_mu);
    pthread_mutex_lock(&c->mu);
    c->n = 0;
    c->closed = false;
    pthread_mutex_unlock(&c->mu);
}

/* Under mu: request i's reply subject in this batch. */
static void reply_of(const struct kvr_client *c, uint32_t i, char *buf, size_t len)
{
    snprintf(buf, len, "%.159s.%u.%u", c->inbox, c->batch, i); /* 181 bytes at most */
}

const char *kvr_client_reply(struct kvr_client *c, uint32_t i, char *buf, size_t len)
{
    pthread_mutex_lock(&c->mu);
    reply_of(c, i, buf, len);
    pthread_mutex_unlock(&c->mu);
    return buf;
}

uint64_t kvr_client_key(struct kvr_client *c, uint32_t i, const char *request_id)
{
    char bytes[512]; /* "<reply>\0<id>": a reply of ours is under 192 bytes, ids under 256 */
    kvr_client_reply(c, i, bytes, 192);
    size_t a = strlen(bytes), b = strnlen(request_id, sizeof bytes - a - 1);
    memcpy(bytes + a + 1, request_id, b);
    uint64_t k = kvr_hash_bytes(bytes, a + 1 + b);
    return k ? k : 1;
}

void kvr_client_publish(struct kvr_client *c, uint32_t i, const char *subject, const void *data,
                        size_t len, uint32_t max_tokens)
{
    char reply[192];
    pthread_mutex_lock(&c->mu);
    reply_of(c, i, reply, sizeof reply);
    if (i < c->n)
        c->reqs[i] =
            (struct kvr_client_req){.t_send = kvr_now_ns(), .expect = max_tokens, .sent = true};
    pthread_mutex_unlock(&c->mu);
    natsConnection_PublishRequest(c->nc_pub, subject, reply, data, (int)len);
}

void kvr_client_send(struct kvr_client *c, uint32_t i)
{
    pthread_mutex_lock(&c->send_mu);
    uint32_t max_tokens = 0;
    if (c->encode && c->encode(c->encode_ctx, i, &c->buf, &max_tokens))
        kvr_client_publish(c, i, c->subj_gen, c->buf.data, c->buf.len, max_tokens);
    pthread_mutex_unlock(&c->send_mu);
}

void kvr_client_start_closed(struct kvr_client *c, uint32_t clients)
{
    pthread_mutex_lock(&c->mu);
    uint32_t first = clients < c->n ? clients : c->n;
    c->next = first;
    pthread_mutex_unlock(&c->mu);
    for (uint32_t i = 0; i < first; i++)
        kvr_client_send(c, i);
}

void kvr_client_resend(struct kvr_client *c, uint32_t i)
{
    char reply[192];
    pthread_mutex_lock(&c->send_mu);
    uint32_t max_tokens = 0;
    if (c->encode && c->encode(c->encode_ctx, i, &c->buf, &max_tokens)) {
        pthread_mutex_lock(&c->mu);
        reply_of(c, i, reply, sizeof reply);
        if (i < c->n) {
            c->reqs[i].t_resent = kvr_now_ns();
            c->reqs[i].resends++;
        }
        pthread_mutex_unlock(&c->mu);
        natsConnection_PublishRequest(c->nc_pub, c->subj_gen, reply, c->buf.data, (int)c->buf.len);
    }
    pthread_mutex_unlock(&c->send_mu);
}

void kvr_client_cancel(struct kvr_client *c, uint32_t i, const char *request_id)
{
    char reply[192];
    struct kvr_buf b = {0};
    pthread_mutex_lock(&c->mu);
    reply_of(c, i, reply, sizeof reply);
    pthread_mutex_unlock(&c->mu);
    if (kvr_wire_encode_cancel(&b, request_id, reply) == KVR_OK) {
        pthread_mutex_lock(&c->mu);
        if (i < c->n && !c->reqs[i].t_cancel)
            c->reqs[i].t_cancel = kvr_now_ns();
        pthread_mutex_unlock(&c->mu);
        natsConnection_Publish(c->nc_pub, c->subj_cancel, b.data, (int)b.len);
    }
    kvr_buf_free(&b);
}

/* Under mu: whether q, not decided, has stalled at now (docs/protocol.md, "Resending"). */
static bool stalled(const struct kvr_client_req *q, uint64_t resend_ns, uint64_t now)
{
    uint64_t since = later(q->t_send, q->t_resent);
    if (!q->heard) /* nothing at all: its router may have died with it, or it was lost whole */
        return ago(now, since) >= resend_ns;
    if (q->t_hole) /* positions missing: wait half as long, so the repeat beats the final's 2 s */
        return ago(now, later(since, q->t_hole)) >= resend_ns / 2;
    return !q->t_end && ago(now, later(since, q->t_last)) >= resend_ns; /* silent short of end */
}

/*
 * Under mu: what a client of a router fleet does when its stream stalls for resend_ns (nothing
 * came: its router may have died with the request, or the stream was lost; nothing new came
 * before the final; positions stayed missing): send it again; a router that has it in flight
 * absorbs the resend and its worker repeats the stream so far. At most 3 times per request.
 * Returns the resends.
 */
static uint32_t resend_stalled(struct kvr_client *c, uint64_t resend_ns)
{
    uint64_t now = kvr_now_ns();
    uint32_t sent = 0;
    for (uint32_t i = 0; resend_ns && i < c->n; i++) {
        struct kvr_client_req *q = &c->reqs[i];
        if (!q->sent || q->done || q->resends >= 3 || !stalled(q, resend_ns, now))
            continue;
        sent++;
        pthread_mutex_unlock(&c->mu);
        kvr_client_resend(c, i);
        pthread_mutex_lock(&c->mu);
    }
    return sent;
}

/*
 * Under mu: request i (every request when i is UINT32_MAX) decided interrupted if its final chunk
 * is 2 s old with positions missing; in closed loop what that frees is sent (mu let go meanwhile).
 */
static void expire_some(struct kvr_client *c, uint32_t i)
{
    uint64_t now = kvr_now_ns();
    for (uint32_t k = i == UINT32_MAX ? 0 : i; k < c->n && (i == UINT32_MAX || k == i); k++) {
        int64_t next = expire(c, &c->reqs[k], now);
        if (next < 0)
            continue;
        pthread_mutex_unlock(&c->mu);
        kvr_client_send(c, (uint32_t)next);
        pthread_mutex_lock(&c->mu);
    }
}

uint32_t kvr_client_wait_all(struct kvr_client *c, uint64_t deadline_ns, uint64_t resend_ns)
{
    uint32_t resent = 0;
    pthread_mutex_lock(&c->mu);
    while (c->ndone < c->n && kvr_now_ns() < deadline_ns) {
        resent += resend_stalled(c, resend_ns);
        expire_some(c, UINT32_MAX);
        timed_wait(c, 100 * KVR_NS_PER_MS);
    }
    pthread_mutex_unlock(&c->mu);
    return resent;
}

uint64_t kvr_client_wait_one(struct kvr_client *c, uint32_t i, uint64_t deadline_ns)
{
    pthread_mutex_lock(&c->mu);
    while (i < c->n && !c->reqs[i].done && kvr_now_ns() < deadline_ns) {
        timed_wait(c, c->reqs[i].t_end ? 100 * KVR_NS_PER_MS : KVR_NS_PER_S);
        expire_some(c, i);
    }
    uint64_t dt = 0;
    if (i < c->n && c->reqs[i].done && !c->reqs[i].error)
        dt = c->reqs[i].t_last - c->reqs[i].t_send;
    pthread_mutex_unlock(&c->mu);
    return dt;
}

void kvr_client_wake_at(struct kvr_client *c, uint32_t tokens)
{
    pthread_mutex_lock(&c->mu);
    c->wake_tokens = tokens;
    pthread_mutex_unlock(&c->mu);
}

struct kvr_client_req kvr_client_wait_tokens(struct kvr_client *c, uint32_t i, uint64_t deadline_ns)
{
    struct kvr_client_req q = {0};
    pthread_mutex_lock(&c->mu);
    while (i < c->n && !c->reqs[i].done && c->reqs[i].ntok < c->wake_tokens &&
           kvr_now_ns() < deadline_ns) {
        timed_wait(c, 50 * KVR_NS_PER_MS);
        expire_some(c, i);
    }
    if (i < c->n)
        q = c->reqs[i];
    pthread_mutex_unlock(&c->mu);
    return q;
}

struct kvr_client_req kvr_client_get(struct kvr_client *c, uint32_t i)
{
    struct kvr_client_req q = {0};
    pthread_mutex_lock(&c->mu);
    expire_some(c, i);
    if (i < c->n)
        q = c->reqs[i];
    pthread_mutex_unlock(&c->mu);
    return q;
}

uint32_t kvr_client_done(struct kvr_client *c)
{
    pthread_mutex_lock(&c->mu);
    uint32_t n = c->ndone;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* Finals besides the first and its repeats. */
static uint32_t other_finals(const struct kvr_client_req *q)
{
    return q->finals > 1 + q->repeat_finals ? q->finals - 1 - q->repeat_finals : 0;
}

/* Tokens past max_tokens, or past the end its worker's own final chunk gave. */
static bool extra_tokens(const struct kvr_client_req *q)
{
    bool own_end = q->t_end && q->final_worker && q->final_worker == q->worker;
    return (q->expect && q->max_end > q->expect) || (own_end && q->max_end > q->final_end);
}

/* Positions missing from the answer, or still missing from a stream that ended. */
static bool missing_tokens(const struct kvr_client_req *q)
{
    return q->missing || (q->t_end && !q->done);
}

bool kvr_contract_broken(const struct kvr_client_req *q)
{
    return other_finals(q) || q->tokens2 || q->worker2 || q->spurious || missing_tokens(q) ||
           extra_tokens(q);
}

void kvr_contract_add(struct kvr_contract *k, const struct kvr_client_req *q)
{
    if (!q->sent)
        return;
    k->requests++;
    k->finished += q->done && !q->error;
    k->unanswered += !q->done;
    k->double_finals += other_finals(q) > 0;
    k->extra_finals += other_finals(q);
    k->repeat_finals += q->repeat_finals > 0;
    k->gaps_filled += q->gap && !missing_tokens(q);
    k->second_streams += q->tokens2 > 0;
    k->second_tokens += q->tokens2;
    k->two_workers += q->worker2 != 0;
    k->spurious_finals += q->spurious;
    k->missing_tokens += missing_tokens(q);
    k->extra_tokens += extra_tokens(q);
    k->no_responders += q->no_responders;
    if (q->done && q->error)
        k->errors[kvr_code_slot(q->error)]++;
    if (other_finals(q))
        k->late[kvr_code_slot(q->late_error)]++;
}

const char *kvr_contract_codes(const uint32_t by_code[KVR_CODE_SLOTS], char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = 0;
    for (uint32_t e = 0; e < KVR_CODE_SLOTS && at < len; e++) {
        if (!by_code[e])
            continue;
        if (e < KVR_CODE_SLOTS - 1)
            at += (size_t)snprintf(buf + at, len - at, "%s%u (%s) x%u", at ? ", " : "", e,
                                   kvr_status_str((kvr_status)e), by_code[e]);
        else /* the last slot counts every code from it on */
            at += (size_t)snprintf(buf + at, len - at, "%s%u or above (other) x%u", at ? ", " : "",
                                   e, by_code[e]);
    }
    if (!at)
        snprintf(buf, len, "none");
    return buf;
}

const char *kvr_contract_format(const struct kvr_contract *k, char *buf, size_t len)
{
    snprintf(buf, len,
             "double_finals=%u extra_finals=%u second_streams=%u second_stream_tokens=%llu "
             "spurious_finals=%u missing_tokens=%u extra_tokens=%u two_workers=%u "
             "no_responders=%u unanswered=%u malformed=%llu dropped=%llu (allowed: "
             "repeat_finals=%u gaps_filled=%u)",
             k->double_finals, k->extra_finals, k->second_streams,
             (unsigned long long)k->second_tokens, k->spurious_finals, k->missing_tokens,
             k->extra_tokens, k->two_workers, k->no_responders, k->unanswered,
             (unsigned long long)k->malformed, (unsigned long long)k->dropped, k->repeat_finals,
             k->gaps_filled);
    return buf;
}

void kvr_client_contract(struct kvr_client *c, uint32_t from, uint32_t to, struct kvr_contract *k)
{
    memset(k, 0, sizeof *k);
    uint64_t dropped = inbox_dropped(c);
    pthread_mutex_lock(&c->mu);
    k->malformed = c->bad_chunks;
    k->dropped = dropped > c->dropped_before ? dropped - c->dropped_before : 0;
    for (uint32_t i = from; i < to && i < c->n; i++)
        kvr_contract_add(k, &c->reqs[i]);
    pthread_mutex_unlock(&c->mu);
}

void kvr_client_prompt(uint32_t *tok, uint32_t n, uint64_t seed)
{
    uint64_t x = (seed * 0x9e3779b97f4a7c15ull) | 1; /* xorshift64*: any state but 0 */
    for (uint32_t t = 0; t < n; t++) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        tok[t] = (uint32_t)((x * 0x2545f4914f6cdd1dull) >> 33) % 32000u;
    }
}
