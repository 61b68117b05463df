/* Helpers for the multi-process tests; see tests/mp_testutil.h. Compiled
 * into every test program next to harness.c. */

#include "tests/mp_testutil.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include "axon/rpc/launch.h"
#include "axon/runtime/pipeline/pipeline.h"

void rt_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Binds port on loopback with SO_REUSEADDR and keeps the socket (never
 * listening) for the rest of the process: another process's check below
 * (a bind without SO_REUSEADDR) then sees the port taken, while the
 * listener this process or its agents start on it (SO_REUSEADDR, as gRPC
 * and axon-run do) still binds it. Returns 1 when reserved. */
static int port_reserve(int port) {
  int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0)
    return 0;
  /* First a plain bind: fails while anyone holds the port (a listener, a
   * reservation of another test, a TIME_WAIT). */
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
      bind(fd, (struct sockaddr *)&a, sizeof a)) {
    if (fd >= 0)
      close(fd);
    return 0;
  }
  return 1; /* fd stays open (close-on-exec) until the process ends */
}

int rt_free_port(void) {
  /* Below Linux's ephemeral range (32768 and up by default), so no outgoing
   * connection or bind(0) of any process takes the port between this call
   * and the listener's bind (as happened to a metrics port), and reserved
   * (port_reserve) so that no other test process picks it meanwhile. */
  static unsigned seed;
  if (!seed) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    seed = ((unsigned)getpid() * 2654435761u) ^ (unsigned)ts.tv_nsec;
  }
  for (int i = 0; i < 400; i++) {
    int port = 20000 + (int)(rand_r(&seed) % 12000);
    if (port_reserve(port))
      return port;
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t l = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) ||
      getsockname(fd, (struct sockaddr *)&a, &l)) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  close(fd);
  return ntohs(a.sin_port);
}

void mt_bin_path(const char *name, char *buf, size_t len) {
  const char *d = getenv("AXON_BIN_DIR");
  if (d && *d) {
    snprintf(buf, len, "%s/%s", d, name);
    return;
  }
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = 0;
  snprintf(buf, len, "%s/../%s", dirname(exe), name);
}

void rt_agent_path(char *buf, size_t len) {
  mt_bin_path("axon-agent", buf, len);
}

pid_t rt_spawn_agentv(const char *name, int master_port,
                      const char *const *args) {
  char path[4200], master[64];
  rt_agent_path(path, sizeof path);
  snprintf(master, sizeof master, "127.0.0.1:%d", master_port);
  const char *argv[32] = {path, "--name", name, "--master", master};
  int argc = 5;
  for (int i = 0; argc < 31 && args && args[i]; i++)
    argv[argc++] = args[i];
  argv[argc] = NULL;
  /* The test world authenticates: its agents and this process's nodes
   * share a fresh token (unless the test set AXON_TOKEN_FILE itself). */
  if (ax_local_token() != 0)
    return -1;
  ax_spawn_opts o = {.argv = argv, .pin = -1};
  return ax_local_spawn(&o);
}

pid_t rt_spawn_agent(const char *name, int master_port, ...) {
  const char *args[32];
  int k = 0;
  va_list ap;
  va_start(ap, master_port);
  const char *a;
  while (k < 31 && (a = va_arg(ap, const char *)))
    args[k++] = a;
  va_end(ap);
  args[k] = NULL;
  return rt_spawn_agentv(name, master_port, args);
}

int rt_stop_agent(pid_t pid, int sig, int timeout_ms) {
  if (pid <= 0)
    return -1;
  kill(pid, sig);
  int64_t end = ax_clock_ms() + timeout_ms;
  int st = 0;
  while (ax_clock_ms() < end) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid)
      return st;
    if (r < 0)
      return -1;
    rt_sleep_ms(10);
  }
  fprintf(stderr, "agent %d did not exit in %d ms: SIGKILL\n", (int)pid,
          timeout_ms);
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  return -1;
}

