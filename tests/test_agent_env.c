/* Agents started as srun and mpirun start them: `axon-agent --name wN` and
 * nothing else on the command line; the master's address comes from
 * AXON_MASTER_ADDR/AXON_MASTER_PORT and the rank from SLURM_PROCID or
 * OMPI_COMM_WORLD_RANK (ax_node_opts_from_env). They join this test's
 * master with those ranks; an agent with a bad rank variable exits 2 with
 * a message naming it. Ends with zero RRefs, contexts and calls on every
 * node. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "axon/rpc/launch.h"
#include "axon/runtime/pipeline/pipeline.h"
#include "harness.h"
#include "mp_testutil.h"

/* Starts `axon-agent --name name` with the variables vars (NULL-terminated
 * NAME=VALUE list) added to this environment and stderr sent to errfile
 * (when not NULL). */
static pid_t spawn_env_agent(const char *name, const char *const *vars,
                             const char *errfile) {
  char path[4200];
  rt_agent_path(path, sizeof path);
  if (ax_local_token() != 0)
    return -1;
  const char *argv[] = {path, "--name", name, NULL};
  ax_spawn_opts o = {.argv = argv, .env = vars, .err = errfile, .pin = -1};
  return ax_local_spawn(&o);
}

/* The master (this process, rank 0) is up first; an agent that asks for
 * no rank ("wx", as axon-run's coordinator) joins, and a second later the
 * agents with ranks from their environment: ranks 1 and 2 as srun gives
 * them, 3 as mpirun does. Each of them asks for the rank the master had
 * chosen for wx, which moves on each time and ends at 4. (Should wx join
 * last on a loaded machine it simply takes 4.) */
static void test_join_from_env(void **state) {
  int port = rt_free_port();
  assert_true(port > 0);
  assert_int_equal(ax_local_token(), 0);
  char listen[64];
  ax_node_opts o;
  mt_master_opts(&o, "drv", port, 5, 4, listen);
  o.peer_timeout_ms = 2000;
  ax_node *drv = NULL;
  AX_ASSERT_OK(ax_node_create(&o, &drv));
  AX_ASSERT_OK(ax_pipe_init(drv));
  char addr[] = "AXON_MASTER_ADDR=127.0.0.1", port_var[64];
  snprintf(port_var, sizeof port_var, "AXON_MASTER_PORT=%d", port);
  const char *const envx[] = {addr, port_var, NULL};
  const char *const env1[] = {addr, port_var, "SLURM_PROCID=1", NULL};
  const char *const env2[] = {addr, port_var, "SLURM_PROCID=2",
                              "OMPI_COMM_WORLD_RANK=9", NULL};
  const char *const env3[] = {addr, port_var, "OMPI_COMM_WORLD_RANK=3", NULL};
  const char *const names[] = {"wx", "wa", "wb", "wc"};
  const int want[] = {4, 1, 2, 3};
  pid_t pids[4] = {spawn_env_agent(names[0], envx, NULL)};
  rt_sleep_ms(1000);
  pids[1] = spawn_env_agent(names[1], env1, NULL);
  pids[2] = spawn_env_agent(names[2], env2, NULL);
  pids[3] = spawn_env_agent(names[3], env3, NULL);
  for (int i = 0; i < 4; i++)
    assert_true(pids[i] > 0);
  int rc = ax_node_join(drv, 60000);
  if (rc != AX_OK) {
    for (int i = 0; i < 4; i++)
      rt_stop_agent(pids[i], SIGKILL, 5000);
    dt_driver_end(drv);
    AX_ASSERT_OK(rc);
  }
  assert_int_equal(ax_node_rank(drv), 0);
  assert_int_equal(ax_node_world_size(drv), 5);
  for (int i = 0; i < 4; i++) {
    int r = -1;
    AX_ASSERT_OK(ax_node_rank_of(drv, names[i], &r));
    if (r != want[i])
      fail_msg("%s joined with rank %d, expected %d", names[i], r, want[i]);
    AX_ASSERT_OK(rt_alive(drv, names[i]));
  }
  AX_ASSERT_OK(dt_all_zero(drv, names, 4));
  mt_end(drv, pids, 4);
}

static void test_bad_rank_variable(void **state) {
  char errfile[] = "/tmp/axon-agent-env-XXXXXX";
  int fd = mkstemp(errfile);
  assert_true(fd >= 0);
  close(fd);
  const char *const env[] = {"AXON_MASTER_ADDR=127.0.0.1", "AXON_MASTER_PORT=1",
                             "SLURM_PROCID=first", NULL};
  pid_t pid = spawn_env_agent("wbad", env, errfile);
  assert_true(pid > 0);
  /* It must refuse at once, long before any join timeout. */
  int st = rt_stop_agent(pid, 0, 30000);
  char msg[512] = {0};
  FILE *f = fopen(errfile, "r");
  if (f) {
    size_t n = fread(msg, 1, sizeof msg - 1, f);
    msg[n] = 0;
    fclose(f);
  }
  unlink(errfile);
  if (!(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2))
    fail_msg("agent with SLURM_PROCID=first: status %d, stderr: %s", st, msg);
  assert_non_null(strstr(msg, "SLURM_PROCID='first'"));
  AX_ASSERT_OK(rt_local_zero());
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(test_join_from_env),
      cmocka_unit_test(test_bad_rank_variable),
  };
  return AX_TEST_MAIN(t);
}
