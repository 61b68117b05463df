/* PReLU with one slope per channel (custom.h), written against
 * models/module.h only: forward saves its input in the caller's slot,
 * backward accumulates the slopes' gradients into the flat gradient buffer
 * at this module's offset. It also has the split backward (the input half
 * keeps dy for the weight half), so the zero-bubble modes can run it. */
#include "custom.h"

typedef struct prelu {
  int channels;
} prelu;

enum { SAVE_X = 0 };

/* Checks x (N, C, ...) against the layer; *inner = elements per (n, c). */
static int check(const ax_module *m, const ax_tensor *x, int64_t *inner) {
  const prelu *p = m->priv;
  if (!x || x->dtype != AX_F32)
    return ax_seterr(AX_EDTYPE, "prelu: input must be f32");
  if (x->device.type != AX_DEV_CPU)
    return ax_seterr(AX_EUNSUPPORTED, "prelu: CPU tensors only (the example "
                                      "has no CUDA kernel)");
  if (x->ndim < 2 || x->shape[1] != p->channels)
    return ax_seterr(AX_ESHAPE, "prelu: input needs dim 1 = %d channels",
                     p->channels);
  *inner = (int64_t)(ax_tensor_numel(x) / (size_t)(x->shape[0] * x->shape[1]));
  return AX_OK;
}

static int prelu_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                         const ax_tlist *in, ax_tlist *out) {
  ax_tensor *x = in->t[0];
  int64_t inner;
  AX_TRY(check(m, x, &inner));
  ax_tensor *y = ax_tensor_like(x);
  if (!y)
    return AX_ENOMEM;
  const float *a = ax_param(m, ex, 0), *xs = ax_f32(x);
  float *ys = ax_f32(y);
  int64_t N = x->shape[0], C = x->shape[1];
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++) {
      int64_t o = (n * C + c) * inner;
      for (int64_t i = 0; i < inner; i++)
        ys[o + i] = xs[o + i] > 0 ? xs[o + i] : a[c] * xs[o + i];
    }
  if (slot)
    ax_slot_put(slot, SAVE_X, x);
  *out = ax_tlist1(y);
  return AX_OK;
}

enum { SAVE_DY = 1 };

/* One pass over x and dy: dx (when dxs) and/or the slopes' gradients (when
 * da), each in a fixed order (n, then i), so the halves and the fused
 * backward give the same values. */
static void prelu_grads(const ax_module *m, const ax_exec *ex,
                        const ax_tensor *x, const ax_tensor *dy, int64_t inner,
                        float *dxs, float *da) {
  const float *a = ax_param(m, ex, 0), *xs = ax_f32(x), *g = ax_f32(dy);
  int64_t N = x->shape[0], C = x->shape[1];
  for (int64_t c = 0; c < C; c++) {
    double acc = 0;
    for (int64_t n = 0; n < N; n++) {
      int64_t o = (n * C + c) * inner;
      for (int64_t i = 0; i < inner; i++) {
        int pos = xs[o + i] > 0;
        if (!pos)
          acc += (double)g[o + i] * xs[o + i];
        if (dxs)
          dxs[o + i] = pos ? g[o + i] : a[c] * g[o + i];
      }
    }
    if (da)
      da[c] += (float)acc;
  }
}

/* The saved input and the output gradient, checked. */
static int prelu_inputs(const ax_module *m, ax_slot *slot, const ax_tensor *dy,
                        ax_tensor **x, int64_t *inner) {
  if (!(*x = ax_slot_get(slot, SAVE_X)))
    return ax_seterr(AX_ESTATE, "prelu: backward without forward");
  AX_TRY(check(m, *x, inner));
  if (!dy || ax_tensor_numel(dy) != ax_tensor_numel(*x))
    return ax_seterr(AX_ESHAPE, "prelu: gradient does not match the output");
  return AX_OK;
}

/* The input half (and, with da, the whole backward). */
static int prelu_backward_common(ax_module *m, const ax_exec *ex, ax_slot *slot,
                                 const ax_tlist *dout, ax_tlist *din,
                                 int whole) {
  ax_tensor *x, *dy = dout->t[0];
  int64_t inner;
  AX_TRY(prelu_inputs(m, slot, dy, &x, &inner));
  ax_tensor *dx = ex->need_dx ? ax_tensor_like(x) : NULL;
  if (ex->need_dx && !dx)
    return AX_ENOMEM;
  prelu_grads(m, ex, x, dy, inner, dx ? ax_f32(dx) : NULL,
              whole ? ax_grad(m, ex, 0) : NULL);
  din->n = 1;
  din->t[0] = dx;
  if (whole)
    ax_slot_put(slot, SAVE_X, NULL);
  else /* the weight half needs x and dy */
    ax_slot_put(slot, SAVE_DY, dy);
  return AX_OK;
}

static int prelu_backward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                          const ax_tlist *dout, ax_tlist *din) {
  return prelu_backward_common(m, ex, slot, dout, din, 1);
}

static int prelu_backward_input(ax_module *m, const ax_exec *ex, ax_slot *slot,
                                const ax_tlist *dout, ax_tlist *din) {
  return prelu_backward_common(m, ex, slot, dout, din, 0);
}

static int prelu_backward_weight(ax_module *m, const ax_exec *ex,
                                 ax_slot *slot) {
  ax_tensor *x, *dy = ax_slot_get(slot, SAVE_DY);
  int64_t inner;
  if (!dy)
    return ax_seterr(AX_ESTATE, "prelu: weight half before its input half");
  AX_TRY(prelu_inputs(m, slot, dy, &x, &inner));
  prelu_grads(m, ex, x, dy, inner, NULL, ax_grad(m, ex, 0));
  ax_slot_put(slot, SAVE_X, NULL);
  ax_slot_put(slot, SAVE_DY, NULL);
  return AX_OK;
}

static void prelu_init(ax_module *m, float *params, float *buffers,
                       ax_rng *rng) {
  const prelu *p = m->priv;
  for (int c = 0; c < p->channels; c++)
    params[c] = 0.25f;
}

static const ax_module_ops prelu_ops = {
    /* .kind = */ "prelu",
    /* .forward = */ prelu_forward,
    /* .backward = */ prelu_backward,
    /* .init = */ prelu_init,
    /* .destroy = */ NULL,
    /* .backward_input = */ prelu_backward_input,
    /* .backward_weight = */ prelu_backward_weight,
};

ax_module *cm_prelu_new(int channels) {
  if (channels < 1) {
    ax_seterr(AX_EINVAL, "prelu: %d channels", channels);
    return NULL;
  }
  ax_module *m = ax_module_new(&prelu_ops, sizeof(prelu));
  if (!m)
    return NULL;
  ((prelu *)m->priv)->channels = channels;
  m->n_params = (size_t)channels;
  return m;
}
