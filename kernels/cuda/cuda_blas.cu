/* CUDA backend, BLAS family: gemm and gemm_bf16 (cuBLAS), axpby, sum,
 * bias_add, bias_grad.
 *
 * gemm: the contract is row-major; cuBLAS is column-major. A row-major
 * (r, c) matrix with leading dimension ld is the column-major (c, r) matrix
 * with the same ld, its transpose. So C = op(A) op(B) is computed as
 * C^T = op(B)^T op(A)^T in column-major: A and B swap places, m and n swap,
 * and each keeps its own transpose flag. All of a backend's cuBLAS calls
 * share one handle (ctx->cublas) bound to the backend's stream; they are
 * issued under one mutex, so the math mode set for one call cannot change
 * under another thread's call.
 * Precision: FP32 (CUBLAS_DEFAULT_MATH, no TF32) unless the environment
 * variable AXON_TF32 is "1" when the call is made; then
 * CUBLAS_TF32_TENSOR_OP_MATH (about 1e-3 relative error per product).
 * gemm_bf16 is the same mapping through cublasGemmEx (and its strided
 * batched form): CUDA_R_16BF inputs, CUDA_R_32F C, CUBLAS_COMPUTE_32F
 * (products of bf16 values are exact in f32 and summed in f32; the math
 * mode does not apply to it). An f32 operand is first rounded by the
 * backend's cast_f32_bf16 into a bf16 scratch buffer of the backend (one
 * for A, one for B, grown as needed and kept): the elements it spans, with
 * its own leading dimension and stride. The buffers are used under the
 * BLAS lock and on the backend's one stream, so a later call's cast runs
 * after the GEMM that read them.
 *
 * axpby, bias_add: explicitly rounded float operations in the CPU
 * reference's order (no FMA contraction), so results equal the CPU's.
 *
 * sum, bias_grad: deterministic. Each thread accumulates a fixed set of
 * elements in double in a fixed order, blocks reduce in shared memory with
 * a fixed tree, and a final pass adds the per-block partials in index
 * order. The launch shapes depend only on the sizes, never on the device or
 * timing, and no floating-point atomics are used; repeated calls give the
 * same bits. The partials live in a scratch block from the caching
 * allocator, freed right after the launches (stream-ordered reuse). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/cuda/cuda_blas.cuh"

#define RED_THREADS 256  /* threads per reduction block (a power of two) */
#define RED_BLOCKS 1024  /* at most this many partials per reduction */
#define FIN_THREADS 1024 /* the final block of sum; >= RED_BLOCKS */

static pthread_mutex_t blas_lock = PTHREAD_MUTEX_INITIALIZER;

#define GRID_STRIDE(i, n)                                                      \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);      \
       i += (size_t)gridDim.x * blockDim.x)

/* ---- cuBLAS handle and gemm ---------------------------------------------- */

static int cublas_locked(ax_backend *be, cublasHandle_t *out) {
  axi_cuda_ctx *ctx = (axi_cuda_ctx *)be->ctx;
  if (!ctx->cublas) {
    cublasHandle_t h;
    AX_CUBLAS_TRY(cublasCreate(&h));
    cublasStatus_t st = cublasSetStream(h, ctx->stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
      cublasDestroy(h);
      return ax_seterr(AX_ECUBLAS, "cublasSetStream: %s",
                       cublasGetStatusString(st));
    }
    ctx->cublas = h;
  }
  *out = (cublasHandle_t)ctx->cublas;
  return AX_OK;
}

int axi_cuda_cublas(ax_backend *be, cublasHandle_t *out) {
  pthread_mutex_lock(&blas_lock);
  int rc = cublas_locked(be, out);
  pthread_mutex_unlock(&blas_lock);
  return rc;
}

static int tf32_wanted(void) {
  const char *e = getenv("AXON_TF32");
  return e && strcmp(e, "1") == 0;
}

