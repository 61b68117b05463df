#include "axon/rpc/launch.h"
#include "axon/kernels/clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int ax_local_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t l = sizeof a;
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &l) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0)
    close(fd);
  return port;
}

/* How long a stopped (SIGSTOPped) child gets, after SIGCONT and SIGTERM, to
 * exit before SIGKILL: it cannot exit by itself while stopped, so waiting
 * out the caller's whole timeout on it would only delay the end. */
#define STOPPED_GRACE_MS 500

/* Ends a child seen stopped: SIGTERM then SIGCONT (it may exit cleanly), and
 * the time after which it is SIGKILLed. */
static int64_t end_stopped(pid_t pid, const char *why) {
  fprintf(stderr,
          "axon: child %d is stopped (%s): SIGTERM + SIGCONT, "
          "SIGKILL in %d ms\n",
          (int)pid, why, STOPPED_GRACE_MS);
  kill(pid, SIGTERM);
  kill(pid, SIGCONT);
  return ax_clock_ms() + STOPPED_GRACE_MS;
}

/* Reaps children until none is left or timeout_ms passed; returns how many
 * are still running. A child that is stopped (reported by WUNTRACED) is
 * ended within STOPPED_GRACE_MS instead (see end_stopped). */
static int wait_children(int n, pid_t *pids, int64_t timeout_ms, int *status) {
  int64_t end = ax_clock_ms() + timeout_ms;
  int64_t *kill_at = calloc((size_t)(n > 0 ? n : 1), sizeof *kill_at);
  int left = 0;
  for (int i = 0; i < n; i++)
    left += pids[i] > 0;
  while (left > 0) {
    for (int i = 0; i < n; i++) {
      int st = 0;
      pid_t r = pids[i] > 0 ? waitpid(pids[i], &st, WNOHANG | WUNTRACED) : 0;
      if (r > 0 && WIFSTOPPED(st)) {
        if (kill_at && !kill_at[i])
          kill_at[i] = end_stopped(pids[i], strsignal(WSTOPSIG(st)));
        else if (!kill_at)
          kill(pids[i], SIGKILL);
        continue;
      }
      if (r != 0) {
        if (status)
          status[i] = st;
        pids[i] = 0;
        left--;
        continue;
      }
      if (pids[i] > 0 && kill_at && kill_at[i] > 0 &&
          ax_clock_ms() >= kill_at[i]) {
        kill(pids[i], SIGKILL); /* reaped by a later waitpid */
        kill_at[i] = -1;
      }
    }
    if (left == 0 || ax_clock_ms() >= end)
      break;
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  free(kill_at);
  return left;
}

int ax_local_reap(int n, pid_t *pids, int64_t timeout_ms, int *status) {
  wait_children(n, pids, timeout_ms, status);
  int killed = 0;
  for (int i = 0; i < n; i++)
    if (pids[i] > 0) {
      kill(pids[i], SIGKILL);
      waitpid(pids[i], NULL, 0);
      if (status)
        status[i] = -1;
      pids[i] = 0;
      killed++;
    }
  return killed;
}

int ax_local_end_world(ax_node *master, int n, pid_t *pids, int64_t timeout_ms,
                       int *status, const char *who) {
  ax_world_report rep;
  int rc = ax_node_shutdown_world(master, timeout_ms, &rep);
  if (rc != AX_OK)
    fprintf(stderr, "%s: %s\n", who, ax_errmsg());
  /* Without a world (never joined) nobody was told to leave. */
  if (rc != AX_ESTATE && rc != AX_EINVAL &&
      wait_children(n, pids, timeout_ms, status) == 0)
    return rc;
  for (int i = 0; i < n; i++)
    if (pids[i] > 0) {
      fprintf(stderr, "%s: child %d still running: SIGTERM\n", who,
              (int)pids[i]);
      kill(pids[i], SIGTERM);
    }
  ax_local_reap(n, pids, timeout_ms, status);
  return rc;
}

int ax_local_stop(int n, pid_t *pids, int64_t timeout_ms, int *status) {
  for (int i = 0; i < n; i++)
    if (pids[i] > 0)
      kill(pids[i], SIGTERM);
  return ax_local_reap(n, pids, timeout_ms, status);
}

static char g_token_path[64];
static pid_t g_token_owner;

static void token_unlink(void) {
  if (g_token_path[0] && getpid() == g_token_owner) /* not from children */
    unlink(g_token_path);
}

int ax_local_token(void) {
  if (getenv("AXON_TOKEN_FILE"))
    return 0;
  snprintf(g_token_path, sizeof g_token_path, "/tmp/axon-token-XXXXXX");
  int fd = mkstemp(g_token_path); /* mode 0600 */
  uint8_t r[32];
  int u = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  int ok = fd >= 0 && u >= 0 && read(u, r, sizeof r) == (ssize_t)sizeof r;
  char hex[65];
  for (int i = 0; ok && i < 32; i++)
    snprintf(hex + 2 * i, 3, "%02x", r[i]);
  ok = ok && write(fd, hex, 64) == 64;
  if (u >= 0)
    close(u);
  if (fd >= 0)
    close(fd);
  if (!ok) {
    perror("axon: cannot write a token file");
    if (fd >= 0)
      unlink(g_token_path);
    g_token_path[0] = 0;
    return -1;
  }
  g_token_owner = getpid();
  atexit(token_unlink);
  setenv("AXON_TOKEN_FILE", g_token_path, 1);
  return 0;
}

/* The cores AXON_PIN_AGENTS pins local agents to, in order, into
 * cores[CPU_SETSIZE]: its list, or for "1" the cores this process may use.
 * Their number; 0 when it asks for no pinning. */
static int pin_cores(int *cores) {
  const char *env = getenv("AXON_PIN_AGENTS");
  int n = 0;
  cpu_set_t set;
  if (!env || !*env || !strcmp(env, "0"))
    return 0;
  if (strcmp(env, "1")) {
    for (const char *c = env; c && n < CPU_SETSIZE; c = strchr(c, ',')) {
      c += *c == ',';
      cores[n++] = atoi(c);
    }
  } else if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int i = 0; i < CPU_SETSIZE; i++)
      if (CPU_ISSET(i, &set))
        cores[n++] = i;
  }
  return n;
}

