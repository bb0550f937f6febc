/*
 * kvzmq: the engines' KV-event transport over ZeroMQ (libzmq), both ends.
 *
 * Wire (vLLM's ZmqEventPublisher; SGLang's is the same):
 *   - live: a PUB socket; each message is 3 frames [topic, seq, payload], topic the configured
 *     bytes (may be empty), seq 8 bytes big-endian unsigned (0 for the first batch, one more for
 *     each), payload one msgpack batch (kvevents.h);
 *   - replay: a ROUTER socket keeping the last N batches. A request is one frame, the first wanted
 *     seq (8 bytes big-endian), after an empty delimiter frame when the client is a REQ or a
 *     DEALER that sends one; the answer is one message [seq, payload] per kept batch whose seq >=
 *     the wanted one, oldest first, then an end marker [seq = all ones (-1), empty payload], each
 *     with the same envelope as the request (the delimiter echoed when there was one).
 *
 * The publisher (the engine side: the engine stand-in) binds both sockets (its PUB is an XPUB so
 * it can count subscribers; subscribers cannot tell). kvr_kvpub_publish is thread-safe: it
 * assigns the seq and stores the batch in the ring under the publisher's mutex and wakes the
 * publisher's own thread, which owns both sockets, sends the batch (zero-copy, the ring's bytes)
 * and serves replay requests. A replay request is bounded: the request must be 1 frame of 8 bytes
 * (after the identity and an optional empty delimiter; ZMQ_MAXMSGSIZE 64 bytes on the socket);
 * anything else is answered with just the end marker and counted (replay_bad).
 *
 * The subscriber (the adapter side) runs its own thread: a SUB socket connected to the engine's
 * PUB with the topic filter, a DEALER connected to the replay endpoint (when given). It checks
 * every message (3 frames, seq 8 bytes, topic equal to the configured one when that is not empty,
 * else counted as bad and dropped), decodes the payload with kvr_kvev_decode and calls
 * hooks->batch strictly in seq order, never twice for one seq:
 *   - the first batch after open (or after a reset) is taken as it comes;
 *   - seq == last + 1: delivered at once (zmq_poll, no sleeping);
 *   - seq > last + 1 (a gap): the replay socket is asked from last + 1; replies are delivered in
 *     order (those <= last dropped as duplicates) while live batches arriving meanwhile are held
 *     (at most hold_max, of hold_bytes_max bytes in all) and delivered after, duplicates
 *     dropped. When the replay cannot cover the gap (its first reply is past last + 1: evicted
 *     from the ring; no replay endpoint; no new batch nor end marker from it for
 *     replay_timeout_ms, counted from the request or its last new batch; more than
 *     hold_max or hold_bytes_max held) hooks->reset(ctx, why) is called and the subscriber goes
 *     on from the next batch it has (replayed or held) as a first batch. A timed-out replay's
 *     DEALER is closed and a fresh one connected, so late replies never mix with the next
 *     request's;
 *   - seq <= last on the live socket (the engine restarted: its seq began again at 0):
 *     hooks->reset(ctx, "engine restarted"), then a replay from 0 (what the new engine published
 *     before we noticed, lost to ZeroMQ's slow joiner), then on as above. An engine restarted and
 *     first seen at seq > last + 1 cannot be told from a gap (the wire has no epoch): the replay
 *     then delivers the new engine's batches as if they filled it;
 *   - a batch that does not decode (or is over the limits) is counted (bad, bad_decode) and
 *     skipped: its seq counts as delivered (last advances past it, hooks->bad is told). Asking
 *     again would return the same bytes and fail the same way, and a reset would throw away a
 *     whole worker's index for one batch; a skipped batch costs at most the blocks it named
 *     (a Stored missed: fewer hits; a Removed missed: an entry the index ages out).
 * The hooks run on the subscriber's thread, one at a time, never with a subscriber lock held;
 * they must not call kvr_kvsub_close (kvr_kvsub_stats is fine).
 */
#ifndef KVR_KVZMQ_H
#define KVR_KVZMQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvevents.h"
#include "kvr/status.h"

