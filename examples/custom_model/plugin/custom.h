/* The custom_model example's plugin: a model that is not in libaxon and a
 * layer written here, through the public module interface only.
 *
 * Model "fmcnn": a small CNN for Fashion-MNIST (1 x 28 x 28 images, any size
 * from 4 x 4 works) in four blocks, the units a pipeline splits it at:
 *   0 "conv1": conv3x3(in_channels -> c0) + PReLU + maxpool 2
 *   1 "conv2": conv3x3(c0 -> c1) + batch norm + PReLU + maxpool 2
 *   2 "conv3": conv3x3(c1 -> c2) + PReLU + global average pooling
 *   3 "head":  Linear(c2 -> classes)
 * Configuration: channels=c0/c1/c2 (default 8/16/32), in_channels=1,
 * classes=10.
 *
 * Layer PReLU (He et al., 2015): y = x where x > 0, a_c x elsewhere, with
 * one learned slope a_c per channel (dim 1 of (N, C, ...) inputs), initial
 * value 0.25. CPU tensors only: the example ships no CUDA kernel, so it
 * refuses device tensors with AX_EUNSUPPORTED. */
#ifndef CUSTOM_MODEL_H
#define CUSTOM_MODEL_H

#include <axon/models/model.h>

/* A PReLU over `channels` channels; NULL (ax_errmsg set) when channels < 1
 * or out of memory. */
ax_module *cm_prelu_new(int channels);

/* The "fmcnn" model. */
extern const ax_model_def cm_fmcnn;

#endif
