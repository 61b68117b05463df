/* Staleness corrections (runtime/pipeline/stage/staleness.h) over 3 real agent
 * processes on loopback, against the single-process reference of
 * tests/pipe_testutil.h (pt_reference_ex with pt_ref_opts.staleness, its
 * own SGD and the versions' momentum and update averages, written apart
 * from the stage host):
 *  - predict and pipemare for ddg, fr and pipedream (K = 2, 3) and 2bw
 *    (K = 2, 3 and M = 2, 4) equal their reference (relative <= 1e-5 over
 *    a floor of 1e-2 times the parameters' RMS), and
 *    differ visibly from the uncorrected reference (negative control);
 *  - none is the mode as it was: bit for bit the uncorrected reference on
 *    pipedream (one unit, one summation order), and the same run as
 *    options that never name a correction;
 *  - the delays the stages get (ax_pipe_delay, derived from the action
 *    lists) are the reference's lags; pipemare stashes no version (2bw
 *    keeps its shadow for the forwards);
 *  - bad options get AX_EINVAL with a message, and a flushed mode refuses a
 *    correction, in ax_pipe_new and in a stage host's own setup;
 * and every node ends with zero live RRefs, contexts, calls and futures. */
#include <stdlib.h>
#include <string.h>

/* Relative differences over a floor of 1e-2 times the parameters' root
 * mean square (pipe_testutil.h): a weight crossing zero (1e-5 in size)
 * otherwise turns a rounding difference of 2e-10 into 2e-5. */
#define PT_FLOOR_RMS
#include "tests/pipe_testutil.h"

#define NAGENTS 3
static const char *g_names[NAGENTS] = {"z1", "z2", "z3"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

static const char *g_model_cfg = "widths=48/40/32/24/10";
static const char *g_data_cfg = "shape=48,classes=10,examples=256,seed=7";
static const char *g_optim = "opt=sgd,lr=0.05,momentum=0.9";
enum { BATCH = 16 };

typedef struct stale_case {
  int mode, K, M, T, staleness;
  double gamma; /* pipemare; 0: the default */
  int warmup;
} stale_case;

/* Runs the case on the agents; the stages' parameters in got[k], the
 * pipe's statistics in *st. */
static void run_pipe(const stale_case *c, const int *bounds, pt_data *data,
                     ax_tensor **got, ax_pipe_stats *st) {
  ax_pipe_opts o = {"mlp",   g_model_cfg, c->K,   g_names,
                    bounds,  c->mode,     c->M,   AX_RECOMPUTE_NEVER,
                    g_optim, 3,           AX_CPU, 30000};
  o.staleness = c->staleness;
  o.stale_gamma = c->gamma;
  o.stale_warmup = c->warmup;
  ax_pipe *p;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, c->T, pt_batch, NULL, data));
  ax_pipe_get_stats(p, st);
  for (int k = 0; k < c->K; k++) {
    ax_tensor *gbuf = NULL;
    AX_ASSERT_OK(ax_pipe_stage_state(p, k, &got[k], &gbuf));
    ax_tensor_release(gbuf);
  }
  ax_pipe_free(p);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

/* The reference of the case with correction `stale`. */
static void run_ref(const stale_case *c, const int *bounds, pt_data *data,
                    int stale, ax_tensor **want) {
  const ax_model_def *def = ax_model_find("mlp");
  ax_config mcfg;
  AX_ASSERT_OK(ax_model_config(def, g_model_cfg, &mcfg));
  ax_tensor *wbuf[NAGENTS];
  pt_ref_opts ro = {ax_pipe_units(c->mode, c->M), 0, stale,
                    c->gamma ? c->gamma : AX_PIPEMARE_GAMMA, c->warmup};
  pt_reference_ex(def, &mcfg, bounds, c->K, ref_kind(c->mode), c->T, pt_batch,
                  data, g_optim, 3, &ro, want, wbuf);
  for (int k = 0; k < c->K; k++)
    ax_tensor_release(wbuf[k]);
}

static double worst_of(int K, ax_tensor **a, ax_tensor **b) {
  double w = 0;
  for (int k = 0; k < K; k++) {
    double x = pt_worst(a[k], b[k]);
    w = x > w ? x : w;
  }
  return w;
}

static void release_all(int K, ax_tensor **t) {
  for (int k = 0; k < K; k++)
    ax_tensor_release(t[k]);
}

