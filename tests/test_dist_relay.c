/* Relay edges of distributed autograd, against single-process references
 * (3 steps of SGD with momentum, parameters within 1e-5):
 *  - the driver relay: the driver calls forward on stage 0 (agent w1), gets
 *    its output and passes it as the argument of stage 1's forward (w2),
 *    on the MLP and on a tiny BERT (whose mask gets no gradient);
 *  - a relay of several hops: stage 0 keeps its output as a value RRef on
 *    w1, a box on w3 (which neither produces nor consumes it) fetches it
 *    and returns it to the driver, the driver keeps it as a value of its
 *    own, and stage 1 on w2 fetches that value;
 *  - two consumers of one relayed tensor: stage 1 runs twice on it (once
 *    given as an argument, once fetched from the driver) with different
 *    labels, and stage 0 must get the sum of both gradients.
 * Every node ends with zero live RRefs, contexts and calls. */
#include <string.h>

#include "harness.h"
#include "tests/dist_testutil.h"
#include "tests/mp_testutil.h"

#define NAGENTS 3
static const char *g_names[NAGENTS] = {"w1", "w2", "w3"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

/* "t.keep" on the driver: returns its arguments, so that ax_remote to the
 * driver itself keeps them as a value the driver owns. */
static int h_keep(ax_call_ctx *cc, const ax_values *args, ax_values *out,
                  void *user) {
  for (size_t i = 0; i < ax_values_count(args); i++) {
    ax_tensor *t;
    AX_TRY(ax_values_get_tensor(args, i, &t));
    AX_TRY(ax_values_add_tensor(out, t));
  }
  return AX_OK;
}

/* [seed, n_labels, inputs..., labels...] with the inputs given as tensors
 * (in) or as one value RRef (r). */
static ax_values *fwd_args(uint64_t seed, const ax_tlist *in, ax_rref *r,
                           const ax_tlist *lab) {
  ax_values *a = ax_values_new();
  assert_non_null(a);
  AX_ASSERT_OK(ax_values_add_i64(a, (int64_t)seed));
  AX_ASSERT_OK(ax_values_add_i64(a, lab ? lab->n : 0));
  if (r)
    AX_ASSERT_OK(ax_values_add_rref(a, r));
  for (int i = 0; in && i < in->n; i++)
    AX_ASSERT_OK(ax_values_add_tensor(a, in->t[i]));
  for (int i = 0; lab && i < lab->n; i++)
    AX_ASSERT_OK(ax_values_add_tensor(a, lab->t[i]));
  return a;
}

/* Stage forward on its owner; returns the outputs here. */
static ax_values *fwd(ax_rref *stage, uint64_t seed, const ax_tlist *in,
                      ax_rref *r, const ax_tlist *lab) {
  ax_values *a = fwd_args(seed, in, r, lab), *out = NULL;
  AX_ASSERT_OK(ax_rmod_forward(g_drv, stage, a, &out));
  ax_values_free(a);
  return out;
}

static ax_tlist tensors_of(const ax_values *v) {
  ax_tlist t = {0};
  for (size_t i = 0; i < ax_values_count(v) && t.n < AX_TLIST_MAX; i++)
    AX_ASSERT_OK(ax_values_get_tensor(v, i, &t.t[t.n++]));
  return t;
}

/* Labels shifted by one class (the second consumer's labels). */
static ax_tlist shifted(const ax_tlist *lab, int classes) {
  ax_tlist s = {0};
  s.n = lab->n;
  for (int i = 0; i < lab->n; i++) {
    assert_int_equal(lab->t[i]->dtype, AX_I32);
    s.t[i] = ax_tensor_like(lab->t[i]);
    AX_ASSERT_OK(ax_tensor_copy(s.t[i], lab->t[i]));
    int32_t *l = (int32_t *)s.t[i]->data;
    for (size_t j = 0; j < ax_tensor_numel(s.t[i]); j++)
      l[j] = (l[j] + 1) % classes;
  }
  return s;
}

/* Backward from loss tensors held here, one optimizer step, release. */
static void finish(uint64_t ctx, ax_dist_optim *opt, const ax_tlist *roots) {
  AX_ASSERT_OK(ax_dist_backward(g_drv, ctx, roots, 60000));
  AX_ASSERT_OK(ax_dist_optim_step(opt, ctx, 60000));
  AX_ASSERT_OK(ax_dist_context_release(g_drv, ctx, 10000));
}

/* y = stage0(x) here; loss = stage1(y) with y as the argument. */
static void step_driver_relay(ax_node *drv, ax_rref **st, int K,
                              ax_dist_optim *opt, const ax_tlist *in,
                              const ax_tlist *lab, uint64_t seed, void *user) {
  uint64_t ctx;
  AX_ASSERT_OK(ax_dist_context_new(drv, &ctx));
  ax_values *y = fwd(st[0], seed, in, NULL, NULL);
  ax_tlist yt = tensors_of(y);
  ax_values *loss = fwd(st[1], seed, &yt, NULL, lab);
  ax_tlist roots = tensors_of(loss);
  finish(ctx, opt, &roots);
  ax_values_free(loss);
  ax_values_free(y);
}

/* Y stays on w1; a box on w3 fetches it (a recv there) and returns it (a
 * send); the driver keeps it as its own value K; stage 1 fetches K from the
 * driver. Hops: w1 -> w3 -> driver -> w2. */
static void step_two_hop(ax_node *drv, ax_rref **st, int K, ax_dist_optim *opt,
                         const ax_tlist *in, const ax_tlist *lab, uint64_t seed,
                         void *user) {
  ax_rref *box, *Y, *kept;
  uint64_t ctx;
  AX_ASSERT_OK(ax_remote_object(drv, "w3", "rref.box", "", AX_CPU, NULL, &box));
  AX_ASSERT_OK(ax_dist_context_new(drv, &ctx));
  ax_values *a = fwd_args(seed, in, NULL, NULL), *one = ax_values_new(), *v;
  AX_ASSERT_OK(ax_rmod_forward_remote(drv, st[0], a, &Y));
  ax_values_free(a);
  AX_ASSERT_OK(ax_values_add_rref(one, Y));
  AX_ASSERT_OK(ax_rref_rpc_sync(drv, box, "put", one, NULL, NULL));
  ax_values_free(one);
  int64_t fa[2] = {0, 30000};
  ax_values *fetch = dt_i64s(2, fa);
  AX_ASSERT_OK(ax_rref_rpc_sync(drv, box, "fetch", fetch, NULL, &v));
  ax_values_free(fetch);
  AX_ASSERT_OK(ax_remote(drv, ax_node_name(drv), "t.keep", v, NULL, &kept));
  ax_values *loss = fwd(st[1], seed, NULL, kept, lab);
  ax_tlist roots = tensors_of(loss);
  finish(ctx, opt, &roots);
  AX_ASSERT_OK(ax_rref_rpc_sync(drv, box, "clear", NULL, NULL, NULL));
  ax_rref_release(box);
  ax_values_free(loss);
  ax_values_free(v);
  ax_rref_release(kept);
  ax_rref_release(Y);
}

/* y = stage0(x) here; stage 1 consumes it twice: as an argument with the
 * labels, and fetched from the driver's value with the shifted labels. */
static void step_two_consumers(ax_node *drv, ax_rref **st, int K,
                               ax_dist_optim *opt, const ax_tlist *in,
                               const ax_tlist *lab, uint64_t seed, void *user) {
  uint64_t ctx;
  ax_rref *kept;
  AX_ASSERT_OK(ax_dist_context_new(drv, &ctx));
  ax_values *y = fwd(st[0], seed, in, NULL, NULL);
  ax_tlist yt = tensors_of(y), lab2 = shifted(lab, 10);
  AX_ASSERT_OK(ax_remote(drv, ax_node_name(drv), "t.keep", y, NULL, &kept));
  ax_values *la = fwd(st[1], seed, &yt, NULL, lab);
  ax_values *lb = fwd(st[1], seed, NULL, kept, &lab2);
  ax_tlist roots = tensors_of(la), rb = tensors_of(lb);
  roots.t[roots.n++] = rb.t[0];
  finish(ctx, opt, &roots);
  ax_tlist_clear(&lab2);
  ax_values_free(la);
  ax_values_free(lb);
  ax_values_free(y);
  ax_rref_release(kept);
}

/* The reference of step_two_consumers, summing in the same places: stage
 * 1 runs twice on y, the two gradients of y are added, stage 0 runs its
 * backward once. The two stage nets get the whole net's parameters before
 * the step and give it their gradients. */
typedef struct two_ref {
  ax_net *st[2];
} two_ref;

static void local_two_consumers(ax_net *net, ax_optim *opt, const ax_tlist *in,
                                const ax_tlist *lab, int ignore, uint64_t seed,
                                void *user) {
  two_ref *tr = user;
  ax_net *s0 = tr->st[0], *s1 = tr->st[1];
  assert_int_equal(s0->n_params + s1->n_params, net->n_params);
  memcpy(ax_f32(s0->params), ax_f32(net->params), s0->n_params * 4);
  memcpy(ax_f32(s1->params), ax_f32(net->params) + s0->n_params,
         s1->n_params * 4);
  AX_ASSERT_OK(ax_net_zero_grad(s0));
  AX_ASSERT_OK(ax_net_zero_grad(s1));
  ax_tlist lab2 = shifted(lab, 10), y = {0}, dy = {0}, none = {0};
  ax_slot *slot0 = ax_slot_new();
  AX_ASSERT_OK(ax_net_forward(s0, slot0, 1, seed, in, &y));
  for (int pass = 0; pass < 2; pass++) {
    ax_slot *slot = ax_slot_new();
    ax_tlist out = {0}, dout = {0}, din = {0};
    ax_loss_result r;
    AX_ASSERT_OK(ax_net_forward(s1, slot, 1, seed, &y, &out));
    AX_ASSERT_OK(
        ax_loss_xent(&out, pass ? &lab2 : lab, ignore, NULL, 1.0f, &r, &dout));
    AX_ASSERT_OK(ax_net_backward(s1, slot, seed, 1, &dout, &din));
    if (pass == 0) {
      dy = din;
      memset(&din, 0, sizeof din);
    } else {
      for (int i = 0; i < dy.n; i++)
        for (size_t j = 0; j < ax_tensor_numel(dy.t[i]); j++)
          ax_f32(dy.t[i])[j] += ax_f32(din.t[i])[j];
    }
    ax_tlist_clear(&out);
    ax_tlist_clear(&dout);
    ax_tlist_clear(&din);
    ax_slot_free(slot);
  }
  AX_ASSERT_OK(ax_net_backward(s0, slot0, seed, 0, &dy, &none));
  memcpy(ax_f32(net->grads), ax_f32(s0->grads), s0->n_params * 4);
  memcpy(ax_f32(net->grads) + s0->n_params, ax_f32(s1->grads),
         s1->n_params * 4);
  AX_ASSERT_OK(ax_optim_step(opt, net->params, net->grads));
  ax_tlist_clear(&none);
  ax_tlist_clear(&dy);
  ax_tlist_clear(&y);
  ax_tlist_clear(&lab2);
  ax_slot_free(slot0);
}

static dt_oracle_cfg mlp_cfg(dt_dist_step_fn step) {
  dt_oracle_cfg c = {.model = "mlp",
                     .kind = "mlp.stage",
                     .model_cfg = "widths=784/64/32/10",
                     .data_cfg = "shape=1/28/28,classes=10,examples=640,seed=9",
                     .optim = "opt=sgd,lr=0.05,momentum=0.9",
                     .steps = 3,
                     .batch = 32,
                     .rtol = 1e-5};
  c.dist_step = step;
  return c;
}

static void test_driver_relay(void **state) {
  dt_oracle_cfg c = mlp_cfg(step_driver_relay);
  dt_run_oracle(g_drv, g_names, 2, NULL, &c);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

/* The same with a tiny BERT: stage 0 also passes the attention mask on,
 * which gets no gradient (an empty contribution through the relay). */
static void test_driver_relay_bert(void **state) {
  dt_oracle_cfg c = {.model = "bert",
                     .kind = "bert.stage",
                     .model_cfg = DT_BERT_CFG,
                     .optim = "opt=sgd,lr=0.05,momentum=0.9",
                     .steps = 3,
                     .batch = DT_BERT_B,
                     .rtol = 1e-5};
  c.batch_fn = dt_bert_batch;
  c.dist_step = step_driver_relay;
  dt_run_oracle(g_drv, g_names, 2, NULL, &c);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_two_hop_relay(void **state) {
  dt_oracle_cfg c = mlp_cfg(step_two_hop);
  dt_run_oracle(g_drv, g_names, 2, NULL, &c);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_relay_two_consumers(void **state) {
  dt_oracle_cfg c = mlp_cfg(step_two_consumers);
  const ax_model_def *def = ax_model_find("mlp");
  ax_config mcfg;
  ax_model_info info;
  int b[3];
  AX_ASSERT_OK(ax_model_config(def, c.model_cfg, &mcfg));
  AX_ASSERT_OK(def->describe(&mcfg, &info));
  AX_ASSERT_OK(ax_split_uniform(info.n_blocks, 2, b));
  two_ref tr;
  for (int k = 0; k < 2; k++)
    AX_ASSERT_OK(
        ax_model_stage(def, &mcfg, b[k], b[k + 1], AX_CPU, 3, &tr.st[k]));
  c.local_step = local_two_consumers;
  c.user = &tr;
  dt_run_oracle(g_drv, g_names, 2, NULL, &c);
  ax_net_free(tr.st[0]);
  ax_net_free(tr.st[1]);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

int main(void) {
  static const char *const args[] = {"--threads", "2", NULL};
  if (mt_start("driver", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  if (ax_rpc_register(g_drv, "t.keep", h_keep, NULL) != AX_OK) {
    mt_end(g_drv, g_pids, NAGENTS);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_driver_relay),
      cmocka_unit_test(test_driver_relay_bert),
      cmocka_unit_test(test_two_hop_relay),
      cmocka_unit_test(test_relay_two_consumers),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
