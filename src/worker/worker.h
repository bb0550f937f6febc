/*
 * kvr_worker: a simulated inference worker's state and handlers, without NATS. It runs the
 * simulated engine (src/engine) in real time (step times divided by the speed-up), takes requests
 * (a WorkerGenerate from a router), streams one GenerateResponse chunk per token to each request's
 * reply subject, and publishes what a real engine adapter publishes: KV events, prefill done,
 * output blocks, done (with the outcome and the tokens streamed), and a heartbeat listing the
 * request keys it holds. In null mode it answers every request at once (to measure the router's
 * own overhead). Errors reach clients through its kvr_reply, like the router's.
 *
 * A stream: every chunk's position is the tokens sent before it, the first chunk (position 0) and
 * the final carry cached_tokens, the final's position is the total. A request ends exactly once:
 * finished by the engine, cancelled by a router's WorkerCancel, or past its deadline (deadline_ms
 * from its arrival); each end publishes one DoneEvent, and every end but a silent cancel one
 * final chunk. An ended key is remembered for 60 s (recent.h), so a duplicate forward is dropped
 * and counted, never answered; a cancel for a key not yet here is remembered the same way and ends
 * the forward when it comes.
 *
 * Cuts: chunks published just before the outgoing connection was cut may be lost inside the
 * server, and clients reconnect too. So about a second after the connection is back
 * (KVR_WK_REPEAT_DELAY_NS), each stream open at the cut or since gets one repeat: every token so
 * far from position 0, and for a stream that ended meanwhile (or in the KVR_WK_KEPT_NS before
 * the cut) its final again; a client keeps only what it lacks. For that the worker keeps each
 * stream's tokens while it is open (at most its max_tokens) and for KVR_WK_RESEND_KEPT_NS after
 * it ends (until the repeat, during a cut), within a budget.
 *
 * Resends: a client that got nothing for 2 s resends; a router that knows the request ended
 * sends a WorkerRebind with repeat (its stream was lost whole, docs/protocol.md), and the worker
 * repeats the stream kept under that key, at most once per KVR_WK_RESEND_GAP_NS and
 * KVR_WK_RESEND_MAX times in all (what a resending client can cost is bounded by its stream).
 *
 * Rebinds: on a server that lets a worker answer clients only by response permission
 * (allow_responses), the right to answer a client belongs to the connection that received its
 * request, and is lost in a cut. So when the outgoing connection, which receives the forwards, is
 * back, the worker lists the streams it is about to repeat in RebindAsks (ev.<id>.rebind); each
 * router that knows one as booked here answers with a WorkerRebind carrying the client's reply
 * subject, which renews the right, before the repeat is due.
 *
 * Worker id clash: each process has a random instance and its start time; one that sees the
 * heartbeat of another instance under its id yields if it is the younger (kvr_worker_yields):
 * it publishes nothing more at all (the older serves the same forwards) and stops.
 *
 * Threads: delivery threads call the kvr_worker_on_* handlers; the engine thread runs
 * kvr_worker_run_engine; the heartbeat thread calls kvr_worker_beat; the NATS library's event
 * thread calls kvr_worker_on_disconnected / on_reconnected. All state is behind one mutex;
 * messages made under it go out through the outbox and the sink after it is released
 * (kvr__worker_unlock: taken out under the mutex, published after).
 *
 * The heartbeat is never starved by the mutex: the busy threads (an adapter's streams take it
 * once per token) release and take it again back to back, and a waiter on glibc's mutex can wait
 * hundreds of milliseconds while they take it hundreds of times. So the heartbeat thread, when a
 * beat is due, asks for it (beat_wanted) and tries the mutex without blocking; whichever thread
 * has it next, or the heartbeat thread once it gets it, queues the beat before releasing it (its
 * content made under the mutex, as ever). The heartbeat thread itself never waits on the mutex
 * between beats, and keeps to its period on the clock, not by counting its sleeps.
 */
#ifndef KVR_WORKER_H
#define KVR_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uthash.h>

#include "buf.h"
#include "codec.h"
#include "config.h"
#include "heap.h"
#include "outbox.h"
#include "recent.h"
#include "reply.h"

#define KVR_WK_REPEAT_DELAY_NS (1000ull * 1000000ull) /* from the reconnect to the repeat */
#define KVR_WK_KEPT_NS         (2000ull * 1000000ull) /* a cut repeats what ended this long before */
#define KVR_WK_RESEND_KEPT_NS                                                                      \
    (10000ull * 1000000ull) /* an ended stream is kept this long, for a repeat on a resend */
