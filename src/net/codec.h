/*
 * The wire codec: protobuf (proto/kvrouter/v1/kvrouter.proto) to plain C and back. Only the codec's
 * own files (codec*.c) include the generated *.pb-c.h; everything else speaks the
 * structs below. Encoders write into a growable kvr_buf. Pure and thread-safe: no shared state
 * (the allocation-failure injection for tests is per thread).
 *
 * One error discipline for every decoder. A decoder returns exactly one of:
 *   KVR_OK             decoded; out holds what the message said, validated.
 *   KVR_ERR_MALFORMED  not a valid message of that type: protobuf-c cannot parse it, or the part
 *                      that says what it is is missing (a KvEvent's event, a Gossip's body, the
 *                      request inside a WorkerGenerate or SelectRequest).
 *   KVR_ERR_TOO_LARGE  over one of the caps below: the message's bytes (checked before protobuf-c
 *                      sees them), a string's length (request id, router id, reply subject, error
 *                      text) or a repeated field's count (blocks, ids, hashes, keys, records).
 *   KVR_ERR_INVALID    well-formed and within the caps, but a value out of range: a zero id or
 *                      key, a cached prefix longer than the prompt, a backwards or too-long seq
 *                      range, an unknown enum value, max_tokens of 0 or over the limit.
 *   KVR_ERR_NOMEM      an allocation failed, protobuf-c's own (it unpacks through an allocator
 *                      that records the failure) or the decoder's copies: the message may be fine.
 * The request decoders (generate, worker generate, select) also return KVR_ERR_EMPTY_PROMPT,
 * KVR_ERR_PROMPT_TOO_LONG (more tokens than lim->max_prompt_tokens, within the byte cap) and
 * KVR_ERR_UNKNOWN_POLICY, which clients see as error codes. Checks run in that order: bytes,
 * framing, counts and lengths, values, then copies; so no field from the wire becomes a loop bound
 * or an allocation size before it is checked. On an error a decoder frees what it copied and
 * leaves the out-struct zeroed, apart from what the request decoders keep to name the error (see
 * kvr_wire_decode_generate); freeing it anyway is harmless.
 */
#ifndef KVR_CODEC_H
#define KVR_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "kvr/router.h"
#include "kvr/status.h"

/* --- caps: what a legitimate message can need; more is KVR_ERR_TOO_LARGE ------------------- */

/* Strings, in bytes (NUL excluded). */
#define KVR_REQUEST_ID_MAX 256 /* a client request id */
/* A router id (Gossip, SyncRequest, a Decision's origin, WorkerGenerate): options hold 255. */
#define KVR_ROUTER_ID_MAX 256
/* A client's reply subject in a Decision: an inbox (_INBOX.<22 chars>.<n>) or any subject. */
#define KVR_REPLY_MAX 1024
/* A GenerateResponse's error text: a kvr_status text (all under 64 bytes). */
#define KVR_ERROR_TEXT_MAX 1024

/*
 * Repeated fields, in items: they become loop bounds and allocation sizes. The block counts allow
 * one prompt's worth: the default 1M-token prompt limit in the default 64-token blocks is 16384
 * blocks; 65536 allows 16-token blocks.
 */
/* blocks in a Stored event: a run of a sequence, split by the worker past this so that applying one
 * holds a router's mutex about a millisecond */
#define KVR_WIRE_STORED_BLOCKS_MAX   4096u
#define KVR_WIRE_DECISION_BLOCKS_MAX 65536u /* block hashes in a Decision: one per prompt block */
/* Ids in a Removed event: one engine step's evictions, split by the worker past this. */
#define KVR_WIRE_REMOVED_IDS_MAX 4096u
/* Request keys in a Heartbeat: the requests one worker holds (it runs max_seqs, 256 by default,
 * and queues the rest); 65536 keys are 640 KB, under NATS's default 1 MB payload. */
