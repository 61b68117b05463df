/* The distributed-autograd oracle: a model split into 3 stages on 3 agent
 * processes, trained with distributed autograd and the distributed
 * optimizer (activations pass stage to stage as RRefs, the driver sends
 * only inputs, labels and control), ends with the same parameters (and
 * batch-norm running statistics) as single-process training of the same
 * model, seed and batches. MLP for 20 steps, ResNet20 for a few steps.
 * Also reports the time per step of both (AXON_BENCH=1 prints more). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "models/data/dataset.h"
#include "models/loss.h"
#include "models/model.h"
#include "runtime/optim.h"
#include "runtime/pipeline/train.h"
#include "tests/mp_testutil.h"

#define NAGENTS 3
static const char *g_names[NAGENTS] = {"w1", "w2", "w3"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

typedef struct oracle_cfg {
  const char *model, *kind, *model_cfg, *data_cfg, *optim;
  int steps, batch;
  double rtol;
} oracle_cfg;

/* One single-process step (runtime/pipeline/train_local.c's recipe). */
static void local_step(ax_net *net, ax_optim *opt, const ax_tlist *in,
                       const ax_tlist *lab, int ignore, uint64_t seed) {
  ax_slot *slot = ax_slot_new();
  ax_tlist out = {0}, dout = {0}, din = {0};
  ax_loss_result r;
  AX_ASSERT_OK(ax_net_zero_grad(net));
  AX_ASSERT_OK(ax_net_forward(net, slot, 1, seed, in, &out));
  AX_ASSERT_OK(ax_loss_xent(&out, lab, ignore, NULL, 1.0f, &r, &dout));
  AX_ASSERT_OK(ax_net_backward(net, slot, seed, 0, &dout, &din));
  AX_ASSERT_OK(ax_optim_step(opt, net->params, net->grads));
  ax_tlist_clear(&out);
  ax_tlist_clear(&dout);
  ax_tlist_clear(&din);
  ax_slot_free(slot);
}

/* One distributed step: stage k's forward gets stage k-1's output RRef. */
static void dist_step(ax_rref **stages, ax_dist_optim *opt, const ax_tlist *in,
                      const ax_tlist *lab, uint64_t seed) {
  uint64_t ctx;
  AX_ASSERT_OK(ax_dist_context_new(g_drv, &ctx));
  ax_rref *y[NAGENTS] = {0};
  for (int k = 0; k < NAGENTS; k++) {
    ax_values *a = ax_values_new();
    ax_values_add_i64(a, (int64_t)seed);
    ax_values_add_i64(a, k == NAGENTS - 1 ? lab->n : 0);
    if (k == 0)
      for (int i = 0; i < in->n; i++)
        ax_values_add_tensor(a, in->t[i]);
    else
      ax_values_add_rref(a, y[k - 1]);
    if (k == NAGENTS - 1)
      for (int i = 0; i < lab->n; i++)
        ax_values_add_tensor(a, lab->t[i]);
    AX_ASSERT_OK(ax_rmod_forward_remote(g_drv, stages[k], a, &y[k]));
    ax_values_free(a);
  }
  AX_ASSERT_OK(ax_dist_backward_rrefs(g_drv, ctx, &y[NAGENTS - 1], 1, 60000));
  AX_ASSERT_OK(ax_dist_optim_step(opt, ctx, 60000));
  AX_ASSERT_OK(ax_dist_context_release(g_drv, ctx, 10000));
  for (int k = 0; k < NAGENTS; k++)
    ax_rref_release(y[k]);
}

static void compare(const ax_tensor *got, const float *want, size_t n,
                    double rtol, const char *what, int stage) {
  assert_int_equal(ax_tensor_numel(got), n);
  double worst = 0.0;
  for (size_t i = 0; i < n; i++) {
    double a = ax_f32(got)[i], b = want[i];
    double d = fabs(a - b) / (1e-6 + fabs(b));
    if (d > worst)
      worst = d;
  }
  if (worst > rtol)
    fail_msg("stage %d %s: relative difference %.3g > %.3g", stage, what,
             worst, rtol);
}

