/* Multi-head self-attention with a padding mask.
 *
 * Children: 0 = fused QKV projection (hidden -> 3 hidden), 1 = dropout on
 * the attention probabilities, 2 = output projection (hidden -> hidden).
 * The fused projection yields (B, S, 3, heads, dh); two permutations turn
 * it into Q, K and V of shape (B * heads, S, dh) each, stored one after the
 * other, so every product below is one strided batched GEMM.
 *
 * A member of a tensor-parallel group (models/layers/parallel.h) runs its
 * heads / T heads the same way: its projections are a column part (Q, K
 * and V of its heads: width = heads / T * dh) and a row part (which sums
 * the members' outputs), its dropout the whole mask's part. */
#include <math.h>

#include "axon/models/layers/parallel.h"
#include "axon/models/layers/tf-impl.h"
#include "axon/models/precision-impl.h"

#include "axon/kernels/error.h"

typedef struct mhsa_priv {
  int hidden, heads; /* heads: this member's */
  int width;         /* heads * dh: this member's Q, K and V features */
} mhsa_priv;

/* Slot, each in the exec's precision (ax_slot_put_act): 0 = qkvp (3 B
 * heads, S, dh), 1 = probs (B, heads, S, S), 2 = dropped probs (same
 * shape; may be probs itself). The products read Q, K, V and the dropped
 * probabilities as kept (bf16 operands in bf16). */
enum { SAVE_QKV = 0, SAVE_PROBS = 1, SAVE_PROBS_D = 2 };

/* Owns the temporaries of one call so that every exit path frees them. */
#define ATTN_TMP 6
typedef struct tmp_set {
  ax_tensor *t[ATTN_TMP];
} tmp_set;

static ax_tensor *new3(int64_t a, int64_t b, int64_t c, ax_device dev) {
  int64_t shape[3] = {a, b, c};
  return axi_tf_new(3, shape, dev);
}

static int check_inputs(const mhsa_priv *p, const ax_tlist *in) {
  AX_TRY(axi_tf_check_in("attention", in, 2));
  ax_tensor *x = in->t[0], *mask = in->t[1];
  char b[96];
  if (x->ndim != 3 || x->shape[2] != p->hidden)
    return ax_seterr(AX_ESHAPE, "attention: x %s must be (B, S, %d)",
                     ax_tensor_shape_str(x, b, sizeof b), p->hidden);
  if (!ax_device_eq(mask->device, x->device))
    return ax_seterr(AX_EDEVICE, "attention: mask and x on different devices");
  if (mask->dtype != AX_F32)
    return ax_seterr(AX_EDTYPE, "attention: mask must be f32, got %s",
                     ax_dtype_name(mask->dtype));
  if (mask->ndim != 2 || mask->shape[0] != x->shape[0] ||
      mask->shape[1] != x->shape[1])
    return ax_seterr(AX_ESHAPE, "attention: mask %s must be (%lld, %lld)",
                     ax_tensor_shape_str(mask, b, sizeof b),
                     (long long)x->shape[0], (long long)x->shape[1]);
  return AX_OK;
}

