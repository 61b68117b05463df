/* Checkpoints through axon-run, as a user runs them (--local worlds):
 *  - kill -9 of the coordinator mid-run, then the same command line with
 *    --resume: the per-step losses (--loss-log, every bit) from the resumed
 *    step on, the final test accuracy and test loss equal the uninterrupted
 *    run's: without checkpoints for gpipe and 1f1b, with the same
 *    --checkpoint-every (the same cuts) for pipedream;
 *  - a K=4 ResNet20 (batch-norm buffers) checkpoint evaluated in one process
 *    (axon-run eval), directly and after axon-run export, gives the
 *    distributed model's test accuracy and loss exactly;
 *  - a damaged newest checkpoint is refused by --resume and eval with an
 *    error naming the file and the previous complete checkpoint, which
 *    still evaluates.
 * This process is a child subreaper: the agents of a killed axon-run come
 * back here, and each test waits until every one of them has exited by
 * itself (they see their master go down). Zero live RRefs, contexts and
 * calls after checkpointing and restoring are checked on real agents by
 * test_pipe_ckpt. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "tests/mp_testutil.h"

static char g_tmp[64];

/* "key=VALUE" of the summary line in out, into v. */
static void field(const char *out, const char *key, char *v, size_t len) {
  const char *s = out ? strstr(out, "summary:") : NULL;
  if (!s)
    s = out ? strstr(out, "eval:") : NULL;
  const char *at = s ? strstr(s, key) : NULL;
  if (!at)
    fprintf(stderr, "---- no %s in ----\n%s\n----\n", key, out ? out : "");
  assert_non_null(at);
  at += strlen(key);
  size_t n = strcspn(at, " \n");
  snprintf(v, len, "%.*s", (int)(n < len ? n : len - 1), at);
}

/* Waits until every orphaned agent that came back to this subreaper has
 * exited (they see their master go down); fails if one is still running
 * after 30 s. */
static void reap_orphans(void) {
  int64_t end = ax_clock_ms() + 30000;
  for (;;) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p < 0)
      return; /* no child left */
    if (p == 0 && ax_clock_ms() > end) {
      fprintf(stderr, "  an agent is still running 30 s after its master "
                      "was killed\n");
      fail();
    }
    if (p == 0)
      rt_sleep_ms(50);
  }
}

#define COMMON                                                                 \
  "--local", "3", "--dataset", "synthetic", "--data-config",                   \
      "shape=64,classes=10,examples=2048", "--model", "mlp", "--model-config", \
      "widths=64/64/64/10", "--steps", "300", "--batch", "32", "--optim",      \
      "opt=adamw,lr=1e-3,sched=cosine,total=300", "--eval-limit", "500",       \
      "--quiet", "--microbatches", "4"

