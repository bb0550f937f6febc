/*
 * The unit tests' recording sink: a struct kvr_sink (src/base/outbox.h) whose publish keeps a
 * copy of every message (what a daemon would have published) in rec_sent, in order, so a test
 * drives a state machine through its handlers and reads back what it said. One recorder a test
 * executable; rec_reset in each test's .fini frees what it holds. Also what more than one of those
 * tests builds alike from the wire codec alone (rec.c links with every daemon's tests).
 */
#ifndef KVR_TEST_REC_H
#define KVR_TEST_REC_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "kvr/status.h"
#include "log.h"
#include "outbox.h"

/* One message as published. */
struct rec_sent {
    char *subject; /* owned */
    char *reply;   /* owned; "" for none */
    uint8_t *data; /* owned; NUL-terminated after its len bytes */
    size_t len;
    kvr_status err;
};

#define REC_MAX 8192
extern struct rec_sent rec_sent[REC_MAX];
extern size_t rec_nsent;

/* kvr_sink.publish: a copy of m at rec_sent[rec_nsent++] (at most REC_MAX, asserted); KVR_OK. */
kvr_status rec_record(void *ctx, const struct kvr_outmsg *m);

/* Free the messages from index mark on and forget them (rec_nsent = mark). */
void rec_truncate(size_t mark);
/* Free every message recorded (rec_nsent = 0). */
void rec_reset(void);

/* Catch what this process logs (stderr) from level on until rec_log_end (kvr_log_init(name));
 * rec_log_end puts stderr back at error level and returns the text (until the next call). */
void rec_log_begin(const char *name, enum kvr_log_level level);
const char *rec_log_end(const char *name);
/* Lines of text holding what, and the sum of their suppressed=N. */
uint32_t rec_log_lines(const char *text, const char *what, uint64_t *suppressed);
/* A flood anyone could send, each message a line `what` unless gated (reply.h's kvr_log_gate):
 * send(ctx) 1,000 times, then once more a second later. Asserts that at most KVR_REPLY_LOG_PER_S
 * lines were written for each second the 1,000 touched, one more after, and that they and the
 * suppressed=N they carry account for all 1,001. */
void rec_log_flood(void (*send)(void *ctx), void *ctx, const char *name, const char *what);

/* 16 bytes of 0xff: no message of the protocol (a truncated varint). */
extern const uint8_t rec_junk[16];

/* Messages to subject since index from; the last one in *last (may be NULL). */
int rec_count(const char *subject, size_t from, const struct rec_sent **last);

/* The error code of the final chunk m (asserted: final, service header carries the code). */
uint32_t rec_error_in(const struct rec_sent *m);

/* A message for a handler: its subject and bytes (kvr_buf_free(&e.b) after). */
struct rec_event {
    char subject[64];
    struct kvr_buf b;
};

/* Worker wid's heartbeat (block size 64) on its subject kv.<ns>.ev.<wid>.hb of namespace
 * "default", with the n keys it holds, its interval and the forwards waiting in its queue. */
struct rec_event rec_heartbeat(uint64_t wid, uint64_t capacity, const uint64_t *keys, uint32_t n,
                               uint32_t interval_ms, uint32_t forwards_waiting);

/*
 * A sink that checks order across threads: every message to "order.test" carries a uint64_t,
 * each one more than the last (what a test's threads made under the state machine's mutex);
 * rec_order_next is the value expected next, rec_order_wrong counts those out of order.
 */
extern uint64_t rec_order_next, rec_order_wrong;
kvr_status rec_order_sink(void *ctx, const struct kvr_outmsg *m);

/* nthreads threads each make `each` of those messages one at a time: mu locked, the next value
 * added to out, then unlock(ctx), which releases mu and publishes what out holds. Returns when
 * all are done (every thread started, asserted). */
void rec_order_run(int nthreads, int each, pthread_mutex_t *mu, struct kvr_outbox *out,
                   void (*unlock)(void *ctx), void *ctx);

#endif