static int mhsa_run(ax_module *m, const ax_exec *ex, ax_slot *slot,
                    const ax_tlist *in, tmp_set *t, ax_tensor **y) {
  mhsa_priv *p = m->priv;
  ax_tensor *x = in->t[0], *mask = in->t[1]; // (B, S, H), (B, S)
  int B = (int)x->shape[0], S = (int)x->shape[1], H = p->width;
  int A = p->heads, dh = H / A;
  long bsh = (long)B * S * H;
  ax_backend *be = ax_backend_of(x->device);
  ax_tensor **qkv = &t->t[0], **tmp = &t->t[1], **qkvp = &t->t[2],
            **scores = &t->t[3], **probs = &t->t[4], **ctx = &t->t[5];

  AX_TRY(axi_tf_child_fwd(m, 0, ex, slot, x, qkv)); // (B, S, 3H)
  /* (1, BS, 3, H) -> (3, BS, H) = (3B, S, A, dh) -> (3B, A, S, dh). */
  if (!(*tmp = new3(3, (int64_t)B * S, H, x->device)) ||
      !(*qkvp = new3(3L * B * A, S, dh, x->device)))
    return AX_ENOMEM;
  AX_TRY(AX_K(be, permute0213, 1, B * S, 3, H, ax_f32(*qkv), ax_f32(*tmp)));
  AX_TRY(AX_K(be, permute0213, 3 * B, S, A, dh, ax_f32(*tmp), ax_f32(*qkvp)));
  ax_tensor_release(*qkv);
  ax_tensor_release(*tmp);
  *qkv = *tmp = NULL;
  if (slot) /* Q, K and V as kept, also the products' operands */
    AX_TRY(ax_slot_put_act(slot, SAVE_QKV, ex, *qkvp));
  ax_tensor *qk = slot ? ax_slot_get(slot, SAVE_QKV) : *qkvp;

  /* scores (B A, S, S) = Q K^T, then the masked, scaled softmax. */
  int64_t pshape[4] = {B, A, S, S};
  if (!(*scores = axi_tf_new(4, pshape, x->device)) ||
      !(*probs = axi_tf_new(4, pshape, x->device)))
    return AX_ENOMEM;
  long ss = (long)S * S, sd = (long)S * dh;
  AX_TRY(axi_prec_gemm(ex, be, 0, 1, S, S, dh, 1.0f, axi_mm_at(qk, 0), dh, sd,
                       axi_mm_at(qk, (size_t)bsh), dh, sd, 0.0f,
                       ax_f32(*scores), S, ss, B * A));
  float scale = 1.0f / sqrtf((float)dh);
  AX_TRY(AX_K(be, softmax_mask_fwd, B, A, S, S, ax_f32(*scores), ax_f32(mask),
              scale, ax_f32(*probs)));
  ax_tensor_release(*scores);
  *scores = NULL;
  ax_tensor *pd = NULL; // (B, A, S, S)
  AX_TRY(axi_tf_child_fwd(m, 1, ex, slot, *probs, &pd));
  t->t[3] = pd;
  ax_tensor *pk = pd; /* the dropped probabilities as kept */
  if (slot) {
    AX_TRY(ax_slot_put_act(slot, SAVE_PROBS, ex, *probs));
    if (pd == *probs) /* no dropout: one tensor kept once */
      ax_slot_put(slot, SAVE_PROBS_D, ax_slot_get(slot, SAVE_PROBS));
    else
      AX_TRY(ax_slot_put_act(slot, SAVE_PROBS_D, ex, pd));
    pk = ax_slot_get(slot, SAVE_PROBS_D);
  }

  /* ctx (B A, S, dh) = P V, back to (B, S, A, dh) = (B, S, H). */
  if (!(*ctx = new3((int64_t)B * A, S, dh, x->device)) ||
      !(*tmp = new3(B, S, H, x->device)))
    return AX_ENOMEM;
  AX_TRY(axi_prec_gemm(ex, be, 0, 0, S, dh, S, 1.0f, axi_mm_at(pk, 0), S, ss,
                       axi_mm_at(qk, 2 * (size_t)bsh), dh, sd, 0.0f,
                       ax_f32(*ctx), dh, sd, B * A));
  AX_TRY(AX_K(be, permute0213, B, A, S, dh, ax_f32(*ctx), ax_f32(*tmp)));
  return axi_tf_child_fwd(m, 2, ex, slot, *tmp, y); // (B, S, H)
}

static int mhsa_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                        const ax_tlist *in, ax_tlist *out) {
  AX_TRY(check_inputs(m->priv, in));
  tmp_set t = {{0}};
  ax_tensor *y = NULL;
  int rc = mhsa_run(m, ex, slot, in, &t, &y);
  axi_tf_tmp_free(t.t, ATTN_TMP);
  if (rc != AX_OK)
    return rc;
  *out = ax_tlist1(y);
  return AX_OK;
}

