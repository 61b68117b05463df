/* Gradient sums that do not depend on the layout (ax_pipe_opts.sum_order:
 * AX_SUM_TREE, the default; kernels/sum_tree.h), with 4 real agent
 * processes on loopback. At a fixed number of micro-batches R M per
 * mini-batch (same batch, same micro-batch size), R replicas of M
 * micro-batches each train to the same bits for R = 1, 2, 4 (the
 * parameters, in every replica, and every step's reported loss):
 *  - an MLP, SGD with momentum: gpipe with one stage (R = 1, 2, 4), 1f1b
 *    with two (R = 1, 2), and ZeRO over R = 2 replicas;
 *  - BERT tiny with dropout 0, AdamW (most MLM positions are ignored, so
 *    the loss divisor must be the whole mini-batch's label count), R = 1,
 *    2, 4;
 *  - a resume that changes R: 3 steps at R = 1, M = 4, a checkpoint, 3
 *    more at R = 2, M = 2, equal the uninterrupted 6 steps at R = 1;
 *  - negative control: in the chain order (micro-batches left to right,
 *    ring all-reduce) R = 4 differs from R = 1, so the test sees the
 *    order and the equalities are the tree's doing.
 * Every replica holds the same bits; zero live RRefs, contexts and calls
 * on every node afterwards. */
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/pipeline/state/checkpoint.h"
#include "tests/pipe_testutil.h"

#define NAGENTS 4
static const char *g_names[NAGENTS] = {"s1", "s2", "s3", "s4"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

#define MLP_CFG "widths=48/40/32/24/10"
#define DATA_CFG "shape=48,classes=10,examples=256,seed=7"
#define SGD "opt=sgd,lr=0.05,momentum=0.9"
#define BERT_CFG "layers=2,hidden=32,heads=2,ff=64,vocab=50,seq=16,dropout=0"
#define ADAMW "opt=adamw,lr=1e-3"
#define SEED 3

static int bert_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  (void)user;
  return ax_test_bert_batch(t, 8, 16, 3, in, lab);
}

/* One training setting: the model and its data. */
typedef struct setting {
  const char *model, *cfg, *optim;
  ax_pipe_batch_fn batch;
  void *data;
} setting;

static int same_bits(const ax_tensor *a, const ax_tensor *b) {
  return ax_tensor_numel(a) == ax_tensor_numel(b) &&
         !memcmp(a->data, b->data, ax_tensor_nbytes(a));
}

static ax_pipe *new_pipe(const setting *st, int mode, int K, int R, int M,
                         int order, int zero) {
  ax_pipe_opts o = {st->model,          st->cfg,   K,    g_names, NULL, mode, M,
                    AX_RECOMPUTE_NEVER, st->optim, SEED, AX_CPU,  30000};
  o.replicas = R;
  o.zero = zero;
  o.sum_order = order;
  ax_pipe *p = NULL;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  return p;
}

/* Replica 0's stage parameters into out[], after checking that every other
 * replica holds the same bits; frees p. */
static void take_params(ax_pipe *p, int K, int R, ax_tensor **out) {
  for (int s = 0; s < K; s++) {
    ax_tensor *bufs;
    AX_ASSERT_OK(ax_pipe_stage_state(p, s, &out[s], &bufs));
    ax_tensor_release(bufs);
    for (int r = 1; r < R; r++) {
      ax_tensor *q, *qb;
      AX_ASSERT_OK(ax_pipe_stage_state(ax_pipe_replica(p, r), s, &q, &qb));
      if (!same_bits(out[s], q))
        fail_msg("replica %d's stage %d differs from replica 0's", r, s);
      ax_tensor_release(q);
      ax_tensor_release(qb);
    }
  }
  ax_pipe_free(p);
}

/* A setting's batches, and the loss of each step as reported. */
#define MAX_STEPS 8
typedef struct feed {
  const setting *st;
  double loss[MAX_STEPS];
} feed;

static int feed_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  feed *f = user;
  return f->st->batch(f->st->data, t, in, lab);
}

static void feed_step(void *user, const ax_pipe_step_info *si) {
  feed *f = user;
  if (si->batch >= 0 && si->batch < MAX_STEPS)
    f->loss[si->batch] = si->loss;
}

/* Trains `steps` (<= MAX_STEPS) mini-batches: the parameters into out[],
 * the step losses into loss[]. */
static void train_params(const setting *st, int mode, int K, int R, int M,
                         int order, int zero, int steps, ax_tensor **out,
                         double *loss) {
  ax_pipe *p = new_pipe(st, mode, K, R, M, order, zero);
  feed f = {st, {0}};
  AX_ASSERT_OK(ax_pipe_train(p, steps, feed_batch, feed_step, &f));
  take_params(p, K, R, out);
  memcpy(loss, f.loss, sizeof f.loss);
}

/* Whether the K stages of a and b hold the same bits; releases both. */
static int equal_release(ax_tensor **a, ax_tensor **b, int K) {
  int same = 1;
  for (int s = 0; s < K; s++) {
    same &= same_bits(a[s], b[s]);
    ax_tensor_release(a[s]);
    ax_tensor_release(b[s]);
  }
  return same;
}

/* R M = 4 micro-batches per mini-batch: R = 1 (M = 4) against every other
 * R of `rs` (up to 4 / K replicas of K agents), to the bit: the
 * parameters and every step's loss. */
