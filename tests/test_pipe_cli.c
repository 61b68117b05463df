/* axon-run's pipeline paths end to end, as a user runs them:
 *  - --partition balanced with --local K on a small MLP and a small
 *    ResNet20: the split printed is contiguous (rising from 0 to the number
 *    of blocks, every stage non-empty), the run exits 0 with a summary, and
 *    the loss goes down; the same with --staleness predict on 2bw;
 *  - --stages K --agents a,b,c --master HOST:PORT against agents this test
 *    starts separately (this process is their master): the run trains and
 *    exits 0, and the agents end with zero live RRefs, contexts, calls and
 *    futures and exit cleanly on SIGTERM.
 * Every child process is waited for with a bound. The --agents case runs
 * last: it is the only one that starts gRPC in this process, and every
 * child must be forked before that. */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "axon/models/model.h"
#include "axon/runtime/pipeline/coord/coordinator.h"
#include "harness.h"
#include "tests/mp_testutil.h"

/* Runs axon-run with argv (NULL-terminated, after "train"), stdout and
 * stderr into `log`; waits up to timeout_ms. Returns the exit status, or
 * -1 on a timeout (the child is killed). */
static int run_axon_cmd(const char *log, int timeout_ms, const char *cmd,
                        const char **argv) {
  const char *av[48] = {cmd};
  int ac = 1;
  while (ac < 47 && argv[ac - 1])
    av[ac] = argv[ac - 1], ac++;
  av[ac] = NULL;
  pid_t pid = mt_spawn_axon_run(log, av);
  if (pid < 0)
    return -1;
  int64_t end = ax_clock_ms() + timeout_ms;
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (ax_clock_ms() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      fprintf(stderr, "axon-run did not finish in %d ms\n", timeout_ms);
      return -1;
    }
    rt_sleep_ms(20);
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int run_axon(const char *log, int timeout_ms, const char **argv) {
  return run_axon_cmd(log, timeout_ms, "train", argv);
}

static void dump_on_failure(const char *out) {
  fprintf(stderr, "---- axon-run output ----\n%s\n-------------------------\n",
          out ? out : "(none)");
}

/* Checks the "(blocks a/b/...)" line: K + 1 bounds rising strictly from 0
 * to n_blocks. */
static void check_split(const char *out, int K, int n_blocks) {
  const char *at = out ? strstr(out, "(blocks ") : NULL;
  if (!at)
    dump_on_failure(out);
  assert_non_null(at);
  at += strlen("(blocks ");
  int b[AX_PIPE_MAX_STAGES + 2], n = 0;
  char *end;
  for (;;) {
    long v = strtol(at, &end, 10);
    if (end == at || n > AX_PIPE_MAX_STAGES)
      break;
    b[n++] = (int)v;
    if (*end != '/')
      break;
    at = end + 1;
  }
  fprintf(stderr, "  split chosen:");
  for (int i = 0; i < n; i++)
    fprintf(stderr, "%s%d", i ? "/" : " ", b[i]);
  fprintf(stderr, "\n");
  assert_int_equal(n, K + 1);
  assert_int_equal(b[0], 0);
  assert_int_equal(b[K], n_blocks);
  for (int s = 0; s < K; s++)
    assert_true(b[s] < b[s + 1]);
}

/* Mean loss of the first and last `w` rows of the per-step metrics CSV
 * (the column named "loss"). */
static void csv_losses(const char *path, int w, double *first, double *last) {
  char *txt = mt_slurp(path);
  assert_non_null(txt);
  int col = -1, c = 0;
  char *line = strtok(txt, "\n");
  for (char *h = line, *f; h && (f = strsep(&h, ",")); c++)
    if (!strcmp(f, "loss"))
      col = c;
  assert_true(col >= 0);
  double v[4096];
  int n = 0;
  while ((line = strtok(NULL, "\n")) && n < 4096) {
    c = 0;
    for (char *h = line, *f; (f = strsep(&h, ",")); c++)
      if (c == col)
        v[n++] = atof(f);
  }
  free(txt);
  assert_true(n >= 2 * w);
  *first = *last = 0;
  for (int i = 0; i < w; i++) {
    *first += v[i] / w;
    *last += v[n - 1 - i] / w;
  }
}

static void run_balanced(const char *tag, const char **argv, int K,
                         int n_blocks) {
  char log[256], csv[256];
  snprintf(log, sizeof log, "/tmp/axon_test_pipe_cli_%d_%s.log", getpid(), tag);
  snprintf(csv, sizeof csv, "/tmp/axon_test_pipe_cli_%d_%s.csv", getpid(), tag);
  const char *av[48];
  int ac = 0;
  while (argv[ac])
    av[ac] = argv[ac], ac++;
  av[ac++] = "--partition";
  av[ac++] = "balanced";
  av[ac++] = "--csv";
  av[ac++] = csv;
  av[ac++] = "--quiet";
  av[ac] = NULL;
  double t0 = ax_clock_s();
  int rc = run_axon(log, 80000, av);
  char *out = mt_slurp(log);
  fprintf(stderr, "  %s: exit %d in %.1f s\n", tag, rc, ax_clock_s() - t0);
  if (rc != 0 || !strstr(out ? out : "", "summary:"))
    dump_on_failure(out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "summary:"));
  check_split(out, K, n_blocks);
  double first, last;
  csv_losses(csv, 3, &first, &last);
  fprintf(stderr, "  %s: loss %.4f over the first steps, %.4f over the last\n",
          tag, first, last);
  assert_true(isfinite(last));
  assert_true(last < first);
  free(out);
  unlink(log);
  unlink(csv);
}