/* The backward walk, each child whole or only its input half (`part`). */
static int mhsa_grad(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                     ax_slot *slot, ax_tensor *dy, tmp_set *t, ax_tensor **dx) {
  mhsa_priv *p = m->priv;
  ax_tensor *qkvp = ax_slot_get(slot, SAVE_QKV);
  ax_tensor *probs = ax_slot_get(slot, SAVE_PROBS);
  ax_tensor *pd = ax_slot_get(slot, SAVE_PROBS_D);
  if (!qkvp || !probs || !pd)
    return axi_tf_no_state("attention");
  int B = (int)probs->shape[0], A = (int)probs->shape[1];
  int S = (int)probs->shape[2], H = p->width, dh = H / A;
  long bsh = (long)B * S * H, ss = (long)S * S, sd = (long)S * dh;
  if (ax_tensor_numel(dy) != (size_t)B * S * p->hidden)
    return ax_seterr(AX_ESHAPE,
                     "attention: gradient has %zu elements, "
                     "expected (%d, %d, %d)",
                     ax_tensor_numel(dy), B, S, p->hidden);
  ax_device dev = dy->device;
  ax_backend *be = ax_backend_of(dev);
  axi_mm q = axi_mm_at(qkvp, 0), k = axi_mm_at(qkvp, (size_t)bsh),
         v = axi_mm_at(qkvp, 2 * (size_t)bsh);
  ax_tensor **dctxp = &t->t[0], **dctx = &t->t[1], **dpd = &t->t[2],
            **dqkvp = &t->t[3], **dprobs = &t->t[4], **dscores = &t->t[5];

  AX_TRY(axi_tf_child_bwd(part, m, 2, ex, slot, 1, dy, dctxp)); // (B, S, H)
  int64_t pshape[4] = {B, A, S, S};
  if (!(*dctx = new3((int64_t)B * A, S, dh, dev)) ||
      !(*dpd = axi_tf_new(4, pshape, dev)) ||
      !(*dqkvp = new3(3L * B * A, S, dh, dev)))
    return AX_ENOMEM;
  AX_TRY(AX_K(be, permute0213, B, S, A, dh, ax_f32(*dctxp), ax_f32(*dctx)));
  float *dq = ax_f32(*dqkvp), *dk = dq + bsh, *dv = dq + 2 * bsh;
  /* dP_d = dctx V^T; dV = P_d^T dctx. */
  AX_TRY(axi_prec_gemm(ex, be, 0, 1, S, S, dh, 1.0f, axi_mm_at(*dctx, 0), dh,
                       sd, v, dh, sd, 0.0f, ax_f32(*dpd), S, ss, B * A));
  AX_TRY(axi_prec_gemm(ex, be, 1, 0, S, dh, S, 1.0f, axi_mm_at(pd, 0), S, ss,
                       axi_mm_at(*dctx, 0), dh, sd, 0.0f, dv, dh, sd, B * A));
  AX_TRY(axi_tf_child_bwd(part, m, 1, ex, slot, 1, *dpd, dprobs));
  ax_tensor *pf = NULL; /* the probabilities as f32, for the softmax */
  if (!(*dscores = axi_tf_new(4, pshape, dev)))
    return AX_ENOMEM;
  AX_TRY(ax_slot_get_f32(slot, SAVE_PROBS, &pf));
  float scale = 1.0f / sqrtf((float)dh);
  int rc = AX_K(be, softmax_bwd, B * A * S, S, ax_f32(pf), ax_f32(*dprobs),
                scale, ax_f32(*dscores));
  ax_tensor_release(pf);
  AX_TRY(rc);
  /* dQ = dS K; dK = dS^T Q. */
  AX_TRY(axi_prec_gemm(ex, be, 0, 0, S, dh, S, 1.0f, axi_mm_at(*dscores, 0), S,
                       ss, k, dh, sd, 0.0f, dq, dh, sd, B * A));
  AX_TRY(axi_prec_gemm(ex, be, 1, 0, S, dh, S, 1.0f, axi_mm_at(*dscores, 0), S,
                       ss, q, dh, sd, 0.0f, dk, dh, sd, B * A));
  /* (3B, A, S, dh) -> (3B, S, A, dh) = (3, BS, H) -> (BS, 3, H). The
   * permutation's scratch reuses the slots freed above. */
  for (int i = 0; i < 6; i++)
    if (i != 3) {
      ax_tensor_release(t->t[i]);
      t->t[i] = NULL;
    }
  if (!(*dctx = new3(3, (int64_t)B * S, H, dev)) ||
      !(*dpd = new3(B, S, 3L * H, dev)))
    return AX_ENOMEM;
  AX_TRY(AX_K(be, permute0213, 3 * B, A, S, dh, dq, ax_f32(*dctx)));
  AX_TRY(AX_K(be, permute0213, 1, 3, B * S, H, ax_f32(*dctx), ax_f32(*dpd)));
  return axi_tf_child_bwd(part, m, 0, ex, slot, ex->need_dx, *dpd, dx);
}

