/* Conv2d: a square-kernel 2-D convolution over NCHW tensors. */
#include <math.h>

#include "axon/kernels/backend-impl.h"
#include "axon/models/layers/vision.h"

typedef struct conv2d {
  int in, out, k, stride, pad, bias;
} conv2d;

/* Slot: the input x from forward until the weight half, and the output
 * gradient dy from the input half until the weight half (the filter and
 * bias gradients need both). */
enum { SAVE_X = 0, SAVE_DY = 1 };

/* Fills the kernel geometry for input x; AX_ESHAPE when x does not fit. */
static int conv_desc(const conv2d *L, const ax_tensor *x, ax_conv_desc *d) {
  char b[64];
  if (!x || x->dtype != AX_F32 || x->ndim != 4 || x->shape[1] != L->in)
    return ax_seterr(AX_ESHAPE,
                     "conv2d(%d->%d, k=%d, s=%d, p=%d): expected input "
                     "(N, %d, H, W), got %s",
                     L->in, L->out, L->k, L->stride, L->pad, L->in,
                     x ? ax_tensor_shape_str(x, b, sizeof b) : "none");
  *d = (ax_conv_desc){0};
  d->n = (int)x->shape[0];
  d->c = L->in;
  d->h = (int)x->shape[2];
  d->w = (int)x->shape[3];
  d->k = L->out;
  d->r = d->s = L->k;
  d->stride = L->stride;
  d->pad = L->pad;
  /* The explicit size test also covers a negative (h + 2p - k) that C
   * division by the stride would round up to 0. */
  if (d->h + 2 * d->pad < d->r || d->w + 2 * d->pad < d->s ||
      ax_conv_desc_init(d) != AX_OK)
    return ax_seterr(AX_ESHAPE,
                     "conv2d(%d->%d, k=%d, s=%d, p=%d): input %s is too small "
                     "for the kernel",
                     L->in, L->out, L->k, L->stride, L->pad,
                     ax_tensor_shape_str(x, b, sizeof b));
  return AX_OK;
}

static int conv_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                        const ax_tlist *in, ax_tlist *out) {
  conv2d *L = m->priv;
  ax_tensor *x = in->n > 0 ? in->t[0] : NULL; // (N, in, H, W)
  ax_conv_desc d;
  AX_TRY(conv_desc(L, x, &d));
  int64_t shape[4] = {d.n, d.k, d.oh, d.ow};
  ax_tensor *y = ax_tensor_new(AX_F32, 4, shape, x->device); // (N, out, OH, OW)
  if (!y)
    return AX_ENOMEM;
  ax_backend *be = ax_backend_of(x->device);
  int rc = AX_K(be, conv2d_fwd, &d, ax_f32(x), ax_param(m, ex, 0), ax_f32(y));
  if (rc == AX_OK && L->bias)
    rc = AX_K(be, bias_add, ax_f32(y),
              ax_param(m, ex, (size_t)L->out * L->in * L->k * L->k), d.n, d.k,
              d.oh * d.ow);
  if (rc != AX_OK) {
    ax_tensor_release(y);
    return rc;
  }
  if (slot) {
    ax_slot_put(slot, SAVE_X, x);
    ax_slot_put(slot, SAVE_DY, NULL);
  }
  *out = ax_tlist1(y);
  return AX_OK;
}

/* The saved input and its geometry; AX_ESTATE unless the slot is between
 * forward and the input half (want_dy = 0) or between the halves (1). */
static int conv_state(const conv2d *L, ax_slot *slot, int want_dy,
                      ax_tensor **x, ax_conv_desc *d) {
  *x = ax_slot_get(slot, SAVE_X); // (N, in, H, W)
  int has_dy = ax_slot_get(slot, SAVE_DY) != NULL;
  if (!*x || has_dy != want_dy)
    return ax_seterr(AX_ESTATE, "conv2d(%d->%d): %s", L->in, L->out,
                     !*x       ? "backward without forward"
                     : want_dy ? "weight half without input half"
                               : "input half ran twice");
  return conv_desc(L, *x, d);
}

