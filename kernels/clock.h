/* axon's one clock: monotonic time, and the deadlines of timed waits.
 *
 * This header is a leaf, like error.h: it includes nothing of axon's and
 * every layer may include it. Every duration axon measures and every
 * deadline it keeps in milliseconds or microseconds is on CLOCK_MONOTONIC
 * through these functions; the timespec helpers turn such a wait into the
 * absolute time pthread_cond_timedwait wants, on the clock its condition
 * variable uses. Thread-safe; no function fails. */
#ifndef AX_CLOCK_H
#define AX_CLOCK_H

#include <stdint.h>
#include <sys/types.h> /* clockid_t, also under strict -std=c11 */
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CLOCK_MONOTONIC in microseconds, milliseconds (both rounded down) and
 * seconds. */
int64_t ax_clock_us(void);
int64_t ax_clock_ms(void);
double ax_clock_s(void);

/* CPU time in microseconds: the calling thread's (CLOCK_THREAD_CPUTIME_ID)
 * when whole_process is 0, else the process's, all its threads together
 * (CLOCK_PROCESS_CPUTIME_ID). Differences of two readings are the CPU time
 * used between them; the origin is unspecified. */
int64_t ax_clock_cpu_us(int whole_process);

/* The time `ms` milliseconds (`us` microseconds) from now on clock `clk`,
 * normalised (0 <= tv_nsec < 1e9), for pthread_cond_timedwait on a
 * condition variable whose clock is clk: CLOCK_REALTIME unless
 * pthread_condattr_setclock chose another (pthread_timedjoin_np takes
 * CLOCK_REALTIME). ms and us are at least 0. */
struct timespec ax_clock_after_ms(clockid_t clk, int64_t ms);
struct timespec ax_clock_after_us(clockid_t clk, int64_t us);

/* The instant abs_ms on ax_clock_ms's scale, for pthread_cond_timedwait on
 * a condition variable set to CLOCK_MONOTONIC. abs_ms is at least 0. */
struct timespec ax_clock_at_ms(int64_t abs_ms);

#ifdef __cplusplus
}
#endif

#endif
