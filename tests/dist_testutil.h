/* Helpers for the distributed-autograd oracles (test_dist_oracle.c,
 * test_cuda_pipeline.c): one single-process training step, the same step
 * through remote stage modules with distributed autograd and the
 * distributed optimizer, the comparison of a stage's flat buffer with its
 * slice of the reference, and the whole oracle. Header-only. */
#ifndef AX_DIST_TESTUTIL_H
#define AX_DIST_TESTUTIL_H

#include <math.h>

#include "axon/kernels/clock.h"
#include "axon/models/data/dataset.h"
#include "axon/models/loss.h"
#include "axon/models/model.h"
#include "axon/models/optim.h"
#include "axon/runtime/autograd/stage.h"
#include "harness.h"
#include "tests/mp_testutil.h"

#define DT_MAX_STAGES 8

/* One single-process step of the whole model (info's;
 * runtime/pipeline/coord/train_local.c's recipe, tied copies summed). */
static inline void dt_local_step(ax_net *net, ax_optim *opt, const ax_tlist *in,
                                 const ax_tlist *lab, const ax_model_info *info,
                                 uint64_t seed) {
  ax_slot *slot = ax_slot_new();
  ax_tlist out = {0}, dout = {0}, din = {0};
  ax_loss_result r;
  AX_ASSERT_OK(ax_net_zero_grad(net));
  AX_ASSERT_OK(ax_net_forward(net, slot, 1, seed, in, &out));
  AX_ASSERT_OK(
      ax_loss_xent(&out, lab, info->ignore_index, NULL, 1.0f, &r, &dout));
  AX_ASSERT_OK(ax_net_backward(net, slot, seed, 0, &dout, &din));
  int whole[2] = {0, info->n_blocks};
  AX_ASSERT_OK(ax_model_tie_grads(info, 1, whole, &net, NULL));
  AX_ASSERT_OK(ax_optim_step(opt, net->params, net->grads));
  ax_tlist_clear(&out);
  ax_tlist_clear(&dout);
  ax_tlist_clear(&din);
  ax_slot_free(slot);
}

/* One distributed step over K stages: stage k's forward gets stage k-1's
 * output RRef (fetched stage to stage), the last one the labels; backward
 * from the loss, one optimizer step, context released. */
static inline void dt_dist_step(ax_node *drv, ax_rref **stages, int K,
                                ax_dist_optim *opt, const ax_tlist *in,
                                const ax_tlist *lab, uint64_t seed) {
  uint64_t ctx;
  assert_true(K >= 1 && K <= DT_MAX_STAGES);
  AX_ASSERT_OK(ax_dist_context_new(drv, &ctx));
  ax_rref *y[DT_MAX_STAGES] = {0};
  for (int k = 0; k < K; k++) {
    ax_values *a = ax_values_new();
    ax_values_add_i64(a, (int64_t)seed);
    ax_values_add_i64(a, k == K - 1 ? lab->n : 0);
    if (k == 0)
      for (int i = 0; i < in->n; i++)
        ax_values_add_tensor(a, in->t[i]);
    else
      ax_values_add_rref(a, y[k - 1]);
    if (k == K - 1)
      for (int i = 0; i < lab->n; i++)
        ax_values_add_tensor(a, lab->t[i]);
    AX_ASSERT_OK(ax_rmod_forward_remote(drv, stages[k], a, &y[k]));
    ax_values_free(a);
  }
  AX_ASSERT_OK(ax_dist_backward_rrefs(drv, ctx, &y[K - 1], 1, 60000));
  AX_ASSERT_OK(ax_dist_optim_step(opt, ctx, 60000));
  AX_ASSERT_OK(ax_dist_context_release(drv, ctx, 10000));
  for (int k = 0; k < K; k++)
    ax_rref_release(y[k]);
}

/* A tiny BERT (dropout off) and its deterministic mini-batch t: ids,
 * segments, mask (the last two positions of odd sequences padded); MLM
 * labels (B * T) with most positions ignored; NSP labels (B). */
