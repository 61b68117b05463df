/* A plugin (runtime/autograd/plugin.h) with the model "tied" for
 * test_pipe_ties: a tiny language-model-like chain whose output layer is
 * tied to its embedding table (models/model.h), built by
 * tests/CMakeLists.txt as test_plugin_ties.so. The test and its agents
 * load it, so both know the model (ax_model_register at load).
 *
 * Config keys vocab V, hidden H, layers L (default 12, 8, 2). Blocks: 0
 * "embed" (an embedding table (V, H): i32 ids (B) -> (B, H)), 1..L
 * "layer1".. (Linear H -> H, tanh), L + 1 "head" (Linear H -> V with bias:
 * logits (B, V)). The head's weight (V, H), the first V H of its
 * parameters, is tied to the embedding table. */
#include "axon/models/layers/basic.h"
#include "axon/models/layers/transformer.h"
#include "axon/runtime/autograd/plugin.h"

#include <stdio.h>

AX_PLUGIN_EXPORT const uint32_t axon_plugin_abi = AX_PLUGIN_ABI;

typedef struct tied_cfg {
  int vocab, hidden, layers;
} tied_cfg;

static int parse(const ax_config *cfg, tied_cfg *c) {
  int err = AX_OK;
  c->vocab = (int)ax_config_int(cfg, "vocab", 12, &err);
  c->hidden = (int)ax_config_int(cfg, "hidden", 8, &err);
  c->layers = (int)ax_config_int(cfg, "layers", 2, &err);
  if (err != AX_OK || c->vocab < 2 || c->hidden < 1 || c->layers < 0 ||
      c->layers + 2 > AX_MODEL_MAX_BLOCKS)
    return ax_seterr(AX_EINVAL, "tied: bad configuration");
  return AX_OK;
}

static int describe(const ax_config *cfg, ax_model_info *info) {
  tied_cfg c;
  AX_TRY(parse(cfg, &c));
  info->n_blocks = c.layers + 2;
  snprintf(info->block_names[0], sizeof info->block_names[0], "embed");
  for (int i = 1; i <= c.layers; i++)
    snprintf(info->block_names[i], sizeof info->block_names[i], "layer%d", i);
  snprintf(info->block_names[c.layers + 1], sizeof info->block_names[0],
           "head");
  info->n_outputs = 1;
  info->ignore_index = -100;
  info->n_ties = 1;
  info->ties[0] =
      (ax_model_tie){0, c.layers + 1, 0, 0, (size_t)c.vocab * (size_t)c.hidden};
  return AX_OK;
}

static int build_block(const ax_config *cfg, int index, ax_module **out) {
  tied_cfg c;
  AX_TRY(parse(cfg, &c));
  ax_module *m = NULL;
  if (index == 0) {
    m = ax_embedding_new(c.vocab, c.hidden);
  } else if (index <= c.layers) {
    m = ax_sequential_new();
    if (m && (ax_module_add(m, ax_linear_new(c.hidden, c.hidden, 1)) ||
              ax_module_add(m, ax_tanh_new()))) {
      ax_module_free(m);
      m = NULL;
    }
  } else if (index == c.layers + 1) {
    m = ax_linear_new(c.hidden, c.vocab, 1);
  } else {
    return ax_seterr(AX_EINVAL, "tied: no block %d", index);
  }
  *out = m;
  return m ? AX_OK : AX_ENOMEM;
}

static const ax_model_def g_tied = {"tied", "vocab=12,hidden=8,layers=2",
                                    describe, build_block};

AX_PLUGIN_EXPORT int axon_plugin_init(ax_node *node) {
  return node ? AX_OK : ax_model_register(&g_tied);
}
