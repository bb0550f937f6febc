/*
 * Policy names, generated from KVR_POLICY_LIST. Constant data; thread-safe.
 */
#include "kvr/policy.h"

#include <string.h>

static const char *const names[] = {
#define KVR_POLICY_NAME(e, name, desc) name,
    KVR_POLICY_LIST(KVR_POLICY_NAME)
#undef KVR_POLICY_NAME
};

static const char *const descs[] = {
#define KVR_POLICY_DESC(e, name, desc) desc,
    KVR_POLICY_LIST(KVR_POLICY_DESC)
#undef KVR_POLICY_DESC
};

const char *kvr_policy_name(enum kvr_policy p)
{
    return (unsigned)p < KVR_POLICY_COUNT ? names[p] : "unknown";
}

const char *kvr_policy_desc(enum kvr_policy p)
{
    return (unsigned)p < KVR_POLICY_COUNT ? descs[p] : "";
}

kvr_status kvr_policy_parse(const char *name, size_t len, enum kvr_policy *out)
{
    if (!name)
        return KVR_ERR_UNKNOWN_POLICY;
    for (int p = 0; p < KVR_POLICY_COUNT; p++) {
        if (strlen(names[p]) == len && memcmp(names[p], name, len) == 0) {
            *out = (enum kvr_policy)p;
            return KVR_OK;
        }
    }
    return KVR_ERR_UNKNOWN_POLICY;
}
