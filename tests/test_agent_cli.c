/* Command-line input of axon-agent and axon-run: every numeric flag is
 * range-checked (exit status 2 with a message naming the flag), unknown
 * configuration keys are refused with the known ones listed, a device that
 * does not exist is named as such, and an unreachable master is reported
 * within a few seconds with visible retries and the --join-timeout bound. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/launch.h"
#include "harness.h"
#include "tests/mp_testutil.h"

/* Runs program `prog` (a built one) with the NULL-terminated arguments;
 * returns its exit status (-1 if it did not exit) and its stderr in err. */
static int run(const char *prog, const char *const *args, char *err, size_t len,
               int64_t *ms) {
  char path[512], tmpl[] = "/tmp/axon_cli_err_XXXXXX";
  mt_bin_path(prog, path, sizeof path);
  int fd = mkstemp(tmpl);
  assert_true(fd >= 0);
  const char *av[32] = {path};
  for (int n = 1; args[n - 1] && n < 31; n++)
    av[n] = args[n - 1];
  int64_t t0 = ax_clock_ms();
  ax_spawn_opts o = {.argv = av, .err = tmpl, .pin = -1};
  pid_t pid = ax_local_spawn(&o);
  assert_true(pid > 0);
  int st = 0;
  waitpid(pid, &st, 0);
  if (ms)
    *ms = ax_clock_ms() - t0;
  ssize_t have = pread(fd, err, len - 1, 0);
  err[have > 0 ? have : 0] = 0;
  close(fd);
  unlink(tmpl);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Expects exit status `code` and `needle` in the error output. */
static void expect(const char *prog, const char *const *args, int code,
                   const char *needle) {
  static char err[16384];
  int rc = run(prog, args, err, sizeof err, NULL);
  if (rc != code || !strstr(err, needle)) {
    fprintf(stderr, "%s %s...: status %d (want %d), stderr:\n%s\n", prog,
            args[0], rc, code, err);
    fail();
  }
}

static void test_agent_numbers(void **state) {
  const char *const cases[][3] = {
      {"--listen", "127.0.0.1:70000", "--listen"},
      {"--listen", "127.0.0.1", "HOST:PORT"},
      {"--master", "127.0.0.1:0", "--master"},
      {"--metrics-port", "65536", "--metrics-port"},
      {"--metrics-port", "-1", "--metrics-port"},
      {"--threads", "0", "--threads"},
      {"--threads", "4x", "--threads"},
      {"--world-size", "0", "--world-size"},
      {"--rank", "-2", "--rank"},
      {"--heartbeat-ms", "0", "--heartbeat-ms"},
      {"--peer-timeout-ms", "-5", "--peer-timeout-ms"},
      {"--join-timeout-ms", "0", "--join-timeout-ms"},
      {"--max-msg-bytes", "-1", "--max-msg-bytes"},
      {"--max-values", "0", "--max-values"},
      {"--max-call-depth", "0", "--max-call-depth"},
      {"--max-grpc-msg-bytes", "1Q", "--max-grpc-msg-bytes"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *args[] = {"--name", "x", cases[i][0], cases[i][1], NULL};
    expect("axon-agent", args, 2, cases[i][2]);
  }
}

static void test_agent_device(void **state) {
  const char *args[] = {"--name", "x", "--device", "cuda:7", NULL};
  expect("axon-agent", args, 2, "cuda:7 does not exist");
}

/* An unreachable master: retries are visible, and the bound is the
 * --join-timeout. */
static void test_agent_unreachable_master(void **state) {
  static char err[16384];
  int port = rt_free_port(); /* nothing listens there */
  char master[64];
  snprintf(master, sizeof master, "127.0.0.1:%d", port);
  const char *args[] = {"--name",         "x",    "--master", master,
                        "--join-timeout", "3000", NULL};
  int64_t ms = 0;
  int rc = run("axon-agent", args, err, sizeof err, &ms);
  fprintf(stderr, "unreachable master reported after %lld ms\n", (long long)ms);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(err, "not reachable"));
  assert_non_null(strstr(err, "retrying"));
  assert_non_null(strstr(err, "not complete in 3000 ms"));
  assert_true(ms < 20000);
}

static void test_run_numbers(void **state) {
  const char *const cases[][3] = {
      {"--steps", "-3", "--steps"},
      {"--steps", "0", "--steps"},
      {"--epochs", "0", "--epochs"},
      {"--batch", "0", "--batch"},
      {"--eval-batch", "-1", "--eval-batch"},
      {"--eval-limit", "0", "--eval-limit"},
      {"--seed", "x", "--seed"},
      {"--threads", "0", "--threads"},
      {"--local", "0", "--local"},
      {"--local", "99", "--local"},
      {"--stages", "-1", "--stages"},
      {"--microbatches", "0", "--microbatches"},
      {"--agent-threads", "0", "--agent-threads"},
      {"--master", "host:99999", "--master"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *args[] = {"train", cases[i][0], cases[i][1], NULL};
    expect("axon-run", args, 2, cases[i][2]);
  }
  const char *dev[] = {"train", "--device", "cuda:7", NULL};
  expect("axon-run", dev, 2, "cuda:7 does not exist");
}

/* A tiny pipeline run with the options after "--steps 2" (exit 0). */
static void expect_trains(const char *const *opts) {
  const char *args[32] = {"train",
                          "--model-config",
                          "widths=8/6/6/4",
                          "--dataset",
                          "synthetic",
                          "--data-config",
                          "shape=8,classes=4,examples=64,seed=3",
                          "--optim",
                          "opt=sgd,lr=0.1,momentum=0.9",
                          "--steps",
                          "2",
                          "--quiet"};
  int n = 12;
  while (*opts && n < 31)
    args[n++] = *opts++;
  args[n] = NULL;
  expect("axon-run", args, 0, "");
}

/* --staleness and PipeMare's settings: checked before any agent starts. A
 * correction runs with --zero and with --optimizer-host; the two together
 * are refused for where they keep the optimizer state. */
static void test_run_staleness(void **state) {
  const char *bad[] = {"train", "--staleness", "sometimes", NULL};
  expect("axon-run", bad, 2, "expected none, predict or pipemare");
  const char *flushed[] = {"train", "--local",     "2",       "--mode",
                           "gpipe", "--staleness", "predict", NULL};
  expect("axon-run", flushed, 2, "asynchronous modes");
  const char *gamma[] = {"train", "--pipemare-gamma", "1.5", NULL};
  expect("axon-run", gamma, 2, "--pipemare-gamma");
  const char *warm[] = {"train", "--pipemare-warmup", "-1", NULL};
  expect("axon-run", warm, 2, "--pipemare-warmup");
  const char *zero[] = {"--local",     "4",        "--replicas", "2",
                        "--zero",      "1",        "--mode",     "pipedream",
                        "--staleness", "pipemare", NULL};
  expect_trains(zero);
  const char *host[] = {"--local",          "2",   "--mode",      "2bw",
                        "--microbatches",   "2",   "--staleness", "predict",
                        "--optimizer-host", "opt", NULL};
  expect_trains(host);
  const char *both[] = {"train",       "--local",  "4",
                        "--replicas",  "2",        "--zero",
                        "1",           "--mode",   "pipedream",
                        "--staleness", "pipemare", "--optimizer-host",
                        "opt",         NULL};
  expect("axon-run", both, 2, "whole on that agent, so not with --zero");
}

static void test_run_unknown_keys(void **state) {
  const char *m[] = {
      "train", "--model-config", "widths=784/10,bogus=1", "--steps", "1", NULL};
  expect("axon-run", m, 2, "unknown model-config key 'bogus' (known: widths)");
  const char *o[] = {"train",   "--optim", "opt=sgd,lr=0.1,momentun=0.9",
                     "--steps", "1",       NULL};
  expect("axon-run", o, 2, "unknown optim key 'momentun' (known: opt, lr");
  const char *d[] = {
      "train",   "--dataset", "synthetic", "--data-config", "shape=8,clases=4",
      "--steps", "1",         NULL};
  expect("axon-run", d, 2, "unknown data-config key 'clases'");
  /* Valid keys still train (a tiny synthetic run). */
  const char *ok[] = {"train",
                      "--model-config",
                      "widths=8/4",
                      "--dataset",
                      "synthetic",
                      "--data-config",
                      "shape=8,classes=4,examples=64,seed=3",
                      "--optim",
                      "opt=sgd,lr=0.1,momentum=0.9",
                      "--steps",
                      "2",
                      "--quiet",
                      NULL};
  expect("axon-run", ok, 0, "");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_agent_numbers),
      cmocka_unit_test(test_agent_device),
      cmocka_unit_test(test_run_staleness),
      cmocka_unit_test(test_agent_unreachable_master),
      cmocka_unit_test(test_run_numbers),
      cmocka_unit_test(test_run_unknown_keys),
  };
  return AX_TEST_MAIN(tests);
}
