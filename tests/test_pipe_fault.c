/* A stage agent killed in the middle of a pipeline run: the coordinator
 * stops with an error naming that agent within 5 s (no hang), and the
 * surviving agents and the coordinator end with zero live RRefs, contexts,
 * calls and futures. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/pipeline/train.h"
#include "tests/pipe_testutil.h"

#define NAGENTS 3
static const char *g_names[NAGENTS] = {"f1", "f2", "f3"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;
static double g_killed_at;

static void *killer(void *arg) {
  rt_sleep_ms(700);
  g_killed_at = ax_now();
  kill(g_pids[1], SIGKILL);
  return NULL;
}

static void run_kill(int mode) {
  ax_config dcfg;
  pt_data data = {NULL, 32};
  AX_ASSERT_OK(ax_config_parse(&dcfg, "shape=256,classes=10,examples=512"));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
  ax_pipe_opts o = {"mlp", "widths=256/256/256/10", NAGENTS, g_names, NULL,
                    mode, 4, 0, "opt=sgd,lr=0.01", 1, AX_CPU, 30000};
  ax_pipe *p;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  pthread_t th;
  pthread_create(&th, NULL, killer, NULL);
  int rc = ax_pipe_train(p, 100000, pt_batch, NULL, &data);
  double took = ax_now() - g_killed_at;
  char msg[512];
  snprintf(msg, sizeof msg, "%s", ax_errmsg());
  pthread_join(th, NULL);
  fprintf(stderr, "  %s: stopped %.2f s after the kill: %s: %s\n",
          ax_pipe_mode_name(mode), took, ax_strerror(rc), msg);
  assert_int_not_equal(rc, AX_OK);
  assert_non_null(strstr(msg, "f2"));
  assert_true(took < 5.0);
  ax_pipe_free(p);
  ax_dataset_close(data.ds);
  const char *alive[2] = {"f1", "f3"};
  AX_ASSERT_OK(dt_all_zero(g_drv, alive, 2));
}

static void test_kill_stage(void **state) { run_kill(AX_MODE_PIPEDREAM); }

int main(void) {
  int port = rt_free_port();
  for (int i = 0; i < NAGENTS; i++)
    g_pids[i] = rt_spawn_agent(g_names[i], port, "--threads", "4",
                               "--peer-timeout-ms", "2000", NULL);
  int rc = dt_driver("coord", port, NAGENTS + 1, &g_drv);
  if (rc == AX_OK)
    rc = dt_wait_world(g_drv, g_names, NAGENTS);
  if (rc != AX_OK) {
    fprintf(stderr, "driver: %s: %s\n", ax_strerror(rc), ax_errmsg());
    for (int i = 0; i < NAGENTS; i++)
      rt_stop_agent(g_pids[i], SIGKILL, 5000);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kill_stage),
  };
  int failed = AX_TEST_MAIN(tests);
  for (int i = 0; i < NAGENTS; i++)
    rt_stop_agent(g_pids[i], i == 1 ? SIGKILL : SIGTERM, 15000);
  dt_driver_end(g_drv);
  return failed;
}
