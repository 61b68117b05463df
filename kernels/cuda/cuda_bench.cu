/* Reference timing for `axon-bench gemm`: a raw cublasSgemm on its own
 * handle and stream, outside the backend (no allocator, no lock, no math
 * mode switch per call), so the backend's gemm can be compared with what
 * cuBLAS gives directly. Contract in kernels/backend-impl.h. */
#include <cublas_v2.h>

#include "axon/kernels/cuda/cuda_common.cuh"

/* Random values in [-1, 1) from a counter hash: never zeros, which would
 * hide wrong indexing and can run faster than real data. */
__global__ static void bench_fill_kernel(float *x, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] = 2.0f * ax_dropout_uniform(seed, i) - 1.0f;
}

/* Everything one measurement owns; released by bench_free in any state. */
typedef struct bench_res {
  float *a, *b, *c;
  cudaStream_t stream;
  cudaEvent_t start, stop;
  cublasHandle_t handle;
} bench_res;

static void bench_free(bench_res *r) {
  if (r->handle)
    cublasDestroy(r->handle);
  if (r->start)
    cudaEventDestroy(r->start);
  if (r->stop)
    cudaEventDestroy(r->stop);
  if (r->stream)
    cudaStreamDestroy(r->stream);
  cudaFree(r->a);
  cudaFree(r->b);
  cudaFree(r->c);
  (void)cudaGetLastError();
}

static int cuda_status(const char *what, cudaError_t e) {
  if (e == cudaSuccess)
    return AX_OK;
  return ax_seterr(e == cudaErrorMemoryAllocation ? AX_ENOMEM : AX_ECUDA,
                   "bench cublas: %s: %s", what, cudaGetErrorString(e));
}

static int cublas_status(const char *what, cublasStatus_t s) {
  if (s == CUBLAS_STATUS_SUCCESS)
    return AX_OK;
  return ax_seterr(s == CUBLAS_STATUS_ALLOC_FAILED ? AX_ENOMEM : AX_ECUBLAS,
                   "bench cublas: %s: %s (%s)", what, cublasGetStatusString(s),
                   cublasGetStatusName(s));
}

static int bench_setup(bench_res *r, int n, int tf32) {
  size_t bytes = (size_t)n * n * sizeof(float);
  int rc = cuda_status("cudaMalloc", cudaMalloc((void **)&r->a, bytes));
  if (rc == AX_OK)
    rc = cuda_status("cudaMalloc", cudaMalloc((void **)&r->b, bytes));
  if (rc == AX_OK)
    rc = cuda_status("cudaMalloc", cudaMalloc((void **)&r->c, bytes));
  if (rc == AX_OK)
    rc = cuda_status(
        "cudaStreamCreate",
        cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking));
  if (rc == AX_OK)
    rc = cuda_status("cudaEventCreate", cudaEventCreate(&r->start));
  if (rc == AX_OK)
    rc = cuda_status("cudaEventCreate", cudaEventCreate(&r->stop));
  if (rc == AX_OK)
    rc = cublas_status("cublasCreate", cublasCreate(&r->handle));
  if (rc == AX_OK)
    rc =
        cublas_status("cublasSetStream", cublasSetStream(r->handle, r->stream));
  if (rc == AX_OK)
    rc = cublas_status(
        "cublasSetMathMode",
        cublasSetMathMode(r->handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                          : CUBLAS_DEFAULT_MATH));
  size_t numel = (size_t)n * n;
  float *bufs[3] = {r->a, r->b, r->c};
  for (int i = 0; rc == AX_OK && i < 3; i++) {
    bench_fill_kernel<<<axi_cuda_grid(numel), AXI_CUDA_THREADS, 0, r->stream>>>(
        bufs[i], numel, 0x5eedull + (uint64_t)i);
    rc = cuda_status("fill kernel", cudaGetLastError());
  }
  return rc;
}

/* iters products C = A B on the stream (column-major; the layout does not
 * change the cost of a square product). */
static int bench_loop(bench_res *r, int n, int iters) {
  const float one = 1.0f, zero = 0.0f;
  for (int i = 0; i < iters; i++)
    AX_TRY(cublas_status(
        "cublasSgemm", cublasSgemm(r->handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n,
                                   &one, r->a, n, r->b, n, &zero, r->c, n)));
  return AX_OK;
}

static int bench_run(bench_res *r, int n, int iters, int tf32,
                     double *seconds) {
  AX_TRY(bench_setup(r, n, tf32));
  AX_TRY(bench_loop(r, n, 3)); /* warm-up: handle workspace, kernel load */
  AX_TRY(
      cuda_status("cudaStreamSynchronize", cudaStreamSynchronize(r->stream)));
  AX_TRY(cuda_status("cudaEventRecord", cudaEventRecord(r->start, r->stream)));
  AX_TRY(bench_loop(r, n, iters));
  AX_TRY(cuda_status("cudaEventRecord", cudaEventRecord(r->stop, r->stream)));
  AX_TRY(cuda_status("cudaEventSynchronize", cudaEventSynchronize(r->stop)));
  float ms = 0.0f;
  AX_TRY(cuda_status("cudaEventElapsedTime",
                     cudaEventElapsedTime(&ms, r->start, r->stop)));
  *seconds = (double)ms / 1000.0 / iters;
  return AX_OK;
}

extern "C" int axi_cudalib_bench_cublas(int ordinal, int n, int iters, int tf32,
                                        double *seconds) {
  if (n < 1 || iters < 1 || !seconds)
    return ax_seterr(AX_EINVAL,
                     "bench cublas: need n >= 1, iters >= 1 "
                     "(got n=%d, iters=%d)",
                     n, iters);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || ordinal < 0 ||
      ordinal >= count) {
    (void)cudaGetLastError();
    return ax_seterr(AX_ENODEV, "bench cublas: no device cuda:%d", ordinal);
  }
  AX_TRY(cuda_status("cudaSetDevice", cudaSetDevice(ordinal)));
  bench_res r = {0};
  int rc = bench_run(&r, n, iters, tf32, seconds);
  bench_free(&r);
  return rc;
}