static void run_case(const stale_case *c) {
  const ax_model_def *def = ax_model_find("mlp");
  ax_config mcfg, dcfg;
  ax_model_info info;
  AX_ASSERT_OK(ax_model_config(def, g_model_cfg, &mcfg));
  AX_ASSERT_OK(def->describe(&mcfg, &info));
  int bounds[NAGENTS + 1];
  AX_ASSERT_OK(ax_split_uniform(info.n_blocks, c->K, bounds));
  pt_data data = {NULL, BATCH};
  AX_ASSERT_OK(ax_config_parse(&dcfg, g_data_cfg));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
  ax_tensor *got[NAGENTS], *want[NAGENTS], *plain[NAGENTS];
  ax_pipe_stats st;
  run_pipe(c, bounds, &data, got, &st);
  run_ref(c, bounds, &data, c->staleness, want);
  run_ref(c, bounds, &data, AX_STALE_NONE, plain);
  double worst = worst_of(c->K, got, want), off = worst_of(c->K, got, plain);
  fprintf(stderr,
          "  %-9s %-8s K=%d M=%d: %2d steps, worst relative "
          "difference %.2g (against no correction: %.2g), peak versions "
          "%d\n",
          ax_pipe_mode_name(c->mode), ax_staleness_name(c->staleness), c->K,
          c->M, c->T, worst, off, st.peak_versions[0]);
  for (int k = 0; k < c->K; k++) {
    int bound = ax_pipe_version_bound(c->mode, c->K, k, c->M);
    if (c->staleness == AX_STALE_PREDICT) /* the live one besides */
      assert_true(st.peak_versions[k] <= bound + 1);
    else if (c->staleness == AX_STALE_PIPEMARE) /* nothing stashed */
      assert_int_equal(st.peak_versions[k], c->mode == AX_MODE_2BW ? 2 : 1);
    assert_true(st.peak_live[k] <= ax_pipe_live_bound(c->mode, c->K, k, c->M));
  }
  if (c->staleness != AX_STALE_NONE && off < 1e-4)
    fail_msg("%s %s K=%d: the correction changed nothing (%.3g)",
             ax_pipe_mode_name(c->mode), ax_staleness_name(c->staleness), c->K,
             off);
  if (worst > 1e-5)
    fail_msg("%s %s K=%d M=%d: relative difference %.3g > 1e-5",
             ax_pipe_mode_name(c->mode), ax_staleness_name(c->staleness), c->K,
             c->M, worst);
  release_all(c->K, got);
  release_all(c->K, want);
  release_all(c->K, plain);
  ax_dataset_close(data.ds);
}

static void run_grid(int staleness) {
  static const int mini[] = {AX_MODE_PIPEDREAM, AX_MODE_DDG, AX_MODE_FR};
  for (int K = 2; K <= 3; K++)
    for (size_t i = 0; i < sizeof mini / sizeof mini[0]; i++) {
      stale_case c = {mini[i], K, 1, 12, staleness, 0, 0};
      run_case(&c);
    }
  static const int km[][2] = {{2, 2}, {3, 2}, {3, 4}};
  for (size_t i = 0; i < sizeof km / sizeof km[0]; i++) {
    stale_case c = {AX_MODE_2BW, km[i][0], km[i][1], 8, staleness, 0, 0};
    run_case(&c);
  }
}

static void test_predict_equals_reference(void **state) {
  run_grid(AX_STALE_PREDICT);
}

static void test_pipemare_equals_reference(void **state) {
  run_grid(AX_STALE_PIPEMARE);
  /* another gamma and the warm-up form of the step size */
  stale_case c = {AX_MODE_PIPEDREAM, 3, 1, 12, AX_STALE_PIPEMARE, 0.5, 5};
  run_case(&c);
}

/* none: bit for bit the uncorrected reference (pipedream sums one unit per
 * update, in the reference's order), and the same as a run whose options
 * never name a correction. */
static void test_none_is_the_mode(void **state) {
  stale_case c = {AX_MODE_PIPEDREAM, 3, 1, 12, AX_STALE_NONE, 0, 0};
  run_case(&c);
  const ax_model_def *def = ax_model_find("mlp");
  ax_config mcfg, dcfg;
  ax_model_info info;
  AX_ASSERT_OK(ax_model_config(def, g_model_cfg, &mcfg));
  AX_ASSERT_OK(def->describe(&mcfg, &info));
  int bounds[NAGENTS + 1];
  AX_ASSERT_OK(ax_split_uniform(info.n_blocks, c.K, bounds));
  pt_data data = {NULL, BATCH};
  AX_ASSERT_OK(ax_config_parse(&dcfg, g_data_cfg));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
  ax_tensor *got[NAGENTS], *want[NAGENTS];
  ax_pipe_stats st;
  run_pipe(&c, bounds, &data, got, &st);
  run_ref(&c, bounds, &data, AX_STALE_NONE, want);
  for (int k = 0; k < c.K; k++)
    assert_memory_equal(ax_f32(got[k]), ax_f32(want[k]),
                        ax_tensor_nbytes(want[k]));
  release_all(c.K, got);
  release_all(c.K, want);
  ax_dataset_close(data.ds);
}

/* The stages' delays, derived from the action lists, are the reference's
 * lags (written from the modes' update rules). */
