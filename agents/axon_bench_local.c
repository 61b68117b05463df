/* Helpers shared by the axon-bench modes that run local agents; see
 * agents/axon_bench_local.h. */
#include "agents/axon_bench_local.h"

#include <arpa/inet.h>
#include <errno.h>
#include <libgen.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int axi_bench_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t l = sizeof a;
  int port = -1;
  if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) &&
      !getsockname(fd, (struct sockaddr *)&a, &l))
    port = ntohs(a.sin_port);
  if (fd >= 0)
    close(fd);
  return port;
}

pid_t axi_bench_spawn_agent(const char *name, int port, const char *env,
                            const char *val, int overwrite,
                            const char *const *args) {
  char exe[4096], path[4200], master[64];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = 0;
  snprintf(path, sizeof path, "%s/axon-agent", dirname(exe));
  snprintf(master, sizeof master, "127.0.0.1:%d", port);
  const char *argv[32] = {path, "--name", name, "--master", master};
  int argc = 5;
  for (int i = 0; argc < 31 && args && args[i]; i++)
    argv[argc++] = args[i];
  argv[argc] = NULL;
  pid_t pid = fork();
  if (pid == 0) {
    if (env)
      setenv(env, val, overwrite);
    execv(path, (char *const *)argv);
    fprintf(stderr, "exec %s: %s\n", path, strerror(errno));
    _exit(127);
  }
  return pid;
}

/* Orders doubles for qsort. */
static int axi_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double axi_bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, axi_cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
