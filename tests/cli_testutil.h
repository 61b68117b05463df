/* Helpers of the tests that run axon-run as a user would (its files in one
 * temporary folder, its exit status and output checked). Include after
 * harness.h; one test program at a time uses the folder. */
#ifndef AX_TESTS_CLI_TESTUTIL_H
#define AX_TESTS_CLI_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "tests/mp_testutil.h"

/* The test's folder (set by cli_dir_make). */
static char g_cli_dir[256];

/* Makes a fresh /tmp/axon-TAG-XXXXXX folder for the test's files. */
static inline void cli_dir_make(const char *tag) {
  snprintf(g_cli_dir, sizeof g_cli_dir, "/tmp/axon-%s-XXXXXX", tag);
  assert_non_null(mkdtemp(g_cli_dir));
}

/* Removes the folder and everything in it. */
static inline void cli_dir_remove(void) {
  char cmd[320];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_cli_dir);
  assert_int_equal(system(cmd), 0);
}

/* DIR/name (one of 16 rotating buffers). */
static inline const char *cli_path(const char *name) {
  static char p[16][320];
  static int k;
  char *s = p[k++ % 16];
  snprintf(s, 320, "%s/%s", g_cli_dir, name);
  return s;
}

/* Runs axon-run with argv (after the program), fails with its output unless
 * it exits with `want`; returns the output (the caller frees). */
static inline char *cli_run(int want, const char **argv) {
  char log[320]; /* not one of cli_path's, which argv may hold */
  snprintf(log, sizeof log, "%s/log", g_cli_dir);
  int rc = mt_run_axon(log, NULL, 60000, argv);
  char *out = mt_slurp(log);
  if (rc != want)
    fail_msg("axon-run exited %d, not %d:\n%s", rc, want, out ? out : "");
  return out;
}

#endif
