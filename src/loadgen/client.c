/*
 * kvr_client implementation.
 */
#include "client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec.h"
#include "grow.h"

/* Under mu: wait on cv for at most ns. */
static void timed_wait(struct kvr_client *c, uint64_t ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t t = (uint64_t)ts.tv_nsec + ns;
    ts.tv_sec += (time_t)(t / KVR_NS_PER_S);
    ts.tv_nsec = (long)(t % KVR_NS_PER_S);
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
}

/* Under mu. */
static void add_gap(struct kvr_client *c, double ms)
{
    if (c->ngaps == UINT32_MAX || !KVR_GROW(c->gaps, c->capgaps, c->ngaps + 1, 1024)) {
        c->gaps_dropped++;
        return;
    }
    c->gaps[c->ngaps++] = ms;
}

/* Under mu: chunk r of request q, received at now; in closed loop the request to send next. */
static int64_t record(struct kvr_client *c, struct kvr_client_req *q,
                      const struct kvr_wire_response *r, uint64_t now)
{
    q->heard = true;
    if (r->ntokens) {
        if (!q->t_first)
            q->t_first = now;
        else
            add_gap(c, (double)(now - q->t_last) / 1e6);
        q->t_last = now;
        q->ntok += r->ntokens;
    }
    if (r->worker_id)
        q->worker = r->worker_id;
    if (!r->final)
        return -1;
    q->done = true;
    q->error = r->error_code;
    q->cached = r->cached_tokens;
    if (!q->t_last)
        q->t_last = now;
    c->ndone++;
    pthread_cond_broadcast(&c->cv);
    return c->closed && c->next < c->n ? (int64_t)c->next++ : -1;
}

/* Responses for "<inbox>.<i>", on nats.c's delivery thread. */
static void on_chunk(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ctx)
{
    (void)nc;
    (void)sub;
    struct kvr_client *c = ctx;
    uint64_t now = kvr_now_ns();
    const char *dot = strrchr(natsMsg_GetSubject(msg), '.');
    uint32_t i = dot ? (uint32_t)strtoul(dot + 1, NULL, 10) : UINT32_MAX;
    struct kvr_wire_response r;
    kvr_status st =
        kvr_wire_decode_response(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), &r);
    natsMsg_Destroy(msg);
    int64_t next = -1;
    pthread_mutex_lock(&c->mu);
    if (st == KVR_OK && i < c->n && c->reqs[i].sent && !c->reqs[i].done)
        next = record(c, &c->reqs[i], &r, now);
    pthread_mutex_unlock(&c->mu);
    if (st == KVR_OK)
        kvr_wire_response_free(&r);
    if (next >= 0)
        kvr_client_send(c, (uint32_t)next);
}

static kvr_status subscribe(struct kvr_client *c)
{
    char wild[160];
    snprintf(wild, sizeof wild, "%s.*", c->inbox);
    natsStatus s = natsConnection_Subscribe(&c->sub, c->nc_sub, wild, on_chunk, c);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(c->sub, -1, -1);
    if (s == NATS_OK)
        s = natsConnection_Flush(c->nc_sub);
    return kvr_nats_status(s);
}

struct kvr_client *kvr_client_create(const char *urls, const char *prefix, const char *ns,
                                     kvr_status *st)
{
    struct kvr_client *c = calloc(1, sizeof *c);
    if (!c) {
        *st = KVR_ERR_NOMEM;
        return NULL;
    }
    pthread_mutex_init(&c->send_mu, NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    kvr_status s = kvr_subject(c->subj_gen, sizeof c->subj_gen, prefix, ns, "generate")
                       ? KVR_OK
                       : KVR_ERR_INVALID;
    natsInbox *inbox = NULL;
    if (s == KVR_OK)
        s = kvr_nats_status(natsInbox_Create(&inbox));
    if (s == KVR_OK)
        snprintf(c->inbox, sizeof c->inbox, "_KVB.%s", inbox + 7); /* after "_INBOX." */
    natsInbox_Destroy(inbox);
    if (s == KVR_OK)
        s = kvr_connect(urls, "kvbench", &c->nc_pub);
    if (s == KVR_OK)
        s = kvr_connect(urls, "kvbench-inbox", &c->nc_sub);
    if (s == KVR_OK)
        s = subscribe(c);
    *st = s;
    if (s != KVR_OK) {
        kvr_client_destroy(c);
        return NULL;
    }
    return c;
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
    natsConnection_Destroy(c->nc_pub);
    natsConnection_Destroy(c->nc_sub);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->send_mu);
    free(c->reqs);
    free(c->gaps);
    kvr_buf_free(&c->buf);
    free(c);
}