/* The gemm of both input types: f32 (bf16 == 0) or bf16 bit patterns
 * (a and b already bf16), C f32 either way. */
static int gemm_locked(ax_backend *be, int bf16, int ta, int tb, int m, int n,
                       int k, float alpha, const void *a, int lda, long sa,
                       const void *b, int ldb, long sb, float beta, float *c,
                       int ldc, long sc, int batch) {
  cublasHandle_t h = NULL;
  AX_TRY(cublas_locked(be, &h));
  AX_CUBLAS_TRY(cublasSetMathMode(h, tf32_wanted() ? CUBLAS_TF32_TENSOR_OP_MATH
                                                   : CUBLAS_DEFAULT_MATH));
  cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const float *fa = (const float *)a, *fb = (const float *)b;
  const cudaDataType_t in = CUDA_R_16BF, out = CUDA_R_32F;
  const cublasComputeType_t ct = CUBLAS_COMPUTE_32F;
  const cublasGemmAlgo_t algo = CUBLAS_GEMM_DEFAULT;
  if (!bf16 && batch == 1)
    AX_CUBLAS_TRY(cublasSgemm(h, ob, oa, n, m, k, &alpha, fb, ldb, fa, lda,
                              &beta, c, ldc));
  else if (!bf16)
    AX_CUBLAS_TRY(cublasSgemmStridedBatched(
        h, ob, oa, n, m, k, &alpha, fb, ldb, (long long)sb, fa, lda,
        (long long)sa, &beta, c, ldc, (long long)sc, batch));
  else if (batch == 1)
    AX_CUBLAS_TRY(cublasGemmEx(h, ob, oa, n, m, k, &alpha, b, in, ldb, a, in,
                               lda, &beta, c, out, ldc, ct, algo));
  else
    AX_CUBLAS_TRY(cublasGemmStridedBatchedEx(
        h, ob, oa, n, m, k, &alpha, b, in, ldb, (long long)sb, a, in, lda,
        (long long)sa, &beta, c, out, ldc, (long long)sc, batch, ct, algo));
  return AX_OK;
}

/* The elements an operand of `rows` stored rows of `cols` (leading
 * dimension ld) spans over `batch` matrices `stride` apart. */
static size_t span(int rows, int cols, int ld, long stride, int batch) {
  if (rows <= 0 || cols <= 0 || batch <= 0)
    return 0;
  return (size_t)(batch - 1) * (size_t)stride + (size_t)(rows - 1) * ld +
         (size_t)cols;
}

/* *p as bf16 for operand `which` (0 A, 1 B) of gemm_bf16: a bf16 operand
 * as it is, an f32 one's n elements rounded into the backend's scratch
 * buffer `which`. Called under the BLAS lock. */
static int bf16_operand(ax_backend *be, int which, ax_dtype dt, size_t n,
                        const void **p) {
  if (dt == AX_BF16 || n == 0)
    return AX_OK;
  axi_cuda_ctx *ctx = (axi_cuda_ctx *)be->ctx;
  size_t bytes = n * sizeof(uint16_t);
  if (ctx->bf16_scratch_bytes[which] < bytes) {
    /* Stream-ordered reuse: GEMMs still queued on the old buffer run
     * before whatever its next owner queues. */
    axi_cuda_mfree(ctx, ctx->bf16_scratch[which]);
    ctx->bf16_scratch_bytes[which] = 0;
    if (!(ctx->bf16_scratch[which] = axi_cuda_malloc(ctx, bytes)))
      return ax_seterr(AX_ENOMEM,
                       "gemm_bf16: no device memory for %zu bf16 "
                       "scratch bytes",
                       bytes);
    ctx->bf16_scratch_bytes[which] = bytes;
  }
  uint16_t *y = (uint16_t *)ctx->bf16_scratch[which];
  AX_TRY(AX_K(be, cast_f32_bf16, n, (const float *)*p, y));
  *p = y;
  return AX_OK;
}

