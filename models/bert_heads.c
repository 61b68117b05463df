/* BERT's pre-training heads, the last block of the "bert" model.
 *
 * Input {hidden f32 (B, S, H), mask f32 (B, S)}; output {MLM logits f32
 * (B * S, vocab), NSP logits f32 (B, 2)}.
 *  - Masked LM: dense H -> H, GELU, layer norm, decoder H -> vocab with
 *    bias (not tied to the token embedding).
 *  - Next sentence: the [CLS] position 0 of every sequence, pooler dense
 *    H -> H with tanh, then dense H -> 2.
 * The [CLS] rows are gathered with the embedding kernel (the hidden states
 * seen as a (B * S, H) table indexed by b * S), and its backward
 * scatter-adds their gradient into the hidden-state gradient. */
#include "axon/models/layers/tf-impl.h"

#include <stdlib.h>

#include "axon/kernels/error.h"

enum {
  C_MLM_DENSE,
  C_MLM_GELU,
  C_MLM_LN,
  C_MLM_DEC,
  C_POOL,
  C_TANH,
  C_NSP,
  C_N
};

typedef struct heads_priv {
  int hidden, vocab;
} heads_priv;

/* Slot: 0 = [CLS] row indices i32 (B), 1 = hidden (B, S, H) (for its
 * shape). */

/* Moves child i's result out of the chain's temporaries t into *y and
 * releases the others, so the chain keeps only its last result. */
static void chain_take(ax_tensor **t, int i, ax_tensor **y) {
  *y = t[i];
  t[i] = NULL;
  axi_tf_tmp_free(t, C_N);
}

/* An i32 (B) tensor of b * S on dev, the [CLS] row of every sequence. */
static ax_tensor *cls_rows(int B, int S, ax_device dev) {
  int64_t n = B;
  int32_t *h = malloc(sizeof(int32_t) * (size_t)(B + 1));
  ax_tensor *t = ax_tensor_new(AX_I32, 1, &n, dev);
  int ok = h && t;
  for (int b = 0; ok && b < B; b++)
    h[b] = b * S;
  if (ok)
    ok = ax_tensor_write(t, h, sizeof(int32_t) * (size_t)B) == AX_OK;
  free(h);
  if (!ok) {
    ax_tensor_release(t);
    return NULL;
  }
  return t;
}

static int heads_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                         const ax_tlist *in, ax_tlist *out) {
  heads_priv *p = m->priv;
  AX_TRY(axi_tf_check_in("bert heads", in, 1));
  ax_tensor *x = in->t[0]; // (B, S, H)
  int64_t want[3] = {-1, -1, p->hidden};
  AX_TRY(ax_tensor_check(x, "bert heads: hidden", AX_F32, 3, want));
  int B = (int)x->shape[0], S = (int)x->shape[1], H = p->hidden;
  if (S < 1)
    return ax_seterr(AX_ESHAPE, "bert heads: empty sequences");
  int64_t flat[2] = {(int64_t)B * S, H};
  int64_t cshape[2] = {B, H};
  ax_tensor *xf = ax_tensor_reshape(x, 2, flat); // (B S, H)
  ax_tensor *idx = cls_rows(B, S, x->device);
  ax_tensor *cls = axi_tf_new(2, cshape, x->device); // (B, H)
  ax_tensor *t[C_N] = {0}, *mlm = NULL, *nsp = NULL;
  int rc = xf && idx && cls ? AX_OK : AX_ENOMEM;
  if (rc == AX_OK)
    rc = axi_tf_chain_fwd(m, ex, slot, C_MLM_DENSE, C_MLM_DEC, xf, t);
  chain_take(t, C_MLM_DEC, &mlm);
  if (rc == AX_OK)
    rc = AX_K(ax_backend_of(x->device), embedding_fwd, B, H, B * S, ax_i32(idx),
              ax_f32(x), ax_f32(cls));
  if (rc == AX_OK)
    rc = axi_tf_chain_fwd(m, ex, slot, C_POOL, C_NSP, cls, t);
  chain_take(t, C_NSP, &nsp);
  if (rc == AX_OK && slot) {
    ax_slot_put(slot, 0, idx);
    ax_slot_put(slot, 1, x);
  }
  ax_tensor_release(xf);
  ax_tensor_release(idx);
  ax_tensor_release(cls);
  if (rc != AX_OK) {
    ax_tensor_release(mlm);
    ax_tensor_release(nsp);
    return rc;
  }
  out->n = 2;
  out->t[0] = mlm;
  out->t[1] = nsp;
  return AX_OK;
}

