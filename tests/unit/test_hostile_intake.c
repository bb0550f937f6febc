/*
 * Bad inputs on the subjects a client publishes to: kv.<ns>.generate, kv.<ns>.select and
 * kv.<ns>.cancel, through the router's intake handlers. Each row of docs/hostile-inputs.md that
 * names a test here is one case below: the error code the client gets (and the endpoint's
 * errors_by_code in $SRV.STATS), or the counter of a message nobody can be told about.
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "fleet.h"
#include "intake.h"
#include "kvrouter.pb-c.h"
#include "pending.h"
#include "reply.h"
#include "test_hostile_rig.h"

TestSuite(hostile_intake, .init = hr_setup, .fini = hr_teardown, .timeout = 60);

/* Pack any message into b. */
static void pack(struct kvr_buf *b, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    cr_assert(eq(int, kvr_buf_reserve(b, n + 1), KVR_OK));
    b->len = protobuf_c_message_pack(m, b->data);
}

static uint32_t prompt[9000];

/* A GenerateRequest with n tokens of the prompt, id and max_tokens; ov may be NULL. */
static void request(struct kvr_buf *b, const char *id, size_t n, uint32_t max_tokens,
                    Kvrouter__V1__Overrides *ov)
{
    for (uint32_t i = 0; i < 9000; i++)
        prompt[i] = 100 + i;
    Kvrouter__V1__GenerateRequest g = KVROUTER__V1__GENERATE_REQUEST__INIT;
    g.request_id = (char *)id;
    g.token_ids = prompt;
    g.n_token_ids = n;
    g.max_tokens = max_tokens;
    g.overrides = ov;
    pack(b, &g.base);
}

static const char *code_name(uint32_t code)
{
    return kvr_status_name((kvr_status)code) + 4; /* "KVR_ERR_X" -> "ERR_X", as in STATS */
}

/* data[0..len) on generate answered at reply: exactly one final chunk with code, counted in
 * $SRV.STATS by its name. Returns the error text (static). */
static const char *refused(const char *row, const char *reply, const void *data, size_t len,
                           kvr_status code)
{
    static char text[1100];
    char key[96];
    snprintf(key, sizeof key, "generate.errors_by_code.%s", code_name(code));
    uint64_t before = hr_stat(key);
    size_t mark = hr_nsent;
    kvr_intake_generate(&hr_rd, reply, data, len);
    const struct hr_sent *m = NULL;
    cr_assert(eq(int, hr_count(reply, mark, &m), 1), "%s: one answer", row);
    cr_assert(eq(sz, hr_nsent, mark + 1), "%s: nothing else published", row);
    cr_assert(eq(u32, hr_error_in(m), code), "%s", row);
    cr_assert(eq(u64, hr_stat(key), before + 1), "%s: counted as %s", row, key);
    return hr_error_text(m, text, sizeof text);
}

Test(hostile_intake, generate_bad_inputs_are_refused_each_with_its_code)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    struct kvr_buf b = {0};
    uint8_t junk[64];
    memset(junk, 0xff, sizeof junk);
    refused("junk bytes", "_INBOX.g", junk, sizeof junk, KVR_ERR_MALFORMED);
    request(&b, "cut", 64, 8, NULL);
    refused("truncated", "_INBOX.g", b.data, b.len - 3, KVR_ERR_MALFORMED);
    uint8_t wrong_type[] = {0x0a, 0x02, 'i', 'd', 0x18, 0x05, 0x11, 1, 2, 3, 4, 5, 6, 7, 8};
    refused("a field of the wrong wire type", "_INBOX.g", wrong_type, sizeof wrong_type,
            KVR_ERR_MALFORMED);
    refused("empty payload", "_INBOX.g", "", 0, KVR_ERR_EMPTY_PROMPT);
    request(&b, "none", 0, 8, NULL);
    refused("no tokens", "_INBOX.g", b.data, b.len, KVR_ERR_EMPTY_PROMPT);
    request(&b, "long", 8193, 8, NULL);
    const char *t =
        refused("prompt over the limit", "_INBOX.g", b.data, b.len, KVR_ERR_PROMPT_TOO_LONG);
    cr_assert(not(eq(ptr, strstr(t, "8193 tokens, the limit is 8192"), NULL)), "%s", t);
    request(&b, "zero", 64, 0, NULL);
    refused("max_tokens 0", "_INBOX.g", b.data, b.len, KVR_ERR_MAX_TOKENS_ZERO);
    request(&b, "many", 64, 257, NULL);
    t = refused("max_tokens over the limit", "_INBOX.g", b.data, b.len,
                KVR_ERR_MAX_TOKENS_TOO_LARGE);
    cr_assert(not(eq(ptr, strstr(t, "257 requested, the limit is 256"), NULL)), "%s", t);
    char id[258];
    memset(id, 'i', 257);
    id[257] = 0;
    request(&b, id, 64, 8, NULL);
    refused("request_id of 257 bytes", "_INBOX.g", b.data, b.len, KVR_ERR_ID_TOO_LONG);
    kvr_buf_free(&b);
}

