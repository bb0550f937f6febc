/*
 * Routing policies, selectable by name (ROUTING.md sections 4 and 5). kv is the project's own
 * cost-based policy and the default; the others are the baselines it is measured against. The
 * list is defined once, so names, enum values and help text cannot drift. Pure; thread-safe.
 */
#ifndef KVR_POLICY_H
#define KVR_POLICY_H

#include <stddef.h>

#include "kvr/status.h"

/* X(enum, name, one-line description) */
#define KVR_POLICY_LIST(X)                                                                         \
    X(KVR_POLICY_KV, "kv", "lowest predicted prefill + decode cost (default)")                     \
    X(KVR_POLICY_RANDOM, "random", "uniform over live workers")                                    \
    X(KVR_POLICY_ROUND_ROBIN, "round_robin", "cyclic")                                             \
    X(KVR_POLICY_LEAST_LOADED, "least_loaded", "fewest in-flight requests")                        \
    X(KVR_POLICY_POWER_OF_TWO, "power_of_two", "the less loaded of two random workers")            \
    X(KVR_POLICY_PREFIX_ONLY, "prefix_only", "largest cached prefix, no load term")                \
    X(KVR_POLICY_SGLANG, "sglang_cache_aware", "SGLang's cache-aware balance/prefix rule")         \
    X(KVR_POLICY_LLMD, "llmd_weighted", "llm-d's weighted queue/kv-free/prefix score")             \
    X(KVR_POLICY_CHWBL, "chwbl", "consistent hashing with bounded loads on the first block")

#define KVR_POLICY_ENUM(e, name, desc) e,
enum kvr_policy { KVR_POLICY_LIST(KVR_POLICY_ENUM) KVR_POLICY_COUNT };
#undef KVR_POLICY_ENUM

/* The policy's name, or "unknown". */
const char *kvr_policy_name(enum kvr_policy p);

/* One line describing the policy, or "". */
const char *kvr_policy_desc(enum kvr_policy p);

/* Parse a name (exact, case-sensitive; len bytes of name). KVR_ERR_UNKNOWN_POLICY if none. */
kvr_status kvr_policy_parse(const char *name, size_t len, enum kvr_policy *out);

#endif
