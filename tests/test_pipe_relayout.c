/* A checkpoint resumed on another layout, through axon-run as a user runs
 * it (--local worlds). The reference is one uninterrupted run (K = 4, 1f1b,
 * checkpoints every 20 steps); each resume starts from its step-20
 * checkpoint on another layout and runs to step 40:
 *  - another stage count, partition, chunking or flushed mode with the same
 *    micro-batches, also spread over replicas (2 of 2 micro-batches for
 *    the reference's 4): the losses of every step and the final parameters
 *    equal the reference's bit for bit (a layer's math does not depend on
 *    where it runs; micro-batch gradients are summed in the same tree);
 *  - other micro-batch counts and replicas (the summation order changes):
 *    the final parameters within 1e-5 relative (norm of the difference
 *    over the norm);
 *  - a resume whose math differs (learning rate, batch) is refused with
 *    the differing keys named;
 *  - a staleness correction's history (its average update and the
 *    prediction for the next batch) is part of the state: 2bw with predict
 *    and pipedream with pipemare resumed on their own layout continue bit
 *    for bit.
 * The final parameters are compared through axon-run export, which reads
 * any layout's checkpoint. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "axon/runtime/pipeline/state/checkpoint.h"
#include "harness.h"
#include "tests/mp_testutil.h"

static char g_tmp[64];

#define COMMON                                                                 \
  "--dataset", "synthetic", "--data-config",                                   \
      "shape=64,classes=10,examples=2048", "--model", "mlp", "--model-config", \
      "widths=64/64/64/64/64/64/64/64/10", "--steps", "40", "--batch", "32",   \
      "--optim", "opt=adamw,lr=1e-3,sched=cosine,total=40", "--eval-limit",    \
      "200", "--quiet", "--checkpoint-every", "20"

/* The reference run, once: its losses in g_tmp/ref.losses, its checkpoints
 * under g_tmp/ref. */
static int setup(void **state) {
  snprintf(g_tmp, sizeof g_tmp, "/tmp/axon_relayoutXXXXXX");
  assert_non_null(mkdtemp(g_tmp));
  char dir[128], log[128], out[128];
  snprintf(dir, sizeof dir, "%s/ref", g_tmp);
  snprintf(log, sizeof log, "%s/ref.losses", g_tmp);
  snprintf(out, sizeof out, "%s/ref.out", g_tmp);
  const char *a[] = {
      "train",      COMMON, "--local",        "4", "--mode",           "1f1b",
      "--loss-log", log,    "--microbatches", "4", "--checkpoint-dir", dir,
      NULL};
  int st = mt_run_axon(out, NULL, 300000, a);
  if (st != 0) {
    char *o = mt_slurp(out);
    fprintf(stderr, "---- reference run ----\n%s\n", o ? o : "");
    free(o);
  }
  return st;
}

static int teardown(void **state) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
  return system(cmd) == 0 ? 0 : -1;
}

/* The whole model's parameters of the newest checkpoint under dir. */
static ax_net *final_net(const char *dir) {
  ax_net *net = NULL;
  ax_ckpt_info info;
  AX_ASSERT_OK(ax_ckpt_load_net(dir, AX_CPU, &net, &info));
  assert_int_equal(info.step, 40);
  return net;
}

/* Resumes the reference's step-20 checkpoint with the layout options
 * `lay` (NULL-terminated) into g_tmp/NAME; returns axon-run's status. */
static int resume(const char *name, const char *const *lay) {
  char dir[128], log[128], out[128], from[128];
  snprintf(dir, sizeof dir, "%s/%s", g_tmp, name);
  snprintf(log, sizeof log, "%s/%s.losses", g_tmp, name);
  snprintf(out, sizeof out, "%s/%s.out", g_tmp, name);
  snprintf(from, sizeof from, "%s/ref/ckpt-00000020", g_tmp);
  const char *a[48] = {"train",    COMMON, "--loss-log",       log,
                       "--resume", from,   "--checkpoint-dir", dir};
  int n = 0;
  while (a[n])
    n++;
  for (int i = 0; lay[i] && n < 46; i++)
    a[n++] = lay[i];
  a[n] = NULL;
  int st = mt_run_axon(out, NULL, 300000, a);
  if (st != 0) {
    char *o = mt_slurp(out);
    fprintf(stderr, "---- %s ----\n%s\n", name, o ? o : "");
    free(o);
  }
  return st;
}

