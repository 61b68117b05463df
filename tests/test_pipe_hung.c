/* A hung (SIGSTOPped) stage during `axon-run train --local 3`: the run
 * stops with a clear error naming the stage, and axon-run does not wait on
 * the stopped child: it exits non-zero within a few
 * seconds of the stop (heartbeats notice the stage after the 3 s peer
 * timeout; before the fix the stopped child then cost 10 s more, 24.8 s in
 * all), and leaves no child behind. This process is a child subreaper, so
 * an agent that axon-run failed to reap comes back here and is counted. */
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "harness.h"
#include "tests/mp_testutil.h"

/* The children of pid, from /proc (at most max). */
static int children_of(pid_t pid, pid_t *out, int max) {
  int n = 0;
  DIR *d = opendir("/proc");
  struct dirent *e;
  while (d && (e = readdir(d)) && n < max) {
    pid_t c = (pid_t)atoi(e->d_name);
    if (c <= 0)
      continue;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)c);
    FILE *f = fopen(path, "r");
    if (!f)
      continue;
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = 0;
    const char *rp = strrchr(buf, ')'); /* after the command name */
    int ppid = 0;
    char st;
    if (rp && sscanf(rp + 1, " %c %d", &st, &ppid) == 2 && ppid == pid)
      out[n++] = c;
  }
  if (d)
    closedir(d);
  return n;
}

/* The --name argument of agent pid into name. */
static void agent_name(pid_t pid, char *name, size_t len) {
  char path[64], buf[4096];
  snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
  FILE *f = fopen(path, "r");
  size_t got = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f)
    fclose(f);
  buf[got] = 0;
  snprintf(name, len, "?");
  for (size_t i = 0; i < got; i += strlen(buf + i) + 1)
    if (!strcmp(buf + i, "--name") && i + 7 < got)
      snprintf(name, len, "%s", buf + i + 7);
}

static void test_stopped_stage(void **state) {
  char log[] = "/tmp/axon-hung-XXXXXX";
  int fd = mkstemp(log);
  assert_true(fd >= 0);
  close(fd);
  const char *av[] = {"train",
                      "--local",
                      "3",
                      "--mode",
                      "gpipe",
                      "--dataset",
                      "synthetic",
                      "--data-config",
                      "shape=64,classes=10,examples=100000",
                      "--model",
                      "mlp",
                      "--model-config",
                      "widths=64/64/64/10",
                      "--steps",
                      "1000000",
                      "--quiet",
                      NULL};
  pid_t run = mt_spawn_axon_run(log, av);
  /* Waits until the three agents run and the training started. */
  pid_t kids[8];
  int nk = 0;
  for (int i = 0; i < 300 && nk < 3; i++) {
    rt_sleep_ms(50);
    nk = children_of(run, kids, 8);
  }
  assert_int_equal(nk, 3);
  rt_sleep_ms(1500);
  pid_t victim = kids[1];
  char name[64];
  agent_name(victim, name, sizeof name);
  fprintf(stderr, "  stopping agent %s (pid %d)\n", name, (int)victim);
  assert_int_equal(kill(victim, SIGSTOP), 0);
  int64_t t0 = ax_clock_ms();
  int st = 0;
  while (waitpid(run, &st, WNOHANG) == 0 && ax_clock_ms() - t0 < 60000)
    rt_sleep_ms(20);
  double took = (double)(ax_clock_ms() - t0) / 1e3;
  if (ax_clock_ms() - t0 >= 60000) {
    kill(run, SIGKILL);
    waitpid(run, &st, 0);
  }
  FILE *f = fopen(log, "r");
  char out[16384] = "";
  size_t got = f ? fread(out, 1, sizeof out - 1, f) : 0;
  out[got] = 0;
  if (f)
    fclose(f);
  unlink(log);
  fprintf(stderr, "  axon-run exited %.1f s after the SIGSTOP, status %d\n",
          took, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  fprintf(stderr, "---- output ----\n%s----\n", out);
  /* Nothing left: every agent was reaped by axon-run (an orphan would be
   * reparented to this subreaper and show up here). */
  int left = 0;
  for (int i = 0; i < nk; i++)
    if (kill(kids[i], 0) == 0) {
      int s2;
      if (waitpid(kids[i], &s2, WNOHANG) == 0) {
        fprintf(stderr, "  agent %d still running\n", (int)kids[i]);
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
      }
      left++;
    }
  assert_true(WIFEXITED(st));
  assert_int_not_equal(WEXITSTATUS(st), 0);
  assert_non_null(strstr(out, "peer is down"));
  char want[96];
  snprintf(want, sizeof want, "on agent %s", name);
  assert_non_null(strstr(out, want));
  assert_int_equal(left, 0);
  /* Detection takes the 3 s peer timeout; the end must not add the old
   * 10 s wait on the stopped child. Generous under load. */
  assert_true(took < 9.0);
}

int main(void) {
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stopped_stage),
  };
  return AX_TEST_MAIN(tests);
}