/* a resend repeats a stream this often, at most: under the 1 s a client waits between resends
 * (at 1 s, jitter refused about half of the second ones, each counted against the 3) */
#define KVR_WK_RESEND_GAP_NS (500ull * 1000000ull)
#define KVR_WK_RESEND_MAX    3u /* and this many times in all */
#define KVR_WK_LIST_AFTER_CUT_NS                                                                   \
    (5000ull * 1000000ull) /* heartbeats list what ended during a cut for this long after it */
#define KVR_WK_KEPT_MAX    65536u     /* ended streams kept at most */
#define KVR_WK_KEPT_TOKENS (1u << 22) /* and their tokens and text at most (16 MB, in 4 bytes) */
#define KVR_WK_TEXT_MAX    (1u << 24) /* text bytes kept of one stream, at most */
#define KVR_WK_ENGINE_WAKE_NS                                                                      \
    (200ull * 1000000ull) /* the engine thread's longest sleep: engine_ns stays this fresh */

#define KVR_WK_LEAVE_NS (200ull * 1000000ull) /* the stop: routers told, forwards still taken */

struct kvr_wreq {
    uint64_t key;            /* the router's key for the request: the engine's request id */
    char *reply;             /* the client's reply subject (owned) */
    char *request_id;        /* the client's id (owned) */
    uint32_t produced;       /* tokens its chunks carried: the next chunk's position */
    uint32_t generated;      /* tokens the engine generated, by its count: == produced but for an
                                engine that streams text without token ids, whose chunks carry
                                none (docs/protocol.md); what the routers are told */
    uint32_t max_tokens;     /* tokens it may generate (bounds toks) */
    uint32_t cached_tokens;  /* prompt tokens the engine had cached, known at its prefill */
    uint32_t *toks;          /* the tokens generated, for a repeat after a cut (owned) */
    uint32_t ntoks, captoks; /* kept (== produced unless memory ran short), room */
    char *text;              /* their text, where the engine gives one (owned; NULL: none) */
    uint32_t *text_end;      /* text bytes through each kept token (owned, captoks; NULL: none) */
    uint32_t ntext, captext; /* */
    uint32_t prompt_tokens;  /* its prompt's length */
    uint64_t arrived;        /* when it was taken (monotonic ns) */
    uint32_t blocks;         /* adapter: the KV blocks it holds as announced (prompt + output) */
    uint8_t held[4], nheld;  /* adapter: the start of a UTF-8 character cut at a chunk's end */
    bool started;            /* adapter: its first token came (prefill done) */
    char finish[KVR_WIRE_FINISH_REASON_MAX + 1]; /* the engine's finish reason ("": "length") */
    uint64_t deadline;                           /* monotonic ns by which it must end; 0: none */
    uint64_t ended_at;     /* ended (kept for a repeat): monotonic ns; 0 while held */
    uint64_t resent_at;    /* the last repeat on a client's resend (monotonic ns); 0: none */
    uint8_t resends;       /* repeats on a client's resend so far (at most KVR_WK_RESEND_MAX) */
    bool superseded;       /* ended, then the same key ended here again: out of kept_by, inert */
    kvr_status outcome;    /* ended: its final chunk's code */
    struct kvr_wreq *next; /* ended: the next kept, in the order they ended */
    UT_hash_handle hh;     /* held: by key; the worker owns the item */
    UT_hash_handle hk;     /* ended: by key in kept_by */
};

/* A held request's deadline; stale entries (the request ended) are skipped when they surface. */
struct kvr_wk_deadline {
    uint64_t at;  /* monotonic ns */
    uint64_t key; /* */
};
static inline bool kvr_wk_deadline_less(const struct kvr_wk_deadline *a,
                                        const struct kvr_wk_deadline *b)
{
    return a->at < b->at;
}
KVR_HEAP_DEFINE(kvr_wk_deadlines, struct kvr_wk_deadline, kvr_wk_deadline_less)