Test(hostile_intake, generate_bad_overrides_sizes_and_replies_are_refused)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    struct kvr_buf b = {0};
    Kvrouter__V1__Overrides ov = KVROUTER__V1__OVERRIDES__INIT;
    ov.policy = "no-such-policy";
    request(&b, "pol", 64, 8, &ov);
    refused("unknown policy", "_INBOX.g", b.data, b.len, KVR_ERR_UNKNOWN_POLICY);
    double bad[] = {NAN, INFINITY, -1, 1e7};
    for (int i = 0; i < 4; i++) {
        ov = (Kvrouter__V1__Overrides)KVROUTER__V1__OVERRIDES__INIT;
        ov.has_overlap_weight = i % 2 == 0;
        ov.overlap_weight = bad[i];
        ov.has_temperature = i % 2 == 1;
        ov.temperature = bad[i];
        request(&b, "ov", 64, 8, &ov);
        refused("override NaN, inf, -1, 1e7", "_INBOX.g", b.data, b.len, KVR_ERR_BAD_OVERRIDE);
    }
    static uint8_t big[64 * 1024];
    memset(big, 0x08, sizeof big); /* refused on its size, before it is parsed */
    refused("bytes over the decoder's cap", "_INBOX.g", big, sizeof big, KVR_ERR_TOO_LARGE);
    hr_rd.max_request_bytes = 200; /* what the server's max_payload lets a forward carry */
    request(&b, "fwd", 150, 8, NULL);
    const char *t =
        refused("bytes over what a forward carries", "_INBOX.g", b.data, b.len, KVR_ERR_TOO_LARGE);
    cr_assert(not(eq(ptr, strstr(t, "the limit is 200"), NULL)), "%s", t);
    hr_rd.max_request_bytes = 0;
    char reply[1100] = "_INBOX.";
    memset(reply + 7, 'r', 1018); /* 1,025 bytes */
    request(&b, "rep", 64, 8, NULL);
    refused("reply subject of 1,025 bytes", reply, b.data, b.len, KVR_ERR_REPLY_TOO_LONG);
    uint64_t dropped = hr_stat("generate.dropped");
    size_t mark = hr_nsent;
    kvr_intake_generate(&hr_rd, NULL, b.data, b.len); /* no reply subject: nobody to answer */
    kvr_intake_generate(&hr_rd, "kv.default.ev.1.done", b.data, b.len);      /* a fleet subject */
    kvr_intake_generate(&hr_rd, "kv.other.router.gossip.r9", b.data, b.len); /* any namespace */
    kvr_intake_generate(&hr_rd, "$SYS.REQ.SERVER.PING", b.data, b.len);      /* a system one */
    cr_assert(eq(sz, hr_nsent, mark), "never answered there, nor routed");
    cr_assert(eq(u64, hr_stat("generate.dropped"), dropped + 4));
    cr_assert(eq(u64, hr_stat("generate.errors_by_code.ERR_NO_REPLY"), 4));
    kvr_buf_free(&b);
}

