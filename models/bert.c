/* The simplified BERT of the seed study (MLM + NSP pre-training).
 *
 * Blocks: 0 "embed" (token + learned position + segment embeddings, layer
 * norm, dropout), 1..L "layer1".."layerL" (post-LN encoder layers), L + 1
 * "heads" (masked-LM head and next-sentence head). The MLM decoder is not
 * tied to the token embedding, so every stage owns its weights. */
#include "axon/models/layers/parallel.h"
#include "axon/models/layers/tf-impl.h"
#include "axon/models/model.h"

#include <stdio.h>
#include <stdlib.h>

#include "axon/kernels/error.h"

typedef struct bert_cfg {
  int layers, hidden, heads, ff, vocab, seq, types;
  float dropout;
  ax_tp tp; /* this member's part of the encoder layers (parallel.h) */
} bert_cfg;

/* Reads and checks the configuration; AX_EINVAL with a message naming the
 * offending key. */
static int bert_parse(const ax_config *cfg, bert_cfg *c) {
  int err = AX_OK;
  c->layers = (int)ax_config_int(cfg, "layers", 3, &err);
  c->hidden = (int)ax_config_int(cfg, "hidden", 768, &err);
  c->heads = (int)ax_config_int(cfg, "heads", 12, &err);
  c->ff = (int)ax_config_int(cfg, "ff", 3072, &err);
  c->vocab = (int)ax_config_int(cfg, "vocab", 8192, &err);
  c->seq = (int)ax_config_int(cfg, "seq", 128, &err);
  c->types = (int)ax_config_int(cfg, "types", 2, &err);
  c->dropout = (float)ax_config_float(cfg, "dropout", 0.1, &err);
  c->tp.size = (int)ax_config_int(cfg, "tp", 1, &err);
  c->tp.rank = (int)ax_config_int(cfg, "tp_rank", 0, &err);
  if (err != AX_OK)
    return ax_seterr(AX_EINVAL, "bert: a configuration value does not parse");
  if (c->layers < 1 || c->layers + 2 > AX_MODEL_MAX_BLOCKS)
    return ax_seterr(AX_EINVAL, "bert: layers=%d outside [1, %d]", c->layers,
                     AX_MODEL_MAX_BLOCKS - 2);
  if (c->hidden < 1 || c->heads < 1 || c->hidden % c->heads != 0)
    return ax_seterr(AX_EINVAL,
                     "bert: heads=%d must be positive and divide hidden=%d",
                     c->heads, c->hidden);
  if (c->ff < 1 || c->vocab < 1 || c->seq < 1 || c->types < 1)
    return ax_seterr(AX_EINVAL,
                     "bert: ff=%d vocab=%d seq=%d types=%d must "
                     "all be positive",
                     c->ff, c->vocab, c->seq, c->types);
  if (c->tp.size < 1 || c->tp.rank < 0 || c->tp.rank >= c->tp.size ||
      c->heads % c->tp.size != 0 || c->ff % c->tp.size != 0)
    return ax_seterr(AX_EINVAL,
                     "bert: tp=%d tp_rank=%d: tp must divide "
                     "heads=%d and ff=%d, 0 <= tp_rank < tp",
                     c->tp.size, c->tp.rank, c->heads, c->ff);
  if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
    return ax_seterr(AX_EINVAL, "bert: dropout=%g outside [0, 1)",
                     (double)c->dropout);
  return AX_OK;
}

/* The dropout salt of block i: distinct per block, the same in every
 * process that builds the block. */
static uint64_t block_salt(int i) { return ax_salt_mix(0xbe27u, (uint64_t)i); }

/* ---- block 0: embeddings ---- */

typedef struct embed_priv {
  int vocab, seq, types, hidden;
} embed_priv;

/* Own parameters: token (vocab, H), position (seq, H), segment (types, H).
 * Children: 0 layer norm, 1 dropout. Slot: 0 = ids, 1 = segments from
 * forward until the tables' gradients are made; between the halves also
 * 2 = the gradient of the summed embeddings (B, S, H), which the tables'
 * gradients scatter. */
enum { SAVE_IDS = 0, SAVE_SEG = 1, SAVE_DE = 2 };