int ax_local_cores(int k) {
  int cores[CPU_SETSIZE], n = pin_cores(cores), distinct = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int s = 0; n > 0 && s < k; s++) /* agent s on cores[s % n] */
    if (cores[s % n] >= 0 && cores[s % n] < CPU_SETSIZE &&
        !CPU_ISSET(cores[s % n], &set)) {
      CPU_SET(cores[s % n], &set);
      distinct++;
    }
  if (n > 0)
    return distinct > 0 ? distinct : 1;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return CPU_COUNT(&set);
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? (int)online : 1;
}

/* Pins this child, local agent number s, to one core as AXON_PIN_AGENTS
 * asks (launch.h); reports a failure and runs unpinned. */
static void pin_child(int s) {
  int cores[CPU_SETSIZE], n = pin_cores(cores);
  cpu_set_t set;
  if (n == 0)
    return;
  /* One core: one compute thread (the default is one per online core, and
   * two OpenMP threads spinning on one core slow every kernel down). */
  setenv("AXON_THREADS", "1", 0);
  CPU_ZERO(&set);
  CPU_SET(cores[s % n], &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0)
    fprintf(stderr, "axon: cannot pin local agent %d to core %d: %s\n", s,
            cores[s % n], strerror(errno));
}

/* Sets the "NAME=VALUE" variables of list (NULL: none), replacing values
 * already set when overwrite is non-zero. */
