#include "split_testutil.h"

#include <math.h>
#include <string.h>

#include "axon/kernels/rng.h"

/* Output gradients for `out`: N(0, 1) f32 values from seed base + i for
 * f32 or bf16 entry i, NULL elsewhere. */
static ax_tlist rand_grads(const ax_tlist *out, uint64_t base) {
  ax_tlist d = {0};
  d.n = out->n;
  for (int i = 0; i < out->n; i++)
    if (out->t[i] &&
        (out->t[i]->dtype == AX_F32 || out->t[i]->dtype == AX_BF16))
      d.t[i] = ax_test_randn(base + (uint64_t)i, 1.0f, out->t[i]->ndim,
                             out->t[i]->shape);
  return d;
}

/* A zeroed tensor like the net's gradient buffer. */
static ax_tensor *zero_grads(const ax_net *net) {
  ax_tensor *g = ax_tensor_like(net->grads);
  assert_non_null(g);
  memset(g->data, 0, ax_tensor_nbytes(g));
  return g;
}

static int all_zero(const ax_tensor *t) {
  const float *p = ax_f32(t);
  for (size_t i = 0; i < ax_tensor_numel(t); i++)
    if (p[i] != 0.0f)
      return 0;
  return 1;
}

/* Fails unless a and b hold the same bits (both NULL counts as equal). */
static void same_bits(const ax_tensor *a, const ax_tensor *b, const char *what,
                      int unit, int idx) {
  if (!a || !b) {
    if (a || b)
      fail_msg("unit %d: %s %d is NULL on one side only", unit, what, idx);
    return;
  }
  if (!ax_tensor_same_shape(a, b) || a->dtype != b->dtype)
    fail_msg("unit %d: %s %d shapes or types differ", unit, what, idx);
  if (a->dtype != AX_F32) {
    if (memcmp(a->data, b->data, ax_tensor_nbytes(a)) != 0)
      fail_msg("unit %d: %s %d (%s) differs", unit, what, idx,
               ax_dtype_name(a->dtype));
    return;
  }
  const float *x = ax_f32(a), *y = ax_f32(b);
  for (size_t i = 0; i < ax_tensor_numel(a); i++)
    if (memcmp(&x[i], &y[i], sizeof x[i]) != 0)
      fail_msg("unit %d: %s %d differs at [%zu]: split %.9g, fused %.9g", unit,
               what, idx, i, (double)x[i], (double)y[i]);
}

static void same_lists(const ax_tlist *a, const ax_tlist *b, int unit) {
  if (a->n != b->n)
    fail_msg("unit %d: %d input gradients split, %d fused", unit, a->n, b->n);
  for (int i = 0; i < a->n; i++)
    same_bits(a->t[i], b->t[i], "input gradient", unit, i);
}

typedef struct unit {
  const ax_tlist *in;
  uint64_t seed;  /* dropout seed */
  ax_tlist dout;  /* fixed output gradients */
  ax_tensor *ref; /* the fused backward's parameter gradients */
  ax_tlist dref;  /* and input gradients */
} unit;

static ax_exec exec_for(const ax_net *net, const unit *u, ax_tensor *grads,
                        int need_dx) {
  ax_exec ex = ax_net_exec(net, 1);
  ex.seed = u->seed;
  ex.update_stats = 0;
  ex.need_dx = need_dx;
  ex.grads = grads;
  return ex;
}

static void forward(ax_net *net, const unit *u, const ax_exec *ex,
                    ax_slot *slot) {
  ax_tlist out = {0};
  AX_ASSERT_OK(ax_forward(net->root, ex, slot, u->in, &out));
  ax_tlist_clear(&out);
}

/* The reference: forward and the fused backward of one unit. */
static void fused(ax_net *net, unit *u, int need_dx) {
  ax_slot *slot = ax_slot_new();
  u->ref = zero_grads(net);
  ax_exec ex = exec_for(net, u, u->ref, need_dx);
  ax_tlist out = {0};
  AX_ASSERT_OK(ax_forward(net->root, &ex, slot, u->in, &out));
  u->dout = rand_grads(&out, 1000 * (u->seed - 98));
  ax_tlist_clear(&out);
  AX_ASSERT_OK(ax_backward(net->root, &ex, slot, &u->dout, &u->dref));
  ax_slot_free(slot);
}

