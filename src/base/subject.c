/*
 * Subject names.
 */
#include "subject.h"

#include <stdio.h>
#include <string.h>

bool kvr_subject(char *buf, size_t len, const char *prefix, const char *ns, const char *suffix)
{
    int n = snprintf(buf, len, "%s.%s.%s", prefix, ns, suffix);
    return n > 0 && (size_t)n < len;
}

static bool token_char(char c)
{
    unsigned char u = (unsigned char)c;
    return u > 0x20 && u < 0x7f && c != '*' && c != '>' && c != '.';
}

bool kvr_token_ok(const char *s, size_t max)
{
    size_t n = 0;
    for (; s && s[n]; n++)
        if (n >= max || !token_char(s[n]))
            return false;
    return n > 0;
}

bool kvr_subject_ok(const char *s, size_t max)
{
    size_t n = 0, token = 0;
    for (; s && s[n]; n++) {
        if (n >= max)
            return false;
        if (s[n] == '.') {
            if (!token)
                return false; /* an empty token */
            token = 0;
        } else if (!token_char(s[n])) {
            return false;
        } else {
            token++;
        }
    }
    return token > 0;
}

bool kvr_id_ok(const char *s, size_t max)
{
    size_t n = 0;
    for (; s && s[n]; n++) {
        char c = s[n];
        if (n >= max || !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                          (c >= '0' && c <= '9') || c == '-' || c == '_'))
            return false;
    }
    return n > 0;
}

bool kvr_reply_usable(const char *reply, const char *prefix)
{
    if (!reply || !*reply || *reply == '$')
        return false;
    size_t n = strlen(prefix);
    return !(n && !strncmp(reply, prefix, n) && reply[n] == '.');
}