Test(hostile_intake, odd_but_valid_generates_are_served)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    struct kvr_buf b = {0};
    hr_log_begin();
    request(&b, "id\r\nts=forged level=error msg=\xff", 64, 8, NULL);
    kvr_intake_generate(&hr_rd, "_INBOX.crlf", b.data, b.len); /* an id is data, not a name */
    kvr_intake_generate(&hr_rd, "_INBOX.crlf", b.data, b.len); /* and a resend of it */
    const char *log = hr_log_end();
    cr_assert(eq(int, hr_count("kv.default.worker.1.generate", 0, NULL), 1), "served once");
    cr_assert(eq(u64, hr_stat("data.replication.resends"), 1), "the resend absorbed");
    cr_assert(hr_log_lines_whole(log), "%s", log);
    request(&b, "tail", 64, 8, NULL);
    uint8_t unknown[] = {0xf8, 0x06, 0x01}; /* field 111, varint 1: a newer client's field */
    cr_assert(eq(int, kvr_buf_reserve(&b, b.len + sizeof unknown), KVR_OK));
    memcpy(b.data + b.len, unknown, sizeof unknown);
    kvr_intake_generate(&hr_rd, "_INBOX.new", b.data, b.len + sizeof unknown);
    cr_assert(eq(int, hr_count("kv.default.worker.1.generate", 0, NULL), 2), "unknown field");
    Kvrouter__V1__GenerateRequest g = KVROUTER__V1__GENERATE_REQUEST__INIT;
    uint32_t top[64];
    for (int i = 0; i < 64; i++)
        top[i] = UINT32_MAX - (uint32_t)i;
    g.request_id = "extremes";
    g.token_ids = top;
    g.n_token_ids = 64;
    g.max_tokens = 256;
    g.deadline_ms = UINT32_MAX; /* 49 days, in nanoseconds: no wrap */
    pack(&b, &g.base);
    kvr_intake_generate(&hr_rd, "_INBOX.ext", b.data, b.len);
    cr_assert(eq(int, hr_count("kv.default.worker.1.generate", 0, NULL), 3), "token ids 2^32-1");
    cr_assert(eq(u64, hr_stat("generate.num_errors"), 0));
    kvr_buf_free(&b);
}

/* A client's request "a" streams on its inbox; its "a\0b", sent there too, is refused
 * ERR_INVALID. protobuf-c reads that id as "a", and the refusal named it so: the client read a
 * final ERR_INVALID chunk for "a", its request still streaming. The refusal names no request. */
Test(hostile_intake, a_nul_id_refused_names_no_other_request)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    struct kvr_buf b = {0};
    request(&b, "a", 64, 8, NULL);
    kvr_intake_generate(&hr_rd, "_INBOX.one", b.data, b.len);
    cr_assert(eq(int, hr_count("kv.default.worker.1.generate", 0, NULL), 1), "a is placed");
    request(&b, "aXb", 64, 8, NULL);
    char *x = memchr(b.data, 'X', b.len);
    cr_assert(x != NULL);
    *x = 0; /* "a\0b": the library's encoder cannot write it */
    size_t mark = hr_nsent;
    kvr_intake_generate(&hr_rd, "_INBOX.one", b.data, b.len);
    const struct hr_sent *m = NULL;
    cr_assert(eq(int, hr_count("_INBOX.one", mark, &m), 1), "one answer");
    cr_assert(eq(u32, hr_error_in(m), KVR_ERR_INVALID));
    struct kvr_wire_response r;
    cr_assert(eq(int, kvr_wire_decode_response(m->data, m->len, &r), KVR_OK));
    cr_assert(eq(str, r.request_id ? r.request_id : "", ""),
              "the refusal names no request, not the client's \"a\": got \"%s\"", r.request_id);
    kvr_wire_response_free(&r);
    /* refused for another reason first (max_tokens 0): no "a" either */
    request(&b, "aXb", 64, 0, NULL);
    *(char *)memchr(b.data, 'X', b.len) = 0;
    mark = hr_nsent;
    kvr_intake_generate(&hr_rd, "_INBOX.one", b.data, b.len);
    cr_assert(eq(int, hr_count("_INBOX.one", mark, &m), 1), "one answer");
    cr_assert(eq(u32, hr_error_in(m), KVR_ERR_MAX_TOKENS_ZERO));
    cr_assert(eq(int, kvr_wire_decode_response(m->data, m->len, &r), KVR_OK));
    cr_assert(eq(str, r.request_id ? r.request_id : "", ""),
              "max_tokens 0: the refusal names no request, got \"%s\"", r.request_id);
    kvr_wire_response_free(&r);
    kvr_buf_free(&b);
}

