/* Linear layer: y = x W^T + b over the last dimension. */
#include <math.h>
#include <stdio.h>

#include "kernels/backend-impl.h"
#include "models/layers/basic.h"

typedef struct linear {
  int in, out, bias;
  float init_std;
} linear;

/* Slot: the input x from forward until the weight half, and the output
 * gradient dy from the input half until the weight half (dW = dy^T x and
 * db = sum dy need both). */
enum { SAVE_X = 0, SAVE_DY = 1 };

static int linear_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                          const ax_tlist *in, ax_tlist *out) {
  linear *L = m->priv;
  ax_tensor *x = in->t[0]; // (..., in)
  char b[64];
  if (!x || x->dtype != AX_F32 || x->ndim < 1 || x->shape[x->ndim - 1] != L->in)
    return ax_seterr(AX_ESHAPE, "linear(%d->%d): input %s does not end in %d",
                     L->in, L->out,
                     x ? ax_tensor_shape_str(x, b, sizeof b) : "?", L->in);
  int rows = (int)(ax_tensor_numel(x) / (size_t)L->in);
  int64_t shape[AX_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++)
    shape[i] = x->shape[i];
  shape[x->ndim - 1] = L->out;
  ax_tensor *y = ax_tensor_new(AX_F32, x->ndim, shape, x->device);
  if (!y)
    return AX_ENOMEM;
  ax_backend *be = ax_backend_of(x->device);
  const float *W = ax_param(m, ex, 0);
  int rc = AX_K(be, gemm, 0, 1, rows, L->out, L->in, 1.0f, ax_f32(x), L->in, 0,
                W, L->in, 0, 0.0f, ax_f32(y), L->out, 0, 1);
  if (rc == AX_OK && L->bias)
    rc = AX_K(be, bias_add, ax_f32(y), ax_param(m, ex, (size_t)L->in * L->out),
              rows, L->out, 1);
  if (rc != AX_OK) {
    ax_tensor_release(y);
    return rc;
  }
  if (slot) {
    ax_slot_put(slot, SAVE_X, x);
    ax_slot_put(slot, SAVE_DY, NULL);
  }
  out->n = 1;
  out->t[0] = y;
  return AX_OK;
}

/* The saved input and its row count; AX_ESTATE unless the slot is between
 * forward and the input half (want_dy = 0) or between the halves (1). */
static int linear_state(const linear *L, ax_slot *slot, int want_dy,
                        ax_tensor **x, int *rows) {
  *x = ax_slot_get(slot, SAVE_X); // (..., in)
  int has_dy = ax_slot_get(slot, SAVE_DY) != NULL;
  if (!*x || has_dy != want_dy)
    return ax_seterr(AX_ESTATE, "linear(%d->%d): %s", L->in, L->out,
                     !*x       ? "backward without forward"
                     : want_dy ? "weight half without input half"
                               : "input half ran twice");
  *rows = (int)(ax_tensor_numel(*x) / (size_t)L->in);
  return AX_OK;
}

static int linear_backward_input(ax_module *m, const ax_exec *ex, ax_slot *slot,
                                 const ax_tlist *dout, ax_tlist *din) {
  linear *L = m->priv;
  ax_tensor *x, *dy = dout->n > 0 ? dout->t[0] : NULL; // (..., out)
  int rows;
  AX_TRY(linear_state(L, slot, 0, &x, &rows));
  if (!dy || dy->dtype != AX_F32 ||
      ax_tensor_numel(dy) != (size_t)rows * L->out)
    return ax_seterr(AX_ESHAPE,
                     "linear(%d->%d): gradient has %zu elements, "
                     "expected %d",
                     L->in, L->out, dy ? ax_tensor_numel(dy) : 0,
                     rows * L->out);
  din->n = 1;
  din->t[0] = NULL;
  if (ex->need_dx) {
    ax_tensor *dx = ax_tensor_like(x);
    if (!dx)
      return AX_ENOMEM;
    /* dx (rows, in) = dy (rows, out) W (out, in) */
    int rc = AX_K(ax_backend_of(x->device), gemm, 0, 0, rows, L->in, L->out,
                  1.0f, ax_f32(dy), L->out, 0, ax_param(m, ex, 0), L->in, 0,
                  0.0f, ax_f32(dx), L->in, 0, 1);
    if (rc != AX_OK) {
      ax_tensor_release(dx);
      return rc;
    }
    din->t[0] = dx;
  }
  ax_slot_put(slot, SAVE_DY, dy);
  return AX_OK;
}

static int linear_backward_weight(ax_module *m, const ax_exec *ex,
                                  ax_slot *slot) {
  linear *L = m->priv;
  ax_tensor *x, *dy = ax_slot_get(slot, SAVE_DY); // (..., out)
  int rows;
  AX_TRY(linear_state(L, slot, 1, &x, &rows));
  ax_backend *be = ax_backend_of(x->device);
  /* dW (out, in) += dy^T (out, rows) x (rows, in) */
  AX_TRY(AX_K(be, gemm, 1, 0, L->out, L->in, rows, 1.0f, ax_f32(dy), L->out, 0,
              ax_f32(x), L->in, 0, 1.0f, ax_grad(m, ex, 0), L->in, 0, 1));
  if (L->bias)
    AX_TRY(AX_K(be, bias_grad, ax_f32(dy),
                ax_grad(m, ex, (size_t)L->in * L->out), rows, L->out, 1));
  ax_slot_put(slot, SAVE_X, NULL);
  ax_slot_put(slot, SAVE_DY, NULL);
  return AX_OK;
}

static void linear_init(ax_module *m, float *params, float *buffers,
                        ax_rng *rng) {
  linear *L = m->priv;
  size_t nw = (size_t)L->in * L->out;
  if (L->init_std > 0.0f) {
    for (size_t i = 0; i < nw; i++)
      params[i] = L->init_std * (float)ax_rng_normal(rng);
    for (int i = 0; L->bias && i < L->out; i++)
      params[nw + (size_t)i] = 0.0f;
    return;
  }
  float bound = 1.0f / sqrtf((float)L->in);
  for (size_t i = 0; i < nw + (L->bias ? (size_t)L->out : 0); i++)
    params[i] = bound * (float)(2.0 * ax_rng_uniform(rng) - 1.0);
}

static const ax_module_ops linear_ops = {
    /* .kind = */ "linear",
    /* .forward = */ linear_forward,
    /* .backward = */ NULL, /* the halves back to back */
    /* .init = */ linear_init,
    /* .destroy = */ NULL,
    /* .backward_input = */ linear_backward_input,
    /* .backward_weight = */ linear_backward_weight,
};

ax_module *ax_linear_new_std(int in, int out, int bias, float init_std) {
  if (in <= 0 || out <= 0) {
    ax_seterr(AX_EINVAL, "linear: sizes %d -> %d must be positive", in, out);
    return NULL;
  }
  ax_module *m = ax_module_new(&linear_ops, sizeof(linear));
  if (!m)
    return NULL;
  linear *L = m->priv;
  L->in = in;
  L->out = out;
  L->bias = bias != 0;
  L->init_std = init_std;
  m->n_params = (size_t)in * out + (bias ? (size_t)out : 0);
  return m;
}

ax_module *ax_linear_new(int in, int out, int bias) {
  return ax_linear_new_std(in, out, bias, 0.0f);
}
