/* Users' models and kinds over real agents: three stock axon-agent
 * processes started with --plugin custom_model.so --plugin
 * test_plugin_good.so train the custom_model example's fmcnn (a model and a
 * layer libaxon does not have) in every pipeline mode; the kinds of models
 * registered before and after ax_dist_init, a plugin's function and object
 * kind are served; agents refuse broken plugins with the file named; the
 * custom_model program runs end to end; the world ends with every agent
 * leaving and exiting 0, zero live RRefs, contexts and calls everywhere. */
#include <math.h>

#include "axon/rpc/launch.h"
#include "axon/runtime/autograd/plugin.h"
#include "axon/runtime/pipeline/coord/coordinator.h"
#include "tests/example_testutil.h"
#include "tests/harness.h"

#define NAGENTS 3
#define STEPS 6
#define BATCH 8

static const char *const g_names[NAGENTS] = {"w1", "w2", "w3"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;
static char g_cm[4200], g_fixture[4200];

static int setup(void) {
  mt_bin_path("custom_model.so", g_cm, sizeof g_cm);
  mt_bin_path("test_plugin_good.so", g_fixture, sizeof g_fixture);
  /* The coordinator looks fmcnn up to split it: it loads the plugin too. */
  if (ax_plugin_load(g_cm) != AX_OK || ax_plugin_load(g_fixture) != AX_OK) {
    fprintf(stderr, "%s\n", ax_errmsg());
    return -1;
  }
  const char *args[] = {"--plugin", g_cm, "--plugin", g_fixture, NULL};
  return mt_start("driver", g_names, NAGENTS, args, g_pids, &g_drv) ? -1 : 0;
}

/* Ends the world as a user would: every agent is told to leave and exits
 * with 0; no signal is needed. */
static int teardown(void) {
  int st[NAGENTS], bad = 0;
  ax_world_report rep;
  memset(&rep, 0, sizeof rep);
  int rc = ax_node_shutdown_world(g_drv, 20000, &rep);
  if (rc != AX_OK || rep.left != NAGENTS || rep.members != NAGENTS) {
    fprintf(stderr, "world shutdown: %s: %s (left %d of %d)\n", ax_strerror(rc),
            ax_errmsg(), rep.left, rep.members);
    bad = 1;
  }
  ax_local_reap(NAGENTS, g_pids, 15000, st);
  for (int i = 0; i < NAGENTS; i++)
    if (!mt_exit_clean(st[i])) {
      fprintf(stderr, "agent %s: exit status %d\n", g_names[i], st[i]);
      bad = 1;
    }
  dt_driver_end(g_drv);
  return bad ? -1 : 0;
}

/* One fixed batch: the loss must fall over the steps in every mode. */
typedef struct feed {
  ax_tensor *x, *y;
  double loss[STEPS];
  long n;
} feed;

static int feed_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  feed *f = user;
  *in = ax_tlist1(ax_tensor_retain(f->x));
  *lab = ax_tlist1(ax_tensor_retain(f->y));
  return AX_OK;
}

static void feed_step(void *user, const ax_pipe_step_info *s) {
  feed *f = user;
  if (f->n < STEPS)
    f->loss[f->n] = s->loss;
  f->n++;
}

