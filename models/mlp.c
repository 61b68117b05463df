/* MLP: Flatten, then Linear + ReLU blocks, then a Linear head.
 * Config: widths=784/256/128/10 (input, hidden..., classes). Block i is
 * Linear(widths[i], widths[i+1]) followed by ReLU except for the last; block
 * 0 starts with Flatten so images (B, 1, 28, 28) feed straight in. */
#include <stdio.h>

#include "axon/models/layers/basic.h"
#include "axon/models/model.h"

#define MLP_MAX_WIDTHS 32

static int mlp_widths(const ax_config *cfg, int64_t *w) {
  int err = AX_OK;
  int n = ax_config_ints(cfg, "widths", w, MLP_MAX_WIDTHS, &err);
  if (err != AX_OK)
    return -1;
  if (n < 2) {
    ax_seterr(AX_EINVAL, "mlp: widths needs at least input/classes");
    return -1;
  }
  for (int i = 0; i < n; i++)
    if (w[i] <= 0) {
      ax_seterr(AX_EINVAL, "mlp: width %lld must be positive", (long long)w[i]);
      return -1;
    }
  return n;
}

static int mlp_describe(const ax_config *cfg, ax_model_info *info) {
  int64_t w[MLP_MAX_WIDTHS];
  int n = mlp_widths(cfg, w);
  if (n < 0)
    return AX_EINVAL;
  info->n_blocks = n - 1;
  for (int i = 0; i < n - 1; i++)
    snprintf(info->block_names[i], sizeof info->block_names[i],
             i == n - 2 ? "head" : "fc%d", i + 1);
  info->n_outputs = 1;
  info->ignore_index = -100;
  return AX_OK;
}

static int mlp_build_block(const ax_config *cfg, int index, ax_module **out) {
  int64_t w[MLP_MAX_WIDTHS];
  int n = mlp_widths(cfg, w);
  *out = NULL;
  if (n < 0)
    return AX_EINVAL;
  if (index < 0 || index >= n - 1)
    return ax_seterr(AX_EINVAL, "mlp: no block %d", index);
  ax_module *blk = ax_sequential_new();
  int rc = blk ? AX_OK : AX_ENOMEM;
  if (rc == AX_OK && index == 0)
    rc = ax_module_add(blk, ax_flatten_new());
  if (rc == AX_OK)
    rc = ax_module_add(blk, ax_linear_new((int)w[index], (int)w[index + 1], 1));
  if (rc == AX_OK && index < n - 2)
    rc = ax_module_add(blk, ax_relu_new());
  if (rc != AX_OK) {
    ax_module_free(blk);
    return rc;
  }
  *out = blk;
  return AX_OK;
}

const ax_model_def ax_model_mlp = {
    /* .name = */ "mlp",
    /* .default_config = */ "widths=784/256/128/10",
    /* .describe = */ mlp_describe,
    /* .build_block = */ mlp_build_block,
};
