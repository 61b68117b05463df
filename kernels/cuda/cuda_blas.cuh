/* CUDA backend, BLAS family: cuBLAS status checks and the backend's cuBLAS
 * handle. CUDA types never leave kernels/cuda/. */
#ifndef AX_CUDA_BLAS_CUH
#define AX_CUDA_BLAS_CUH

#include <cublas_v2.h>

#include "axon/kernels/cuda/cuda_common.cuh"

/* Returns from the calling function with an axon error carrying cuBLAS's
 * own name and description of the status. */
#define AX_CUBLAS_TRY(call)                                                    \
  do {                                                                         \
    cublasStatus_t ax_cb_ = (call);                                            \
    if (ax_cb_ != CUBLAS_STATUS_SUCCESS)                                       \
      return ax_seterr(ax_cb_ == CUBLAS_STATUS_ALLOC_FAILED ? AX_ENOMEM        \
                                                            : AX_ECUBLAS,      \
                       "%s: %s (%s)", #call, cublasGetStatusString(ax_cb_),    \
                       cublasGetStatusName(ax_cb_));                           \
  } while (0)

/* The backend's cuBLAS handle (ctx->cublas), created on first use on the
 * backend's device and bound to its stream. The caller has made the device
 * current. Thread-safe. */
int axi_cuda_cublas(ax_backend *be, cublasHandle_t *out);

#endif
