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
    m = ax_token_embed_new(c.vocab, c.seq, c.types, c.hidden, AX_BERT_LN_EPS,
                           c.dropout, block_salt(0));
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