/* axon-run plan: every mode predicted over a links file, the fastest
 * picked; a slow link lengthens the prediction; a missing pair, a cap
 * nothing fits, and probe's options on train are refused by name. */
static double plan_ms(const char *out, const char *mode) {
  char key[64];
  snprintf(key, sizeof key, "\n  %s ", mode);
  const char *at = out ? strstr(out, key) : NULL;
  double ms = -1;
  if (at)
    sscanf(at + strlen(key), " uniform %*s %lf", &ms);
  return ms;
}

static void test_plan(void **state) {
  const char *links = "/tmp/axon-test-plan-links.txt",
             *log = "/tmp/axon-test-plan.log";
  FILE *f = fopen(links, "w");
  assert_non_null(f);
  fprintf(f, "# axon-run probe: FROM TO RTT_US GBIT_S\n");
  const char *names[3] = {"a", "b", "c"};
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++)
      if (i != j)
        fprintf(f, "%s %s %s\n", names[i], names[j],
                (i == 1 && j == 2) || (i == 2 && j == 1) ? "20000 0.01"
                                                         : "50 10");
  fclose(f);
  const char *base[] = {"--model",
                        "mlp",
                        "--model-config",
                        "widths=64/256/32/32/32/10",
                        "--dataset",
                        "synthetic",
                        "--data-config",
                        "shape=64,classes=4,examples=256,seed=3",
                        "--batch",
                        "32",
                        "--stages",
                        "3",
                        "--agents",
                        "a,b,c",
                        "--links",
                        links,
                        NULL};
  int nb = 16;
  assert_int_equal(run_axon_cmd(log, 60000, "plan", base), 0);
  char *out = mt_slurp(log);
  if (!out || !strstr(out, "plan: mode="))
    dump_on_failure(out);
  assert_non_null(strstr(out, "plan: mode="));
  const char *modes[] = {"sequential", "gpipe", "1f1b", "pipedream", "2bw"};
  for (int i = 0; i < 5; i++)
    assert_true(plan_ms(out, modes[i]) > 0);
  /* b -> c is 10 ms one way: gpipe's flush pays it at least twice */
  double slow = plan_ms(out, "gpipe");
  free(out);
  /* the same with fast links everywhere */
  f = fopen(links, "w");
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++)
      if (i != j)
        fprintf(f, "%s %s 50 10\n", names[i], names[j]);
  fclose(f);
  assert_int_equal(run_axon_cmd(log, 60000, "plan", base), 0);
  out = mt_slurp(log);
  double fast = plan_ms(out, "gpipe");
  free(out);
  fprintf(stderr, "plan: gpipe %.2f ms/step over a 10 ms link, %.2f without\n",
          slow, fast);
  assert_true(slow > fast + 20 - 1e-6);
  /* a pair the file lacks */
  f = fopen(links, "w");
  fprintf(f, "a b 50 10\n");
  fclose(f);
  assert_int_equal(run_axon_cmd(log, 60000, "plan", base), 1);
  out = mt_slurp(log);
  assert_non_null(strstr(out, "has no b -> a")); /* both ways are needed */
  free(out);
  /* nothing fits a 1-byte cap */
  base[nb - 2] = "--mem-cap"; /* in place of the links */
  base[nb - 1] = "1";
  assert_int_equal(run_axon_cmd(log, 60000, "plan", base), 1);
  out = mt_slurp(log);
  assert_non_null(strstr(out, "no mode and split fits"));
  free(out);
  const char *bad[] = {"--model", "mlp", "--iters", "3", NULL};
  assert_int_equal(run_axon(log, 60000, bad), 2);
  out = mt_slurp(log);
  assert_non_null(strstr(out, "--iters is an option of axon-run probe"));
  free(out);
  unlink(links);
  unlink(log);
}

