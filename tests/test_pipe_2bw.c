/* PipeDream-2BW over 4 real agent processes on loopback, against a
 * single-process simulator of its update rule: every micro-batch of
 * mini-batch t runs forward and backward with W(t-1) (W(-1) = W(0)), the
 * mini-batch's gradients are summed, and W(t+1) = step(W(t), g(t)). Also:
 * at most two weight versions per stage, the live-state bound, too few
 * micro-batches refused, and zero live RRefs, contexts and calls. */
#include <stdlib.h>
#include <string.h>

/* Micro-batch sums round differently from the whole batch's: relative to
 * the parameters' scale (pipe_testutil.h), not to values near zero. */
#define PT_FLOOR_RMS
#include "tests/pipe_testutil.h"

#define NAGENTS 4
static const char *g_names[NAGENTS] = {"q1", "q2", "q3", "q4"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

static const char *g_model_cfg = "widths=48/40/32/24/10";
static const char *g_data_cfg = "shape=48,classes=10,examples=256,seed=7";
static const char *g_optim = "opt=sgd,lr=0.05,momentum=0.9";
enum { BATCH = 16 };

/* The update rule, one process: stage k's version t + 1 from version t
 * and the whole mini-batch's gradient at version max(t - 1, 0). With lag
 * 0 it is plain SGD (the negative control). */
static void reference(const ax_model_def *def, const ax_config *mcfg,
                      const int *bounds, int K, int T, int lag,
                      pt_data *data, ax_tensor **out) {
  ax_net *net[NAGENTS];
  ax_optim *opt[NAGENTS];
  ax_tensor **ver[NAGENTS];
  ax_config oc;
  ax_optim_cfg ocfg;
  ax_model_info info;
  AX_ASSERT_OK(ax_config_parse(&oc, g_optim));
  AX_ASSERT_OK(ax_optim_cfg_parse(&oc, &ocfg));
  AX_ASSERT_OK(def->describe(mcfg, &info));
  for (int k = 0; k < K; k++) {
    AX_ASSERT_OK(ax_model_stage(def, mcfg, bounds[k], bounds[k + 1], AX_CPU,
                                3, &net[k]));
    opt[k] = ax_optim_new(&ocfg, net[k]->n_params, AX_CPU);
    ver[k] = calloc((size_t)T + 1, sizeof *ver[k]);
    ver[k][0] = ax_tensor_like(net[k]->params);
    AX_ASSERT_OK(ax_tensor_copy(ver[k][0], net[k]->params));
  }
  for (int t = 0; t < T; t++) {
    int v = t - lag > 0 ? t - lag : 0;
    ax_tlist in = {0}, lab = {0}, x[NAGENTS + 1] = {{0}}, dy = {0}, dx = {0};
    ax_slot *slot[NAGENTS];
    AX_ASSERT_OK(pt_batch(data, t, &in, &lab));
    x[0] = in;
    for (int k = 0; k < K; k++) {
      ax_exec ex = ax_net_exec(net[k], 1);
      ex.params = ver[k][v];
      slot[k] = ax_slot_new();
      AX_ASSERT_OK(ax_forward(net[k]->root, &ex, slot[k], &x[k], &x[k + 1]));
    }
    ax_loss_result r;
    AX_ASSERT_OK(ax_loss_xent(&x[K], &lab, info.ignore_index, NULL, 1.0f, &r,
                              &dy));
    for (int k = K - 1; k >= 0; k--) {
      ax_exec ex = ax_net_exec(net[k], 1);
      ex.params = ver[k][v];
      AX_ASSERT_OK(ax_net_zero_grad(net[k]));
      ex.grads = net[k]->grads;
      ex.need_dx = k > 0;
      AX_ASSERT_OK(ax_backward(net[k]->root, &ex, slot[k], &dy, &dx));
      ax_tlist_clear(&dy);
      dy = dx;
      memset(&dx, 0, sizeof dx);
      ax_slot_free(slot[k]);
      ver[k][t + 1] = ax_tensor_like(ver[k][t]);
      AX_ASSERT_OK(ax_tensor_copy(ver[k][t + 1], ver[k][t]));
      AX_ASSERT_OK(ax_optim_step(opt[k], ver[k][t + 1], net[k]->grads));
    }
    ax_tlist_clear(&dy);
    for (int k = 0; k <= K; k++)
      ax_tlist_clear(&x[k]);
    ax_tlist_clear(&lab);
  }
  for (int k = 0; k < K; k++) {
    out[k] = ax_tensor_retain(ver[k][T]);
    for (int v = 0; v <= T; v++)
      ax_tensor_release(ver[k][v]);
    free(ver[k]);
    ax_optim_free(opt[k]);
    ax_net_free(net[k]);
  }
}

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
  ax_pipe_opts o = {"mlp", g_model_cfg, K, g_names, bounds, AX_MODE_2BW, M,
                    AX_RECOMPUTE_NEVER, g_optim, 3, AX_CPU, 30000};
  ax_pipe *p;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, T, pt_batch, NULL, &data));
  ax_pipe_stats st;
  ax_pipe_get_stats(p, &st);
  for (int k = 0; k < K; k++) {
    assert_true(st.peak_versions[k] <= 2);
    assert_true(st.peak_live[k] <= ax_pipe_live_bound(AX_MODE_2BW, K, k, M));
  }
  ax_tensor *want[NAGENTS], *sync[NAGENTS];
  reference(def, &mcfg, bounds, K, T, 1, &data, want);
  reference(def, &mcfg, bounds, K, T, 0, &data, sync);
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
  }
  fprintf(stderr, "  2bw K=%d M=%d: %d steps, worst relative difference "
          "%.2g (against plain SGD: %.2g), peak versions %d\n", K, M, T,
          worst, off, st.peak_versions[0]);
  assert_true(off > 1e-3); /* the lag is visible */
  if (worst > (M == 1 ? 0.0 : 1e-5))
    fail_msg("2bw K=%d M=%d: relative difference %.3g > 1e-5", K, M, worst);
  ax_pipe_free(p);
  ax_dataset_close(data.ds);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_2bw_equals_its_rule(void **state) {
  run_case(2, 1, 8); /* one micro-batch: the same arithmetic, exactly */
  run_case(2, 2, 8);
  run_case(3, 2, 8);
  run_case(4, 4, 8);
  run_case(4, 3, 6);
}

static void test_2bw_needs_micro_batches(void **state) {
  ax_pipe_opts o = {"mlp", g_model_cfg, 4, g_names, NULL, AX_MODE_2BW, 2,
                    AX_RECOMPUTE_NEVER, g_optim, 3, AX_CPU, 5000};
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