static void run_oracle(const oracle_cfg *c) {
  const ax_model_def *def = ax_model_find(c->model);
  assert_non_null(def);
  ax_config mcfg, dcfg;
  ax_model_info info;
  AX_ASSERT_OK(ax_model_config(def, c->model_cfg, &mcfg));
  AX_ASSERT_OK(def->describe(&mcfg, &info));
  int bounds[NAGENTS + 1];
  AX_ASSERT_OK(ax_split_uniform(info.n_blocks, NAGENTS, bounds));
  /* The stages on the agents. */
  ax_rref *stages[NAGENTS], *params[NAGENTS];
  for (int k = 0; k < NAGENTS; k++) {
    char cfg[512];
    snprintf(cfg, sizeof cfg, "stage=%d,splits=%d/%d/%d/%d,seed=3%s%s", k,
             bounds[0], bounds[1], bounds[2], bounds[3],
             c->model_cfg ? "," : "", c->model_cfg ? c->model_cfg : "");
    AX_ASSERT_OK(ax_remote_module(g_drv, g_names[k], c->kind, cfg, AX_CPU,
                                  &stages[k]));
  }
  for (int k = 0; k < NAGENTS; k++)
    AX_ASSERT_OK(ax_rmod_parameters(g_drv, stages[k], &params[k]));
  ax_dist_optim *dopt;
  AX_ASSERT_OK(ax_dist_optim_new(g_drv, params, NAGENTS, c->optim, &dopt));
  /* The single-process reference. */
  ax_net *ref;
  AX_ASSERT_OK(ax_model_stage(def, &mcfg, 0, info.n_blocks, AX_CPU, 3, &ref));
  ax_config ocfg;
  ax_optim_cfg oc;
  AX_ASSERT_OK(ax_config_parse(&ocfg, c->optim));
  AX_ASSERT_OK(ax_optim_cfg_parse(&ocfg, &oc));
  ax_optim *lopt = ax_optim_new(&oc, ref->n_params, AX_CPU);
  /* The same batches for both. */
  ax_dataset *ds;
  ax_loader *ld;
  AX_ASSERT_OK(ax_config_parse(&dcfg, c->data_cfg));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &ds));
  AX_ASSERT_OK(ax_loader_new(ds, c->batch, 1, 1, 5, &ld));
  ax_loader_start(ld, 0);
  double t_local = 0, t_dist = 0;
  for (int s = 0; s < c->steps; s++) {
    ax_tlist in = {0}, lab = {0};
    AX_ASSERT_OK(ax_loader_next(ld, &in, &lab));
    uint64_t seed = 1000 + (uint64_t)s;
    double t0 = ax_now();
    local_step(ref, lopt, &in, &lab, info.ignore_index, seed);
    double t1 = ax_now();
    dist_step(stages, dopt, &in, &lab, seed);
    t_dist += ax_now() - t1;
    t_local += t1 - t0;
    ax_tlist_clear(&in);
    ax_tlist_clear(&lab);
  }
  fprintf(stderr, "[bench] %s 3 stages: %.2f ms/step distributed, %.2f ms/step "
          "one process (batch %d, %d steps)\n", c->model,
          1e3 * t_dist / c->steps, 1e3 * t_local / c->steps, c->batch,
          c->steps);
  /* Compare each stage's slice of the flat buffers. */
  size_t poff = 0, boff = 0;
  for (int k = 0; k < NAGENTS; k++) {
    ax_tensor *p = NULL, *b = NULL;
    AX_ASSERT_OK(ax_rmod_state_save(g_drv, stages[k], &p, &b));
    compare(p, ax_f32(ref->params) + poff, ax_tensor_numel(p), c->rtol,
            "parameters", k);
    poff += ax_tensor_numel(p);
    if (b) {
      compare(b, ax_f32(ref->buffers) + boff, ax_tensor_numel(b), c->rtol,
              "buffers", k);
      boff += ax_tensor_numel(b);
    }
    ax_tensor_release(p);
    ax_tensor_release(b);
  }
  assert_int_equal(poff, ref->n_params);
  assert_int_equal(boff, ref->n_buffers);
  ax_loader_free(ld);
  ax_dataset_close(ds);
  ax_optim_free(lopt);
  ax_net_free(ref);
  ax_dist_optim_free(dopt);
  for (int k = 0; k < NAGENTS; k++) {
    ax_rref_release(params[k]);
    ax_rref_release(stages[k]);
  }
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_mlp_oracle(void **state) {
  oracle_cfg c = {"mlp", "mlp.stage", "widths=784/64/32/10",
                  "shape=1/28/28,classes=10,examples=640,seed=9",
                  "opt=sgd,lr=0.05,momentum=0.9", 20, 32, 1e-5};
  run_oracle(&c);
}

static void test_resnet20_oracle(void **state) {
  oracle_cfg c = {"resnet20", "resnet20.stage", "in_channels=1,image=16",
                  "shape=1/16/16,classes=10,examples=64,seed=4",
                  "opt=adamw,lr=1e-3", 3, 8, 1e-5};
  run_oracle(&c);
}

int main(void) {
  static const char *const args[] = {"--threads", "2", NULL};
  if (mt_start("driver", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mlp_oracle),
      cmocka_unit_test(test_resnet20_oracle),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