#define DT_BERT_CFG "layers=2,hidden=16,heads=2,ff=32,vocab=50,seq=8,dropout=0"
#define DT_BERT_B 8
#define DT_BERT_T 8
static inline int dt_bert_batch(void *user, long t, ax_tlist *in,
                                ax_tlist *lab) {
  return ax_test_bert_batch(t, DT_BERT_B, DT_BERT_T, 2, in, lab);
}

/* Fails unless every element of got (a CPU tensor of n floats) is within
 * rtol of want, relative to floor + |want|: floor is 1e-6 or, when
 * PT_FLOOR_RMS is defined (as for pipe_testutil.h's pt_worst), 1e-2 times
 * the root mean square of want. */
static inline void dt_compare(const ax_tensor *got, const float *want, size_t n,
                              double rtol, const char *what, int stage) {
  assert_int_equal(ax_tensor_numel(got), n);
  double worst = 0.0, floor = 1e-6;
#ifdef PT_FLOOR_RMS
  double ss = 0;
  for (size_t i = 0; i < n; i++)
    ss += (double)want[i] * want[i];
  floor = n ? 1e-2 * sqrt(ss / (double)n) : floor;
#endif
  for (size_t i = 0; i < n; i++) {
    double a = ax_f32(got)[i], b = want[i];
    double d = fabs(a - b) / (floor + fabs(b));
    if (d > worst || isnan(d))
      worst = isnan(d) ? INFINITY : d;
  }
  if (worst > rtol)
    fail_msg("stage %d %s: relative difference %.3g > %.3g", stage, what, worst,
             rtol);
}

/* The distributed step of an oracle (dt_dist_step's arguments plus the
 * configuration's user pointer) and its single-process counterpart. */
typedef void (*dt_dist_step_fn)(ax_node *drv, ax_rref **stages, int K,
                                ax_dist_optim *opt, const ax_tlist *in,
                                const ax_tlist *lab, uint64_t seed, void *user);
typedef void (*dt_local_step_fn)(ax_net *net, ax_optim *opt, const ax_tlist *in,
                                 const ax_tlist *lab, int ignore, uint64_t seed,
                                 void *user);

typedef struct dt_oracle_cfg {
  const char *model, *kind, *model_cfg, *data_cfg, *optim;
  int steps, batch;
  double rtol;
  /* Optional: mini-batch t (NULL: the synthetic data set of data_cfg,
   * batches of `batch`). */
  int (*batch_fn)(void *user, long t, ax_tlist *in, ax_tlist *lab);
  dt_dist_step_fn dist_step;   /* NULL: dt_dist_step */
  dt_local_step_fn local_step; /* NULL: dt_local_step */
  void *user;                  /* passed to the three above */
} dt_oracle_cfg;

/* The oracle: the model split uniformly into K stages of kind c->kind on
 * agents names[k], on devices devs[k] (NULL: all on the CPU), trained for
 * c->steps with distributed autograd and the distributed optimizer, ends
 * within c->rtol of single-process CPU training on the same batches; then
 * every node is back to zero live RRefs, contexts, calls and futures. */
