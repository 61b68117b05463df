/* Embedding lookup and layer normalisation layers. */
#include "axon/models/layers/tf-impl.h"

#include "axon/kernels/error.h"

/* ---- embedding ---- */

typedef struct emb_priv {
  int rows, dim;
} emb_priv;

static int emb_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                       const ax_tlist *in, ax_tlist *out) {
  emb_priv *p = m->priv;
  if (in->n < 1 || !in->t[0])
    return ax_seterr(AX_EINVAL, "embedding: missing the ids");
  ax_tensor *ids = in->t[0]; // (...) i32
  if (ids->dtype != AX_I32)
    return ax_seterr(AX_EDTYPE, "embedding: ids must be i32, got %s",
                     ax_dtype_name(ids->dtype));
  if (ids->ndim >= AX_MAX_DIMS)
    return ax_seterr(AX_ESHAPE, "embedding: ids have too many dimensions (%d)",
                     ids->ndim);
  int64_t shape[AX_MAX_DIMS];
  for (int i = 0; i < ids->ndim; i++)
    shape[i] = ids->shape[i];
  shape[ids->ndim] = p->dim;
  ax_tensor *y = axi_tf_new(ids->ndim + 1, shape, ids->device); // (..., dim)
  if (!y)
    return AX_ENOMEM;
  ax_backend *be = ax_backend_of(ids->device);
  int rc = AX_K(be, embedding_fwd, (int)ax_tensor_numel(ids), p->dim, p->rows,
                ax_i32(ids), ax_param(m, ex, 0), ax_f32(y));
  if (rc != AX_OK) {
    ax_tensor_release(y);
    return rc;
  }
  if (slot) {
    ax_slot_put(slot, 0, ids);
    ax_slot_put(slot, 1, NULL);
  }
  *out = ax_tlist1(y);
  return AX_OK;
}

/* Slot: 0 = ids from forward until the weight half, 1 = the output
 * gradient (in the exec's precision, ax_slot_put_act) from the input half
 * until the weight half (the table's gradient is a scatter-add of it at
 * the ids). */
static int emb_backward_input(ax_module *m, const ax_exec *ex, ax_slot *slot,
                              const ax_tlist *dout, ax_tlist *din) {
  emb_priv *p = m->priv;
  ax_tensor *ids = ax_slot_get(slot, 0);
  if (!ids || ax_slot_get(slot, 1))
    return ids ? ax_seterr(AX_ESTATE, "embedding: input half ran twice")
               : axi_tf_no_state("embedding");
  AX_TRY(axi_tf_check_in("embedding", dout, 1));
  ax_tensor *dy = dout->t[0]; // (..., dim)
  size_t n = ax_tensor_numel(ids);
  if (ax_tensor_numel(dy) != n * (size_t)p->dim)
    return ax_seterr(AX_ESHAPE,
                     "embedding: gradient has %zu elements, "
                     "expected %zu x %d",
                     ax_tensor_numel(dy), n, p->dim);
  AX_TRY(ax_slot_put_act(slot, 1, ex, dy));
  if (ex->need_dx) { /* integer ids have no gradient: one NULL entry */
    din->n = 1;
    din->t[0] = NULL;
  }
  return AX_OK;
}

static int emb_backward_weight(ax_module *m, const ax_exec *ex, ax_slot *slot) {
  emb_priv *p = m->priv;
  ax_tensor *ids = ax_slot_get(slot, 0), *dy = ax_slot_get(slot, 1);
  if (!ids || !dy)
    return ax_seterr(AX_ESTATE, "embedding: weight half without input half");
  ax_tensor *dyf = NULL;
  AX_TRY(ax_slot_get_f32(slot, 1, &dyf));
  int rc =
      AX_K(ax_backend_of(dy->device), embedding_bwd, (int)ax_tensor_numel(ids),
           p->dim, ax_i32(ids), ax_f32(dyf), ax_grad(m, ex, 0));
  ax_tensor_release(dyf);
  AX_TRY(rc);
  ax_slot_put(slot, 0, NULL); /* the weight half consumes the saved state */
  ax_slot_put(slot, 1, NULL);
  return AX_OK;
}