static void check_layouts(const setting *st, int mode, int K, const int *rs,
                          int nr, int zero, int steps) {
  ax_tensor *ref[NAGENTS];
  double ref_loss[MAX_STEPS], loss[MAX_STEPS];
  train_params(st, mode, K, 1, 4, AX_SUM_TREE, 0, steps, ref, ref_loss);
  for (int i = 0; i < nr; i++) {
    ax_tensor *got[NAGENTS], *keep[NAGENTS];
    train_params(st, mode, K, rs[i], 4 / rs[i], AX_SUM_TREE, zero, steps, got,
                 loss);
    for (int s = 0; s < K; s++)
      keep[s] = ax_tensor_retain(ref[s]);
    int same = equal_release(keep, got, K) &&
               !memcmp(loss, ref_loss, sizeof loss) && loss[steps - 1] > 0;
    fprintf(stderr,
            "  %s %-5s K=%d: R=%d M=%d%s against R=1 M=4, %d steps: "
            "parameters and losses %s\n",
            st->model, ax_pipe_mode_name(mode), K, rs[i], 4 / rs[i],
            zero ? " zero" : "", steps, same ? "same bits" : "DIFFERENT");
    if (!same)
      fail_msg("%s R=%d: parameters differ from R=1", st->model, rs[i]);
  }
  for (int s = 0; s < K; s++)
    ax_tensor_release(ref[s]);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_mlp_any_replicas(void **state) {
  (void)state;
  ax_config dcfg;
  pt_data data = {NULL, 16};
  AX_ASSERT_OK(ax_config_parse(&dcfg, DATA_CFG));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
  setting st = {"mlp", MLP_CFG, SGD, pt_batch, &data};
  static const int r124[] = {2, 4}, r12[] = {2};
  check_layouts(&st, AX_MODE_GPIPE, 1, r124, 2, 0, 4);
  check_layouts(&st, AX_MODE_1F1B, 2, r12, 1, 0, 4);
  check_layouts(&st, AX_MODE_GPIPE, 1, r12, 1, 1, 4); /* ZeRO */
  ax_dataset_close(data.ds);
}

static void test_bert_any_replicas(void **state) {
  (void)state;
  setting st = {"bert", BERT_CFG, ADAMW, bert_batch, NULL};
  static const int r124[] = {2, 4};
  check_layouts(&st, AX_MODE_GPIPE, 1, r124, 2, 0, 3);
}

/* 3 steps at R = 1, M = 4, a checkpoint, 3 more at R = 2, M = 2 (1f1b, K =
 * 2): the bits of 6 steps at R = 1. */
static void test_resume_other_replicas(void **state) {
  (void)state;
  char root[] = "/tmp/axon_sumtree_XXXXXX";
  assert_non_null(mkdtemp(root));
  ax_config dcfg;
  pt_data data = {NULL, 16};
  AX_ASSERT_OK(ax_config_parse(&dcfg, DATA_CFG));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
  setting st = {"mlp", MLP_CFG, SGD, pt_batch, &data};
  ax_pipe *a = new_pipe(&st, AX_MODE_1F1B, 2, 1, 4, AX_SUM_TREE, 0);
  AX_ASSERT_OK(ax_pipe_train(a, 3, pt_batch, NULL, &data));
  ax_ckpt_info in;
  memset(&in, 0, sizeof in);
  in.step = 3;
  in.seed = SEED;
  snprintf(in.model, sizeof in.model, "mlp");
  snprintf(in.config, sizeof in.config, "sumtree");
  AX_ASSERT_OK(ax_pipe_checkpoint(a, root, &in, 2, 0));
  AX_ASSERT_OK(ax_pipe_train(a, 3, pt_batch, NULL, &data));
  ax_tensor *whole[2], *resumed[2];
  take_params(a, 2, 1, whole);
  ax_pipe *b = new_pipe(&st, AX_MODE_1F1B, 2, 2, 2, AX_SUM_TREE, 0);
  ax_ckpt_info got;
  AX_ASSERT_OK(ax_pipe_restore(b, root, &got));
  assert_int_equal(got.step, 3);
  AX_ASSERT_OK(ax_pipe_train(b, 3, pt_batch, NULL, &data));
  take_params(b, 2, 2, resumed);
  int same = equal_release(whole, resumed, 2);
  fprintf(stderr,
          "  mlp 1f1b K=2: R=1 M=4 to step 3, then R=2 M=2 to step 6: %s\n",
          same ? "same bits as R=1 throughout" : "DIFFERENT");
  assert_true(same);
  ax_dataset_close(data.ds);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  assert_int_equal(system(cmd), 0);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

/* The chain (micro-batches in order, replicas' means averaged by the
 * ring) at R = 4, M = 1 against R = 1, M = 4: the sums' order differs,
 * and so must the bits. */
static void test_chain_depends_on_layout(void **state) {
  (void)state;
  ax_config dcfg;
  pt_data data = {NULL, 16};
  AX_ASSERT_OK(ax_config_parse(&dcfg, DATA_CFG));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
  setting st = {"mlp", MLP_CFG, SGD, pt_batch, &data};
  ax_tensor *one[1], *four[1];
  double loss[MAX_STEPS];
  train_params(&st, AX_MODE_GPIPE, 1, 1, 4, AX_SUM_CHAIN, 0, 4, one, loss);
  train_params(&st, AX_MODE_GPIPE, 1, 4, 1, AX_SUM_CHAIN, 0, 4, four, loss);
  int same = equal_release(one, four, 1);
  fprintf(stderr, "  mlp gpipe K=1 chain: R=4 M=1 against R=1 M=4: %s\n",
          same ? "same bits" : "different bits (as expected)");
  assert_false(same);
  ax_dataset_close(data.ds);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

int main(void) {
  static const char *const args[] = {"--threads", "4", NULL};
  if (mt_start("stcoord", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mlp_any_replicas),
      cmocka_unit_test(test_bert_any_replicas),
      cmocka_unit_test(test_resume_other_replicas),
      cmocka_unit_test(test_chain_depends_on_layout),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
