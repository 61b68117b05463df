/* BatchNorm2d: per-channel normalisation of (N, C, H, W) or (N, C), and the
 * same followed by a ReLU in one module (ax_batchnorm2d_relu_new), which runs
 * the backend's fused kernels when it has them and the separate ones when it
 * does not. */
#include <stdio.h>

#include "axon/kernels/backend-impl.h"
#include "axon/models/layers/vision.h"

typedef struct batchnorm {
  int c;
  float momentum, eps;
  int relu; /* a ReLU follows the normalisation */
} batchnorm;

/* Saved tensors (the output only with relu), and integer flags in the slot.
 * Forward saves x, the batch statistics and (with relu) y; the input half
 * drops them and keeps only the per-channel sums (2, C) that ARE the
 * parameter gradients, {sum dy * xhat, sum dy}, for the weight half. */
enum { SAVE_X = 0, SAVE_STATS = 1, SAVE_Y = 2, SAVE_DSUM = 3 };
enum { FLAG_EVAL = 0 };

/* Checks x and returns its batch size n and plane size hw. */
static int bn_shape(const batchnorm *L, const ax_tensor *x, int *n, int *hw) {
  char b[64];
  if (!x || x->dtype != AX_F32 || (x->ndim != 4 && x->ndim != 2) ||
      x->shape[1] != L->c || x->shape[0] <= 0)
    return ax_seterr(AX_ESHAPE,
                     "batchnorm2d(%d): expected input (N, %d, H, W) or "
                     "(N, %d), got %s",
                     L->c, L->c, L->c,
                     x ? ax_tensor_shape_str(x, b, sizeof b) : "none");
  *n = (int)x->shape[0];
  *hw = x->ndim == 4 ? (int)(x->shape[2] * x->shape[3]) : 1;
  if (*hw <= 0)
    return ax_seterr(AX_ESHAPE, "batchnorm2d(%d): empty planes in %s", L->c,
                     ax_tensor_shape_str(x, b, sizeof b));
  return AX_OK;
}

static int bn_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                      const ax_tlist *in, ax_tlist *out) {
  batchnorm *L = m->priv;
  ax_tensor *x = in->n > 0 ? in->t[0] : NULL; // (N, C, H, W)
  int n, hw;
  AX_TRY(bn_shape(L, x, &n, &hw));
  if (!ex->buffers)
    return ax_seterr(AX_EINVAL, "batchnorm2d(%d): exec has no buffers", L->c);
  ax_backend *be = ax_backend_of(x->device);
  const float *gamma = ax_param(m, ex, 0), *beta = ax_param(m, ex, L->c);
  float *run_mean = ax_buffer(m, ex, 0), *run_var = ax_buffer(m, ex, L->c);
  ax_tensor *y = ax_tensor_like(x);
  if (!y)
    return AX_ENOMEM;
  int rc;
  if (!ex->training) {
    rc = AX_K(be, bn_fwd_eval, n, L->c, hw, ax_f32(x), gamma, beta, run_mean,
              run_var, L->eps, ax_f32(y));
    if (rc == AX_OK && L->relu)
      rc = AX_K(be, relu_fwd, ax_tensor_numel(y), ax_f32(y), ax_f32(y));
    if (rc == AX_OK && slot) {
      ax_slot_put(slot, SAVE_X, NULL);
      ax_slot_put(slot, SAVE_STATS, NULL);
      ax_slot_put(slot, SAVE_Y, NULL);
      ax_slot_put(slot, SAVE_DSUM, NULL);
      ax_slot_set_int(slot, FLAG_EVAL, 1);
    }
  } else {
    int64_t sshape[2] = {2, L->c};
    ax_tensor *stats = ax_tensor_new(AX_F32, 2, sshape, x->device); // (2, C)
    if (!stats) {
      ax_tensor_release(y);
      return AX_ENOMEM;
    }
    int upd = ex->update_stats != 0;
    if (L->relu && be->iface.bn_relu_fwd_train) {
      rc = AX_K(be, bn_relu_fwd_train, n, L->c, hw, ax_f32(x), gamma, beta,
                ax_f32(y), ax_f32(stats), ax_f32(stats) + L->c,
                upd ? run_mean : NULL, upd ? run_var : NULL, L->momentum,
                L->eps);
    } else {
      rc =
          AX_K(be, bn_fwd_train, n, L->c, hw, ax_f32(x), gamma, beta, ax_f32(y),
               ax_f32(stats), ax_f32(stats) + L->c, upd ? run_mean : NULL,
               upd ? run_var : NULL, L->momentum, L->eps);
      if (rc == AX_OK && L->relu)
        rc = AX_K(be, relu_fwd, ax_tensor_numel(y), ax_f32(y), ax_f32(y));
    }
    if (rc == AX_OK && slot) {
      ax_slot_put(slot, SAVE_X, x);
      ax_slot_put(slot, SAVE_STATS, stats);
      ax_slot_put(slot, SAVE_Y, L->relu ? y : NULL);
      ax_slot_put(slot, SAVE_DSUM, NULL);
      ax_slot_set_int(slot, FLAG_EVAL, 0);
    }
    ax_tensor_release(stats);
  }
  if (rc != AX_OK) {
    ax_tensor_release(y);
    if (rc == AX_ESHAPE) {
      char msg[192];
      snprintf(msg, sizeof msg, "%s", ax_errmsg());
      return ax_seterr(rc, "batchnorm2d(%d): %s", L->c, msg);
    }
    return rc;
  }
  *out = ax_tlist1(y);
  return AX_OK;
}

