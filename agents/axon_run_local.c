/* axon-run --local: the world of K stage agents started as child processes
 * of this one (fork/exec of the axon-agent next to this binary, BEFORE any
 * gRPC initialisation in this process) on a reserved loopback port. */
#include <arpa/inet.h>
#include <errno.h>
#include <libgen.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agents/axon_run.h"
#include "axon/rpc/launch.h"
#include "axon/runtime/autograd/plugin.h"

/* AXON_PIN_AGENTS pins local agent s to one core: "1" = core s modulo the
 * cores this process may use, "a,b,c" = the s-th listed core (modulo the
 * list), with AXON_THREADS=1 unless set. Called in the child before exec;
 * failures are reported and the agent runs unpinned. */
static void pin_child(int s) {
  const char *env = getenv("AXON_PIN_AGENTS");
  if (!env || !*env || !strcmp(env, "0"))
    return;
  int cores[CPU_SETSIZE], n = 0;
  cpu_set_t set;
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
  if (n == 0)
    return;
  /* One core: one compute thread (the default is one per online core, and
   * two OpenMP threads spinning on one core slow every kernel down). */
  setenv("AXON_THREADS", "1", 0);
  CPU_ZERO(&set);
  CPU_SET(cores[s % n], &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0)
    fprintf(stderr, "axon-run: cannot pin stage%d to core %d: %s\n", s,
            cores[s % n], strerror(errno));
}

/* Starts K agents named names[0..K) joining 127.0.0.1:port, each loading
 * the plugins. */
int axi_run_spawn_local(int K, const char *const *names, int port, int threads,
                        const char *const *plugins, int nplugins, pid_t *pids) {
  char exe[4096], path[4200], master[64], th[16];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = 0;
  snprintf(path, sizeof path, "%s/axon-agent", dirname(exe));
  if (access(path, X_OK) != 0) {
    fprintf(stderr, "axon-run: no axon-agent next to axon-run (%s)\n", path);
    return -1;
  }
  snprintf(master, sizeof master, "127.0.0.1:%d", port);
  snprintf(th, sizeof th, "%d", threads);
  if (ax_local_token() != 0) /* the local world authenticates */
    return -1;
  for (int s = 0; s < K; s++) {
    const char *name = names[s];
    pids[s] = fork();
    if (pids[s] == 0) {
      pin_child(s);
      setenv("AXON_THREADS", "1", 0); /* K agents share this machine */
      const char *argv[16 + 2 * AX_PLUGIN_MAX] = {
          path,   "--name",    name, "--master",
          master, "--threads", th,   "--peer-timeout-ms",
          "3000"};
      int argc = 9;
      for (int i = 0; i < nplugins && i < AX_PLUGIN_MAX; i++) {
        argv[argc++] = "--plugin";
        argv[argc++] = plugins[i];
      }
      execv(path, (char *const *)argv);
      fprintf(stderr, "exec %s: %s\n", path, strerror(errno));
      _exit(127);
    }
  }
  return 0;
}

/* Reserves a loopback port: a socket bound to it (SO_REUSEADDR, never
 * listening) that *fd keeps open. While it is open no other bind(0) or
 * outgoing connection of any process on this host gets the port, so the
 * agents started with it cannot meet another program there; our own gRPC
 * listener (SO_REUSEADDR too) can still bind it. Close *fd once the node
 * listens. Returns the port, or -1. */
int axi_run_reserve_port(int *fd) {
  int one = 1;
  *fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t l = sizeof sa;
  if (*fd >= 0 &&
      !setsockopt(*fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) &&
      !bind(*fd, (struct sockaddr *)&sa, sizeof sa) &&
      !getsockname(*fd, (struct sockaddr *)&sa, &l))
    return ntohs(sa.sin_port);
  if (*fd >= 0)
    close(*fd);
  *fd = -1;
  return -1;
}
