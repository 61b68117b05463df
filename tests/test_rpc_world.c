/* Ending a world (rpc/node.h, ax_node_shutdown_world) with real agents: the
 * master waits for in-flight work before anyone leaves; a member still busy
 * at the deadline is reported late by name and told to leave anyway; a
 * member already down is counted, not waited for; every agent told to leave
 * exits 0 on its own (no signal). */
#include "axon/rpc/launch.h"
#include "tests/harness.h"
#include "tests/mp_testutil.h"

#define NAGENTS 3

static const char *const g_names[NAGENTS] = {"a1", "a2", "a3"};

typedef struct world {
  pid_t pids[NAGENTS];
  ax_node *drv;
} world;

static void start(world *w) {
  static const char *const args[] = {"--threads", "2", NULL};
  AX_ASSERT_OK(mt_start("driver", g_names, NAGENTS, args, w->pids, &w->drv));
  /* Every agent has joined and said it is ready (its first tick). */
  for (int i = 0; i < NAGENTS; i++)
    AX_ASSERT_OK(rt_remote_zero(w->drv, g_names[i]));
}

/* Reaps the agents (no signal) and ends the driver; the agents given in
 * `clean` must have exited with 0. */
static void finish(world *w, const int *clean) {
  int st[NAGENTS];
  int left = ax_local_reap(NAGENTS, w->pids, 15000, st);
  AX_ASSERT_OK(dt_all_zero(w->drv, NULL, 0)); /* the agents are gone */
  dt_driver_end(w->drv);
  assert_int_equal(left, 0);
  for (int i = 0; i < NAGENTS; i++)
    if (clean[i] && !mt_exit_clean(st[i]))
      fail_msg("%s: exit status %d", g_names[i], st[i]);
}

static ax_future *sleep_on(ax_node *n, const char *to, int64_t ms) {
  ax_values *a = dt_i64s(1, &ms);
  ax_future *f = NULL;
  ax_call_opts co = {.timeout_ms = 30000};
  AX_ASSERT_OK(ax_rpc_async(n, to, "axon.test.sleep_ms", a, &co, &f));
  ax_values_free(a);
  return f;
}

/* A call in flight on a1 finishes before the world ends. */
static void drains_in_flight(void **state) {
  world w;
  start(&w);
  assert_int_equal(ax_node_wait_leave(w.drv, 0), AX_ESTATE);
  ax_future *f = sleep_on(w.drv, "a1", 1500);
  int64_t t0 = ax_clock_ms();
  ax_world_report rep;
  AX_ASSERT_OK(ax_node_shutdown_world(w.drv, 20000, &rep));
  int64_t ms = ax_clock_ms() - t0;
  assert_true(ax_future_is_done(f));
  AX_ASSERT_OK(ax_future_err(f));
  ax_future_release(f);
  assert_int_equal(rep.members, NAGENTS);
  assert_int_equal(rep.left, NAGENTS);
  assert_int_equal(rep.late + rep.down + rep.failed, 0);
  printf("world ended after %lld ms (a call of 1500 ms in flight)\n",
         (long long)ms);
  const int clean[NAGENTS] = {1, 1, 1};
  finish(&w, clean);
}

/* a2 is still busy at the deadline: reported late, told to leave anyway. */
static void reports_late(void **state) {
  world w;
  start(&w);
  /* 3 s leave the idle agents ample time to drain, even under load. */
  ax_future *f = sleep_on(w.drv, "a2", 6000);
  ax_world_report rep;
  int rc = ax_node_shutdown_world(w.drv, 3000, &rep);
  const char *msg = ax_errmsg();
  if (rc != AX_ETIMEOUT || !strstr(msg, "late: a2") ||
      !strstr(msg, "still busy") || strstr(msg, "a1") || strstr(msg, "a3"))
    fail_msg("%s: %s", ax_errname(rc), msg);
  assert_int_equal(rep.late, 1);
  assert_int_equal(rep.left, NAGENTS - 1);
  AX_ASSERT_OK(ax_future_wait(f, 15000)); /* a2 finished its call first */
  ax_future_release(f);
  const int clean[NAGENTS] = {1, 1, 1};
  finish(&w, clean);
}

/* a3 died: counted as down, the others leave. */
static void skips_down(void **state) {
  world w;
  start(&w);
  rt_stop_agent(w.pids[2], SIGKILL, 5000);
  w.pids[2] = 0;
  for (int i = 0; i < 500 && !ax_node_peer_is_down(w.drv, "a3"); i++)
    rt_sleep_ms(20);
  AX_ASSERT_OK(dt_all_zero(w.drv, g_names, NAGENTS - 1));
  ax_world_report rep;
  AX_ASSERT_OK(ax_node_shutdown_world(w.drv, 10000, &rep));
  assert_int_equal(rep.down, 1);
  assert_int_equal(rep.left, NAGENTS - 1);
  const int clean[NAGENTS] = {1, 1, 0};
  finish(&w, clean);
}

/* ax_local_end_world's fallback: a2 cannot leave before its 20 s call ends,
 * so after the (short) deadline it gets SIGTERM, then SIGKILL; the idle
 * agents left on their own, and nothing is left running. */
static void signals_fallback(void **state) {
  world w;
  start(&w);
  ax_future *f = sleep_on(w.drv, "a2", 20000);
  rt_sleep_ms(200); /* the call is running on a2 */
  int st[NAGENTS];
  int64_t t0 = ax_clock_ms();
  int rc = ax_local_end_world(w.drv, NAGENTS, w.pids, 1500, st, "test");
  int64_t ms = ax_clock_ms() - t0;
  assert_int_equal(rc, AX_ETIMEOUT);
  for (int i = 0; i < NAGENTS; i++)
    assert_int_equal(w.pids[i], 0);
  assert_true(mt_exit_clean(st[0]) && mt_exit_clean(st[2]));
  assert_false(mt_exit_clean(st[1])); /* signalled: still in its call */
  assert_true(ms < 15000); /* well before a2's call would have ended */
  printf("ended in %lld ms, a2 status %d\n", (long long)ms, st[1]);
  ax_future_wait(f, 10000);
  ax_future_release(f);
  const int clean[NAGENTS] = {0, 0, 0};
  finish(&w, clean);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(drains_in_flight),
      cmocka_unit_test(reports_late),
      cmocka_unit_test(skips_down),
      cmocka_unit_test(signals_fallback),
  };
  return AX_TEST_MAIN(tests);
}