#define KVR_KVZMQ_SEQ_END           UINT64_MAX /* the replay's end marker seq (-1) */
#define KVR_KVPUB_RING_DEFAULT      10000u     /* batches kept for replay (vLLM's buffer_steps) */
#define KVR_KVZMQ_HWM_DEFAULT       100000 /* PUB send / SUB receive high-water marks, messages */
#define KVR_KVSUB_REPLAY_TIMEOUT_MS 500u   /* default replay's silence before it is given up */
#define KVR_KVSUB_HOLD_DEFAULT      10000u /* default live batches held during a replay */
#define KVR_KVSUB_HOLD_BYTES        (256u << 20) /* and their bytes, at most */
#define KVR_KVZMQ_ENDPOINT_MAX      256u         /* longest endpoint text, with its NUL */

/* ---- publisher (engine side) ---------------------------------------------------------------- */

struct kvr_kvpub;

struct kvr_kvpub_stats {
    uint64_t next_seq;        /* the seq the next publish gets */
    uint64_t published;       /* batches given to kvr_kvpub_publish */
    uint64_t sent;            /* batches sent on the PUB socket */
    uint64_t dropped;         /* batches not sent on purpose (kvr_kvpub_drop) */
    uint64_t lost;            /* batches evicted from the ring before the thread sent them */
    uint64_t replay_requests; /* well-formed replay requests served */
    uint64_t replay_bad;      /* malformed replay requests (answered with the end marker) */
    uint64_t replayed;        /* batches sent on the replay socket */
    uint32_t ring;            /* batches now in the ring */
    uint32_t subscribers;     /* subscriptions the PUB socket has seen, less unsubscriptions */
};

/*
 * Bind a PUB socket at endpoint and, when replay_endpoint is not NULL, a ROUTER at it; both
 * strings are copied, "tcp://127.0.0.1:*" (or ":0") picks an ephemeral port (see
 * kvr_kvpub_endpoint). topic NULL means "" (copied). ring_batches 0 means
 * KVR_KVPUB_RING_DEFAULT. Starts the publisher's thread. NULL on failure with *st set
 * (KVR_ERR_INVALID: NULL endpoint, bad endpoint text; KVR_ERR_IO: bind failed, e.g. port in use;
 * KVR_ERR_NOMEM). st may be NULL.
 */
struct kvr_kvpub *kvr_kvpub_open(const char *endpoint, const char *replay_endpoint,
                                 const char *topic, uint32_t ring_batches, kvr_status *st);

/*
 * The endpoint actually bound (the PUB's, or the replay ROUTER's when replay), e.g.
 * "tcp://127.0.0.1:43117", into buf (NUL-terminated). KVR_ERR_INVALID when replay is asked of a
 * publisher without one or buf is too small (KVR_KVZMQ_ENDPOINT_MAX is always enough).
 * Thread-safe.
 */
kvr_status kvr_kvpub_endpoint(struct kvr_kvpub *p, bool replay, char *buf, size_t cap);

/*
 * Publish one batch: payload[0..len) is copied (borrowed for the call); it gets the next seq
 * (from 0), enters the ring (the oldest leaves when it is full) and is sent by the publisher's
 * thread. Thread-safe; never blocks on the network. *seq_out (may be NULL) receives its seq.
 * KVR_OK, KVR_ERR_NOMEM, KVR_ERR_INVALID (len > KVR_KVEV_MAX_BYTES), KVR_ERR_SHUTDOWN (closing).
 */
kvr_status kvr_kvpub_publish(struct kvr_kvpub *p, const void *payload, size_t len,
                             uint64_t *seq_out);

/* Test hook: the next n batches published get their seq and enter the ring but are not sent on
 * the PUB socket (lost on the way; a replay returns them). Thread-safe. */
void kvr_kvpub_drop(struct kvr_kvpub *p, uint32_t n);

/* Wait until the PUB socket has seen at least n subscriptions (a connected SUB that subscribed),
 * at most timeout_ms. true when it has. For tests and the stand-in, to avoid the slow joiner. */
bool kvr_kvpub_wait_subscribers(struct kvr_kvpub *p, uint32_t n, uint32_t timeout_ms);

/* A snapshot of the counters into *out. Thread-safe. */
void kvr_kvpub_stats(struct kvr_kvpub *p, struct kvr_kvpub_stats *out);

/* Stop the thread (what is published but not yet sent is sent first, with a 100 ms linger),
 * close the sockets, free everything. NULL is fine. Not concurrently with publish. */
void kvr_kvpub_close(struct kvr_kvpub *p);

/* ---- subscriber (adapter side) -------------------------------------------------------------- */

struct kvr_kvsub;

