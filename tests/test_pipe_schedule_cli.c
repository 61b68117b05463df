/* axon-run schedule and train --schedule over real agents (--local 2):
 *  - the printed 1f1b schedule reads back unchanged (schedule --file);
 *  - a hand-written 1F1B order with a warm-up of two on rank 0 trains to
 *    1f1b's losses, every bit (--loss-log);
 *  - a checkpoint of such a run resumes under the built-in 1f1b to the same
 *    losses again (the flushed modes share the math);
 *  - a schedule that --mode contradicts, and a malformed one (its line and
 *    column), are refused before any agent starts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "tests/cli_testutil.h"

#define TRAIN                                                                  \
  "train", "--model", "mlp", "--model-config", "widths=48/44/40/36/10",        \
      "--dataset", "synthetic", "--data-config",                               \
      "shape=48,classes=10,examples=256", "--batch", "16", "--local", "2",     \
      "--quiet"

static void write_file(const char *p, const char *text) {
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs(text, f);
  assert_int_equal(fclose(f), 0);
}

static void test_schedule_cli(void **state) {
  cli_dir_make("sched");
  /* The printed schedule reads back unchanged. */
  const char *printed = cli_path("1f1b.txt"), *again = cli_path("again.txt");
  free(
      cli_run(0, (const char *[]){"schedule", "--mode", "1f1b", "--stages", "2",
                                  "--micro", "4", "--out", printed, NULL}));
  free(cli_run(0, (const char *[]){"schedule", "--file", printed, "--out",
                                   again, NULL}));
  char *a = mt_slurp(printed), *b = mt_slurp(again);
  assert_non_null(strstr(a, "rank 0: 0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3 STEP0"));
  assert_string_equal(a, b);
  free(a), free(b);
  /* 1f1b itself, then a warm-up of two from a file: the same bits. */
  const char *own = cli_path("own.log"), *warm = cli_path("warm.log"),
             *file = cli_path("warm.txt"), *ck = cli_path("ckpt"),
             *resumed = cli_path("resumed.log");
  write_file(file, "# 1F1B with a warm-up of two on rank 0\n"
                   "ranks 2\nmicro 4\n"
                   "rank 0: 0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3 STEP0\n"
                   "rank 1: 1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3 STEP1\n");
  free(cli_run(0,
               (const char *[]){TRAIN, "--mode", "1f1b", "--microbatches", "4",
                                "--steps", "6", "--loss-log", own, NULL}));
  char *out = cli_run(0, (const char *[]){TRAIN, "--schedule", file, "--steps",
                                          "6", "--loss-log", warm, NULL});
  assert_non_null(strstr(out, "mode=1f1b stages=2 micro=4 steps=6"));
  free(out);
  a = mt_slurp(own), b = mt_slurp(warm);
  assert_non_null(a);
  assert_string_equal(a, b);
  free(b);
  /* Three steps from the file with a checkpoint, three more resumed by the
   * built-in mode. */
  free(cli_run(0, (const char *[]){TRAIN, "--schedule", file, "--steps", "3",
                                   "--checkpoint-dir", ck, "--checkpoint-every",
                                   "3", "--loss-log", resumed, NULL}));
  free(cli_run(0,
               (const char *[]){TRAIN, "--mode", "1f1b", "--steps", "6",
                                "--resume", ck, "--loss-log", resumed, NULL}));
  b = mt_slurp(resumed);
  assert_string_equal(a, b);
  free(a), free(b);
  /* Refusals, before any agent starts. */
  out = cli_run(
      2, (const char *[]){TRAIN, "--schedule", file, "--mode", "gpipe", NULL});
  assert_non_null(strstr(out, "--mode gpipe contradicts the schedule"));
  free(out);
  const char *bad = cli_path("bad.txt");
  write_file(bad, "ranks 2\nmicro 4\nrank 0: 0F0 0F1 0Q2\n");
  out = cli_run(2, (const char *[]){TRAIN, "--schedule", bad, NULL});
  char where[400];
  snprintf(where, sizeof where, "%s:3:17: '0Q2'", bad);
  assert_non_null(strstr(out, where));
  free(out);
  cli_dir_remove();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_schedule_cli),
  };
  return AX_TEST_MAIN(tests);
}