static int embed_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                         const ax_tlist *in, ax_tlist *out) {
  embed_priv *p = m->priv;
  if (in->n < 3 || !in->t[0] || !in->t[1] || !in->t[2])
    return ax_seterr(AX_EINVAL, "bert embed: expected {ids, segments, mask}");
  ax_tensor *ids = in->t[0], *seg = in->t[1], *mask = in->t[2];
  AX_TRY(ax_tensor_check(ids, "bert embed: ids", AX_I32, 2, NULL));
  int64_t bs[2] = {ids->shape[0], ids->shape[1]};
  AX_TRY(ax_tensor_check(seg, "bert embed: segments", AX_I32, 2, bs));
  AX_TRY(ax_tensor_check(mask, "bert embed: mask", AX_F32, 2, bs));
  if (!ax_device_eq(seg->device, ids->device) ||
      !ax_device_eq(mask->device, ids->device))
    return ax_seterr(AX_EDEVICE, "bert embed: inputs on different devices");
  int B = (int)bs[0], S = (int)bs[1], H = p->hidden, n = B * S;
  if (S > p->seq)
    return ax_seterr(AX_ESHAPE, "bert embed: %d tokens exceed seq=%d", S,
                     p->seq);
  int64_t shape[3] = {B, S, H};
  ax_tensor *e = axi_tf_new(3, shape, ids->device); // (B, S, H)
  ax_tensor *s = axi_tf_new(3, shape, ids->device);
  ax_tensor *h = NULL, *y = NULL;
  ax_backend *be = ax_backend_of(ids->device);
  const float *tok = ax_param(m, ex, 0);
  const float *pos = tok + (size_t)p->vocab * H;
  const float *typ = pos + (size_t)p->seq * H;
  int rc = e && s ? AX_OK : AX_ENOMEM;
  if (rc == AX_OK)
    rc = AX_K(be, embedding_fwd, n, H, p->vocab, ax_i32(ids), tok, ax_f32(e));
  if (rc == AX_OK)
    rc = AX_K(be, embedding_fwd, n, H, p->types, ax_i32(seg), typ, ax_f32(s));
  if (rc == AX_OK)
    rc = AX_K(be, axpby, (size_t)n * H, 1.0f, ax_f32(s), 1.0f, ax_f32(e));
  /* Positions 0..S-1 are the first S rows of the table for every sequence:
   * a bias over (B, S * H). */
  if (rc == AX_OK && n > 0)
    rc = AX_K(be, bias_add, ax_f32(e), pos, B, S * H, 1);
  if (rc == AX_OK)
    rc = axi_tf_child_fwd(m, 0, ex, slot, e, &h);
  if (rc == AX_OK)
    rc = axi_tf_child_fwd(m, 1, ex, slot, h, &y);
  ax_tensor_release(e);
  ax_tensor_release(s);
  ax_tensor_release(h);
  if (rc != AX_OK)
    return rc;
  if (slot) {
    ax_slot_put(slot, SAVE_IDS, ids);
    ax_slot_put(slot, SAVE_SEG, seg);
    ax_slot_put(slot, SAVE_DE, NULL);
  }
  out->n = 2;
  out->t[0] = y;
  out->t[1] = ax_tensor_retain(mask);
  return AX_OK;
}

/* Accumulates the three tables' gradients from de (B, S, H) and drops the
 * saved ids and segments. */
static int embed_tables_grad(ax_module *m, const ax_exec *ex, ax_slot *slot,
                             ax_tensor *de) {
  embed_priv *p = m->priv;
  ax_tensor *ids = ax_slot_get(slot, SAVE_IDS),
            *seg = ax_slot_get(slot, SAVE_SEG);
  int B = (int)ids->shape[0], S = (int)ids->shape[1], H = p->hidden;
  ax_backend *be = ax_backend_of(ids->device);
  float *gtok = ax_grad(m, ex, 0);
  float *gpos = gtok + (size_t)p->vocab * H;
  float *gtyp = gpos + (size_t)p->seq * H;
  AX_TRY(AX_K(be, embedding_bwd, B * S, H, ax_i32(ids), ax_f32(de), gtok));
  AX_TRY(AX_K(be, embedding_bwd, B * S, H, ax_i32(seg), ax_f32(de), gtyp));
  if (B * S > 0)
    AX_TRY(AX_K(be, bias_grad, ax_f32(de), gpos, B, S * H, 1));
  ax_slot_put(slot, SAVE_IDS, NULL); /* the state is consumed */
  ax_slot_put(slot, SAVE_SEG, NULL);
  ax_slot_put(slot, SAVE_DE, NULL);
  return AX_OK;
}

/* The weight half: the tables' gradients from the de the input half kept,
 * then the children's weight halves. */
static int embed_weight(ax_module *m, const ax_exec *ex, ax_slot *slot) {
  ax_tensor *de = ax_slot_get(slot, SAVE_DE);
  if (!de || !ax_slot_get(slot, SAVE_IDS) || !ax_slot_get(slot, SAVE_SEG))
    return ax_seterr(AX_ESTATE, "bert embed: weight half without input half");
  AX_TRY(embed_tables_grad(m, ex, slot, de));
  return ax_walk_children(AX_BWD_WEIGHT, m, ex, slot, NULL, NULL);
}

/* The backward (module.h's walk): the children whole or their input halves
 * (`part`); the whole backward then makes the tables' gradients at once,
 * the input half keeps de for the weight half. */
