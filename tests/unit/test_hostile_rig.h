/*
 * The rig of the hostile-input tests of the router daemon (test_hostile.c, test_hostile_fleet.c,
 * test_hostile_events.c): one daemon state driven through its handlers with real protobuf bytes,
 * a recording sink that checks every subject it is asked to publish to (a name from the wire
 * that became a subject unchecked fails the test there), the daemon's own $SRV.STATS answer read
 * back by counter name, and stderr captured to check that log lines stay one line each.
 */
#ifndef KVR_TEST_HOSTILE_RIG_H
#define KVR_TEST_HOSTILE_RIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "codec.h"
#include "rec.h"
#include "state.h"

/* What the daemon published: the recorder's (rec.h), under the rig's names (struct hr_sent is
 * struct rec_sent, hr_count rec_count, hr_error_in rec_error_in). */
#define hr_sent     rec_sent
#define hr_nsent    rec_nsent
#define hr_count    rec_count
#define hr_error_in rec_error_in

extern struct kvr_rd_config hr_cfg;
extern struct kvr_rd hr_rd;

/* .init: defaults for a test (id "r1", short hellos, small prompt limit), then hr_start. */
void hr_setup(void);
/* (Re)create the daemon state with hr_cfg as it stands. */
void hr_start(void);
/* .fini */
void hr_teardown(void);

/* The error text of the final chunk m, into buf. */
const char *hr_error_text(const struct hr_sent *m, char *buf, size_t len);

/*
 * A counter of this router's $SRV.STATS.kvrouter answer: "generate.<key>" / "select.<key>" (an
 * endpoint's, e.g. "generate.errors_by_code.ERR_MALFORMED"), "data.<key>" (e.g.
 * "data.bad_events", "data.replication.gossip_bad"). Asserted to exist (0 when a by-code key is
 * absent). The answer itself is not left in hr_sent.
 */
uint64_t hr_stat(const char *path);

/* Worker wid's heartbeat (block size 64) on its subject, with the keys it holds. */
void hr_heartbeat(uint64_t wid, uint64_t capacity, const uint64_t *keys, uint32_t n,
                  uint32_t interval_ms);
/* Raw bytes on an event subject. */
void hr_event(const char *subject, const void *data, size_t len);
/* Worker wid's done event for key (status OK, output tokens) on its own subject. */
void hr_done(uint64_t wid, uint64_t key, uint32_t output);
/* A GenerateRequest of n tokens from base*1000, max_tokens out, on generate with reply. */
void hr_generate(const char *reply, const char *id, uint32_t base, uint32_t n, uint32_t max_tokens);
/* A peer's decision rec as gossip from peer (epoch, seq), its reply, client id "c" and origin. */
void hr_gossip(const char *peer, uint64_t epoch, uint64_t seq, const struct kvr_request_record *rec,
               const char *reply, const char *origin);
/* A hello from peer. */
void hr_hello(const char *peer, uint64_t epoch, uint64_t seq);
/* Raw bytes on the gossip subject of router id (<prefix>.<ns>.router.gossip.<id>). */
void hr_on_gossip(const char *id, const void *data, size_t len);

/* stderr into a file from now on (and the log level debug); hr_log_end reads it back. */
void hr_log_begin(void);
/* stderr back; the captured text (static buffer, NUL-terminated). */
const char *hr_log_end(void);
/* Whether every line of text is one log line (starts "ts="). */
bool hr_log_lines_whole(const char *text);

/* Nanoseconds of the monotonic clock. */
uint64_t hr_now(void);

#endif
