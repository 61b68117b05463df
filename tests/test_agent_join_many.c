/* A world of many idle agents on one host (issue: light agents): 48 real
 * axon-agent processes join one master, each costs little (PSS under a
 * loose bound that the former 100 MiB per agent broke) and runs no more
 * threads than its handler pool was asked for plus the fixed ones; one
 * barrier round (a call to every agent at once) completes; the world ends
 * cleanly. No timing is asserted beyond generous deadlines; axon-bench join
 * measures the same at 16-256 agents. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "axon/rpc/rpc.h"
#include "harness.h"
#include "tests/mp_testutil.h"

#define NAG 48
#define PSS_BOUND_KB (32 * 1024) /* per idle agent; 7 MiB measured */
#define THREADS_BOUND 24         /* per idle agent; 14 measured, 8 of gRPC */

static char g_names_buf[NAG][16];
static const char *g_names[NAG];
static pid_t g_pids[NAG];
static ax_node *g_drv;

static long proc_field(pid_t pid, const char *file, const char *key) {
  char path[64], line[256];
  long v = -1;
  snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, file);
  FILE *f = fopen(path, "r");
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, key, strlen(key)))
      v = atol(line + strlen(key));
  if (f)
    fclose(f);
  return v;
}

static void test_many_agents(void **state) {
  const char *args[] = {NULL};
  AX_ASSERT_OK(mt_start("driver", g_names, NAG, args, g_pids, &g_drv));
  assert_int_equal(ax_node_world_size(g_drv), NAG + 1);
  long pss_max = 0, thr_max = 0;
  for (int i = 0; i < NAG; i++) {
    long pss = proc_field(g_pids[i], "smaps_rollup", "Pss:");
    long thr = proc_field(g_pids[i], "status", "Threads:");
    pss_max = pss > pss_max ? pss : pss_max;
    thr_max = thr > thr_max ? thr : thr_max;
  }
  fprintf(stderr, "%d idle agents: PSS max %ld KiB, threads max %ld\n", NAG,
          pss_max, thr_max);
  assert_true(pss_max > 0 && pss_max < PSS_BOUND_KB);
  assert_true(thr_max > 0 && thr_max < THREADS_BOUND);
  ax_future *f[NAG];
  for (int i = 0; i < NAG; i++)
    AX_ASSERT_OK(
        ax_rpc_async(g_drv, g_names[i], "axon.test.echo", NULL, NULL, &f[i]));
  for (int i = 0; i < NAG; i++) {
    AX_ASSERT_OK(ax_future_wait(f[i], 60000));
    ax_future_release(f[i]);
  }
  for (int i = 0; i < NAG; i++)
    AX_ASSERT_OK(rt_remote_zero(g_drv, g_names[i]));
  mt_end(g_drv, g_pids, NAG);
  g_drv = NULL;
}

int main(void) {
  for (int i = 0; i < NAG; i++) {
    snprintf(g_names_buf[i], sizeof g_names_buf[i], "a%d", i);
    g_names[i] = g_names_buf[i];
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_many_agents)};
  return AX_TEST_MAIN(tests);
}