/* The options of lay, space-separated, into out. */
static const char *joined(const char *const *lay, char *out, size_t cap) {
  size_t n = 0;
  out[0] = 0;
  for (int i = 0; lay[i] && n < cap; i++)
    n += (size_t)snprintf(out + n, cap - n, "%s%s", i ? " " : "", lay[i]);
  return out;
}

/* Every loss line of g_tmp/NAME.losses equals g_tmp/REF.losses's line of
 * that step, every bit; returns the lines compared. */
static long same_losses(const char *refname, const char *name) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s.losses", g_tmp, refname);
  char *ref = mt_slurp(path);
  snprintf(path, sizeof path, "%s/%s.losses", g_tmp, name);
  char *got = mt_slurp(path);
  assert_non_null(ref);
  assert_non_null(got);
  long n = 0;
  for (char *line = got; *line; n++) {
    long step;
    assert_int_equal(sscanf(line, "%ld", &step), 1);
    char key[32];
    snprintf(key, sizeof key, "\n%ld ", step);
    const char *r = strstr(ref, key);
    assert_non_null(r);
    size_t len = strcspn(line, "\n");
    if (strncmp(r + 1, line, len))
      fail_msg("%s: step %ld: '%.*s', %s '%.*s'", name, step, (int)len, line,
               refname, (int)strcspn(r + 1, "\n"), r + 1);
    line += len + (line[len] == '\n');
  }
  free(ref);
  free(got);
  return n;
}

/* ||a - b|| / ||b|| of NAME's final parameters against the reference's. */
static double param_diff(const char *name) {
  char dir[128];
  snprintf(dir, sizeof dir, "%s/ref", g_tmp);
  ax_net *ref = final_net(dir);
  snprintf(dir, sizeof dir, "%s/%s", g_tmp, name);
  ax_net *got = final_net(dir);
  assert_int_equal(ref->n_params, got->n_params);
  const float *a = ax_f32(got->params), *b = ax_f32(ref->params);
  double d = 0, nb = 0;
  for (size_t i = 0; i < ref->n_params; i++) {
    d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    nb += (double)b[i] * b[i];
  }
  ax_net_free(ref);
  ax_net_free(got);
  return sqrt(d / nb);
}

static void test_recut_bit_for_bit(void **state) {
  static const char *const lays[][9] = {
      {"--local", "2", "--mode", "gpipe", "--microbatches", "4", NULL},
      {"--local", "3", "--mode", "1f1b", "--microbatches", "4", NULL},
      {"--local", "2", "--mode", "interleaved", "--chunks", "2",
       "--microbatches", "4", NULL},
      {"--local", "2", "--mode", "zbv", "--chunks", "2", "--microbatches", "4",
       NULL},
      /* the same 4 micro-batches as 2 replicas of 2 (the sum tree) */
      {"--local", "4", "--replicas", "2", "--mode", "1f1b", "--microbatches",
       "2", NULL},
  };
  for (size_t i = 0; i < sizeof lays / sizeof *lays; i++) {
    char name[16];
    snprintf(name, sizeof name, "recut%zu", i);
    assert_int_equal(resume(name, lays[i]), 0);
    long n = same_losses("ref", name);
    assert_int_equal(n, 20);
    double d = param_diff(name);
    char l[128];
    fprintf(stderr,
            "  K=4 1f1b M=4 -> %s: %ld losses and the final parameters "
            "equal bit for bit (difference %g)\n",
            joined(lays[i], l, sizeof l), n, d);
    assert_true(d == 0.0);
  }
}

