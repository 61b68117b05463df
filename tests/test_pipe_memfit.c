/* --mem-cap: the verifier's fit of a run's plan per agent, before any agent
 * starts (axon-run train, agents/axon_run_fit.c) and from the command line
 * (axon-run schedule --check / --mode). With K = 2 stages and M = 8
 * micro-batches gpipe keeps 8 units live on every stage and 1f1b K - s, so
 * a cap between their peaks:
 *  - is met by 1f1b (schedule --mode, and train --local 2, which then
 *    trains and reports the same bytes per rank);
 *  - refuses gpipe, naming rank 0, its bytes, the cap and its 8 live units,
 *    with exit status 2 and no agent started;
 *  - refuses a schedule file in 1f1b's semantics whose rank 0 runs every
 *    forward first (8 live, where the built-in 1f1b file keeps 2), both in
 *    schedule --check and in train --schedule. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "tests/cli_testutil.h"

#define MODEL                                                                  \
  "--model", "mlp", "--model-config", "widths=48/44/40/36/10", "--dataset",    \
      "synthetic", "--data-config", "shape=48,classes=10,examples=256",        \
      "--batch", "64"
#define TRAIN "train", MODEL, "--local", "2", "--quiet", "--steps", "1"

/* The bytes of ranks 0 and 1 after "peak bytes per rank:" in out. */
static void rank_bytes(const char *out, long *b) {
  const char *at = strstr(out, "peak bytes per rank:");
  assert_non_null(at);
  assert_int_equal(sscanf(at, "peak bytes per rank: %ld %ld", &b[0], &b[1]), 2);
}

/* A refusal before any agent started: exit 2, the rank named. */
static void refused_early(char *out, const char *want) {
  if (!strstr(out, want))
    fail_msg("no '%s' in:\n%s", want, out);
  assert_null(strstr(out, "axon-agent")); /* none started */
  free(out);
}

static void test_memfit(void **state) {
  (void)state;
  cli_dir_make("memfit");
  /* The peaks without a binding cap. */
  long one[2], all[2];
  char *out = cli_run(0, (const char *[]){"schedule", "--mode", "1f1b",
                                          "--stages", "2", "--micro", "8",
                                          MODEL, "--mem-cap", "1G", NULL});
  assert_non_null(strstr(out, "peak live units per stage: 2 1"));
  rank_bytes(out, one);
  free(out);
  out = cli_run(0, (const char *[]){"schedule", "--mode", "gpipe", "--stages",
                                    "2", "--micro", "8", MODEL, "--mem-cap",
                                    "1G", NULL});
  assert_non_null(strstr(out, "peak live units per stage: 8 8"));
  rank_bytes(out, all);
  free(out);
  assert_true(one[0] >= one[1] && all[0] >= all[1] && one[0] < all[0]);
  char cap[32], want[256];
  snprintf(cap, sizeof cap, "%ld", (one[0] + all[0]) / 2);
  snprintf(want, sizeof want,
           "rank 0 (stage 0) needs %ld bytes, over the cap of %s: 8 units "
           "live (8 with activations), 1 weight versions",
           all[0], cap);
  /* The cap from the command line. */
  free(cli_run(0, (const char *[]){"schedule", "--mode", "1f1b", "--stages",
                                   "2", "--micro", "8", MODEL, "--mem-cap", cap,
                                   NULL}));
  refused_early(cli_run(1, (const char *[]){"schedule", "--mode", "gpipe",
                                            "--stages", "2", "--micro", "8",
                                            MODEL, "--mem-cap", cap, NULL}),
                want);
  /* train: gpipe refused before its agents, 1f1b fits and trains. */
  refused_early(
      cli_run(2, (const char *[]){TRAIN, "--mode", "gpipe", "--microbatches",
                                  "8", "--mem-cap", cap, NULL}),
      want);
  out = cli_run(0, (const char *[]){TRAIN, "--mode", "1f1b", "--microbatches",
                                    "8", "--mem-cap", cap, NULL});
  long trained[2];
  rank_bytes(out, trained);
  assert_int_equal(trained[0], one[0]);
  assert_int_equal(trained[1], one[1]);
  assert_non_null(strstr(out, "mode=1f1b stages=2 micro=8 steps=1"));
  free(out);
  /* A file with a higher peak than the built-in's: refused under the cap,
   * which the built-in 1f1b's file meets. */
  const char *own = cli_path("1f1b.txt"), *wide = cli_path("wide.txt");
  free(cli_run(0, (const char *[]){"schedule", "--mode", "1f1b", "--stages",
                                   "2", "--micro", "8", "--out", own, NULL}));
  free(cli_run(0, (const char *[]){"schedule", "--check", own, MODEL,
                                   "--mem-cap", cap, NULL}));
  FILE *f = fopen(wide, "w");
  assert_non_null(f);
  fputs("# 1f1b's stages, every forward of rank 0 first\nranks 2\nmicro 8\n"
        "rank 0: 0F0 0F1 0F2 0F3 0F4 0F5 0F6 0F7 0B0 0B1 0B2 0B3 0B4 0B5 0B6 "
        "0B7 STEP0\n"
        "rank 1: 1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3 1F4 1B4 1F5 1B5 1F6 1B6 1F7 "
        "1B7 STEP1\n",
        f);
  assert_int_equal(fclose(f), 0);
  out = cli_run(0, (const char *[]){"schedule", "--check", wide, NULL});
  assert_non_null(strstr(out, "peak live units per stage: 8 1"));
  free(out);
  refused_early(cli_run(1, (const char *[]){"schedule", "--check", wide, MODEL,
                                            "--mem-cap", cap, NULL}),
                want);
  refused_early(cli_run(2, (const char *[]){TRAIN, "--schedule", wide,
                                            "--mem-cap", cap, NULL}),
                want);
  cli_dir_remove();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_memfit),
  };
  return AX_TEST_MAIN(tests);
}
