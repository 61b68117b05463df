/* Token and learned position embeddings, with or without segments and a
 * layer norm: BERT's and GPT-2's first block (ax_token_embed_new,
 * transformer.h). */
#include "axon/models/layers/tf-impl.h"
#include "axon/models/precision-impl.h"

#include "axon/kernels/error.h"

typedef struct tokemb_priv {
  int vocab, seq, types, hidden;
  int ln; /* child 0 is a layer norm (then child 1 the dropout) */
} tokemb_priv;

/* Own parameters: token (vocab, H), position (seq, H), segment (types, H).
 * Children: [layer norm], dropout. Slot: 0 = ids, 1 = segments from
 * forward until the tables' gradients are made; from the backward (the
 * input half) until then 2 = the gradient of the summed embeddings (B, S,
 * H), in the exec's precision (ax_slot_put_act), which the tables'
 * gradients scatter. */
enum { SAVE_IDS = 0, SAVE_SEG = 1, SAVE_DE = 2 };

/* The inputs: ids (B, S), and with segments the segments (B, S) and the
 * mask (B, S) that passes through. */
static int check_inputs(const tokemb_priv *p, const ax_exec *ex,
                        const ax_tlist *in) {
  int n = p->types ? 3 : 1;
  for (int i = 0; i < n; i++)
    if (in->n < n || !in->t[i])
      return ax_seterr(AX_EINVAL, "token embed: expected %s",
                       p->types ? "{ids, segments, mask}" : "{ids}");
  ax_tensor *ids = in->t[0];
  AX_TRY(ax_tensor_check(ids, "token embed: ids", AX_I32, 2, NULL));
  int64_t bs[2] = {ids->shape[0], ids->shape[1]};
  if (p->types) {
    AX_TRY(ax_tensor_check(in->t[1], "token embed: segments", AX_I32, 2, bs));
    AX_TRY(ax_tensor_check(in->t[2], "token embed: mask", AX_F32, 2, bs));
    if (!ax_device_eq(in->t[1]->device, ids->device) ||
        !ax_device_eq(in->t[2]->device, ids->device))
      return ax_seterr(AX_EDEVICE, "token embed: inputs on different devices");
  }
  if (bs[1] > p->seq)
    return ax_seterr(AX_ESHAPE, "token embed: %lld tokens exceed seq=%d",
                     (long long)bs[1], p->seq);
  if (ex->kv_decode && ex->kv_pos + bs[1] > p->seq)
    return ax_seterr(AX_EINVAL,
                     "token embed: decoding positions %lld..%lld, past the "
                     "model's seq=%d positions",
                     (long long)ex->kv_pos, (long long)(ex->kv_pos + bs[1] - 1),
                     p->seq);
  return AX_OK;
}

static int tokemb_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                          const ax_tlist *in, ax_tlist *out) {
  tokemb_priv *p = m->priv;
  AX_TRY(check_inputs(p, ex, in));
  ax_tensor *ids = in->t[0], *seg = p->types ? in->t[1] : NULL;
  int B = (int)ids->shape[0], S = (int)ids->shape[1], H = p->hidden, n = B * S;
  int64_t shape[3] = {B, S, H};
  ax_tensor *e = axi_tf_new(3, shape, ids->device); // (B, S, H)
  ax_tensor *s = seg ? axi_tf_new(3, shape, ids->device) : NULL;
  ax_tensor *h = NULL, *y = NULL;
  ax_backend *be = ax_backend_of(ids->device);
  const float *tok = ax_param(m, ex, 0);
  const float *pos = tok + (size_t)p->vocab * H;
  const float *typ = pos + (size_t)p->seq * H;
  int64_t first = ex->kv_decode ? ex->kv_pos : 0; /* decoding: later ones */
  int rc = e && (s || !seg) ? AX_OK : AX_ENOMEM;
  if (rc == AX_OK)
    rc = AX_K(be, embedding_fwd, n, H, p->vocab, ax_i32(ids), tok, ax_f32(e));
  if (rc == AX_OK && seg)
    rc = AX_K(be, embedding_fwd, n, H, p->types, ax_i32(seg), typ, ax_f32(s));
  if (rc == AX_OK && seg)
    rc = AX_K(be, axpby, (size_t)n * H, 1.0f, ax_f32(s), 1.0f, ax_f32(e));
  /* Positions first .. first + S - 1 are S consecutive rows of the table
   * for every sequence: a bias over (B, S * H). */
  if (rc == AX_OK && n > 0)
    rc = AX_K(be, bias_add, ax_f32(e), pos + first * H, B, S * H, 1);
  if (rc == AX_OK && p->ln)
    rc = axi_tf_child_fwd(m, 0, ex, slot, e, &h);
  else if (rc == AX_OK)
    h = ax_tensor_retain(e);
  if (rc == AX_OK)
    rc = axi_tf_child_fwd(m, p->ln, ex, slot, h, &y);
  ax_tensor_release(e);
  ax_tensor_release(s);
  ax_tensor_release(h);
  if (rc != AX_OK)
    return rc;
  if (slot && !ex->kv_decode) { /* decoding has no backward */
    ax_slot_put(slot, SAVE_IDS, ids);
    ax_slot_put(slot, SAVE_SEG, seg);
    ax_slot_put(slot, SAVE_DE, NULL);
  }
  out->n = seg ? 2 : 1;
  out->t[0] = y;
  if (seg)
    out->t[1] = ax_tensor_retain(in->t[2]);
  return AX_OK;
}

/* Accumulates the tables' gradients from the kept de (B, S, H), widened,
 * and drops the saved state. */
