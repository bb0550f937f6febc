/*
 * The daemons' signals: SIGTERM and SIGINT ask for a drain (kvr_signal_received says which came),
 * SIGPIPE is ignored. A daemon that cannot go on (a NATS connection that nats.c closed for good)
 * asks for the same drain with kvr_signals_fail, and then exits with a failure status. Call
 * kvr_signals_catch once at start, before any thread: it blocks SIGTERM and SIGINT, which every
 * thread made after inherits, and the two calls below take them when they come (no handler
 * interrupts a thread's system call).
 */
#ifndef KVR_SIGNALS_H
#define KVR_SIGNALS_H

#include <stdbool.h>

/* What kvr_signal_received says after kvr_signals_fail when no signal came: not a signal number. */
#define KVR_STOP_FAILED 256

void kvr_signals_catch(void);
/* The signal that asked to stop (taken now if it is pending), KVR_STOP_FAILED, or 0. From any
 * thread. */
int kvr_signal_received(void);
/* Sleep until a stop signal arrives or kvr_signals_fail is called (a failure is seen within
 * 20 ms); returns what kvr_signal_received then says. */
int kvr_signals_wait(void);
/* Ask the daemon to stop because it cannot go on; safe from any thread. */
void kvr_signals_fail(void);
/* Whether kvr_signals_fail was called: the daemon's exit status is then 1. */
bool kvr_signals_failed(void);

#endif