/* The backward (module.h's walk). The input half keeps nothing of its
 * own: the projections keep their inputs and output gradients, so the
 * weight half is the children's. */
static int mhsa_walk(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                     ax_slot *slot, const ax_tlist *dout, ax_tlist *din) {
  if (part == AX_BWD_WEIGHT)
    return ax_walk_children(part, m, ex, slot, dout, din);
  AX_TRY(axi_tf_check_in("attention", dout, 1));
  tmp_set t = {{0}};
  ax_tensor *dx = NULL;
  int rc = mhsa_grad(part, m, ex, slot, dout->t[0], &t, &dx);
  axi_tf_tmp_free(t.t, ATTN_TMP);
  if (rc == AX_OK) /* backward consumes the saved state */
    for (int i = SAVE_QKV; i <= SAVE_PROBS_D; i++)
      ax_slot_put(slot, i, NULL);
  if (rc != AX_OK || !ex->need_dx) {
    ax_tensor_release(dx);
    return rc;
  }
  din->n = 2;
  din->t[0] = dx;
  din->t[1] = NULL; /* the mask has no gradient */
  return AX_OK;
}

static const ax_module_ops mhsa_ops = {
    /* .kind = */ "attention",
    /* .forward = */ mhsa_forward,
    /* .backward = */ NULL,
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ NULL,
    /* .backward_weight = */ NULL,
    /* .walk = */ mhsa_walk,
};

ax_module *ax_mhsa_new(int hidden, int heads, float dropout, uint64_t salt) {
  return ax_mhsa_new_tp(hidden, heads, dropout, salt, AX_TP_WHOLE);
}

ax_module *ax_mhsa_new_tp(int hidden, int heads, float dropout, uint64_t salt,
                          ax_tp tp) {
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size ||
      heads % tp.size != 0) {
    ax_seterr(AX_EINVAL,
              "attention: member %d of %d must hold a whole "
              "share of %d heads",
              tp.rank, tp.size, heads);
    return NULL;
  }
  if (hidden <= 0 || heads <= 0 || hidden % heads != 0) {
    ax_seterr(AX_EINVAL,
              "attention: %d heads must be positive and divide hidden %d",
              heads, hidden);
    return NULL;
  }
  if (!(dropout >= 0.0f && dropout < 1.0f)) {
    ax_seterr(AX_EINVAL, "attention: dropout %g outside [0, 1)",
              (double)dropout);
    return NULL;
  }
  ax_module *m = ax_module_new(&mhsa_ops, sizeof(mhsa_priv));
  if (!m) {
    ax_seterr(AX_ENOMEM, "attention: no memory");
    return NULL;
  }
  mhsa_priv *p = m->priv;
  p->hidden = hidden;
  p->heads = heads / tp.size;
  p->width = hidden / tp.size;
  float std = AX_BERT_INIT_STD;
  if (ax_module_add(m,
                    ax_linear_column_new(hidden, 3 * hidden, 1, std, 3, tp)) ||
      ax_module_add(m, ax_dropout_new_shard(dropout, salt, tp.size, tp.rank)) ||
      ax_module_add(m, ax_linear_row_new(hidden, hidden, 1, std, tp))) {
    ax_module_free(m);
    ax_seterr(AX_ENOMEM, "attention: no memory");
    return NULL;
  }
  return m;
}