struct kvr_kvsub_config {
    const char *endpoint;          /* the engine's PUB, e.g. "tcp://10.0.0.7:5557" (copied) */
    const char *replay_endpoint;   /* its ROUTER, or NULL: a gap then resets (copied) */
    const char *topic;             /* filter and exact check; NULL or "": every topic (copied) */
    struct kvr_kvev_limits limits; /* for kvr_kvev_decode; zero fields: defaults; max_bytes is
                                      also the sockets' ZMQ_MAXMSGSIZE (a bigger frame makes
                                      ZeroMQ drop the connection, which then reconnects) */
    uint32_t replay_timeout_ms;    /* a replay silent this long is given up; 0: 500 */
    uint32_t hold_max;             /* live batches held during a replay; 0: 10,000 */
    size_t hold_bytes_max;         /* and their bytes; 0: 256 MiB */
    int rcvhwm;                    /* SUB receive high-water mark; 0: 100,000 */
};

struct kvr_kvsub_hooks {
    void *ctx; /* passed to every hook; must outlive the subscriber */
    /* A batch, in seq order. b is the subscriber's: valid for the call; the hook may take its
     * arrays by copying *b and zeroing it (*b = (struct kvr_kvev_batch){0}); whatever is left
     * is freed after the hook returns. replayed: it came from the replay socket. Required. */
    void (*batch)(void *ctx, uint64_t seq, struct kvr_kvev_batch *b, bool replayed);
    /* What the subscriber knew is lost (a gap it could not fill, the engine restarted): the
     * caller forgets this engine's cache state. why is a static text. May be NULL. */
    void (*reset)(void *ctx, const char *why);
    /* A message dropped: seq (UINT64_MAX when unknown), st its decode status or
     * KVR_ERR_MALFORMED for bad frames. May be NULL. */
    void (*bad)(void *ctx, uint64_t seq, kvr_status st);
};

struct kvr_kvsub_stats {
    uint64_t batches;          /* delivered to hooks->batch (live and replayed) */
    uint64_t events;           /* known events in them */
    uint64_t unknown_events;   /* events skipped for an unknown tag */
    uint64_t bad;              /* messages dropped: frames, sizes, topic, payload */
    uint64_t bad_decode;       /* of which the payload did not decode (seq skipped) */
    uint64_t duplicates;       /* batches dropped as already delivered */
    uint64_t gaps;             /* gaps seen (seq > last + 1) */
    uint64_t gaps_filled;      /* of which the replay filled */
    uint64_t replay_requests;  /* requests sent to the replay socket */
    uint64_t replayed;         /* batches delivered from the replay socket */
    uint64_t replay_timeouts;  /* replays without an end marker in time */
    uint64_t resets;           /* hooks->reset calls */
    uint64_t restarts;         /* of which for an engine restart */
    uint64_t held_max;         /* most live batches held at once during a replay */
    bool has_last;             /* a batch was delivered (or skipped) since the last reset */
    uint64_t last_seq;         /* its seq, when has_last */
    uint64_t last_batch_ns;    /* kvr_now_ns() (monotonic) when it was delivered; 0: never */
    double last_ts;            /* its ts (engine's clock, seconds) */
    uint64_t last_gap_fill_ns; /* time from seeing the last filled gap to delivering past it */
};

/*
 * Connect and start the subscriber's thread. cfg and hooks are copied (cfg->endpoint required,
 * hooks->batch required). NULL on failure with *st (KVR_ERR_INVALID, KVR_ERR_IO, KVR_ERR_NOMEM);
 * st may be NULL. Connecting is asynchronous (ZeroMQ retries until the engine is there).
 */
struct kvr_kvsub *kvr_kvsub_open(const struct kvr_kvsub_config *cfg,
                                 const struct kvr_kvsub_hooks *hooks, kvr_status *st);

/* A snapshot of the counters into *out. Thread-safe (also from a hook). */
void kvr_kvsub_stats(struct kvr_kvsub *s, struct kvr_kvsub_stats *out);

/* Stop and join the thread (promptly: it is woken, not polled for), close the sockets, free
 * everything. No hook runs after it returns. NULL is fine. Not from a hook. */
/*
 * The engine restarted (its owner knows from elsewhere, e.g. its process start time): forget the
 * last seq, so the new engine's batches are not taken for the old one's continuation, and ask
 * the replay socket from 0 for what it sent before. Thread-safe, non-blocking; done on the
 * subscriber's thread (after a replay in progress), with the reset hook if anything was
 * delivered since the last reset.
 */
void kvr_kvsub_rewind(struct kvr_kvsub *s);

void kvr_kvsub_close(struct kvr_kvsub *s);

#endif
