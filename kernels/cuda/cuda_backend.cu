/* CUDA backend: device memory, copies and the stream the kernels run on.
 * The compute kernels are filled in by the CUDA issue; entries left NULL
 * report AX_EUNSUPPORTED through AX_K. */
#include <stdlib.h>

#include "kernels/cuda/cuda_common.cuh"

static void *cuda_alloc(ax_backend *be, size_t bytes) {
  void *p = NULL;
  if (cudaSetDevice(((axi_cuda_ctx *)be->ctx)->ordinal) != cudaSuccess ||
      cudaMalloc(&p, bytes) != cudaSuccess)
    return NULL;
  return p;
}

static void cuda_free(ax_backend *be, void *ptr) {
  (void)be;
  cudaFree(ptr);
}

static int cuda_copy_kind(ax_backend *be, void *dst, const void *src,
                          size_t bytes, cudaMemcpyKind kind) {
  cudaStream_t s = axi_cuda_stream(be);
  AX_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, s));
  if (kind != cudaMemcpyDeviceToDevice)
    AX_CUDA_TRY(cudaStreamSynchronize(s));
  return AX_OK;
}

static int cuda_copy_from_host(ax_backend *be, void *dst, const void *src,
                               size_t bytes) {
  return cuda_copy_kind(be, dst, src, bytes, cudaMemcpyHostToDevice);
}

static int cuda_copy_to_host(ax_backend *be, void *dst, const void *src,
                             size_t bytes) {
  return cuda_copy_kind(be, dst, src, bytes, cudaMemcpyDeviceToHost);
}

static int cuda_copy(ax_backend *be, void *dst, const void *src, size_t bytes) {
  return cuda_copy_kind(be, dst, src, bytes, cudaMemcpyDeviceToDevice);
}

static int cuda_synchronize(ax_backend *be) {
  AX_CUDA_TRY(cudaStreamSynchronize(axi_cuda_stream(be)));
  return AX_OK;
}

__global__ static void fill_kernel(float *x, size_t n, float v) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n)
    x[i] = v;
}

static int cuda_fill(ax_backend *be, float *x, size_t n, float v) {
  if (n == 0)
    return AX_OK;
  fill_kernel<<<(unsigned)((n + 255) / 256), 256, 0, axi_cuda_stream(be)>>>(
      x, n, v);
  AX_CUDA_TRY(cudaGetLastError());
  return AX_OK;
}

extern "C" int axi_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess)
    return 0;
  return n;
}

extern "C" int axi_cuda_backend_init(ax_backend *be, int ordinal) {
  int n = axi_cuda_device_count();
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
  be->iface = iface;
  be->device.type = AX_DEV_CUDA;
  be->device.index = ordinal;
  be->ctx = ctx;
  return AX_OK;
}
