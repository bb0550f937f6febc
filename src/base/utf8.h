/*
 * UTF-8 checks: the length of one valid sequence, and text made valid (for a protobuf string
 * field, whose readers in other languages reject invalid UTF-8). Pure.
 */
#ifndef KVR_UTF8_H
#define KVR_UTF8_H

#include <stdbool.h>
#include <stddef.h>

#include "buf.h"

#define KVR_UTF8_REPLACEMENT "\xef\xbf\xbd" /* U+FFFD */

/*
 * The length (1..4) of the valid UTF-8 sequence at s[0..avail), 0 when there is none. When
 * partial is not NULL, *partial says whether s[0..avail) is the valid start of a longer sequence
 * that avail cuts (0 is returned then). Overlong forms, surrogates and code points past U+10FFFF
 * are invalid. Reads no byte past the first that fails, so a NUL-terminated string may be given
 * avail 4.
 */
size_t kvr_utf8_len(const unsigned char *s, size_t avail, bool *partial);

/*
 * Append in[0..n) to out (after its len) as valid UTF-8 without NUL bytes: each invalid byte
 * becomes U+FFFD, NULs are dropped. A valid character cut at the end is not appended: returns
 * its length (0..3), the bytes the caller carries to the front of the next piece. out stays
 * NUL-terminated past its len. KVR_ERR_NOMEM leaves out's len as it was (*kept untouched).
 */
kvr_status kvr_utf8_clean(struct kvr_buf *out, const char *in, size_t n, size_t *kept);

#endif