/* One select of data at reply: the SelectResponse's error code (asserted: exactly one answer). */
static uint32_t select_code(const char *row, const char *reply, const void *data, size_t len)
{
    size_t mark = hr_nsent;
    kvr_intake_select(&hr_rd, reply, data, len);
    const struct hr_sent *m = NULL;
    cr_assert(eq(int, hr_count(reply, mark, &m), 1), "%s: one answer", row);
    uint64_t wid, key;
    uint32_t overlap, ncand, code = 0;
    cr_assert(eq(
        int, kvr_wire_decode_select_response(m->data, m->len, &wid, &overlap, &ncand, &code, &key),
        KVR_OK));
    return code;
}

Test(hostile_intake, select_bad_inputs_are_answered_with_their_code)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    uint8_t junk[16];
    memset(junk, 0xff, sizeof junk);
    cr_assert(eq(u32, select_code("junk", "_INBOX.s", junk, sizeof junk), KVR_ERR_MALFORMED));
    Kvrouter__V1__SelectRequest s = KVROUTER__V1__SELECT_REQUEST__INIT;
    s.book = true; /* and no request inside */
    struct kvr_buf b = {0}, g = {0};
    pack(&b, &s.base);
    cr_assert(eq(u32, select_code("no request", "_INBOX.s", b.data, b.len), KVR_ERR_MALFORMED));
    request(&g, "sel", 64, 8, NULL);
    cr_assert(eq(int, kvr_wire_encode_select_request(&b, g.data, g.len, true), KVR_OK));
    cr_assert(eq(u32, select_code("booked", "_INBOX.s", b.data, b.len), KVR_OK));
    cr_assert(eq(u32, select_code("booked twice", "_INBOX.s", b.data, b.len), KVR_ERR_DUPLICATE));
    char reply[1100] = "_INBOX.";
    memset(reply + 7, 'r', 1018);
    uint32_t code = select_code("reply of 1,025 bytes", reply, b.data, b.len);
    cr_assert(eq(u32, code, KVR_ERR_REPLY_TOO_LONG));
    cr_assert(eq(u64, hr_stat("select.errors_by_code.ERR_MALFORMED"), 2));
    cr_assert(eq(u64, hr_stat("select.errors_by_code.ERR_DUPLICATE"), 1));
    cr_assert(eq(u64, hr_stat("select.errors_by_code.ERR_REPLY_TOO_LONG"), 1));
    cr_assert(eq(u32, hr_rd.pend.n, 1), "one booking only");
    size_t mark = hr_nsent;
    kvr_intake_select(&hr_rd, NULL, b.data, b.len); /* no reply subject: nobody to answer */
    kvr_intake_select(&hr_rd, "kv.default.ev.1.done", b.data, b.len); /* the fleet's own */
    kvr_intake_select(&hr_rd, "$SRV.PING", b.data, b.len);            /* a system subject */
    cr_assert(eq(sz, hr_nsent, mark), "nothing sent: no answer, no booking gossiped");
    cr_assert(eq(u32, hr_rd.pend.n, 1), "nothing booked");
    cr_assert(eq(u64, hr_stat("select.errors_by_code.ERR_NO_REPLY"), 3));
    cr_assert(eq(u64, hr_stat("select.dropped"), 3));
    kvr_buf_free(&b);
    kvr_buf_free(&g);
}

/* A CancelRequest (id, reply) as raw protobuf. */
static void cancel_raw(const char *id, const char *reply)
{
    Kvrouter__V1__CancelRequest c = KVROUTER__V1__CANCEL_REQUEST__INIT;
    c.request_id = (char *)id;
    c.reply = (char *)reply;
    struct kvr_buf b = {0};
    pack(&b, &c.base);
    kvr_intake_cancel(&hr_rd, b.data, b.len);
    kvr_buf_free(&b);
}

