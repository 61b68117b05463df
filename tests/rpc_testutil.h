/* Helpers for the multi-process RPC tests: free ports, spawning axon-agent
 * children (before gRPC is initialised in this process: gRPC aborts after
 * fork), stopping them with a bounded wait, and checking that every node
 * ends with zero live calls and futures. Header-only (static functions):
 * each test is one .c file plus harness.c. */
#ifndef AX_RPC_TESTUTIL_H
#define AX_RPC_TESTUTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <libgen.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rpc/rpc.h"

static inline int64_t rt_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void rt_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* A port the OS considers free right now (bound, then released). */
static inline int rt_free_port(void) {
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

/* Path of the built axon-agent: $AXON_BIN_DIR, else the parent of the
 * directory holding this test binary. */
static inline void rt_agent_path(char *buf, size_t len) {
  const char *d = getenv("AXON_BIN_DIR");
  if (d && *d) {
    snprintf(buf, len, "%s/axon-agent", d);
    return;
  }
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = 0;
  char *dir = dirname(exe);
  snprintf(buf, len, "%s/../axon-agent", dir);
}

/* Starts `axon-agent --name name --master 127.0.0.1:master_port` plus the
 * NULL-terminated extra arguments. Returns the pid, or -1. */
static inline pid_t rt_spawn_agent(const char *name, int master_port, ...) {
  char path[4200], master[64];
  rt_agent_path(path, sizeof path);
  snprintf(master, sizeof master, "127.0.0.1:%d", master_port);
  const char *argv[32] = {path, "--name", name, "--master", master};
  int argc = 5;
  va_list ap;
  va_start(ap, master_port);
  const char *a;
  while (argc < 31 && (a = va_arg(ap, const char *)))
    argv[argc++] = a;
  va_end(ap);
  argv[argc] = NULL;
  pid_t pid = fork();
  if (pid == 0) {
    execv(path, (char *const *)argv);
    fprintf(stderr, "exec %s: %s\n", path, strerror(errno));
    _exit(127);
  }
  return pid;
}

/* Sends sig, waits up to timeout_ms, then SIGKILLs. Returns the exit
 * status as waitpid reports it, or -1. */
static inline int rt_stop_agent(pid_t pid, int sig, int timeout_ms) {
  if (pid <= 0)
    return -1;
  kill(pid, sig);
  int64_t end = rt_now_ms() + timeout_ms;
  int st = 0;
  while (rt_now_ms() < end) {
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

/* The master node of a test: listens on port, expects `world` nodes. */
static inline int rt_driver(const char *name, int port, int world,
                            ax_node **out) {
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  ax_node_opts o;
  ax_node_opts_init(&o);
  o.name = name;
  o.listen = listen;
  o.master = listen;
  o.world_size = world;
  o.rank = 0;
  o.threads = 2;
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

/* Polls `_axon.stats` on node `to` (up to 10 s) until it reports zero live
 * calls and futures. Returns AX_OK or AX_ESTATE with the last counts. */
static inline int rt_remote_zero(ax_node *n, const char *to) {
  int64_t end = rt_now_ms() + 10000;
  int64_t calls = -1, futs = -1;
  while (rt_now_ms() < end) {
    ax_values *r = NULL;
    ax_call_opts o = {.timeout_ms = 5000};
    int rc = ax_rpc_sync(n, to, "_axon.stats", NULL, &o, &r);
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

/* Waits (up to 10 s) for this process to have zero live calls/futures. */
static inline int rt_local_zero(void) {
  int64_t end = rt_now_ms() + 10000;
  while (rt_now_ms() < end) {
    if (ax_rpc_live_calls() == 0 && ax_future_live_count() == 0)
      return AX_OK;
    rt_sleep_ms(20);
  }
  return ax_seterr(AX_ESTATE, "local: %ld live calls, %ld live futures",
                   ax_rpc_live_calls(), ax_future_live_count());
}

#endif
