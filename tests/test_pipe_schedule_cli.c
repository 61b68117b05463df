/* axon-run schedule and train --schedule over real agents (--local 2):
 *  - the printed 1f1b schedule reads back unchanged (schedule --file);
 *  - a hand-written 1F1B order with a warm-up of two on rank 0 trains to
 *    1f1b's losses, every bit (--loss-log), and reports its modelled time;
 *  - a checkpoint of such a run resumes under the built-in 1f1b to the same
 *    losses again (the flushed modes share the math);
 *  - an odd file (a byte-order mark, CRLF, tabs, three stages on one rank
 *    and one on the other) emulated with no --stages, to the same losses;
 *  - a schedule that --mode contradicts, a malformed one (its line and
 *    column) and a directory are refused before any agent starts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "tests/cli_testutil.h"

#define MODEL                                                                  \
  "--model", "mlp", "--model-config", "widths=48/44/40/36/10", "--dataset",    \
      "synthetic", "--data-config", "shape=48,classes=10,examples=256",        \
      "--batch", "16", "--quiet"
#define TRAIN "train", MODEL, "--local", "2"
#define EMULATE "train", MODEL, "--emulate"

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
  assert_non_null(strstr(out, " modelled_seconds=")); /* its lists' */
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
  free(b);
  /* An odd file: a byte-order mark, CRLF line ends, tabs and trailing
   * spaces, three stages on rank 0 and one on rank 1; emulated with no
   * --stages (the file's ranks), to 1f1b's bits again. */
  const char *odd = cli_path("odd.txt"), *odd_log = cli_path("odd.log");
  write_file(odd, "\xef\xbb\xbfranks 2\r\nmicro 4\r\nplacement 0 0 0 1 \r\n"
                  "rank 0:\t0F0 1F0 2F0 0F1 1F1 2F1 2B0 1B0 0B0 0F2 1F2 2F2 "
                  "2B1 1B1 0B1 0F3 1F3 2F3 2B2 1B2 0B2 2B3 1B3 0B3 STEP0 "
                  "STEP1 STEP2\t\r\n"
                  "rank 1: 3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 STEP3  \r\n");
  out = cli_run(0, (const char *[]){EMULATE, "--schedule", odd, "--steps", "6",
                                    "--loss-log", odd_log, NULL});
  assert_non_null(strstr(out, "mode=1f1b stages=4 micro=4 steps=6"));
  free(out);
  b = mt_slurp(odd_log);
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
  out = cli_run(2, (const char *[]){EMULATE, "--schedule", g_cli_dir, NULL});
  assert_non_null(strstr(out, "cannot read: Is a directory"));
  free(out);
  cli_dir_remove();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_schedule_cli),
  };
  return AX_TEST_MAIN(tests);
}
