/* Rendezvous edge cases with real axon-agent processes on loopback:
 *  - agents that reach the master before the master joined itself do not
 *    take the rank the master asked for (axon-run --local: the coordinator
 *    is rank 0 and its agents start first);
 *  - a master that shuts down while joins wait for the world answers them
 *    (the agents hear "shutting down" and exit) and does not crash;
 *  - calls that reach a node before it knows the membership wait and are
 *    then served (ax_node_join's contract). */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"
#include "tests/mp_testutil.h"

static void test_master_keeps_its_rank(void **state) {
  int port = rt_free_port();
  pid_t pids[2];
  const char *names[2] = {"early1", "early2"};
  for (int i = 0; i < 2; i++)
    pids[i] = rt_spawn_agent(names[i], port, "--threads", "2", NULL);
  char listen[64];
  ax_node_opts o;
  mt_master_opts(&o, "late_master", port, 3, 2, listen);
  ax_node *n = NULL;
  AX_ASSERT_OK(ax_node_create(&o, &n));
  rt_sleep_ms(1500); /* both agents ask to join before the master does */
  AX_ASSERT_OK(ax_node_join(n, 30000));
  assert_int_equal(ax_node_rank(n), 0);
  const char *who;
  AX_ASSERT_OK(ax_node_member(n, 0, &who));
  assert_string_equal(who, "late_master");
  for (int r = 1; r < 3; r++) {
    AX_ASSERT_OK(ax_node_member(n, r, &who));
    assert_true(!strcmp(who, "early1") || !strcmp(who, "early2"));
  }
  /* A call right after join: the agent may still be applying the
   * membership; it is held, then served. */
  ax_values *r = NULL;
  AX_ASSERT_OK(
      ax_rpc_sync(n, "early1", "axon.rendezvous.stats", NULL, NULL, &r));
  ax_values_free(r);
  int bad = 0;
  for (int i = 0; i < 2; i++)
    bad += mt_stop_checked(names[i], pids[i]);
  assert_int_equal(bad, 0);
  ax_node_destroy(n);
}

static void test_master_shutdown_with_waiting_joins(void **state) {
  int port = rt_free_port();
  pid_t pid = rt_spawn_agent("orphan", port, "--threads", "2", NULL);
  char listen[64];
  ax_node_opts o;
  mt_master_opts(&o, "short_master", port, 4, 2, listen); /* never full */
  ax_node *n = NULL;
  AX_ASSERT_OK(ax_node_create(&o, &n));
  rt_sleep_ms(1500); /* the agent's join waits for the world */
  int64_t t0 = ax_clock_ms();
  AX_ASSERT_OK(ax_node_shutdown(n, 5000));
  ax_node_destroy(n);
  assert_true(ax_clock_ms() - t0 < 4000); /* the waiting join did not block */
  /* The agent hears "the master is shutting down" and gives up by itself. */
  int st = rt_stop_agent(pid, 0, 10000);
  assert_true(st != -1);
  assert_true(WIFEXITED(st)); /* exited on its own, not killed or crashed */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_master_keeps_its_rank),
      cmocka_unit_test(test_master_shutdown_with_waiting_joins),
  };
  return AX_TEST_MAIN(tests);
}