static inline void dt_run_oracle(ax_node *drv, const char *const *names, int K,
                                 const ax_device *devs,
                                 const dt_oracle_cfg *c) {
  const ax_model_def *def = ax_model_find(c->model);
  assert_non_null(def);
  assert_true(K >= 1 && K <= DT_MAX_STAGES);
  ax_config mcfg, dcfg;
  ax_model_info info;
  AX_ASSERT_OK(ax_model_config(def, c->model_cfg, &mcfg));
  AX_ASSERT_OK(ax_model_describe(def, &mcfg, &info));
  int bounds[DT_MAX_STAGES + 1];
  AX_ASSERT_OK(ax_split_uniform(info.n_blocks, K, bounds));
  char splits[128];
  size_t sl = 0;
  for (int k = 0; k <= K; k++)
    sl += (size_t)snprintf(splits + sl, sizeof splits - sl, "%s%d",
                           k ? "/" : "", bounds[k]);
  /* The stages on the agents. */
  ax_rref *stages[DT_MAX_STAGES], *params[DT_MAX_STAGES];
  for (int k = 0; k < K; k++) {
    char cfg[512];
    snprintf(cfg, sizeof cfg, "stage=%d,splits=%s,seed=3%s%s", k, splits,
             c->model_cfg ? "," : "", c->model_cfg ? c->model_cfg : "");
    AX_ASSERT_OK(ax_remote_module(drv, names[k], c->kind, cfg,
                                  devs ? devs[k] : AX_CPU, &stages[k]));
  }
  for (int k = 0; k < K; k++)
    AX_ASSERT_OK(ax_rmod_parameters(drv, stages[k], &params[k]));
  ax_dist_optim *dopt;
  AX_ASSERT_OK(ax_dist_optim_new(drv, params, K, c->optim, &dopt));
  /* The single-process reference. */
  ax_net *ref;
  AX_ASSERT_OK(ax_model_stage(def, &mcfg, 0, info.n_blocks, AX_CPU, 3, &ref));
  ax_config ocfg;
  ax_optim_cfg oc;
  AX_ASSERT_OK(ax_config_parse(&ocfg, c->optim));
  AX_ASSERT_OK(ax_optim_cfg_parse(&ocfg, &oc));
  ax_optim *lopt = ax_optim_new(&oc, ref->n_params, AX_CPU);
  /* The same batches for both. */
  ax_dataset *ds = NULL;
  ax_loader *ld = NULL;
  if (!c->batch_fn) {
    AX_ASSERT_OK(ax_config_parse(&dcfg, c->data_cfg));
    AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &ds));
    AX_ASSERT_OK(ax_loader_new(ds, c->batch, 1, 1, 5, &ld));
    ax_loader_start(ld, 0);
  }
  double t_local = 0, t_dist = 0;
  for (int s = 0; s < c->steps; s++) {
    ax_tlist in = {0}, lab = {0};
    if (c->batch_fn)
      AX_ASSERT_OK(c->batch_fn(c->user, s, &in, &lab));
    else
      AX_ASSERT_OK(ax_loader_next(ld, &in, &lab));
    uint64_t seed = 1000 + (uint64_t)s;
    double t0 = ax_clock_s();
    if (c->local_step)
      c->local_step(ref, lopt, &in, &lab, info.ignore_index, seed, c->user);
    else
      dt_local_step(ref, lopt, &in, &lab, &info, seed);
    double t1 = ax_clock_s();
    if (c->dist_step)
      c->dist_step(drv, stages, K, dopt, &in, &lab, seed, c->user);
    else
      dt_dist_step(drv, stages, K, dopt, &in, &lab, seed);
    t_dist += ax_clock_s() - t1;
    t_local += t1 - t0;
    ax_tlist_clear(&in);
    ax_tlist_clear(&lab);
  }
  fprintf(stderr,
          "[bench] %s %d stages: %.2f ms/step distributed, %.2f "
          "ms/step one process (batch %d, %d steps)\n",
          c->model, K, 1e3 * t_dist / c->steps, 1e3 * t_local / c->steps,
          c->batch, c->steps);
  /* Compare each stage's slice of the flat buffers. */
  size_t poff = 0, boff = 0;
  for (int k = 0; k < K; k++) {
    ax_tensor *p = NULL, *b = NULL;
    AX_ASSERT_OK(ax_rmod_state_save(drv, stages[k], &p, &b));
    dt_compare(p, ax_f32(ref->params) + poff, ax_tensor_numel(p), c->rtol,
               "parameters", k);
    poff += ax_tensor_numel(p);
    if (b) {
      dt_compare(b, ax_f32(ref->buffers) + boff, ax_tensor_numel(b), c->rtol,
                 "buffers", k);
      boff += ax_tensor_numel(b);
    }
    ax_tensor_release(p);
    ax_tensor_release(b);
  }
  assert_int_equal(poff, ref->n_params);
  assert_int_equal(boff, ref->n_buffers);
  if (ld)
    ax_loader_free(ld);
  if (ds)
    ax_dataset_close(ds);
  ax_optim_free(lopt);
  ax_net_free(ref);
  ax_dist_optim_free(dopt);
  for (int k = 0; k < K; k++) {
    ax_rref_release(params[k]);
    ax_rref_release(stages[k]);
  }
  AX_ASSERT_OK(dt_all_zero(drv, names, K));
}

#endif