#define KVR_WIRE_INFLIGHT_MAX 65536u
/* Keys a Heartbeat lists as ended in its last two intervals: a worker keeps the newest. */
#define KVR_WIRE_ENDED_MAX 16384u
/* Keys in a SyncRequest: a lookup asks for keys a heartbeat listed. */
#define KVR_WIRE_SYNC_KEYS_MAX KVR_WIRE_INFLIGHT_MAX
/* Seqs in a repair range (to_seq - from_seq); more, or a backwards range: KVR_ERR_INVALID. */
#define KVR_WIRE_SYNC_RANGE_MAX 1000000u
/* Decisions, and separately entries, in a SyncPage: a sender cuts a page at ~256 KB or this many
 * records of a kind, so that applying one holds the receiver's mutex about a millisecond. */
#define KVR_WIRE_PAGE_ITEMS_MAX 512u
/* Candidates in a SelectResponse: the router's default max_workers. */
#define KVR_WIRE_CANDIDATES_MAX 65536u
/* Candidates a router lists in a SelectResponse: at ~58 bytes each at most, 4,096 are ~240 KB,
 * under NATS's default 1 MB payload (a list of every worker would not fit past ~18,000). */
#define KVR_WIRE_CANDIDATES_LISTED 4096u
/* Tokens in one GenerateResponse chunk (workers send one): the default max_output_tokens. */
#define KVR_WIRE_RESPONSE_TOKENS_MAX 65536u
/* bytes of text in one GenerateResponse (the text of its tokens) */
#define KVR_WIRE_TEXT_MAX (1u << 20)
/* bytes of an engine's finish reason */
#define KVR_WIRE_FINISH_REASON_MAX 32u

/*
 * Message bytes, checked before protobuf-c sees the message. A varint takes up to 5 bytes for a
 * uint32 and 10 for a uint64 (repeated scalars packed, as proto3 writes them). KVR_WIRE_SLACK is
 * every message's fixed allowance: its ids and strings at their caps, its scalars and length
 * prefixes (under 2 KB in the largest, a Gossip decision), and room for fields a newer version
 * adds.
 */
#define KVR_WIRE_SLACK 4096u
/*
 * The most a WorkerGenerate adds around the client's request it carries: the request's tag and
 * length (6), request_key (11), overlap_blocks and deadline_ms (6 each), and a router id at its
 * cap with its tag and length (3 + KVR_ROUTER_ID_MAX). A router refuses a request longer than
 * what its forward may carry less this.
 */
#define KVR_WIRE_FORWARD_ENVELOPE (KVR_ROUTER_ID_MAX + 32u)
/* A TokensEvent, DoneEvent or WorkerCancel: a few scalars and a router id. */
#define KVR_WIRE_SMALL_EVENT_MAX 1024u
/* A CancelRequest: an id and a reply subject at their caps. */
#define KVR_WIRE_CANCEL_MAX (KVR_REQUEST_ID_MAX + KVR_REPLY_MAX + 64u)
/* A KvEvent: a Stored block is at most 24 bytes (tag, length, two uint64 fields). */
#define KVR_WIRE_KV_MAX (KVR_WIRE_STORED_BLOCKS_MAX * 24u + KVR_WIRE_SLACK)
/* A Heartbeat: its inflight and ended keys, packed uint64s. */
#define KVR_WIRE_HEARTBEAT_MAX ((KVR_WIRE_INFLIGHT_MAX + KVR_WIRE_ENDED_MAX) * 10u + KVR_WIRE_SLACK)
#define KVR_WIRE_REBIND_MAX    16384u /* keys in one RebindAsk */
/* A GenerateResponse: its tokens and its error text. */
#define KVR_WIRE_RESPONSE_MAX                                                                      \
    (KVR_WIRE_RESPONSE_TOKENS_MAX * 5u + KVR_WIRE_TEXT_MAX + KVR_ERROR_TEXT_MAX + KVR_WIRE_SLACK)
