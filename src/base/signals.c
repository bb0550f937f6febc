/*
 * The daemons' signals. Atomics: the handler and the threads that fail write, any thread reads.
 */
#define _DEFAULT_SOURCE
#include "signals.h"

#include <signal.h>
#include <stdatomic.h>
#include <string.h>

#include "clock.h"

static atomic_int got_signal; /* lock-free on every target: async-signal-safe */
static atomic_bool failed;

static void on_signal(int sig)
{
    atomic_store(&got_signal, sig);
}

void kvr_signals_catch(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int kvr_signal_received(void)
{
    int sig = atomic_load(&got_signal);
    return sig ? sig : atomic_load(&failed) ? KVR_STOP_FAILED : 0;
}

int kvr_signals_wait(void)
{
    int sig;
    while (!(sig = kvr_signal_received()))
        kvr_sleep_ns(20 * KVR_NS_PER_MS);
    return sig;
}

void kvr_signals_fail(void)
{
    atomic_store(&failed, true);
}

bool kvr_signals_failed(void)
{
    return atomic_load(&failed);
}
