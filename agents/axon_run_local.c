/* axon-run --local: the world of K stage agents started as child processes
 * of this one (fork/exec of the axon-agent next to this binary, BEFORE any
 * gRPC initialisation in this process) on a reserved loopback port. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agents/axon_run.h"
#include "axon/rpc/launch.h"
#include "axon/runtime/autograd/plugin.h"

/* Starts K agents named names[0..K) joining 127.0.0.1:port, each loading
 * the plugins and pinned as AXON_PIN_AGENTS asks (rpc/launch.h). */
int axi_run_spawn_local(int K, const char *const *names, int port, int threads,
                        const char *const *plugins, int nplugins, pid_t *pids) {
  char path[4200], master[64], th[16];
  if (ax_local_program("axon-agent", path, sizeof path) != 0) {
    fprintf(stderr, "axon-run: no axon-agent next to axon-run (%s)\n", path);
    return -1;
  }
  snprintf(master, sizeof master, "127.0.0.1:%d", port);
  snprintf(th, sizeof th, "%d", threads);
  if (ax_local_token() != 0) /* the local world authenticates */
    return -1;
  static const char *const one_thread[] = {"AXON_THREADS=1", NULL};
  for (int s = 0; s < K; s++) {
    const char *argv[16 + 2 * AX_PLUGIN_MAX] = {
        path,   "--name",    names[s], "--master",
        master, "--threads", th,       "--peer-timeout-ms",
        "3000"};
    int argc = 9;
    for (int i = 0; i < nplugins && i < AX_PLUGIN_MAX; i++) {
      argv[argc++] = "--plugin";
      argv[argc++] = plugins[i];
    }
    /* K agents share this machine: one compute thread each by default. */
    ax_spawn_opts so = {.argv = argv, .env_default = one_thread, .pin = s};
    pids[s] = ax_local_spawn(&so);
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
