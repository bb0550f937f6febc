/*
 * Leveled logs.
 */
#define _DEFAULT_SOURCE
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"

const char *const kvr_log_level_names[] = {"debug", "info", "warn", "error", NULL};

static const char *log_program = "kvrouter";
static enum kvr_log_level log_threshold = KVR_LOG_INFO;

void kvr_log_init(const char *program, enum kvr_log_level level)
{
    log_program = program;
    log_threshold = level;
}

bool kvr_log_enabled(enum kvr_log_level level)
{
    return level >= log_threshold;
}

bool kvr_log_parse_level(const char *s, enum kvr_log_level *out)
{
    for (int i = 0; kvr_log_level_names[i]; i++) {
        if (!strcmp(s, kvr_log_level_names[i])) {
            *out = (enum kvr_log_level)i;
            return true;
        }
    }
    return false;
}

void kvr_log(enum kvr_log_level level, const char *msg, const char *kv_fmt, ...)
{
    if (level < log_threshold)
        return;
    char ts[64];
    kvr_rfc3339(ts, sizeof ts, kvr_realtime_ns());
    char kv[1024] = "";
    if (kv_fmt && *kv_fmt) {
        va_list ap;
        va_start(ap, kv_fmt);
        vsnprintf(kv, sizeof kv, kv_fmt, ap);
        va_end(ap);
    }
    flockfile(stderr);
    fprintf(stderr, "ts=%s level=%s prog=%s msg=%s%s%s\n", ts, kvr_log_level_names[level],
            log_program, msg, *kv ? " " : "", kv);
    funlockfile(stderr);
}

const char *kvr_log_safe(char *out, size_t len, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (!len)
        return out;
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        bool plain = c >= 0x20 && c < 0x7f && c != '"' && c != '\\';
        size_t need = plain ? 1 : 4;
        if (o + need + 4 > len) { /* room for "..." and the NUL */
            if (o + 4 <= len)
                memcpy(out + o, "...", 3), o += 3;
            break;
        }
        if (plain) {
            out[o++] = (char)c;
        } else {
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    out[o] = 0;
    return out;
}
