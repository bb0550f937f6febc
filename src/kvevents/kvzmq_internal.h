/*
 * kvzmq internals shared by the publisher and the subscriber (and their tests).
 */
#ifndef KVR_KVZMQ_INTERNAL_H
#define KVR_KVZMQ_INTERNAL_H

#include <stddef.h>

#include "kvr/status.h"

/*
 * Copy endpoint into out (cap bytes), turning a tcp endpoint's ephemeral port ":0" into ZeroMQ's
 * ":*". KVR_ERR_INVALID when it does not fit or is empty. Pure.
 */
kvr_status kvr_kvzmq_endpoint_fix(const char *endpoint, char *out, size_t cap);

#endif
