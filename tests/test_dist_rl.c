/* The RL example (examples/rl), run as a user would with --local: the
 * agent and its observers reach a running reward of 200 on CartPole; an
 * observer killed mid-run is reported and training carries on with the
 * others; every process ends with zero live RRefs, calls and futures. */
#include "tests/example_testutil.h"
#include "tests/harness.h"

#define ZERO "live at exit: rrefs owned 0, user forks 0, calls 0, futures 0"

static void solves(void **state) {
  char *out = NULL;
  char *argv[] = {"rl",  "--local",    "2",    "--seed",    "1",   "--target",
                  "200", "--episodes", "2000", "--timeout", "100", NULL};
  int rc = et_run(argv, 115, &out);
  if (rc != 0 || !strstr(out, "solved: running reward") ||
      et_count(out, ZERO) != 3)
    fail_msg("exit %d:\n%s", rc, out);
  printf("%s", strstr(out, "solved:"));
  free(out);
}

static void killed_observer(void **state) {
  char *out = NULL;
  char *argv[] = {"rl",       "--local",   "3",          "--seed", "2",
                  "--target", "200",       "--episodes", "2000",   "--kill",
                  "2:5",      "--timeout", "100",        NULL};
  int rc = et_run(argv, 115, &out);
  if (rc != 0 || !strstr(out, "agent: observer2 is down") ||
      !strstr(out, "solved: running reward") || et_count(out, ZERO) != 3)
    fail_msg("exit %d:\n%s", rc, out);
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(solves),
      cmocka_unit_test(killed_observer),
  };
  return AX_TEST_MAIN(tests);
}
