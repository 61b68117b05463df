/* Schedule files (axon-run train --schedule FILE) in hybrid runs over real
 * agents, each against the built-in mode whose lists the file copies
 * (axon-run schedule --mode M --stages K --micro 4 --out FILE):
 *  - a GPT (its tied embedding and head on different stages) on text, with
 *    2 replicas of 2 tensor-parallel members (8 agents) from 1f1b's file,
 *    checkpointed after 2 steps and resumed on another layout (no
 *    replicas, dualpipev's file: 4 stages on 2 agents of 2 members) to step
 *    4: every loss bit for bit the built-in modes' own save and resume;
 *  - 2 replicas of an MLP from v-min's file with a spare and no checkpoint:
 *    an agent killed mid-run (spares_testutil.h), the lost stage takes a
 *    live replica's state (a flushed mode, which the file's mode is), and
 *    every loss is the uninterrupted built-in v-min run's, every bit;
 *  - dualpipev's file with --restarts and checkpoints in memory: an agent
 *    killed and started again, the run rolled back, to the bits of the
 *    built-in dualpipev run that took the same cuts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "harness.h"
#include "tests/cli_testutil.h"
#include "tests/spares_testutil.h"

#define GPT                                                                    \
  "--model", "gpt", "--model-config", "preset=small,seq=16", "--dataset",      \
      "text", "--data-config", g_text, "--batch", "8", "--eval-limit", "16",   \
      "--quiet"

static char g_text[400]; /* file=PATH,seq=16 of the text data set */

/* A text of some 40 KB for the byte-level data set. */
static void write_text(const char *path) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (int i = 0; i < 800; i++)
    fprintf(f, "line %d: the pipeline keeps %d units and %d weights alive\n", i,
            (i * 7) % 13, (i * 11) % 17);
  assert_int_equal(fclose(f), 0);
}

/* Mode m's lists for K ranks and 4 micro-batches, written to `file`. */
static void print_schedule(const char *m, const char *K, const char *file) {
  free(cli_run(0, (const char *[]){"schedule", "--mode", m, "--stages", K,
                                   "--micro", "4", "--out", file, NULL}));
}

/* Two steps on `first` (R = 2, T = 2), checkpointed, then two more resumed
 * on `then` (T = 2 only); each a mode or a file. */
static void save_resume(const char *const first[2], const char *const then[2],
                        const char *dir, const char *log) {
  free(cli_run(0, (const char *[]){"train", GPT, "--local", "8", "--replicas",
                                   "2", "--tensor-parallel", "2", first[0],
                                   first[1], "--microbatches", "4", "--steps",
                                   "2", "--checkpoint-dir", dir, "--loss-log",
                                   log, NULL}));
  free(cli_run(0, (const char *[]){"train", GPT, "--local", "4",
                                   "--tensor-parallel", "2", then[0], then[1],
                                   "--microbatches", "4", "--steps", "4",
                                   "--resume", dir, "--loss-log", log, NULL}));
}

static void test_replicas_tp_relayout(void **state) {
  const char *f1 = cli_path("1f1b.txt"), *fv = cli_path("dualpipev.txt");
  print_schedule("1f1b", "2", f1);
  print_schedule("dualpipev", "2", fv);
  const char *own = cli_path("own.log"), *file = cli_path("file.log");
  save_resume((const char *const[]){"--mode", "1f1b"},
              (const char *const[]){"--mode", "dualpipev"}, cli_path("ck-own"),
              own);
  /* The same --microbatches with a file: allowed, as the file's own. */
  save_resume((const char *const[]){"--schedule", f1},
              (const char *const[]){"--schedule", fv}, cli_path("ck-file"),
              file);
  char *a = mt_slurp(own), *b = mt_slurp(file);
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(count_lines(own), 4);
  assert_string_equal(a, b);
  free(a), free(b);
}