static int tables_grad(ax_module *m, const ax_exec *ex, ax_slot *slot) {
  tokemb_priv *p = m->priv;
  ax_tensor *ids = ax_slot_get(slot, SAVE_IDS),
            *seg = ax_slot_get(slot, SAVE_SEG), *de = NULL;
  int B = (int)ids->shape[0], S = (int)ids->shape[1], H = p->hidden;
  ax_backend *be = ax_backend_of(ids->device);
  float *gtok = ax_grad(m, ex, 0);
  float *gpos = gtok + (size_t)p->vocab * H;
  float *gtyp = gpos + (size_t)p->seq * H;
  AX_TRY(ax_slot_get_f32(slot, SAVE_DE, &de));
  int rc = AX_K(be, embedding_bwd, B * S, H, ax_i32(ids), ax_f32(de), gtok);
  if (rc == AX_OK && seg)
    rc = AX_K(be, embedding_bwd, B * S, H, ax_i32(seg), ax_f32(de), gtyp);
  if (rc == AX_OK && B * S > 0)
    rc = AX_K(be, bias_grad, ax_f32(de), gpos, B, S * H, 1);
  ax_tensor_release(de);
  AX_TRY(rc);
  ax_slot_put(slot, SAVE_IDS, NULL); /* the state is consumed */
  ax_slot_put(slot, SAVE_SEG, NULL);
  ax_slot_put(slot, SAVE_DE, NULL);
  return AX_OK;
}

/* Whether the slot holds a forward's ids (and its segments). */
static int has_inputs(const tokemb_priv *p, ax_slot *slot) {
  return ax_slot_get(slot, SAVE_IDS) &&
         (!p->types || ax_slot_get(slot, SAVE_SEG));
}

/* The weight half: the tables' gradients from the de the input half kept,
 * then the children's weight halves. */
static int tokemb_weight(ax_module *m, const ax_exec *ex, ax_slot *slot) {
  if (!ax_slot_get(slot, SAVE_DE) || !has_inputs(m->priv, slot))
    return ax_seterr(AX_ESTATE, "token embed: weight half without input half");
  AX_TRY(tables_grad(m, ex, slot));
  return ax_walk_children(AX_BWD_WEIGHT, m, ex, slot, NULL, NULL);
}

/* The backward (module.h's walk): the children whole or their input halves
 * (`part`), de kept (so a whole backward and the two halves see the same
 * de in bf16); the whole backward then makes the tables' gradients at
 * once, the input half leaves them to the weight half. */
static int tokemb_walk(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                       ax_slot *slot, const ax_tlist *dout, ax_tlist *din) {
  tokemb_priv *p = m->priv;
  if (part == AX_BWD_WEIGHT)
    return tokemb_weight(m, ex, slot);
  if (!has_inputs(p, slot) || ax_slot_get(slot, SAVE_DE))
    return ax_slot_get(slot, SAVE_DE)
               ? ax_seterr(AX_ESTATE, "token embed: input half ran twice")
               : axi_tf_no_state("token embed");
  AX_TRY(axi_tf_check_in("token embed", dout, 1));
  ax_tensor *dh = NULL, *de = NULL;
  int rc = axi_tf_child_bwd(part, m, p->ln, ex, slot, 1, dout->t[0], &dh);
  if (rc == AX_OK && p->ln) // (B, S, H)
    rc = axi_tf_child_bwd(part, m, 0, ex, slot, 1, dh, &de);
  else if (rc == AX_OK)
    de = ax_tensor_retain(dh);
  if (rc == AX_OK)
    rc = ax_slot_put_act(slot, SAVE_DE, ex, de);
  if (rc == AX_OK && part == AX_BWD_FULL)
    rc = tables_grad(m, ex, slot);
  ax_tensor_release(dh);
  ax_tensor_release(de);
  if (rc == AX_OK && ex->need_dx) { /* integer ids and the mask: no grads */
    din->n = p->types ? 3 : 1;
    din->t[0] = din->t[1] = din->t[2] = NULL;
  }
  return rc;
}

static void tokemb_init(ax_module *m, float *params, float *buffers,
                        ax_rng *rng) {
  axi_tf_normal(params, m->n_params, AX_BERT_INIT_STD, rng);
}

static const ax_module_ops tokemb_ops = {
    /* .kind = */ "token_embed",
    /* .forward = */ tokemb_forward,
    /* .backward = */ NULL,
    /* .init = */ tokemb_init,
    /* .destroy = */ NULL,
    /* .backward_input = */ NULL,
    /* .backward_weight = */ NULL,
    /* .walk = */ tokemb_walk,
};

ax_module *ax_token_embed_new(int vocab, int seq, int types, int hidden,
                              float ln_eps, float dropout, uint64_t salt) {
  if (vocab < 1 || seq < 1 || types < 0 || hidden < 1 || ln_eps < 0) {
    ax_seterr(AX_EINVAL,
              "token embed: vocab=%d seq=%d hidden=%d must be positive, "
              "types=%d and ln_eps=%g not negative",
              vocab, seq, hidden, types, (double)ln_eps);
    return NULL;
  }
  ax_module *m = ax_module_new(&tokemb_ops, sizeof(tokemb_priv));
  if (!m)
    return NULL;
  tokemb_priv *p = m->priv;
  *p = (tokemb_priv){vocab, seq, types, hidden, ln_eps > 0};
  m->n_params = (size_t)(vocab + seq + types) * hidden;
  if ((p->ln && ax_module_add(m, ax_layernorm_new(hidden, ln_eps))) ||
      ax_module_add(m, ax_dropout_new(dropout, salt))) {
    ax_module_free(m);
    return NULL;
  }
  return m;
}
