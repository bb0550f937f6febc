/*
 * kvevents: the fields newer vLLM adds to its events, written here with msgpack-c as vLLM's
 * msgspec writes them (maps, or arrays in BlockStored's field order): extra_keys (a block keyed
 * by more than its tokens).
 */
#include <criterion/criterion.h>
#include "../../criterion_gt.h"
#include <msgpack.h>
#include <string.h>

#include "kvevents.h"

static void str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* extra_keys as its msgpack: nil, or one entry per block (nil, or [salt]). */
static void extra(msgpack_packer *pk, int n, const char *const *salt)
{
    if (n < 0) {
        msgpack_pack_nil(pk);
        return;
    }
    msgpack_pack_array(pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        if (!salt[i]) {
            msgpack_pack_nil(pk);
            continue;
        }
        msgpack_pack_array(pk, 1);
        str(pk, salt[i]);
    }
}

/* [ts, [one BlockStored of 2 blocks of 2 tokens]] as a map (vLLM now) or an array. */
static void stored(msgpack_sbuffer *sb, bool map, int n, const char *const *salt)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_double(&pk, 1.5);
    msgpack_pack_array(&pk, 1);
    if (map) {
        msgpack_pack_map(&pk, 9);
        str(&pk, "type");
        str(&pk, "BlockStored");
        str(&pk, "block_hashes");
    } else {
        msgpack_pack_array(&pk, 9);
        str(&pk, "BlockStored");
    }
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint64(&pk, 11);
    msgpack_pack_uint64(&pk, 12);
    if (map)
        str(&pk, "parent_block_hash");
    msgpack_pack_nil(&pk);
    if (map)
        str(&pk, "token_ids");
    msgpack_pack_array(&pk, 4);
    for (int i = 0; i < 4; i++)
        msgpack_pack_uint32(&pk, (uint32_t)(100 + i));
    if (map)
        str(&pk, "block_size");
    msgpack_pack_uint32(&pk, 2);
    if (map)
        str(&pk, "lora_id");
    msgpack_pack_nil(&pk);
    if (map)
        str(&pk, "medium");
    str(&pk, "GPU");
    if (map)
        str(&pk, "lora_name");
    msgpack_pack_nil(&pk);
    if (map)
        str(&pk, "extra_keys");
    extra(&pk, n, salt);
}

static struct kvr_kvev_event decode(bool map, int n, const char *const *salt)
{
    msgpack_sbuffer sb;
    stored(&sb, map, n, salt);
    struct kvr_kvev_batch b;
    cr_assert(eq(int, kvr_kvev_decode(sb.data, sb.size, NULL, &b), KVR_OK));
    msgpack_sbuffer_destroy(&sb);
    cr_assert(eq(u32, b.nevents, 1));
    struct kvr_kvev_event e = b.events[0];
    cr_assert(eq(u32, e.nhashes, 2));
    e.hashes = NULL, e.tokens = NULL; /* freed below */
    kvr_kvev_batch_free(&b);
    return e;
}

/* Two events differing only in extra_keys (nil against a cache_salt) decoded alike: the adapter
 * announced a salted block as the unsalted prefix. */
Test(kvevents_vllm, extra_keys_mark_the_first_keyed_block)
{
    static const char *const salted[2] = {"tenant-a-salt", NULL};
    static const char *const second[2] = {NULL, "mm-hash"};
    static const char *const none[2] = {NULL, NULL};
    for (int map = 0; map < 2; map++) {
        struct kvr_kvev_event e = decode(map, -1, NULL);
        cr_assert(not(e.has_extra), "nil extra_keys");
        e = decode(map, 2, none);
        cr_assert(not(e.has_extra), "a nil entry for each block");
        e = decode(map, 1, salted);
        cr_assert(e.has_extra, "[[\"tenant-a-salt\"]]");
        cr_assert(eq(u32, e.nplain, 0));
        e = decode(map, 2, second);
        cr_assert(e.has_extra);
        cr_assert(eq(u32, e.nplain, 1));
        e = decode(map, 1, none); /* a short list: the block it does not cover is not known plain */
        cr_assert(e.has_extra);
        cr_assert(eq(u32, e.nplain, 1));
    }
}

Test(kvevents_vllm, extra_keys_of_another_type_are_malformed)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    stored(&sb, true, -1, NULL);
    sb.size--; /* the nil extra_keys, replaced by a string */
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    str(&pk, "salt");
    struct kvr_kvev_batch b;
    cr_assert(eq(int, kvr_kvev_decode(sb.data, sb.size, NULL, &b), KVR_ERR_MALFORMED));
    msgpack_sbuffer_destroy(&sb);
}