/* What $SRV.STATS shows beyond the endpoint's counts. */
struct kvr_wk_counters {
    uint64_t served;         /* requests finished by the engine */
    uint64_t duplicates;     /* forwards dropped: the key was held or ended in the last 60 s */
    uint64_t cancelled;      /* requests ended by a WorkerCancel (held, or remembered first) */
    uint64_t deadlines;      /* requests ended by their deadline */
    uint64_t drain_cut;      /* held requests ended ERR_SHUTDOWN: the drain ran out of time */
    uint64_t early_cancels;  /* cancels remembered for a key not yet here */
    uint64_t late_cancels;   /* cancels for a key that had ended: nothing to do */
    uint64_t bad_cancels;    /* WorkerCancels that did not decode */
    uint64_t bad_heartbeats; /* messages on its own heartbeat subject that did not decode */
    uint64_t repeats;        /* streams repeated after a cut */
    uint64_t rebind_asks;    /* RebindAsks sent after a cut */
    uint64_t rebinds;        /* WorkerRebinds received for a stream kept here */
    uint64_t rebinds_bad;    /* ... that did not decode, or for a key not kept here */
    uint64_t resend_repeats; /* streams repeated for a client's resend (WorkerRebind.repeat) */
    uint64_t resend_refused; /* ... not: not kept here, short of tokens, or repeated < 1 s ago */
    uint64_t engine_errors;  /* requests the engine behind the adapter failed */
    uint64_t dropped;        /* messages not made (out of memory) */
    uint64_t batches;        /* EventBatches sent (--event-batch-ms) */
    uint64_t batched_events; /* the lifecycle events they carried */
};

/* The adapter's figures (adapter.c), for its metrics. */
struct kvr_wk_adapter_stats {
    uint64_t kv_batches;         /* KV-event batches applied */
    uint64_t kv_stored_blocks;   /* blocks announced stored */
    uint64_t kv_removed_blocks;  /* blocks announced removed */
    uint64_t kv_cleared;         /* the engine's AllBlocksCleared */
    uint64_t kv_resets;          /* gaps not filled, engine restarts: cleared here */
    uint64_t kv_skipped_lora;    /* blocks of a LoRA adapter, skipped */
    uint64_t kv_skipped_medium;  /* blocks on another medium than the GPU, skipped */
    uint64_t kv_skipped_extra;   /* blocks with extra_keys (or chained after one), skipped */
    uint64_t kv_skipped_salt;    /* blocks of a Stored with SGLang's cache_salt, skipped */
    uint64_t kv_skipped_group;   /* blocks of a KV cache group not followed, skipped */
    uint64_t kv_bad_block_size;  /* blocks announced at another block size, skipped */
    uint64_t kv_other_rank;      /* batches of another data-parallel rank, skipped */
    uint64_t kv_gaps;            /* sequence gaps seen */
    uint64_t kv_gaps_filled;     /* ... filled from the replay socket */
    uint64_t kv_bad;             /* messages that did not decode */
    uint64_t kv_gap_fill_ns;     /* the last filled gap: from seeing it to delivering past it */
    uint64_t chunks_without_ids; /* engine chunks without token ids */
    uint64_t engine_downs;       /* times the engine stopped answering */
    uint64_t metrics_failed;     /* reads of its /metrics that failed while it answered */
    uint64_t streams;            /* streams open to the engine */
    uint64_t client_cpu_ns;      /* CPU time of the HTTP client's thread */
    bool down;                   /* the engine does not answer now */
    bool no_events;              /* the heartbeat says no_kv_events */
};

struct kvr_worker;

/*
 * The engine behind a worker: the simulated one in this process (sim.c), or a real one behind
 * its OpenAI-compatible API and its KV events (adapter.c). Every op is called under mu. The
 * engine answers through the kvr__worker_* calls below, under mu too.
 */
/* What a backend makes of a request before the worker's mutex is taken (its costly part), for
 * its submit; data is malloc'd, and freed by the worker when submit left it there. */
struct kvr_wk_prep {
    void *data;
    kvr_status st; /* a refusal found meanwhile: submit answers it */
};

struct kvr_wk_backend {
    const char *name;
    /* Without mu, on the thread of the forward q: its costly part into prep (every thread may
     * call it at once; it reads only what is fixed from open on). */
    void (*prepare)(struct kvr_worker *w, const struct kvr_wire_request *q,
                    struct kvr_wk_prep *prep);
    /* Start r (not yet held) for its request q at now, with what prepare made of it: KVR_OK, or
     * why not (r is then freed). It may take prep->data (then sets it NULL). */
    kvr_status (*submit)(struct kvr_worker *w, struct kvr_wreq *r, const struct kvr_wire_request *q,
                         struct kvr_wk_prep *prep, uint64_t now);
    /* Stop key now; nothing more comes for it. */
    void (*cancel)(struct kvr_worker *w, uint64_t key);
    /* The next engine step at now, its duration in ns; 0: nothing to step (the engine thread
     * then only keeps time: deadlines, repeats). */
    uint64_t (*step_begin)(struct kvr_worker *w, uint64_t now);
    void (*step_end)(struct kvr_worker *w, uint64_t now);
    /* Its load for a heartbeat into info: waiting, kv_usage, capacity, approximate, draining. */
    void (*load)(struct kvr_worker *w, struct kvr_worker_info *info);
    /* Stop its threads (none calls in once it returns) and free it. Without mu. */
    void (*free)(struct kvr_worker *w);
};

