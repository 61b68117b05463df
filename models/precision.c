/* Mixed precision: the precision's names, the saved activations in the
 * exec's precision, the GEMM in it and the block boundaries' casts
 * (models/precision-impl.h; the rules at the top of models/module.h). */
#include <string.h>

#include "axon/kernels/error.h"
#include "axon/models/precision-impl.h"

static const char *const g_names[AX_PREC_COUNT] = {"fp32", "bf16"};

const char *ax_precision_name(int precision) {
  return precision >= 0 && precision < AX_PREC_COUNT ? g_names[precision]
                                                     : NULL;
}

int ax_precision_parse(const char *s, int *out) {
  for (int i = 0; s && i < AX_PREC_COUNT; i++)
    if (!strcmp(s, g_names[i])) {
      *out = i;
      return AX_OK;
    }
  return ax_seterr(AX_EINVAL, "precision '%s': expected fp32 or bf16",
                   s ? s : "");
}

/* ---- casts ---- */

int axi_prec_cast(const ax_tensor *t, ax_dtype to, ax_tensor **out) {
  *out = NULL;
  if (t->dtype == to) {
    *out = ax_tensor_retain((ax_tensor *)t);
    return AX_OK;
  }
  if (!((t->dtype == AX_F32 && to == AX_BF16) ||
        (t->dtype == AX_BF16 && to == AX_F32)))
    return ax_seterr(AX_EDTYPE, "cast: %s to %s", ax_dtype_name(t->dtype),
                     ax_dtype_name(to));
  ax_tensor *y = ax_tensor_new(to, t->ndim, t->shape, t->device);
  if (!y)
    return AX_ENOMEM;
  ax_backend *be = ax_backend_of(t->device);
  size_t n = ax_tensor_numel(t);
  int rc = to == AX_BF16 ? AX_K(be, cast_f32_bf16, n, ax_f32(t), ax_bf16(y))
                         : AX_K(be, cast_bf16_f32, n, ax_bf16(t), ax_f32(y));
  if (rc != AX_OK) {
    ax_tensor_release(y);
    return rc;
  }
  *out = y;
  return AX_OK;
}

int axi_prec_operand(const ax_exec *ex, const ax_tensor *t, ax_tensor **out) {
  return axi_prec_cast(t, ex->precision == AX_PREC_BF16 ? AX_BF16 : t->dtype,
                       out);
}

/* ---- saved activations ---- */

int ax_slot_put_act(ax_slot *s, int i, const ax_exec *ex, ax_tensor *t) {
  if (ex->precision != AX_PREC_BF16 || !t || t->dtype != AX_F32) {
    ax_slot_put(s, i, t);
    return AX_OK;
  }
  ax_tensor *b = NULL;
  int rc = axi_prec_cast(t, AX_BF16, &b);
  ax_slot_put(s, i, rc == AX_OK ? b : NULL);
  ax_tensor_release(b);
  return rc;
}

int ax_slot_get_f32(const ax_slot *s, int i, ax_tensor **out) {
  ax_tensor *t = ax_slot_get(s, i);
  *out = NULL;
  return t ? axi_prec_cast(t, t->dtype == AX_BF16 ? AX_F32 : t->dtype, out)
           : AX_OK;
}

/* ---- the GEMM ---- */

int axi_prec_gemm(const ax_exec *ex, ax_backend *be, int trans_a, int trans_b,
                  int m, int n, int k, float alpha, axi_mm a, int lda,
                  long stride_a, axi_mm b, int ldb, long stride_b, float beta,
                  float *c, int ldc, long stride_c, int batch) {
  if (ex->precision != AX_PREC_BF16) {
    if (a.dtype != AX_F32 || b.dtype != AX_F32)
      return ax_seterr(AX_EDTYPE, "gemm: %s x %s operands in fp32",
                       ax_dtype_name(a.dtype), ax_dtype_name(b.dtype));
    return AX_K(be, gemm, trans_a, trans_b, m, n, k, alpha, a.p, lda, stride_a,
                b.p, ldb, stride_b, beta, c, ldc, stride_c, batch);
  }
  return AX_K(be, gemm_bf16, trans_a, trans_b, m, n, k, alpha, a.p, a.dtype,
              lda, stride_a, b.p, b.dtype, ldb, stride_b, beta, c, ldc,
              stride_c, batch);
}

/* ---- block boundaries ---- */

/* *out: new references to in's entries, each bf16 one widened to f32. */
static int widen(const ax_tlist *in, ax_tlist *out) {
  memset(out, 0, sizeof *out);
  for (int i = 0; i < in->n; i++) {
    ax_tensor *t = in->t[i];
    int rc =
        t && t->dtype == AX_BF16 ? axi_prec_cast(t, AX_F32, &out->t[i]) : AX_OK;
    if (rc != AX_OK) {
      out->n = i;
      ax_tlist_clear(out);
      return rc;
    }
    if (!out->t[i])
      out->t[i] = ax_tensor_retain(t);
    out->n = i + 1;
  }
  return AX_OK;
}

/* Every f32 entry of l replaced by its bf16 rounding (l unchanged on
 * error). */
static int narrow(ax_tlist *l) {
  ax_tensor *b[AX_TLIST_MAX] = {NULL};
  for (int i = 0; i < l->n; i++) {
    ax_tensor *t = l->t[i];
    if (!t || t->dtype != AX_F32)
      continue;
    int rc = axi_prec_cast(t, AX_BF16, &b[i]);
    if (rc != AX_OK) {
      for (int j = 0; j < i; j++)
        ax_tensor_release(b[j]);
      return rc;
    }
  }
  for (int i = 0; i < l->n; i++)
    if (b[i]) {
      ax_tensor_release(l->t[i]);
      l->t[i] = b[i];
    }
  return AX_OK;
}

int axi_prec_block_fwd(ax_module *b, const ax_exec *ex, ax_slot *slot,
                       const ax_tlist *in, ax_tlist *out, int round_out) {
  ax_tlist wide = {0};
  int rc = widen(in, &wide);
  if (rc == AX_OK)
    rc = ax_forward(b, ex, slot, &wide, out);
  if (rc == AX_OK && round_out && (rc = narrow(out)) != AX_OK)
    ax_tlist_clear(out);
  ax_tlist_clear(&wide);
  return rc;
}

int axi_prec_block_bwd(ax_bwd_part part, ax_module *b, const ax_exec *ex,
                       ax_slot *slot, const ax_tlist *dout, ax_tlist *din) {
  if (part == AX_BWD_WEIGHT) /* no gradient flows */
    return ax_backward_part(part, b, ex, slot, dout, din);
  ax_tlist wide = {0};
  int rc = widen(dout, &wide);
  if (rc == AX_OK)
    rc = ax_backward_part(part, b, ex, slot, &wide, din);
  if (rc == AX_OK && (rc = narrow(din)) != AX_OK)
    ax_tlist_clear(din);
  ax_tlist_clear(&wide);
  return rc;
}
