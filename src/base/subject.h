/*
 * Subject names: "<prefix>.<ns>.<suffix>". Pure; thread-safe.
 */
#ifndef KVR_SUBJECT_H
#define KVR_SUBJECT_H

#include <stdbool.h>
#include <stddef.h>

/* "<prefix>.<ns>.<suffix>" into buf; false if it does not fit. */
bool kvr_subject(char *buf, size_t len, const char *prefix, const char *ns, const char *suffix);

#endif