/* A SelectResponse: a Candidate is at most 58 bytes. */
#define KVR_WIRE_SELECT_RESPONSE_MAX (KVR_WIRE_CANDIDATES_MAX * 64u + KVR_WIRE_SLACK)
/* A Gossip: one Decision's block hashes, packed uint64s. */
#define KVR_WIRE_GOSSIP_MAX (KVR_WIRE_DECISION_BLOCKS_MAX * 10u + KVR_WIRE_SLACK)
/* A SyncRequest: its keys, packed uint64s. */
#define KVR_WIRE_SYNC_MAX (KVR_WIRE_SYNC_KEYS_MAX * 10u + KVR_WIRE_SLACK)
/* A SyncPage: built at ~256 KB (kvr_page), plus one decision that may overflow it (a Gossip's
 * worth, 640 KB at most); 8 MiB is generous headroom. */
#define KVR_WIRE_PAGE_MAX (8u << 20)

struct kvr_wire_limits {
    uint32_t max_prompt_tokens; /* longer prompts: KVR_ERR_PROMPT_TOO_LONG */
    uint32_t max_output_tokens; /* larger max_tokens: KVR_ERR_MAX_TOKENS_TOO_LARGE */
};

/*
 * The byte cap of a GenerateRequest, WorkerGenerate or SelectRequest under lim: 5 bytes (a uint32
 * varint at most) per token for lim->max_prompt_tokens tokens, plus KVR_WIRE_SLACK for the ids,
 * max_tokens, the overrides and the wrapper's own fields. Saturates at SIZE_MAX.
 */
size_t kvr_wire_request_cap(const struct kvr_wire_limits *lim);

/* A generation request as decoded. Everything is owned; free with kvr_wire_request_free. */
struct kvr_wire_request {
    char *request_id;        /* NUL-terminated, at most KVR_REQUEST_ID_MAX bytes */
    uint32_t *tokens;        /* the prompt */
    uint32_t ntokens;        /* */
    uint32_t max_tokens;     /* */
    struct kvr_overrides ov; /* the policy already parsed */
    uint32_t deadline_ms;    /* 0: none (a WorkerGenerate's: what is left of it) */
    uint64_t got, limit;     /* on a limit error: the value sent and the limit it passed */
    const char *invalid;     /* on KVR_ERR_INVALID: what the protocol does not allow (static) */
};
void kvr_wire_request_free(struct kvr_wire_request *r);

/* The figures of a request decoder's error st into buf ("2000000 tokens, the limit is 1048576"),
 * or "" when it has none. Returns buf. */
const char *kvr_wire_request_why(const struct kvr_wire_request *r, kvr_status st, char *buf,
                                 size_t len);

/*
 * Decode a GenerateRequest. On an error that leaves the request readable (empty or long prompt,
 * unknown policy, max_tokens 0 or over the limit, an override out of range, a WorkerGenerate's
 * zero key), out->request_id is still set so the error can name it, out->got and out->limit hold
 * the figures of a limit passed, and the rest of out is zeroed; the caller frees out in every
 * case. Over kvr_wire_request_cap(lim) bytes: KVR_ERR_TOO_LARGE; a request id over
 * KVR_REQUEST_ID_MAX: KVR_ERR_ID_TOO_LONG (neither with a request id); a request id holding a NUL
 * byte: KVR_ERR_INVALID (out->invalid says so), and its request id empty with this error or any
 * other: the id up to that byte may name another request.
 */
kvr_status kvr_wire_decode_generate(const void *buf, size_t len, const struct kvr_wire_limits *lim,
                                    struct kvr_wire_request *out);
/*
 * A WorkerGenerate: the request plus the router's key and expected overlap (*key and *overlap are
 * set whenever the message parses, else 0). A zero key: KVR_ERR_INVALID; a router id over
 * KVR_ROUTER_ID_MAX: KVR_ERR_TOO_LARGE.
 */