static void emb_init(ax_module *m, float *params, float *buffers, ax_rng *rng) {
  axi_tf_normal(params, m->n_params, AX_BERT_INIT_STD, rng);
}

static const ax_module_ops emb_ops = {
    /* .kind = */ "embedding",
    /* .forward = */ emb_forward,
    /* .backward = */ NULL, /* the halves back to back */
    /* .init = */ emb_init,
    /* .destroy = */ NULL,
    /* .backward_input = */ emb_backward_input,
    /* .backward_weight = */ emb_backward_weight,
};

ax_module *ax_embedding_new(int rows, int dim) {
  if (rows <= 0 || dim <= 0) {
    ax_seterr(AX_EINVAL, "embedding: bad table shape (%d, %d)", rows, dim);
    return NULL;
  }
  ax_module *m = ax_module_new(&emb_ops, sizeof(emb_priv));
  if (!m) {
    ax_seterr(AX_ENOMEM, "embedding: no memory");
    return NULL;
  }
  emb_priv *p = m->priv;
  p->rows = rows;
  p->dim = dim;
  m->n_params = (size_t)rows * dim;
  return m;
}

/* ---- layer norm ---- */

typedef struct ln_priv {
  int dim;
  float eps;
} ln_priv;

/* Parameter layout: gamma (dim) at 0, beta (dim) at dim. Slot: 0 = x (in
 * the exec's precision, ax_slot_put_act), 1 = mean (rows), 2 = rstd (rows,
 * f32 both) from forward until the input half, which
 * drops them and keeps 3 = the sums (2, dim) {sum dy * xhat, sum dy} that
 * ARE the parameter gradients, for the weight half. */
enum { LN_X = 0, LN_MEAN = 1, LN_RSTD = 2, LN_DSUM = 3 };

static int ln_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                      const ax_tlist *in, ax_tlist *out) {
  ln_priv *p = m->priv;
  AX_TRY(axi_tf_check_in("layernorm", in, 1));
  ax_tensor *x = in->t[0]; // (..., dim)
  char b[96];
  if (x->ndim < 1 || x->shape[x->ndim - 1] != p->dim)
    return ax_seterr(AX_ESHAPE, "layernorm: input %s must end in %d features",
                     ax_tensor_shape_str(x, b, sizeof b), p->dim);
  int64_t rows = (int64_t)(ax_tensor_numel(x) / (size_t)p->dim);
  ax_tensor *y = ax_tensor_like(x);
  ax_tensor *mean = axi_tf_new(1, &rows, x->device); // (rows)
  ax_tensor *rstd = axi_tf_new(1, &rows, x->device); // (rows)
  int rc = y && mean && rstd ? AX_OK : AX_ENOMEM;
  if (rc == AX_OK) {
    ax_backend *be = ax_backend_of(x->device);
    rc = AX_K(be, layernorm_fwd, (int)rows, p->dim, ax_f32(x),
              ax_param(m, ex, 0), ax_param(m, ex, (size_t)p->dim), p->eps,
              ax_f32(y), ax_f32(mean), ax_f32(rstd));
  }
  if (rc == AX_OK && slot)
    rc = ax_slot_put_act(slot, LN_X, ex, x);
  if (rc == AX_OK && slot) {
    ax_slot_put(slot, LN_MEAN, mean);
    ax_slot_put(slot, LN_RSTD, rstd);
    ax_slot_put(slot, LN_DSUM, NULL);
  }
  ax_tensor_release(mean);
  ax_tensor_release(rstd);
  if (rc != AX_OK) {
    ax_tensor_release(y);
    return rc;
  }
  *out = ax_tlist1(y);
  return AX_OK;
}

