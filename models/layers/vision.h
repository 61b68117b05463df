/* Vision layers: convolution, batch norm, pooling and the residual
 * BasicBlock of CIFAR ResNets. All take and return one f32 tensor in NCHW
 * layout (GlobalAvgPool returns (N, C)). Constructors return NULL with
 * ax_errmsg set on a bad configuration or out-of-memory.
 *
 * Forward checks the input shape and fails with AX_ESHAPE naming the layer,
 * the expected and the actual shape. All arithmetic runs through the kernel
 * backend of the input's device.
 *
 * Every layer implements the split backward (models/module.h). Between
 * its input half and its weight half a slot keeps: conv2d its input and
 * output gradient; batch norm only its (2, C) parameter-gradient sums;
 * pooling nothing; the BasicBlock what its children keep. */
#ifndef AX_LAYERS_VISION_H
#define AX_LAYERS_VISION_H

#include "axon/models/module.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y (N, out, OH, OW) = conv(x (N, in, H, W)) with a square kernel, stride
 * and zero padding; bias optional. Parameters: weight (out, in, k, k), then
 * bias (out). Init: Kaiming normal, fan_in mode, gain sqrt(2)
 * (std = sqrt(2 / (in * k * k))); bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)). */
ax_module *ax_conv2d_new(int in, int out, int kernel, int stride, int padding,
                         int bias);

/* Batch norm over (N, H, W) per channel of x (N, C, H, W); also accepts
 * (N, C). Parameters gamma (C), beta (C) initialised to 1 and 0; buffers
 * running mean (C) and running variance (C) initialised to 0 and 1.
 * Training: normalises with the batch statistics and, when ex->update_stats,
 * sets run = (1 - momentum) * run + momentum * batch (unbiased variance).
 * Evaluation: normalises with the running statistics; such a forward has no
 * backward (AX_EUNSUPPORTED). Training needs more than one value per channel
 * (AX_ESHAPE otherwise). */
ax_module *ax_batchnorm2d_new(int channels, float momentum, float eps);
/* Batch norm followed by a ReLU, as one module with the parameters and
 * buffers of ax_batchnorm2d_new; it keeps its output for the backward. */
ax_module *ax_batchnorm2d_relu_new(int channels, float momentum, float eps);

/* Max pooling with a square window; padding counts as -inf. */
ax_module *ax_maxpool2d_new(int kernel, int stride, int padding);
/* Average pooling with a square window; the divisor is always kernel^2
 * (count_include_pad). */
ax_module *ax_avgpool2d_new(int kernel, int stride, int padding);
/* (N, C, H, W) -> (N, C): the mean over each plane. */
ax_module *ax_global_avgpool_new(void);

/* The residual block of He et al. (2016):
 *   y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)),
 * 3x3 convolutions without bias, conv1 with the given stride. The shortcut
 * is the identity when in == out and stride == 1, and otherwise a 1x1
 * convolution with that stride followed by batch norm ("option B").
 * Children in order: conv1, bn1 (a batch norm with the first ReLU fused,
 * ax_batchnorm2d_relu_new), conv2, bn2[, shortcut conv, shortcut bn]. */
ax_module *ax_basic_block_new(int in, int out, int stride);

#ifdef __cplusplus
}
#endif
#endif
