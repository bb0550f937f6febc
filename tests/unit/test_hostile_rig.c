/*
 * The hostile-input tests' rig (test_hostile_rig.h).
 */
#define _DEFAULT_SOURCE
#include "test_hostile_rig.h"

#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api.h"
#include "clock.h"
#include "events.h"
#include "fleet.h"
#include "intake.h"
#include "log.h"
#include "service.h"
#include "subject.h"

struct kvr_rd_config hr_cfg;
struct kvr_rd hr_rd;

#define STATS_REPLY "_INBOX.hr-stats"

/* Every subject the daemon publishes to must be one: no space, CR, LF, wildcard or empty token. */
static kvr_status record(void *ctx, const struct kvr_outmsg *m)
{
    cr_assert(kvr_subject_ok(m->subject, 4096), "published to a subject that is none: \"%s\"",
              m->subject);
    bool reply_ok = !m->reply || !*m->reply || kvr_subject_ok(m->reply, 4096);
    cr_assert(reply_ok, "a reply subject that is none: \"%s\"", m->reply);
    return rec_record(ctx, m);
}

void hr_start(void)
{
    cr_assert(eq(int,
                 kvr_rd_init(&hr_rd, &hr_cfg, (struct kvr_sink){.publish = record, .ctx = NULL}),
                 KVR_OK));
    cr_assert(eq(int, kvr_fleet_create(&hr_rd), KVR_OK));
    hr_rd.fleet->synced = true; /* nobody to take a snapshot from */
    hr_rd.serving = true;
}

void hr_setup(void)
{
    hr_nsent = 0;
    kvr_log_init("test_hostile", KVR_LOG_ERROR);
    kvr_rd_config_default(&hr_cfg);
    strcpy(hr_cfg.id, "r1");
    hr_cfg.core.seed = 7;
    hr_cfg.core.max_prompt_tokens = 8192; /* cheap limits: the checks are the same */
    hr_cfg.max_output_tokens = 256;
    hr_cfg.hello_ns = 500 * KVR_NS_PER_MS; /* peers stay alive however slow the run (valgrind) */
    hr_start();
}

void hr_teardown(void)
{
    kvr_fleet_destroy(&hr_rd);
    kvr_rd_free(&hr_rd);
    rec_reset();
}

const char *hr_error_text(const struct hr_sent *m, char *buf, size_t len)
{
    struct kvr_wire_response r;
    cr_assert(eq(int, kvr_wire_decode_response(m->data, m->len, &r), KVR_OK));
    snprintf(buf, len, "%s", r.error ? r.error : "");
    kvr_wire_response_free(&r);
    return buf;
}

/* The value at the dotted path under o (NULL when absent). */
static json_t *at(json_t *o, const char *path)
{
    char key[128];
    while (o && *path) {
        size_t k = strcspn(path, ".");
        snprintf(key, sizeof key, "%.*s", (int)k, path);
        o = json_object_get(o, key);
        path += k + (path[k] == '.');
    }
    return o;
}

/* The endpoint (or its data) that path starts with, and the rest of path in *rest. */
static json_t *root(json_t *stats, const char *path, const char **rest)
{
    json_t *ep = json_object_get(stats, "endpoints");
    static const char *const names[] = {"generate.", "select.", "data."};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(names[i]);
        if (!strncmp(path, names[i], n)) {
            *rest = path + n;
            json_t *e = json_array_get(ep, i == 1 ? 1 : 0);
            return i == 2 ? json_object_get(e, "data") : e;
        }
    }
    cr_fatal("a STATS path starts with generate., select. or data.: %s", path);
    return NULL;
}

