/* Basic layers: Linear, ReLU, Flatten. Constructors return NULL with
 * ax_errmsg set on a bad configuration or out-of-memory.
 *
 * All implement the split backward (models/module.h). Between its input
 * half and its weight half a Linear keeps its input x and the output
 * gradient dy (dW = dy^T x, db = sum dy); ReLU and Flatten keep nothing. */
#ifndef AX_LAYERS_BASIC_H
#define AX_LAYERS_BASIC_H

#include "axon/models/module.h"

/* y (..., out) = x (..., in) W^T + b; W is (out, in) as in PyTorch.
 * Init: U(-1/sqrt(in), 1/sqrt(in)) for W and b (PyTorch's default), or
 * N(0, init_std^2) weights and zero bias when init_std > 0. */
ax_module *ax_linear_new(int in, int out, int bias);
ax_module *ax_linear_new_std(int in, int out, int bias, float init_std);
ax_module *ax_relu_new(void);
/* (N, d1, d2, ...) -> (N, d1 * d2 * ...) */
ax_module *ax_flatten_new(void);

#endif
