/*
 * The unit tests' recording sink (rec.h).
 */
#define _DEFAULT_SOURCE
#include "rec.h"

#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <sched.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "codec.h"
#include "log.h"
#include "reply.h"

struct rec_sent rec_sent[REC_MAX];
size_t rec_nsent;

kvr_status rec_record(void *ctx, const struct kvr_outmsg *m)
{
    (void)ctx;
    cr_assert(lt(sz, rec_nsent, (size_t)REC_MAX));
    struct rec_sent *s = &rec_sent[rec_nsent++];
    s->subject = strdup(m->subject);
    s->reply = strdup(m->reply ? m->reply : "");
    s->data = malloc(m->len + 1);
    memcpy(s->data, m->data, m->len);
    s->data[m->len] = 0;
    s->len = m->len;
    s->err = m->err;
    return KVR_OK;
}

void rec_truncate(size_t mark)
{
    for (size_t i = mark; i < rec_nsent; i++) {
        free(rec_sent[i].subject);
        free(rec_sent[i].reply);
        free(rec_sent[i].data);
    }
    if (mark < rec_nsent)
        rec_nsent = mark;
}

void rec_reset(void)
{
    rec_truncate(0);
}

int rec_count(const char *subject, size_t from, const struct rec_sent **last)
{
    int n = 0;
    for (size_t i = from; i < rec_nsent; i++) {
        if (!strcmp(rec_sent[i].subject, subject)) {
            n++;
            if (last)
                *last = &rec_sent[i];
        }
    }
    return n;
}

uint32_t rec_error_in(const struct rec_sent *m)
{
    struct kvr_wire_response r;
    cr_assert(eq(int, kvr_wire_decode_response(m->data, m->len, &r), KVR_OK));
    cr_assert(r.final, "an error is a final chunk");
    uint32_t code = r.error_code;
    cr_assert(eq(u32, (uint32_t)m->err, code), "the service error header carries the code");
    kvr_wire_response_free(&r);
    return code;
}

struct rec_event rec_heartbeat(uint64_t wid, uint64_t capacity, const uint64_t *keys, uint32_t n,
                               uint32_t interval_ms, uint32_t forwards_waiting)
{
    struct kvr_wire_heartbeat h = {
        .info = {.id = wid, .block_size = 64, .capacity_blocks = capacity},
        .inflight = (uint64_t *)keys,
        .ninflight = n,
        .interval_ms = interval_ms,
        .forwards_waiting = forwards_waiting};
    struct rec_event e = {.b = {0}};
    snprintf(e.subject, sizeof e.subject, "kv.default.ev.%llu.hb", (unsigned long long)wid);
    cr_assert(eq(int, kvr_wire_encode_heartbeat(&e.b, &h), KVR_OK));
    return e;
}

static pthread_mutex_t order_mu = PTHREAD_MUTEX_INITIALIZER;
uint64_t rec_order_next, rec_order_wrong;

kvr_status rec_order_sink(void *ctx, const struct kvr_outmsg *m)
{
    (void)ctx;
    uint64_t v;
    if (strcmp(m->subject, "order.test") || m->len != sizeof v)
        return KVR_OK;
    memcpy(&v, m->data, sizeof v);
    sched_yield(); /* a publish takes a while: a thread that unlocked later may overtake */
    pthread_mutex_lock(&order_mu);
    rec_order_wrong += v != rec_order_next;
    rec_order_next = v + 1;
    pthread_mutex_unlock(&order_mu);
    return KVR_OK;
}

struct order_run {
    int each;
    pthread_mutex_t *mu;
    struct kvr_outbox *out;
    void (*unlock)(void *ctx);
    void *ctx;
    uint64_t seq; /* under mu */
};

static void *order_thread(void *arg)
{
    struct order_run *r = arg;
    for (int i = 0; i < r->each; i++) {
        pthread_mutex_lock(r->mu);
        uint64_t v = r->seq++;
        kvr_outbox_add(r->out, "order.test", &v, sizeof v, KVR_OK);
        r->unlock(r->ctx);
    }
    return NULL;
}

void rec_order_run(int nthreads, int each, pthread_mutex_t *mu, struct kvr_outbox *out,
                   void (*unlock)(void *ctx), void *ctx)
{
    struct order_run r = {each, mu, out, unlock, ctx, 0};
    pthread_t t[16];
    cr_assert(nthreads > 0 && nthreads <= 16);
    for (int i = 0; i < nthreads; i++)
        cr_assert(eq(int, pthread_create(&t[i], NULL, order_thread, &r), 0));
    for (int i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
}

const uint8_t rec_junk[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                              0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};

/* --- what a test logs ------------------------------------------------------------------------ */

static int saved_fd = -1;
static char log_path[64];
static char log_text[1 << 20];

void rec_log_begin(const char *name, enum kvr_log_level level)
{
    snprintf(log_path, sizeof log_path, "/tmp/kvr_test_log_%d.log", (int)getpid());
    fflush(stderr);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert(fd >= 0, "cannot write %s", log_path);
    saved_fd = dup(2);
    dup2(fd, 2);
    close(fd);
    kvr_log_init(name, level);
}

const char *rec_log_end(const char *name)
{
    fflush(stderr);
    dup2(saved_fd, 2);
    close(saved_fd);
    saved_fd = -1;
    kvr_log_init(name, KVR_LOG_ERROR);
    FILE *f = fopen(log_path, "r");
    size_t n = f ? fread(log_text, 1, sizeof log_text - 1, f) : 0;
    if (f)
        fclose(f);
    log_text[n] = 0;
    unlink(log_path);
    return log_text;
}

uint32_t rec_log_lines(const char *text, const char *what, uint64_t *suppressed)
{
    uint32_t n = 0;
    *suppressed = 0;
    for (const char *l = strstr(text, what); l; l = strstr(l + 1, what)) {
        n++;
        const char *eol = strchr(l, '\n'), *s = strstr(l, "suppressed=");
        if (s && (!eol || s < eol))
            *suppressed += strtoull(s + strlen("suppressed="), NULL, 10);
    }
    return n;
}

void rec_log_flood(void (*send)(void *ctx), void *ctx, const char *name, const char *what)
{
    rec_log_begin(name, KVR_LOG_DEBUG);
    uint64_t t0 = kvr_now_ns();
    for (int i = 0; i < 1000; i++)
        send(ctx);
    uint64_t took = kvr_now_ns() - t0; /* the seconds it began in and spanned each have a gate */
    kvr_sleep_ns(1100 * KVR_NS_PER_MS);
    send(ctx); /* a second later: the count of those left out */
    const char *text = rec_log_end(name);
    uint64_t left;
    uint32_t lines = rec_log_lines(text, what, &left);
    uint64_t most = KVR_REPLY_LOG_PER_S * (took / KVR_NS_PER_S + 2) + 1;
    cr_assert(le(u64, lines, most), "%u %s lines for 1,001 messages sent in %.2f s", lines, what,
              (double)took / 1e9);
    cr_assert(eq(u64, lines + left, 1001), "every message is a line or counted in one");
}