struct kvr_worker {
    const struct kvr_wk_config *cfg; /* borrowed, must outlive the worker */
    struct kvr_sink sink;            /* where flushed messages go */
    uint64_t instance;               /* random, non-zero: this process among those with its id */
    uint64_t started_ns;             /* Unix ns at init */
    pthread_mutex_t mu;
    pthread_cond_t cv;                 /* work for the engine thread, or stop (monotonic clock) */
    struct kvr_turns turns;            /* batches go out in the order they left mu */
    const struct kvr_wk_backend *be;   /* the engine behind it */
    struct kvr_engine *eng;            /* the simulated engine (sim.c), under mu; NULL else */
    struct kvr_adapter *ad;            /* the adapter (adapter.c); NULL else */
    uint64_t capacity;                 /* the engine's KV pool, blocks (0: unknown), under mu */
    char engine_why[128];              /* why the engine is not ready ("": it is), under mu */
    struct kvr_wreq *reqs;             /* uthash head, under mu */
    uint32_t nreqs;                    /* */
    struct kvr_wk_deadlines deadlines; /* of held requests, under mu */
    struct kvr_recent recent;          /* ended keys and early cancels, under mu */
    struct kvr_outbox out;             /* under mu */
    struct kvr_buf buf;                /* encoding scratch, under mu */
    struct kvr_buf bbuf;               /* the lifecycle events' own, under mu */
    struct kvr_wire_event batch[KVR_WIRE_BATCH_MAX]; /* held for one EventBatch, under mu */
    uint32_t nbatch;                                 /* */
    uint64_t batch_due;                              /* when they go (monotonic ns) */
    struct kvr_reply generate;                       /* its answers and error counts, under mu */
    struct kvr_log_gate cancel_log;                  /* cancel_dropped lines, under mu */
    struct kvr_wk_counters c;                        /* under mu */
    uint64_t event_seq;                              /* KV event sequence number, under mu */
    uint64_t clash_logged;             /* the last other instance logged (older side), under mu */
    _Atomic bool stopping;             /* threads exit; set under mu, read without it */
    bool draining;                     /* no new requests, under mu */
    bool leaving;                      /* heartbeats say draining (before it is), under mu */
    struct kvr_wreq *kept, *kept_tail; /* ended streams, oldest first, under mu */
    struct kvr_wreq *kept_by;          /* the same, by key (hk) */
    uint32_t nkept;                    /* */
    uint64_t kept_tokens;              /* their tokens and text, in 4 bytes (kept_weight) */
    uint64_t cut_at;                   /* a cut's start (monotonic ns), 0: none since the repeat */
    uint64_t repeat_at;                /* when the repeat is due; 0: none (or still cut) */
    uint64_t ask_at;                   /* when the second RebindAsk is due; 0: none */
    uint64_t list_from, list_until;    /* heartbeats list what ended since list_from until then */
    bool cut;                          /* the outgoing connection is down, under mu */
    _Atomic bool clashed;              /* yielded to an older instance: silent; set under mu */
    _Atomic bool beat_wanted;          /* a heartbeat is due: the next release of mu sends it */
    bool serving;                      /* the link took its subscriptions, under mu */
    _Atomic uint64_t engine_ns;        /* the engine loop's last turn (monotonic ns), 0: none;
                                          read without mu (readiness: a stuck engine) */
    _Atomic uint32_t taking;           /* forwards in kvr_worker_on_generate, not yet let go */
    uint32_t (*queued)(void *ctx);     /* forwards waiting in the link's queue (NULL: none), under
                                          mu; heartbeats say both (forwards_waiting) */
    void *queued_ctx;                  /* */
    char subj_kv[256], subj_tokens[256], subj_done[256], subj_hb[256], subj_gen[256];
    char subj_cancel[256], subj_hello[256], subj_ask[256], subj_rebind[256], subj_batch[256];
    char subj_announce[256]; /* "<prefix>.<ns>.worker.announce": every worker's */
};