kvr_status kvr_wire_decode_worker_generate(const void *buf, size_t len,
                                           const struct kvr_wire_limits *lim,
                                           struct kvr_wire_request *out, uint64_t *key,
                                           uint32_t *overlap);
/* A SelectRequest. */
kvr_status kvr_wire_decode_select(const void *buf, size_t len, const struct kvr_wire_limits *lim,
                                  struct kvr_wire_request *out, bool *book);

struct kvr_wire_response {
    char *request_id;       /* owned */
    uint32_t ntokens;       /* tokens in this chunk */
    bool final;             /* */
    uint32_t error_code;    /* kvr_status; 0 = none */
    char *error;            /* owned; "" when none */
    uint64_t worker_id;     /* */
    uint32_t cached_tokens; /* */
    uint32_t position;      /* output tokens the stream carried before this chunk */
    char *text;             /* owned; "" when none; ntext bytes (valid UTF-8 from a worker) */
    uint32_t ntext;         /* */
    char finish_reason[KVR_WIRE_FINISH_REASON_MAX + 1]; /* "" when none */
};

/* One GenerateResponse chunk to encode (borrowed strings). */
struct kvr_wire_chunk {
    const char *request_id;    /* NULL: "" */
    const uint32_t *tokens;    /* */
    uint32_t ntokens;          /* */
    uint32_t position;         /* tokens sent before this chunk */
    bool final;                /* */
    kvr_status error;          /* on a final chunk; KVR_OK: finished ("length") */
    const char *detail;        /* NULL, or the error's figures, appended to its text after ": " */
    uint64_t worker_id;        /* */
    uint32_t cached_tokens;    /* */
    const char *text;          /* NULL: none; else ntext bytes of valid UTF-8 */
    uint32_t ntext;            /* at most KVR_WIRE_TEXT_MAX */
    const char *finish_reason; /* NULL: from error ("length", "cancelled", "error"); else the
                                  engine's, on a final chunk without error */
};
kvr_status kvr_wire_encode_chunk(struct kvr_buf *b, const struct kvr_wire_chunk *c);
/* A request id over KVR_REQUEST_ID_MAX, an error text over KVR_ERROR_TEXT_MAX, more than
 * KVR_WIRE_RESPONSE_TOKENS_MAX tokens, a text over KVR_WIRE_TEXT_MAX or a finish reason over
 * KVR_WIRE_FINISH_REASON_MAX: KVR_ERR_TOO_LARGE. */
kvr_status kvr_wire_decode_response(const void *buf, size_t len, struct kvr_wire_response *out);
void kvr_wire_response_free(struct kvr_wire_response *r);

enum kvr_wire_kv_kind { KVR_WIRE_STORED = 1, KVR_WIRE_REMOVED = 2, KVR_WIRE_CLEARED = 3 };

struct kvr_wire_kv {
    uint64_t worker_id;
    uint64_t event_seq;
    enum kvr_wire_kv_kind kind;
    bool has_parent;
    uint64_t parent;
    struct kvr_kv_block *blocks; /* owned, nblocks */
    uint32_t nblocks;
    uint64_t *ids; /* owned, nids (Removed) */
    uint32_t nids;
};
/* More than KVR_WIRE_STORED_BLOCKS_MAX blocks or KVR_WIRE_REMOVED_IDS_MAX ids: KVR_ERR_TOO_LARGE
 * (counted on the wire, before protobuf-c allocates them); no event: KVR_ERR_MALFORMED. */
kvr_status kvr_wire_decode_kv(const void *buf, size_t len, struct kvr_wire_kv *out);
void kvr_wire_kv_free(struct kvr_wire_kv *e);

enum kvr_wire_tokens_kind { KVR_WIRE_PREFILL_DONE = 0, KVR_WIRE_OUTPUT_BLOCK = 1 };
struct kvr_wire_tokens {
    uint64_t worker_id;
    uint64_t key;
    enum kvr_wire_tokens_kind kind;
};
/* An unknown kind: KVR_ERR_INVALID. */
kvr_status kvr_wire_decode_tokens(const void *buf, size_t len, struct kvr_wire_tokens *out);

