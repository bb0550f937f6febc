/*
 * The clock of the programs (the core and the simulator never read one: time is their argument).
 * Thread-safe.
 */
#ifndef KVR_CLOCK_H
#define KVR_CLOCK_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define KVR_NS_PER_MS 1000000ull
#define KVR_NS_PER_S  1000000000ull

uint64_t kvr_now_ns(void);      /* monotonic */
uint64_t kvr_realtime_ns(void); /* since the epoch */
void kvr_sleep_ns(uint64_t ns); /* the whole time, across signals */
/* The monotonic clock ms from now: a deadline for pthread_cond_timedwait on a condition made
 * with CLOCK_MONOTONIC. */
struct timespec kvr_deadline_ms(uint32_t ms);
/* Initialise cv on the monotonic clock (kvr_now_ns's, and kvr_deadline_ms's). */
void kvr_cond_init_monotonic(pthread_cond_t *cv);
/* realtime_ns as RFC 3339 with nanoseconds ("2026-12-01T09:03:54.123456789Z") into buf. */
void kvr_rfc3339(char *buf, size_t len, uint64_t realtime_ns);

#endif
