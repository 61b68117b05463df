/* Freezing and re-packing (runtime/pipeline/state/freeze.h) with real agents:
 * an MLP of 5 blocks trained by gpipe on 4 agents (K = 4), then at step 3
 * blocks 0-1 frozen and the rest re-packed onto K = 2 with 2 replicas, at
 * step 6 blocks 0-3 frozen and block 4 re-packed onto K = 1 with 4
 * replicas, to step 12. Oracle: a single-process run of the same rule
 * (the whole batch, SGD with momentum; the frozen blocks' optimizer stops
 * at the freeze, the others' goes on): the trained blocks' parameters and
 * the evaluation loss through the frozen prefix equal it within relative
 * 1e-5 (negative control: the same run without the second freeze differs).
 * The AutoCache answers every example seen again since the last freeze.
 * Refusals: a freeze that does not add blocks or leaves none to train.
 * A checkpoint of a frozen pipeline resumes it to the bit. Zero live RRefs,
 * contexts and calls on every node. */
#include <stdlib.h>
#include <string.h>

#include "axon/models/loss.h"
#include "axon/models/optim.h"
#include "axon/runtime/pipeline/coord/train.h"
#include "axon/runtime/pipeline/state/checkpoint.h"
#include "axon/runtime/pipeline/state/freeze.h"
#include "tests/pipe_testutil.h"

