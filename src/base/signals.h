/*
 * The daemons' signals: SIGTERM and SIGINT ask for a drain (kvr_signal_received says which came),
 * SIGPIPE is ignored. Call kvr_signals_catch once at start, before threads.
 */
#ifndef KVR_SIGNALS_H
#define KVR_SIGNALS_H

void kvr_signals_catch(void);
/* The signal that asked to stop, or 0. Async-signal-safe to read from any thread. */
int kvr_signal_received(void);
/* Sleep until a stop signal arrives (polling every 20 ms); returns it. */
int kvr_signals_wait(void);

#endif
