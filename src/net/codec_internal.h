/*
 * What the codec's own files (codec.c, codec_events.c, codec_fleet.c, codec_select.c) share and
 * nothing else includes: the allocator protobuf-c unpacks with, which records a failed allocation
 * so that a decoder can tell out-of-memory from malformed input; the allocation helpers every
 * decoder copies with (all of them honour kvr_wire_fail_alloc); a wire-level count of repeated
 * fields, so a decoder can refuse over-many items before protobuf-c allocates them; and the pack
 * helper of the encoders. Pure and thread-safe, like the codec.
 */
#ifndef KVR_CODEC_INTERNAL_H
#define KVR_CODEC_INTERNAL_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "kvr/status.h"

/* One per unpack: kvr_codec_unpack sets it up; pass &pc to the type's *_free_unpacked. */
struct kvr_codec_alloc {
    ProtobufCAllocator pc; /* allocates through kvr_codec_array, frees with free() */
    bool failed;           /* an allocation failed */
};

/*
 * The one way a decoder unpacks (after its size cap): a message of type d from buf[0..len)
 * through a's recording allocator (a is initialised here; free the message with
 * protobuf_c_message_free_unpacked or the type's own free, passing &a->pc). NULL on failure, with
 * *st KVR_ERR_NOMEM if an allocation failed, else KVR_ERR_MALFORMED.
 */
void *kvr_codec_unpack(struct kvr_codec_alloc *a, const ProtobufCMessageDescriptor *d,
                       const void *buf, size_t len, kvr_status *st);

/* What a decoder with a repeated submessage refuses before protobuf-c allocates anything: over
 * max_bytes, or more than max_items occurrences of field (or of sub inside field, as
 * kvr_codec_count counts them). */
struct kvr_codec_caps {
    size_t max_bytes;
    uint32_t field, sub;
    size_t max_items;
};

/* kvr_codec_unpack after those caps: NULL with *st KVR_ERR_TOO_LARGE past one of them, or
 * KVR_ERR_MALFORMED when the framing is broken. */
void *kvr_codec_unpack_capped(struct kvr_codec_alloc *a, const ProtobufCMessageDescriptor *d,
                              const void *buf, size_t len, const struct kvr_codec_caps *caps,
                              kvr_status *st);

/* n items of size bytes (at least one byte, so NULL always means failure); NULL when the product
 * overflows or malloc fails. Free with free(). */
void *kvr_codec_array(size_t n, size_t size);

/* *out = an owned copy of s (NULL reads as ""): KVR_ERR_TOO_LARGE if s is over max bytes (*out
 * NULL), KVR_ERR_NOMEM if the copy fails. */
kvr_status kvr_codec_dup(const char *s, size_t max, char **out);

/* s, or "" for NULL (protobuf-c gives an absent string its empty string, but be sure). Not to be
 * written to. */
char *kvr_codec_str(char *s);

/*
 * *n = how many times field `field` occurs at the top level of the message in buf (sub 0), or how
 * many times field `sub` occurs inside the top-level occurrences of `field` (a repeated field of a
 * submessage, which protobuf merges across occurrences). KVR_ERR_MALFORMED if the framing is
 * broken (a truncated varint or length, a group, which proto3 does not have).
 */
kvr_status kvr_codec_count(const void *buf, size_t len, uint32_t field, uint32_t sub, size_t *n);

/*
 * Whether a top-level occurrence of the length-delimited field `field` of the message in buf
 * (sub 0), or of field `sub` inside one, holds a NUL byte: protobuf-c hands a string on as a C
 * string, which such a byte cuts short ("a\0b" and "a\0c" would both read as "a"). False when
 * the framing is broken (protobuf-c has refused the message then).
 */
bool kvr_codec_nul_in(const void *buf, size_t len, uint32_t field, uint32_t sub);

/* An error's text with its figures into buf: "prompt too long: 9 tokens, the limit is 8" (detail
 * NULL or empty: the status's text alone). Returns buf. */
char *kvr_codec_error_text(char *buf, size_t len, kvr_status st, const char *detail);

/* kvr_wire_decode_generate through protobuf-c alone, without its fast path (for the tests that
 * compare the two). */
struct kvr_wire_limits;
struct kvr_wire_request;
kvr_status kvr_wire_decode_generate_pb(const void *buf, size_t len,
                                       const struct kvr_wire_limits *lim,
                                       struct kvr_wire_request *out);

/* The varint at *p (10 bytes at most, as protobuf-c reads them: bits past 64 are dropped), *p
 * moved past it; false when it runs past end or over 10 bytes. */
static inline bool kvr_codec_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t c = *(*p)++;
        x |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

/* kvr_wire_decode_kv through protobuf-c alone, without its fast path (for the tests that compare
 * the two). */
struct kvr_wire_kv;
kvr_status kvr_wire_decode_kv_pb(const void *buf, size_t len, struct kvr_wire_kv *out);

/* Pack m into b (replacing its contents). */
kvr_status kvr_codec_pack(struct kvr_buf *b, const ProtobufCMessage *m);

#endif
