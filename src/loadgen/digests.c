/*
 * kvbench --mode digest (the answers parsed with jansson) and --mode resend.
 */
#include "digests.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "fleet.h"
#include "kvr/hash.h"

#define DIGEST_HEX 16 /* the router writes its digest as 16 lower-case hex digits */

/* The "digest" of answer data[0..len) into out (DIGEST_HEX + 1 bytes); false, reported, if none. */
static bool digest_of(const char *data, size_t len, char *out)
{
    json_error_t err;
    json_t *root = json_loadb(data, len, 0, &err);
    const char *d = json_string_value(json_object_get(root, "digest"));
    bool ok = d && strlen(d) == DIGEST_HEX && strspn(d, "0123456789abcdef") == DIGEST_HEX;
    if (ok)
        memcpy(out, d, DIGEST_HEX + 1);
    else if (!root)
        fprintf(stderr, "kvbench: a malformed answer (%s at byte %d): counted as a disagreement\n",
                err.text, err.position);
    else
        fprintf(stderr,
                "kvbench: an answer without a %d-hex-digit \"digest\": counted as a "
                "disagreement\n",
                DIGEST_HEX);
    json_decref(root);
    return ok;
}

/* Subscribe to a new inbox on the client's connection and ask the routers; NULL on failure. */
static natsSubscription *ask(const struct kvr_bench_config *cfg, struct kvr_client *c)
{
    char subj[256], inbox[192];
    natsSubscription *sub = NULL;
    if (!kvr_subject(subj, sizeof subj, cfg->net.prefix, cfg->net.ns, "router.digest") ||
        !kvr_client_ask_inbox(c, inbox, sizeof inbox))
        return NULL;
    if (natsConnection_SubscribeSync(&sub, c->nc_sub, inbox) != NATS_OK ||
        natsConnection_Flush(c->nc_sub) != NATS_OK ||
        natsConnection_PublishRequest(c->nc_pub, subj, inbox, "", 0) != NATS_OK) {
        natsSubscription_Destroy(sub);
        return NULL;
    }
    return sub;
}

int kvr_digests_check(const struct kvr_bench_config *cfg, struct kvr_client *client)
{
    natsSubscription *sub = ask(cfg, client);
    if (!sub)
        return 1;
    char first[DIGEST_HEX + 1] = "";
    int answers = 0, differ = 0;
    uint64_t end = kvr_now_ns() + cfg->digest_wait_ns;
    for (uint64_t now = kvr_now_ns(); now < end; now = kvr_now_ns()) {
        natsMsg *m = NULL;
        if (natsSubscription_NextMsg(&m, sub, (int64_t)((end - now) / KVR_NS_PER_MS + 1)) !=
            NATS_OK)
            break;
        const char *data = natsMsg_GetData(m);
        int len = natsMsg_GetDataLength(m);
        printf("%.*s\n", len, data);
        char digest[DIGEST_HEX + 1];
        answers++;
        if (!digest_of(data, (size_t)len, digest))
            differ++;
        else if (!first[0])
            memcpy(first, digest, sizeof digest);
        else
            differ += strcmp(first, digest) != 0;
        natsMsg_Destroy(m);
    }
    natsSubscription_Destroy(sub);
    fprintf(stderr, "kvbench: %d routers answered; %s\n", answers,
            !answers ? "none"
            : differ ? "their digests differ"
                     : "their digests agree");
    return answers && !differ ? 0 : 1;
}

/* --- --mode resend ------------------------------------------------------------------------- */

#define RS_PROMPT    8192u /* a trial's prompt, fresh tokens: its prefill is long enough to hit */
#define RS_OUTPUT    64u   /* a trial's max_tokens: its decoding is too */
#define RS_BATCH     20u   /* queued: trials per saturated round */
#define RS_BG_TOKENS 2000u /* a background request's max_tokens (it is cancelled long before) */
#define RS_POLL_NS   (200 * 1000ull)
#define RS_PLACE_NS  (200 * KVR_NS_PER_MS) /* prefilling: no decision seen by then, resend */
#define RS_GIVEUP_NS (20 * KVR_NS_PER_S)   /* a trial, or a round, gives up */
#define RS_STATS_NS  (100 * KVR_NS_PER_MS) /* how long the routers' $SRV.STATS are collected */

