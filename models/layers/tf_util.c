/* Helpers shared by the transformer layers: initialisation, argument
 * checks, elementwise sums, calls into child modules and chains of them. */
#include "axon/models/layers/tf-impl.h"

#include "axon/kernels/error.h"

void axi_tf_normal(float *p, size_t n, float std, ax_rng *rng) {
  for (size_t i = 0; i < n; i++)
    p[i] = (float)(std * ax_rng_normal(rng));
}

int axi_tf_check_in(const char *kind, const ax_tlist *in, int n) {
  if (in->n < n)
    return ax_seterr(AX_EINVAL, "%s: expected %d input tensor%s, got %d", kind,
                     n, n > 1 ? "s" : "", in->n);
  for (int i = 0; i < n; i++)
    if (!in->t[i])
      return ax_seterr(AX_EINVAL, "%s: input %d is missing", kind, i);
  if (in->t[0]->dtype != AX_F32)
    return ax_seterr(AX_EDTYPE, "%s: input must be f32, got %s", kind,
                     ax_dtype_name(in->t[0]->dtype));
  return AX_OK;
}

int axi_tf_no_state(const char *kind) {
  return ax_seterr(AX_ESTATE, "%s: backward without a saved forward", kind);
}

ax_tensor *axi_tf_new(int ndim, const int64_t *shape, ax_device dev) {
  return ax_tensor_new(AX_F32, ndim, shape, dev);
}

int axi_tf_add(const ax_tensor *a, const ax_tensor *b, ax_tensor **out) {
  *out = NULL;
  size_t n = ax_tensor_numel(a);
  if (n != ax_tensor_numel(b))
    return ax_seterr(AX_ESHAPE, "add: %zu elements plus %zu", n,
                     ax_tensor_numel(b));
  ax_tensor *y = ax_tensor_like(a);
  if (!y)
    return AX_ENOMEM;
  ax_backend *be = ax_backend_of(a->device);
  int rc = AX_K(be, copy, y->data, a->data, n * sizeof(float));
  if (rc == AX_OK)
    rc = AX_K(be, axpby, n, 1.0f, ax_f32(b), 1.0f, ax_f32(y));
  if (rc != AX_OK) {
    ax_tensor_release(y);
    return rc;
  }
  *out = y;
  return AX_OK;
}

int axi_tf_child_fwd(ax_module *m, int i, const ax_exec *ex, ax_slot *slot,
                     ax_tensor *x, ax_tensor **y) {
  *y = NULL;
  ax_slot *cs = NULL;
  if (slot && !(cs = ax_slot_child(slot, i)))
    return AX_ENOMEM;
  ax_tlist in = ax_tlist1(x), out = {0};
  AX_TRY(ax_forward(m->children[i], ex, cs, &in, &out));
  if (out.n < 1 || !out.t[0]) {
    ax_tlist_clear(&out);
    return ax_seterr(AX_EINTERNAL, "%s: child %d returned no output",
                     m->ops->kind, i);
  }
  *y = out.t[0];
  out.t[0] = NULL;
  ax_tlist_clear(&out);
  return AX_OK;
}

int axi_tf_child_bwd(ax_bwd_part part, ax_module *m, int i, const ax_exec *ex,
                     ax_slot *slot, int need_dx, ax_tensor *dy,
                     ax_tensor **dx) {
  *dx = NULL;
  ax_slot *cs = ax_slot_child(slot, i);
  if (!cs)
    return AX_ENOMEM;
  ax_exec cex = *ex;
  cex.need_dx = need_dx;
  ax_tlist dout = ax_tlist1(dy), din = {0};
  AX_TRY(ax_backward_part(part, m->children[i], &cex, cs, &dout, &din));
  if (need_dx && din.n >= 1) {
    *dx = din.t[0];
    din.t[0] = NULL;
  }
  ax_tlist_clear(&din);
  if (need_dx && !*dx)
    return ax_seterr(AX_EINTERNAL, "%s: child %d returned no gradient",
                     m->ops->kind, i);
  return AX_OK;
}

void axi_tf_tmp_free(ax_tensor **t, int n) {
  for (int i = 0; i < n; i++) {
    ax_tensor_release(t[i]);
    t[i] = NULL;
  }
}

int axi_tf_chain_fwd(ax_module *m, const ax_exec *ex, ax_slot *slot, int first,
                     int last, ax_tensor *x, ax_tensor **t) {
  for (int i = first; i <= last; i++, x = t[i - 1])
    AX_TRY(axi_tf_child_fwd(m, i, ex, slot, x, &t[i]));
  return AX_OK;
}

int axi_tf_chain_bwd(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                     ax_slot *slot, int first, int last, int need_dx,
                     ax_tensor *dy, ax_tensor **g) {
  for (int i = last; i >= first; dy = g[i--])
    AX_TRY(axi_tf_child_bwd(part, m, i, ex, slot, i > first || need_dx, dy,
                            &g[i]));
  return AX_OK;
}

int axi_tf_add_parts(ax_module *m, ax_module **parts, int n) {
  int rc = AX_OK;
  for (int i = 0; i < n; i++) {
    if (rc == AX_OK)
      rc = ax_module_add(m, parts[i]); /* frees parts[i] on failure */
    else
      ax_module_free(parts[i]);
  }
  return rc;
}