int mt_exit_clean(int st) {
  return st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int mt_stop_checked(const char *name, pid_t pid) {
  int st = rt_stop_agent(pid, SIGTERM, 15000);
  if (mt_exit_clean(st))
    return 0;
  fprintf(stderr, "agent %s: bad exit status %d\n", name, st);
  return 1;
}

void mt_master_opts(ax_node_opts *o, const char *name, int port, int world,
                    int threads, char *listen) {
  snprintf(listen, 64, "127.0.0.1:%d", port);
  ax_node_opts_init(o);
  o->name = name;
  o->listen = listen;
  o->master = listen;
  o->world_size = world;
  o->rank = 0;
  o->threads = threads;
}

int rt_driver(const char *name, int port, int world, ax_node **out) {
  char listen[64];
  ax_node_opts o;
  mt_master_opts(&o, name, port, world, 2, listen);
  int rc = ax_node_create(&o, out);
  if (rc != AX_OK)
    return rc;
  rc = ax_node_join(*out, 90000);
  if (rc != AX_OK) {
    ax_node_destroy(*out);
    *out = NULL;
  }
  return rc;
}

int rt_remote_zero(ax_node *n, const char *to) {
  int64_t end = ax_clock_ms() + 10000;
  int64_t calls = -1, futs = -1;
  while (ax_clock_ms() < end) {
    ax_values *r = NULL;
    ax_call_opts o = {.timeout_ms = 5000};
    int rc = ax_rpc_sync(n, to, "axon.rendezvous.stats", NULL, &o, &r);
    if (rc != AX_OK)
      return rc;
    ax_values_get_i64(r, 0, &calls);
    ax_values_get_i64(r, 1, &futs);
    ax_values_free(r);
    if (calls == 0 && futs == 0)
      return AX_OK;
    rt_sleep_ms(50);
  }
  return ax_seterr(AX_ESTATE, "%s: %lld live calls, %lld live futures", to,
                   (long long)calls, (long long)futs);
}

int rt_local_zero(void) {
  int64_t end = ax_clock_ms() + 10000;
  while (ax_clock_ms() < end) {
    if (ax_rpc_live_calls() == 0 && ax_future_live_count() == 0)
      return AX_OK;
    rt_sleep_ms(20);
  }
  return ax_seterr(AX_ESTATE, "local: %ld live calls, %ld live futures",
                   ax_rpc_live_calls(), ax_future_live_count());
}

int dt_driver(const char *name, int port, int world, ax_node **out) {
  char listen[64];
  ax_node_opts o;
  mt_master_opts(&o, name, port, world, 4, listen);
  o.peer_timeout_ms = 2000;
  int rc = ax_node_create(&o, out);
  if (rc != AX_OK)
    return rc;
  if ((rc = ax_pipe_init(*out)) == AX_OK)
    rc = ax_node_join(*out, 90000);
  if (rc != AX_OK) {
    ax_node_shutdown(*out, 1000);
    ax_dist_fini(*out);
    ax_node_destroy(*out);
    *out = NULL;
  }
  return rc;
}

void dt_driver_end(ax_node *n) {
  ax_node_shutdown(n, 5000);
  ax_dist_fini(n);
  ax_node_destroy(n);
}

int dt_counts(ax_node *n, const char *to, int64_t *owned, int64_t *users,
              int64_t *ctxs) {
  if (!to) {
    long o, u;
    AX_TRY(ax_rref_live(n, &o, &u));
    *owned = o;
    *users = u;
    *ctxs = ax_dist_live_contexts(n);
    return AX_OK;
  }
  ax_values *r = NULL;
  ax_call_opts co = {.timeout_ms = 5000};
  AX_TRY(ax_rpc_sync(n, to, "axon.rref.live", NULL, &co, &r));
  ax_values_get_i64(r, 0, owned);
  ax_values_get_i64(r, 1, users);
  ax_values_free(r);
  AX_TRY(ax_rpc_sync(n, to, "axon.autograd.live", NULL, &co, &r));
  ax_values_get_i64(r, 0, ctxs);
  ax_values_free(r);
  return AX_OK;
}

int dt_wait_counts(ax_node *n, const char *to, int64_t owned, int64_t users,
                   int64_t ctxs) {
  int64_t end = ax_clock_ms() + 10000, o = -1, u = -1, c = -1;
  while (ax_clock_ms() < end) {
    AX_TRY(dt_counts(n, to, &o, &u, &c));
    if ((owned < 0 || o == owned) && (users < 0 || u == users) &&
        (ctxs < 0 || c == ctxs))
      return AX_OK;
    rt_sleep_ms(20);
  }
  char buf[2048] = "";
  if (!to) {
    ax_rref_debug_list(n, buf, sizeof buf);
  } else {
    ax_values *r = NULL;
    const char *s = NULL;
    ax_call_opts co = {.timeout_ms = 5000};
    if (ax_rpc_sync(n, to, "axon.rref.list", NULL, &co, &r) == AX_OK &&
        ax_values_get_str(r, 0, &s) == AX_OK)
      snprintf(buf, sizeof buf, "%s", s);
    ax_values_free(r);
  }
  return ax_seterr(AX_ESTATE,
                   "%s: %lld owned, %lld users, %lld contexts "
                   "(want %lld/%lld/%lld)\n%s",
                   to ? to : "local", (long long)o, (long long)u, (long long)c,
                   (long long)owned, (long long)users, (long long)ctxs, buf);
}

int dt_all_zero(ax_node *n, const char *const *names, int k) {
  for (int i = 0; i < k; i++) {
    AX_TRY(dt_wait_counts(n, names[i], 0, 0, 0));
    AX_TRY(rt_remote_zero(n, names[i]));
  }
  AX_TRY(dt_wait_counts(n, NULL, 0, 0, 0));
  return rt_local_zero();
}

ax_values *dt_i64s(int k, const int64_t *v) {
  ax_values *a = ax_values_new();
  for (int i = 0; i < k; i++)
    ax_values_add_i64(a, v[i]);
  return a;
}

int mt_start(const char *drv_name, const char *const *names, int k,
             const char *const *args, pid_t *pids, ax_node **drv) {
  const char *const *each[MT_MAX_AGENTS];
  if (k < 1 || k > MT_MAX_AGENTS)
    return ax_seterr(AX_EINVAL, "mt_start: %d agents", k);
  for (int i = 0; i < k; i++)
    each[i] = args;
  return mt_start_each(drv_name, names, k, each, pids, drv);
}

int mt_start_each(const char *drv_name, const char *const *names, int k,
                  const char *const *const *args, pid_t *pids, ax_node **drv) {
  int port = rt_free_port();
  for (int i = 0; i < k; i++)
    pids[i] = rt_spawn_agentv(names[i], port, args[i]);
  /* No wait for the agents to learn the membership: calls reaching one
   * that has not are held until it has (ax_node_join). */
  int rc = dt_driver(drv_name, port, k + 1, drv);
  if (rc != AX_OK) {
    fprintf(stderr, "driver: %s: %s\n", ax_strerror(rc), ax_errmsg());
    for (int i = 0; i < k; i++)
      rt_stop_agent(pids[i], SIGKILL, 5000);
  }
  return rc;
}

void mt_end(ax_node *drv, const pid_t *pids, int k) {
  pid_t left[MT_MAX_AGENTS];
  int n = k < MT_MAX_AGENTS ? k : MT_MAX_AGENTS;
  memcpy(left, pids, sizeof *left * (size_t)n);
  ax_local_end_world(drv, n, left, 15000, NULL, "mt_end");
  dt_driver_end(drv);
}

int rt_alive(ax_node *n, const char *name) {
  ax_values *a = ax_values_new(), *r = NULL;
  ax_values_add_i64(a, 20);
  ax_values_add_i64(a, 22);
  ax_call_opts o = {.timeout_ms = 20000};
  int err = ax_rpc_sync(n, name, "axon.test.add", a, &o, &r);
  int64_t x = 0;
  if (err == AX_OK)
    err = ax_values_get_i64(r, 0, &x);
  if (err == AX_OK && x != 42)
    err = ax_seterr(AX_ESTATE, "%s: add(20, 22) = %lld", name, (long long)x);
  ax_values_free(r);
  ax_values_free(a);
  return err;
}

int rt_dial(const char *hostport) {
  const char *c = hostport ? strrchr(hostport, ':') : NULL;
  int fd = c ? socket(AF_INET, SOCK_STREAM, 0) : -1;
  if (fd < 0)
    return -1;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)atoi(c + 1))};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int rt_closed_by_peer(int fd) {
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[256];
  ssize_t r;
  while ((r = read(fd, buf, sizeof buf)) > 0)
    ;
  return r == 0 || (r < 0 && errno == ECONNRESET);
}

