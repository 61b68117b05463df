/* Shared by the CUDA backend's translation units: status checks that turn
 * CUDA errors into axon errors with the library's own message. CUDA types
 * never leave kernels/cuda/. */
#ifndef AX_CUDA_COMMON_CUH
#define AX_CUDA_COMMON_CUH

#include <cuda_runtime.h>

#include "kernels/backend-impl.h"
#include "runtime/error.h"

#define AX_CUDA_TRY(call)                                                      \
  do {                                                                         \
    cudaError_t ax_ce_ = (call);                                               \
    if (ax_ce_ != cudaSuccess)                                                 \
      return ax_seterr(ax_ce_ == cudaErrorMemoryAllocation ? AX_ENOMEM         \
                                                           : AX_ECUDA,         \
                       "%s: %s", #call, cudaGetErrorString(ax_ce_));           \
  } while (0)

/* Per-device backend state. Library handles are created on first use by
 * the family that needs them (cuda_blas.cu, cuda_dnn.cu) and bound to the
 * stream. */
typedef struct axi_cuda_ctx {
  int ordinal;
  cudaStream_t stream;
  void *cublas; /* cublasHandle_t */
  void *cudnn;  /* cudnnHandle_t */
  void *alloc;  /* caching allocator state (cuda_alloc.cu) */
  void *dnn;    /* cuDNN descriptor/algorithm cache (cuda_dnn.cu) */
} axi_cuda_ctx;

static inline cudaStream_t axi_cuda_stream(ax_backend *be) {
  return ((axi_cuda_ctx *)be->ctx)->stream;
}

/* Each op family fills its entries of the vtable; called once by
 * axi_cuda_backend_init. One .cu/.cuh pair per family. */
void axi_cuda_ops_blas(ax_backend_i *i);    /* gemm, axpby, sum, bias */
void axi_cuda_ops_elem(ax_backend_i *i);    /* activations, dropout, add_relu */
void axi_cuda_ops_optim(ax_backend_i *i);   /* sgd_step, adamw_step */
void axi_cuda_ops_dnn(ax_backend_i *i);     /* conv, batch norm, pooling */
void axi_cuda_ops_norm(ax_backend_i *i);    /* layer norm */
void axi_cuda_ops_softmax(ax_backend_i *i); /* xent, masked softmax, permute */
void axi_cuda_ops_embed(ax_backend_i *i);   /* embedding */

#endif
