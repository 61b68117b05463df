/* The BERT-initialised fully connected layer: y = x W^T + b over the last
 * dimension of x, W (out, in) stored row-major as PyTorch does. */
#include "models/layers/tf-impl.h"

#include "runtime/error.h"

typedef struct dense_priv {
  int in, out, bias;
  float std;
} dense_priv;

/* Parameter layout: W (out, in) at 0, then b (out). */

static int dense_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                         const ax_tlist *in, ax_tlist *out) {
  dense_priv *p = m->priv;
  AX_TRY(axi_tf_check_in("dense", in, 1));
  ax_tensor *x = in->t[0]; // (..., in)
  char b[96];
  if (x->ndim < 1 || x->shape[x->ndim - 1] != p->in)
    return ax_seterr(AX_ESHAPE, "dense: input %s must end in %d features",
                     ax_tensor_shape_str(x, b, sizeof b), p->in);
  int64_t shape[AX_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++)
    shape[i] = x->shape[i];
  shape[x->ndim - 1] = p->out;
  int rows = (int)(ax_tensor_numel(x) / (size_t)p->in);
  ax_tensor *y = axi_tf_new(x->ndim, shape, x->device); // (..., out)
  if (!y)
    return AX_ENOMEM;
  ax_backend *be = ax_backend_of(x->device);
  const float *w = ax_param(m, ex, 0);
  int rc = AX_OK;
  if (rows > 0) {
    rc = AX_K(be, gemm, 0, 1, rows, p->out, p->in, 1.0f, ax_f32(x), p->in, 0L,
              w, p->in, 0L, 0.0f, ax_f32(y), p->out, 0L, 1);
    if (rc == AX_OK && p->bias)
      rc = AX_K(be, bias_add, ax_f32(y), ax_param(m, ex, (size_t)p->out * p->in),
                rows, p->out, 1);
  }
  if (rc != AX_OK) {
    ax_tensor_release(y);
    return rc;
  }
  if (slot)
    ax_slot_put(slot, 0, x);
  *out = ax_tlist1(y);
  return AX_OK;
}

static int dense_backward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                          const ax_tlist *dout, ax_tlist *din) {
  dense_priv *p = m->priv;
  ax_tensor *x = ax_slot_get(slot, 0); // (..., in)
  if (!x)
    return axi_tf_no_state("dense");
  AX_TRY(axi_tf_check_in("dense", dout, 1));
  ax_tensor *dy = dout->t[0]; // (..., out)
  int rows = (int)(ax_tensor_numel(x) / (size_t)p->in);
  if (ax_tensor_numel(dy) != (size_t)rows * p->out)
    return ax_seterr(AX_ESHAPE, "dense: gradient has %zu elements, expected "
                     "%d x %d", ax_tensor_numel(dy), rows, p->out);
  ax_backend *be = ax_backend_of(x->device);
  if (rows > 0) {
    /* dW (out, in) += dy^T (out, rows) x (rows, in); db += column sums. */
    AX_TRY(AX_K(be, gemm, 1, 0, p->out, p->in, rows, 1.0f, ax_f32(dy), p->out,
                0L, ax_f32(x), p->in, 0L, 1.0f, ax_grad(m, ex, 0), p->in, 0L,
                1));
    if (p->bias)
      AX_TRY(AX_K(be, bias_grad, ax_f32(dy),
                  ax_grad(m, ex, (size_t)p->out * p->in), rows, p->out, 1));
  }
  if (!ex->need_dx)
    return AX_OK;
  ax_tensor *dx = ax_tensor_like(x);
  if (!dx)
    return AX_ENOMEM;
  int rc = AX_OK;
  if (rows > 0) /* dx (rows, in) = dy (rows, out) W (out, in) */
    rc = AX_K(be, gemm, 0, 0, rows, p->in, p->out, 1.0f, ax_f32(dy), p->out,
              0L, ax_param(m, ex, 0), p->in, 0L, 0.0f, ax_f32(dx), p->in, 0L,
              1);
  if (rc != AX_OK) {
    ax_tensor_release(dx);
    return rc;
  }
  *din = ax_tlist1(dx);
  return AX_OK;
}

static void dense_init(ax_module *m, float *params, float *buffers,
                       ax_rng *rng) {
  dense_priv *p = m->priv;
  size_t nw = (size_t)p->out * p->in;
  axi_tf_normal(params, nw, p->std, rng);
  for (size_t i = nw; i < m->n_params; i++)
    params[i] = 0.0f;
}

static const ax_module_ops dense_ops = {
    /* .kind = */ "dense",
    /* .forward = */ dense_forward,
    /* .backward = */ dense_backward,
    /* .init = */ dense_init,
    /* .destroy = */ NULL,
};

ax_module *ax_dense_new(int in, int out, int bias, float std) {
  if (in <= 0 || out <= 0 || !(std >= 0.0f)) {
    ax_seterr(AX_EINVAL, "dense: bad configuration in=%d out=%d std=%g", in,
              out, (double)std);
    return NULL;
  }
  ax_module *m = ax_module_new(&dense_ops, sizeof(dense_priv));
  if (!m) {
    ax_seterr(AX_ENOMEM, "dense: no memory");
    return NULL;
  }
  dense_priv *p = m->priv;
  p->in = in;
  p->out = out;
  p->bias = bias != 0;
  p->std = std;
  m->n_params = (size_t)out * in + (p->bias ? (size_t)out : 0);
  return m;
}