/* --checkpoint-in-memory without --checkpoint-every is refused by name
 * before any agent starts; --elastic with --zero (a lost replica's
 * optimizer shard exists nowhere else) too. */
static void test_in_memory_flags(void **state) {
  const char *log = "/tmp/axon-test-memflags.log";
  const char *no_every[] = {
      "--model", "mlp", "--local", "2", "--checkpoint-in-memory", NULL};
  assert_int_equal(run_axon(log, 30000, no_every), 2);
  char *out = mt_slurp(log);
  assert_non_null(strstr(out, "--checkpoint-in-memory needs "
                              "--checkpoint-every"));
  free(out);
  const char *replicas[] = {"--model",    "mlp",  "--local",   "4",
                            "--replicas", "2",    "--zero",    "1",
                            "--mode",     "1f1b", "--elastic", NULL};
  assert_int_equal(run_axon(log, 30000, replicas), 2);
  out = mt_slurp(log);
  assert_non_null(strstr(out, "the only copy of its shard"));
  free(out);
  unlink(log);
}

static void test_balanced_mlp(void **state) {
  const char *av[] = {"--model",
                      "mlp",
                      "--model-config",
                      "widths=64/256/32/32/32/10",
                      "--dataset",
                      "synthetic",
                      "--data-config",
                      "shape=64,classes=4,examples=256,seed=3",
                      "--optim",
                      "opt=sgd,lr=0.1",
                      "--batch",
                      "32",
                      "--eval-limit",
                      "64",
                      "--local",
                      "3",
                      "--mode",
                      "gpipe",
                      "--microbatches",
                      "2",
                      "--steps",
                      "24",
                      NULL};
  run_balanced("mlp", av, 3, 5);
}

/* --staleness end to end: a corrected asynchronous mode trains. */
static void test_staleness_mlp(void **state) {
  const char *av[] = {"--model",
                      "mlp",
                      "--model-config",
                      "widths=64/256/32/32/32/10",
                      "--dataset",
                      "synthetic",
                      "--data-config",
                      "shape=64,classes=4,examples=256,seed=3",
                      "--optim",
                      "opt=sgd,lr=0.05,momentum=0.9",
                      "--batch",
                      "32",
                      "--eval-limit",
                      "64",
                      "--local",
                      "3",
                      "--mode",
                      "2bw",
                      "--microbatches",
                      "2",
                      "--staleness",
                      "predict",
                      "--steps",
                      "24",
                      NULL};
  run_balanced("stale", av, 3, 5);
}

/* --freeze-schedule end to end: two freezes re-pack 4 agents (K = 4, then
 * 2 x 2 replicas, then 1 x 4), the phases are reported, and the summary
 * names the last pipeline; a freeze that leaves nothing to train ends the
 * run with a clear error. */
static void test_freeze_mlp(void **state) {
  const char *av[] = {"--model",
                      "mlp",
                      "--model-config",
                      "widths=64/256/32/32/32/10",
                      "--dataset",
                      "synthetic",
                      "--data-config",
                      "shape=64,classes=4,examples=256,seed=3",
                      "--optim",
                      "opt=sgd,lr=0.1",
                      "--batch",
                      "32",
                      "--eval-limit",
                      "64",
                      "--local",
                      "4",
                      "--mode",
                      "gpipe",
                      "--microbatches",
                      "2",
                      "--steps",
                      "24",
                      "--freeze-schedule",
                      "8:2:2,16:4:1",
                      NULL};
  char log[] = "/tmp/axon_cli_freezeXXXXXX";
  int fd = mkstemp(log);
  assert_true(fd >= 0);
  close(fd);
  int rc = run_axon(log, 120000, av);
  char *out = mt_slurp(log);
  if (rc != 0 || !out || !strstr(out, "final_stages=1 final_replicas=4") ||
      !strstr(out, "freeze at step 8") || !strstr(out, "the last phase"))
    dump_on_failure(out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "re-packed from 4 agents x 1 replicas to 2 x 2"));
  assert_non_null(strstr(out, "re-packed from 2 agents x 2 replicas to 1 x 4"));
  assert_non_null(
      strstr(out, "frozen_blocks=4 final_stages=1 final_replicas=4"));
  free(out);
  const char *bad[] = {"--model",
                       "mlp",
                       "--model-config",
                       "widths=64/256/32/32/32/10",
                       "--dataset",
                       "synthetic",
                       "--data-config",
                       "shape=64,classes=4,examples=256,seed=3",
                       "--batch",
                       "32",
                       "--local",
                       "2",
                       "--steps",
                       "8",
                       "--freeze-schedule",
                       "4:5",
                       NULL};
  rc = run_axon(log, 60000, bad);
  out = mt_slurp(log);
  if (rc == 0 || !out || !strstr(out, "at least one must train"))
    dump_on_failure(out);
  assert_true(rc != 0);
  assert_non_null(strstr(out, "at least one must train"));
  free(out);
  unlink(log);
}

