/* The schedules beyond 1F1B over real agent processes on loopback:
 * interleaved 1F1B (K agents hold v stages each, stage i on agent i mod K),
 * zero bubble H1 (the backward split into I and W), and the V modes (agent
 * r holds stages r and 2K - 1 - r): zbv, dualpipev (composite F&B actions,
 * B mixed with I and W), v-half and v-min. The parameters after each
 * flushed mini-batch equal one single-process full-batch SGD step
 * (relative <= 1e-5) on an 8-block MLP, for K <= 4 and M <= 8; every
 * (stage, unit) runs each of its actions once; the stages' own events pass
 * the schedule oracle (tests/pipe_eventcheck.h: order per agent, placement,
 * data dependencies, live and version bounds); the new V modes train to
 * the same bits as 1f1b over as many stages; bad micro-batch counts are
 * refused; zero live RRefs, contexts and calls after every case. */
#include <stdlib.h>
#include <string.h>

#include "tests/pipe_testutil.h"

#define NAGENTS 4
static const char *g_names[NAGENTS] = {"i1", "i2", "i3", "i4"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

static const char *g_model_cfg = "widths=48/44/40/36/32/28/24/20/10";
static const char *g_data_cfg = "shape=48,classes=10,examples=256,seed=7";
static const char *g_optim = "opt=sgd,lr=0.05,momentum=0.9";

/* One case; with `keep`, the stages' parameters (keep[0 .. S)) and
 * buffers (keep[S ..)) after it, for the caller to release. */
static void run_case_keep(int mode, int K, int v, int M, int T,
                          ax_tensor **keep) {
  const ax_model_def *def = ax_model_find("mlp");
  ax_config mcfg, dcfg;
  ax_model_info info;
  AX_ASSERT_OK(ax_model_config(def, g_model_cfg, &mcfg));
  AX_ASSERT_OK(def->describe(&mcfg, &info));
  int S = K * v, bounds[16 + 1];
  AX_ASSERT_OK(ax_split_uniform(info.n_blocks, S, bounds));
  pt_data data = {NULL, 16};
  AX_ASSERT_OK(ax_config_parse(&dcfg, g_data_cfg));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
  ax_pipe_opts o = {"mlp",   g_model_cfg,
                    K,       g_names,
                    bounds,  mode,
                    M,       AX_RECOMPUTE_NEVER,
                    g_optim, 3,
                    AX_CPU,  30000,
                    NULL,    v};
  ax_pipe *p;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  assert_int_equal(ax_pipe_stages(p), S);
  AX_ASSERT_OK(ax_pipe_train(p, T, pt_batch, NULL, &data));
  /* The schedule from the stages' own events (placement included). */
  pt_check_stage_trace_v(p, mode, K, v, M, AX_RECOMPUTE_NEVER, T, g_drv,
                         g_names);
  long ne;
  const ax_pipe_event *ev = ax_pipe_events(p, &ne);
  int split = ax_pipe_mode_get(mode)->split,
      mixes = ax_pipe_mode_get(mode)->weight_halves != NULL;
  long want_ev = 0; /* every action but the STEPs */
  for (int r = 0; r < K; r++)
    want_ev += ax_pipe_nops_rank(mode, K, v, r, M, T) - (long)S / K * T;
  assert_int_equal(ne, want_ev);
  static unsigned char once[16][AX_OP_KINDS][64];
  memset(once, 0, sizeof once);
  for (long i = 0; i < ne; i++) {
    const ax_pipe_op *e = &ev[i].op;
    assert_true(once[e->stage][e->kind][e->batch * M + e->micro]++ == 0);
    assert_true(e->kind == AX_OP_FWD || mixes ||
                (split ? e->kind != AX_OP_BWD : e->kind == AX_OP_BWD));
    assert_true(ev[i].live <= ax_pipe_live_bound(mode, S, e->stage, M));
  }
  for (int k = 0; keep && k < S; k++)
    AX_ASSERT_OK(ax_pipe_stage_state(p, k, &keep[k], &keep[S + k]));
  ax_tensor *want[16], *wbuf[16];
  pt_reference(def, &mcfg, bounds, S, REF_SYNC, T, pt_batch, &data, g_optim, 3,
               want, wbuf);
  double worst = pt_worst_stages(p, S, want, wbuf);
  fprintf(stderr,
          "  %-11s K=%d v=%d M=%d: %d steps, worst relative "
          "difference %.2g\n",
          ax_pipe_mode_name(mode), K, v, M, T, worst);
  if (worst > 1e-5)
    fail_msg("%s K=%d v=%d M=%d: relative difference %.3g > 1e-5",
             ax_pipe_mode_name(mode), K, v, M, worst);
  ax_pipe_free(p);
  ax_dataset_close(data.ds);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void run_case_mode(int mode, int K, int v, int M, int T) {
  run_case_keep(mode, K, v, M, T, NULL);
}

static void run_case(int K, int v, int M, int T) {
  run_case_mode(AX_MODE_INTERLEAVED, K, v, M, T);
}

static void test_zbh1_equals_full_batch(void **state) {
  static const int km[][2] = {{1, 2}, {2, 2}, {2, 8}, {3, 4},
                              {4, 4}, {4, 8}, {4, 1}};
  for (size_t i = 0; i < sizeof km / sizeof km[0]; i++)
    run_case_mode(AX_MODE_ZBH1, km[i][0], 1, km[i][1], 2);
}

static void test_zbv_equals_full_batch(void **state) {
  static const int km[][2] = {{1, 2}, {2, 2}, {2, 5}, {3, 4},
                              {4, 4}, {4, 8}, {4, 1}};
  for (size_t i = 0; i < sizeof km / sizeof km[0]; i++)
    run_case_mode(AX_MODE_ZBV, km[i][0], 2, km[i][1], 2);
}

static void test_dualpipev_equals_full_batch(void **state) {
  static const int km[][2] = {{1, 2}, {2, 4}, {2, 5}, {3, 6}, {4, 8}};
  for (size_t i = 0; i < sizeof km / sizeof km[0]; i++)
    run_case_mode(AX_MODE_DUALPIPEV, km[i][0], 2, km[i][1], 2);
}

static void test_vhalf_vmin_equal_full_batch(void **state) {
  static const int km[][2] = {{1, 2}, {2, 4}, {3, 4}, {4, 8}, {4, 1}};
  for (size_t i = 0; i < sizeof km / sizeof km[0]; i++) {
    run_case_mode(AX_MODE_VHALF, km[i][0], 2, km[i][1], 2);
    run_case_mode(AX_MODE_VMIN, km[i][0], 2, km[i][1], 2);
  }
}

/* The new V modes over K agents train to 1f1b's bits over 2K agents of one
 * stage each (the same split of the blocks, data and seeds): both sum the
 * micro-batches' gradients in order, and a B equals its I and W. */
static void test_v_modes_same_bits_as_1f1b(void **state) {
  static const int modes[] = {AX_MODE_DUALPIPEV, AX_MODE_VHALF, AX_MODE_VMIN};
  for (int K = 1; K <= 2; K++) {
    int S = 2 * K, M = 2 * S;
    ax_tensor *ref[8], *got[8];
    run_case_keep(AX_MODE_1F1B, S, 1, M, 2, ref);
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
      run_case_keep(modes[m], K, 2, M, 2, got);
      for (int k = 0; k < 2 * S; k++) {
        assert_true((got[k] == NULL) == (ref[k] == NULL));
        if (got[k] && (ax_tensor_numel(got[k]) != ax_tensor_numel(ref[k]) ||
                       memcmp(ax_f32(got[k]), ax_f32(ref[k]),
                              ax_tensor_numel(ref[k]) * sizeof(float))))
          fail_msg("%s K=%d M=%d: %s of stage %d differ from 1f1b's",
                   ax_pipe_mode_name(modes[m]), K, M,
                   k < S ? "parameters" : "buffers", k % S);
        ax_tensor_release(got[k]);
      }
    }
    for (int k = 0; k < 2 * S; k++)
      ax_tensor_release(ref[k]);
  }
}

static void test_interleaved_equals_full_batch(void **state) {
  run_case(1, 2, 2, 2);
  run_case(2, 2, 2, 2);
  run_case(2, 2, 8, 2);
  run_case(2, 4, 4, 2);
  run_case(3, 2, 6, 2);
  run_case(4, 2, 4, 2);
  run_case(4, 2, 8, 2);
}

static void test_interleaved_refuses(void **state) {
  ax_pipe_opts o = {"mlp",   g_model_cfg,
                    4,       g_names,
                    NULL,    AX_MODE_INTERLEAVED,
                    6,       AX_RECOMPUTE_NEVER,
                    g_optim, 3,
                    AX_CPU,  5000,
                    NULL,    2};
  ax_pipe *p = NULL;
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "multiple"));
  o.M = 4;
  o.chunks = 3; /* 12 stages for 8 blocks */
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL);
  assert_null(p);
}

int main(void) {
  static const char *const args[] = {"--threads", "4", NULL};
  if (mt_start("coordi", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_interleaved_refuses),
      cmocka_unit_test(test_interleaved_equals_full_batch),
      cmocka_unit_test(test_zbh1_equals_full_batch),
      cmocka_unit_test(test_zbv_equals_full_batch),
      cmocka_unit_test(test_dualpipev_equals_full_batch),
      cmocka_unit_test(test_vhalf_vmin_equal_full_batch),
      cmocka_unit_test(test_v_modes_same_bits_as_1f1b),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