/* 60 steps of an MLP (4 blocks: one per stage of a V schedule on 2). */
#define MLP_RUN                                                                \
  "train", "--dataset", "synthetic", "--data-config",                          \
      "shape=64,classes=10,examples=4096", "--model", "mlp", "--model-config", \
      "widths=64/64/64/64/10", "--batch", "32", "--steps", "60", "--optim",    \
      "opt=adamw,lr=1e-3", "--eval-limit", "64", "--quiet"
#define MLP MLP_RUN, "--local", "4", "--replicas", "2"
#define V_RUN MLP_RUN, "--local", "2", "--checkpoint-every", "10"

static void test_live_spare(void **state) {
  const char *fv = cli_path("v-min.txt"), *l_ref = cli_path("ref.log"),
             *o_ref = cli_path("ref.out"), *l_rec = cli_path("rec.log"),
             *o_rec = cli_path("rec.out");
  print_schedule("v-min", "2", fv);
  run_axon_ref(o_ref, l_ref,
               (const char *[]){MLP, "--mode", "v-min", "--microbatches", "4",
                                "--loss-log", l_ref, NULL});
  int st = run_axon_kill(o_rec, l_rec, NULL, 25, NO_RESTART, "stage1",
                         (const char *[]){MLP, "--schedule", fv, "--spares",
                                          "spare0", "--loss-log", l_rec, NULL});
  char *out = mt_slurp(o_rec);
  if (st != 0 || !out || !strstr(out, "0 steps lost"))
    fprintf(stderr, "---- %s ----\n%s\n----\n", o_rec, out ? out : "");
  assert_int_equal(st, 0);
  assert_non_null(strstr(out, "rebuilding the pipeline with spare spare0"));
  assert_non_null(strstr(out, "0 steps lost"));
  same_losses(l_ref, l_rec, 60, out, 0);
  free(out);
}

/* dualpipev's file (4 stages on 2 agents, no replicas) with --restarts and
 * checkpoints in memory: stage1 killed and started again under its name,
 * every stage rolled back to step 20's copies; the losses are the
 * built-in dualpipev run's that took the same cuts, every bit. */
static void test_restart_v(void **state) {
  const char *fv = cli_path("dualpipev.txt"), *l_ref = cli_path("vref.log"),
             *o_ref = cli_path("vref.out"), *l_rec = cli_path("vrec.log"),
             *o_rec = cli_path("vrec.out");
  print_schedule("dualpipev", "2", fv);
  run_axon_ref(o_ref, l_ref,
               (const char *[]){V_RUN, "--mode", "dualpipev", "--microbatches",
                                "4", "--checkpoint-dir", cli_path("vref-ck"),
                                "--loss-log", l_ref, NULL});
  int st = run_axon_kill(o_rec, l_rec, NULL, 25, RESTART_ANYWHERE, "stage1",
                         (const char *[]){V_RUN, "--schedule", fv, "--restarts",
                                          "1", "--checkpoint-in-memory",
                                          "--loss-log", l_rec, NULL});
  char *out = mt_slurp(o_rec);
  if (st != 0 || !out || !strstr(out, "rolled back from memory"))
    fprintf(stderr, "---- %s ----\n%s\n----\n", o_rec, out ? out : "");
  assert_int_equal(st, 0);
  assert_non_null(strstr(out, "stage1 rejoined; rebuilding"));
  assert_non_null(strstr(out, "rolled back from memory"));
  assert_true(count_lines(l_rec) > 60); /* some steps ran twice */
  same_losses(l_ref, l_rec, 60, out, 0);
  free(out);
}

int main(void) {
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  cli_dir_make("schedhyb");
  write_text(cli_path("text.txt"));
  snprintf(g_text, sizeof g_text, "file=%s,seq=16", cli_path("text.txt"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_replicas_tp_relayout),
      cmocka_unit_test(test_live_spare),
      cmocka_unit_test(test_restart_v),
  };
  int rc = AX_TEST_MAIN(tests);
  cli_dir_remove();
  return rc;
}