static void every_mode(void **state) {
  int64_t xs[4] = {BATCH, 1, 12, 12}, ys[1] = {BATCH};
  feed f = {ax_test_randn(3, 1.0f, 4, xs), ax_test_randint(4, 0, 10, 1, ys)};
  int modes = 0;
  for (int m = 0; strcmp(ax_pipe_mode_name(m), "?"); m++, modes++) {
    ax_pipe_opts o = {.model = "fmcnn",
                      .model_config = "channels=4/8/8",
                      .K = NAGENTS,
                      .agents = g_names,
                      .mode = m,
                      .M = 2,
                      .optim_config = "opt=sgd,lr=0.05,momentum=0.9",
                      .seed = 5,
                      .device = AX_CPU,
                      .timeout_ms = 60000};
    if (ax_pipe_mode_get(m)->chunked) { /* 2 agents x 2 stages: 4 blocks */
      o.K = 2;
      o.chunks = 2;
    }
    if (o.M < ax_pipe_min_units(m, o.K)) /* dualpipev: 2 per stage */
      o.M = ax_pipe_min_units(m, o.K);
    ax_pipe *p = NULL;
    AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
    f.n = 0;
    AX_ASSERT_OK(ax_pipe_train(p, STEPS, feed_batch, feed_step, &f));
    ax_pipe_free(p);
    assert_int_equal(f.n, STEPS);
    printf("%-10s loss", ax_pipe_mode_name(m));
    for (int i = 0; i < STEPS; i++) {
      printf(" %.4f", f.loss[i]);
      if (!isfinite(f.loss[i]))
        fail_msg("%s: loss %d is not finite", ax_pipe_mode_name(m), i);
    }
    printf("\n");
    if (!(f.loss[STEPS - 1] < f.loss[0] - 0.05))
      fail_msg("%s: loss did not fall: %.4f -> %.4f", ax_pipe_mode_name(m),
               f.loss[0], f.loss[STEPS - 1]);
  }
  assert_true(modes >= 6);
  ax_tensor_release(f.x);
  ax_tensor_release(f.y);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

/* The fixture registers fixture_early when loaded (before the agent's
 * ax_dist_init) and fixture_late on the node (after it). */
static void kinds_functions(void **state) {
  for (int i = 0; i < NAGENTS; i++) {
    const char *kinds[2] = {"fixture_early.stage", "fixture_late.stage"};
    for (int k = 0; k < 2; k++) {
      ax_rref *r = NULL;
      AX_ASSERT_OK(
          ax_remote_module(g_drv, g_names[i], kinds[k], "", AX_CPU, &r));
      int64_t shape[2] = {4, 6}, hdr[2] = {1, 0};
      ax_tensor *x = ax_test_randn(9, 1.0f, 2, shape);
      ax_values *a = dt_i64s(2, hdr), *out = NULL;
      ax_values_add_tensor(a, x);
      AX_ASSERT_OK(ax_rmod_forward(g_drv, r, a, &out));
      ax_tensor *y;
      AX_ASSERT_OK(ax_values_get_tensor(out, 0, &y));
      assert_int_equal(y->shape[0], 4);
      assert_int_equal(y->shape[1], 3);
      ax_values_free(out);
      ax_values_free(a);
      ax_tensor_release(x);
      ax_rref_release(r);
    }
    int64_t v = 41;
    ax_values *a = dt_i64s(1, &v), *out = NULL;
    AX_ASSERT_OK(ax_rpc_sync(g_drv, g_names[i], "fixture.ping", a, NULL, &out));
    int64_t got;
    const char *who;
    AX_ASSERT_OK(ax_values_get_i64(out, 0, &got));
    AX_ASSERT_OK(ax_values_get_str(out, 1, &who));
    assert_int_equal(got, 42);
    assert_string_equal(who, g_names[i]);
    ax_values_free(out);
    ax_rref *c = NULL;
    AX_ASSERT_OK(ax_remote_object(g_drv, g_names[i], "fixture.counter",
                                  "start=10", AX_CPU, NULL, &c));
    for (int k = 1; k <= 2; k++) {
      AX_ASSERT_OK(ax_rref_rpc_sync(g_drv, c, "add", a, NULL, &out));
      AX_ASSERT_OK(ax_values_get_i64(out, 0, &got));
      assert_int_equal(got, 10 + 41 * k);
      ax_values_free(out);
    }
    ax_values_free(a);
    ax_rref_release(c);
  }
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

/* An agent given a broken plugin exits with 1 and names the file. */
static void agent_refuses(void **state) {
  char bad[4200], missing[4200], want[64];
  mt_bin_path("test_plugin_badabi.so", bad, sizeof bad);
  mt_bin_path("missing_plugin.so", missing, sizeof missing);
  snprintf(want, sizeof want, "built for plugin ABI %u, this axon has ABI %u",
           AX_PLUGIN_ABI + 1, AX_PLUGIN_ABI);
  const char *cases[2][2] = {{bad, want}, {missing, "no such file"}};
  for (int i = 0; i < 2; i++) {
    char *argv[] = {"axon-agent",        "--name",      "x",
                    "--master",          "127.0.0.1:1", "--plugin",
                    (char *)cases[i][0], NULL};
    char *out = NULL;
    int rc = et_run(argv, 30, &out);
    if (rc != 1 || !strstr(out, cases[i][0]) || !strstr(out, cases[i][1]))
      fail_msg("exit %d, want 1 naming %s and '%s':\n%s", rc, cases[i][0],
               cases[i][1], out);
    free(out);
  }
}

/* The example program as a user runs it: every mode, agents exit 0. */
static void example_program(void **state) {
  char *argv[] = {"custom_model",
                  "--local",
                  "3",
                  "--steps",
                  "8",
                  "--batch",
                  "16",
                  "--data-config",
                  "limit=512",
                  "--eval-limit",
                  "250",
                  "--model-config",
                  "channels=4/8/8",
                  NULL};
  char *out = NULL;
  int rc = et_run(argv, 300, &out);
  int modes = et_count(out, "custom_model: mode=");
  if (rc != 0 || modes < 6 ||
      !strstr(out, "custom_model: 3 agent(s) left and exited with 0") ||
      !strstr(out, "live at exit: rrefs 0, contexts 0, calls 0, futures 0"))
    fail_msg("exit %d, %d modes:\n%s", rc, modes, out);
  free(out);
}

/* axon-run loads the plugin, trains fmcnn and passes --plugin on to the
 * agents it starts; they leave when told and exit. */
static void axon_run_plugin(void **state) {
  char *argv[] = {"axon-run",     "train", "--plugin",      g_cm,
                  "--model",      "fmcnn", "--local",       "3",
                  "--mode",       "1f1b",  "--steps",       "4",
                  "--batch",      "16",    "--data-config", "limit=256",
                  "--eval-limit", "100",   "--quiet",       NULL};
  char *out = NULL;
  int rc = et_run(argv, 120, &out);
  if (rc != 0 || !strstr(out, "summary: model=fmcnn") ||
      et_count(out, "the master ends the world, exiting") != 3 ||
      et_count(out, ": exited") != 3)
    fail_msg("exit %d:\n%s", rc, out);
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_mode),      cmocka_unit_test(kinds_functions),
      cmocka_unit_test(agent_refuses),   cmocka_unit_test(example_program),
      cmocka_unit_test(axon_run_plugin),
  };
  if (setup() != 0)
    return 1;
  int failed = AX_TEST_MAIN(tests);
  return teardown() != 0 || failed;
}
