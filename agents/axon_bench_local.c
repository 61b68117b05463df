/* Helpers shared by the axon-bench modes that run local agents; see
 * agents/axon_bench_local.h. */
#include "agents/axon_bench_local.h"

#include <stdio.h>
#include <stdlib.h>

#include "axon/rpc/launch.h"
#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/pipeline/pipeline.h"

pid_t axi_bench_spawn_agent(const char *name, int port, const char *env,
                            const char *val, int overwrite,
                            const char *const *args) {
  char path[4200], master[64], var[256];
  ax_local_program("axon-agent", path, sizeof path); /* exec says if not */
  snprintf(master, sizeof master, "127.0.0.1:%d", port);
  const char *argv[32] = {path, "--name", name, "--master", master};
  int argc = 5;
  for (int i = 0; argc < 31 && args && args[i]; i++)
    argv[argc++] = args[i];
  argv[argc] = NULL;
  snprintf(var, sizeof var, "%s=%s", env ? env : "", val ? val : "");
  const char *const vars[] = {var, NULL};
  ax_spawn_opts o = {.argv = argv, .pin = -1};
  if (env && overwrite)
    o.env = vars;
  else if (env)
    o.env_default = vars;
  return ax_local_spawn(&o);
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

int axi_bench_master(const char *name, int port, int world, ax_node **out) {
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  ax_node_opts o;
  ax_node_opts_init(&o);
  o.name = name;
  o.listen = o.master = listen;
  o.world_size = world;
  o.rank = 0;
  o.threads = 4;
  o.peer_timeout_ms = 3000;
  *out = NULL;
  int rc = ax_node_create(&o, out);
  if (rc == AX_OK)
    rc = ax_pipe_init(*out);
  if (rc == AX_OK)
    rc = ax_node_join(*out, 90000);
  return rc; /* the caller ends *out (non-NULL once created) */
}
