/* The RPC + data-parallel hybrid example (examples/hybrid_ps), run as a
 * user would with --local: the remote embedding gets a gradient through
 * distributed autograd at every step of every trainer, the trainers' local
 * models stay identical (their gradients all-reduced), the loss falls, and
 * every process ends with zero live RRefs, calls and futures. */
#include "tests/example_testutil.h"
#include "tests/harness.h"

#define ZERO "live at exit: rrefs owned 0, user forks 0, calls 0, futures 0"

static void hybrid_trains(void **state) {
  char *out = NULL;
  char *argv[] = {"hybrid_ps", "--local", "3",  "--steps",
                  "60",        "--batch", "32", NULL};
  int rc = et_run(argv, 120, &out);
  if (rc != 0 || et_count(out, ZERO) != 4 ||
      et_count(out, "60 of 60 remote steps") != 3 ||
      et_count(out, "local model equal to trainer1's") != 3)
    fail_msg("exit %d; output:\n%s", rc, out);
  for (int r = 1; r <= 3; r++) {
    char key[32];
    snprintf(key, sizeof key, "trainer%d: loss ", r);
    double first = et_number_after(out, key);
    const char *p = strstr(out, key);
    const char *arrow = p ? strstr(p, "-> ") : NULL;
    double last = arrow ? atof(arrow + 3) : -1;
    fprintf(stderr, "  trainer%d: loss %.4f -> %.4f\n", r, first, last);
    assert_true(first > 0 && last > 0 && last < 0.8 * first);
  }
  free(out);
}

static void bad_options(void **state) {
  char *out = NULL;
  char *argv[] = {"hybrid_ps", "--local", "0", NULL};
  assert_int_equal(et_run(argv, 20, &out), 2);
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(bad_options),
                                     cmocka_unit_test(hybrid_trains)};
  return AX_TEST_MAIN(tests);
}
