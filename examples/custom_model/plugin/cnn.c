/* The "fmcnn" model (custom.h): its configuration and its four blocks,
 * built from libaxon's layers and the example's own PReLU. */
#include <stdio.h>

#include "custom.h"
#include <axon/models/layers/basic.h>
#include <axon/models/layers/vision.h>

#define FMCNN_BLOCKS 4

typedef struct fmcnn_cfg {
  int64_t ch[3];
  int in_channels, classes;
} fmcnn_cfg;

static int fmcnn_config(const ax_config *cfg, fmcnn_cfg *c) {
  int err = AX_OK;
  int n = ax_config_ints(cfg, "channels", c->ch, 3, &err);
  c->in_channels = (int)ax_config_int(cfg, "in_channels", 1, &err);
  c->classes = (int)ax_config_int(cfg, "classes", 10, &err);
  if (err != AX_OK || n != 3)
    return ax_seterr(AX_EINVAL, "fmcnn: channels=C0/C1/C2, in_channels and "
                                "classes must be integers");
  if (c->ch[0] < 1 || c->ch[1] < 1 || c->ch[2] < 1 || c->in_channels < 1 ||
      c->classes < 1)
    return ax_seterr(AX_EINVAL, "fmcnn: every width must be positive");
  return AX_OK;
}

static int fmcnn_describe(const ax_config *cfg, ax_model_info *info) {
  static const char *const names[FMCNN_BLOCKS] = {"conv1", "conv2", "conv3",
                                                  "head"};
  fmcnn_cfg c;
  AX_TRY(fmcnn_config(cfg, &c));
  info->n_blocks = FMCNN_BLOCKS;
  for (int i = 0; i < FMCNN_BLOCKS; i++)
    snprintf(info->block_names[i], sizeof info->block_names[i], "%s", names[i]);
  info->n_outputs = 1;
  info->ignore_index = -100;
  return AX_OK;
}

static int fmcnn_build_block(const ax_config *cfg, int index, ax_module **out) {
  fmcnn_cfg c;
  *out = NULL;
  AX_TRY(fmcnn_config(cfg, &c));
  if (index < 0 || index >= FMCNN_BLOCKS)
    return ax_seterr(AX_EINVAL, "fmcnn: no block %d", index);
  int in = index == 0 ? c.in_channels : (int)c.ch[index - 1];
  int ch = index < 3 ? (int)c.ch[index] : 0;
  ax_module *parts[5] = {0};
  int n = 0;
  if (index < 3) {
    parts[n++] = ax_conv2d_new(in, ch, 3, 1, 1, 1);
    if (index == 1)
      parts[n++] = ax_batchnorm2d_new(ch, 0.1f, 1e-5f);
    parts[n++] = cm_prelu_new(ch);
    parts[n++] =
        index < 2 ? ax_maxpool2d_new(2, 2, 0) : ax_global_avgpool_new();
  } else {
    parts[n++] = ax_linear_new((int)c.ch[2], c.classes, 1);
  }
  ax_module *blk = ax_sequential_new();
  int rc = blk ? AX_OK : AX_ENOMEM;
  for (int i = 0; i < n; i++) {
    if (rc == AX_OK && !parts[i])
      rc = ax_seterr(AX_ENOMEM, "fmcnn: block %d: %s", index, ax_errmsg());
    if (rc == AX_OK) { /* takes the part, also on failure */
      rc = ax_module_add(blk, parts[i]);
      parts[i] = NULL;
    }
    ax_module_free(parts[i]);
  }
  if (rc != AX_OK) {
    ax_module_free(blk);
    return rc;
  }
  *out = blk;
  return AX_OK;
}

const ax_model_def cm_fmcnn = {
    /* .name = */ "fmcnn",
    /* .default_config = */ "channels=8/16/32,in_channels=1,classes=10",
    /* .describe = */ fmcnn_describe,
    /* .build_block = */ fmcnn_build_block,
};