/* Set up w for cfg (borrowed) publishing through sink; draws the instance. */
kvr_status kvr_worker_init(struct kvr_worker *w, const struct kvr_wk_config *cfg,
                           struct kvr_sink sink);
void kvr_worker_free(struct kvr_worker *w);

/* A WorkerGenerate data[0..len) answered at reply (takes mu; publishes). */
void kvr_worker_on_generate(struct kvr_worker *w, const char *reply, const void *data, size_t len);
/* A WorkerCancel data[0..len) (takes mu; publishes). */
void kvr_worker_on_cancel(struct kvr_worker *w, const void *data, size_t len);
/* A router's WorkerRebind data[0..len) (takes mu): its delivery renewed the right to answer the
 * stream's client; counted. */
void kvr_worker_on_rebind(struct kvr_worker *w, const void *data, size_t len);
/* Someone asks whether this id is taken: answer at reply with the current heartbeat. */
void kvr_worker_on_hello(struct kvr_worker *w, const char *reply);
/* A heartbeat on the worker's own heartbeat subject: another instance under its id is a clash,
 * and the younger yields (logged, then silent and stopping). */
void kvr_worker_on_heartbeat(struct kvr_worker *w, const void *data, size_t len);

/* The clash rule: does the process (started_ns, instance) yield to (other_started_ns,
 * other_instance)? The younger yields; on a tie, the larger instance. */
bool kvr_worker_yields(uint64_t started_ns, uint64_t instance, uint64_t other_started_ns,
                       uint64_t other_instance);
/* It yielded: the caller stops without draining and exits non-zero. */
bool kvr_worker_clashed(struct kvr_worker *w);

/* What is due at now (monotonic ns): end the held requests past their deadline, the repeat after
 * a cut, forget what has been kept long enough, send the lifecycle events held for a batch once
 * due (takes mu; publishes). Returns when the next thing
 * is due, 0 when nothing is. The engine thread does this itself; tests call it with their own now.
 */
uint64_t kvr_worker_tick(struct kvr_worker *w, uint64_t now);

/* The engine thread's loop: step the engine in real time until kvr_worker_stop, waking for
 * deadlines and the repeat as they come due, and at least every KVR_WK_ENGINE_WAKE_NS (a long
 * step too), each turn stamping engine_ns. */
void kvr_worker_run_engine(struct kvr_worker *w);

/* Publish one heartbeat now (its load, the requests it holds, whether it drains, its instance);
 * waits for mu. */
void kvr_worker_heartbeat(struct kvr_worker *w);
/* The heartbeat thread's beat: the same heartbeat, without waiting on mu behind the busy threads:
 * asked for (beat_wanted), then sent by whichever thread releases mu first through
 * kvr__worker_unlock (this one when mu is free: it tries it every millisecond). Returns once it is
 * queued (or the worker stops: then it may be left asked for, and is dropped once the engine is
 * closed, since a heartbeat reads the engine's load). */
void kvr_worker_beat(struct kvr_worker *w);

/* The outgoing connection was cut: the streams open now or ending from now on will be repeated. */
void kvr_worker_on_disconnected(struct kvr_worker *w);
/* It is back: RebindAsks now and half a repeat delay later, the repeat KVR_WK_REPEAT_DELAY_NS from
 * now (publishes). */
void kvr_worker_on_reconnected(struct kvr_worker *w);

/* Take no new requests (the heartbeat says so). */
/* The stop: heartbeats say draining from now on; with refuse, new forwards are refused too (first
 * without: routers stop sending once they hear it, and what they sent meanwhile is served). */
void kvr_worker_set_draining(struct kvr_worker *w, bool refuse);
/* What a drain waits for: the requests still held, and 1 more from a cut of the outgoing
 * connection until its repeat is made (a stream that ended just before the stop or during the cut
 * would lose its final for good if the process left first). */
uint32_t kvr_worker_held(struct kvr_worker *w);
/* End every request still held with ERR_SHUTDOWN (the drain ran out of time): the engine lets it
 * go, its client gets its final chunk, the routers its done event. */
void kvr_worker_cut_held(struct kvr_worker *w);
/* Make the engine thread (and the heartbeat thread's waits) return. */
void kvr_worker_stop(struct kvr_worker *w);
bool kvr_worker_stopping(struct kvr_worker *w); /* without mu */