/* The backward (module.h's walk), each child whole or only its input half
 * (`part`). The input half keeps nothing of its own: the dense layers keep
 * their inputs and output gradients, the layer norm its (2, H) sums, so
 * the weight half is the children's. */
static int heads_walk(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                      ax_slot *slot, const ax_tlist *dout, ax_tlist *din) {
  if (part == AX_BWD_WEIGHT)
    return ax_walk_children(part, m, ex, slot, dout, din);
  heads_priv *p = m->priv;
  ax_tensor *idx = ax_slot_get(slot, 0), *x = ax_slot_get(slot, 1);
  if (!idx || !x)
    return axi_tf_no_state("bert heads");
  if (dout->n < 2 || !dout->t[0] || !dout->t[1])
    return ax_seterr(AX_EINVAL, "bert heads: expected {dmlm, dnsp}");
  int B = (int)x->shape[0], H = p->hidden;
  ax_tensor *g[C_N] = {0}, *dxf = NULL, *dcls = NULL, *dx = NULL;
  int rc = axi_tf_chain_bwd(part, m, ex, slot, C_MLM_DENSE, C_MLM_DEC,
                            ex->need_dx, dout->t[0], g);
  chain_take(g, C_MLM_DENSE, &dxf); // (B S, H)
  if (rc == AX_OK)
    rc = axi_tf_chain_bwd(part, m, ex, slot, C_POOL, C_NSP, ex->need_dx,
                          dout->t[1], g);
  chain_take(g, C_POOL, &dcls); // (B, H)
  /* dxf is the fresh output of the dense backward, so the [CLS] gradient
   * can be added into it in place. */
  if (rc == AX_OK && ex->need_dx)
    rc = AX_K(ax_backend_of(x->device), embedding_bwd, B, H, ax_i32(idx),
              ax_f32(dcls), ax_f32(dxf));
  if (rc == AX_OK && ex->need_dx && !(dx = ax_tensor_reshape(dxf, 3, x->shape)))
    rc = AX_ENOMEM;
  ax_tensor_release(dxf);
  ax_tensor_release(dcls);
  if (rc == AX_OK) { /* backward consumes the saved state */
    ax_slot_put(slot, 0, NULL);
    ax_slot_put(slot, 1, NULL);
  }
  if (rc != AX_OK || !ex->need_dx)
    return rc;
  din->n = 2;
  din->t[0] = dx;
  din->t[1] = NULL; /* the mask has no gradient */
  return AX_OK;
}

static const ax_module_ops heads_ops = {
    /* .kind = */ "bert_heads",
    /* .forward = */ heads_forward,
    /* .backward = */ NULL,
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ NULL,
    /* .backward_weight = */ NULL,
    /* .walk = */ heads_walk,
};

ax_module *axi_bert_heads_new(int hidden, int vocab) {
  ax_module *m = ax_module_new(&heads_ops, sizeof(heads_priv));
  if (!m)
    return NULL;
  heads_priv *p = m->priv;
  p->hidden = hidden;
  p->vocab = vocab;
  ax_module *parts[C_N] = {
      ax_linear_new_std(hidden, hidden, 1, AX_BERT_INIT_STD),
      ax_gelu_new(),
      ax_layernorm_new(hidden, AX_BERT_LN_EPS),
      ax_linear_new_std(hidden, vocab, 1, AX_BERT_INIT_STD),
      ax_linear_new_std(hidden, hidden, 1, AX_BERT_INIT_STD),
      ax_tanh_new(),
      ax_linear_new_std(hidden, 2, 1, AX_BERT_INIT_STD),
  };
  if (axi_tf_add_parts(m, parts, C_N) != AX_OK) {
    ax_module_free(m);
    return NULL;
  }
  return m;
}
