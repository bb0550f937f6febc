/*
 * kvevents: the engines' KV-cache event batches (vLLM, SGLang), msgpack, decoded and encoded.
 *
 * A batch is what one ZeroMQ message carries as its payload (kvzmq.h carries the frames): a
 * msgpack array [ts, events, data_parallel_rank?]; each event is either a positional array whose
 * first element is its tag ("BlockStored", "BlockRemoved", "AllBlocksCleared"), as msgspec's
 * array_like structs encode it, or (vLLM since PR #42892, SGLang since #37482) a map with the tag
 * under "type" and the fields by name. Layouts accepted by the decoder (docs/engines.md):
 *   - batch [ts, events] or [ts, events, dp_rank|nil], or more trailing elements (ignored); a map
 *     {"ts", "events", "data_parallel_rank"?} as well; ts a float or an integer;
 *   - ["BlockStored", block_hashes, parent|nil, token_ids, block_size, lora_id|nil, medium|nil,
 *     lora_name, extra_keys, group_idx, kv_cache_spec_kind, ...] (vLLM's BlockStored field order)
 *     where every element after the tag may be left out from the end (msgspec omit_defaults)
 *     and further elements (kv_cache_spec_sliding_window, ...) are ignored; the older shape
 *     named its 5th element num_toks_per_block (same place, same meaning); at position 7, where
 *     vLLM has lora_name (a string or nil, not read), SGLang's salted BlockStored
 *     (BlockStoredWithMetadata, sglang PR 30827) has a metadata map {"cache_salt": str,
 *     "session_id"?: str};
 *   - ["BlockRemoved", block_hashes, medium|nil, group_idx, ...], ["AllBlocksCleared", ...]
 *     (vLLM names a group's kind on its BlockStored only: none is read from a Removed array);
 *   - the same as maps: keys "type", "block_hashes", "parent_block_hash", "token_ids",
 *     "block_size" (or "num_toks_per_block"), "lora_id", "medium", "extra_keys", "group_idx",
 *     "kv_cache_spec_kind" (a Removed's too, should an engine send it), a Stored's
 *     "cache_salt" (SGLang since PR 37482) and "metadata" (a map as at position 7); unknown keys
 *     are ignored, absent keys take the defaults below;
 *   - an event with any other tag is skipped and counted (batch.unknown_events), not an error.
 * Defaults when left out: hashes and tokens empty, parent none, lora none, medium "", group none,
 * kind "", extra_keys none, no salt, block_size = ntokens / nhashes (0 when both are 0).
 *
 * Block hashes (and a parent hash) are integers or byte strings on the wire, mapped to one u64
 * engine id (struct kvr_kvev_event.hashes):
 *   - an integer, positive up to 2^64-1 or negative down to -2^63: its 64 bits (two's
 *     complement), so the signed and the unsigned encoding of one hash give the same id;
 *   - a byte string (msgpack bin or, leniently, str) of 1..64 bytes: kvr_kvev_id_of_bytes(), the
 *     XXH3-64 (seed 1337, kvr_hash_bytes) of its bytes, whatever its length. Stable across calls,
 *     processes and machines; an integer and a byte string never name the same block on purpose.
 *
 * Checks (anything failing is KVR_ERR_MALFORMED, nothing leaked, *out left zeroed):
 *   - token ids are integers 0..2^32-1; block_size, lora_id and group_idx integers (or nil where
 *     the field is optional); extra_keys nil or an array, one entry per block, each nil (tokens
 *     alone) or anything else (keyed by more: has_extra, nplain; a short list's missing entries
 *     count as keyed); medium a string or nil (kept up to KVR_KVEV_MEDIUM_CAP - 1 bytes,
 *     longer ones truncated, never an error, every byte that is not printable ASCII kept as '?',
 *     a NUL too, so "GPU\0x" is not "GPU"); kv_cache_spec_kind a string or nil (the same, up
 *     to KVR_KVEV_SPEC_CAP - 1 bytes); a Stored's position 7 nil, a string (vLLM's lora_name) or
 *     a map, "metadata" nil or a map, and a "cache_salt" there or among a map event's fields nil
 *     (none) or a string (has_salt; its text is never kept);
 *   - a Stored event's token count must be exactly nhashes * block_size (vLLM and SGLang only
 *     ever store full blocks): anything else makes the whole batch malformed, because an index
 *     built from mis-cut blocks is worse than a batch counted as bad;
 *   - block_size 0 is allowed only with no hashes and no tokens;
 *   - a byte-string hash of 0 or more than 64 bytes, a float hash, a nested array: malformed;
 *   - the msgpack itself: complete, no trailing bytes, nesting at most 16 deep, every declared
 *     array/map length no larger than the bytes left, and no more objects than a batch within
 *     the limits below holds (checked before msgpack-c allocates: KVR_ERR_TOO_LARGE).
 * Limits (caller-given, struct kvr_kvev_limits; a zero field takes its default): more events,
 * hashes (summed over the batch's events, parents not counted) or tokens (summed) than the limit
 * is KVR_ERR_TOO_LARGE; so is an input longer than max_bytes.
 *
 * Pure C, no I/O, no global state: every function is thread-safe on distinct batches.
 */
