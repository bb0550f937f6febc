/*
 * kvr_status: the one result type of the kvrouter library.
 *
 * Every action returns a kvr_status; KVR_OK is zero, everything else is an error with a fixed
 * text. Codes and texts come from one list (KVR_STATUS_LIST), so they cannot drift apart. The
 * numeric values are part of the wire protocol (they travel as error codes to clients), so new
 * codes are only ever appended; proto/kvrouter/v1/kvrouter.proto's ErrorCode lists the same values
 * (tests/unit/test_codec.c checks they agree). 14 is retired: it was "queued", an outcome (struct
 * kvr_decision.queued), never an error on the wire. Thread-safe: pure functions on constant data.
 */
#ifndef KVR_STATUS_H
#define KVR_STATUS_H

/* X(name, value, text) */
#define KVR_STATUS_LIST(X)                                                                         \
    X(KVR_OK, 0, "ok")                                                                             \
    X(KVR_ERR_NOMEM, 1, "out of memory")                                                           \
    X(KVR_ERR_INVALID, 2, "invalid argument")                                                      \
    X(KVR_ERR_EMPTY_PROMPT, 3, "empty prompt")                                                     \
    X(KVR_ERR_PROMPT_TOO_LONG, 4, "prompt too long")                                               \
    X(KVR_ERR_UNKNOWN_POLICY, 5, "unknown policy")                                                 \
    X(KVR_ERR_NO_WORKERS, 6, "no workers")                                                         \
    X(KVR_ERR_OVERLOADED, 7, "overloaded: every worker is busy")                                   \
    X(KVR_ERR_UNKNOWN_WORKER, 8, "unknown worker")                                                 \
    X(KVR_ERR_UNKNOWN_REQUEST, 9, "unknown request")                                               \
    X(KVR_ERR_DUPLICATE, 10, "duplicate id")                                                       \
    X(KVR_ERR_UNKNOWN_PARENT, 11, "unknown parent block")                                          \
    X(KVR_ERR_BLOCK_SIZE, 12, "block size mismatch")                                               \
    X(KVR_ERR_FULL, 13, "capacity limit reached")                                                  \
    /* 14 is retired: it was the outcome "queued", never an error on the wire */                   \
    X(KVR_ERR_MALFORMED, 15, "malformed message")                                                  \
    X(KVR_ERR_TOO_LARGE, 16, "message too large")                                                  \
    X(KVR_ERR_WORKER_LOST, 17, "worker lost")                                                      \
    X(KVR_ERR_TIMEOUT, 18, "timed out")                                                            \
    X(KVR_ERR_IO, 19, "i/o error")                                                                 \
    X(KVR_ERR_SHUTDOWN, 20, "shutting down")                                                       \
    X(KVR_ERR_NOT_DELIVERED, 21, "never reached its worker")                                       \
    X(KVR_ERR_MAX_TOKENS_ZERO, 22, "max_tokens is 0")                                              \
    X(KVR_ERR_MAX_TOKENS_TOO_LARGE, 23, "max_tokens over the limit")                               \
    X(KVR_ERR_NO_REPLY, 24, "no reply subject")                                                    \
    X(KVR_ERR_CANCELLED, 25, "cancelled")                                                          \
    X(KVR_ERR_DEADLINE, 26, "deadline exceeded")                                                   \
    X(KVR_ERR_WORKER_ID_CLASH, 27, "worker id used by another process")                            \
    X(KVR_ERR_INTERRUPTED, 28, "stream interrupted")                                               \
    X(KVR_ERR_REPLY_TOO_LONG, 29, "reply subject too long")                                        \
    X(KVR_ERR_ID_TOO_LONG, 30, "request id too long")                                              \
    X(KVR_ERR_BAD_OVERRIDE, 31, "override out of range")                                           \
    X(KVR_ERR_SUPERSEDED, 32, "served by another worker")

#define KVR_STATUS_ENUM(name, value, text) name = value,
typedef enum kvr_status { KVR_STATUS_LIST(KVR_STATUS_ENUM) } kvr_status;
#undef KVR_STATUS_ENUM

/* A fixed text for any status; "unknown status" for values outside the list. Never NULL. */
const char *kvr_status_str(kvr_status st);

/* The enum's own name ("KVR_ERR_NO_WORKERS"), for logs; "KVR_UNKNOWN" outside the list. */
const char *kvr_status_name(kvr_status st);

#endif