static int embed_walk(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                      ax_slot *slot, const ax_tlist *dout, ax_tlist *din) {
  if (part == AX_BWD_WEIGHT)
    return embed_weight(m, ex, slot);
  if (!ax_slot_get(slot, SAVE_IDS) || !ax_slot_get(slot, SAVE_SEG) ||
      ax_slot_get(slot, SAVE_DE))
    return ax_slot_get(slot, SAVE_DE)
               ? ax_seterr(AX_ESTATE, "bert embed: input half ran twice")
               : axi_tf_no_state("bert embed");
  AX_TRY(axi_tf_check_in("bert embed", dout, 1));
  ax_tensor *dh = NULL, *de = NULL;
  int rc = axi_tf_child_bwd(part, m, 1, ex, slot, 1, dout->t[0], &dh);
  if (rc == AX_OK) // (B, S, H)
    rc = axi_tf_child_bwd(part, m, 0, ex, slot, 1, dh, &de);
  if (rc == AX_OK && part == AX_BWD_FULL)
    rc = embed_tables_grad(m, ex, slot, de);
  else if (rc == AX_OK)
    ax_slot_put(slot, SAVE_DE, de);
  ax_tensor_release(dh);
  ax_tensor_release(de);
  if (rc == AX_OK && ex->need_dx) { /* integer ids and the mask: no grads */
    din->n = 3;
    din->t[0] = din->t[1] = din->t[2] = NULL;
  }
  return rc;
}

static void embed_init(ax_module *m, float *params, float *buffers,
                       ax_rng *rng) {
  axi_tf_normal(params, m->n_params, AX_BERT_INIT_STD, rng);
}

static const ax_module_ops embed_ops = {
    /* .kind = */ "bert_embed",
    /* .forward = */ embed_forward,
    /* .backward = */ NULL,
    /* .init = */ embed_init,
    /* .destroy = */ NULL,
    /* .backward_input = */ NULL,
    /* .backward_weight = */ NULL,
    /* .walk = */ embed_walk,
};

static ax_module *embed_new(const bert_cfg *c) {
  ax_module *m = ax_module_new(&embed_ops, sizeof(embed_priv));
  if (!m)
    return NULL;
  embed_priv *p = m->priv;
  p->vocab = c->vocab;
  p->seq = c->seq;
  p->types = c->types;
  p->hidden = c->hidden;
  m->n_params = (size_t)(c->vocab + c->seq + c->types) * c->hidden;
  if (ax_module_add(m, ax_layernorm_new(c->hidden, AX_BERT_LN_EPS)) ||
      ax_module_add(m, ax_dropout_new(c->dropout, block_salt(0)))) {
    ax_module_free(m);
    return NULL;
  }
  return m;
}

/* ---- block L + 1: pre-training heads (models/bert_heads.c) ---- */

ax_module *axi_bert_heads_new(int hidden, int vocab);

/* ---- the model definition ---- */

static int bert_describe(const ax_config *cfg, ax_model_info *info) {
  bert_cfg c;
  AX_TRY(bert_parse(cfg, &c));
  info->n_blocks = c.layers + 2;
  snprintf(info->block_names[0], sizeof info->block_names[0], "embed");
  for (int i = 1; i <= c.layers; i++)
    snprintf(info->block_names[i], sizeof info->block_names[i], "layer%d", i);
  snprintf(info->block_names[c.layers + 1], sizeof info->block_names[0],
           "heads");
  info->n_outputs = 2;
  info->ignore_index = -100;
  return AX_OK;
}

static int bert_build_block(const ax_config *cfg, int index, ax_module **out) {
  *out = NULL;
  bert_cfg c;
  AX_TRY(bert_parse(cfg, &c));
  if (index < 0 || index > c.layers + 1)
    return ax_seterr(AX_EINVAL, "bert: block %d outside [0, %d)", index,
                     c.layers + 2);
  ax_module *m;
  if (index == 0)
    m = embed_new(&c);
  else if (index <= c.layers)
    m = ax_encoder_layer_new_tp(c.hidden, c.heads, c.ff, c.dropout,
                                block_salt(index), c.tp);
  else
    m = axi_bert_heads_new(c.hidden, c.vocab);
  if (!m)
    return ax_seterr(AX_ENOMEM, "bert: cannot build block %d: %s", index,
                     ax_errmsg());
  *out = m;
  return AX_OK;
}

const ax_model_def ax_model_bert = {
    /* .name = */ "bert",
    /* .default_config = */
    "layers=3,hidden=768,heads=12,ff=3072,vocab=8192,seq=128,types=2,"
    "dropout=0.1,tp=1,tp_rank=0",
    /* .describe = */ bert_describe,
    /* .build_block = */ bert_build_block,
};