enum timing { T_0MS, T_1MS, T_QUEUED, T_PREFILL, T_DECODE, T_AFTER, T_COUNT };
static const char *const timing_name[T_COUNT] = {"0ms",        "1ms",      "queued",
                                                 "prefilling", "decoding", "after-end"};

struct row {
    uint32_t trials, in_phase; /* resent in the phase the timing names */
    uint32_t doubles;          /* a final besides the first and its repeats, or a second stream */
    uint32_t spurious;         /* an error final, then new tokens */
    uint32_t tokens;           /* missing or extra tokens */
    uint32_t failed;           /* no answer, or an error */
    uint32_t placed_twice;     /* two decisions gossiped for it */
    uint64_t queue_max;        /* queued: the most the routers' queues held at a resend */
    struct kvr_contract k;     /* every count of the trials */
};

struct trial {
    uint64_t t_resend; /* 0: not yet */
    bool in_phase;     /* */
    bool complete;     /* nothing more is waited for */
};

struct resend {
    const struct kvr_bench_config *cfg;
    struct kvr_client *client;
    struct kvr_watch watch; /* this timing's decisions */
    enum timing t;          /* the timing tried now */
    uint64_t run;           /* realtime at start: ids never repeat across runs */
    uint32_t n, nbg;        /* trials per timing; background slots after them */
    uint32_t workers;       /* heard */
    uint32_t bg_tokens;     /* a background prompt: a quarter of a worker's KV, plus a block */
    uint32_t *tok;          /* prompt scratch of the encoder */
    struct trial *tr;       /* n */
    struct row rows[T_COUNT];
};

/* Request i's id: trials first, then the background. */
static void rs_id(const struct resend *rs, uint32_t i, char *buf, size_t len)
{
    if (i < rs->n)
        snprintf(buf, len, "rs%" PRIu64 "-%s-%u", rs->run, timing_name[rs->t], i);
    else
        snprintf(buf, len, "rs%" PRIu64 "-%s-bg%u", rs->run, timing_name[rs->t], i - rs->n);
}

/* The client's encoder: the same bytes every time for the same request. */
static bool rs_encode(void *ctx, uint32_t i, struct kvr_buf *out, uint32_t *max_tokens)
{
    struct resend *rs = ctx;
    bool bg = i >= rs->n;
    uint32_t len = bg ? rs->bg_tokens : RS_PROMPT;
    char id[128];
    rs_id(rs, i, id, sizeof id);
    kvr_client_prompt(rs->tok, len, kvr_hash_bytes(id, strlen(id)));
    *max_tokens = bg ? RS_BG_TOKENS : RS_OUTPUT;
    return kvr_wire_encode_generate(out, id, rs->tok, len, *max_tokens, NULL) == KVR_OK;
}

/* Watch request i's decisions, then send it. */
static void rs_start(struct resend *rs, uint32_t i)
{
    char id[128];
    rs_id(rs, i, id, sizeof id);
    kvr_watch_set(&rs->watch, i, kvr_client_key(rs->client, i, id));
    kvr_client_send(rs->client, i);
}

static void rs_resend(struct resend *rs, uint32_t i, bool in_phase)
{
    rs->tr[i].in_phase = in_phase;
    rs->tr[i].t_resend = kvr_now_ns();
    kvr_client_resend(rs->client, i);
}