pid_t mt_spawn_axon_run(const char *out, const char *const *argv) {
  return mt_spawn_axon_run_env(out, argv, NULL, 0);
}

pid_t mt_spawn_axon_run_env(const char *out, const char *const *argv,
                            const char *const *env, int own_group) {
  char path[4200];
  mt_bin_path("axon-run", path, sizeof path);
  const char *av[64] = {path};
  int ac = 1;
  while (ac < 63 && argv[ac - 1])
    av[ac] = argv[ac - 1], ac++;
  av[ac] = NULL;
  ax_spawn_opts o = {
      .argv = av, .env = env, .out = out, .pin = -1, .own_group = own_group};
  return ax_local_spawn(&o);
}

/* Runs axon-run with argv (NULL-terminated, after the program), output to
 * log. With watch, SIGKILLs it as soon as that file exists. Returns the
 * exit status, 128 + signal, or -1 after timeout_ms. */
int mt_run_axon(const char *log, const char *watch, int timeout_ms,
                const char **argv) {
  pid_t pid = mt_spawn_axon_run(log, argv);
  if (pid < 0)
    return -1;
  int64_t end = ax_clock_ms() + timeout_ms;
  int st = 0;
  struct stat sb;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (ax_clock_ms() > end || (watch && stat(watch, &sb) == 0)) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      if (!watch || ax_clock_ms() > end)
        return -1;
      break;
    }
    rt_sleep_ms(2);
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

char *mt_slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
  size_t got = b ? fread(b, 1, (size_t)n, f) : 0;
  fclose(f);
  if (b)
    b[got] = 0;
  return b;
}
