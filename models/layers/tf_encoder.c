/* One BERT encoder layer (post-LN) built from the transformer layers.
 *
 * Children, in order: 0 attention, 1 dropout, 2 layer norm, 3 dense
 * hidden -> ff, 4 GELU, 5 dense ff -> hidden, 6 dropout, 7 layer norm. */
#include "axon/models/layers/parallel.h"
#include "axon/models/layers/tf-impl.h"

#include "axon/kernels/error.h"

enum { C_ATTN, C_DROP1, C_LN1, C_FF1, C_GELU, C_FF2, C_DROP2, C_LN2, C_N };

typedef struct enc_priv {
  int hidden;
} enc_priv;

/* The temporaries of one call: t[i] is child i's output (or, backward, its
 * input gradient), t[C_N] and t[C_N + 1] the two residual sums. */
#define ENC_TMP (C_N + 2)

static int attn_fwd(ax_module *m, const ax_exec *ex, ax_slot *slot,
                    const ax_tlist *in, ax_tensor **a) {
  ax_slot *cs = NULL;
  if (slot && !(cs = ax_slot_child(slot, C_ATTN)))
    return AX_ENOMEM;
  ax_tlist pair = {2, {in->t[0], in->t[1]}}, out = {0};
  AX_TRY(ax_forward(m->children[C_ATTN], ex, cs, &pair, &out));
  *a = out.t[0];
  out.t[0] = NULL;
  ax_tlist_clear(&out);
  return AX_OK;
}

static int enc_run(ax_module *m, const ax_exec *ex, ax_slot *slot,
                   const ax_tlist *in, ax_tensor **t, ax_tensor **y) {
  ax_tensor *x = in->t[0]; // (B, S, H)
  /* x1 = LN(x + Dropout(Attn(x))), in t[C_LN1] */
  AX_TRY(attn_fwd(m, ex, slot, in, &t[C_ATTN]));
  AX_TRY(axi_tf_child_fwd(m, C_DROP1, ex, slot, t[C_ATTN], &t[C_DROP1]));
  AX_TRY(axi_tf_add(x, t[C_DROP1], &t[C_N]));
  /* y = LN(x1 + Dropout(FF2(GELU(FF1(x1))))); FF1's output is (B, S, ff) */
  AX_TRY(axi_tf_chain_fwd(m, ex, slot, C_LN1, C_DROP2, t[C_N], t));
  AX_TRY(axi_tf_add(t[C_LN1], t[C_DROP2], &t[C_N + 1]));
  return axi_tf_child_fwd(m, C_LN2, ex, slot, t[C_N + 1], y);
}

static int enc_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                       const ax_tlist *in, ax_tlist *out) {
  enc_priv *p = m->priv;
  AX_TRY(axi_tf_check_in("encoder", in, 2));
  char b[96];
  ax_tensor *x = in->t[0];
  if (x->ndim != 3 || x->shape[2] != p->hidden)
    return ax_seterr(AX_ESHAPE, "encoder: hidden %s must be (B, S, %d)",
                     ax_tensor_shape_str(x, b, sizeof b), p->hidden);
  ax_tensor *t[ENC_TMP] = {0}, *y = NULL;
  int rc = enc_run(m, ex, slot, in, t, &y);
  axi_tf_tmp_free(t, ENC_TMP);
  if (rc != AX_OK)
    return rc;
  out->n = 2;
  out->t[0] = y;
  out->t[1] = ax_tensor_retain(in->t[1]);
  return AX_OK;
}