void kvr_client_shutdown(void)
{
    nats_Close();
}

kvr_status kvr_client_begin(struct kvr_client *c, uint32_t n, bool closed,
                            kvr_client_encode_fn encode, void *ctx, uint64_t gaps_hint)
{
    pthread_mutex_lock(&c->send_mu);
    c->encode = encode;
    c->encode_ctx = ctx;
    pthread_mutex_unlock(&c->send_mu);
    pthread_mutex_lock(&c->mu);
    kvr_status st = KVR_OK;
    uint32_t hint = gaps_hint < UINT32_MAX ? (uint32_t)gaps_hint : UINT32_MAX;
    if (!KVR_GROW(c->reqs, c->cap, n, 64) || !KVR_GROW(c->gaps, c->capgaps, hint, 1024)) {
        st = KVR_ERR_NOMEM;
        n = 0;
    }
    if (n)
        memset(c->reqs, 0, (size_t)n * sizeof *c->reqs);
    c->n = n;
    c->next = c->ndone = c->ngaps = 0;
    c->gaps_dropped = 0;
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

void kvr_client_publish(struct kvr_client *c, uint32_t i, const char *subject, const void *data,
                        size_t len)
{
    char reply[192];
    snprintf(reply, sizeof reply, "%s.%u", c->inbox, i);
    pthread_mutex_lock(&c->mu);
    if (i < c->n)
        c->reqs[i] = (struct kvr_client_req){.t_send = kvr_now_ns(), .sent = true};
    pthread_mutex_unlock(&c->mu);
    natsConnection_PublishRequest(c->nc_pub, subject, reply, data, (int)len);
}

void kvr_client_send(struct kvr_client *c, uint32_t i)
{
    pthread_mutex_lock(&c->send_mu);
    if (c->encode && c->encode(c->encode_ctx, i, &c->buf))
        kvr_client_publish(c, i, c->subj_gen, c->buf.data, c->buf.len);
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

/* Request i again, same reply subject and id; its record is left as it is. */
static void resend(struct kvr_client *c, uint32_t i)
{
    char reply[192];
    snprintf(reply, sizeof reply, "%s.%u", c->inbox, i);
    pthread_mutex_lock(&c->send_mu);
    if (c->encode && c->encode(c->encode_ctx, i, &c->buf))
        natsConnection_PublishRequest(c->nc_pub, c->subj_gen, reply, c->buf.data, (int)c->buf.len);
    pthread_mutex_unlock(&c->send_mu);
}

/*
 * Under mu: what a client of a router fleet does when nothing came back for resend_ns (its
 * router may have died with the request): send it again; a router that has it in flight absorbs
 * the resend. At most 3 times per request. Returns the resends.
 */
static uint32_t resend_silent(struct kvr_client *c, uint64_t resend_ns)
{
    uint64_t now = kvr_now_ns();
    uint32_t sent = 0;
    for (uint32_t i = 0; resend_ns && i < c->n; i++) {
        struct kvr_client_req *q = &c->reqs[i];
        uint64_t last = q->t_resent ? q->t_resent : q->t_send;
        if (!q->sent || q->heard || q->done || q->resends >= 3 || now - last < resend_ns)
            continue;
        q->t_resent = now;
        q->resends++;
        sent++;
        pthread_mutex_unlock(&c->mu);
        resend(c, i);
        pthread_mutex_lock(&c->mu);
    }
    return sent;
}

uint32_t kvr_client_wait_all(struct kvr_client *c, uint64_t deadline_ns, uint64_t resend_ns)
{
    uint32_t resent = 0;
    pthread_mutex_lock(&c->mu);
    while (c->ndone < c->n && kvr_now_ns() < deadline_ns) {
        resent += resend_silent(c, resend_ns);
        timed_wait(c, 100 * KVR_NS_PER_MS);
    }
    pthread_mutex_unlock(&c->mu);
    return resent;
}

uint64_t kvr_client_wait_one(struct kvr_client *c, uint32_t i, uint64_t deadline_ns)
{
    pthread_mutex_lock(&c->mu);
    while (i < c->n && !c->reqs[i].done && kvr_now_ns() < deadline_ns)
        timed_wait(c, KVR_NS_PER_S);
    uint64_t dt = 0;
    if (i < c->n && c->reqs[i].done && !c->reqs[i].error)
        dt = c->reqs[i].t_last - c->reqs[i].t_send;
    pthread_mutex_unlock(&c->mu);
    return dt;
}

uint32_t kvr_client_done(struct kvr_client *c)
{
    pthread_mutex_lock(&c->mu);
    uint32_t n = c->ndone;
    pthread_mutex_unlock(&c->mu);
    return n;
}
