/*
 * What the three daemons share: leveled key=value logs, the clock, the subject names, NATS
 * connections set up the way NATS-NOTES.md says (SendAsap, reconnect forever, named), replies
 * with the NATS service error headers, and a declarative option table that reads defaults, a
 * config file, the environment and flags, and prints --help. Thread-safe unless noted.
 */
#ifndef KVR_UTIL_H
#define KVR_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nats/nats.h>

#include "kvr/status.h"

/* --- logs ------------------------------------------------------------------------------------ */

enum kvr_log_level { KVR_LOG_DEBUG, KVR_LOG_INFO, KVR_LOG_WARN, KVR_LOG_ERROR };

/* Program name and threshold; call once before threads start. */
void kvr_log_init(const char *program, enum kvr_log_level level);
bool kvr_log_parse_level(const char *s, enum kvr_log_level *out);

/* One line: ts=... level=... prog=... msg=<msg> <kv>, where kv is printf-formatted key=value pairs.
 */
void kvr_log(enum kvr_log_level level, const char *msg, const char *kv_fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* --- time ------------------------------------------------------------------------------------ */

uint64_t kvr_now_ns(void);                                     /* monotonic */
void kvr_sleep_ns(uint64_t ns);                                /* */
void kvr_rfc3339(char *buf, size_t len, uint64_t realtime_ns); /* for $SRV.STATS */
uint64_t kvr_realtime_ns(void);

/* --- subjects -------------------------------------------------------------------------------- */

/* "<prefix>.<ns>.<suffix>" into buf; false if it does not fit. */
bool kvr_subject(char *buf, size_t len, const char *prefix, const char *ns, const char *suffix);

/* --- connections ----------------------------------------------------------------------------- */

/*
 * Connect to urls (comma-separated, tried in order: the first is the preferred node) as name:
 * SendAsap, reconnect forever every 250 ms (with jitter), retry the first connect until it
 * succeeds, and log disconnects and reconnects.
 * name is borrowed for the connection's whole life (its callbacks may run after it is destroyed):
 * pass a string that outlives it.
 */
kvr_status kvr_connect(const char *urls, const char *name, natsConnection **out);

/*
 * Publish data to subject; when err is not KVR_OK, add the NATS service error headers
 * (Nats-Service-Error, Nats-Service-Error-Code). subject may be NULL (nothing is sent).
 */
kvr_status kvr_publish(natsConnection *nc, const char *subject, const void *data, size_t len,
                       kvr_status err);

/* --- options --------------------------------------------------------------------------------- */

enum kvr_opt_type { KVR_OPT_STR, KVR_OPT_U32, KVR_OPT_U64, KVR_OPT_DOUBLE, KVR_OPT_BOOL };

struct kvr_opt {
    const char *name;       /* --name, config-file key "name" */
    const char *env;        /* environment variable, or NULL */
    enum kvr_opt_type type; /* */
    void *ptr;              /* where the value goes: char[256] for STR */
    const char *help;       /* one line */
};

#define KVR_OPT_STR_MAX 256

/*
 * Apply, in order: the config file (--config PATH or $KVR_CONFIG: "name = value" lines, '#'
 * comments), the environment, then the command line. Returns 0 to go on, 1 after printing --help,
 * 2 on an error (already reported on stderr).
 */
int kvr_opts_parse(const struct kvr_opt *opts, size_t n, int argc, char **argv, const char *program,
                   const char *summary);

#endif
