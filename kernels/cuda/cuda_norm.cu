/* CUDA backend, norm family: layer normalisation over the last dimension of
 * x (rows, d), matching the CPU reference (kernels/cpu/cpu_layernorm.c).
 *
 * Forward: one block per row; the mean and then the squared deviations
 * around it are summed in double (two passes, as the CPU), the biased
 * variance gives rstd = 1 / sqrt(var + eps); mean and rstd may be NULL.
 * Backward: with xhat = (x - mean) * rstd and g = dy * gamma,
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))   (one block per row,
 *   skipped when dx is NULL),
 *   dgamma += sum over rows of dy * xhat, dbeta += sum over rows of dy.
 * The parameter gradients are reduced without atomics: a first kernel sums
 * fixed chunks of rows per column (32 columns x 8 row lanes per block, in
 * double) into partials, a second adds the chunks of each column in order.
 * The split depends only on (rows, d), so results are reproducible.
 * Element-wise float expressions use explicit _rn intrinsics where the CPU
 * code has a separate multiply and add, so the compiler does not contract
 * them into FMAs the CPU does not do.
 * Scratch memory comes from the backend allocator and is released right
 * after the kernels that use it are queued: reuse is ordered by the
 * backend's single stream. */
#include "axon/kernels/cuda/cuda_reduce.cuh"

__global__ static void ln_fwd_kernel(int d, const float *x, const float *gamma,
                                     const float *beta, float eps, float *y,
                                     float *mean, float *rstd) {
  __shared__ double sh[32];
  const size_t r = blockIdx.x;
  const float *xr = x + r * d;
  float *yr = y + r * d;
  double s = 0.0;
  for (int j = threadIdx.x; j < d; j += blockDim.x)
    s += xr[j];
  const double mu = axi_block_sum(s, sh) / d;
  double v = 0.0;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    double c = xr[j] - mu;
    v += c * c;
  }
  v = axi_block_sum(v, sh);
  const float rs = (float)(1.0 / sqrt(v / d + (double)eps));
  const float m = (float)mu;
  for (int j = threadIdx.x; j < d; j += blockDim.x)
    yr[j] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(xr[j], m), rs), gamma[j]),
                      beta[j]);
  if (threadIdx.x == 0) {
    if (mean)
      mean[r] = m;
    if (rstd)
      rstd[r] = rs;
  }
}

__global__ static void ln_bwd_dx_kernel(int d, const float *x, const float *dy,
                                        const float *gamma, const float *mean,
                                        const float *rstd, float *dx) {
  __shared__ double sh[32];
  const size_t r = blockIdx.x;
  const float *xr = x + r * d, *gr = dy + r * d;
  float *dr = dx + r * d;
  const float m = mean[r], rs = rstd[r];
  double sg = 0.0, sgx = 0.0;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    float xh = __fmul_rn(__fsub_rn(xr[j], m), rs);
    float g = __fmul_rn(gr[j], gamma[j]);
    sg += g;
    sgx += (double)g * xh;
  }
  sg = axi_block_sum(sg, sh);
  sgx = axi_block_sum(sgx, sh);
  const float mg = (float)(sg / d), mgx = (float)(sgx / d);
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    float xh = __fmul_rn(__fsub_rn(xr[j], m), rs);
    float g = __fmul_rn(gr[j], gamma[j]);
    dr[j] = __fmul_rn(rs, __fsub_rn(__fsub_rn(g, mg), __fmul_rn(xh, mgx)));
  }
}

#define COLS 32 /* columns per block of the partial kernel (blockDim.x) */
#define LANES 8 /* row lanes per block (blockDim.y) */

/* Block (bx, by): columns [bx * COLS, +COLS) over the rows of chunk by,
 * [by * chunk, min(rows, (by + 1) * chunk)). Writes part_g / part_b
 * (chunks, d). */