static int bn_backward_input(ax_module *m, const ax_exec *ex, ax_slot *slot,
                             const ax_tlist *dout, ax_tlist *din) {
  batchnorm *L = m->priv;
  ax_tensor *x = ax_slot_get(slot, SAVE_X);         // (N, C, H, W)
  ax_tensor *stats = ax_slot_get(slot, SAVE_STATS); // (2, C)
  ax_tensor *y = ax_slot_get(slot, SAVE_Y);         // like x, with relu
  ax_tensor *dy = dout->n > 0 ? dout->t[0] : NULL;  // like x
  if (!x || !stats || (L->relu && !y)) {
    if (ax_slot_int(slot, FLAG_EVAL))
      return ax_seterr(AX_EUNSUPPORTED,
                       "batchnorm2d(%d): no backward after an eval-mode "
                       "forward",
                       L->c);
    return ax_seterr(AX_ESTATE, "batchnorm2d(%d): %s", L->c,
                     ax_slot_get(slot, SAVE_DSUM) ? "input half ran twice"
                                                  : "backward without forward");
  }
  char b[64], b2[64];
  if (!dy || dy->dtype != AX_F32 || !ax_tensor_same_shape(dy, x))
    return ax_seterr(AX_ESHAPE, "batchnorm2d(%d): expected gradient %s, got %s",
                     L->c, ax_tensor_shape_str(x, b, sizeof b),
                     dy ? ax_tensor_shape_str(dy, b2, sizeof b2) : "none");
  int n, hw;
  AX_TRY(bn_shape(L, x, &n, &hw));
  ax_backend *be = ax_backend_of(x->device);
  /* The kernel always writes dx (dropped when not needed) and accumulates
   * the parameter gradients, here into zeroed sums of this slot. */
  int64_t sshape[2] = {2, L->c};
  ax_tensor *dx = ax_tensor_like(x);
  ax_tensor *dsum = ax_tensor_new(AX_F32, 2, sshape, x->device); // (2, C)
  int rc = dx && dsum ? AX_OK : AX_ENOMEM;
  if (rc == AX_OK)
    rc = AX_K(be, fill, ax_f32(dsum), 2 * (size_t)L->c, 0.0f);
  float *dgamma = ax_f32(dsum), *dbeta = dgamma + L->c;
  if (rc == AX_OK && L->relu && be->iface.bn_relu_bwd) {
    rc = AX_K(be, bn_relu_bwd, n, L->c, hw, ax_f32(x), ax_f32(y), ax_f32(dy),
              ax_param(m, ex, 0), ax_f32(stats), ax_f32(stats) + L->c,
              ax_f32(dx), dgamma, dbeta);
  } else if (rc == AX_OK) {
    /* Unfused: the ReLU's gradient goes to a temporary g first. */
    ax_tensor *g = L->relu ? ax_tensor_like(x) : NULL;
    rc = L->relu && !g ? AX_ENOMEM : AX_OK;
    if (rc == AX_OK && g)
      rc = AX_K(be, relu_bwd, ax_tensor_numel(y), ax_f32(y), ax_f32(dy),
                ax_f32(g));
    if (rc == AX_OK)
      rc = AX_K(be, bn_bwd, n, L->c, hw, ax_f32(x), ax_f32(g ? g : dy),
                ax_param(m, ex, 0), ax_f32(stats), ax_f32(stats) + L->c,
                ax_f32(dx), dgamma, dbeta);
    ax_tensor_release(g);
  }
  if (rc == AX_OK) {
    ax_slot_put(slot, SAVE_X, NULL);
    ax_slot_put(slot, SAVE_STATS, NULL);
    ax_slot_put(slot, SAVE_Y, NULL);
    ax_slot_put(slot, SAVE_DSUM, dsum);
  }
  ax_tensor_release(dsum);
  if (rc != AX_OK) {
    ax_tensor_release(dx);
    return rc;
  }
  din->n = 1;
  din->t[0] = NULL;
  if (ex->need_dx)
    din->t[0] = dx;
  else
    ax_tensor_release(dx);
  return AX_OK;
}