static void test_delays(void **state) {
  static const int modes[] = {AX_MODE_PIPEDREAM, AX_MODE_DDG, AX_MODE_FR,
                              AX_MODE_2BW};
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
    for (int K = 1; K <= 6; K++)
      for (int s = 0; s < K; s++)
        assert_int_equal(ax_pipe_delay(modes[i], K, s, K),
                         ref_delay(ref_kind(modes[i]), K - 1 - s));
  for (int s = 0; s < 4; s++) {
    assert_int_equal(ax_pipe_delay(AX_MODE_GPIPE, 4, s, 4), 0);
    assert_int_equal(ax_pipe_delay(AX_MODE_1F1B, 4, s, 8), 0);
  }
  assert_int_equal(ax_pipe_delay(AX_MODE_PIPEDREAM, 4, 4, 1), -1);
  assert_int_equal(ax_pipe_delay(AX_MODE_COUNT, 4, 0, 1), -1);
}

static void test_bad_options(void **state) {
  int k = 42;
  assert_int_equal(ax_staleness_parse("sometimes", &k), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "none, predict or pipemare"));
  assert_int_equal(k, 42);
  AX_ASSERT_OK(ax_staleness_parse("pipemare", &k));
  assert_int_equal(k, AX_STALE_PIPEMARE);
  ax_pipe_opts o = {
      "mlp", g_model_cfg,        2,       g_names, NULL,   AX_MODE_GPIPE,
      2,     AX_RECOMPUTE_NEVER, g_optim, 3,       AX_CPU, 5000};
  ax_pipe *p = NULL;
  o.staleness = AX_STALE_PREDICT; /* a flushed mode: nothing is stale */
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "asynchronous"));
  o.mode = AX_MODE_PIPEDREAM;
  o.staleness = AX_STALE_COUNT;
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL);
  o.staleness = AX_STALE_PIPEMARE;
  o.stale_gamma = 1.5;
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "gamma"));
  o.stale_gamma = 0;
  o.stale_warmup = -1;
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL);
  assert_null(p);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

/* A stage host checks the correction of its setup message itself. */
static int setup_with(ax_rref *h, int mode, int64_t kind, int64_t delay,
                      double gamma, int64_t warmup) {
  ax_values *a = ax_values_new();
  assert_non_null(a);
  ax_values_add_i64(a, mode);
  ax_values_add_i64(a, AX_RECOMPUTE_NEVER);
  ax_values_add_str(a, g_optim);
  ax_values_add_i64(a, 0);
  ax_values_add_i64(a, 0);
  ax_values_add_i64(a, (int64_t)ax_rref_id(h));
  ax_values_add_i64(a, AX_SUM_TREE); /* the sum order */
  ax_values_add_str(a, "staleness"); /* the optional part's name */
  ax_values_add_i64(a, kind);
  ax_values_add_i64(a, delay);
  ax_values_add_f64(a, gamma);
  ax_values_add_i64(a, warmup);
  ax_values *r = NULL;
  ax_call_opts co = {.timeout_ms = 10000};
  int err = ax_rref_rpc_sync(g_drv, h, "setup", a, &co, &r);
  ax_values_free(a);
  ax_values_free(r);
  return err;
}

static void test_host_refuses_bad_setup(void **state) {
  ax_rref *h = NULL;
  ax_call_opts co = {.timeout_ms = 10000};
  char cfg[128];
  snprintf(cfg, sizeof cfg, "model=mlp,stage=0,splits=0/4,seed=3,%s",
           g_model_cfg);
  AX_ASSERT_OK(ax_remote_object(g_drv, g_names[0], "axon.pipe.stage", cfg,
                                AX_CPU, &co, &h));
  AX_ASSERT_OK(setup_with(h, AX_MODE_PIPEDREAM, AX_STALE_PREDICT, 2, -1, 0));
  assert_int_equal(setup_with(h, AX_MODE_1F1B, AX_STALE_PREDICT, 0, -1, 0),
                   AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "asynchronous"));
  assert_int_equal(setup_with(h, AX_MODE_DDG, 7, 2, -1, 0), AX_EINVAL);
  assert_int_equal(setup_with(h, AX_MODE_DDG, AX_STALE_PIPEMARE, -3, -1, 0),
                   AX_EINVAL);
  assert_int_equal(setup_with(h, AX_MODE_DDG, AX_STALE_PIPEMARE, 2, 1.0, 0),
                   AX_EINVAL);
  assert_int_equal(setup_with(h, AX_MODE_FR, AX_STALE_PIPEMARE, 2, -1, -4),
                   AX_EINVAL);
  ax_values *r = NULL;
  AX_ASSERT_OK(ax_rref_rpc_sync(g_drv, h, "teardown", NULL, &co, &r));
  ax_values_free(r);
  ax_rref_release(h);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

int main(void) {
  static const char *const args[] = {"--threads", "4", NULL};
  if (mt_start("coordz", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_options),
      cmocka_unit_test(test_delays),
      cmocka_unit_test(test_host_refuses_bad_setup),
      cmocka_unit_test(test_none_is_the_mode),
      cmocka_unit_test(test_predict_equals_reference),
      cmocka_unit_test(test_pipemare_equals_reference),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