struct kvr_wire_done {
    uint64_t worker_id;
    uint64_t key;
    uint32_t status;        /* kvr_status: KVR_OK completed */
    uint32_t output_tokens; /* tokens it streamed */
};
kvr_status kvr_wire_decode_done(const void *buf, size_t len, struct kvr_wire_done *out);

/* An EventBatch: a worker's lifecycle events sent together, in the order it emitted them. */
#define KVR_WIRE_BATCH_MAX 256u
/* Its bytes at most: KVR_WIRE_BATCH_MAX events of about 30 bytes each, and the slack. */
#define KVR_WIRE_BATCH_BYTES_MAX (KVR_WIRE_BATCH_MAX * 64u + KVR_WIRE_SLACK)
enum kvr_wire_event_kind { KVR_WIRE_EV_TOKENS = 1, KVR_WIRE_EV_DONE = 2 };
struct kvr_wire_event {
    enum kvr_wire_event_kind kind;
    union {
        struct kvr_wire_tokens tokens; /* KVR_WIRE_EV_TOKENS */
        struct kvr_wire_done done;     /* KVR_WIRE_EV_DONE */
    } u;
};
struct kvr_wire_batch {
    uint64_t worker_id;
    struct kvr_wire_event *ev; /* owned, n */
    uint32_t n;
};
/* Over KVR_WIRE_BATCH_BYTES_MAX bytes or KVR_WIRE_BATCH_MAX events: KVR_ERR_TOO_LARGE (counted on
 * the wire first); an event of no kind, of an unknown tokens kind, or naming another worker than
 * the batch: KVR_ERR_INVALID. Nothing is owned after a failure. */
kvr_status kvr_wire_decode_batch(const void *buf, size_t len, struct kvr_wire_batch *out);
void kvr_wire_batch_free(struct kvr_wire_batch *b);

struct kvr_wire_heartbeat {
    struct kvr_worker_info info; /* id, block size, capacity, waiting, kv usage */
    uint64_t *inflight;          /* owned */
    uint32_t ninflight;
    uint32_t interval_ms;
    bool draining;
    uint64_t instance;         /* random per worker process */
    uint64_t started_ns;       /* its start, Unix ns */
    uint64_t *ended;           /* owned: keys it ended in the last two intervals */
    uint32_t nended;           /* at most KVR_WIRE_ENDED_MAX */
    uint64_t last_event_seq;   /* its last KV event's number, sent or queued (0: none) */
    uint32_t forwards_waiting; /* forwards received, not taken yet: it may hold any it does not
                                  list (0: none, or a worker that does not say) */
};
/* A zero worker id or block size: KVR_ERR_INVALID; more than KVR_WIRE_INFLIGHT_MAX keys in flight
 * or KVR_WIRE_ENDED_MAX ended: KVR_ERR_TOO_LARGE. A kv_usage outside [0, 1] reads as 0. */
kvr_status kvr_wire_decode_heartbeat(const void *buf, size_t len, struct kvr_wire_heartbeat *out);
void kvr_wire_heartbeat_free(struct kvr_wire_heartbeat *h);

/* Encoders: each replaces b's contents with one message. */
kvr_status kvr_wire_encode_generate(struct kvr_buf *b, const char *request_id,
                                    const uint32_t *tokens, uint32_t ntokens, uint32_t max_tokens,
                                    const struct kvr_overrides *ov);
/* Forward a client's GenerateRequest bytes unchanged, wrapped with the router's decision and what
 * is left of its deadline (0: none). */
kvr_status kvr_wire_encode_worker_generate(struct kvr_buf *b, const void *request, size_t len,
                                           uint64_t key, uint32_t overlap, const char *router_id,
                                           uint32_t deadline_ms);