static int gemm_any(ax_backend *be, int bf16, int ta, int tb, int m, int n,
                    int k, float alpha, const void *a, ax_dtype at, int lda,
                    long sa, const void *b, ax_dtype bt, int ldb, long sb,
                    float beta, float *c, int ldc, long sc, int batch) {
  if (m < 0 || n < 0 || k < 0 || batch < 0)
    return ax_seterr(AX_EINVAL, "gemm: negative size");
  if (m == 0 || n == 0 || batch == 0)
    return AX_OK;
  if (k == 0) { /* C = beta * C; A and B are not read, cuBLAS wants ld >= 1 */
    lda = lda < 1 ? 1 : lda;
    ldb = ldb < 1 ? 1 : ldb;
  }
  AX_CUDA_ENTER(be);
  pthread_mutex_lock(&blas_lock);
  int rc = AX_OK;
  if (bf16 && k > 0) {
    rc = bf16_operand(be, 0, at, span(ta ? k : m, ta ? m : k, lda, sa, batch),
                      &a);
    if (rc == AX_OK)
      rc = bf16_operand(be, 1, bt, span(tb ? n : k, tb ? k : n, ldb, sb, batch),
                        &b);
  }
  if (rc == AX_OK)
    rc = gemm_locked(be, bf16, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb,
                     beta, c, ldc, sc, batch);
  pthread_mutex_unlock(&blas_lock);
  return rc;
}

static int cuda_gemm(ax_backend *be, int ta, int tb, int m, int n, int k,
                     float alpha, const float *a, int lda, long sa,
                     const float *b, int ldb, long sb, float beta, float *c,
                     int ldc, long sc, int batch) {
  return gemm_any(be, 0, ta, tb, m, n, k, alpha, a, AX_F32, lda, sa, b, AX_F32,
                  ldb, sb, beta, c, ldc, sc, batch);
}

static int cuda_gemm_bf16(ax_backend *be, int ta, int tb, int m, int n, int k,
                          float alpha, const void *a, ax_dtype at, int lda,
                          long sa, const void *b, ax_dtype bt, int ldb, long sb,
                          float beta, float *c, int ldc, long sc, int batch) {
  if ((at != AX_F32 && at != AX_BF16) || (bt != AX_F32 && bt != AX_BF16))
    return ax_seterr(AX_EDTYPE, "gemm_bf16: %s x %s operands",
                     ax_dtype_name(at), ax_dtype_name(bt));
  return gemm_any(be, 1, ta, tb, m, n, k, alpha, a, at, lda, sa, b, bt, ldb, sb,
                  beta, c, ldc, sc, batch);
}

/* ---- axpby --------------------------------------------------------------- */

/* mode 0: y = a x (y is not read, as on the CPU when b == 0);
 * mode 1: y = x + y; mode 2: y = a x + b y. */
__global__ static void axpby_kernel(size_t n, float a, const float *x, float b,
                                    float *y, int mode) {
  GRID_STRIDE(i, n) {
    float v;
    if (mode == 0)
      v = __fmul_rn(a, x[i]);
    else if (mode == 1)
      v = __fadd_rn(x[i], y[i]);
    else
      v = __fadd_rn(__fmul_rn(a, x[i]), __fmul_rn(b, y[i]));
    y[i] = v;
  }
}

static int cuda_axpby(ax_backend *be, size_t n, float a, const float *x,
                      float b, float *y) {
  if (n == 0)
    return AX_OK;
  AX_CUDA_ENTER(be);
  int mode = b == 0.0f ? 0 : (a == 1.0f && b == 1.0f) ? 1 : 2;
  axpby_kernel<<<axi_cuda_grid(n), AXI_CUDA_THREADS, 0, axi_cuda_stream(be)>>>(
      n, a, x, b, y, mode);
  AX_CUDA_TRY(cudaGetLastError());
  return AX_OK;
}

/* ---- deterministic reductions -------------------------------------------- */

