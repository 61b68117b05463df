/* GPT's head (models/gpt.c's last block): the final layer norm, then
 * logits = x W^T with W the tied token table, or, in a training forward
 * that asks for it (ax_exec.xent), the softmax cross-entropy fused over
 * chunks of rows so that the (rows, vocab) logits, their probabilities and
 * their gradient exist only a chunk at a time. */
#include "axon/kernels/backend-impl.h"
#include "axon/models/gpt-impl.h"
#include "axon/models/layers/tf-impl.h"
#include "axon/models/model.h"
#include "axon/models/precision-impl.h"

/* Children: 0 the final layer norm, 1 the output projection (hidden ->
 * vocab, no bias) whose weight is the tied token table. The input
 * (B, T, H) runs as (B T, H) rows. Slot ints 0 and 1: B and T, for the
 * shape of the input gradient. With the loss fused, the slot keeps the
 * layer norm's output gradient (S_DH, (B T, H)) until the input half and
 * the projection's weight gradient (S_DW, (vocab, H)) until the weight
 * half. */
enum { C_LN, C_PROJ };
enum { S_DH = 0, S_DW = 1 };

/* The logits a fused chunk holds at most (floats): 128 MiB in its one
 * (rows, vocab) buffer, which holds the logits, then their softmax, then
 * their gradient. */
#define CHUNK_FLOATS ((size_t)1 << 25)

typedef struct head_priv {
  int hidden, vocab, chunk; /* chunk: rows per fused chunk, 0 automatic */
} head_priv;

/* The fused loss over the rows of h (rows, H), the layer norm's output,
 * with W (vocab, H): per chunk of rows the logits z = h W^T, the loss and
 * softmax (xent_fwd) and the logits' gradient dz (xent_bwd), both in place,
 * dh = dz W and dW (+)= dz^T h, both GEMMs on dz in ex's precision. Saves
 * dh and dW in slot and the sums in ex->xent; with loss_only, the logits
 * and the loss alone. */
