/*
 * The daemons' signals. Atomics: the threads that take a signal or fail write, any thread reads.
 */
#define _DEFAULT_SOURCE
#include "signals.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "clock.h"

static atomic_int got_signal; /* the stop signal taken, 0: none yet */
static atomic_bool failed;

/* SIGTERM and SIGINT: blocked in every thread, taken by kvr_signal_received and kvr_signals_wait
 * (sigtimedwait), so no thread is ever interrupted by one. A handler would run on whichever
 * thread the kernel picks, nats.c's reader among them: its blocking read then fails with EINTR,
 * which nats.c takes for a broken connection (a worker lost its subscriptions just as its drain
 * began). */
static void stop_set(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
}

/* Should a thread unblock them (a library's own), its signal still asks for the drain instead of
 * killing the process at once. */
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
    sigset_t set;
    stop_set(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* the threads made from now on inherit it */
}

/* Take a pending stop signal within ns (0: only one already pending). */
static void take(uint64_t ns)
{
    sigset_t set;
    stop_set(&set);
    struct timespec ts = {(time_t)(ns / KVR_NS_PER_S), (long)(ns % KVR_NS_PER_S)};
    int sig = sigtimedwait(&set, NULL, &ts);
    if (sig > 0)
        atomic_store(&got_signal, sig);
}

int kvr_signal_received(void)
{
    if (!atomic_load(&got_signal))
        take(0);
    int sig = atomic_load(&got_signal);
    return sig ? sig : atomic_load(&failed) ? KVR_STOP_FAILED : 0;
}

int kvr_signals_wait(void)
{
    int sig;
    while (!(sig = kvr_signal_received()))
        take(20 * KVR_NS_PER_MS);
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
