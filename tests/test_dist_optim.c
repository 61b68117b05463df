/* The distributed optimizer against single-process references
 * (models/optim.h on one ax_net holding the whole model), with the stages
 * on real agent processes:
 *  - SGD with momentum and weight decay, Nesterov SGD and AdamW, 20 steps,
 *    on the MLP and on a tiny BERT, each split into 3 stages;
 *  - 70 parameter sets (more than 64) of tiny stages on 2 agents, every one
 *    initialised and stepped;
 *  - a parameter set without gradient in a context is not stepped: its
 *    parameters stay bit for bit, and its optimizer state too (the next
 *    step equals a reference that skipped that step), for SGD with
 *    momentum and weight decay and for AdamW;
 *  - bad arguments are refused with a clear error.
 * Every node ends with zero live RRefs, contexts and calls. */
#include <string.h>

#include "harness.h"
#include "tests/dist_testutil.h"
#include "tests/mp_testutil.h"

#define NAGENTS 3
static const char *g_names[NAGENTS] = {"w1", "w2", "w3"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

static const char *const g_optims[] = {
    "opt=sgd,lr=0.05,momentum=0.9,wd=0.01",
    "opt=sgd,lr=0.05,momentum=0.9,nesterov=1,wd=0.001",
    "opt=adamw,lr=1e-3,wd=0.01",
};
#define NOPTIMS (int)(sizeof g_optims / sizeof g_optims[0])

/* ---- 20 steps, MLP and BERT ----------------------------------------- */
static void test_mlp_optimizers(void **state) {
  for (int i = 0; i < NOPTIMS; i++) {
    fprintf(stderr, "  mlp, %s\n", g_optims[i]);
    dt_oracle_cfg c = {.model = "mlp",
                       .kind = "mlp.stage",
                       .model_cfg = "widths=784/64/32/10",
                       .data_cfg = "shape=1/28/28,classes=10,examples=640,"
                                   "seed=9",
                       .optim = g_optims[i],
                       .steps = 20,
                       .batch = 32,
                       .rtol = 1e-5};
    dt_run_oracle(g_drv, g_names, NAGENTS, NULL, &c);
  }
}

static void test_bert_optimizers(void **state) {
  for (int i = 0; i < NOPTIMS; i++) {
    fprintf(stderr, "  bert, %s\n", g_optims[i]);
    dt_oracle_cfg c = {.model = "bert",
                       .kind = "bert.stage",
                       .model_cfg = DT_BERT_CFG,
                       .optim = g_optims[i],
                       .steps = 20,
                       .batch = DT_BERT_B,
                       .rtol = 1e-5,
                       .batch_fn = dt_bert_batch};
    dt_run_oracle(g_drv, g_names, NAGENTS, NULL, &c);
  }
}

/* ---- independent tiny models ----------------------------------------- */
#define TINY_CFG "widths=6/5/3"
#define TINY_B 4

/* N whole tiny MLPs as stages (seed 100 + i) on the agents, their
 * parameter sets, and their references. */
typedef struct tiny_world {
  int n;
  ax_rref **stages, **params;
  ax_net **ref;
  ax_optim **lopt;
  ax_dist_optim *dopt;
  ax_model_info info;
} tiny_world;

static void tiny_new(tiny_world *w, int n, int nagents, const char *optim) {
  const ax_model_def *def = ax_model_find("mlp");
  ax_config mcfg, ocfg;
  ax_model_info info;
  ax_optim_cfg oc;
  AX_ASSERT_OK(ax_model_config(def, TINY_CFG, &mcfg));
  AX_ASSERT_OK(ax_model_describe(def, &mcfg, &info));
  w->info = info;
  AX_ASSERT_OK(ax_config_parse(&ocfg, optim));
  AX_ASSERT_OK(ax_optim_cfg_parse(&ocfg, &oc));
  w->n = n;
  w->stages = calloc((size_t)n, sizeof *w->stages);
  w->params = calloc((size_t)n, sizeof *w->params);
  w->ref = calloc((size_t)n, sizeof *w->ref);
  w->lopt = calloc((size_t)n, sizeof *w->lopt);
  assert_true(w->stages && w->params && w->ref && w->lopt);
  for (int i = 0; i < n; i++) {
    char cfg[128];
    snprintf(cfg, sizeof cfg, "%s,seed=%d", TINY_CFG, 100 + i);
    AX_ASSERT_OK(ax_remote_module(g_drv, g_names[i % nagents], "mlp.stage", cfg,
                                  AX_CPU, &w->stages[i]));
    AX_ASSERT_OK(ax_model_stage(def, &mcfg, 0, info.n_blocks, AX_CPU,
                                100 + (uint64_t)i, &w->ref[i]));
    w->lopt[i] = ax_optim_new(&oc, w->ref[i]->n_params, AX_CPU);
    assert_non_null(w->lopt[i]);
  }
  for (int i = 0; i < n; i++)
    AX_ASSERT_OK(ax_rmod_parameters(g_drv, w->stages[i], &w->params[i]));
  AX_ASSERT_OK(ax_dist_optim_new(g_drv, w->params, n, optim, &w->dopt));
}

static void tiny_free(tiny_world *w) {
  ax_dist_optim_free(w->dopt);
  for (int i = 0; i < w->n; i++) {
    ax_rref_release(w->params[i]);
    ax_rref_release(w->stages[i]);
    ax_optim_free(w->lopt[i]);
    ax_net_free(w->ref[i]);
  }
  free(w->stages);
  free(w->params);
  free(w->ref);
  free(w->lopt);
}

static void tiny_batch(int i, int s, ax_tlist *in, ax_tlist *lab) {
  int64_t xs[2] = {TINY_B, 6}, ls = TINY_B;
  uint64_t seed = 1000 * (uint64_t)s + (uint64_t)i;
  *in = ax_tlist1(ax_test_randn(seed, 1.0f, 2, xs));
  *lab = ax_tlist1(ax_test_randint(seed + 7, 0, 3, 1, &ls));
}

/* Step s: models with on[i] set run forward (loss on their owner) and
 * backward under one context, and their references one local step; then
 * one distributed step, which must step exactly those. */
static void tiny_step(tiny_world *w, int s, const int *on) {
  uint64_t ctx;
  ax_rref **loss = calloc((size_t)w->n, sizeof *loss);
  assert_non_null(loss);
  int nl = 0;
  AX_ASSERT_OK(ax_dist_context_new(g_drv, &ctx));
  for (int i = 0; i < w->n; i++) {
    if (on && !on[i])
      continue;
    ax_tlist in, lab;
    tiny_batch(i, s, &in, &lab);
    ax_values *a = ax_values_new();
    ax_values_add_i64(a, s);
    ax_values_add_i64(a, 1);
    ax_values_add_tensor(a, in.t[0]);
    ax_values_add_tensor(a, lab.t[0]);
    AX_ASSERT_OK(ax_rmod_forward_remote(g_drv, w->stages[i], a, &loss[nl++]));
    ax_values_free(a);
    dt_local_step(w->ref[i], w->lopt[i], &in, &lab, &w->info, (uint64_t)s);
    ax_tlist_clear(&in);
    ax_tlist_clear(&lab);
  }
  AX_ASSERT_OK(ax_dist_backward_rrefs(g_drv, ctx, loss, nl, 60000));
  int stepped = -1;
  AX_ASSERT_OK(ax_dist_optim_step_count(w->dopt, ctx, 60000, &stepped));
  assert_int_equal(stepped, nl);
  AX_ASSERT_OK(ax_dist_context_release(g_drv, ctx, 10000));
  for (int i = 0; i < nl; i++)
    ax_rref_release(loss[i]);
  free(loss);
}

static ax_tensor *tiny_params(tiny_world *w, int i) {
  ax_tensor *p = NULL, *b = NULL;
  AX_ASSERT_OK(ax_rmod_state_save(g_drv, w->stages[i], &p, &b));
  ax_tensor_release(b);
  return p;
}

static void tiny_compare(tiny_world *w) {
  for (int i = 0; i < w->n; i++) {
    ax_tensor *p = tiny_params(w, i);
    dt_compare(p, ax_f32(w->ref[i]->params), w->ref[i]->n_params, 1e-5,
               "parameters", i);
    ax_tensor_release(p);
  }
}

/* 70 parameter sets on 2 agents, 3 steps of SGD with momentum. */
static void test_many_parameter_sets(void **state) {
  tiny_world w;
  tiny_new(&w, 70, 2, "opt=sgd,lr=0.1,momentum=0.9");
  for (int s = 0; s < 3; s++)
    tiny_step(&w, s, NULL);
  tiny_compare(&w);
  tiny_free(&w);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

/* Model 1 gets no gradient in the second of three contexts. */
static void test_no_gradient_not_stepped(void **state) {
  static const char *const optims[] = {
      "opt=sgd,lr=0.1,momentum=0.9,wd=0.05",
      "opt=adamw,lr=1e-2,wd=0.05",
  };
  for (int k = 0; k < 2; k++) {
    fprintf(stderr, "  %s\n", optims[k]);
    tiny_world w;
    tiny_new(&w, 2, 2, optims[k]);
    static const int only0[2] = {1, 0};
    tiny_step(&w, 0, NULL);
    ax_tensor *before = tiny_params(&w, 1);
    tiny_step(&w, 1, only0); /* also asserts that 1 set was stepped */
    ax_tensor *after = tiny_params(&w, 1);
    assert_int_equal(ax_tensor_numel(before), ax_tensor_numel(after));
    assert_memory_equal(ax_f32(before), ax_f32(after),
                        ax_tensor_numel(before) * sizeof(float));
    ax_tensor_release(before);
    ax_tensor_release(after);
    tiny_step(&w, 2, NULL); /* its momentum / moments must be untouched */
    tiny_compare(&w);
    tiny_free(&w);
  }
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

/* ---- bad arguments --------------------------------------------------- */
static void test_bad_arguments(void **state) {
  static const char *const opt = "opt=sgd,lr=0.1,momentum=0.9";
  tiny_world w;
  tiny_new(&w, 2, 2, opt);
  tiny_step(&w, 0, NULL); /* momentum is set now */
  ax_dist_optim *o = NULL;
  ax_rref *dup[2] = {w.params[0], w.params[0]};
  AX_ASSERT_ERR(ax_dist_optim_new(g_drv, dup, 2, opt, &o), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "same stage"));
  ax_rref *again[2] = {w.params[0], NULL}; /* a second object, same stage */
  AX_ASSERT_OK(ax_rmod_parameters(g_drv, w.stages[0], &again[1]));
  AX_ASSERT_ERR(ax_dist_optim_new(g_drv, again, 2, opt, &o), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "parameter sets 0 and 1 are the same"));
  ax_rref_release(again[1]);
  ax_rref *hole[2] = {w.params[0], NULL};
  AX_ASSERT_ERR(ax_dist_optim_new(g_drv, hole, 2, opt, &o), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "parameter set 1 is NULL"));
  AX_ASSERT_ERR(ax_dist_optim_new(g_drv, w.params, 2, "opt=sgd,lr=-1", &o),
                AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "bad configuration"));
  /* A stage is not a parameter set: the owner's error names the entry. */
  ax_rref *mixed[2] = {w.params[0], w.stages[1]};
  assert_int_not_equal(ax_dist_optim_new(g_drv, mixed, 2, opt, &o), AX_OK);
  assert_non_null(strstr(ax_errmsg(), "parameter set 1"));
  assert_null(o);
  /* Nothing was lost: parameter set 0 kept its optimizer and momentum (a
   * new optimizer would have restarted it), and both still step. */
  tiny_step(&w, 1, NULL);
  tiny_compare(&w);
  AX_ASSERT_ERR(ax_dist_optim_step(w.dopt, 0, 1000), AX_EINVAL);
  tiny_free(&w);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

int main(void) {
  static const char *const args[] = {"--threads", "2", NULL};
  if (mt_start("driver", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mlp_optimizers),
      cmocka_unit_test(test_bert_optimizers),
      cmocka_unit_test(test_many_parameter_sets),
      cmocka_unit_test(test_no_gradient_not_stepped),
      cmocka_unit_test(test_bad_arguments),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