/* Trial i at now, not yet resent: resend it when its timing has come. */
static void rs_due(struct resend *rs, uint32_t i, const struct kvr_client_req *q, uint64_t now)
{
    uint64_t age = now - q->t_send;
    struct kvr_watch_item w;
    switch (rs->t) {
    case T_1MS:
        if (age >= KVR_NS_PER_MS)
            rs_resend(rs, i, true);
        break;
    case T_PREFILL: /* placed (its decision gossiped), no token yet */
        w = kvr_watch_get(&rs->watch, i);
        if (w.decisions || q->heard || age >= RS_PLACE_NS)
            rs_resend(rs, i, w.decisions && !q->heard);
        break;
    case T_DECODE: /* its first token came, not its final */
        if (q->t_first || q->done || age >= RS_GIVEUP_NS)
            rs_resend(rs, i, q->t_first && !q->done);
        break;
    case T_AFTER:
        if (q->done || age >= RS_GIVEUP_NS)
            rs_resend(rs, i, q->done);
        break;
    default: /* 0ms and queued resend when they send */
        break;
    }
}

/* Trial i at now: resend it when due; true when it is over (--linger-ms past its final chunk
 * and its resend, or given up). */
static bool rs_step(struct resend *rs, uint32_t i, uint64_t now)
{
    struct kvr_client_req q = kvr_client_get(rs->client, i);
    if (!rs->tr[i].t_resend) {
        rs_due(rs, i, &q, now);
        return false;
    }
    uint64_t last = q.t_final > rs->tr[i].t_resend ? q.t_final : rs->tr[i].t_resend;
    return (q.done && now >= last + rs->cfg->linger_ns) || now - q.t_send >= RS_GIVEUP_NS;
}

/* Trials [first, last) stepped until every one is over. */
static void rs_follow(struct resend *rs, uint32_t first, uint32_t last)
{
    for (uint32_t lo = first; lo < last; kvr_sleep_ns(RS_POLL_NS)) {
        uint64_t now = kvr_now_ns();
        for (uint32_t i = lo; i < last; i++)
            rs->tr[i].complete = rs->tr[i].complete || rs_step(rs, i, now);
        while (lo < last && rs->tr[lo].complete)
            lo++;
    }
}

/* Every timing but queued: --concurrency trials in flight, each sent, resent when due, followed. */
static void rs_window(struct resend *rs)
{
    uint32_t window = rs->cfg->concurrency, lo = 0, next = 0;
    while (lo < rs->n) {
        while (next < rs->n && next - lo < window) {
            rs_start(rs, next);
            if (rs->t == T_0MS)
                rs_resend(rs, next, true);
            next++;
        }
        uint64_t now = kvr_now_ns();
        for (uint32_t i = lo; i < next; i++)
            rs->tr[i].complete = rs->tr[i].complete || rs_step(rs, i, now);
        while (lo < next && rs->tr[lo].complete)
            lo++;
        kvr_sleep_ns(RS_POLL_NS);
    }
}

/* The routers' queues now, summed; the most seen is kept in the row. */
static uint64_t rs_queue(struct resend *rs)
{
    uint32_t routers = 0;
    char inbox[192];
    uint64_t q = kvr_client_ask_inbox(rs->client, inbox, sizeof inbox)
                     ? kvr_fleet_queue_len(rs->client->nc_pub, rs->client->nc_sub, inbox,
                                           RS_STATS_NS, &routers)
                     : 0;
    struct row *r = &rs->rows[rs->t];
    r->queue_max = q > r->queue_max ? q : r->queue_max;
    return q;
}

/*
 * Queued: background requests from slot *bg on, until a router queues one (every worker is busy
 * in its predicted load: four of them fill a worker). Returns whether the fleet is saturated.
 */
static bool rs_saturate(struct resend *rs, uint32_t *bg, uint32_t end)
{
    uint32_t need = 4 * rs->workers + 1;
    for (uint32_t k = 1; *bg < end; k++) {
        kvr_client_send(rs->client, (*bg)++);
        if (k >= need && (k - need) % rs->workers == 0 && rs_queue(rs) > 0)
            return true;
    }
    return false;
}

/* Queued: the background of slots [from, to) cancelled, and its answers awaited. */
static void rs_release(struct resend *rs, uint32_t from, uint32_t to)
{
    char id[128];
    for (uint32_t j = from; j < to; j++) {
        rs_id(rs, j, id, sizeof id);
        kvr_client_cancel(rs->client, j, id);
    }
    uint64_t end = kvr_now_ns() + RS_GIVEUP_NS;
    for (uint32_t j = from; j < to; j++)
        kvr_client_wait_one(rs->client, j, end);
}