/* Stop the engine's own threads (the adapter's client, subscriber and poller) and free it: after
 * the link's threads are joined and its handlers waited out, before its connections close, so
 * nothing publishes after.
 * From then on no heartbeat is made (nor a hello answered): a heartbeat reads the engine's load.
 * Idempotent; kvr_worker_free does it too. */
void kvr_worker_close_engine(struct kvr_worker *w);

/* Publish what the outbox holds (takes and releases mu); after a yield, discard it. */
void kvr_worker_flush(struct kvr_worker *w);

/* Inside src/worker only, under mu: release mu (taken by the caller) and publish what the outbox
 * holds, a heartbeat asked for first (kvr_worker_beat). The one way its threads let mu go after
 * changing state: one acquisition per event (the outbox taken out under it). */
void kvr__worker_unlock(struct kvr_worker *w);
/* Under mu: queue the heartbeat if kvr_worker_beat asked for one (presence.c). */
void kvr__worker_beat_if_wanted(struct kvr_worker *w);

/* Inside src/worker only (worker.c, events.c and presence.c), under mu. */
/* Queue w->buf (just encoded with status st) to subject; an encoding failure is counted, and
 * after a yield nothing is queued. The lifecycle events held for a batch go before a message on
 * another of the worker's event subjects. */
void kvr__worker_emit(struct kvr_worker *w, const char *subject, kvr_status st);
/* Request key ended with outcome after tokens streamed: its done event (events.c). */
void kvr__worker_done(struct kvr_worker *w, uint64_t key, kvr_status outcome, uint32_t tokens);
/* Queue the lifecycle events held (--event-batch-ms): one EventBatch, or the event alone. */
void kvr__worker_seal(struct kvr_worker *w);
/* Queue r's stream again, from position 0 (final again when it ended). */
void kvr__worker_repeat(struct kvr_worker *w, const struct kvr_wreq *r);
/* Whether r's kept tokens are every one its chunks carried and its engine made, so a repeat gives
 * the stream whole (not so when memory ran short, or for an engine that gave no token ids). */
static inline bool kvr__worker_whole(const struct kvr_wreq *r)
{
    return r->ntoks == r->produced && r->generated == r->produced;
}
/* Whether r is repeated after the cut that started at cut_at. */
bool kvr__worker_repeats(const struct kvr_wreq *r, uint64_t cut_at);
/* Queue the RebindAsks for the streams the repeat will cover. */
void kvr__worker_ask_rebind(struct kvr_worker *w);

/* The engines' side (sim.c, adapter.c), under mu. */
kvr_status kvr__wk_sim_open(struct kvr_worker *w);     /* sets be and eng */
kvr_status kvr__wk_adapter_open(struct kvr_worker *w); /* sets be and ad, starts its threads */
void kvr__wk_adapter_stats(struct kvr_worker *w, struct kvr_wk_adapter_stats *out);
/* The request held under key; NULL when none. */
struct kvr_wreq *kvr__worker_find(struct kvr_worker *w, uint64_t key);
/* key's prefill is done (its first token comes next): the routers' prefill-done event. */
void kvr__worker_prefill(struct kvr_worker *w, uint64_t key);
/* key took one more KV block for its output: the routers' output-block event. */
void kvr__worker_output_block(struct kvr_worker *w, uint64_t key);
/* r's next n tokens (and ntext bytes of valid UTF-8 text, or none): one chunk to its client,
 * kept for a repeat. */
void kvr__worker_tokens(struct kvr_worker *w, struct kvr_wreq *r, const uint32_t *toks, uint32_t n,
                        const char *text, uint32_t ntext);
/* key finished in the engine (finish: the engine's reason, NULL or "": "length"): its final
 * chunk, its done event. A key not held gets its done event only. */
void kvr__worker_finished(struct kvr_worker *w, uint64_t key, const char *finish);
/* r failed in the engine with st (detail: the engine's words, or NULL): the client's final
 * chunk with the error, the done event. */
void kvr__worker_failed(struct kvr_worker *w, struct kvr_wreq *r, kvr_status st,
                        const char *detail);
/* KV events, split to the wire's caps. */
void kvr__worker_stored(struct kvr_worker *w, const uint64_t *parent, const struct kvr_kv_block *b,
                        size_t n);
void kvr__worker_removed(struct kvr_worker *w, const uint64_t *ids, size_t n);
void kvr__worker_cleared(struct kvr_worker *w);

#endif
