/* Runs of axon-run train that lose an agent (test_pipe_spares.c,
 * test_pipe_recover.c): the agent's process found among axon-run's
 * children and killed (or stopped) once the loss log reached a step, an
 * agent started again under its name, and the losses the runs logged.
 * Header-only. */
#ifndef AX_TESTS_SPARES_TESTUTIL_H
#define AX_TESTS_SPARES_TESTUTIL_H

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "axon/rpc/launch.h"
#include "harness.h"
#include "tests/mp_testutil.h"

static inline int count_lines(const char *path) {
  FILE *f = fopen(path, "r");
  int n = 0, c;
  while (f && (c = fgetc(f)) != EOF)
    n += c == '\n';
  if (f)
    fclose(f);
  return n;
}

/* The pid of the child of `parent` started as agent `name`, or -1. */
static inline pid_t child_agent(pid_t parent, const char *name) {
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
static inline int proc_arg(pid_t pid, const char *file, const char *key,
                           char *v, size_t len) {
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
static inline pid_t start_agent(const char *name, const char *master,
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
static inline int served_on(const char *out, const char *name, char *addr,
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

/* What run_axon_victim returns when the run ended before its victim could
 * be killed: the loss log is watched by polling, and on a loaded machine
 * the watcher may not run again before a run of small steps is over. */
#define KILL_MISSED (-2)

/* Runs axon-run with argv; with kill_at > 0, SIGKILLs its agent `victim`
 * once the loss log has that many lines, and with a restart starts another
 * agent under the same name (the same master and token; with
 * RESTART_SAME_ADDRESS on the killed one's control address). RESTART_HUNG
 * stops the victim (SIGSTOP) instead, starts the new one while the world
 * still takes the old one for alive, and wakes the old one (SIGCONT) once
 * the pipeline was rebuilt. axon-run itself is stopped from the moment the
 * watcher saw the step until the victim is hit, so that the run does not
 * go on while the victim is looked for. Returns the exit status, or
 * KILL_MISSED. */
static inline int run_axon_victim(const char *out, const char *loss_log,
                                  int kill_at, int restart, const char *victim,
                                  const char **argv) {
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
      kill(pid, SIGSTOP); /* resumed below, once the victim was hit or not */
      pid_t a = child_agent(pid, victim);
      char master[64] = "", token[512] = "", listen[128] = "";
      if (a > 0 && restart &&
          (proc_arg(a, "cmdline", "--master", master, sizeof master) ||
           proc_arg(a, "environ", "AXON_TOKEN_FILE=", token, sizeof token)))
        a = -1; /* not readable yet: try again */
      if (a > 0 && restart == RESTART_SAME_ADDRESS &&
          served_on(out, victim, listen, sizeof listen))
        a = -1;
      int sig = restart == RESTART_HUNG ? SIGSTOP : SIGKILL;
      if (a > 0 && kill(a, sig) == 0) {
        fprintf(stderr, "  %s %s (pid %d) after %d steps\n",
                sig == SIGSTOP ? "stopped" : "killed", victim, (int)a,
                count_lines(loss_log));
        killed = 1;
        stopped = sig == SIGSTOP ? a : -1;
      }
      kill(pid, SIGCONT);
      if (killed && restart) {
        rt_sleep_ms(300);
        again = start_agent(victim, master, token,
                            restart == RESTART_SAME_ADDRESS ? listen : NULL);
      }
    }
    if (stopped > 0) { /* the old process wakes up after the rebuild */
      char *text = mt_slurp(out);
      if (text && strstr(text, "rebuilding the pipeline")) {
        fprintf(stderr, "  woke the old %s (pid %d)\n", victim, (int)stopped);
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
  if (kill_at > 0 && !killed) {
    fprintf(stderr, "  the run ended after %d steps, before %s was killed\n",
            count_lines(loss_log), victim);
    return KILL_MISSED;
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* run_axon_victim with kill_at > 0, run again (3 tries in all) while the
 * run ends before its victim is killed, each time after removing the loss
 * log and dir (the run's checkpoint directory; NULL: none), so that no
 * file of a run that lost nothing is taken for the recovered run's. The
 * oracles apply unchanged to the run that did lose its victim. */
static inline int run_axon_kill(const char *out, const char *loss_log,
                                const char *dir, int kill_at, int restart,
                                const char *victim, const char **argv) {
  int st = KILL_MISSED;
  for (int i = 0; i < 3 && st == KILL_MISSED; i++) {
    char rm[1200];
    snprintf(rm, sizeof rm, "rm -rf '%s' '%s'", loss_log, dir ? dir : "");
    if (system(rm) != 0)
      fail_msg("could not remove %s", loss_log);
    st = run_axon_victim(out, loss_log, kill_at, restart, victim, argv);
  }
  assert_int_not_equal(st, KILL_MISSED);
  return st;
}

/* The last loss logged for each step (lines "step loss"), as text. */
static inline int last_losses(const char *path, char (*v)[40], int max) {
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

/* The loss of every step of a recovered run (log l_rec, output text out)
 * against the uninterrupted run's (l_ref), both `steps` long (at most
 * 1024): the last loss logged for a step that ran twice; every bit, or
 * with tol > 0 within that relative difference. Steps whose update every
 * stage applied before the coordinator took their answers (a live
 * recovery says "axon-run: steps A to B were applied") must be missing. */
static inline void same_losses(const char *l_ref, const char *l_rec, int steps,
                               const char *out, double tol) {
  long un_lo = 0, un_hi = -1;
  const char *un = out ? strstr(out, "axon-run: steps ") : NULL;
  if (un && sscanf(un, "axon-run: steps %ld to %ld were applied", &un_lo,
                   &un_hi) == 2)
    fprintf(stderr, "  steps %ld to %ld not reported\n", un_lo, un_hi);
  static char a[1024][40], b[1024][40];
  assert_true(steps <= 1024);
  memset(a, 0, sizeof a);
  memset(b, 0, sizeof b);
  assert_int_equal(last_losses(l_ref, a, steps), steps);
  assert_int_equal(last_losses(l_rec, b, steps), steps);
  for (int s = 0; s < steps; s++)
    if (s >= un_lo && s <= un_hi)
      assert_string_equal(b[s], ""); /* never logged */
    else if (tol > 0
                 ? !(fabs(atof(a[s]) - atof(b[s])) <= tol * fabs(atof(a[s])))
                 : strcmp(a[s], b[s]) != 0) {
      fprintf(stderr, "  step %d: %s uninterrupted, %s recovered\n", s, a[s],
              b[s]);
      fail();
    }
}

/* An uninterrupted reference run: exit 0, else its output is shown and
 * the test fails. */
static inline void run_axon_ref(const char *out, const char *loss_log,
                                const char **argv) {
  int st = run_axon_victim(out, loss_log, 0, NO_RESTART, "", argv);
  if (st != 0) {
    char *text = mt_slurp(out);
    fprintf(stderr, "---- %s (exit %d) ----\n%s\n----\n", out, st,
            text ? text : "");
    free(text);
  }
  assert_int_equal(st, 0);
}

#endif
