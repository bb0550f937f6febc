/*
 * Leveled logs: one line per event on stderr, `ts=... level=... prog=... msg=<msg> key=value...`.
 * kvr_log_init runs once before threads start; kvr_log is thread-safe (one line is written whole).
 * Values that come from the network go through kvr_log_safe first, so a line stays one line.
 */
#ifndef KVR_LOG_H
#define KVR_LOG_H

#include <stdbool.h>
#include <stddef.h>

enum kvr_log_level { KVR_LOG_DEBUG, KVR_LOG_INFO, KVR_LOG_WARN, KVR_LOG_ERROR };

/* The names "debug", "info", "warn", "error", NULL-terminated (for option tables). */
extern const char *const kvr_log_level_names[];

/* Program name (borrowed: a string literal) and threshold. */
void kvr_log_init(const char *program, enum kvr_log_level level);
bool kvr_log_enabled(enum kvr_log_level level);
/* A level by name; false when s names none. */
bool kvr_log_parse_level(const char *s, enum kvr_log_level *out);

/* One line: msg, then kv_fmt printf-formatted (key=value pairs separated by spaces). */
void kvr_log(enum kvr_log_level level, const char *msg, const char *kv_fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * An untrusted string made fit for a log value into out (at most len - 1 bytes): bytes other
 * than printable ASCII, '"' and '\\' become \xNN; once what is written nears len - 4 bytes the
 * rest is cut and "..." ends the value.
 * Returns out.
 */
const char *kvr_log_safe(char *out, size_t len, const char *s);

#endif