static int head_fused(ax_module *m, const ax_exec *ex, ax_slot *slot,
                      ax_tensor *h) {
  const head_priv *hp = m->priv;
  ax_xent_fuse *f = ex->xent;
  int H = hp->hidden, V = hp->vocab, rows = (int)h->shape[0];
  if (!f->labels || f->labels->dtype != AX_I32 ||
      ax_tensor_numel(f->labels) != (size_t)rows)
    return ax_seterr(AX_ESHAPE, "gpt head: %d rows need as many i32 labels",
                     rows);
  int chunk = hp->chunk ? hp->chunk : (int)(CHUNK_FLOATS / (size_t)V);
  chunk = chunk < 1 ? 1 : chunk > rows ? rows : chunk;
  if (!hp->chunk) { /* as few chunks, of rows as even as they can be */
    int n_chunks = (rows + chunk - 1) / chunk;
    chunk = (rows + n_chunks - 1) / n_chunks;
  }
  ax_backend *be = ax_backend_of(h->device);
  int64_t wshape[2] = {V, H}, zshape[2] = {chunk, V}, hshape[2] = {rows, H};
  ax_tensor *wv =
      ax_tensor_view(ex->params, m->children[C_PROJ]->param_off, 2, wshape);
  ax_tensor *wk = NULL, *hk = NULL;
  const int grads = !f->loss_only;
  ax_tensor *z = ax_tensor_new(AX_F32, 2, zshape, h->device);
  ax_tensor *dh = grads ? ax_tensor_new(AX_F32, 2, hshape, h->device) : NULL;
  ax_tensor *dw = grads ? ax_tensor_new(AX_F32, 2, wshape, h->device) : NULL;
  int rc = wv && z && (!grads || (dh && dw)) ? AX_OK : AX_ENOMEM;
  /* The table and the rows in ex's precision once for every chunk (the
   * table is packed twice a chunk); the logits' gradient goes to its two
   * GEMMs in f32, which a bf16 GEMM rounds as it packs it (the bits of a
   * bf16 copy made first, without the copy). */
  if (rc == AX_OK)
    rc = axi_prec_operand(ex, wv, &wk);
  if (rc == AX_OK)
    rc = axi_prec_operand(ex, h, &hk);
  const int32_t *lab = ax_i32(f->labels);
  for (int r0 = 0; rc == AX_OK && r0 < rows; r0 += chunk) {
    int n = rows - r0 < chunk ? rows - r0 : chunk;
    double sum = 0.0;
    int64_t count = 0, correct = 0;
    rc = axi_prec_gemm(ex, be, 0, 1, n, V, H, 1.0f,
                       axi_mm_at(hk, (size_t)r0 * H), H, 0, axi_mm_at(wk, 0), H,
                       0, 0.0f, ax_f32(z), V, 0, 1);
    if (rc == AX_OK)
      rc = AX_K(be, xent_fwd, n, V, ax_f32(z), lab + r0, f->ignore_index,
                ax_f32(z), &sum, &count, &correct);
    f->loss_sum += sum;
    f->count += count;
    f->correct += correct;
    if (!grads)
      continue;
    if (rc == AX_OK)
      rc = AX_K(be, xent_bwd, n, V, ax_f32(z), lab + r0, f->ignore_index,
                f->scale, ax_f32(z));
    if (rc == AX_OK) /* dh (n, H) = dz (n, V) W (V, H) */
      rc = axi_prec_gemm(ex, be, 0, 0, n, H, V, 1.0f, axi_mm_at(z, 0), V, 0,
                         axi_mm_at(wk, 0), H, 0, 0.0f,
                         ax_f32(dh) + (size_t)r0 * H, H, 0, 1);
    if (rc == AX_OK) /* dW (V, H) (+)= dz^T (V, n) h (n, H) */
      rc = axi_prec_gemm(ex, be, 1, 0, V, H, n, 1.0f, axi_mm_at(z, 0), V, 0,
                         axi_mm_at(hk, (size_t)r0 * H), H, 0, r0 ? 1.0f : 0.0f,
                         ax_f32(dw), H, 0, 1);
  }
  if (rc == AX_OK && grads) {
    ax_slot_put(slot, S_DH, dh);
    ax_slot_put(slot, S_DW, dw);
  }
  f->done = rc == AX_OK;
  ax_tensor_release(wv);
  ax_tensor_release(wk);
  ax_tensor_release(hk);
  ax_tensor_release(z);
  ax_tensor_release(dh);
  ax_tensor_release(dw);
  return rc;
}

static int head_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                        const ax_tlist *in, ax_tlist *out) {
  AX_TRY(axi_tf_check_in("gpt head", in, 1));
  ax_tensor *x = in->t[0];
  int64_t hidden = ((head_priv *)m->priv)->hidden;
  if (x->ndim != 3 || x->shape[2] != hidden) {
    char b[96];
    return ax_seterr(AX_ESHAPE, "gpt head: x %s must be (B, T, %lld)",
                     ax_tensor_shape_str(x, b, sizeof b), (long long)hidden);
  }
  int64_t rows[2] = {x->shape[0] * x->shape[1], hidden};
  /* Fused when loss_chunk asks, else only where it keeps less until the
   * backward: the table's and the input's gradients (V H + rows H floats)
   * against the logits' gradient the plain path keeps (rows V). So a
   * pipeline's micro-batch of fewer rows than the hidden width keeps its
   * logits' gradient. */
  const head_priv *hp = m->priv;
  int64_t V = hp->vocab;
  int fuse = ex->xent && ex->training && slot &&
             (hp->chunk > 0 || rows[0] * V > V * hidden + rows[0] * hidden);
  ax_tensor *x2 = ax_tensor_reshape(x, 2, rows), *h = NULL, *y = NULL;
  if (slot) {
    ax_slot_put(slot, S_DH, NULL);
    ax_slot_put(slot, S_DW, NULL);
  }
  int rc = x2 ? axi_tf_child_fwd(m, C_LN, ex, slot, x2, &h) : AX_ENOMEM;
  if (rc == AX_OK)
    rc = fuse ? head_fused(m, ex, slot, h)
              : axi_tf_child_fwd(m, C_PROJ, ex, slot, h, &y);
  ax_tensor_release(x2);
  ax_tensor_release(h);
  if (rc != AX_OK)
    return rc;
  if (slot) {
    ax_slot_set_int(slot, 0, x->shape[0]);
    ax_slot_set_int(slot, 1, x->shape[1]);
  }
  if (y)
    *out = ax_tlist1(y);
  return AX_OK;
}

