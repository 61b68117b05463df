/* CPU activations and dropout. */
#include <math.h>

#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/cpu/cpu_math-impl.h"
#include "axon/kernels/error.h"

#define PAR_N 65536

int axi_cpu_relu_fwd(ax_backend *be, size_t n, const float *x, float *y) {
  (void)be;
#pragma omp parallel for simd num_threads(ax_cpu_threads()) if (n > PAR_N)
  for (size_t i = 0; i < n; i++) {
    /* Branch-free so that it vectorises: signs are random, branches are not
     * predictable. */
    float v = x[i];
    y[i] = v > 0.0f ? v : 0.0f;
  }
  return AX_OK;
}

int axi_cpu_relu_bwd(ax_backend *be, size_t n, const float *y, const float *dy,
                     float *dx) {
  (void)be;
#pragma omp parallel for simd num_threads(ax_cpu_threads()) if (n > PAR_N)
  for (size_t i = 0; i < n; i++) {
    float g = dy[i];
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
  return AX_OK;
}

int axi_cpu_add_relu_fwd(ax_backend *be, size_t n, const float *x, float *y) {
  (void)be;
#pragma omp parallel for simd num_threads(ax_cpu_threads()) if (n > PAR_N)
  for (size_t i = 0; i < n; i++) {
    float v = x[i] + y[i];
    y[i] = v > 0.0f ? v : 0.0f;
  }
  return AX_OK;
}

int axi_cpu_tanh_fwd(ax_backend *be, size_t n, const float *x, float *y) {
  (void)be;
#pragma omp parallel for num_threads(ax_cpu_threads()) if (n > PAR_N)
  for (size_t i = 0; i < n; i++)
    y[i] = tanhf(x[i]);
  return AX_OK;
}

int axi_cpu_tanh_bwd(ax_backend *be, size_t n, const float *y, const float *dy,
                     float *dx) {
  (void)be;
#pragma omp parallel for num_threads(ax_cpu_threads()) if (n > PAR_N)
  for (size_t i = 0; i < n; i++)
    dx[i] = dy[i] * (1.0f - y[i] * y[i]);
  return AX_OK;
}

/* Values per unit of work of the elementwise loops below, whose bodies are
 * cloned for AVX-512 and vectorise there. */
enum { BLOCK = 4096 };

/* GELU(x) = x * Phi(x), Phi the standard normal CDF. */
AXI_CPU_CLONES static void gelu_block(size_t n, const float *x, float *y) {
#pragma omp simd
  for (size_t i = 0; i < n; i++)
    y[i] = x[i] * axi_normal_cdf(x[i]);
}

/* d/dx GELU = Phi(x) + x * phi(x). */
AXI_CPU_CLONES static void gelu_bwd_block(size_t n, const float *x,
                                          const float *dy, float *dx) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) {
    const float v = x[i];
    const float pdf = 0.39894228040143268f * axi_exp_nonpos(-0.5f * v * v);
    dx[i] = dy[i] * (axi_normal_cdf(v) + v * pdf);
  }
}

AXI_CPU_CLONES static void dropout_block(size_t n, const float *x, float *y,
                                         float p, float scale, uint64_t seed,
                                         uint64_t first) {
#pragma omp simd
  for (size_t i = 0; i < n; i++)
    y[i] = ax_dropout_uniform(seed, first + i) >= p ? x[i] * scale : 0.0f;
}

static size_t block_len(size_t n, size_t b) {
  return n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK;
}

int axi_cpu_gelu_fwd(ax_backend *be, size_t n, const float *x, float *y) {
  (void)be;
  const size_t nb = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for num_threads(ax_cpu_threads()) if (n > PAR_N / 8)
  for (size_t b = 0; b < nb; b++)
    gelu_block(block_len(n, b), x + b * BLOCK, y + b * BLOCK);
  return AX_OK;
}

int axi_cpu_gelu_bwd(ax_backend *be, size_t n, const float *x, const float *dy,
                     float *dx) {
  (void)be;
  const size_t nb = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for num_threads(ax_cpu_threads()) if (n > PAR_N / 8)
  for (size_t b = 0; b < nb; b++)
    gelu_bwd_block(block_len(n, b), x + b * BLOCK, dy + b * BLOCK,
                   dx + b * BLOCK);
  return AX_OK;
}

int axi_cpu_dropout_fwd(ax_backend *be, size_t n, const float *x, float *y,
                        float p, uint64_t seed, uint64_t first) {
  (void)be;
  if (p < 0.0f || p >= 1.0f)
    return ax_seterr(AX_EINVAL, "dropout: p = %g outside [0, 1)", p);
  const float scale = 1.0f / (1.0f - p);
  const size_t nb = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for num_threads(ax_cpu_threads()) if (n > PAR_N)
  for (size_t b = 0; b < nb; b++)
    dropout_block(block_len(n, b), x + b * BLOCK, y + b * BLOCK, p, scale, seed,
                  first + b * BLOCK);
  return AX_OK;
}

int axi_cpu_dropout_bwd(ax_backend *be, size_t n, const float *dy, float *dx,
                        float p, uint64_t seed, uint64_t first) {
  return axi_cpu_dropout_fwd(be, n, dy, dx, p, seed, first);
}
