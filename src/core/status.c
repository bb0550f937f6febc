/*
 * Texts of kvr_status, generated from KVR_STATUS_LIST. Constant data only; thread-safe.
 */
#include "kvr/status.h"

const char *kvr_status_str(kvr_status st)
{
    switch (st) {
#define KVR_STATUS_TEXT(name, value, text)                                                         \
    case name:                                                                                     \
        return text;
        KVR_STATUS_LIST(KVR_STATUS_TEXT)
#undef KVR_STATUS_TEXT
    }
    return "unknown status";
}

const char *kvr_status_name(kvr_status st)
{
    switch (st) {
#define KVR_STATUS_NAME(name, value, text)                                                         \
    case name:                                                                                     \
        return #name;
        KVR_STATUS_LIST(KVR_STATUS_NAME)
#undef KVR_STATUS_NAME
    }
    return "KVR_UNKNOWN";
}