/* The input half of one unit, checked to write no parameter gradient. */
static void input_half(ax_net *net, unit *u, const ax_exec *ex, ax_slot *slot,
                       ax_tlist *din) {
  AX_ASSERT_OK(ax_backward_input(net->root, ex, slot, &u->dout, din));
  if (!all_zero(ex->grads))
    fail_msg("the input half of %s wrote parameter gradients",
             net->root->ops->kind);
}

/* The weight half of one unit, checked to leave its slot empty. */
static void weight_half(ax_net *net, const ax_exec *ex, ax_slot *slot) {
  AX_ASSERT_OK(ax_backward_weight(net->root, ex, slot));
  if (ax_slot_bytes(slot) != 0)
    fail_msg("%s keeps %zu bytes after its weight half", net->root->ops->kind,
             ax_slot_bytes(slot));
}

void ax_test_split_matches_fused(ax_module *m, const ax_tlist *u1,
                                 const ax_tlist *u2, int need_dx) {
  ax_test_split_matches_fused_prec(m, u1, u2, need_dx, AX_PREC_FP32);
}

void ax_test_split_matches_fused_prec(ax_module *m, const ax_tlist *u1,
                                      const ax_tlist *u2, int need_dx,
                                      int precision) {
  assert_non_null(m);
  assert_true(ax_module_can_split(m));
  ax_net *net = ax_net_new(m, AX_CPU, 7);
  assert_non_null(net);
  net->precision = precision;
  unit u[2] = {{u1, 99}, {u2, 100}};
  for (int k = 0; k < 2; k++)
    fused(net, &u[k], need_dx);

  /* Halves back to back on one slot. */
  ax_slot *s[2] = {ax_slot_new(), ax_slot_new()};
  ax_tensor *g[2] = {zero_grads(net), zero_grads(net)};
  ax_tlist din[2] = {{0}};
  ax_exec ex0 = exec_for(net, &u[0], g[0], need_dx);
  forward(net, &u[0], &ex0, s[0]);
  input_half(net, &u[0], &ex0, s[0], &din[0]);
  weight_half(net, &ex0, s[0]);
  same_lists(&din[0], &u[0].dref, 0);
  same_bits(g[0], u[0].ref, "parameter gradients", 0, 0);
  ax_tlist_clear(&din[0]);
  memset(g[0]->data, 0, ax_tensor_nbytes(g[0]));

  /* W later: F(u1) F(u2) B(u1) B(u2) W(u2) W(u1). */
  ax_exec ex[2];
  for (int k = 0; k < 2; k++) {
    ex[k] = exec_for(net, &u[k], g[k], need_dx);
    forward(net, &u[k], &ex[k], s[k]);
  }
  for (int k = 0; k < 2; k++)
    input_half(net, &u[k], &ex[k], s[k], &din[k]);
  /* The weight halves get parameters that are all NaN: the built-in
   * layers' weight halves must read none. */
  ax_tensor *nan = ax_tensor_like(net->params);
  assert_non_null(nan);
  AX_ASSERT_OK(ax_tensor_fill(nan, NAN));
  for (int k = 1; k >= 0; k--) {
    ex[k].params = nan;
    weight_half(net, &ex[k], s[k]);
  }
  ax_tensor_release(nan);
  for (int k = 0; k < 2; k++) {
    same_lists(&din[k], &u[k].dref, k);
    same_bits(g[k], u[k].ref, "parameter gradients", k, 0);
    ax_tlist_clear(&din[k]);
    ax_tlist_clear(&u[k].dout);
    ax_tlist_clear(&u[k].dref);
    ax_tensor_release(u[k].ref);
    ax_tensor_release(g[k]);
    ax_slot_free(s[k]);
  }
  ax_net_free(net);
}

ax_tlist ax_test_other_unit(const ax_tlist *in, unsigned mask, float a,
                            float b) {
  ax_tlist o = {0};
  o.n = in->n;
  for (int i = 0; i < in->n; i++) {
    ax_tensor *t = in->t[i];
    if (!t || t->dtype != AX_F32 || !(mask & (1u << i))) {
      o.t[i] = ax_tensor_retain(t);
      continue;
    }
    o.t[i] = ax_tensor_like(t);
    assert_non_null(o.t[i]);
    for (size_t j = 0; j < ax_tensor_numel(t); j++)
      ax_f32(o.t[i])[j] = a * ax_f32(t)[j] + b;
  }
  return o;
}