#define NAGENTS 4
static const char *g_names[NAGENTS] = {"z1", "z2", "z3", "z4"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

#define MODEL_CFG "widths=24/32/28/20/16/10"
#define DATA_CFG "shape=24,classes=10,examples=64,seed=3"
#define OPTIM "opt=sgd,lr=0.05,momentum=0.9"
#define SEED 11
#define BATCH 16

/* ---- the single-process reference ---------------------------------------- */

typedef struct ref {
  ax_net *net;
  ax_optim *opt;
} ref;

/* Offset of block b's first parameter in the whole model. */
static size_t block_off(const ax_model_def *def, const ax_config *cfg, int b) {
  size_t off = 0;
  for (int i = 0; i < b; i++) {
    ax_module *m;
    size_t np, nb;
    AX_ASSERT_OK(def->build_block(cfg, i, &m));
    ax_module_layout(m, 0, 0, &np, &nb);
    ax_module_free(m);
    off += np;
  }
  return off;
}

/* One whole-batch SGD step; the first `frozen` parameters, and their
 * momentum, are put back afterwards: they do not train. */
static void ref_step(ref *r, pt_data *d, long t, size_t frozen) {
  ax_tlist in = {0}, lab = {0}, y = {0}, dl = {0}, din = {0};
  AX_ASSERT_OK(pt_batch(d, t, &in, &lab));
  ax_slot *slot = ax_slot_new();
  AX_ASSERT_OK(ax_net_forward(r->net, slot, 1, 0, &in, &y));
  ax_loss_result lr;
  AX_ASSERT_OK(ax_loss_xent(&y, &lab, -100, NULL, 1.0f, &lr, &dl));
  AX_ASSERT_OK(ax_net_zero_grad(r->net));
  AX_ASSERT_OK(ax_net_backward(r->net, slot, 0, 0, &dl, &din));
  float *keep = malloc(2 * frozen * sizeof(float) + 1);
  ax_tensor *mom = ax_optim_state(r->opt, 0);
  memcpy(keep, ax_f32(r->net->params), frozen * sizeof(float));
  if (t > 0)
    memcpy(keep + frozen, ax_f32(mom), frozen * sizeof(float));
  AX_ASSERT_OK(ax_optim_step(r->opt, r->net->params, r->net->grads));
  memcpy(ax_f32(r->net->params), keep, frozen * sizeof(float));
  if (t > 0)
    memcpy(ax_f32(mom), keep + frozen, frozen * sizeof(float));
  free(keep);
  ax_slot_free(slot);
  ax_tlist_clear(&in), ax_tlist_clear(&lab), ax_tlist_clear(&y);
  ax_tlist_clear(&dl), ax_tlist_clear(&din);
}

static double ref_eval(ref *r, pt_data *d, int nb) {
  double sum = 0;
  for (int t = 0; t < nb; t++) {
    ax_tlist in = {0}, lab = {0}, y = {0};
    AX_ASSERT_OK(pt_batch(d, t, &in, &lab));
    AX_ASSERT_OK(ax_net_forward(r->net, NULL, 0, 0, &in, &y));
    ax_loss_result lr;
    AX_ASSERT_OK(ax_loss_xent(&y, &lab, -100, NULL, 1.0f, &lr, NULL));
    sum += lr.loss;
    ax_tlist_clear(&in), ax_tlist_clear(&lab), ax_tlist_clear(&y);
  }
  return sum / nb;
}

/* Trains the reference: every block until step s1, blocks >= f1 until s2,
 * blocks >= f2 until `end`. */
static void ref_run(const ax_model_def *def, const ax_config *cfg, pt_data *d,
                    int f1, long s1, int f2, long s2, long end, ref *r) {
  AX_ASSERT_OK(ax_model_stage(def, cfg, 0, 5, AX_CPU, SEED, &r->net));
  ax_config oc;
  ax_optim_cfg ocfg;
  AX_ASSERT_OK(ax_config_parse(&oc, OPTIM));
  AX_ASSERT_OK(ax_optim_cfg_parse(&oc, &ocfg));
  r->opt = ax_optim_new(&ocfg, r->net->n_params, AX_CPU);
  for (long t = 0; t < end; t++)
    ref_step(r, d, t, t < s1 ? 0 : block_off(def, cfg, t < s2 ? f1 : f2));
  ax_optim_free(r->opt);
}

/* ---- the test ------------------------------------------------------------ */

static double worst_suffix(ax_pipe *p, const ax_model_def *def,
                           const ax_config *cfg, const ref *r, int f) {
  /* The pipeline's one stage (K = 1) holds blocks [f, 5). */
  ax_tensor *got, *buf;
  AX_ASSERT_OK(ax_pipe_stage_state(p, 0, &got, &buf));
  size_t off = block_off(def, cfg, f);
  int64_t n = (int64_t)(r->net->n_params - off);
  ax_tensor *want = ax_tensor_view(r->net->params, off, 1, &n);
  double w = pt_worst(got, want);
  ax_tensor_release(want);
  ax_tensor_release(got);
  ax_tensor_release(buf);
  return w;
}

static void run_case(int second_freeze, double *worst, double *eval_diff,
                     ax_freeze_stats *fs) {
  const ax_model_def *def = ax_model_find("mlp");
  ax_config mcfg, dcfg;
  AX_ASSERT_OK(ax_model_config(def, MODEL_CFG, &mcfg));
  AX_ASSERT_OK(ax_config_parse(&dcfg, DATA_CFG));
  pt_data d = {NULL, BATCH};
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &d.ds));
  ax_pipe_opts o = {"mlp", MODEL_CFG,     4,      g_names,
                    NULL,  AX_MODE_GPIPE, 2,      AX_RECOMPUTE_NEVER,
                    OPTIM, SEED,          AX_CPU, 30000};
  ax_pipe *p;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, 3, pt_batch, NULL, &d));
  ax_freeze_opts f1 = {2, 2, 0};
  AX_ASSERT_OK(ax_pipe_freeze(&p, &f1));
  ax_pipe_freeze_stats(p, fs);
  assert_int_equal(fs->blocks, 2);
  assert_int_equal(fs->K, 2);
  assert_int_equal(fs->replicas, 2);
  AX_ASSERT_OK(ax_pipe_train(p, 3, pt_batch, NULL, &d));
  ax_freeze_opts f2 = {4, 1, 0};
  if (second_freeze)
    AX_ASSERT_OK(ax_pipe_freeze(&p, &f2));
  else
    f2.blocks = 2;
  AX_ASSERT_OK(ax_pipe_train(p, 6, pt_batch, NULL, &d));
  ax_pipe_freeze_stats(p, fs);
  ref r;
  ref_run(def, &mcfg, &d, 2, 3, 4, 6, 12, &r);
  *worst = second_freeze ? worst_suffix(p, def, &mcfg, &r, 4) : 1.0;
  double acc, loss;
  AX_ASSERT_OK(ax_pipe_evaluate(p, 2, pt_batch, &d, &acc, &loss));
  double want = ref_eval(&r, &d, 2);
  *eval_diff = fabs(loss - want) / fabs(want);
  ax_net_free(r.net);
  ax_pipe_free(p);
  ax_dataset_close(d.ds);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_freeze_equals_reference(void **state) {
  double worst, ediff, worst_off, ediff_off;
  ax_freeze_stats fs, fs_off;
  run_case(1, &worst, &ediff, &fs);
  run_case(0, &worst_off, &ediff_off, &fs_off);
  fprintf(stderr,
          "  gpipe K=4 -> freeze 2 blocks, K=2 R=2 -> freeze 4, K=1 "
          "R=4: trained block's worst relative difference %.2g, evaluation "
          "loss %.2g (without the second freeze: %.2g); cache %ld hits, "
          "%ld misses, %lld bytes\n",
          worst, ediff, ediff_off, fs.hits, fs.misses,
          (long long)fs.cache_bytes);
  if (worst > 1e-5 || ediff > 1e-5)
    fail_msg("freeze: relative differences %.3g / %.3g > 1e-5", worst, ediff);
  assert_true(ediff_off > 1e-4);
  assert_int_equal(fs.blocks, 4);
  assert_int_equal(fs.K, 1);
  assert_int_equal(fs.replicas, 4);
  /* Since the second freeze: steps 6..11 are batches 2, 3, 0, 1, 2, 3 of
   * 4: the last two seen before. */
  assert_int_equal(fs.misses, 4 * BATCH);
  assert_int_equal(fs.hits, 2 * BATCH);
}