static void run_resume(const char *mode, int cut) {
  char d[256], ref_log[300], a_log[300], b_log[300], out[300], watch[300];
  snprintf(d, sizeof d, "%s/%s", g_tmp, mode);
  snprintf(ref_log, sizeof ref_log, "%s-ref.losses", d);
  snprintf(a_log, sizeof a_log, "%s-a.losses", d);
  snprintf(b_log, sizeof b_log, "%s-b.losses", d);
  snprintf(out, sizeof out, "%s.out", d);
  snprintf(watch, sizeof watch, "%s/ckpt-00000030/MANIFEST", d);
  char refdir[300];
  snprintf(refdir, sizeof refdir, "%s-refckpt", d);
  /* The uninterrupted run: with the same cuts for an async mode. */
  const char *ref[] = {"train",
                       COMMON,
                       "--mode",
                       mode,
                       "--loss-log",
                       ref_log,
                       cut ? "--checkpoint-dir" : NULL,
                       refdir,
                       "--checkpoint-every",
                       "10",
                       NULL};
  assert_int_equal(mt_run_axon(out, NULL, 300000, ref), 0);
  char *ro = mt_slurp(out);
  char acc[32], loss[32];
  field(ro, "test_accuracy=", acc, sizeof acc);
  field(ro, "test_loss=", loss, sizeof loss);
  free(ro);
  /* Killed (-9) right after its checkpoint at step 30. */
  const char *a[] = {"train",
                     COMMON,
                     "--mode",
                     mode,
                     "--loss-log",
                     a_log,
                     "--checkpoint-dir",
                     d,
                     "--checkpoint-every",
                     "10",
                     NULL};
  int st = mt_run_axon(out, watch, 300000, a);
  assert_int_equal(st, 128 + SIGKILL);
  reap_orphans();
  const char *b[] = {"train",
                     COMMON,
                     "--mode",
                     mode,
                     "--loss-log",
                     b_log,
                     "--checkpoint-dir",
                     d,
                     "--checkpoint-every",
                     "10",
                     "--resume",
                     d,
                     NULL};
  st = mt_run_axon(out, NULL, 300000, b);
  char *bo = mt_slurp(out);
  if (st != 0)
    fprintf(stderr, "---- resumed run ----\n%s\n----\n", bo);
  assert_int_equal(st, 0);
  char acc2[32], loss2[32];
  field(bo, "test_accuracy=", acc2, sizeof acc2);
  field(bo, "test_loss=", loss2, sizeof loss2);
  free(bo);
  /* Step by step, every bit. */
  char *rl = mt_slurp(ref_log), *bl = mt_slurp(b_log);
  assert_non_null(rl);
  assert_non_null(bl);
  long first = -1, n = 0;
  for (char *line = bl; *line; line = strchr(line, '\n') + 1) {
    long step;
    assert_int_equal(sscanf(line, "%ld", &step), 1);
    if (first < 0)
      first = step;
    char key[32];
    snprintf(key, sizeof key, "\n%ld ", step);
    const char *r = step == 0 ? rl : strstr(rl, key);
    assert_non_null(r);
    r += *r == '\n';
    size_t len = strcspn(line, "\n");
    if (strncmp(r, line, len + 1)) {
      fprintf(stderr, "  resumed '%.*s', reference '%.*s'\n", (int)len, line,
              (int)strcspn(r, "\n"), r);
      fail();
    }
    n++;
    if (!strchr(line, '\n'))
      break;
  }
  fprintf(stderr,
          "  %s: resumed at step %ld, %ld losses equal bit for bit; "
          "test accuracy %s / %s, loss %s / %s\n",
          mode, first, n, acc2, acc, loss2, loss);
  assert_true(first >= 30 && first < 300);
  assert_int_equal(first + n, 300);
  assert_string_equal(acc, acc2);
  assert_string_equal(loss, loss2);
  free(rl);
  free(bl);
  reap_orphans();
}

static void test_resume_gpipe(void **state) { run_resume("gpipe", 0); }
static void test_resume_1f1b(void **state) { run_resume("1f1b", 0); }
static void test_resume_pipedream(void **state) { run_resume("pipedream", 1); }

#define RESNET                                                                 \
  "--local", "4", "--mode", "1f1b", "--model", "resnet20", "--dataset",        \
      "synthetic", "--data-config", "shape=1/32/32,classes=10,examples=256",   \
      "--steps", "4", "--batch", "16", "--eval-batch", "32", "--eval-limit",   \
      "96", "--quiet", "--checkpoint-dir", dir, "--checkpoint-every", "2"

