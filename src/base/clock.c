/*
 * The clock.
 */
#define _DEFAULT_SOURCE
#include "clock.h"

#include <errno.h>
#include <stdio.h>
#include <time.h>

static uint64_t read_clock(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (uint64_t)t.tv_sec * KVR_NS_PER_S + (uint64_t)t.tv_nsec;
}

uint64_t kvr_now_ns(void)
{
    return read_clock(CLOCK_MONOTONIC);
}

struct timespec kvr_deadline_ms(uint32_t ms)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += (time_t)(ms / 1000);
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

uint64_t kvr_realtime_ns(void)
{
    return read_clock(CLOCK_REALTIME);
}

void kvr_sleep_ns(uint64_t ns)
{
    struct timespec t = {(time_t)(ns / KVR_NS_PER_S), (long)(ns % KVR_NS_PER_S)};
    while (nanosleep(&t, &t) && errno == EINTR)
        ;
}

void kvr_rfc3339(char *buf, size_t len, uint64_t ns)
{
    time_t s = (time_t)(ns / KVR_NS_PER_S);
    struct tm tm;
    gmtime_r(&s, &tm);
    char day[32];
    strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, len, "%s.%09lluZ", day, (unsigned long long)(ns % KVR_NS_PER_S));
}

void kvr_cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}
