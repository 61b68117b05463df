/* GPT-2 (Radford et al. 2019), laid out as nanoGPT does, as a block list.
 *
 * Blocks: 0 "embed" (token + learned position embeddings, dropout), 1..L
 * "layer1".."layerL" (pre-LN decoder layers, models/layers/transformer.h),
 * L + 1 "head" (the final layer norm, eps 1e-5, then logits = x W_te^T).
 * W_te, the head's weight, is a tied copy of block 0's token table
 * (models/model.h): the model has one tie, so the stages that hold the two
 * copies keep them equal (Megatron's shared embedding).
 *
 * Input {ids i32 (B, T)}, T <= seq; output {logits f32 (B T, vocab)}; the
 * labels are the next-token ids (B T), -100 ignored, and the loss is the
 * mean over the kept tokens (models/loss.h).
 *
 * A training forward that asks for the loss (ax_forward_xent) gets it from
 * the head fused over chunks of rows (models/gpt_head.c): the key
 * loss_chunk sets their row count and always fuses (0, the default: the
 * fewest chunks of even rows whose logits fit 128 MiB, and fused only when that
 * keeps less memory until the backward than the logits' gradient does).
 *
 * Initialisation as GPT-2's: every weight N(0, 0.02^2), the projections
 * into the residual stream N(0, (0.02 / sqrt(2 L))^2), biases 0, layer
 * norms 1 and 0. */
#include "axon/models/gpt-impl.h"
#include "axon/models/layers/parallel.h"
#include "axon/models/layers/tf-impl.h"
#include "axon/models/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "axon/kernels/error.h"

typedef struct gpt_cfg {
  int layers, hidden, heads, ff, seq, vocab;
  float dropout;
  int loss_chunk; /* rows per chunk of the fused loss, 0: the head's own */
  ax_tp tp;       /* this member's part of the decoder layers (parallel.h) */
} gpt_cfg;

/* The presets: the sizes a preset names (explicit keys override them). */
static const struct {
  const char *name;
  int layers, hidden, heads, ff, seq, vocab;
} g_presets[] = {
    {"small", 2, 64, 4, 256, 64, 256}, /* trains in seconds on a CPU */
    {"gpt2-124m", 12, 768, 12, 3072, 1024, 50257},
};
#define N_PRESETS (int)(sizeof g_presets / sizeof g_presets[0])

/* Reads and checks the configuration; AX_EINVAL with a message naming the
 * offending key. */
static int gpt_parse(const ax_config *cfg, gpt_cfg *c) {
  const char *preset = ax_config_str(cfg, "preset", "small");
  int k = 0;
  while (k < N_PRESETS && strcmp(g_presets[k].name, preset))
    k++;
  if (k == N_PRESETS)
    return ax_seterr(AX_EINVAL, "gpt: preset=%s (known: small, gpt2-124m)",
                     preset);
  int err = AX_OK;
  c->layers = (int)ax_config_int(cfg, "layers", g_presets[k].layers, &err);
  c->hidden = (int)ax_config_int(cfg, "hidden", g_presets[k].hidden, &err);
  c->heads = (int)ax_config_int(cfg, "heads", g_presets[k].heads, &err);
  c->ff = (int)ax_config_int(cfg, "ff", g_presets[k].ff, &err);
  c->seq = (int)ax_config_int(cfg, "seq", g_presets[k].seq, &err);
  c->vocab = (int)ax_config_int(cfg, "vocab", g_presets[k].vocab, &err);
  c->dropout = (float)ax_config_float(cfg, "dropout", 0.0, &err);
  c->loss_chunk = (int)ax_config_int(cfg, "loss_chunk", 0, &err);
  c->tp.size = (int)ax_config_int(cfg, "tp", 1, &err);
  c->tp.rank = (int)ax_config_int(cfg, "tp_rank", 0, &err);
  if (err != AX_OK)
    return ax_seterr(AX_EINVAL, "gpt: a configuration value does not parse");
  if (c->layers < 1 || c->layers + 2 > AX_MODEL_MAX_BLOCKS)
    return ax_seterr(AX_EINVAL, "gpt: layers=%d outside [1, %d]", c->layers,
                     AX_MODEL_MAX_BLOCKS - 2);
  if (c->hidden < 1 || c->heads < 1 || c->hidden % c->heads != 0)
    return ax_seterr(AX_EINVAL,
                     "gpt: heads=%d must be positive and divide hidden=%d",
                     c->heads, c->hidden);
  if (c->ff < 1 || c->vocab < 1 || c->seq < 1)
    return ax_seterr(AX_EINVAL,
                     "gpt: ff=%d vocab=%d seq=%d must all be positive", c->ff,
                     c->vocab, c->seq);
  if (c->tp.size < 1 || c->tp.rank < 0 || c->tp.rank >= c->tp.size ||
      c->heads % c->tp.size != 0 || c->ff % c->tp.size != 0)
    return ax_seterr(AX_EINVAL,
                     "gpt: tp=%d tp_rank=%d: tp must divide heads=%d and "
                     "ff=%d, 0 <= tp_rank < tp",
                     c->tp.size, c->tp.rank, c->heads, c->ff);
  if (c->loss_chunk < 0)
    return ax_seterr(AX_EINVAL, "gpt: loss_chunk=%d is negative",
                     c->loss_chunk);
  if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
    return ax_seterr(AX_EINVAL, "gpt: dropout=%g outside [0, 1)",
                     (double)c->dropout);
  return AX_OK;
}

