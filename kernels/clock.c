/* The monotonic clock and the deadlines of timed waits (clock.h). */
#include "axon/kernels/clock.h"

int64_t ax_clock_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t ax_clock_ms(void) { return ax_clock_us() / 1000; }

double ax_clock_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int64_t ax_clock_cpu_us(int whole_process) {
  struct timespec ts;
  clock_gettime(
      whole_process ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_THREAD_CPUTIME_ID, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ts plus sec seconds and nsec nanoseconds (0 <= nsec < 1e9), normalised. */
static struct timespec add(struct timespec ts, int64_t sec, long nsec) {
  ts.tv_sec += (time_t)sec;
  ts.tv_nsec += nsec;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

struct timespec ax_clock_after_ms(clockid_t clk, int64_t ms) {
  struct timespec ts;
  clock_gettime(clk, &ts);
  return add(ts, ms / 1000, (long)(ms % 1000) * 1000000L);
}

struct timespec ax_clock_after_us(clockid_t clk, int64_t us) {
  struct timespec ts;
  clock_gettime(clk, &ts);
  return add(ts, us / 1000000, (long)(us % 1000000) * 1000L);
}

struct timespec ax_clock_at_ms(int64_t abs_ms) {
  struct timespec ts = {(time_t)(abs_ms / 1000),
                        (long)(abs_ms % 1000) * 1000000L};
  return ts;
}
