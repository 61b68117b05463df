/* Pipeline oracles on ResNet20 and BERT with real agent processes:
 *  - ResNet20 (batch norm: micro-batch statistics, running statistics
 *    compared too): pipedream and ddg equal the weight-stashing reference,
 *    fr the replay reference, K = 2, 3, 4, 12 steps (small images, few
 *    examples);
 *  - a small BERT with dropout off: gpipe and 1f1b equal single-process
 *    full-batch SGD (two outputs, MLM labels of B * T rows with ignored
 *    positions, so the loss divisors must be the mini-batch's counts). */
#include <stdlib.h>
#include <string.h>

#define PT_FLOOR_RMS
#include "axon/kernels/clock.h"
#include "tests/pipe_testutil.h"

#define NAGENTS 4
static const char *g_names[NAGENTS] = {"m1", "m2", "m3", "m4"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

#define BERT_CFG "layers=2,hidden=16,heads=2,ff=32,vocab=50,seq=8,dropout=0"
#define BERT_B 8
#define BERT_T 8

/* A deterministic BERT mini-batch t: ids, segments, mask (the last two
 * positions of odd sequences padded); MLM labels (B * T) with most
 * positions ignored; NSP labels (B). */
static int bert_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  return ax_test_bert_batch(t, BERT_B, BERT_T, 2, in, lab);
}

typedef struct mcase {
  const char *model, *model_cfg, *optim;
  ax_pipe_batch_fn batch;
  void *data;
} mcase;

static void run_case(const mcase *c, int mode, int K, int M, int steps) {
  const ax_model_def *def = ax_model_find(c->model);
  ax_config mcfg;
  ax_model_info info;
  AX_ASSERT_OK(ax_model_config(def, c->model_cfg, &mcfg));
  AX_ASSERT_OK(def->describe(&mcfg, &info));
  int bounds[NAGENTS + 1];
  AX_ASSERT_OK(ax_split_uniform(info.n_blocks, K, bounds));
  ax_pipe_opts o = {
      c->model, c->model_cfg,       K,        g_names, bounds, mode,
      M,        AX_RECOMPUTE_NEVER, c->optim, 5,       AX_CPU, 30000};
  ax_pipe *p;
  double t0 = ax_clock_s();
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, steps, c->batch, NULL, c->data));
  double t1 = ax_clock_s();
  pt_check_events(p, mode, K, M, AX_RECOMPUTE_NEVER, steps);
  ax_tensor *want[NAGENTS], *wbuf[NAGENTS];
  pt_reference(def, &mcfg, bounds, K, ref_kind(mode), steps, c->batch, c->data,
               c->optim, 5, want, wbuf);
  double worst = pt_worst_stages(p, K, want, wbuf);
  fprintf(stderr,
          "  %s %-10s K=%d M=%d: %d steps in %.2f s, worst relative "
          "difference %.2g\n",
          c->model, ax_pipe_mode_name(mode), K, M, steps, t1 - t0, worst);
  if (worst > 1e-5)
    fail_msg("%s %s K=%d M=%d: relative difference %.3g", c->model,
             ax_pipe_mode_name(mode), K, M, worst);
  ax_pipe_free(p);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_resnet20_async(void **state) {
  ax_config dcfg;
  pt_data data = {NULL, 4};
  AX_ASSERT_OK(ax_config_parse(&dcfg, "shape=1/8/8,classes=10,examples=48,"
                                      "seed=4"));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
  mcase c = {"resnet20", "in_channels=1,image=8", "opt=sgd,lr=0.02", pt_batch,
             &data};
  for (int K = 2; K <= 4; K++) {
    run_case(&c, AX_MODE_PIPEDREAM, K, 1, 12);
    run_case(&c, AX_MODE_DDG, K, 1, 12);
    run_case(&c, AX_MODE_FR, K, 1, 12);
  }
  ax_dataset_close(data.ds);
}

static void test_bert_sync(void **state) {
  mcase c = {"bert", BERT_CFG, "opt=sgd,lr=0.05", bert_batch, NULL};
  run_case(&c, AX_MODE_GPIPE, 2, 1, 2); /* no micro-batches: exact */
  run_case(&c, AX_MODE_GPIPE, 2, 4, 2);
  run_case(&c, AX_MODE_1F1B, 4, 4, 2);
  run_case(&c, AX_MODE_GPIPE, 4, 8, 2);
  run_case(&c, AX_MODE_1F1B, 3, 2, 2);
}

int main(void) {
  static const char *const args[] = {"--threads", "4", NULL};
  ax_cpu_set_threads(1); /* the references: no OpenMP spinning under load */
  if (mt_start("coord", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bert_sync),
      cmocka_unit_test(test_resnet20_async),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
