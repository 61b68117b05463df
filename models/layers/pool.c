/* Pooling layers: MaxPool2d, AvgPool2d (count_include_pad) and
 * GlobalAvgPool (N, C, H, W) -> (N, C). */
#include "axon/kernels/backend-impl.h"
#include "axon/models/layers/vision.h"

typedef struct pool2d {
  int k, stride, pad;
  int is_max; /* max pooling, else average */
  int global; /* window = whole plane, output (N, C) */
} pool2d;

/* Saved state: the argmax of max pooling, the input shape as integers. */
enum { SAVE_ARGMAX = 0 };
enum { INT_N = 0, INT_C, INT_H, INT_W, INT_DONE };

static const char *pool_name(const pool2d *P) {
  return P->global ? "global_avgpool" : P->is_max ? "maxpool2d" : "avgpool2d";
}

/* The pooling geometry of an (n, c, h, w) input. */
static int pool_desc(const pool2d *P, int64_t n, int64_t c, int64_t h,
                     int64_t w, ax_pool_desc *d) {
  *d = (ax_pool_desc){0};
  d->n = (int)n;
  d->c = (int)c;
  d->h = (int)h;
  d->w = (int)w;
  d->kh = P->global ? d->h : P->k;
  d->kw = P->global ? d->w : P->k;
  d->stride = P->global ? 1 : P->stride;
  d->pad = P->global ? 0 : P->pad;
  /* The explicit size test also covers a negative (h + 2p - k) that C
   * division by the stride would round up to 0. */
  if (d->h + 2 * d->pad < d->kh || d->w + 2 * d->pad < d->kw ||
      ax_pool_desc_init(d) != AX_OK)
    return ax_seterr(AX_ESHAPE,
                     "%s(k=%d, s=%d, p=%d): input (%lld, %lld, %lld, %lld) is "
                     "too small for the window",
                     pool_name(P), P->k, P->stride, P->pad, (long long)n,
                     (long long)c, (long long)h, (long long)w);
  return AX_OK;
}

static int pool_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                        const ax_tlist *in, ax_tlist *out) {
  pool2d *P = m->priv;
  ax_tensor *x = in->n > 0 ? in->t[0] : NULL; // (N, C, H, W)
  char b[64];
  if (!x || x->dtype != AX_F32 || x->ndim != 4 || x->shape[0] <= 0 ||
      x->shape[1] <= 0 || x->shape[2] <= 0 || x->shape[3] <= 0)
    return ax_seterr(AX_ESHAPE, "%s: expected input (N, C, H, W), got %s",
                     pool_name(P),
                     x ? ax_tensor_shape_str(x, b, sizeof b) : "none");
  ax_pool_desc d;
  AX_TRY(pool_desc(P, x->shape[0], x->shape[1], x->shape[2], x->shape[3], &d));
  int64_t shape[4] = {d.n, d.c, d.oh, d.ow};
  ax_tensor *y = ax_tensor_new(AX_F32, P->global ? 2 : 4, shape, x->device);
  ax_tensor *am = NULL;
  if (y && P->is_max)
    am = ax_tensor_new(AX_I32, 4, shape, x->device); // (N, C, OH, OW)
  if (!y || (P->is_max && !am)) {
    ax_tensor_release(y);
    return AX_ENOMEM;
  }
  ax_backend *be = ax_backend_of(x->device);
  int rc = P->is_max
               ? AX_K(be, maxpool_fwd, &d, ax_f32(x), ax_f32(y), ax_i32(am))
               : AX_K(be, avgpool_fwd, &d, ax_f32(x), ax_f32(y));
  if (rc == AX_OK && slot) {
    ax_slot_put(slot, SAVE_ARGMAX, am);
    ax_slot_set_int(slot, INT_N, d.n);
    ax_slot_set_int(slot, INT_C, d.c);
    ax_slot_set_int(slot, INT_H, d.h);
    ax_slot_set_int(slot, INT_W, d.w);
    ax_slot_set_int(slot, INT_DONE, 1);
  }
  ax_tensor_release(am);
  if (rc != AX_OK) {
    ax_tensor_release(y);
    return rc;
  }
  *out = ax_tlist1(y);
  return AX_OK;
}