/* Queued: rounds of RS_BATCH trials sent into a saturated fleet and resent while they wait. */
static void rs_queued(struct resend *rs)
{
    uint32_t bg = rs->n, per = rs->nbg / ((rs->n + RS_BATCH - 1) / RS_BATCH);
    for (uint32_t first = 0; first < rs->n; first += RS_BATCH) {
        uint32_t last = first + RS_BATCH < rs->n ? first + RS_BATCH : rs->n, bg0 = bg;
        bool full = rs_saturate(rs, &bg, bg0 + per);
        for (uint32_t i = first; i < last; i++)
            rs_start(rs, i);
        bool waiting = full && rs_queue(rs) > 0; /* after a STATS round trip: they have arrived */
        for (uint32_t i = first; i < last; i++) {
            struct kvr_client_req q = kvr_client_get(rs->client, i);
            struct kvr_watch_item w = kvr_watch_get(&rs->watch, i);
            rs_resend(rs, i, waiting && !w.decisions && !q.heard);
        }
        rs_release(rs, bg0, bg);
        rs_follow(rs, first, last);
    }
}

/* One line on trial i that broke the contract or failed: what came, what the fleet did. */
static void rs_detail(const struct resend *rs, uint32_t i, const struct kvr_client_req *q,
                      const struct kvr_watch_item *w)
{
    printf("resend %s #%u: %s (%u); finals=%u (a late one: %u) tokens=%u of %u from worker %" PRIu64
           ", %u from worker %" PRIu64 "; missing=%u spurious=%d; resent %.1f ms after the send; "
           "decisions=%u (workers %" PRIu64 ", %" PRIu64 "; by %s at %" PRIu64 ", %s at %" PRIu64
           " ns); done events=%u (first: %s)\n",
           timing_name[rs->t], i, q->done ? kvr_status_str((kvr_status)q->error) : "no answer",
           q->error, q->finals, q->late_error, q->have, q->expect, q->worker, q->tokens2,
           q->worker2, q->missing, q->spurious, (double)(rs->tr[i].t_resend - q->t_send) / 1e6,
           w->decisions, w->worker, w->worker2, w->origin[0], w->at[0], w->origin[1], w->at[1],
           w->dones, w->dones ? kvr_status_str((kvr_status)w->status) : "-");
}

/* This timing's trials into its row; the first few broken ones told. */
static void rs_tally(struct resend *rs)
{
    struct row *r = &rs->rows[rs->t];
    uint32_t told = 0;
    for (uint32_t i = 0; i < rs->n; i++) {
        struct kvr_client_req q = kvr_client_get(rs->client, i);
        struct kvr_watch_item w = kvr_watch_get(&rs->watch, i);
        if ((kvr_contract_broken(&q) || !q.done || q.error) && told++ < 5)
            rs_detail(rs, i, &q, &w);
        struct kvr_contract one = {0};
        kvr_contract_add(&one, &q);
        kvr_contract_add(&r->k, &q);
        r->trials++;
        r->in_phase += rs->tr[i].in_phase;
        r->doubles += one.double_finals || one.second_streams;
        r->spurious += one.spurious_finals;
        r->tokens += one.missing_tokens || one.extra_tokens;
        r->failed += !q.done || q.error != KVR_OK;
        r->placed_twice += w.decisions > 1;
    }
    struct kvr_contract all; /* the answers that did not decode, which no record holds */
    kvr_client_contract(rs->client, 0, 0, &all);
    r->k.malformed = all.malformed;
}