__global__ static void ln_param_partial_kernel(int rows, int d, int chunk,
                                               const float *x, const float *dy,
                                               const float *mean,
                                               const float *rstd,
                                               double *part_g, double *part_b) {
  __shared__ double sg[LANES][COLS], sb[LANES][COLS];
  const int j = blockIdx.x * COLS + threadIdx.x;
  const int r0 = blockIdx.y * chunk;
  const int r1 = rows - r0 < chunk ? rows : r0 + chunk;
  double ag = 0.0, ab = 0.0;
  if (j < d)
    for (int r = r0 + threadIdx.y; r < r1; r += LANES) {
      size_t o = (size_t)r * d + j;
      float xh = __fmul_rn(__fsub_rn(x[o], mean[r]), rstd[r]);
      ag += (double)dy[o] * xh;
      ab += dy[o];
    }
  sg[threadIdx.y][threadIdx.x] = ag;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && j < d) {
    for (int l = 1; l < LANES; l++) {
      ag += sg[l][threadIdx.x];
      ab += sb[l][threadIdx.x];
    }
    part_g[(size_t)blockIdx.y * d + j] = ag;
    part_b[(size_t)blockIdx.y * d + j] = ab;
  }
}

__global__ static void ln_param_final_kernel(int d, int chunks,
                                             const double *part_g,
                                             const double *part_b,
                                             float *dgamma, float *dbeta) {
  AXI_GRID_STRIDE(j, (size_t)d) {
    double g = 0.0, b = 0.0;
    for (int c = 0; c < chunks; c++) {
      g += part_g[(size_t)c * d + j];
      b += part_b[(size_t)c * d + j];
    }
    if (dgamma)
      dgamma[j] += (float)g;
    if (dbeta)
      dbeta[j] += (float)b;
  }
}

static int cuda_layernorm_fwd(ax_backend *be, int rows, int d, const float *x,
                              const float *gamma, const float *beta, float eps,
                              float *y, float *mean, float *rstd) {
  if (rows < 0 || d <= 0)
    return ax_seterr(AX_EINVAL, "layernorm_fwd: bad shape (%d, %d)", rows, d);
  if (rows == 0)
    return AX_OK;
  AX_CUDA_ENTER(be);
  ln_fwd_kernel<<<rows, axi_row_threads(d), 0, axi_cuda_stream(be)>>>(
      d, x, gamma, beta, eps, y, mean, rstd);
  AX_CUDA_TRY(cudaGetLastError());
  return AX_OK;
}

static int ln_params(ax_backend *be, int rows, int d, const float *x,
                     const float *dy, const float *mean, const float *rstd,
                     float *dgamma, float *dbeta) {
  cudaStream_t st = axi_cuda_stream(be);
  int chunk = 64;
  if ((rows + chunk - 1) / chunk > 65535)
    chunk = (rows + 65534) / 65535;
  const int chunks = (rows + chunk - 1) / chunk;
  const size_t part = (size_t)chunks * d;
  double *buf = (double *)be->iface.alloc(be, 2 * part * sizeof(double));
  if (!buf)
    return ax_seterr(AX_ENOMEM, "layernorm_bwd: %d x %d partial sums", chunks,
                     d);
  dim3 grid((unsigned)((d + COLS - 1) / COLS), (unsigned)chunks);
  ln_param_partial_kernel<<<grid, dim3(COLS, LANES), 0, st>>>(
      rows, d, chunk, x, dy, mean, rstd, buf, buf + part);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) {
    ln_param_final_kernel<<<axi_cuda_grid((size_t)d), AXI_CUDA_THREADS, 0,
                            st>>>(d, chunks, buf, buf + part, dgamma, dbeta);
    e = cudaGetLastError();
  }
  be->iface.free(be, buf);
  if (e != cudaSuccess)
    return ax_seterr(AX_ECUDA, "layernorm_bwd: %s", cudaGetErrorString(e));
  return AX_OK;
}

static int cuda_layernorm_bwd(ax_backend *be, int rows, int d, const float *x,
                              const float *dy, const float *gamma,
                              const float *mean, const float *rstd, float *dx,
                              float *dgamma, float *dbeta) {
  if (rows < 0 || d <= 0)
    return ax_seterr(AX_EINVAL, "layernorm_bwd: bad shape (%d, %d)", rows, d);
  if (rows == 0)
    return AX_OK;
  AX_CUDA_ENTER(be);
  if (dx) {
    ln_bwd_dx_kernel<<<rows, axi_row_threads(d), 0, axi_cuda_stream(be)>>>(
        d, x, dy, gamma, mean, rstd, dx);
    AX_CUDA_TRY(cudaGetLastError());
  }
  if (dgamma || dbeta)
    AX_TRY(ln_params(be, rows, d, x, dy, mean, rstd, dgamma, dbeta));
  return AX_OK;
}

void axi_cuda_ops_norm(ax_backend_i *i) {
  i->layernorm_fwd = cuda_layernorm_fwd;
  i->layernorm_bwd = cuda_layernorm_bwd;
}