static void test_export_eval(void **state) {
  char dir[256], out[300], model[300];
  snprintf(dir, sizeof dir, "%s/resnet", g_tmp);
  snprintf(out, sizeof out, "%s.out", dir);
  snprintf(model, sizeof model, "%s/model.bin", g_tmp);
  const char *tr[] = {"train", RESNET, NULL};
  assert_int_equal(mt_run_axon(out, NULL, 300000, tr), 0);
  char *o = mt_slurp(out);
  char acc[32], loss[32], acc2[32], loss2[32];
  field(o, "test_accuracy=", acc, sizeof acc);
  field(o, "test_loss=", loss, sizeof loss);
  free(o);
  const char *ev[] = {"eval", "--checkpoint", dir,  "--eval-batch",
                      "32",   "--eval-limit", "96", NULL};
  assert_int_equal(mt_run_axon(out, NULL, 60000, ev), 0);
  o = mt_slurp(out);
  field(o, "test_accuracy=", acc2, sizeof acc2);
  field(o, "test_loss=", loss2, sizeof loss2);
  free(o);
  fprintf(stderr, "  distributed K=4: %s %s; one process: %s %s\n", acc, loss,
          acc2, loss2);
  assert_string_equal(acc, acc2);
  assert_string_equal(loss, loss2);
  const char *ex[] = {"export", "--checkpoint", dir, "--out", model, NULL};
  assert_int_equal(mt_run_axon(out, NULL, 60000, ex), 0);
  const char *em[] = {"eval", "--checkpoint", model, "--eval-batch",
                      "32",   "--eval-limit", "96",  NULL};
  assert_int_equal(mt_run_axon(out, NULL, 60000, em), 0);
  o = mt_slurp(out);
  field(o, "test_accuracy=", acc2, sizeof acc2);
  field(o, "test_loss=", loss2, sizeof loss2);
  free(o);
  fprintf(stderr, "  exported file: %s %s\n", acc2, loss2);
  assert_string_equal(acc, acc2);
  assert_string_equal(loss, loss2);
}

static void test_damaged_refused(void **state) {
  char dir[256], out[300], file[400];
  snprintf(dir, sizeof dir, "%s/resnet", g_tmp); /* test_export_eval's */
  snprintf(out, sizeof out, "%s-bad.out", dir);
  snprintf(file, sizeof file, "%s/ckpt-00000004/stage-02.axck", dir);
  char *orig = mt_slurp(file);
  assert_non_null(orig);
  struct stat sb;
  assert_int_equal(stat(file, &sb), 0);
  FILE *f = fopen(file, "r+b");
  assert_non_null(f);
  fseek(f, sb.st_size / 2, SEEK_SET);
  fputc(orig[sb.st_size / 2] ^ 1, f); /* one bit */
  fclose(f);
  free(orig);
  const char *tr[] = {"train", RESNET, "--resume", dir, NULL};
  int st = mt_run_axon(out, NULL, 300000, tr);
  char *o = mt_slurp(out);
  fprintf(stderr, "  resume: status %d: %s", st,
          o && strstr(o, "axon-run: ") ? strstr(o, "axon-run: ") : "?\n");
  assert_int_not_equal(st, 0);
  assert_non_null(strstr(o, "stage-02.axck"));
  assert_non_null(strstr(o, "ckpt-00000002"));
  free(o);
  reap_orphans();
  const char *ev[] = {"eval", "--checkpoint", dir, NULL};
  assert_int_not_equal(mt_run_axon(out, NULL, 60000, ev), 0);
  o = mt_slurp(out);
  assert_non_null(strstr(o, "stage-02.axck"));
  free(o);
  char prev[300];
  snprintf(prev, sizeof prev, "%s/ckpt-00000002", dir);
  const char *ep[] = {"eval", "--checkpoint", prev, "--eval-limit", "32", NULL};
  assert_int_equal(mt_run_axon(out, NULL, 60000, ep), 0);
}

int main(void) {
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  snprintf(g_tmp, sizeof g_tmp, "/tmp/axon-ckcli-%d", (int)getpid());
  mkdir(g_tmp, 0755);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resume_gpipe),
      cmocka_unit_test(test_resume_1f1b),
      cmocka_unit_test(test_resume_pipedream),
      cmocka_unit_test(test_export_eval),
      cmocka_unit_test(test_damaged_refused),
  };
  int failed = AX_TEST_MAIN(tests);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
  if (system(cmd) != 0)
    fprintf(stderr, "cannot remove %s\n", g_tmp);
  return failed;
}