uint64_t hr_stat(const char *path)
{
    struct kvr_service svc;
    kvr_api_init(&svc, &hr_rd);
    size_t mark = hr_nsent;
    kvr_api_on_srv(&hr_rd, &svc, "$SRV.STATS.kvrouter", STATS_REPLY);
    cr_assert(eq(sz, hr_nsent, mark + 1), "one STATS answer");
    json_t *stats = json_loadb((const char *)hr_sent[mark].data, hr_sent[mark].len, 0, NULL);
    rec_truncate(mark);
    cr_assert(stats != NULL, "STATS is JSON");
    const char *rest = path;
    json_t *base = root(stats, path, &rest);
    json_t *v = at(base, rest);
    bool by_code = strstr(path, "errors_by_code.") != NULL;
    cr_assert(v || by_code, "no %s in $SRV.STATS", path);
    uint64_t n = 0;
    if (json_is_integer(v))
        n = (uint64_t)json_integer_value(v);
    else if (json_is_string(v))
        n = strtoull(json_string_value(v), NULL, 10);
    else
        cr_assert(by_code, "%s is no counter", path);
    json_decref(stats);
    return n;
}

void hr_heartbeat(uint64_t wid, uint64_t capacity, const uint64_t *keys, uint32_t n,
                  uint32_t interval_ms)
{
    struct rec_event e = rec_heartbeat(wid, capacity, keys, n, interval_ms, 0);
    kvr_events_on_message(&hr_rd, e.subject, e.b.data, e.b.len);
    kvr_buf_free(&e.b);
}

void hr_event(const char *subject, const void *data, size_t len)
{
    kvr_events_on_message(&hr_rd, subject, data, len);
}

void hr_done(uint64_t wid, uint64_t key, uint32_t output)
{
    struct kvr_buf b = {0};
    char subject[64];
    snprintf(subject, sizeof subject, "kv.default.ev.%" PRIu64 ".done", wid);
    cr_assert(eq(int, kvr_wire_encode_done(&b, wid, key, KVR_OK, output), KVR_OK));
    hr_event(subject, b.data, b.len);
    kvr_buf_free(&b);
}

void hr_generate(const char *reply, const char *id, uint32_t base, uint32_t n, uint32_t max_tokens)
{
    uint32_t *t = malloc((n + 1) * sizeof *t);
    for (uint32_t i = 0; i < n; i++)
        t[i] = base * 1000 + i;
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_generate(&b, id, t, n, max_tokens, NULL), KVR_OK));
    kvr_intake_generate(&hr_rd, reply, b.data, b.len);
    kvr_buf_free(&b);
    free(t);
}

void hr_gossip(const char *peer, uint64_t epoch, uint64_t seq, const struct kvr_request_record *rec,
               const char *reply, const char *origin)
{
    struct kvr_buf b = {0};
    cr_assert(eq(int,
                 kvr_wire_encode_gossip_decision(&b, peer, epoch, seq, rec, reply, "c", origin,
                                                 kvr_realtime_ns(), 0),
                 KVR_OK));
    hr_on_gossip(peer, b.data, b.len);
    kvr_buf_free(&b);
}

void hr_on_gossip(const char *id, const void *data, size_t len)
{
    char subject[600];
    snprintf(subject, sizeof subject, "kv.default.router.gossip.%s", id);
    kvr_fleet_on_gossip(&hr_rd, subject, data, len);
}

void hr_hello(const char *peer, uint64_t epoch, uint64_t seq)
{
    struct kvr_buf b = {0};
    cr_assert(eq(int, kvr_wire_encode_gossip_hello(&b, peer, epoch, seq, true), KVR_OK));
    hr_on_gossip(peer, b.data, b.len);
    kvr_buf_free(&b);
}

/* --- stderr ---------------------------------------------------------------------------------- */

void hr_log_begin(void)
{
    rec_log_begin("test_hostile", KVR_LOG_DEBUG);
}

const char *hr_log_end(void)
{
    return rec_log_end("test_hostile");
}

bool hr_log_lines_whole(const char *text)
{
    for (const char *line = text; *line;) {
        if (strncmp(line, "ts=", 3))
            return false;
        const char *nl = strchr(line, '\n');
        if (!nl)
            return false; /* a line is written whole, newline included */
        line = nl + 1;
    }
    return true;
}

uint64_t hr_now(void)
{
    return kvr_now_ns();
}