static int launch_status(const char *what, cudaError_t e) {
  if (e == cudaSuccess)
    return AX_OK;
  return ax_seterr(e == cudaErrorMemoryAllocation ? AX_ENOMEM : AX_ECUDA,
                   "%s: %s", what, cudaGetErrorString(e));
}

/* Sum of v over the block in a fixed tree order; blockDim.x is a power of
 * two and sh holds blockDim.x doubles. The result is valid in thread 0. */
__device__ static double block_sum(double v, double *sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s)
      sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  return sh[0];
}

/* partial[block] = sum of the elements this block's threads stride over. */
__global__ static void sum_partial_kernel(const float *x, size_t n,
                                          double *partial) {
  __shared__ double sh[RED_THREADS];
  double acc = 0.0;
  GRID_STRIDE(i, n) { acc += x[i]; }
  double s = block_sum(acc, sh);
  if (threadIdx.x == 0)
    partial[blockIdx.x] = s;
}

/* out[0] = sum of partial[0..np), np <= FIN_THREADS; one block. */
__global__ static void sum_final_kernel(const double *partial, int np,
                                        double *out) {
  __shared__ double sh[FIN_THREADS];
  double v = (int)threadIdx.x < np ? partial[threadIdx.x] : 0.0;
  double s = block_sum(v, sh);
  if (threadIdx.x == 0)
    out[0] = s;
}

static int cuda_sum(ax_backend *be, size_t n, const float *x, double *out) {
  axi_cuda_ctx *ctx = (axi_cuda_ctx *)be->ctx;
  if (n == 0) {
    *out = 0.0;
    return AX_OK;
  }
  AX_CUDA_ENTER(be);
  size_t nb = (n + RED_THREADS - 1) / RED_THREADS;
  int blocks = (int)(nb < RED_BLOCKS ? nb : RED_BLOCKS);
  double *scratch =
      (double *)axi_cuda_malloc(ctx, (size_t)(blocks + 1) * sizeof(double));
  if (!scratch)
    return ax_seterr(AX_ENOMEM, "sum: out of device memory");
  cudaStream_t s = ctx->stream;
  sum_partial_kernel<<<blocks, RED_THREADS, 0, s>>>(x, n, scratch);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) {
    sum_final_kernel<<<1, FIN_THREADS, 0, s>>>(scratch, blocks,
                                               scratch + blocks);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(out, scratch + blocks, sizeof(double),
                        cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(s);
  axi_cuda_mfree(ctx, scratch);
  return launch_status("sum", e);
}

/* ---- bias ---------------------------------------------------------------- */

/* y (outer, c, inner) += bias (c), over total = outer * c * inner. */
__global__ static void bias_add_kernel(float *y, const float *bias,
                                       size_t total, size_t c, size_t inner) {
  GRID_STRIDE(i, total) { y[i] = __fadd_rn(y[i], bias[(i / inner) % c]); }
}

static int cuda_bias_add(ax_backend *be, float *y, const float *bias, int outer,
                         int c, int inner) {
  if (outer < 0 || c < 0 || inner < 0)
    return ax_seterr(AX_EINVAL, "bias_add: negative size");
  size_t total = (size_t)outer * c * inner;
  if (total == 0)
    return AX_OK;
  AX_CUDA_ENTER(be);
  bias_add_kernel<<<axi_cuda_grid(total), AXI_CUDA_THREADS, 0,
                    axi_cuda_stream(be)>>>(y, bias, total, (size_t)c,
                                           (size_t)inner);
  AX_CUDA_TRY(cudaGetLastError());
  return AX_OK;
}

/* inner == 1, dy (outer, c): thread j of block (x, s) sums column j over the
 * rows [s * chunk, (s + 1) * chunk) in row order; loads are coalesced. */
__global__ static void colsum_partial_kernel(const float *dy, int outer, int c,
                                             int chunk, double *partial) {
  long j = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= c)
    return;
  long o0 = (long)blockIdx.y * chunk;
  long o1 = o0 + chunk < outer ? o0 + chunk : outer;
  double acc = 0.0;
  for (long o = o0; o < o1; o++)
    acc += dy[(size_t)o * c + j];
  partial[(size_t)blockIdx.y * c + j] = acc;
}