/* gamma's and beta's gradients lie side by side, as the sums do. */
static int bn_backward_weight(ax_module *m, const ax_exec *ex, ax_slot *slot) {
  batchnorm *L = m->priv;
  ax_tensor *dsum = ax_slot_get(slot, SAVE_DSUM); // (2, C)
  if (!dsum)
    return ax_seterr(AX_ESTATE,
                     "batchnorm2d(%d): weight half without input "
                     "half",
                     L->c);
  AX_TRY(AX_K(ax_backend_of(dsum->device), axpby, 2 * (size_t)L->c, 1.0f,
              ax_f32(dsum), 1.0f, ax_grad(m, ex, 0)));
  ax_slot_put(slot, SAVE_DSUM, NULL);
  return AX_OK;
}

static void bn_init(ax_module *m, float *params, float *buffers, ax_rng *rng) {
  batchnorm *L = m->priv;
  for (int i = 0; i < L->c; i++) {
    params[i] = 1.0f;        /* gamma */
    params[L->c + i] = 0.0f; /* beta */
  }
  if (!buffers)
    return;
  for (int i = 0; i < L->c; i++) {
    buffers[i] = 0.0f;        /* running mean */
    buffers[L->c + i] = 1.0f; /* running variance */
  }
}

static const ax_module_ops bn_ops = {
    /* .kind = */ "batchnorm2d",
    /* .forward = */ bn_forward,
    /* .backward = */ NULL, /* the halves back to back */
    /* .init = */ bn_init,
    /* .destroy = */ NULL,
    /* .backward_input = */ bn_backward_input,
    /* .backward_weight = */ bn_backward_weight,
};

static ax_module *bn_new(int channels, float momentum, float eps, int relu) {
  if (channels <= 0 || !(momentum >= 0.0f && momentum <= 1.0f) ||
      !(eps > 0.0f)) {
    ax_seterr(AX_EINVAL,
              "batchnorm2d: bad configuration channels=%d momentum=%g "
              "eps=%g",
              channels, (double)momentum, (double)eps);
    return NULL;
  }
  ax_module *m = ax_module_new(&bn_ops, sizeof(batchnorm));
  if (!m) {
    ax_seterr(AX_ENOMEM, "batchnorm2d: out of memory");
    return NULL;
  }
  batchnorm *L = m->priv;
  *L = (batchnorm){channels, momentum, eps, relu};
  m->n_params = 2 * (size_t)channels;
  m->n_buffers = 2 * (size_t)channels;
  return m;
}

ax_module *ax_batchnorm2d_new(int channels, float momentum, float eps) {
  return bn_new(channels, momentum, eps, 0);
}

ax_module *ax_batchnorm2d_relu_new(int channels, float momentum, float eps) {
  return bn_new(channels, momentum, eps, 1);
}