static void test_balanced_resnet20(void **state) {
  const ax_model_def *def = ax_model_find("resnet20");
  ax_config cfg;
  ax_model_info info;
  AX_ASSERT_OK(ax_model_config(def, "in_channels=1,image=8", &cfg));
  AX_ASSERT_OK(def->describe(&cfg, &info));
  const char *av[] = {"--model",
                      "resnet20",
                      "--model-config",
                      "in_channels=1,image=8",
                      "--dataset",
                      "synthetic",
                      "--data-config",
                      "shape=1/8/8,classes=4,examples=64,"
                      "seed=3",
                      "--optim",
                      "opt=sgd,lr=0.05",
                      "--batch",
                      "8",
                      "--eval-limit",
                      "16",
                      "--local",
                      "3",
                      "--mode",
                      "pipedream",
                      "--steps",
                      "24",
                      NULL};
  run_balanced("resnet20", av, 3, info.n_blocks);
}

#define NAG 3
static void test_agents_and_master(void **state) {
  const char *names[NAG] = {"x1", "x2", "x3"};
  char log[256], master[64];
  snprintf(log, sizeof log, "/tmp/axon_test_pipe_cli_%d_agents.log", getpid());
  int port = rt_free_port();
  snprintf(master, sizeof master, "127.0.0.1:%d", port);
  pid_t pids[NAG];
  for (int i = 0; i < NAG; i++) /* forked before gRPC starts here */
    pids[i] = rt_spawn_agent(names[i], port, "--threads", "2",
                             "--peer-timeout-ms", "3000", NULL);
  const char *av[] = {"--model",        "mlp",
                      "--model-config", "widths=32/32/32/10",
                      "--dataset",      "synthetic",
                      "--data-config",  "shape=32,classes=4,examples=128",
                      "--optim",        "opt=sgd,lr=0.1",
                      "--batch",        "16",
                      "--eval-limit",   "32",
                      "--stages",       "3",
                      "--agents",       "x1,x2,x3",
                      "--master",       master,
                      "--mode",         "1f1b",
                      "--microbatches", "2",
                      "--steps",        "12",
                      "--quiet",        NULL};
  /* axon-run must fork before gRPC starts here too: start it now, without
   * waiting, and join as the master below (it retries until we listen). */
  const char *full[48] = {"train"};
  int ac = 1;
  for (int i = 0; av[i]; i++)
    full[ac++] = av[i];
  full[ac] = NULL;
  pid_t run = mt_spawn_axon_run(log, full);
  ax_node *drv = NULL;
  int rc = dt_driver("master", port, NAG + 2, &drv);
  if (rc != AX_OK)
    fprintf(stderr, "driver: %s: %s\n", ax_strerror(rc), ax_errmsg());
  int st = -1;
  int64_t end = ax_clock_ms() + 80000;
  while (run > 0 && waitpid(run, &st, WNOHANG) == 0) {
    if (ax_clock_ms() > end) {
      kill(run, SIGKILL);
      waitpid(run, &st, 0);
      st = -1;
      break;
    }
    rt_sleep_ms(20);
  }
  char *out = mt_slurp(log);
  int ok = rc == AX_OK && st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0 &&
           out && strstr(out, "summary:");
  if (!ok)
    dump_on_failure(out);
  int zero = rc == AX_OK ? dt_all_zero(drv, names, NAG) : rc;
  if (zero != AX_OK)
    fprintf(stderr, "after the run: %s: %s\n", ax_strerror(zero), ax_errmsg());
  int clean = 1;
  for (int i = 0; i < NAG; i++) {
    clean &= mt_exit_clean(rt_stop_agent(pids[i], SIGTERM, 15000));
  }
  if (drv)
    dt_driver_end(drv);
  free(out);
  unlink(log);
  assert_true(ok);
  AX_ASSERT_OK(zero);
  assert_true(clean);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan),
      cmocka_unit_test(test_in_memory_flags),
      cmocka_unit_test(test_balanced_mlp),
      cmocka_unit_test(test_staleness_mlp),
      cmocka_unit_test(test_freeze_mlp),
      cmocka_unit_test(test_balanced_resnet20),
      cmocka_unit_test(test_agents_and_master), /* last: starts gRPC */
  };
  return AX_TEST_MAIN(tests);
}