int axi_gpt_sizes_of(const ax_config *cfg, axi_gpt_sizes *out) {
  gpt_cfg c;
  AX_TRY(gpt_parse(cfg, &c));
  *out = (axi_gpt_sizes){c.layers, c.hidden, c.heads, c.ff, c.seq, c.vocab};
  return AX_OK;
}

/* The dropout salt of block i: distinct per block, the same in every
 * process that builds the block. */
static uint64_t block_salt(int i) { return ax_salt_mix(0x6e70u, (uint64_t)i); }

/* ---- the model definition ---- */

static int gpt_describe(const ax_config *cfg, ax_model_info *info) {
  gpt_cfg c;
  AX_TRY(gpt_parse(cfg, &c));
  int L = c.layers;
  info->n_blocks = L + 2;
  snprintf(info->block_names[0], sizeof info->block_names[0], "embed");
  for (int i = 1; i <= L; i++)
    snprintf(info->block_names[i], sizeof info->block_names[i], "layer%d", i);
  snprintf(info->block_names[L + 1], sizeof info->block_names[0], "head");
  info->n_outputs = 1;
  info->ignore_index = -100;
  /* The head's projection weight (vocab, hidden), after its layer norm's
   * 2 hidden parameters, is the token table, block 0's first. */
  size_t H = (size_t)c.hidden;
  info->n_ties = 1;
  info->ties[0] = (ax_model_tie){0, L + 1, 0, 2 * H, (size_t)c.vocab * H};
  return AX_OK;
}

static int gpt_build_block(const ax_config *cfg, int index, ax_module **out) {
  *out = NULL;
  gpt_cfg c;
  AX_TRY(gpt_parse(cfg, &c));
  if (index < 0 || index > c.layers + 1)
    return ax_seterr(AX_EINVAL, "gpt: block %d outside [0, %d)", index,
                     c.layers + 2);
  ax_module *m;
  if (index == 0)
    m = ax_token_embed_new(c.vocab, c.seq, 0, c.hidden, 0.0f, c.dropout,
                           block_salt(0));
  else if (index <= c.layers)
    m = ax_decoder_layer_new_tp(
        c.hidden, c.heads, c.ff, c.dropout, block_salt(index),
        AX_BERT_INIT_STD / sqrtf(2.0f * c.layers), c.tp);
  else
    m = axi_gpt_head_new(c.hidden, c.vocab, c.loss_chunk);
  if (!m)
    return ax_seterr(AX_ENOMEM, "gpt: cannot build block %d: %s", index,
                     ax_errmsg());
  *out = m;
  return AX_OK;
}

const ax_model_def ax_model_gpt = {
    /* .name = */ "gpt",
    /* .default_config = */ "preset=small,dropout=0,tp=1,tp_rank=0",
    /* .describe = */ gpt_describe,
    /* .build_block = */ gpt_build_block,
};