/* A client's CancelRequest: the request id and reply subject of the generate it names. */
struct kvr_wire_cancel {
    char *request_id; /* owned */
    char *reply;      /* owned */
};
kvr_status kvr_wire_encode_cancel(struct kvr_buf *b, const char *request_id, const char *reply);
/* A request id over KVR_REQUEST_ID_MAX: KVR_ERR_ID_TOO_LONG; a reply over KVR_REPLY_MAX:
 * KVR_ERR_REPLY_TOO_LONG; an empty reply: KVR_ERR_NO_REPLY; either holding a NUL byte:
 * KVR_ERR_INVALID. */
kvr_status kvr_wire_decode_cancel(const void *buf, size_t len, struct kvr_wire_cancel *out);
void kvr_wire_cancel_free(struct kvr_wire_cancel *c);

/* A router's WorkerCancel. */
struct kvr_wire_worker_cancel {
    uint64_t key;      /* */
    kvr_status reason; /* KVR_ERR_CANCELLED or KVR_ERR_DEADLINE */
    bool silent;       /* end without a chunk: another worker serves it */
};
kvr_status kvr_wire_encode_worker_cancel(struct kvr_buf *b, const struct kvr_wire_worker_cancel *c,
                                         const char *router_id);
/* A zero key, or a reason other than the two: KVR_ERR_INVALID. */
kvr_status kvr_wire_decode_worker_cancel(const void *buf, size_t len,
                                         struct kvr_wire_worker_cancel *out);
/* A worker's RebindAsk: the keys of the streams it is about to repeat after a cut. */
struct kvr_wire_rebind_ask {
    uint64_t worker_id;
    uint64_t *keys; /* owned when decoded */
    uint32_t nkeys; /* at most KVR_WIRE_REBIND_MAX */
};
kvr_status kvr_wire_encode_rebind_ask(struct kvr_buf *b, const struct kvr_wire_rebind_ask *r);
/* A zero worker id: KVR_ERR_INVALID; more than KVR_WIRE_REBIND_MAX keys: KVR_ERR_TOO_LARGE. */
kvr_status kvr_wire_decode_rebind_ask(const void *buf, size_t len, struct kvr_wire_rebind_ask *out);
void kvr_wire_rebind_ask_free(struct kvr_wire_rebind_ask *r);

/* A router's WorkerRebind of key (published with the client's reply subject as its reply); repeat:
 * the client resent it, publish the stream again. */
kvr_status kvr_wire_encode_worker_rebind(struct kvr_buf *b, uint64_t key, const char *router_id,
                                         bool repeat);
/* A zero key: KVR_ERR_INVALID. */
kvr_status kvr_wire_decode_worker_rebind(const void *buf, size_t len, uint64_t *key, bool *repeat);

kvr_status kvr_wire_encode_select_request(struct kvr_buf *b, const void *request, size_t len,
                                          bool book);
/* key: the booking's (0 when not booked); router_id: who answers; detail: NULL or the error's
 * figures. The answer lists at most KVR_WIRE_CANDIDATES_LISTED of d's candidates (the chosen
 * worker, then the cheapest, or the first in registry order when d has no costs) and says how
 * many were weighed. */
kvr_status kvr_wire_encode_select_response(struct kvr_buf *b, const struct kvr_decision *d,
                                           uint64_t key, kvr_status error, const char *router_id,
                                           const char *detail);
/* The out-params are set only on KVR_OK; more than KVR_WIRE_CANDIDATES_MAX candidates (counted on
 * the wire): KVR_ERR_TOO_LARGE. */
kvr_status kvr_wire_decode_select_response(const void *buf, size_t len, uint64_t *worker_id,
                                           uint32_t *overlap, uint32_t *ncandidates,
                                           uint32_t *error_code, uint64_t *key);
kvr_status kvr_wire_encode_stored(struct kvr_buf *b, uint64_t worker_id, uint64_t seq,
                                  const uint64_t *parent, const struct kvr_kv_block *blocks,
                                  size_t n);