static int ln_backward_input(ax_module *m, const ax_exec *ex, ax_slot *slot,
                             const ax_tlist *dout, ax_tlist *din) {
  ln_priv *p = m->priv;
  ax_tensor *x = ax_slot_get(slot, LN_X), *mean = ax_slot_get(slot, LN_MEAN),
            *rstd = ax_slot_get(slot, LN_RSTD);
  if (!x || !mean || !rstd)
    return ax_slot_get(slot, LN_DSUM)
               ? ax_seterr(AX_ESTATE, "layernorm: input half ran twice")
               : axi_tf_no_state("layernorm");
  AX_TRY(axi_tf_check_in("layernorm", dout, 1));
  ax_tensor *dy = dout->t[0]; // (..., dim)
  if (ax_tensor_numel(dy) != ax_tensor_numel(x))
    return ax_seterr(AX_ESHAPE,
                     "layernorm: gradient has %zu elements, "
                     "expected %zu",
                     ax_tensor_numel(dy), ax_tensor_numel(x));
  /* One pass makes dx and the parameter sums (into zeroed sums of this
   * slot); dx is dropped when the caller does not want it. */
  int64_t sshape[2] = {2, p->dim};
  ax_tensor *xf = NULL; /* the saved input as f32 */
  AX_TRY(ax_slot_get_f32(slot, LN_X, &xf));
  ax_tensor *dx = ax_tensor_like(xf);
  ax_tensor *dsum = axi_tf_new(2, sshape, x->device); // (2, dim)
  int rc = dx && dsum ? AX_OK : AX_ENOMEM;
  ax_backend *be = ax_backend_of(x->device);
  if (rc == AX_OK)
    rc = AX_K(be, fill, ax_f32(dsum), 2 * (size_t)p->dim, 0.0f);
  if (rc == AX_OK)
    rc = AX_K(be, layernorm_bwd, (int)ax_tensor_numel(mean), p->dim, ax_f32(xf),
              ax_f32(dy), ax_param(m, ex, 0), ax_f32(mean), ax_f32(rstd),
              ax_f32(dx), ax_f32(dsum), ax_f32(dsum) + p->dim);
  ax_tensor_release(xf);
  if (rc == AX_OK) { /* the sums replace the forward's state */
    ax_slot_put(slot, LN_X, NULL);
    ax_slot_put(slot, LN_MEAN, NULL);
    ax_slot_put(slot, LN_RSTD, NULL);
    ax_slot_put(slot, LN_DSUM, dsum);
  }
  ax_tensor_release(dsum);
  if (rc != AX_OK || !ex->need_dx) {
    ax_tensor_release(dx);
    return rc;
  }
  *din = ax_tlist1(dx);
  return AX_OK;
}

/* gamma's and beta's gradients lie side by side, as the sums do. */
static int ln_backward_weight(ax_module *m, const ax_exec *ex, ax_slot *slot) {
  ln_priv *p = m->priv;
  ax_tensor *dsum = ax_slot_get(slot, LN_DSUM); // (2, dim)
  if (!dsum)
    return ax_seterr(AX_ESTATE, "layernorm: weight half without input half");
  AX_TRY(AX_K(ax_backend_of(dsum->device), axpby, 2 * (size_t)p->dim, 1.0f,
              ax_f32(dsum), 1.0f, ax_grad(m, ex, 0)));
  ax_slot_put(slot, LN_DSUM, NULL);
  return AX_OK;
}

static void ln_init(ax_module *m, float *params, float *buffers, ax_rng *rng) {
  ln_priv *p = m->priv;
  for (int i = 0; i < p->dim; i++) {
    params[i] = 1.0f;
    params[p->dim + i] = 0.0f;
  }
}

static const ax_module_ops ln_ops = {
    /* .kind = */ "layernorm",
    /* .forward = */ ln_forward,
    /* .backward = */ NULL, /* the halves back to back */
    /* .init = */ ln_init,
    /* .destroy = */ NULL,
    /* .backward_input = */ ln_backward_input,
    /* .backward_weight = */ ln_backward_weight,
};

ax_module *ax_layernorm_new(int dim, float eps) {
  if (dim <= 0 || !(eps > 0.0f)) {
    ax_seterr(AX_EINVAL, "layernorm: bad configuration dim=%d eps=%g", dim,
              (double)eps);
    return NULL;
  }
  ax_module *m = ax_module_new(&ln_ops, sizeof(ln_priv));
  if (!m) {
    ax_seterr(AX_ENOMEM, "layernorm: no memory");
    return NULL;
  }
  ln_priv *p = m->priv;
  p->dim = dim;
  p->eps = eps;
  m->n_params = 2 * (size_t)dim;
  return m;
}
