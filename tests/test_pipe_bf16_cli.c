/* axon-run --precision, as a user runs it:
 *  - a value other than fp32 or bf16 is refused (exit status 2) with a
 *    message naming the option and the values;
 *  - a bf16 run in this process and a bf16 pipeline (--local) train and
 *    say so in their summary;
 *  - the checkpoint's run configuration records the precision, and a
 *    resume in another precision goes on from it (the state is f32 in
 *    both), telling that the precision changed. */
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/pipeline/state/checkpoint.h"
#include "harness.h"
#include "tests/mp_testutil.h"

static char g_tmp[64];

#define DATA                                                                   \
  "--dataset", "synthetic", "--data-config",                                   \
      "shape=32,classes=10,examples=512", "--model", "mlp", "--model-config",  \
      "widths=32/32/32/10", "--batch", "16", "--optim",                        \
      "opt=sgd,lr=0.05,momentum=0.9", "--eval-limit", "128", "--quiet"

/* Runs axon-run with argv; its exit status, its output in *text (freed by
 * the caller). */
static int run(const char **argv, char **text) {
  char out[128];
  snprintf(out, sizeof out, "%s/out", g_tmp);
  int st = mt_run_axon(out, NULL, 300000, argv);
  *text = mt_slurp(out);
  assert_non_null(*text);
  if (st != 0 && st != 2) /* 2: a refusal, which one test expects */
    fprintf(stderr, "---- axon-run exited %d ----\n%s\n----\n", st, *text);
  return st;
}

static void test_refuses_other_values(void **state) {
  const char *a[] = {"train",       DATA,   "--steps", "2",
                     "--precision", "fp16", NULL};
  char *t;
  assert_int_equal(run(a, &t), 2);
  assert_non_null(strstr(t, "--precision"));
  assert_non_null(strstr(t, "fp32 or bf16"));
  free(t);
}

static void test_in_process(void **state) {
  const char *a[] = {"train",       DATA,   "--steps", "8",
                     "--precision", "bf16", NULL};
  char *t;
  assert_int_equal(run(a, &t), 0);
  assert_non_null(strstr(t, "steps=8"));
  assert_non_null(strstr(t, "precision=bf16"));
  free(t);
}

static void test_pipeline_and_resume(void **state) {
  char dir[128], log[128];
  snprintf(dir, sizeof dir, "%s/ckpt", g_tmp);
  snprintf(log, sizeof log, "%s/losses", g_tmp);
  const char *a[] = {"train",
                     DATA,
                     "--local",
                     "2",
                     "--mode",
                     "1f1b",
                     "--steps",
                     "10",
                     "--precision",
                     "bf16",
                     "--checkpoint-dir",
                     dir,
                     "--checkpoint-every",
                     "10",
                     NULL};
  char *t;
  assert_int_equal(run(a, &t), 0);
  assert_non_null(strstr(t, "precision=bf16"));
  free(t);
  char found[512];
  ax_ckpt_info info;
  AX_ASSERT_OK(ax_ckpt_find(dir, found, sizeof found));
  AX_ASSERT_OK(ax_ckpt_read_info(found, &info));
  assert_int_equal(info.step, 10);
  assert_non_null(strstr(info.config, ";precision=bf16"));
  /* Resumed in fp32 (on another mode: the layout may change too). */
  const char *b[] = {"train",      DATA,      "--local", "2",        "--mode",
                     "gpipe",      "--steps", "16",      "--resume", dir,
                     "--loss-log", log,       NULL};
  assert_int_equal(run(b, &t), 0);
  assert_non_null(strstr(t, "the precision changes from bf16 to fp32"));
  assert_null(strstr(t, "precision=bf16"));
  free(t);
  char *l = mt_slurp(log);
  assert_non_null(l);
  long first = -1;
  assert_int_equal(sscanf(l, "%ld", &first), 1);
  assert_int_equal(first, 10); /* from the checkpoint on */
  free(l);
}

int main(void) {
  snprintf(g_tmp, sizeof g_tmp, "/tmp/axon_bf16_cli_XXXXXX");
  if (!mkdtemp(g_tmp))
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refuses_other_values),
      cmocka_unit_test(test_in_process),
      cmocka_unit_test(test_pipeline_and_resume),
  };
  int failed = AX_TEST_MAIN(tests);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", g_tmp);
  return failed;
}