kvr_status kvr_wire_encode_removed(struct kvr_buf *b, uint64_t worker_id, uint64_t seq,
                                   const uint64_t *ids, size_t n);
kvr_status kvr_wire_encode_cleared(struct kvr_buf *b, uint64_t worker_id, uint64_t seq);
kvr_status kvr_wire_encode_tokens(struct kvr_buf *b, uint64_t worker_id, uint64_t key,
                                  enum kvr_wire_tokens_kind kind);
kvr_status kvr_wire_encode_done(struct kvr_buf *b, uint64_t worker_id, uint64_t key,
                                uint32_t status, uint32_t output_tokens);
/* ev[0..n) (1 <= n <= KVR_WIRE_BATCH_MAX) as one EventBatch of worker_id (each event's own
 * worker_id is written as worker_id). */
kvr_status kvr_wire_encode_batch(struct kvr_buf *b, uint64_t worker_id,
                                 const struct kvr_wire_event *ev, uint32_t n);
kvr_status kvr_wire_encode_heartbeat(struct kvr_buf *b, const struct kvr_wire_heartbeat *h);

/* --- router replicas ----------------------------------------------------------------------- */

/* A decision as replicas share it; everything owned (free with kvr_wire_decision_free). */
struct kvr_wire_decision {
    struct kvr_request_record rec; /* rec.block_hashes is owned here */
    char *reply;                   /* "" for booked selects */
    char *request_id;              /* */
    char *origin;                  /* the router that answers the client */
    uint64_t decided_ns;           /* when the origin decided, Unix ns */
    uint32_t placement;            /* the origin's placements of it before this one */
};
void kvr_wire_decision_free(struct kvr_wire_decision *d);

/* A request queued at its origin (a Queued notice). */
struct kvr_wire_queued {
    char *reply;         /* the client's reply subject (owned; never empty) */
    char *request_id;    /* the client's id (owned) */
    uint64_t decided_ns; /* when the origin took it, Unix ns */
    uint32_t wait_ms;    /* the longest it may stay queued there */
    bool released;       /* it left the origin's queue unplaced */
    uint32_t error_code; /* released: its client's answer (a kvr_status) */
};

enum kvr_wire_gossip_kind {
    KVR_WIRE_GOSSIP_DECISION = 1,
    KVR_WIRE_GOSSIP_HELLO = 2,
    KVR_WIRE_GOSSIP_QUEUED = 3
};

struct kvr_wire_gossip {
    char *router_id; /* owned */
    uint64_t epoch;
    uint64_t seq;
    enum kvr_wire_gossip_kind kind;
    struct kvr_wire_decision d; /* decisions */
    bool serving;               /* hellos */
    struct kvr_wire_queued q;   /* queued notices */
};
void kvr_wire_gossip_free(struct kvr_wire_gossip *g);

kvr_status kvr_wire_encode_gossip_decision(struct kvr_buf *b, const char *router_id, uint64_t epoch,
                                           uint64_t seq, const struct kvr_request_record *rec,
                                           const char *reply, const char *request_id,
                                           const char *origin, uint64_t decided_ns,
                                           uint32_t placement);
kvr_status kvr_wire_encode_gossip_hello(struct kvr_buf *b, const char *router_id, uint64_t epoch,
                                        uint64_t seq, bool serving);
kvr_status kvr_wire_encode_gossip_queued(struct kvr_buf *b, const char *router_id, uint64_t epoch,
                                         uint64_t seq, const struct kvr_wire_queued *q);
/*
 * A router id that is empty (KVR_ERR_INVALID) or over KVR_ROUTER_ID_MAX (KVR_ERR_TOO_LARGE); a
 * decision naming no request or worker, or a cached prefix longer than its blocks
 * (KVR_ERR_INVALID), over KVR_WIRE_DECISION_BLOCKS_MAX hashes or with a reply, request id or
 * origin over its cap (KVR_ERR_TOO_LARGE); a queued notice without a reply subject
 * (KVR_ERR_INVALID) or with a reply or request id over its cap (KVR_ERR_TOO_LARGE); no body:
 * KVR_ERR_MALFORMED.
 */
