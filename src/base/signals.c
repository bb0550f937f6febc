/*
 * The daemons' signals.
 */
#define _DEFAULT_SOURCE
#include "signals.h"

#include <signal.h>
#include <string.h>

#include "clock.h"

static volatile sig_atomic_t got_signal;

static void on_signal(int sig)
{
    got_signal = sig;
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
    return (int)got_signal;
}

int kvr_signals_wait(void)
{
    while (!got_signal)
        kvr_sleep_ns(20 * KVR_NS_PER_MS);
    return (int)got_signal;
}
