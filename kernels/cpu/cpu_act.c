/* CPU activations and dropout. */
#include <math.h>

#include "axon/kernels/cpu/cpu.h"
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

/* GELU(x) = x * Phi(x), Phi the standard normal CDF. */
int axi_cpu_gelu_fwd(ax_backend *be, size_t n, const float *x, float *y) {
  (void)be;
#pragma omp parallel for num_threads(ax_cpu_threads()) if (n > PAR_N / 8)
  for (size_t i = 0; i < n; i++)
    y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
  return AX_OK;
}

/* d/dx GELU = Phi(x) + x * phi(x). */
int axi_cpu_gelu_bwd(ax_backend *be, size_t n, const float *x, const float *dy,
                     float *dx) {
  (void)be;
#pragma omp parallel for num_threads(ax_cpu_threads()) if (n > PAR_N / 8)
  for (size_t i = 0; i < n; i++) {
    float v = x[i];
    float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
    float pdf = 0.39894228040143268f * expf(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
  return AX_OK;
}

int axi_cpu_dropout_fwd(ax_backend *be, size_t n, const float *x, float *y,
                        float p, uint64_t seed, uint64_t first) {
  (void)be;
  if (p < 0.0f || p >= 1.0f)
    return ax_seterr(AX_EINVAL, "dropout: p = %g outside [0, 1)", p);
  float scale = 1.0f / (1.0f - p);
#pragma omp parallel for num_threads(ax_cpu_threads()) if (n > PAR_N)
  for (size_t i = 0; i < n; i++)
    y[i] = ax_dropout_uniform(seed, first + i) >= p ? x[i] * scale : 0.0f;
  return AX_OK;
}

int axi_cpu_dropout_bwd(ax_backend *be, size_t n, const float *dy, float *dx,
                        float p, uint64_t seed, uint64_t first) {
  return axi_cpu_dropout_fwd(be, n, dy, dx, p, seed, first);
}