kvr_status kvr_wire_decode_gossip(const void *buf, size_t len, struct kvr_wire_gossip *out);

struct kvr_wire_sync {
    char *router_id; /* owned */
    bool full;
    uint64_t *keys; /* owned */
    uint32_t nkeys;
    uint64_t from_seq, to_seq, epoch;
    uint64_t token; /* echoed in the pages */
};
void kvr_wire_sync_free(struct kvr_wire_sync *s);
kvr_status kvr_wire_encode_sync(struct kvr_buf *b, const struct kvr_wire_sync *s);
/* A router id over KVR_ROUTER_ID_MAX or more than KVR_WIRE_SYNC_KEYS_MAX keys: KVR_ERR_TOO_LARGE;
 * to_seq - from_seq over KVR_WIRE_SYNC_RANGE_MAX (a backwards range included): KVR_ERR_INVALID. */
kvr_status kvr_wire_decode_sync(const void *buf, size_t len, struct kvr_wire_sync *out);

/* Builds SyncPage messages of bounded size. */
struct kvr_page {
    void *decisions; /* internal arrays, owned */
    void *entries;   /* */
    uint32_t ndecisions, nentries, capd, cape;
    size_t approx;          /* bytes so far, roughly */
    struct kvr_buf strings; /* copies of strings (offsets), owned */
    bool index_partial;     /* every page encoded says the sender's index has holes */
};
void kvr_page_init(struct kvr_page *p);
void kvr_page_free(struct kvr_page *p);
/* Add a record (copied): KVR_ERR_NOMEM, or KVR_ERR_FULL past 2^31 records of a kind. */
kvr_status kvr_page_add_decision(struct kvr_page *p, const struct kvr_request_record *rec,
                                 const char *reply, const char *request_id, const char *origin,
                                 uint64_t decided_ns, uint32_t placement);
kvr_status kvr_page_add_entry(struct kvr_page *p, const struct kvr_index_record *rec);
/* Encode the page into b (last: the final page) and empty it. */
kvr_status kvr_page_encode(struct kvr_page *p, struct kvr_buf *b, bool last, uint64_t token);

/* What a SyncPage says of itself. */
struct kvr_wire_page_head {
    bool last;          /* the final page of its answer */
    uint64_t token;     /* the request's */
    bool index_partial; /* the sender's index has holes (struct kvr_page) */
};

/*
 * Decode a SyncPage: every record is checked first (decisions as in a Gossip; an entry naming no
 * worker, or whose TTL overflows in nanoseconds, is KVR_ERR_INVALID; more than
 * KVR_WIRE_PAGE_ITEMS_MAX decisions or entries is KVR_ERR_TOO_LARGE, counted on the wire). Only
 * when the whole page is good is *head set and the callbacks called, for each decision and entry
 * (borrowed for the call; a NULL callback skips them); on an error no callback runs and *head is
 * zeroed. The callbacks see views into the unpacked page: the decoder allocates nothing while it
 * calls them, so it cannot fail half-way through a page.
 */
kvr_status kvr_wire_decode_page(const void *buf, size_t len,
                                void (*on_decision)(void *ctx, const struct kvr_wire_decision *d),
                                void (*on_entry)(void *ctx, const struct kvr_index_record *e),
                                void *ctx, struct kvr_wire_page_head *head);

/*
 * Testing: make the decoders' n-th allocation from now on this thread fail (0: the next one), once;
 * -1 disarms. Counts protobuf-c's allocations and the decoders' own copies. Returns the countdown
 * it replaces: -1 if the armed failure happened (or none was armed), else the allocations that
 * were still to go.
 */
long kvr_wire_fail_alloc(long n);

#endif