/* One timing: its batch, its watch, its trials, its row. 0, or 1 when memory is short. */
static int rs_timing(struct resend *rs, enum timing t)
{
    struct kvr_client *c = rs->client;
    rs->t = t;
    memset(rs->tr, 0, (size_t)rs->n * sizeof *rs->tr);
    if (kvr_client_begin(c, rs->n + rs->nbg, false, rs_encode, rs, 0) != KVR_OK)
        return 1;
    kvr_status st = kvr_watch_start(&rs->watch, c->nc_sub, rs->cfg->net.prefix, rs->cfg->net.ns,
                                    rs->n + rs->nbg);
    if (st == KVR_OK) {
        if (t == T_QUEUED)
            rs_queued(rs);
        else
            rs_window(rs);
        rs_tally(rs);
        kvr_watch_stop(&rs->watch);
    }
    kvr_client_end(c);
    return st == KVR_OK ? 0 : 1;
}

/* The table; the exit status: 1 if any trial broke the contract or failed. */
static int rs_print(const struct resend *rs)
{
    printf("%-11s %7s %9s %15s %16s %24s %7s %13s\n", "timing", "trials", "in_phase",
           "double_answers", "spurious_finals", "missing_or_extra_tokens", "failed",
           "placed_twice");
    int rc = 0;
    for (int t = 0; t < T_COUNT; t++) {
        const struct row *r = &rs->rows[t];
        printf("%-11s %7u %9u %15u %16u %24u %7u %13u\n", timing_name[t], r->trials, r->in_phase,
               r->doubles, r->spurious, r->tokens, r->failed, r->placed_twice);
        rc |= r->doubles || r->spurious || r->tokens || r->failed;
    }
    char line[512];
    for (int t = 0; t < T_COUNT; t++)
        printf("%-11s contract: %s\n", timing_name[t],
               kvr_contract_format(&rs->rows[t].k, line, sizeof line));
    printf("queued: the routers' queues held up to %" PRIu64 " requests when the trials were "
           "resent\n",
           rs->rows[T_QUEUED].queue_max);
    printf("resend: %s\n", rc ? "FAIL (some resent request was answered twice, spuriously, with "
                                "the wrong tokens, or not at all)"
                              : "ok (every resent request was answered once, in full)");
    return rc;
}

/* The workers, for the background's size; false when none is heard. */
static bool rs_fleet(struct resend *rs)
{
    struct kvr_fleet f;
    kvr_fleet_init(&f);
    uint32_t n = kvr_fleet_discover(&f, rs->client->nc_sub, rs->cfg->net.prefix, rs->cfg->net.ns,
                                    1500 * KVR_NS_PER_MS);
    uint64_t tokens = (f.capacity / 4 + 1) * f.block_size;
    rs->workers = n;
    rs->bg_tokens = tokens < (1u << 20) ? (uint32_t)tokens : (1u << 20);
    kvr_fleet_free(&f);
    return n && f.block_size;
}

int kvr_resend_run(const struct kvr_bench_config *cfg, struct kvr_client *client)
{
    struct resend rs = {.cfg = cfg, .client = client, .n = cfg->trials, .run = kvr_realtime_ns()};
    if (!rs_fleet(&rs)) {
        fprintf(stderr, "kvbench: no worker heartbeat seen\n");
        return 2;
    }
    uint32_t rounds = (rs.n + RS_BATCH - 1) / RS_BATCH;
    rs.nbg = rounds * (8 * rs.workers + 8);
    uint32_t most = rs.bg_tokens > RS_PROMPT ? rs.bg_tokens : RS_PROMPT;
    rs.tok = malloc((size_t)most * sizeof *rs.tok);
    rs.tr = calloc(rs.n, sizeof *rs.tr);
    printf("resend: %u trials per timing (%u-token fresh prompts, %u tokens out, %u in flight; "
           "queued: rounds of %u behind %u-token background requests), %u workers; the resend "
           "is the same bytes, inbox and request_id\n",
           rs.n, RS_PROMPT, RS_OUTPUT, cfg->concurrency, RS_BATCH, rs.bg_tokens, rs.workers);
    fflush(stdout);
    int rc = rs.tok && rs.tr ? 0 : 1;
    for (int t = 0; t < T_COUNT && rc == 0; t++)
        rc = rs_timing(&rs, (enum timing)t);
    if (rc == 0)
        rc = rs_print(&rs);
    free(rs.tok);
    free(rs.tr);
    return rc;
}
