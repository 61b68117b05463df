/* Helpers for the tests that run an example program (examples/NAME, built
 * as $AXON_BIN_DIR/NAME) as a user would: spawn it with arguments, bound
 * its run time, capture its output and pick numbers out of it.
 * Header-only, over tests/mp_testutil.h. */
#ifndef AX_EXAMPLE_TESTUTIL_H
#define AX_EXAMPLE_TESTUTIL_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "axon/rpc/launch.h"
#include "tests/mp_testutil.h"

/* Runs example argv[0] (a name, found by mt_bin_path) with argv[1..]
 * (NULL-terminated), output (stdout and stderr) into a malloc'ed string
 * *out, killing its process group after timeout_s. Returns the exit code,
 * 128 + signal, or -1. */
static inline int et_run(char *const *argv, int timeout_s, char **out) {
  char path[4200], tmpl[] = "/tmp/axon_example_XXXXXX";
  mt_bin_path(argv[0], path, sizeof path);
  int fd = mkstemp(tmpl);
  if (fd < 0)
    return -1;
  const char *av[64] = {path};
  for (int i = 1; i < 63 && argv[i - 1] && argv[i]; i++)
    av[i] = argv[i];
  ax_spawn_opts o = {.argv = av, .out = tmpl, .pin = -1, .own_group = 1};
  pid_t pid = ax_local_spawn(&o);
  if (pid < 0) {
    close(fd);
    unlink(tmpl);
    return -1;
  }
  int st = 0, code = -1;
  double t0 = ax_clock_s();
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    if (r < 0 || ax_clock_s() - t0 > timeout_s) {
      fprintf(stderr, "%s: over %d s, killed\n", argv[0], timeout_s);
      kill(-pid, SIGKILL);
      waitpid(pid, &st, 0);
      break;
    }
    nanosleep(&(struct timespec){0, 20000000}, NULL);
  }
  off_t len = lseek(fd, 0, SEEK_END);
  char *s = malloc((size_t)len + 1);
  if (s) {
    ssize_t k = pread(fd, s, (size_t)len, 0);
    s[k > 0 ? k : 0] = 0;
  }
  close(fd);
  unlink(tmpl);
  *out = s;
  return code;
}

/* Number of occurrences of needle in s. */
static inline int et_count(const char *s, const char *needle) {
  int k = 0;
  for (const char *p = s; p && (p = strstr(p, needle)); p += strlen(needle))
    k++;
  return k;
}

/* The number after the last occurrence of `key` in s, or -1. */
static inline double et_number_after(const char *s, const char *key) {
  const char *p = NULL;
  for (const char *q = s; (q = strstr(q, key)); q++)
    p = q;
  return p ? atof(p + strlen(key)) : -1;
}

#endif
