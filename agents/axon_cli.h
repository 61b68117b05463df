/* Command-line checks shared by axon-agent and axon-run: numeric flags
 * with a range, and HOST:PORT addresses. Each prints a clear message naming
 * the program and the flag, and returns 0 on bad input (the caller exits
 * with status 2). Header-only: the programs share no object files. */
#ifndef AX_AGENT_CLI_H
#define AX_AGENT_CLI_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parses a whole decimal integer in [lo, hi] (an optional K/M/G suffix
 * multiplies by 2^10/2^20/2^30 when `units` is set). */
static inline int axi_cli_int(const char *prog, const char *flag, const char *s,
                              int64_t lo, int64_t hi, int units, int64_t *out) {
  char *end = NULL;
  errno = 0;
  long long v = s ? strtoll(s, &end, 10) : 0;
  int shift = 0;
  if (units && end && *end && !end[1]) {
    shift = *end == 'K' || *end == 'k'   ? 10
            : *end == 'M' || *end == 'm' ? 20
            : *end == 'G' || *end == 'g' ? 30
                                         : -1;
    if (shift > 0)
      end++;
  }
  int ok = s && *s && end != s && !*end && errno != ERANGE && shift >= 0 &&
           (shift == 0 || (v >= 0 && v <= (INT64_MAX >> shift)));
  if (ok && shift) /* v >= 0 here: shifting a negative value is undefined */
    v = (long long)((int64_t)v << shift);
  if (!ok || v < lo || v > hi) {
    fprintf(stderr, "%s: %s %s: expected an integer from %lld to %lld\n", prog,
            flag, s ? s : "(none)", (long long)lo, (long long)hi);
    return 0;
  }
  *out = v;
  return 1;
}

/* The same into an int. */
static inline int axi_cli_i32(const char *prog, const char *flag, const char *s,
                              int lo, int hi, int *out) {
  int64_t v;
  if (!axi_cli_int(prog, flag, s, lo, hi, 0, &v))
    return 0;
  *out = (int)v;
  return 1;
}

/* Checks a HOST:PORT address: a non-empty host and a port in
 * [min_port, 65535]. */
static inline int axi_cli_hostport(const char *prog, const char *flag,
                                   const char *s, int min_port) {
  const char *c = s ? strrchr(s, ':') : NULL;
  int64_t port;
  if (!c || c == s) {
    fprintf(stderr, "%s: %s %s: expected HOST:PORT\n", prog, flag,
            s ? s : "(none)");
    return 0;
  }
  return axi_cli_int(prog, flag, c + 1, min_port, 65535, 0, &port);
}

#endif