#ifndef KVR_KVEVENTS_H
#define KVR_KVEVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "kvr/status.h"

/* A batch at the limits on events, hashes and tokens takes about 10 MB (a million 5-byte token
 * ids, 65,536 hashes of 66 bytes): the default bound on bytes leaves it room, no more. */
#define KVR_KVEV_MAX_EVENTS 4096u       /* default events per batch */
#define KVR_KVEV_MAX_HASHES 65536u      /* default block hashes per batch (all events) */
#define KVR_KVEV_MAX_TOKENS 1048576u    /* default token ids per batch (all events) */
#define KVR_KVEV_MAX_BYTES  (16u << 20) /* default largest payload, bytes */
#define KVR_KVEV_MEDIUM_CAP 32u         /* medium text kept, with its NUL */
#define KVR_KVEV_SPEC_CAP   32u         /* kv_cache_spec_kind text kept, with its NUL */
#define KVR_KVEV_DIGEST_LEN 32u         /* bytes of the encoder's byte-string hashes */

/* Caller-given bounds of one decode; 0 in a field means its KVR_KVEV_MAX_* default. */
struct kvr_kvev_limits {
    uint32_t max_events; /* events in a batch, unknown ones included */
    uint32_t max_hashes; /* block hashes summed over the batch */
    uint32_t max_tokens; /* token ids summed over the batch */
    size_t max_bytes;    /* payload length */
};

enum kvr_kvev_kind {
    KVR_KVEV_STORED = 1,  /* blocks entered the cache */
    KVR_KVEV_REMOVED = 2, /* blocks left the cache */
    KVR_KVEV_CLEARED = 3, /* the whole cache was dropped */
};

struct kvr_kvev_event {
    enum kvr_kvev_kind kind;
    uint64_t *hashes;    /* nhashes engine ids in wire order; NULL when 0 */
    uint32_t nhashes;    /* number of blocks */
    bool has_parent;     /* Stored: the block before the first is known */
    uint64_t parent;     /* Stored: its engine id, when has_parent */
    uint32_t *tokens;    /* Stored: ntokens token ids, all blocks concatenated; NULL when 0 */
    uint32_t ntokens;    /* Stored: nhashes * block_size */
    uint32_t block_size; /* Stored: tokens per block as the engine gave it */
    bool has_lora;       /* Stored: lora_id was an integer (not nil, not absent) */
    int64_t lora_id;     /* Stored: when has_lora */
    bool has_extra;      /* Stored: a block has extra_keys (multimodal ids, LoRA name,
                            cache_salt, prompt embeds): its hash is not of its tokens alone */
    uint32_t nplain;     /* Stored, when has_extra: the blocks before the first with them */
    bool has_salt;       /* Stored: SGLang's cache_salt was given (a string, "" too): every block
                            is keyed by it, not by its tokens alone (kvr_kvev_encode writes none) */
    bool has_group;      /* Stored, Removed: group_idx was an integer: the KV cache group
                            (vLLM: one per kind of layer of a hybrid model) */
    int64_t group_idx;   /* when has_group */
    char medium[KVR_KVEV_MEDIUM_CAP];  /* Stored, Removed: "GPU", "CPU", ... (printable ASCII);
                                          "" when nil/absent */
    char spec_kind[KVR_KVEV_SPEC_CAP]; /* Stored (a map Removed): the group's kv_cache_spec_kind,
                                          "full_attention", "sliding_window", "mamba", ...
                                          (printable ASCII); "" when nil/absent */
};

/* Where the decoder met the layouts (bits of struct kvr_kvev_batch.seen), for stats and logs. */
#define KVR_KVEV_SEEN_MAP_EVENTS 0x1u /* at least one event was a map */
#define KVR_KVEV_SEEN_BYTES_HASH 0x2u /* at least one hash was a byte string */
#define KVR_KVEV_SEEN_NEG_HASH   0x4u /* at least one hash was a negative integer */
#define KVR_KVEV_SEEN_MAP_BATCH  0x8u /* the batch itself was a map */

/*
 * A batch. Filled by kvr_kvev_decode (which owns every array: free with kvr_kvev_batch_free), or
 * by a caller for kvr_kvev_encode (which only reads events[0..nevents) and the fields they point
 * to; such a batch's arrays are the caller's, and it must not be given to kvr_kvev_batch_free
 * unless they were malloc'ed the way the decoder does: events, hash_store and token_store).
 */