static void test_other_sums_within_tolerance(void **state) {
  static const char *const lays[][9] = {
      {"--local", "2", "--mode", "gpipe", "--microbatches", "8", NULL},
      {"--local", "4", "--replicas", "2", "--mode", "1f1b", "--microbatches",
       "4", NULL},
      {"--local", "1", "--mode", "sequential", NULL},
  };
  for (size_t i = 0; i < sizeof lays / sizeof *lays; i++) {
    char name[16];
    snprintf(name, sizeof name, "sum%zu", i);
    assert_int_equal(resume(name, lays[i]), 0);
    double d = param_diff(name);
    char l[128];
    fprintf(stderr,
            "  K=4 1f1b M=4 -> %s: final parameters within %.2g relative\n",
            joined(lays[i], l, sizeof l), d);
    assert_true(d <= 1e-5);
  }
}

static void test_other_math_refused(void **state) {
  char out[128];
  snprintf(out, sizeof out, "%s/bad.out", g_tmp);
  char from[128];
  snprintf(from, sizeof from, "%s/ref", g_tmp);
  const char *a[] = {"train",
                     "--dataset",
                     "synthetic",
                     "--data-config",
                     "shape=64,classes=10,examples=2048",
                     "--model",
                     "mlp",
                     "--model-config",
                     "widths=64/64/64/64/64/64/64/64/10",
                     "--steps",
                     "40",
                     "--batch",
                     "64",
                     "--optim",
                     "opt=adamw,lr=2e-3,sched=cosine,total=40",
                     "--quiet",
                     "--local",
                     "2",
                     "--resume",
                     from,
                     NULL};
  assert_int_equal(mt_run_axon(out, NULL, 120000, a), 1);
  char *o = mt_slurp(out);
  assert_non_null(o);
  if (!strstr(o, "optim: checkpoint") || !strstr(o, "batch: checkpoint '32'"))
    fail_msg("no key named in:\n%s", o);
  free(o);
}

/* Runs axon-run train with COMMON, the options in opt and the last ones
 * given (NULL-terminated); the loss log into g_tmp/NAME.losses. */
static void run_named(const char *name, const char *const *opt, const char *x1,
                      const char *x2, const char *x3, const char *x4) {
  char dir[128], log[128], out[128];
  snprintf(dir, sizeof dir, "%s/%s", g_tmp, name);
  snprintf(log, sizeof log, "%s/%s.losses", g_tmp, name);
  snprintf(out, sizeof out, "%s/%s.out", g_tmp, name);
  const char *a[48] = {"train", COMMON, "--loss-log", log, "--checkpoint-dir",
                       dir};
  int n = 0;
  while (a[n])
    n++;
  for (int i = 0; opt[i]; i++)
    a[n++] = opt[i];
  const char *x[4] = {x1, x2, x3, x4};
  for (int i = 0; i < 4 && x[i]; i++)
    a[n++] = x[i];
  a[n] = NULL;
  int st = mt_run_axon(out, NULL, 300000, a);
  if (st != 0) {
    char *o = mt_slurp(out);
    fprintf(stderr, "---- %s ----\n%s\n", name, o ? o : "");
    free(o);
  }
  assert_int_equal(st, 0);
}

static void test_staleness_history_resumes(void **state) {
  static const char *const rules[][9] = {
      {"--local", "4", "--mode", "2bw", "--staleness", "predict",
       "--microbatches", "4", NULL},
      {"--local", "4", "--mode", "pipedream", "--staleness", "pipemare",
       "--microbatches", "4", NULL},
  };
  for (size_t i = 0; i < sizeof rules / sizeof *rules; i++) {
    char ref[32], res[32], from[128];
    snprintf(ref, sizeof ref, "stale%zu", i);
    snprintf(res, sizeof res, "stale%zu-resumed", i);
    run_named(ref, rules[i], NULL, NULL, NULL, NULL);
    snprintf(from, sizeof from, "%s/%s/ckpt-00000020", g_tmp, ref);
    run_named(res, rules[i], "--resume", from, NULL, NULL);
    long n = same_losses(ref, res);
    assert_int_equal(n, 20);
    fprintf(stderr,
            "  %s %s: resumed at step 20, %ld losses equal bit for bit\n",
            rules[i][3], rules[i][5], n);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_recut_bit_for_bit),
      cmocka_unit_test(test_other_sums_within_tolerance),
      cmocka_unit_test(test_other_math_refused),
      cmocka_unit_test(test_staleness_history_resumes),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
