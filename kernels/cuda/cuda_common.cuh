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

/* Per-device backend state. */
typedef struct axi_cuda_ctx {
  int ordinal;
  cudaStream_t stream;
} axi_cuda_ctx;

static inline cudaStream_t axi_cuda_stream(ax_backend *be) {
  return ((axi_cuda_ctx *)be->ctx)->stream;
}

#endif