/* inner > 1: block (j, s) sums channel j over the rows of chunk s. */
__global__ static void chansum_partial_kernel(const float *dy, int outer, int c,
                                              int inner, int chunk,
                                              double *partial) {
  __shared__ double sh[RED_THREADS];
  size_t j = blockIdx.x;
  long o0 = (long)blockIdx.y * chunk;
  long o1 = o0 + chunk < outer ? o0 + chunk : outer;
  size_t count = (size_t)(o1 - o0) * inner;
  double acc = 0.0;
  for (size_t e = threadIdx.x; e < count; e += blockDim.x) {
    size_t o = o0 + e / inner, i = e % inner;
    acc += dy[(o * c + j) * inner + i];
  }
  double s = block_sum(acc, sh);
  if (threadIdx.x == 0)
    partial[(size_t)blockIdx.y * c + j] = s;
}

/* dbias[j] += sum over s of partial[s][j], in s order. */
__global__ static void bias_final_kernel(const double *partial, int splits,
                                         int c, float *dbias) {
  long j = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= c)
    return;
  double acc = 0.0;
  for (int s = 0; s < splits; s++)
    acc += partial[(size_t)s * c + j];
  dbias[j] = __fadd_rn(dbias[j], (float)acc);
}

static int cuda_bias_grad(ax_backend *be, const float *dy, float *dbias,
                          int outer, int c, int inner) {
  axi_cuda_ctx *ctx = (axi_cuda_ctx *)be->ctx;
  if (outer < 0 || c < 0 || inner < 0)
    return ax_seterr(AX_EINVAL, "bias_grad: negative size");
  if (outer == 0 || c == 0 || inner == 0)
    return AX_OK;
  AX_CUDA_ENTER(be);
  /* Split the rows so that about RED_BLOCKS blocks run; the shape depends
   * only on (outer, c, inner). */
  unsigned cb = (unsigned)(((long)c + RED_THREADS - 1) / RED_THREADS);
  int bx = inner == 1 ? (int)cb : c;
  int splits = bx >= RED_BLOCKS ? 1 : (RED_BLOCKS + bx - 1) / bx;
  if (splits > outer)
    splits = outer;
  int chunk = (int)(((long)outer + splits - 1) / splits);
  splits = (int)(((long)outer + chunk - 1) / chunk);
  double *partial =
      (double *)axi_cuda_malloc(ctx, (size_t)splits * c * sizeof(double));
  if (!partial)
    return ax_seterr(AX_ENOMEM, "bias_grad: out of device memory");
  cudaStream_t s = ctx->stream;
  dim3 grid((unsigned)bx, (unsigned)splits);
  if (inner == 1)
    colsum_partial_kernel<<<grid, RED_THREADS, 0, s>>>(dy, outer, c, chunk,
                                                       partial);
  else
    chansum_partial_kernel<<<grid, RED_THREADS, 0, s>>>(dy, outer, c, inner,
                                                        chunk, partial);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) {
    bias_final_kernel<<<cb, RED_THREADS, 0, s>>>(partial, splits, c, dbias);
    e = cudaGetLastError();
  }
  axi_cuda_mfree(ctx, partial); /* stream-ordered: safe before completion */
  return launch_status("bias_grad", e);
}

void axi_cuda_ops_blas(ax_backend_i *i) {
  i->gemm = cuda_gemm;
  i->gemm_bf16 = cuda_gemm_bf16;
  i->axpby = cuda_axpby;
  i->sum = cuda_sum;
  i->bias_add = cuda_bias_add;
  i->bias_grad = cuda_bias_grad;
}
