/* The parameter-server example (examples/param_server), run as a user
 * would with --local: synchronous training equals single-process training
 * on the shards' concatenated batches; the asynchronous and lock-free modes
 * reach 85% test accuracy on Fashion-MNIST with the MLP; a trainer killed
 * mid-run is reported and the others finish; every process ends with zero
 * live RRefs, calls and futures. */
#include "tests/example_testutil.h"
#include "tests/harness.h"

#define ZERO "live at exit: rrefs owned 0, user forks 0, calls 0, futures 0"

static float *load(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  float *p = malloc((size_t)len);
  *n = fread(p, sizeof(float), (size_t)len / sizeof(float), f);
  fclose(f);
  return p;
}

static void check_run(int rc, const char *out, int processes) {
  if (rc != 0 || et_count(out, ZERO) != processes)
    fail_msg("exit %d, %d of %d processes leak-free; output:\n%s", rc,
             et_count(out, ZERO), processes, out);
}

static void sync_equals_single(void **state) {
  char a[] = "/tmp/axon_ps_sync_XXXXXX", b[] = "/tmp/axon_ps_ref_XXXXXX";
  close(mkstemp(a));
  close(mkstemp(b));
  char *out = NULL;
  char *dist[] = {"param_server", "--local", "3",  "--mode",
                  "sync",         "--steps", "30", "--eval-limit",
                  "500",          "--save",  a,    NULL};
  int rc = et_run(dist, 110, &out);
  check_run(rc, out, 4);
  free(out);
  char *single[] = {
      "param_server", "--mode",       "single", "--shards", "3", "--steps",
      "30",           "--eval-limit", "500",    "--save",   b,   NULL};
  rc = et_run(single, 60, &out);
  if (rc != 0)
    fail_msg("single: exit %d:\n%s", rc, out);
  free(out);
  size_t na = 0, nb = 0;
  float *pa = load(a, &na), *pb = load(b, &nb);
  unlink(a);
  unlink(b);
  assert_non_null(pa);
  assert_non_null(pb);
  assert_int_equal(na, nb);
  assert_true(na > 200000);
  double d = 0, s = 0;
  for (size_t i = 0; i < na; i++) {
    d += ((double)pa[i] - pb[i]) * ((double)pa[i] - pb[i]);
    s += (double)pb[i] * pb[i];
  }
  free(pa);
  free(pb);
  printf("sync vs single: relative difference %.3g\n", sqrt(d / s));
  assert_true(sqrt(d / s) <= 1e-5);
}

static void accuracy(const char *mode, const char *optim, char *steps) {
  char *out = NULL;
  char *argv[] = {"param_server", "--local", "2",   "--mode",
                  (char *)mode,   "--steps", steps, "--optim",
                  (char *)optim,  NULL};
  int rc = et_run(argv, 115, &out);
  check_run(rc, out, 3);
  double acc = et_number_after(out, "test accuracy ");
  printf("%s: test accuracy %.4f\n", mode, acc);
  if (acc < 0.85)
    fail_msg("%s: accuracy %.4f < 0.85:\n%s", mode, acc, out);
  free(out);
}

static void async_accuracy(void **state) {
  accuracy("async", "opt=adamw,lr=1e-3,wd=0", "1000");
}

static void hogwild_accuracy(void **state) {
  accuracy("hogwild", "opt=sgd,lr=0.1", "1500");
}

static void killed_trainer(void **state) {
  char *out = NULL;
  char *argv[] = {"param_server", "--local",      "3",   "--mode",
                  "sync",         "--steps",      "40",  "--kill",
                  "2:10",         "--eval-limit", "500", NULL};
  int rc = et_run(argv, 110, &out);
  /* The server and the two survivors end leak-free. */
  check_run(rc, out, 3);
  if (!strstr(out, "server: trainer2 is down") ||
      !strstr(out, "server: 40 updates") || !strstr(out, "1 trainer(s) lost"))
    fail_msg("the loss of trainer2 was not handled:\n%s", out);
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sync_equals_single),
      cmocka_unit_test(killed_trainer),
      cmocka_unit_test(async_accuracy),
      cmocka_unit_test(hogwild_accuracy),
  };
  return AX_TEST_MAIN(tests);
}
