/*
 * Subject names: "<prefix>.<ns>.<suffix>", and the one rule for names that come from the wire or
 * the command line before they become a subject or a log field. Pure; thread-safe.
 */
#ifndef KVR_SUBJECT_H
#define KVR_SUBJECT_H

#include <stdbool.h>
#include <stddef.h>

/* "<prefix>.<ns>.<suffix>" into buf; false if it does not fit. */
bool kvr_subject(char *buf, size_t len, const char *prefix, const char *ns, const char *suffix);

/* One subject token of at most max bytes: non-empty, printable ASCII, no space, dot or wildcard. */
bool kvr_token_ok(const char *s, size_t max);

/* A subject one may publish to, at most max bytes: tokens as above, joined by single dots. */
bool kvr_subject_ok(const char *s, size_t max);

/* An id (a router's): non-empty, at most max bytes of letters, digits, '-' and '_'. */
bool kvr_id_ok(const char *s, size_t max);

/* A client's reply subject the fleet may answer at: non-empty, not under "<prefix>." (the
 * fleets' own subjects, any namespace) and not a system subject ("$..."); answering anything else
 * would let a client make a router or worker publish into them. */
bool kvr_reply_usable(const char *reply, const char *prefix);

#endif
