/*
 * Worker events: every worker's KV events, prefill done, output blocks, done and heartbeats,
 * through one subscription on kv.<ns>.ev.> (so one worker's events arrive in order). The worker
 * id and the event kind come from the subject (kv.<ns>.ev.<id>.<kind>); a subject, payload or
 * worker id that does not check out is counted (ev_errors) and dropped. Under the state mutex.
 */
#ifndef KVR_RD_EVENTS_H
#define KVR_RD_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "state.h"

/* A message on kv.<ns>.ev.> (takes mu; publishes). */
void kvr_events_on_message(struct kvr_rd *rd, const char *subject, const void *data, size_t len);

/* Under mu: apply a KV event of worker_id (now, or held back and replayed after a snapshot): its
 * number noted (kvseq.h), the message kept in rd->kvlog. */
kvr_status kvr_events_apply_kv(struct kvr_rd *rd, uint64_t worker_id, const void *data, size_t len);

/* Under mu: apply again one that was applied before (from rd->kvlog): neither noted nor kept. */
kvr_status kvr_events_apply_kv_again(struct kvr_rd *rd, uint64_t worker_id, const void *data,
                                     size_t len);

/* Whether a worker event's status makes it a bad event (counted in ev_errors and dropped). */
bool kvr_events_bad(kvr_status st);

/* The worker id in <ev_prefix><id>.<kind> (ev_prefix "<prefix>.<ns>.ev.") and a pointer to
 * <kind>; false if malformed: another prefix, an id with a sign or a leading zero, or a token more
 * or less (kv.<ns>.ev.1.7.hb would otherwise speak for worker 7 with worker 1's rights). */
bool kvr_events_parse_subject(const char *ev_prefix, const char *subject, uint64_t *worker_id,
                              const char **kind);

#endif