Test(hostile_intake, cancel_bad_inputs_are_counted_and_change_nothing)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    hr_generate("_INBOX.c", "live", 1, 128, 8);
    size_t mark = hr_nsent;
    uint8_t junk[16];
    memset(junk, 0xff, sizeof junk);
    kvr_intake_cancel(&hr_rd, junk, sizeof junk);
    cancel_raw("live", ""); /* no reply subject */
    char id[258], reply[1100] = "_INBOX.";
    memset(id, 'i', 257);
    id[257] = 0;
    cancel_raw(id, "_INBOX.c");
    memset(reply + 7, 'r', 1018);
    cancel_raw("live", reply);
    cr_assert(eq(u64, hr_stat("data.cancels_bad"), 4), "junk, no reply, long id, long reply");
    cancel_raw("live", "_INBOX.c\r\nPUB evil 1\r\nx"); /* a reply is hashed into a key, never a
                                                          subject: another request's key */
    cancel_raw("never-sent", "_INBOX.c");              /* remembered for a request still to come */
    cr_assert(eq(u64, hr_stat("data.cancels"), 6));
    cr_assert(eq(u64, hr_stat("data.cancels_sent"), 0), "no worker told to stop");
    cr_assert(eq(sz, hr_nsent, mark), "nothing published");
    cr_assert(eq(u32, hr_rd.pend.n, 1), "the live request goes on");
    cancel_raw("live", "_INBOX.c"); /* the real cancel still works */
    cr_assert(eq(int, hr_count("kv.default.worker.1.cancel", mark, NULL), 1));
    mark = hr_nsent;
    hr_generate("_INBOX.c", "never-sent", 2, 64, 8); /* the request the early cancel named */
    const struct hr_sent *m = NULL;
    cr_assert(eq(int, hr_count("_INBOX.c", mark, &m), 1), "answered at once");
    cr_assert(eq(u32, hr_error_in(m), KVR_ERR_CANCELLED));
}

/* Anyone may publish on the cancel subject, and every router hears it: each cancel that did not
 * decode was a warning line, without bound (1,001 lines for 1,001 cancels), as refused requests
 * were before (row 187). Now at most KVR_REPLY_LOG_PER_S a second, the next one written saying
 * how many were left out; every one is counted. */
static void bad_cancel(void *ctx)
{
    (void)ctx;
    kvr_intake_cancel(&hr_rd, rec_junk, sizeof rec_junk);
}

Test(hostile_intake, a_flood_of_bad_cancels_is_logged_in_few_lines)
{
    rec_log_flood(bad_cancel, NULL, "test_hostile", "msg=cancel_dropped");
    cr_assert(eq(u64, hr_stat("data.cancels_bad"), 1001), "every one counted");
}

/* Cancels are anyone's to send and every router hears them: a flood of cancels for made-up ids
 * (one before its request is remembered, for 60 s) evicted what the router remembered of ended
 * requests, so a resend of one that had ended was placed again (a second stream and final). */
Test(hostile_intake, a_flood_of_cancels_does_not_make_a_router_forget_what_ended)
{
    hr_heartbeat(1, 4096, NULL, 0, 1000);
    hr_generate("_INBOX.e", "ended", 1, 128, 8);
    hr_done(1, kvr_pending_key("_INBOX.e", "ended"), 8);
    cr_assert(eq(u32, hr_rd.pend.n, 0), "it ended");
    for (uint32_t i = 0; i < KVR_RECENT_MAX + 1000; i++) {
        char id[32];
        snprintf(id, sizeof id, "flood-%u", i);
        cancel_raw(id, "_INBOX.x");
    }
    cr_assert(eq(u64, hr_stat("data.early_cancels"), KVR_RD_EARLY_CANCELS), "bounded");
    cr_assert(gt(u64, hr_stat("data.early_cancels_evicted"), 0));
    cr_assert(eq(u64, hr_stat("data.recent_evicted"), 0), "nothing that ended forgotten");
    size_t mark = hr_nsent;
    hr_generate("_INBOX.e", "ended", 1, 128, 8); /* its resend */
    cr_assert(eq(int, hr_count("kv.default.worker.1.generate", mark, NULL), 0), "not placed again");
    cr_assert(eq(u64, hr_stat("data.resends_after_end"), 1));
    /* the last cancels of the flood still end their requests on arrival */
    char last[32];
    snprintf(last, sizeof last, "flood-%u", KVR_RECENT_MAX + 999);
    mark = hr_nsent;
    hr_generate("_INBOX.x", last, 2, 64, 8);
    const struct hr_sent *m = NULL;
    cr_assert(eq(int, hr_count("_INBOX.x", mark, &m), 1));
    cr_assert(eq(u32, hr_error_in(m), KVR_ERR_CANCELLED));
}
