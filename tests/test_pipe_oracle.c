/* Pipeline oracles on the MLP with 4 real agent processes on loopback:
 *  1. gpipe and 1f1b (K <= 4, M <= 8) equal single-process full-batch SGD;
 *  2. every mode with K = 1 equals plain single-process SGD;
 *  3. pipedream and ddg equal the weight-stashing reference, fr the replay
 *     reference (tests/pipe_testutil.h), K = 2, 3, 4, 12 steps;
 *  4. the schedule invariants hold on every run's events: the coordinator's
 *     (each operation once, live-state and weight-version bounds) and the
 *     stages' own (tests/pipe_eventcheck.h: each stage's order, data
 *     dependencies from its send and receive events, forward locking),
 *     every mode at K = 3 and 4 with M up to 4 included;
 * and every node ends with zero live RRefs, contexts, calls and futures. */
#include <stdlib.h>
#include <string.h>

#include "tests/pipe_testutil.h"

#define NAGENTS 4
static const char *g_names[NAGENTS] = {"p1", "p2", "p3", "p4"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

typedef struct run_cfg {
  const char *model, *model_cfg, *data_cfg, *optim;
  int batch;
  double rtol;
} run_cfg;

static const run_cfg g_mlp = {"mlp",
                              "widths=48/40/32/24/10",
                              "shape=48,classes=10,examples=256,seed=7",
                              "opt=sgd,lr=0.05,momentum=0.9",
                              16,
                              1e-5};

/* Trains `steps` mini-batches in `mode` and compares with the reference. */
static void run_case(const run_cfg *c, int mode, int K, int M, int steps,
                     int recompute) {
  const ax_model_def *def = ax_model_find(c->model);
  ax_config mcfg, dcfg;
  ax_model_info info;
  AX_ASSERT_OK(ax_model_config(def, c->model_cfg, &mcfg));
  AX_ASSERT_OK(def->describe(&mcfg, &info));
  int bounds[NAGENTS + 1];
  AX_ASSERT_OK(ax_split_uniform(info.n_blocks, K, bounds));
  pt_data data = {NULL, c->batch};
  AX_ASSERT_OK(ax_config_parse(&dcfg, c->data_cfg));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
  ax_pipe_opts o = {c->model, c->model_cfg, K,        g_names, bounds, mode,
                    M,        recompute,    c->optim, 3,       AX_CPU, 30000};
  ax_pipe *p;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, steps, pt_batch, NULL, &data));
  pt_check_events(p, mode, K, M, recompute, steps);
  ax_pipe_stats st;
  ax_pipe_get_stats(p, &st);
  ax_tensor *want[NAGENTS], *wbuf[NAGENTS];
  pt_reference(def, &mcfg, bounds, K, ref_kind(mode), steps, pt_batch, &data,
               c->optim, 3, want, wbuf);
  double worst = pt_worst_stages(p, K, want, wbuf);
  fprintf(stderr,
          "  %-10s K=%d M=%d: %2d steps %.1f ms/step, %.0f "
          "coordinator bytes/step, worst relative difference %.2g\n",
          ax_pipe_mode_name(mode), K, M, steps, 1e3 * st.seconds / steps,
          (double)st.coord_bytes / steps, worst);
  if (ref_kind(mode) != REF_SYNC && K > 1) { /* negative control */
    ax_tensor *sync[NAGENTS], *sbuf[NAGENTS];
    pt_reference(def, &mcfg, bounds, K, REF_SYNC, steps, pt_batch, &data,
                 c->optim, 3, sync, sbuf);
    ax_tensor *got, *gbuf;
    AX_ASSERT_OK(ax_pipe_stage_state(p, 0, &got, &gbuf));
    double off = pt_worst(got, sync[0]);
    fprintf(stderr, "    (against plain SGD instead: %.2g)\n", off);
    assert_true(off > 1e-3);
    ax_tensor_release(got);
    ax_tensor_release(gbuf);
    for (int k = 0; k < K; k++) {
      ax_tensor_release(sync[k]);
      ax_tensor_release(sbuf[k]);
    }
  }
  if (worst > c->rtol)
    fail_msg("%s K=%d M=%d: relative difference %.3g > %.3g",
             ax_pipe_mode_name(mode), K, M, worst, c->rtol);
  ax_pipe_free(p);
  ax_dataset_close(data.ds);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_oracle1_sync_equals_full_batch(void **state) {
  static const int km[][2] = {{2, 4}, {3, 8}, {4, 2}, {4, 8}, {2, 1}};
  for (size_t i = 0; i < sizeof km / sizeof km[0]; i++) {
    run_case(&g_mlp, AX_MODE_GPIPE, km[i][0], km[i][1], 2, AX_RECOMPUTE_NEVER);
    run_case(&g_mlp, AX_MODE_1F1B, km[i][0], km[i][1], 2, AX_RECOMPUTE_NEVER);
  }
  run_case(&g_mlp, AX_MODE_GPIPE, 3, 4, 2, AX_RECOMPUTE_ALWAYS);
  run_case(&g_mlp, AX_MODE_GPIPE, 4, 4, 2, AX_RECOMPUTE_EXCEPT_LAST);
  run_case(&g_mlp, AX_MODE_SEQUENTIAL, 4, 1, 3, AX_RECOMPUTE_NEVER);
}

static void test_oracle2_one_stage(void **state) {
  for (int mode = 0; mode <= AX_MODE_PIPEDREAM; mode++)
    run_case(&g_mlp, mode, 1, 4, 4, AX_RECOMPUTE_NEVER);
}

static void test_oracle3_async(void **state) {
  for (int K = 2; K <= 4; K++) {
    run_case(&g_mlp, AX_MODE_PIPEDREAM, K, 1, 12, AX_RECOMPUTE_NEVER);
    run_case(&g_mlp, AX_MODE_DDG, K, 1, 12, AX_RECOMPUTE_NEVER);
    run_case(&g_mlp, AX_MODE_FR, K, 1, 12, AX_RECOMPUTE_NEVER);
  }
}

/* Every mode at K = 3 and K = 4 (M = 4 and 3 micro-batches for gpipe and
 * 1f1b): the stages' events follow the mode's order and its data
 * dependencies (run_case checks them, and the weights). */
static void test_stage_events_every_mode(void **state) {
  for (int K = 3; K <= 4; K++)
    for (int mode = 0; mode <= AX_MODE_PIPEDREAM; mode++)
      run_case(&g_mlp, mode, K, K == 3 ? 4 : 3, 3, AX_RECOMPUTE_NEVER);
}

static void test_bad_options(void **state) {
  ax_pipe_opts o = {"mlp", g_mlp.model_cfg, 9, g_names, NULL, AX_MODE_GPIPE, 2,
                    0,     g_mlp.optim,     3, AX_CPU,  5000};
  ax_pipe *p = NULL;
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL); /* 9 > 4 blocks */
  o.K = 2;
  o.mode = 17;
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL);
  o.mode = AX_MODE_GPIPE;
  o.model = "nosuchmodel";
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_ENOTFOUND);
  int rc;
  assert_int_equal(ax_pipe_recompute_parse("sometimes", &rc), AX_EINVAL);
  assert_null(p);
}

int main(void) {
  static const char *const args[] = {"--threads", "4", NULL};
  if (mt_start("coord", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_options),
      cmocka_unit_test(test_oracle2_one_stage),
      cmocka_unit_test(test_oracle1_sync_equals_full_batch),
      cmocka_unit_test(test_oracle3_async),
      cmocka_unit_test(test_stage_events_every_mode),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
