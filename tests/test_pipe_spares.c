/* Recovering a lost stage with --spares and --restarts (axon-run): a stage
 * agent is killed with SIGKILL between two checkpoints; the coordinator
 * replaces it with the spare (no outside action), or waits until an agent
 * started again under the same name rejoined; every stage rolls back to
 * the newest checkpoint and training goes on. Oracle: the run ends with exit
 * 0, the spare holds the lost stage, and the loss of every step (the last
 * one logged for a step that ran twice, every bit) equals the run that was
 * never interrupted, which for gpipe and 1f1b means the same parameters at
 * every step: the rolled-back run took the same cuts, and a resumed run is
 * bit-identical (docs/CHECKPOINTS.md). Breaking the rollback (restoring
 * nothing, so the spare starts from initial weights) fails it. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "axon/rpc/launch.h"
#include "harness.h"
#include "tests/mp_testutil.h"

static char g_tmp[64];

static int count_lines(const char *path) {
  FILE *f = fopen(path, "r");
  int n = 0, c;
  while (f && (c = fgetc(f)) != EOF)
    n += c == '\n';
  if (f)
    fclose(f);
  return n;
}

/* The pid of the child of `parent` started as agent `name`, or -1. */
static pid_t child_agent(pid_t parent, const char *name) {
  DIR *d = opendir("/proc");
  struct dirent *e;
  pid_t found = -1;
  while (d && found < 0 && (e = readdir(d))) {
    pid_t pid = (pid_t)atoi(e->d_name);
    char path[64], buf[4096];
    if (pid <= 0)
      continue;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    int ppid = -1;
    if (f) {
      if (fscanf(f, "%*d (%*[^)]) %*c %d", &ppid) != 1)
        ppid = -1;
      fclose(f);
    }
    if (ppid != parent)
      continue;
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    int fd = open(path, O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
      close(fd);
    for (ssize_t i = 0; i + 1 < n; i++) /* "--name\0NAME\0" */
      if (!strcmp(buf + i, "--name") && i + 7 < n && !strcmp(buf + i + 7, name))
        found = pid;
  }
  if (d)
    closedir(d);
  return found;
}

/* Argument `key`'s value in process pid's command line, or the value of
 * environment variable `key` ("NAME=") in its environment, into v. */
static int proc_arg(pid_t pid, const char *file, const char *key, char *v,
                    size_t len) {
  static char buf[1 << 17];
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, file);
  int fd = open(path, O_RDONLY);
  ssize_t n = 0, k;
  while (fd >= 0 && n < (ssize_t)sizeof buf - 1 &&
         (k = read(fd, buf + n, sizeof buf - 1 - (size_t)n)) > 0)
    n += k;
  if (fd >= 0)
    close(fd);
  if (n <= 0)
    return -1;
  buf[n] = 0;
  size_t kl = strlen(key);
  for (ssize_t i = 0; i < n; i += (ssize_t)strlen(buf + i) + 1) {
    if (key[kl - 1] == '=' && !strncmp(buf + i, key, kl)) {
      snprintf(v, len, "%s", buf + i + kl);
      return 0;
    }
    if (!strcmp(buf + i, key) && i + (ssize_t)kl + 1 < n) {
      snprintf(v, len, "%s", buf + i + kl + 1);
      return 0;
    }
  }
  return -1;
}

/* Starts a replacement agent `name` joining master with the token file,
 * listening on `listen` (NULL: any port). */
static pid_t start_agent(const char *name, const char *master,
                         const char *token, const char *listen) {
  char path[4200];
  mt_bin_path("axon-agent", path, sizeof path);
  char var[4200];
  snprintf(var, sizeof var, "AXON_TOKEN_FILE=%s", token);
  const char *const env[] = {var, NULL};
  const char *argv[] = {path,       "--name",   name,
                        "--master", master,     "--threads",
                        "2",        "--listen", listen ? listen : "127.0.0.1:0",
                        NULL};
  ax_spawn_opts o = {.argv = argv, .env = env, .pin = -1};
  return ax_local_spawn(&o);
}

/* The control address agent `name` said it serves on, from axon-run's
 * output (its agents' stderr), into addr; -1 if not there. */
static int served_on(const char *out, const char *name, char *addr,
                     size_t len) {
  char *text = mt_slurp(out), key[128];
  snprintf(key, sizeof key, "axon-agent %s: serving on ", name);
  const char *at = text ? strstr(text, key) : NULL;
  if (at)
    snprintf(addr, len, "%.*s", (int)strcspn(at + strlen(key), ", \n"),
             at + strlen(key));
  free(text);
  return at ? 0 : -1;
}

enum { NO_RESTART, RESTART_ANYWHERE, RESTART_SAME_ADDRESS, RESTART_HUNG };

