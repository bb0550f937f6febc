/*
 * The wire codec: protobuf (proto/kvrouter/v1/kvrouter.proto) to plain C and back. This is the
 * only file that includes the generated *.pb-c.h; everything else speaks the structs below.
 * Decoders validate what they decode (sizes, ids, policy names) and report a kvr_status: a
 * malformed or oversized message is an error value, never a crash. Encoders write into a
 * growable kvr_buf. Pure and thread-safe (no shared state).
 */
#ifndef KVR_CODEC_H
#define KVR_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "kvr/router.h"
#include "kvr/status.h"

#define KVR_REQUEST_ID_MAX 256 /* bytes of a client request id */

struct kvr_wire_limits {
    uint32_t max_prompt_tokens; /* longer prompts: KVR_ERR_PROMPT_TOO_LONG */
    uint32_t max_output_tokens; /* larger max_tokens: KVR_ERR_INVALID */
};

/* A generation request as decoded. Everything is owned; free with kvr_wire_request_free. */
struct kvr_wire_request {
    char *request_id;        /* NUL-terminated, at most KVR_REQUEST_ID_MAX bytes */
    uint32_t *tokens;        /* the prompt */
    uint32_t ntokens;        /* */
    uint32_t max_tokens;     /* */
    struct kvr_overrides ov; /* the policy already parsed */
};
void kvr_wire_request_free(struct kvr_wire_request *r);

/*
 * Decode a GenerateRequest. On an error that leaves the request readable (empty or long prompt,
 * unknown policy, bad limits), out->request_id is still set so the error can name it; the caller
 * frees out in every case.
 */
kvr_status kvr_wire_decode_generate(const void *buf, size_t len, const struct kvr_wire_limits *lim,
                                    struct kvr_wire_request *out);
/* A WorkerGenerate: the request plus the router's key and expected overlap. */
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
};
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
kvr_status kvr_wire_decode_kv(const void *buf, size_t len, struct kvr_wire_kv *out);
void kvr_wire_kv_free(struct kvr_wire_kv *e);

enum kvr_wire_tokens_kind { KVR_WIRE_PREFILL_DONE = 0, KVR_WIRE_OUTPUT_BLOCK = 1 };
struct kvr_wire_tokens {
    uint64_t worker_id;
    uint64_t key;
    enum kvr_wire_tokens_kind kind;
};
kvr_status kvr_wire_decode_tokens(const void *buf, size_t len, struct kvr_wire_tokens *out);

struct kvr_wire_done {
    uint64_t worker_id;
    uint64_t key;
    uint32_t status;
};
kvr_status kvr_wire_decode_done(const void *buf, size_t len, struct kvr_wire_done *out);

struct kvr_wire_heartbeat {
    struct kvr_worker_info info; /* id, block size, capacity, waiting, kv usage */
    uint64_t *inflight;          /* owned */
    uint32_t ninflight;
    uint32_t interval_ms;
    bool draining;
};
kvr_status kvr_wire_decode_heartbeat(const void *buf, size_t len, struct kvr_wire_heartbeat *out);
void kvr_wire_heartbeat_free(struct kvr_wire_heartbeat *h);

/* Encoders: each replaces b's contents with one message. */
kvr_status kvr_wire_encode_generate(struct kvr_buf *b, const char *request_id,
                                    const uint32_t *tokens, uint32_t ntokens, uint32_t max_tokens,
                                    const struct kvr_overrides *ov);
kvr_status kvr_wire_encode_response(struct kvr_buf *b, const char *request_id,
                                    const uint32_t *tokens, uint32_t ntokens, bool final,
                                    kvr_status error, uint64_t worker_id, uint32_t cached_tokens);
/* Forward a client's GenerateRequest bytes unchanged, wrapped with the router's decision. */
kvr_status kvr_wire_encode_worker_generate(struct kvr_buf *b, const void *request, size_t len,
                                           uint64_t key, uint32_t overlap, const char *router_id);
kvr_status kvr_wire_encode_select_request(struct kvr_buf *b, const void *request, size_t len,
                                          bool book);
kvr_status kvr_wire_encode_select_response(struct kvr_buf *b, const struct kvr_decision *d,
                                           uint64_t key, kvr_status error);
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
                                uint32_t status);
kvr_status kvr_wire_encode_heartbeat(struct kvr_buf *b, const struct kvr_wire_heartbeat *h);

/* --- router replicas ----------------------------------------------------------------------- */

/* A decision as replicas share it; everything owned (free with kvr_wire_decision_free). */
struct kvr_wire_decision {
    struct kvr_request_record rec; /* rec.block_hashes is owned here */
    char *reply;                   /* "" for booked selects */
    char *request_id;              /* */
    char *origin;                  /* the router that answers the client */
};
void kvr_wire_decision_free(struct kvr_wire_decision *d);

enum kvr_wire_gossip_kind { KVR_WIRE_GOSSIP_DECISION = 1, KVR_WIRE_GOSSIP_HELLO = 2 };

struct kvr_wire_gossip {
    char *router_id; /* owned */
    uint64_t epoch;
    uint64_t seq;
    enum kvr_wire_gossip_kind kind;
    struct kvr_wire_decision d; /* decisions */
    bool serving;               /* hellos */
};
void kvr_wire_gossip_free(struct kvr_wire_gossip *g);

kvr_status kvr_wire_encode_gossip_decision(struct kvr_buf *b, const char *router_id, uint64_t epoch,
                                           uint64_t seq, const struct kvr_request_record *rec,
                                           const char *reply, const char *request_id,
                                           const char *origin);
kvr_status kvr_wire_encode_gossip_hello(struct kvr_buf *b, const char *router_id, uint64_t epoch,
                                        uint64_t seq, bool serving);
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
kvr_status kvr_wire_decode_sync(const void *buf, size_t len, struct kvr_wire_sync *out);

/* Builds SyncPage messages of bounded size. */
struct kvr_page {
    void *decisions; /* internal arrays, owned */
    void *entries;   /* */
    uint32_t ndecisions, nentries, capd, cape;
    size_t approx;          /* bytes so far, roughly */
    struct kvr_buf strings; /* copies of strings (offsets), owned */
};
void kvr_page_init(struct kvr_page *p);
void kvr_page_free(struct kvr_page *p);
kvr_status kvr_page_add_decision(struct kvr_page *p, const struct kvr_request_record *rec,
                                 const char *reply, const char *request_id, const char *origin);
kvr_status kvr_page_add_entry(struct kvr_page *p, const struct kvr_index_record *rec);
/* Encode the page into b (last: the final page) and empty it. */
kvr_status kvr_page_encode(struct kvr_page *p, struct kvr_buf *b, bool last, uint64_t token);

/*
 * Decode a SyncPage: *last and *token first, then the callbacks for each decision and entry
 * (borrowed for the call; a NULL callback skips them).
 */
kvr_status kvr_wire_decode_page(const void *buf, size_t len,
                                void (*on_decision)(void *ctx, const struct kvr_wire_decision *d),
                                void (*on_entry)(void *ctx, const struct kvr_index_record *e),
                                void *ctx, bool *last, uint64_t *token);

#endif