/* The fused loss's backward, part `part`: the layer norm's part on the
 * saved dh (its input gradient in *dx when ex->need_dx), and the saved dW
 * added to the projection's gradient by the parts that write gradients. */
static int head_fused_walk(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                           ax_slot *slot, ax_tensor **dx) {
  ax_tensor *dh = ax_slot_get(slot, S_DH), *dw = ax_slot_get(slot, S_DW);
  *dx = NULL;
  if ((part == AX_BWD_WEIGHT) != (dh == NULL))
    return ax_seterr(AX_ESTATE, "gpt head: %s",
                     dh ? "weight half before the input half"
                        : "input half ran twice");
  if (part == AX_BWD_WEIGHT) {
    ax_slot *cs = ax_slot_child(slot, C_LN);
    AX_TRY(cs ? ax_backward_weight(m->children[C_LN], ex, cs) : AX_ENOMEM);
  } else {
    AX_TRY(axi_tf_child_bwd(part, m, C_LN, ex, slot, ex->need_dx, dh, dx));
    ax_slot_put(slot, S_DH, NULL);
  }
  if (part == AX_BWD_INPUT)
    return AX_OK;
  AX_TRY(AX_K(ax_backend_of(dw->device), axpby, ax_tensor_numel(dw), 1.0f,
              ax_f32(dw), 1.0f, ax_grad(m->children[C_PROJ], ex, 0)));
  ax_slot_put(slot, S_DW, NULL);
  return AX_OK;
}

/* The chain's backward (whole, or a half), or the fused loss's, the input
 * gradient back in the input's shape (B, T, H). */
static int head_walk(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                     ax_slot *slot, const ax_tlist *dout, ax_tlist *din) {
  ax_tensor *dx = NULL;
  if (ax_slot_get(slot, S_DW)) {
    AX_TRY(head_fused_walk(part, m, ex, slot, &dx));
  } else if (part == AX_BWD_WEIGHT) {
    return ax_walk_children(part, m, ex, slot, dout, din);
  } else {
    ax_tlist d2 = {0};
    AX_TRY(ax_walk_children(part, m, ex, slot, dout, &d2));
    if (d2.n > 0) {
      dx = d2.t[0];
      d2.t[0] = NULL;
    }
    ax_tlist_clear(&d2);
  }
  if (part == AX_BWD_WEIGHT) {
    if (din)
      din->n = 0;
    return AX_OK;
  }
  int rc = AX_OK;
  if (ex->need_dx && dx) {
    int64_t shape[3] = {ax_slot_int(slot, 0), ax_slot_int(slot, 1),
                        dx->shape[1]};
    din->n = 1;
    din->t[0] = ax_tensor_reshape(dx, 3, shape);
    rc = din->t[0] ? AX_OK : AX_ENOMEM;
  }
  ax_tensor_release(dx);
  return rc;
}

static const ax_module_ops head_ops = {
    /* .kind = */ "gpt_head",
    /* .forward = */ head_forward,
    /* .backward = */ NULL,
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ NULL,
    /* .backward_weight = */ NULL,
    /* .walk = */ head_walk,
};

ax_module *axi_gpt_head_new(int hidden, int vocab, int chunk_rows) {
  ax_module *m = ax_module_new(&head_ops, sizeof(head_priv));
  if (m)
    *(head_priv *)m->priv = (head_priv){hidden, vocab, chunk_rows};
  if (m && (ax_module_add(m, ax_layernorm_new(hidden, AX_GPT_LN_EPS)) ||
            ax_module_add(
                m, ax_linear_new_std(hidden, vocab, 0, AX_BERT_INIT_STD)))) {
    ax_module_free(m);
    return NULL;
  }
  return m;
}