/* Runs axon-run with argv; with kill_at > 0, SIGKILLs its agent stage1
 * once the loss log has that many lines, and with a restart starts another
 * agent under the same name (the same master and token; with
 * RESTART_SAME_ADDRESS on the killed one's control address). RESTART_HUNG
 * stops stage1 (SIGSTOP) instead, starts the new one while the world
 * still takes the old one for alive, and wakes the old one (SIGCONT) once
 * the pipeline was rebuilt. Returns the exit status. */
static int run_axon(const char *out, const char *loss_log, int kill_at,
                    int restart, const char **argv) {
  pid_t pid = mt_spawn_axon_run(out, argv);
  if (pid < 0)
    return -1;
  int64_t end = ax_clock_ms() + 300000;
  int st = 0, killed = 0;
  pid_t again = -1, stopped = -1;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (ax_clock_ms() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    if (kill_at > 0 && !killed && count_lines(loss_log) >= kill_at) {
      pid_t a = child_agent(pid, "stage1");
      char master[64] = "", token[512] = "", listen[128] = "";
      if (a > 0 && restart &&
          (proc_arg(a, "cmdline", "--master", master, sizeof master) ||
           proc_arg(a, "environ", "AXON_TOKEN_FILE=", token, sizeof token)))
        a = -1; /* not readable yet: try again */
      if (a > 0 && restart == RESTART_SAME_ADDRESS &&
          served_on(out, "stage1", listen, sizeof listen))
        a = -1;
      int sig = restart == RESTART_HUNG ? SIGSTOP : SIGKILL;
      if (a > 0 && kill(a, sig) == 0) {
        fprintf(stderr, "  %s stage1 (pid %d) after %d steps\n",
                sig == SIGSTOP ? "stopped" : "killed", (int)a,
                count_lines(loss_log));
        killed = 1;
        stopped = sig == SIGSTOP ? a : -1;
        if (restart) {
          rt_sleep_ms(300);
          again = start_agent("stage1", master, token,
                              restart == RESTART_SAME_ADDRESS ? listen : NULL);
        }
      }
    }
    if (stopped > 0) { /* the old process wakes up after the rebuild */
      char *text = mt_slurp(out);
      if (text && strstr(text, "rebuilding the pipeline")) {
        fprintf(stderr, "  woke the old stage1 (pid %d)\n", (int)stopped);
        kill(stopped, SIGCONT);
        stopped = -1;
      }
      free(text);
    }
    rt_sleep_ms(2);
  }
  if (stopped > 0) /* never rebuilt: do not leave it stopped */
    kill(stopped, SIGKILL);
  if (again > 0) { /* it leaves when the world ends */
    int ast = 0;
    int64_t t_end = ax_clock_ms() + 20000;
    while (waitpid(again, &ast, WNOHANG) == 0 && ax_clock_ms() < t_end)
      rt_sleep_ms(20);
    if (ax_clock_ms() >= t_end) {
      kill(again, SIGKILL);
      waitpid(again, &ast, 0);
      fprintf(stderr, "  the restarted agent did not leave with the world\n");
      fail();
    }
  }
  if (kill_at > 0)
    assert_true(killed);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The last loss logged for each step (lines "step loss"), as text. */
static int last_losses(const char *path, char (*v)[40], int max) {
  FILE *f = fopen(path, "r");
  long s;
  char val[40];
  int n = 0;
  while (f && fscanf(f, "%ld %39s", &s, val) == 2)
    if (s >= 0 && s < max) {
      snprintf(v[s], 40, "%s", val);
      n = s + 1 > n ? (int)s + 1 : n;
    }
  if (f)
    fclose(f);
  return n;
}

#define STEPS 60
#define COMMON                                                                 \
  "--local", "3", "--dataset", "synthetic", "--data-config",                   \
      "shape=64,classes=10,examples=4096", "--model", "mlp", "--model-config", \
      "widths=64/64/64/10", "--steps", "60", "--batch", "32", "--optim",       \
      "opt=adamw,lr=1e-3", "--eval-limit", "200", "--microbatches", "4",       \
      "--checkpoint-every", "10"

/* A stage agent lost mid-run (restart: how it comes back; a spare when
 * NO_RESTART) with checkpoints on disk, or only in memory. */
static void run_case(const char *mode, int restart, int in_memory) {
  char d_ref[256], d_sp[256], l_ref[300], l_sp[300], o_ref[300], o_sp[300];
  snprintf(d_ref, sizeof d_ref, "%s/%s-ref", g_tmp, mode);
  snprintf(d_sp, sizeof d_sp, "%s/%s-%s%s", g_tmp, mode,
           restart == RESTART_SAME_ADDRESS ? "same-address"
           : restart == RESTART_HUNG       ? "hung"
           : restart                       ? "restart"
                                           : "spare",
           in_memory ? "-memory" : "");
  snprintf(l_ref, sizeof l_ref, "%s.losses", d_ref);
  snprintf(l_sp, sizeof l_sp, "%s.losses", d_sp);
  snprintf(o_ref, sizeof o_ref, "%s.out", d_ref);
  snprintf(o_sp, sizeof o_sp, "%s.out", d_sp);
  const char *ref[] = {
      "train", COMMON,       "--mode", mode, "--checkpoint-dir",
      d_ref,   "--loss-log", l_ref,    NULL};
  assert_int_equal(run_axon(o_ref, l_ref, 0, 0, ref), 0);
  const char *sp[] = {"train",
                      COMMON,
                      "--mode",
                      mode,
                      "--loss-log",
                      l_sp,
                      restart ? "--restarts" : "--spares",
                      restart ? "1" : "spare0",
                      in_memory ? "--checkpoint-in-memory" : "--checkpoint-dir",
                      in_memory ? NULL : d_sp,
                      NULL};
  int st = run_axon(o_sp, l_sp, 25, restart, sp);
  char *out = mt_slurp(o_sp);
  if (st != 0 || !out || !strstr(out, "recovered in"))
    fprintf(stderr, "---- %s ----\n%s\n----\n", o_sp, out ? out : "");
  assert_int_equal(st, 0);
  assert_non_null(strstr(out, restart ? "stage1 rejoined; rebuilding"
                                      : "rebuilding the pipeline with spare "
                                        "spare0"));
  assert_non_null(strstr(out, "recovered in"));
  assert_non_null(strstr(out, restart ? "[1 stage1 " : "[1 spare0 "));
  /* Rolled back from the copies in memory, or from the files. */
  assert_non_null(strstr(out, in_memory ? "rolled back from memory"
                                        : "rolled back from /"));
  const char *rec = strstr(out, "recovered in");
  fprintf(stderr, "  %s: %.*s\n", mode, (int)strcspn(rec, "\n"), rec);
  free(out);
  static char a[STEPS][40], b[STEPS][40];
  memset(a, 0, sizeof a);
  memset(b, 0, sizeof b);
  assert_int_equal(last_losses(l_ref, a, STEPS), STEPS);
  assert_int_equal(last_losses(l_sp, b, STEPS), STEPS);
  assert_true(count_lines(l_sp) > STEPS); /* some steps ran twice */
  for (int s = 0; s < STEPS; s++)
    if (strcmp(a[s], b[s])) {
      fprintf(stderr, "  step %d: %s uninterrupted, %s recovered\n", s, a[s],
              b[s]);
      fail();
    }
}

static void run_mode(const char *mode, int restart) {
  run_case(mode, restart, 0);
}

static void test_gpipe(void **state) { run_mode("gpipe", NO_RESTART); }
static void test_1f1b(void **state) { run_mode("1f1b", NO_RESTART); }
/* --restarts: the same name comes back from a new process (new addresses:
 * the world's members take its rejoin from the master and dial those). */
static void test_restart_1f1b(void **state) {
  run_mode("1f1b", RESTART_ANYWHERE);
}
/* The same, on the dead process's own control address (an agent started
 * with a fixed --listen): only its new incarnation tells the new process
 * from the old, and the world must dial its new data address. */
static void test_restart_same_address(void **state) {
  run_mode("1f1b", RESTART_SAME_ADDRESS);
}
/* A hung stage1 restarted at once: the master holds the new process's
 * join until the old one is declared down (heartbeats), then takes it;
 * the old one, woken after the rebuild, is refused as an earlier
 * incarnation and changes nothing. */
static void test_restart_hung(void **state) { run_mode("1f1b", RESTART_HUNG); }
/* Checkpoints only in memory (no --checkpoint-dir): the lost stage's copy
 * comes from its neighbour's agent, the others' from their own. */
static void test_spare_from_memory(void **state) {
  run_case("1f1b", NO_RESTART, 1);
}
/* The same with a restart (the new process holds no copy; stage 1's comes
 * from stage 2's agent). */
static void test_restart_from_memory(void **state) {
  run_case("gpipe", RESTART_ANYWHERE, 1);
}

int main(void) {
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  snprintf(g_tmp, sizeof g_tmp, "/tmp/axon-spares-XXXXXX");
  if (!mkdtemp(g_tmp))
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpipe),
      cmocka_unit_test(test_1f1b),
      cmocka_unit_test(test_restart_1f1b),
      cmocka_unit_test(test_restart_same_address),
      cmocka_unit_test(test_restart_hung),
      cmocka_unit_test(test_spare_from_memory),
      cmocka_unit_test(test_restart_from_memory),
  };
  int rc = AX_TEST_MAIN(tests);
  char rm[128];
  snprintf(rm, sizeof rm, "rm -rf '%s'", g_tmp);
  if (system(rm) != 0)
    fprintf(stderr, "could not remove %s\n", g_tmp);
  return rc;
}