struct kvr_kvev_batch {
    double ts;                     /* engine's time, seconds since the epoch */
    bool has_dp_rank;              /* a data_parallel_rank was given (not nil, not absent) */
    int64_t dp_rank;               /* when has_dp_rank */
    struct kvr_kvev_event *events; /* nevents, in wire order, unknown tags left out (owned) */
    uint32_t nevents;              /* known events kept */
    uint32_t unknown_events;       /* events skipped for an unknown tag */
    uint32_t seen;                 /* KVR_KVEV_SEEN_* bits */
    uint64_t *hash_store;          /* decoder: every event's hashes, one array (owned) */
    uint32_t *token_store;         /* decoder: every event's tokens, one array (owned) */
};

/*
 * Decode one payload into *out (overwritten; need not be initialised; on any error it is left
 * zeroed with nothing allocated). data is borrowed for the call; lim may be NULL (defaults).
 * KVR_OK, KVR_ERR_MALFORMED, KVR_ERR_TOO_LARGE, KVR_ERR_NOMEM, KVR_ERR_INVALID (NULL out, or
 * NULL data with len > 0).
 */
kvr_status kvr_kvev_decode(const void *data, size_t len, const struct kvr_kvev_limits *lim,
                           struct kvr_kvev_batch *out);

/* Free what kvr_kvev_decode allocated and zero *b. NULL or a zeroed batch is fine. */
void kvr_kvev_batch_free(struct kvr_kvev_batch *b);

/* The engine id of a byte-string hash: XXH3-64, seed 1337, of data[0..len). Borrowed. */
uint64_t kvr_kvev_id_of_bytes(const void *data, size_t len);

/*
 * The encoder's byte-string form of an id (KVR_KVEV_HASH_BYTES32): 32 bytes, the id big-endian
 * in bytes 0..7, then its bitwise complement big-endian in 8..15, then the id again and its
 * complement (24..31), a stand-in for a 32-byte digest. Decoding maps it to
 * kvr_kvev_id_of_bytes(out, 32), never back to id: use kvr_kvev_id_of_digest(id) to know it.
 */
void kvr_kvev_digest_of(uint64_t id, uint8_t out[KVR_KVEV_DIGEST_LEN]);

/* The id the decoder gives to kvr_kvev_digest_of(id): kvr_kvev_id_of_bytes of those 32 bytes. */
uint64_t kvr_kvev_id_of_digest(uint64_t id);

enum kvr_kvev_hash_form {
    KVR_KVEV_HASH_UINT = 0,    /* msgpack unsigned integers (vLLM before byte hashes) */
    KVR_KVEV_HASH_INT = 1,     /* msgpack signed: ids >= 2^63 as negative int64 (Python hash()) */
    KVR_KVEV_HASH_BYTES32 = 2, /* 32-byte bin strings, kvr_kvev_digest_of (newer vLLM) */
};

enum kvr_kvev_layout {
    KVR_KVEV_LAYOUT_NEW = 0, /* arrays: Stored [tag, hashes, parent, tokens, block_size, lora,
                                medium], Removed [tag, hashes, medium] */
    KVR_KVEV_LAYOUT_OLD = 1, /* arrays: Stored [tag, hashes, parent, tokens, num_toks_per_block,
                                lora], Removed [tag, hashes]: no medium */
    KVR_KVEV_LAYOUT_MAP = 2, /* maps (current vLLM): {"type", "block_hashes",
                                "parent_block_hash", "token_ids", "block_size", "lora_id",
                                "medium", "lora_name": nil, "group_idx" when has_group,
                                "kv_cache_spec_kind" when spec_kind is not ""},
                                Removed {"type", "block_hashes", "medium", "group_idx"?,
                                "kv_cache_spec_kind"?},
                                Cleared {"type"}; the batch stays an array */
};

/* How kvr_kvev_encode writes a batch (the engine stand-in picks one to play a vLLM version). */
struct kvr_kvev_encoding {
    enum kvr_kvev_hash_form hashes; /* block and parent hashes */
    enum kvr_kvev_layout layout;    /* event shape */
    bool dp_rank;                   /* append data_parallel_rank (b->dp_rank, nil unless
                                       b->has_dp_rank): [ts, events, rank] instead of [ts, events] */
};

/*
 * Encode *b into out (its contents replaced). b is borrowed: events[0..nevents) and what they
 * point to; unknown_events, seen, hash_store and token_store are not read. how NULL means
 * {UINT, NEW, dp_rank false}. A nil parent when !has_parent, nil lora when !has_lora, nil medium
 * when medium is "" (an old layout writes no medium at all). The Stored token count is not
 * checked (a test can write a mis-cut event on purpose). KVR_OK, KVR_ERR_NOMEM, KVR_ERR_INVALID
 * (NULL out or b, nevents > 0 with NULL events, nhashes or a Stored's ntokens > 0 with a NULL
 * array, an unknown kind, form or layout).
 */
kvr_status kvr_kvev_encode(struct kvr_buf *out, const struct kvr_kvev_batch *b,
                           const struct kvr_kvev_encoding *how);

#endif
