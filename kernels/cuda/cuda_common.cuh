/* Shared by the CUDA backend's translation units: status checks that turn
 * CUDA errors into axon errors with the library's own message. CUDA types
 * never leave kernels/cuda/. */
#ifndef AX_CUDA_COMMON_CUH
#define AX_CUDA_COMMON_CUH

#include <cuda_runtime.h>

#include "axon/kernels/backend-impl.h"
#include "axon/kernels/error.h"

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
  /* gemm_bf16's bf16 copies of f32 operands (A, B), from the caching
   * allocator, grown as needed and kept; guarded by cuda_blas.cu's lock. */
  void *bf16_scratch[2];
  size_t bf16_scratch_bytes[2];
} axi_cuda_ctx;

static inline cudaStream_t axi_cuda_stream(ax_backend *be) {
  return ((axi_cuda_ctx *)be->ctx)->stream;
}

/* Each op family fills its entries of the vtable; called once by
 * axi_cudalib_backend_init. One .cu/.cuh pair per family. */
void axi_cuda_ops_blas(ax_backend_i *i);    /* gemm, axpby, sum, bias */
void axi_cuda_ops_elem(ax_backend_i *i);    /* activations, dropout, casts */
void axi_cuda_ops_optim(ax_backend_i *i);   /* sgd_step, adamw_step */
void axi_cuda_ops_dnn(ax_backend_i *i);     /* conv, batch norm, pooling */
void axi_cuda_ops_norm(ax_backend_i *i);    /* layer norm */
void axi_cuda_ops_softmax(ax_backend_i *i); /* xent, masked softmax, permute */
void axi_cuda_ops_embed(ax_backend_i *i);   /* embedding */
void axi_cuda_ops_attn(ax_backend_i *i);    /* fused causal attention */

/* ---- device memory (cuda_alloc.cu) ----------------------------------------
 * A caching allocator per backend (ctx->alloc) and pinned host staging for
 * large copies; see the contract at the top of cuda_alloc.cu. */
int axi_cuda_alloc_init(axi_cuda_ctx *ctx);
/* NULL when out of device memory (after releasing the cache, retried once). */
void *axi_cuda_malloc(axi_cuda_ctx *ctx, size_t bytes);
void axi_cuda_mfree(axi_cuda_ctx *ctx, void *ptr);
/* Host <-> device copies on ctx->stream, complete when they return. */
int axi_cuda_copy_h2d(axi_cuda_ctx *ctx, void *dst, const void *src,
                      size_t bytes);
int axi_cuda_copy_d2h(axi_cuda_ctx *ctx, void *dst, const void *src,
                      size_t bytes);
/* Bytes handed out, bytes cached (free), cudaMalloc calls so far. */
extern "C" void axi_cuda_alloc_stats(ax_backend *be, size_t *in_use,
                                     size_t *cached, long *mallocs);

/* Makes the backend's device current on the calling thread; every entry
 * point that launches work or allocates starts with it. */
#define AX_CUDA_ENTER(be)                                                      \
  AX_CUDA_TRY(cudaSetDevice(((axi_cuda_ctx *)(be)->ctx)->ordinal))

/* 1-D launch shape for grid-stride loops over n > 0 elements. */
#define AXI_CUDA_THREADS 256
static inline unsigned axi_cuda_grid(size_t n) {
  size_t b = (n + AXI_CUDA_THREADS - 1) / AXI_CUDA_THREADS;
  return (unsigned)(b < 8192 ? b : 8192);
}

#endif