/* Checkpoint and resume of a frozen pipeline: 3 steps, a freeze (2
 * blocks, K = 2 x 2 replicas), 2 steps, a checkpoint (the stages' files
 * and the coordinator's prefix.axck), 2 steps; a new pipeline frozen the
 * same way, restored and trained 2 steps, ends with the same bits and the
 * same evaluation loss. A pipeline frozen otherwise (or not) is refused;
 * the checkpoint joins into the whole model. */
static void test_checkpoint(void **state) {
  ax_config dcfg;
  pt_data d = {NULL, BATCH};
  AX_ASSERT_OK(ax_config_parse(&dcfg, DATA_CFG));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &d.ds));
  ax_pipe_opts o = {"mlp", MODEL_CFG,     4,      g_names,
                    NULL,  AX_MODE_GPIPE, 2,      AX_RECOMPUTE_NEVER,
                    OPTIM, SEED,          AX_CPU, 30000};
  char root[] = "/tmp/axon_freeze_ckXXXXXX";
  assert_non_null(mkdtemp(root));
  ax_pipe *a, *b, *c;
  ax_freeze_opts f1 = {2, 2, 0};
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &a));
  AX_ASSERT_OK(ax_pipe_train(a, 3, pt_batch, NULL, &d));
  AX_ASSERT_OK(ax_pipe_freeze(&a, &f1));
  AX_ASSERT_OK(ax_pipe_train(a, 2, pt_batch, NULL, &d));
  ax_ckpt_info in;
  memset(&in, 0, sizeof in);
  in.step = 5;
  snprintf(in.model, sizeof in.model, "mlp");
  snprintf(in.model_config, sizeof in.model_config, MODEL_CFG);
  AX_ASSERT_OK(ax_pipe_checkpoint(a, root, &in, 2, 0));
  AX_ASSERT_OK(ax_pipe_train(a, 2, pt_batch, NULL, &d));
  ax_ckpt_info got;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &c)); /* not frozen: refused */
  assert_int_equal(ax_pipe_restore(c, root, &got), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "frozen"));
  ax_pipe_free(c);
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &b));
  AX_ASSERT_OK(ax_pipe_freeze(&b, &f1));
  AX_ASSERT_OK(ax_pipe_restore(b, root, &got));
  assert_int_equal(got.step, 5);
  AX_ASSERT_OK(ax_pipe_train(b, 2, pt_batch, NULL, &d));
  for (int s = 0; s < 2; s++) {
    ax_tensor *pa, *ba, *pb, *bb;
    AX_ASSERT_OK(ax_pipe_stage_state(a, s, &pa, &ba));
    AX_ASSERT_OK(ax_pipe_stage_state(b, s, &pb, &bb));
    assert_int_equal(ax_tensor_numel(pa), ax_tensor_numel(pb));
    if (memcmp(pa->data, pb->data, ax_tensor_nbytes(pa)))
      fail_msg("stage %d: the resumed frozen run differs", s);
    ax_tensor_release(pa), ax_tensor_release(ba);
    ax_tensor_release(pb), ax_tensor_release(bb);
  }
  double acc, la, lb;
  AX_ASSERT_OK(ax_pipe_evaluate(a, 2, pt_batch, &d, &acc, &la));
  AX_ASSERT_OK(ax_pipe_evaluate(b, 2, pt_batch, &d, &acc, &lb));
  assert_true(la == lb); /* the prefix came back too */
  ax_net *whole = NULL;
  AX_ASSERT_OK(ax_ckpt_load_net(root, AX_CPU, &whole, &got));
  const ax_model_def *def = ax_model_find("mlp");
  ax_config mcfg;
  AX_ASSERT_OK(ax_model_config(def, MODEL_CFG, &mcfg));
  assert_int_equal(whole->n_params, block_off(def, &mcfg, 5));
  ax_net_free(whole);
  fprintf(stderr,
          "  gpipe K=4 -> freeze 2, K=2 R=2: resumed from step 5, "
          "equal to the uninterrupted run (evaluation loss %.6f both)\n",
          la);
  ax_pipe_free(a);
  ax_pipe_free(b);
  ax_dataset_close(d.ds);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  assert_int_equal(system(cmd), 0);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_refusals(void **state) {
  ax_pipe_opts o = {"mlp", MODEL_CFG,     4,      g_names,
                    NULL,  AX_MODE_GPIPE, 2,      AX_RECOMPUTE_NEVER,
                    OPTIM, SEED,          AX_CPU, 30000};
  ax_pipe *p, *before;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  before = p;
  ax_freeze_opts bad[] = {{0, 0, 0}, {5, 0, 0}, {2, 5, 0}, {4, 2, 0}};
  for (int i = 0; i < 4; i++) { /* none, all, 5 agents, 2 stages/1 block */
    assert_int_equal(ax_pipe_freeze(&p, &bad[i]), AX_EINVAL);
    assert_ptr_equal(p, before);
  }
  ax_freeze_opts f = {1, 0, -1};
  AX_ASSERT_OK(ax_pipe_freeze(&p, &f));
  ax_freeze_stats fs;
  ax_pipe_freeze_stats(p, &fs);
  assert_int_equal(fs.K, 4); /* ceil(4 x 4 / 5) */
  assert_int_equal(fs.replicas, 1);
  assert_int_equal(ax_pipe_freeze(&p, &f), AX_EINVAL); /* not more */
  ax_freeze_point pts[4];
  int n;
  AX_ASSERT_OK(ax_freeze_schedule_parse("100:2,200:4:1", pts, 4, &n));
  assert_int_equal(n, 2);
  assert_int_equal(pts[1].step, 200);
  assert_int_equal(pts[1].blocks, 4);
  assert_int_equal(pts[1].K, 1);
  const char *bad_s[] = {"100", "100:2,50:3", "100:2,200:2", "1:1x", "0:1"};
  for (int i = 0; i < 5; i++)
    assert_int_equal(ax_freeze_schedule_parse(bad_s[i], pts, 4, &n), AX_EINVAL);
  ax_pipe_free(p);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

int main(void) {
  static const char *const args[] = {"--threads", "1", NULL};
  ax_cpu_set_threads(1);
  if (mt_start("zdrv", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_freeze_equals_reference),
      cmocka_unit_test(test_checkpoint),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