static int pool_backward_input(ax_module *m, const ax_exec *ex, ax_slot *slot,
                               const ax_tlist *dout, ax_tlist *din) {
  pool2d *P = m->priv;
  ax_tensor *dy = dout->n > 0 ? dout->t[0] : NULL; // like the output
  ax_tensor *am = ax_slot_get(slot, SAVE_ARGMAX);
  if (!ax_slot_int(slot, INT_DONE) || (P->is_max && !am))
    return ax_seterr(AX_ESTATE, "%s: backward without forward", pool_name(P));
  ax_pool_desc d;
  AX_TRY(pool_desc(P, ax_slot_int(slot, INT_N), ax_slot_int(slot, INT_C),
                   ax_slot_int(slot, INT_H), ax_slot_int(slot, INT_W), &d));
  char b[64];
  size_t want = (size_t)d.n * d.c * d.oh * d.ow;
  if (!dy || dy->dtype != AX_F32 || dy->ndim != (P->global ? 2 : 4) ||
      dy->shape[0] != d.n || dy->shape[1] != d.c || ax_tensor_numel(dy) != want)
    return ax_seterr(AX_ESHAPE,
                     "%s: expected gradient (%d, %d, %d, %d), got %s",
                     pool_name(P), d.n, d.c, d.oh, d.ow,
                     dy ? ax_tensor_shape_str(dy, b, sizeof b) : "none");
  din->n = 1;
  din->t[0] = NULL;
  if (ex->need_dx) {
    int64_t shape[4] = {d.n, d.c, d.h, d.w};
    ax_tensor *dx = ax_tensor_new(AX_F32, 4, shape, dy->device);
    if (!dx)
      return AX_ENOMEM;
    ax_backend *be = ax_backend_of(dy->device);
    int rc = P->is_max
                 ? AX_K(be, maxpool_bwd, &d, ax_f32(dy), ax_i32(am), ax_f32(dx))
                 : AX_K(be, avgpool_bwd, &d, ax_f32(dy), ax_f32(dx));
    if (rc != AX_OK) {
      ax_tensor_release(dx);
      return rc;
    }
    din->t[0] = dx;
  }
  ax_slot_put(slot, SAVE_ARGMAX, NULL);
  ax_slot_set_int(slot, INT_DONE, 0);
  return AX_OK;
}

static const ax_module_ops maxpool_ops = {
    /* .kind = */ "maxpool2d",
    /* .forward = */ pool_forward,
    /* .backward = */ NULL, /* the input half alone */
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ pool_backward_input,
    /* .backward_weight = */ NULL, /* no parameters */
};

static const ax_module_ops avgpool_ops = {
    /* .kind = */ "avgpool2d",
    /* .forward = */ pool_forward,
    /* .backward = */ NULL, /* the input half alone */
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ pool_backward_input,
    /* .backward_weight = */ NULL, /* no parameters */
};

static const ax_module_ops global_avgpool_ops = {
    /* .kind = */ "global_avgpool",
    /* .forward = */ pool_forward,
    /* .backward = */ NULL, /* the input half alone */
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ pool_backward_input,
    /* .backward_weight = */ NULL, /* no parameters */
};

static ax_module *pool_new(const ax_module_ops *ops, pool2d cfg) {
  if (!cfg.global &&
      (cfg.k <= 0 || cfg.stride <= 0 || cfg.pad < 0 || 2 * cfg.pad > cfg.k)) {
    ax_seterr(AX_EINVAL,
              "%s: bad configuration kernel=%d stride=%d padding=%d (padding "
              "must be at most half the kernel)",
              ops->kind, cfg.k, cfg.stride, cfg.pad);
    return NULL;
  }
  ax_module *m = ax_module_new(ops, sizeof(pool2d));
  if (!m) {
    ax_seterr(AX_ENOMEM, "%s: out of memory", ops->kind);
    return NULL;
  }
  *(pool2d *)m->priv = cfg;
  return m;
}

ax_module *ax_maxpool2d_new(int kernel, int stride, int padding) {
  return pool_new(&maxpool_ops, (pool2d){kernel, stride, padding, 1, 0});
}

ax_module *ax_avgpool2d_new(int kernel, int stride, int padding) {
  return pool_new(&avgpool_ops, (pool2d){kernel, stride, padding, 0, 0});
}

ax_module *ax_global_avgpool_new(void) {
  return pool_new(&global_avgpool_ops, (pool2d){0, 1, 0, 0, 1});
}