/* The backward walk, each child whole or only its input half (`part`). */
static int enc_grad(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                    ax_slot *slot, ax_tensor *dy, ax_tensor **t,
                    ax_tensor **dx) {
  /* Feed-forward half: the residual adds the LN2 input gradient to x1's. */
  AX_TRY(axi_tf_chain_bwd(part, m, ex, slot, C_FF1, C_LN2, 1, dy, t));
  AX_TRY(axi_tf_add(t[C_LN2], t[C_FF1], &t[C_N]));
  /* Attention half. */
  AX_TRY(axi_tf_chain_bwd(part, m, ex, slot, C_DROP1, C_LN1, 1, t[C_N], t));
  ax_slot *cs = ax_slot_child(slot, C_ATTN);
  if (!cs)
    return AX_ENOMEM;
  ax_exec cex = *ex;
  ax_tlist dout = ax_tlist1(t[C_DROP1]), din = {0};
  AX_TRY(ax_backward_part(part, m->children[C_ATTN], &cex, cs, &dout, &din));
  int rc = AX_OK;
  if (ex->need_dx) {
    if (din.n < 1 || !din.t[0])
      rc = ax_seterr(AX_EINTERNAL, "encoder: attention returned no gradient");
    else
      rc = axi_tf_add(t[C_LN1], din.t[0], dx);
  }
  ax_tlist_clear(&din);
  return rc;
}

/* The backward (module.h's walk). The children keep what their weight
 * halves need, so the weight half is theirs. */
static int enc_walk(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                    ax_slot *slot, const ax_tlist *dout, ax_tlist *din) {
  if (part == AX_BWD_WEIGHT)
    return ax_walk_children(part, m, ex, slot, dout, din);
  AX_TRY(axi_tf_check_in("encoder", dout, 1));
  ax_tensor *t[ENC_TMP] = {0}, *dx = NULL;
  int rc = enc_grad(part, m, ex, slot, dout->t[0], t, &dx);
  axi_tf_tmp_free(t, ENC_TMP);
  if (rc != AX_OK || !ex->need_dx) {
    ax_tensor_release(dx);
    return rc;
  }
  din->n = 2;
  din->t[0] = dx;
  din->t[1] = NULL; /* the mask has no gradient */
  return AX_OK;
}

static const ax_module_ops enc_ops = {
    /* .kind = */ "encoder",
    /* .forward = */ enc_forward,
    /* .backward = */ NULL,
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ NULL,
    /* .backward_weight = */ NULL,
    /* .walk = */ enc_walk,
};

ax_module *ax_encoder_layer_new(int hidden, int heads, int ff, float dropout,
                                uint64_t salt) {
  return ax_encoder_layer_new_tp(hidden, heads, ff, dropout, salt, AX_TP_WHOLE);
}

ax_module *ax_encoder_layer_new_tp(int hidden, int heads, int ff, float dropout,
                                   uint64_t salt, ax_tp tp) {
  if (ff <= 0 || (tp.size > 0 && ff % tp.size != 0)) {
    ax_seterr(AX_EINVAL,
              "encoder: feed-forward size %d must be positive "
              "and divisible by the %d members of its group",
              ff, tp.size);
    return NULL;
  }
  /* The attention constructor checks hidden, heads, dropout and tp. */
  ax_module *attn =
      ax_mhsa_new_tp(hidden, heads, dropout, ax_salt_mix(salt, 1), tp);
  if (!attn)
    return NULL;
  ax_module *m = ax_module_new(&enc_ops, sizeof(enc_priv));
  if (!m) {
    ax_module_free(attn);
    ax_seterr(AX_ENOMEM, "encoder: no memory");
    return NULL;
  }
  ((enc_priv *)m->priv)->hidden = hidden;
  ax_module *parts[C_N] = {
      attn,
      ax_dropout_new(dropout, ax_salt_mix(salt, 2)),
      ax_layernorm_new(hidden, AX_BERT_LN_EPS),
      ax_linear_column_new(hidden, ff, 1, AX_BERT_INIT_STD, 1, tp),
      ax_gelu_new(),
      ax_linear_row_new(ff, hidden, 1, AX_BERT_INIT_STD, tp),
      ax_dropout_new(dropout, ax_salt_mix(salt, 3)),
      ax_layernorm_new(hidden, AX_BERT_LN_EPS),
  };
  if (axi_tf_add_parts(m, parts, C_N) != AX_OK) {
    ax_module_free(m);
    ax_seterr(AX_ENOMEM, "encoder: no memory");
    return NULL;
  }
  return m;
}
