/* ReLU and Flatten: parameter-free layers. */
#include "axon/kernels/backend-impl.h"
#include "axon/models/layers/basic.h"

/* ReLU's slot: its output, in the exec's precision (ax_slot_put_act). */
enum { SAVE_Y = 0 };

static int relu_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                        const ax_tlist *in, ax_tlist *out) {
  ax_tensor *x = in->t[0];
  if (!x || x->dtype != AX_F32)
    return ax_seterr(AX_EDTYPE, "relu: input must be f32");
  ax_tensor *y = ax_tensor_like(x);
  if (!y)
    return AX_ENOMEM;
  int rc = AX_K(ax_backend_of(x->device), relu_fwd, ax_tensor_numel(x),
                ax_f32(x), ax_f32(y));
  if (rc == AX_OK && slot)
    rc = ax_slot_put_act(slot, SAVE_Y, ex, y);
  if (rc != AX_OK) {
    ax_tensor_release(y);
    return rc;
  }
  *out = ax_tlist1(y);
  return AX_OK;
}

static int relu_backward_input(ax_module *m, const ax_exec *ex, ax_slot *slot,
                               const ax_tlist *dout, ax_tlist *din) {
  ax_tensor *y = ax_slot_get(slot, SAVE_Y), *dy = dout->t[0];
  if (!y)
    return ax_seterr(AX_ESTATE, "relu: backward without forward");
  if (!dy || ax_tensor_numel(dy) != ax_tensor_numel(y))
    return ax_seterr(AX_ESHAPE, "relu: gradient does not match the output");
  din->n = 1;
  din->t[0] = NULL;
  if (ex->need_dx) {
    ax_tensor *yf = NULL; /* the saved output as f32 */
    AX_TRY(ax_slot_get_f32(slot, SAVE_Y, &yf));
    ax_tensor *dx = ax_tensor_like(yf);
    int rc = dx ? AX_K(ax_backend_of(y->device), relu_bwd, ax_tensor_numel(y),
                       ax_f32(yf), ax_f32(dy), ax_f32(dx))
                : AX_ENOMEM;
    ax_tensor_release(yf);
    if (rc != AX_OK) {
      ax_tensor_release(dx);
      return rc;
    }
    din->t[0] = dx;
  }
  ax_slot_put(slot, SAVE_Y, NULL);
  return AX_OK;
}

static const ax_module_ops relu_ops = {
    /* .kind = */ "relu",
    /* .forward = */ relu_forward,
    /* .backward = */ NULL, /* the input half alone */
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ relu_backward_input,
    /* .backward_weight = */ NULL, /* no parameters */
};

ax_module *ax_relu_new(void) { return ax_module_new(&relu_ops, 0); }

/* ---- flatten ---- */

static ax_tensor *reshape2(const ax_tensor *x, int64_t rows) {
  int64_t shape[2] = {rows,
                      rows ? (int64_t)(ax_tensor_numel(x) / (size_t)rows) : 0};
  return ax_tensor_reshape(x, 2, shape);
}

static int flatten_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                           const ax_tlist *in, ax_tlist *out) {
  ax_tensor *x = in->t[0];
  if (!x || x->ndim < 1)
    return ax_seterr(AX_ESHAPE, "flatten: input needs a batch dimension");
  ax_tensor *y = reshape2(x, x->shape[0]);
  if (!y)
    return AX_ENOMEM;
  if (slot) { /* only the input shape is needed for backward */
    ax_slot_set_int(slot, 0, x->ndim);
    for (int i = 1; i < x->ndim && i < AX_SLOT_SAVED; i++)
      ax_slot_set_int(slot, i, x->shape[i]);
  }
  *out = ax_tlist1(y);
  return AX_OK;
}

static int flatten_backward_input(ax_module *m, const ax_exec *ex,
                                  ax_slot *slot, const ax_tlist *dout,
                                  ax_tlist *din) {
  ax_tensor *dy = dout->t[0];
  int ndim = (int)ax_slot_int(slot, 0);
  if (ndim < 1 || !dy)
    return ax_seterr(AX_ESTATE, "flatten: backward without forward");
  din->n = 1;
  din->t[0] = NULL;
  if (ex->need_dx) {
    int64_t shape[AX_MAX_DIMS] = {dy->shape[0]};
    for (int i = 1; i < ndim; i++)
      shape[i] = ax_slot_int(slot, i);
    din->t[0] = ax_tensor_reshape(dy, ndim, shape);
    if (!din->t[0])
      return AX_ESHAPE;
  }
  return AX_OK;
}

static const ax_module_ops flatten_ops = {
    /* .kind = */ "flatten",
    /* .forward = */ flatten_forward,
    /* .backward = */ NULL, /* the input half alone */
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ flatten_backward_input,
    /* .backward_weight = */ NULL, /* no parameters */
};

ax_module *ax_flatten_new(void) { return ax_module_new(&flatten_ops, 0); }
