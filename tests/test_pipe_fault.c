/* A stage agent killed in the middle of a pipeline run: the coordinator
 * stops with an error naming that agent within 5 s (no hang), and the
 * surviving agents and the coordinator end with zero live RRefs, contexts,
 * calls and futures. One case per mode below (pipedream, gpipe, ddg), each
 * on its own group of three agents (a killed agent cannot come back). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "tests/pipe_testutil.h"

#define NGROUPS 3
#define PER 3
#define NKILL (NGROUPS * PER)
#define NAGENTS (NKILL + 2) /* e1, e2: shut down while hosting stages */
static const char *g_names[NAGENTS] = {"f1", "f2", "f3", "g1", "g2", "g3",
                                       "h1", "h2", "h3", "e1", "e2"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;
static double g_killed_at;

static void *killer(void *arg) {
  rt_sleep_ms(700);
  g_killed_at = ax_clock_s();
  kill(*(pid_t *)arg, SIGKILL);
  return NULL;
}

/* Trains on group g (agents 3g .. 3g+2) and kills the middle one. */
static void run_kill(int mode, int g) {
  const char *const *names = &g_names[PER * g];
  ax_config dcfg;
  pt_data data = {NULL, 32};
  AX_ASSERT_OK(ax_config_parse(&dcfg, "shape=256,classes=10,examples=512"));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
  ax_pipe_opts o = {"mlp", "widths=256/256/256/10", PER, names,  NULL, mode, 4,
                    0,     "opt=sgd,lr=0.01",       1,   AX_CPU, 30000};
  ax_pipe *p;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  pthread_t th;
  pthread_create(&th, NULL, killer, &g_pids[PER * g + 1]);
  int rc = ax_pipe_train(p, 100000, pt_batch, NULL, &data);
  double took = ax_clock_s() - g_killed_at;
  char msg[512];
  snprintf(msg, sizeof msg, "%s", ax_errmsg());
  pthread_join(th, NULL);
  fprintf(stderr, "  %s: stopped %.2f s after the kill: %s: %s\n",
          ax_pipe_mode_name(mode), took, ax_strerror(rc), msg);
  assert_int_not_equal(rc, AX_OK);
  assert_non_null(strstr(msg, names[1]));
  assert_true(took < 5.0);
  ax_pipe_free(p);
  ax_dataset_close(data.ds);
  const char *alive[2] = {names[0], names[2]};
  AX_ASSERT_OK(dt_all_zero(g_drv, alive, 2));
}

static void test_kill_pipedream(void **state) {
  run_kill(AX_MODE_PIPEDREAM, 0);
}
static void test_kill_gpipe(void **state) { run_kill(AX_MODE_GPIPE, 1); }
static void test_kill_ddg(void **state) { run_kill(AX_MODE_DDG, 2); }

/* Agents told to stop (SIGTERM) while they still host set-up stages that
 * hold their neighbours' RRefs (no teardown) exit cleanly: destroying the
 * hosts at shutdown releases those RRefs after the RRef layer stopped. */
static void test_shutdown_with_stages(void **state) {
  ax_config dcfg;
  pt_data data = {NULL, 16};
  AX_ASSERT_OK(ax_config_parse(&dcfg, "shape=32,classes=10,examples=64"));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
  const char *names[2] = {"e1", "e2"};
  ax_pipe_opts o = {
      "mlp", "widths=32/32/10", 2, names,  NULL, AX_MODE_PIPEDREAM, 1,
      0,     "opt=sgd,lr=0.01", 1, AX_CPU, 30000};
  ax_pipe *p;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, 1, pt_batch, NULL, &data));
  for (int i = NKILL; i < NAGENTS; i++)
    kill(g_pids[i], SIGTERM);
  int clean = 1;
  for (int i = NKILL; i < NAGENTS; i++) {
    int st = rt_stop_agent(g_pids[i], SIGTERM, 15000);
    fprintf(stderr, "  %s: %s %d\n", g_names[i],
            st == -1        ? "not stopped"
            : WIFEXITED(st) ? "exit status"
                            : "signal",
            st == -1        ? 0
            : WIFEXITED(st) ? WEXITSTATUS(st)
                            : WTERMSIG(st));
    clean &= st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    g_pids[i] = -1;
  }
  ax_pipe_free(p); /* the hosts' agents are gone: no teardown, no hang */
  ax_dataset_close(data.ds);
  assert_true(clean);
}

int main(void) {
  static const char *const args[] = {"--threads", "4", "--peer-timeout-ms",
                                     "2000", NULL};
  if (mt_start("coord", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kill_pipedream),
      cmocka_unit_test(test_kill_gpipe),
      cmocka_unit_test(test_kill_ddg),
      cmocka_unit_test(test_shutdown_with_stages),
  };
  int failed = AX_TEST_MAIN(tests);
  for (int i = 0; i < NAGENTS; i++)
    rt_stop_agent(g_pids[i], i < NKILL && i % PER == 1 ? SIGKILL : SIGTERM,
                  15000);
  dt_driver_end(g_drv);
  return failed;
}
