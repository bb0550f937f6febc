/*
 * Subject names.
 */
#include "subject.h"

#include <stdio.h>

bool kvr_subject(char *buf, size_t len, const char *prefix, const char *ns, const char *suffix)
{
    int n = snprintf(buf, len, "%s.%s.%s", prefix, ns, suffix);
    return n > 0 && (size_t)n < len;
}
