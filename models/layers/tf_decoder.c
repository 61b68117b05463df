/* One GPT-2 decoder layer (pre-LN) built from the transformer layers.
 *
 * Children, in order: 0 layer norm, 1 causal attention, 2 dropout,
 * 3 layer norm, 4 dense hidden -> ff, 5 GELU, 6 dense ff -> hidden,
 * 7 dropout. */
#include "axon/models/layers/parallel.h"
#include "axon/models/layers/tf-impl.h"

#include "axon/kernels/error.h"

enum { C_LN1, C_ATTN, C_DROP1, C_LN2, C_FF1, C_GELU, C_FF2, C_DROP2, C_N };

typedef struct dec_priv {
  int hidden;
} dec_priv;

#define DEC_TMP 9

static int dec_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                       const ax_tlist *in, ax_tlist *out) {
  dec_priv *p = m->priv;
  AX_TRY(axi_tf_check_in("decoder", in, 1));
  char b[96];
  ax_tensor *x = in->t[0]; // (B, S, H)
  if (x->ndim != 3 || x->shape[2] != p->hidden)
    return ax_seterr(AX_ESHAPE, "decoder: x %s must be (B, S, %d)",
                     ax_tensor_shape_str(x, b, sizeof b), p->hidden);
  ax_tensor *t[DEC_TMP] = {0}, *y = NULL;
  /* x1 = x + Dropout(Attn(LN1(x))); y = x1 + Dropout(FF2(GELU(FF1(LN2(x1))))).
   * t[C_N] holds x1. */
  int rc = axi_tf_chain_fwd(m, ex, slot, C_LN1, C_DROP1, x, t);
  if (rc == AX_OK)
    rc = axi_tf_add(x, t[C_DROP1], &t[C_N]);
  if (rc == AX_OK)
    rc = axi_tf_chain_fwd(m, ex, slot, C_LN2, C_DROP2, t[C_N], t);
  if (rc == AX_OK)
    rc = axi_tf_add(t[C_N], t[C_DROP2], &y);
  axi_tf_tmp_free(t, DEC_TMP);
  if (rc != AX_OK)
    return rc;
  *out = ax_tlist1(y);
  return AX_OK;
}

/* The backward (module.h's walk): each residual branch's gradient plus the
 * gradient that passes by it. The children keep what their weight halves
 * need, so the weight half is theirs. */
static int dec_walk(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                    ax_slot *slot, const ax_tlist *dout, ax_tlist *din) {
  if (part == AX_BWD_WEIGHT)
    return ax_walk_children(part, m, ex, slot, dout, din);
  AX_TRY(axi_tf_check_in("decoder", dout, 1));
  ax_tensor *g[DEC_TMP] = {0}, *dx = NULL;
  /* dx1 = dy + (the feed-forward branch's input gradient), held in g[C_N];
   * dx = dx1 + (the attention branch's). */
  int rc =
      axi_tf_chain_bwd(part, m, ex, slot, C_LN2, C_DROP2, 1, dout->t[0], g);
  if (rc == AX_OK)
    rc = axi_tf_add(dout->t[0], g[C_LN2], &g[C_N]);
  if (rc == AX_OK)
    rc = axi_tf_chain_bwd(part, m, ex, slot, C_LN1, C_DROP1, ex->need_dx,
                          g[C_N], g);
  if (rc == AX_OK && ex->need_dx)
    rc = axi_tf_add(g[C_N], g[C_LN1], &dx);
  axi_tf_tmp_free(g, DEC_TMP);
  if (rc != AX_OK || !ex->need_dx) {
    ax_tensor_release(dx);
    return rc;
  }
  *din = ax_tlist1(dx);
  return AX_OK;
}

static const ax_module_ops dec_ops = {
    /* .kind = */ "decoder",
    /* .forward = */ dec_forward,
    /* .backward = */ NULL,
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ NULL,
    /* .backward_weight = */ NULL,
    /* .walk = */ dec_walk,
};

ax_module *ax_decoder_layer_new(int hidden, int heads, int ff, float dropout,
                                uint64_t salt, float proj_std) {
  return ax_decoder_layer_new_tp(hidden, heads, ff, dropout, salt, proj_std,
                                 AX_TP_WHOLE);
}

ax_module *ax_decoder_layer_new_tp(int hidden, int heads, int ff, float dropout,
                                   uint64_t salt, float proj_std, ax_tp tp) {
  if (ff <= 0 || (tp.size > 0 && ff % tp.size != 0)) {
    ax_seterr(AX_EINVAL,
              "decoder: feed-forward size %d must be positive "
              "and divisible by the %d members of its group",
              ff, tp.size);
    return NULL;
  }
  /* The attention checks hidden, heads, dropout, proj_std and tp. */
  ax_module *attn = axi_tf_causal_new(hidden, heads, dropout,
                                      ax_salt_mix(salt, 1), proj_std, tp);
  if (!attn)
    return NULL;
  ax_module *m = ax_module_new(&dec_ops, sizeof(dec_priv));
  if (!m) {
    ax_module_free(attn);
    ax_seterr(AX_ENOMEM, "decoder: no memory");
    return NULL;
  }
  ((dec_priv *)m->priv)->hidden = hidden;
  ax_module *parts[C_N] = {
      ax_layernorm_new(hidden, AX_GPT_LN_EPS),
      attn,
      ax_dropout_new(dropout, ax_salt_mix(salt, 2)),
      ax_layernorm_new(hidden, AX_GPT_LN_EPS),
      ax_linear_column_new(hidden, ff, 1, AX_BERT_INIT_STD, 1, tp),
      ax_gelu_new(),
      ax_linear_row_new(ff, hidden, 1, proj_std, tp),
      ax_dropout_new(dropout, ax_salt_mix(salt, 3)),
  };
  if (axi_tf_add_parts(m, parts, C_N) != AX_OK) {
    ax_module_free(m);
    ax_seterr(AX_ENOMEM, "decoder: no memory");
    return NULL;
  }
  return m;
}
