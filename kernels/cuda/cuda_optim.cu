/* CUDA backend: the optim op family (to be filled in). */
#include "kernels/cuda/cuda_common.cuh"

void axi_cuda_ops_optim(ax_backend_i *i) { (void)i; }
