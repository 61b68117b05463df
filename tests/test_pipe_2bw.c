/* PipeDream-2BW over 4 real agent processes on loopback, against a
 * single-process simulator of its update rule (pipe_testutil.h, REF_2BW):
 * every micro-batch of mini-batch t runs forward and backward with W(t-1)
 * (W(-1) = W(0)), the micro-batches' gradients are summed in order, and
 * W(t+1) = step(W(t), g(t)). Also:
 * at most two weight versions per stage, the live-state bound, the
 * stages' own events pass the schedule oracle (tests/pipe_eventcheck.h:
 * order, placement, data dependencies, live and version bounds), too few
 * micro-batches refused, and zero live RRefs, contexts and calls. */
#include <stdlib.h>
#include <string.h>

#include "tests/pipe_testutil.h"

#define NAGENTS 4
static const char *g_names[NAGENTS] = {"q1", "q2", "q3", "q4"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

static const char *g_model_cfg = "widths=48/40/32/24/10";
static const char *g_data_cfg = "shape=48,classes=10,examples=256,seed=7";
static const char *g_optim = "opt=sgd,lr=0.05,momentum=0.9";
enum { BATCH = 16 };

static void run_case(int K, int M, int T) {
  const ax_model_def *def = ax_model_find("mlp");
  ax_config mcfg, dcfg;
  ax_model_info info;
  AX_ASSERT_OK(ax_model_config(def, g_model_cfg, &mcfg));
  AX_ASSERT_OK(def->describe(&mcfg, &info));
  int bounds[NAGENTS + 1];
  AX_ASSERT_OK(ax_split_uniform(info.n_blocks, K, bounds));
  pt_data data = {NULL, BATCH};
  AX_ASSERT_OK(ax_config_parse(&dcfg, g_data_cfg));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
  ax_pipe_opts o = {"mlp",   g_model_cfg, K,      g_names,
                    bounds,  AX_MODE_2BW, M,      AX_RECOMPUTE_NEVER,
                    g_optim, 3,           AX_CPU, 30000};
  ax_pipe *p;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, T, pt_batch, NULL, &data));
  /* The schedule from the stages' own events (placement included). */
  pt_check_stage_trace_v(p, AX_MODE_2BW, K, 1, M, AX_RECOMPUTE_NEVER, T, g_drv,
                         g_names);
  ax_pipe_stats st;
  ax_pipe_get_stats(p, &st);
  for (int k = 0; k < K; k++) {
    assert_true(st.peak_versions[k] <= 2);
    assert_true(st.peak_live[k] <= ax_pipe_live_bound(AX_MODE_2BW, K, k, M));
  }
  /* the rule on the same micro-batches, and plain SGD (negative control) */
  ax_tensor *want[NAGENTS], *wbuf[NAGENTS], *sync[NAGENTS], *sbuf[NAGENTS];
  pt_ref_opts ro = {M, 0};
  pt_reference_ex(def, &mcfg, bounds, K, REF_2BW, T, pt_batch, &data, g_optim,
                  3, &ro, want, wbuf);
  pt_reference_ex(def, &mcfg, bounds, K, REF_SYNC, T, pt_batch, &data, g_optim,
                  3, &ro, sync, sbuf);
  double worst = 0, off = 0;
  for (int k = 0; k < K; k++) {
    ax_tensor *got, *gbuf;
    AX_ASSERT_OK(ax_pipe_stage_state(p, k, &got, &gbuf));
    double w = pt_worst(got, want[k]), s = pt_worst(got, sync[k]);
    worst = w > worst ? w : worst;
    off = s > off ? s : off;
    ax_tensor_release(got);
    ax_tensor_release(gbuf);
    ax_tensor_release(want[k]);
    ax_tensor_release(sync[k]);
    ax_tensor_release(wbuf[k]);
    ax_tensor_release(sbuf[k]);
  }
  fprintf(stderr,
          "  2bw K=%d M=%d: %d steps, worst relative difference "
          "%.2g (against plain SGD: %.2g), peak versions %d\n",
          K, M, T, worst, off, st.peak_versions[0]);
  assert_true(off > 1e-3); /* the lag is visible */
  if (worst > 1e-5)
    fail_msg("2bw K=%d M=%d: relative difference %.3g > 1e-5", K, M, worst);
  ax_pipe_free(p);
  ax_dataset_close(data.ds);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_2bw_equals_its_rule(void **state) {
  run_case(2, 1, 8);
  run_case(2, 2, 8);
  run_case(3, 2, 8);
  run_case(4, 4, 8);
  run_case(4, 3, 6);
}

static void test_2bw_needs_micro_batches(void **state) {
  ax_pipe_opts o = {"mlp",   g_model_cfg, 4,      g_names,
                    NULL,    AX_MODE_2BW, 2,      AX_RECOMPUTE_NEVER,
                    g_optim, 3,           AX_CPU, 5000};
  ax_pipe *p = NULL;
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "at least 3 micro-batches"));
  assert_null(p);
}

int main(void) {
  static const char *const args[] = {"--threads", "4", NULL};
  if (mt_start("coord2", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_2bw_needs_micro_batches),
      cmocka_unit_test(test_2bw_equals_its_rule),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