static int conv_backward_input(ax_module *m, const ax_exec *ex, ax_slot *slot,
                               const ax_tlist *dout, ax_tlist *din) {
  conv2d *L = m->priv;
  ax_tensor *x, *dy = dout->n > 0 ? dout->t[0] : NULL; // (N, out, OH, OW)
  ax_conv_desc d;
  AX_TRY(conv_state(L, slot, 0, &x, &d));
  char b[64];
  if (!dy || dy->dtype != AX_F32 || dy->ndim != 4 || dy->shape[0] != d.n ||
      dy->shape[1] != d.k || dy->shape[2] != d.oh || dy->shape[3] != d.ow)
    return ax_seterr(AX_ESHAPE,
                     "conv2d(%d->%d): expected gradient (%d, %d, %d, %d), "
                     "got %s",
                     L->in, L->out, d.n, d.k, d.oh, d.ow,
                     dy ? ax_tensor_shape_str(dy, b, sizeof b) : "none");
  din->n = 1;
  din->t[0] = NULL;
  if (ex->need_dx) {
    ax_tensor *dx = ax_tensor_like(x);
    if (!dx)
      return AX_ENOMEM;
    int rc = AX_K(ax_backend_of(x->device), conv2d_bwd_data, &d, ax_f32(dy),
                  ax_param(m, ex, 0), ax_f32(dx));
    if (rc != AX_OK) {
      ax_tensor_release(dx);
      return rc;
    }
    din->t[0] = dx;
  }
  ax_slot_put(slot, SAVE_DY, dy);
  return AX_OK;
}

static int conv_backward_weight(ax_module *m, const ax_exec *ex,
                                ax_slot *slot) {
  conv2d *L = m->priv;
  ax_tensor *x, *dy = ax_slot_get(slot, SAVE_DY); // (N, out, OH, OW)
  ax_conv_desc d;
  AX_TRY(conv_state(L, slot, 1, &x, &d));
  ax_backend *be = ax_backend_of(x->device);
  AX_TRY(AX_K(be, conv2d_bwd_filter, &d, ax_f32(x), ax_f32(dy),
              ax_grad(m, ex, 0)));
  if (L->bias)
    AX_TRY(AX_K(be, bias_grad, ax_f32(dy),
                ax_grad(m, ex, (size_t)L->out * L->in * L->k * L->k), d.n, d.k,
                d.oh * d.ow));
  ax_slot_put(slot, SAVE_X, NULL);
  ax_slot_put(slot, SAVE_DY, NULL);
  return AX_OK;
}

/* Kaiming normal (fan_in, gain sqrt(2)) weights as PyTorch's ResNet inits;
 * PyTorch's default uniform bias. */
static void conv_init(ax_module *m, float *params, float *buffers,
                      ax_rng *rng) {
  conv2d *L = m->priv;
  int fan_in = L->in * L->k * L->k;
  size_t nw = (size_t)L->out * fan_in;
  float std = sqrtf(2.0f / (float)fan_in);
  for (size_t i = 0; i < nw; i++)
    params[i] = std * (float)ax_rng_normal(rng);
  float bound = 1.0f / sqrtf((float)fan_in);
  for (int i = 0; L->bias && i < L->out; i++)
    params[nw + (size_t)i] = bound * (float)(2.0 * ax_rng_uniform(rng) - 1.0);
}

static const ax_module_ops conv_ops = {
    /* .kind = */ "conv2d",
    /* .forward = */ conv_forward,
    /* .backward = */ NULL, /* the halves back to back */
    /* .init = */ conv_init,
    /* .destroy = */ NULL,
    /* .backward_input = */ conv_backward_input,
    /* .backward_weight = */ conv_backward_weight,
};

ax_module *ax_conv2d_new(int in, int out, int kernel, int stride, int padding,
                         int bias) {
  if (in <= 0 || out <= 0 || kernel <= 0 || stride <= 0 || padding < 0) {
    ax_seterr(AX_EINVAL,
              "conv2d: bad configuration in=%d out=%d kernel=%d stride=%d "
              "padding=%d",
              in, out, kernel, stride, padding);
    return NULL;
  }
  ax_module *m = ax_module_new(&conv_ops, sizeof(conv2d));
  if (!m) {
    ax_seterr(AX_ENOMEM, "conv2d: out of memory");
    return NULL;
  }
  conv2d *L = m->priv;
  *L = (conv2d){in, out, kernel, stride, padding, bias != 0};
  m->n_params = (size_t)out * in * kernel * kernel + (bias ? (size_t)out : 0);
  return m;
}
