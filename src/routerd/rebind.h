/*
 * Rebinds after a worker's cut. A worker fenced by allow_responses may answer a client only on
 * the connection that received the client's request (or a message with the client's reply
 * subject as its reply). When its outgoing connection is cut and comes back, it lists the streams
 * it is about to repeat (RebindAsk on <prefix>.<ns>.ev.<wid>.rebind); this router answers each
 * key it knows as booked on that worker with a WorkerRebind to <prefix>.<ns>.worker.<wid>.rebind
 * whose NATS reply is the client's, which renews the worker's right to answer that client.
 *
 * A key is known while its request is pending here, and for KVR_REBIND_KEPT_NS after it ended
 * (the worker repeats streams that ended just before the cut, whose final may have been lost):
 * the reply subjects of the last KVR_KEPT_MAX ended requests are kept for that (kept.h). A key
 * listed that is booked on another worker, or unknown, is counted and skipped: a worker gets a
 * rebind only for its own clients. Under the state mutex.
 */
#ifndef KVR_RD_REBIND_H
#define KVR_RD_REBIND_H

#include <stddef.h>
#include <stdint.h>

#include "state.h"

#define KVR_REBIND_KEPT_NS (5000ull * 1000000ull) /* an ended request is rebound this long */
#define KVR_REPEAT_KEPT_NS                                                                         \
    (10000ull * 1000000ull) /* a resend of an ended request asks for a repeat this long */

/* Under mu: p ended on its worker at now; keep its reply subject (taken from p) for a rebind. */
void kvr_rebind_keep(struct kvr_rd *rd, struct kvr_pending *p, uint64_t now);

/*
 * Under mu: worker wid's heartbeat, applied at now, came from process `instance` (random per
 * process). A worker first heard, or heard from another process than before (restarted under the
 * same id before its silence wrote it off), is a new incarnation from now on: the streams kept for
 * a resend of what ended on it earlier went with the process that ended them (kvr_rebind_repeat).
 */
void kvr_rebind_worker_seen(struct kvr_rd *rd, uint64_t wid, uint64_t instance, uint64_t now);
/* Under mu: worker wid left the fleet; a worker of that id heard again is a new incarnation. */
void kvr_rebind_worker_left(struct kvr_rd *rd, uint64_t wid);

/* What became of a client's resend (kvr_rebind_repeat). */
enum kvr_repeat {
    KVR_REPEAT_NONE,  /* nobody was asked: not in flight here, or ended too long ago */
    KVR_REPEAT_ASKED, /* its worker was asked to publish the stream again */
    KVR_REPEAT_GONE,  /* it ended lately on a worker that has left since: nobody can repeat it */
};

/*
 * Under mu: the client resent key (reply: its reply subject). A client resends when its stream
 * made no progress for 2 s (nothing came, a gap stayed open, or it stopped short of its final):
 * chunks were lost on their way (a worker on another server node that answered before that node
 * knew the inbox, a slow consumer's drops; docs/protocol.md). So ask the worker that has it to
 * publish the stream again (a WorkerRebind with repeat, the client's reply as its reply): while
 * it is in flight on a worker (pending here with that reply), or for KVR_REPEAT_KEPT_NS after it
 * ended, unless that worker left the fleet since (drained and exited, or written off), or is
 * another incarnation of it (restarted under the same id: kvr_rebind_worker_seen): then
 * KVR_REPEAT_GONE, its id in *gone, for the caller to answer the client. p: key's pending entry
 * here, or NULL (then the kept reply subjects are looked at).
 */
enum kvr_repeat kvr_rebind_repeat(struct kvr_rd *rd, const struct kvr_pending *p, uint64_t key,
                                  const char *reply, uint64_t now, uint64_t *gone);

/* Under mu: worker wid's RebindAsk data[0..len): queue a WorkerRebind for each key booked on it. */
kvr_status kvr_rebind_on_ask(struct kvr_rd *rd, uint64_t wid, const void *data, size_t len,
                             uint64_t now);

#endif
