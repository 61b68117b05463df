/* ResNet20 for CIFAR-sized images (He et al., 2016, section 4.2).
 *
 * Blocks: 0 "stem" = conv3x3(in_channels -> 16) + BN + ReLU; 1..9
 * "block1".."block9" = BasicBlocks, three at 16 channels, three at 32 (the
 * first with stride 2) and three at 64 (the first with stride 2), with 1x1
 * convolution + BN projection shortcuts where the shape changes (option B);
 * 10 "head" = global average pooling + Linear(64 -> classes).
 *
 * Input {f32 (B, in_channels, image, image)}, output {f32 logits
 * (B, classes)}. With in_channels=3 and classes=10 the model has 272,474
 * parameters (the paper's 0.27M). */
#include <stdio.h>

#include "axon/models/layers/basic.h"
#include "axon/models/layers/vision.h"
#include "axon/models/model.h"

#define RESNET20_BLOCKS 11

typedef struct resnet_cfg {
  int in_channels, classes, image;
} resnet_cfg;

static int resnet_config(const ax_config *cfg, resnet_cfg *rc) {
  int err = AX_OK;
  rc->in_channels = (int)ax_config_int(cfg, "in_channels", 1, &err);
  rc->classes = (int)ax_config_int(cfg, "classes", 10, &err);
  rc->image = (int)ax_config_int(cfg, "image", 32, &err);
  if (err != AX_OK)
    return ax_seterr(AX_EINVAL,
                     "resnet20: in_channels, classes and image must be "
                     "integers");
  if (rc->in_channels <= 0 || rc->classes <= 0 || rc->image < 4)
    return ax_seterr(AX_EINVAL,
                     "resnet20: need in_channels > 0, classes > 0 and image "
                     ">= 4 (got %d, %d, %d)",
                     rc->in_channels, rc->classes, rc->image);
  return AX_OK;
}

static int resnet_describe(const ax_config *cfg, ax_model_info *info) {
  resnet_cfg rc;
  AX_TRY(resnet_config(cfg, &rc));
  info->n_blocks = RESNET20_BLOCKS;
  for (int i = 0; i < RESNET20_BLOCKS; i++) {
    if (i == 0)
      snprintf(info->block_names[i], sizeof info->block_names[i], "stem");
    else if (i == RESNET20_BLOCKS - 1)
      snprintf(info->block_names[i], sizeof info->block_names[i], "head");
    else
      snprintf(info->block_names[i], sizeof info->block_names[i], "block%d", i);
  }
  info->n_outputs = 1;
  info->ignore_index = -100;
  return AX_OK;
}

/* Appends `child` to seq, keeping the first error. */
static int add(ax_module *seq, ax_module *child, int rc) {
  if (rc != AX_OK) {
    ax_module_free(child);
    return rc;
  }
  if (!child) /* the constructor's message stands */
    return AX_EINVAL;
  return ax_module_add(seq, child);
}

static int resnet_build_block(const ax_config *cfg, int index,
                              ax_module **out) {
  resnet_cfg c;
  *out = NULL;
  AX_TRY(resnet_config(cfg, &c));
  if (index < 0 || index >= RESNET20_BLOCKS)
    return ax_seterr(AX_EINVAL, "resnet20: no block %d (it has %d)", index,
                     RESNET20_BLOCKS);
  if (index >= 1 && index <= 9) {
    int stage = (index - 1) / 3, first = (index - 1) % 3 == 0;
    int width = 16 << stage;
    int in = first && stage > 0 ? width / 2 : width;
    int stride = first && stage > 0 ? 2 : 1;
    *out = ax_basic_block_new(in, width, stride);
    return *out ? AX_OK : AX_ENOMEM;
  }
  ax_module *seq = ax_sequential_new();
  if (!seq)
    return ax_seterr(AX_ENOMEM, "resnet20: out of memory");
  int rc = AX_OK;
  if (index == 0) {
    rc = add(seq, ax_conv2d_new(c.in_channels, 16, 3, 1, 1, 0), rc);
    rc = add(seq, ax_batchnorm2d_relu_new(16, 0.1f, 1e-5f), rc);
  } else {
    rc = add(seq, ax_global_avgpool_new(), rc);
    rc = add(seq, ax_linear_new(64, c.classes, 1), rc);
  }
  if (rc != AX_OK) {
    ax_module_free(seq);
    return rc;
  }
  *out = seq;
  return AX_OK;
}

const ax_model_def ax_model_resnet20 = {
    /* .name = */ "resnet20",
    /* .default_config = */ "in_channels=1,classes=10,image=32",
    /* .describe = */ resnet_describe,
    /* .build_block = */ resnet_build_block,
};
