/* CUDA backend: device memory, copies and the stream the kernels run on.
 * Every kernel and copy of a backend is queued on its one stream
 * (ctx->stream), which is what makes the caching allocator's immediate
 * reuse of freed blocks safe (cuda_alloc.cu). The compute kernels come from
 * one registration function per op family; entries left NULL report
 * AX_EUNSUPPORTED through AX_K. */
#include <stdlib.h>

#include "axon/kernels/cuda/cuda_common.cuh"

/* Device memory comes from the caching allocator (cuda_alloc.cu); a block
 * freed here may be reused at once by later work on the backend's stream. */
static void *cuda_alloc(ax_backend *be, size_t bytes) {
  axi_cuda_ctx *ctx = (axi_cuda_ctx *)be->ctx;
  void *p = NULL;
  if (cudaSetDevice(ctx->ordinal) == cudaSuccess)
    p = axi_cuda_malloc(ctx, bytes);
  else
    (void)cudaGetLastError();
  if (!p)
    ax_seterr(AX_ENOMEM, "cuda:%d: out of device memory (%zu bytes)",
              ctx->ordinal, bytes);
  return p;
}

static void cuda_free(ax_backend *be, void *ptr) {
  axi_cuda_mfree((axi_cuda_ctx *)be->ctx, ptr);
}

/* Host copies are complete when they return (large pageable ones are staged
 * through pinned buffers); device-to-device copies are stream-ordered. */
static int cuda_copy_from_host(ax_backend *be, void *dst, const void *src,
                               size_t bytes) {
  AX_CUDA_ENTER(be);
  return axi_cuda_copy_h2d((axi_cuda_ctx *)be->ctx, dst, src, bytes);
}

static int cuda_copy_to_host(ax_backend *be, void *dst, const void *src,
                             size_t bytes) {
  AX_CUDA_ENTER(be);
  return axi_cuda_copy_d2h((axi_cuda_ctx *)be->ctx, dst, src, bytes);
}

static int cuda_copy(ax_backend *be, void *dst, const void *src, size_t bytes) {
  if (bytes == 0 || dst == src)
    return AX_OK;
  AX_CUDA_ENTER(be);
  AX_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                              axi_cuda_stream(be)));
  return AX_OK;
}

static int cuda_synchronize(ax_backend *be) {
  AX_CUDA_ENTER(be);
  AX_CUDA_TRY(cudaStreamSynchronize(axi_cuda_stream(be)));
  return AX_OK;
}

__global__ static void fill_kernel(float *x, size_t n, float v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] = v;
}

static int cuda_fill(ax_backend *be, float *x, size_t n, float v) {
  if (n == 0)
    return AX_OK;
  AX_CUDA_ENTER(be);
  fill_kernel<<<axi_cuda_grid(n), AXI_CUDA_THREADS, 0, axi_cuda_stream(be)>>>(
      x, n, v);
  AX_CUDA_TRY(cudaGetLastError());
  return AX_OK;
}

extern "C" int axi_cudalib_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess)
    return 0;
  return n;
}

extern "C" int axi_cudalib_backend_init(ax_backend *be, int ordinal) {
  int n = axi_cudalib_device_count();
  if (ordinal >= n)
    return ax_seterr(AX_ENODEV, "cuda:%d: %d CUDA device(s) present", ordinal,
                     n);
  axi_cuda_ctx *ctx = (axi_cuda_ctx *)calloc(1, sizeof *ctx);
  if (!ctx)
    return AX_ENOMEM;
  ctx->ordinal = ordinal;
  cudaError_t e = cudaSetDevice(ordinal);
  if (e == cudaSuccess)
    e = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    free(ctx);
    return ax_seterr(AX_ECUDA, "cuda:%d: %s", ordinal, cudaGetErrorString(e));
  }
  int rc = axi_cuda_alloc_init(ctx);
  if (rc != AX_OK) {
    cudaStreamDestroy(ctx->stream);
    free(ctx);
    return rc;
  }
  ax_backend_i iface = {};
  iface.name = "cuda";
  iface.alloc = cuda_alloc;
  iface.free = cuda_free;
  iface.copy_from_host = cuda_copy_from_host;
  iface.copy_to_host = cuda_copy_to_host;
  iface.copy = cuda_copy;
  iface.synchronize = cuda_synchronize;
  iface.fill = cuda_fill;
  axi_cuda_ops_blas(&iface);
  axi_cuda_ops_elem(&iface);
  axi_cuda_ops_optim(&iface);
  axi_cuda_ops_dnn(&iface);
  axi_cuda_ops_norm(&iface);
  axi_cuda_ops_softmax(&iface);
  axi_cuda_ops_embed(&iface);
  axi_cuda_ops_attn(&iface);
  be->iface = iface;
  be->device.type = AX_DEV_CUDA;
  be->device.index = ordinal;
  be->ctx = ctx;
  return AX_OK;
}
