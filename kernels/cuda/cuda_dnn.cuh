/* Shared by the dnn op family (cuda_dnn.cu: state; cuda_dnn_conv.cu:
 * convolutions; cuda_dnn_bn.cu: batch norm; cuda_dnn_pool.cu: pooling).
 *
 * The cuDNN state of a backend lives in ctx->dnn and is created on first
 * use: the handle (also stored in ctx->cudnn, bound to ctx->stream), the
 * per-shape convolution cache, one workspace grown as needed (from the
 * backend's own allocator) and reusable batch-norm descriptors. A cuDNN
 * handle must not be used by two threads at once, so every cuDNN call runs
 * between axi_dnn_lock and axi_dnn_unlock; kernels of this family are all
 * queued on the backend's single stream, which orders the reuse of the
 * workspace. cuDNN types never leave kernels/cuda/. */
#ifndef AX_CUDA_DNN_CUH
#define AX_CUDA_DNN_CUH

#include <pthread.h>
#include <stdint.h>

#include <cudnn.h>

#include "axon/kernels/cuda/cuda_common.cuh"
#include "axon/kernels/cuda/cuda_reduce.cuh"

/* Returns an axon error (cuDNN's message attached) when a cuDNN call fails. */
#define AX_CUDNN_TRY(call)                                                     \
  do {                                                                         \
    cudnnStatus_t ax_dn_ = (call);                                             \
    if (ax_dn_ != CUDNN_STATUS_SUCCESS)                                        \
      return ax_seterr(                                                        \
          ax_dn_ == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||      \
                  ax_dn_ ==                                                    \
                      CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED     \
              ? AX_ENOMEM                                                      \
              : AX_ECUDNN,                                                     \
          "%s: %s", #call, cudnnGetErrorString(ax_dn_));                       \
  } while (0)

typedef struct axi_conv_entry axi_conv_entry; /* cuda_dnn.cu */

#define AXI_DNN_BUCKETS 64

typedef struct axi_dnn_state {
  pthread_mutex_t lock;
  cudnnHandle_t handle;
  void *ws; /* workspace, ws_bytes long (backend allocator) */
  size_t ws_bytes;
  axi_conv_entry *bucket[AXI_DNN_BUCKETS];
  cudnnTensorDescriptor_t bn_x, bn_p; /* (N, C, HW, 1) and (1, C, 1, 1) */
  int64_t selects; /* algorithm selections (one per shape and direction) */
  int64_t hits;    /* convolution calls served from the cache */
  int64_t entries; /* shapes in the cache */
} axi_dnn_state;

/* Makes the backend's device current, creates the state on first use and
 * locks it. On AX_OK the caller must call axi_dnn_unlock. */
int axi_dnn_lock(ax_backend *be, axi_dnn_state **out);
void axi_dnn_unlock(axi_dnn_state *s);

/* The state's workspace, grown to at least `bytes` (call with the lock
 * held). The previous buffer is freed; it is reused in stream order. */
int axi_dnn_workspace(ax_backend *be, axi_dnn_state *s, size_t bytes,
                      void **out);

void axi_cuda_dnn_ops_conv(ax_backend_i *i); /* cuda_dnn_conv.cu */
void axi_cuda_dnn_ops_bn(ax_backend_i *i);   /* cuda_dnn_bn.cu */
void axi_cuda_dnn_ops_pool(ax_backend_i *i); /* cuda_dnn_pool.cu */

/* Convolution algorithm cache counters of a CUDA backend, for tests:
 * selections (one per new shape and direction), calls served from the
 * cache. Plain C types, so a test can declare it itself. */
extern "C" int axi_cuda_dnn_stats(ax_backend *be, int64_t *selects,
                                  int64_t *hits);

#endif