static void set_env(const char *const *list, int overwrite) {
  for (int i = 0; list && list[i]; i++) {
    const char *eq = strchr(list[i], '=');
    char name[256];
    if (!eq || (size_t)(eq - list[i]) >= sizeof name)
      continue;
    memcpy(name, list[i], (size_t)(eq - list[i]));
    name[eq - list[i]] = 0;
    setenv(name, eq + 1, overwrite);
  }
}

/* Sends file `path` (created or truncated) to the descriptors of mask
 * (1: stdout, 2: stderr). */
static void redirect(const char *path, int mask) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    return;
  if (mask & 1)
    dup2(fd, 1);
  if (mask & 2)
    dup2(fd, 2);
  if (fd > 2)
    close(fd);
}

pid_t ax_local_spawn(const ax_spawn_opts *o) {
  fflush(NULL); /* nothing buffered is written twice */
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return -1;
  }
  if (pid > 0)
    return pid;
  if (o->own_group)
    setpgid(0, 0);
  set_env(o->env, 1);
  set_env(o->env_default, 0);
  if (o->pin >= 0)
    pin_child(o->pin);
  if (o->out)
    redirect(o->out, 3);
  else if (o->err)
    redirect(o->err, 2);
  execv(o->argv[0], (char *const *)o->argv);
  fprintf(stderr, "exec %s: %s\n", o->argv[0], strerror(errno));
  _exit(127);
}

int ax_local_program(const char *name, char *buf, size_t len) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = 0;
  snprintf(buf, len, "%s/%s", dirname(exe), name);
  return access(buf, X_OK) == 0 ? 0 : -1;
}

int ax_local_fork(int n, int first_rank, ax_local_child_fn fn, void *user,
                  pid_t *pids) {
  if (ax_local_token() != 0)
    return -1;
  for (int i = 0; i < n; i++) {
    fflush(stdout); /* the child must not repeat buffered output */
    fflush(stderr);
    pid_t p = fork();
    if (p < 0) {
      perror("fork");
      ax_local_stop(i, pids, 5000, NULL);
      return -1;
    }
    if (p == 0) {
      int code = fn(first_rank + i, user);
      fflush(stdout);
      fflush(stderr);
      _exit(code);
    }
    pids[i] = p;
  }
  return 0;
}

int ax_local_reap_report(int n, pid_t *pids, int first_rank, int64_t timeout_ms,
                         const char *who, const char *role, int victim) {
  int *sts = calloc((size_t)(n > 0 ? n : 1), sizeof *sts);
  if (!sts) {
    ax_local_stop(n, pids, timeout_ms, NULL);
    return 1;
  }
  ax_local_reap(n, pids, timeout_ms, sts);
  int bad = 0;
  for (int i = 0; i < n; i++) {
    int st = sts[i], r = first_rank + i;
    if (st == -1) {
      fprintf(stderr, "%s: %s%d did not exit: SIGKILL\n", who, role, r);
      bad = 1;
    } else if (WIFSIGNALED(st)) {
      printf("%s: %s%d ended by signal %d\n", who, role, r, WTERMSIG(st));
      bad |= r != victim;
    } else if (WEXITSTATUS(st)) {
      printf("%s: %s%d exited with %d\n", who, role, r, WEXITSTATUS(st));
      bad = 1;
    }
  }
  free(sts);
  return bad;
}

int ax_local_world(int n, char *master, size_t len, ax_local_child_fn child,
                   ax_local_child_fn parent, void *user, const char *who,
                   const char *role, int victim) {
  int port = ax_local_free_port();
  if (port < 0) {
    fprintf(stderr, "%s: no free loopback port\n", who);
    return 1;
  }
  snprintf(master, len, "127.0.0.1:%d", port);
  pid_t *pids = calloc((size_t)(n > 0 ? n : 1), sizeof *pids);
  if (!pids || ax_local_fork(n, 1, child, user, pids) != 0) {
    free(pids);
    return 1;
  }
  int rc = parent(0, user);
  int bad = ax_local_reap_report(n, pids, 1, 30000, who, role, victim);
  free(pids);
  return rc ? rc : bad;
}
