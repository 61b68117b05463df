/* Layer normalisation over the last dimension of x (rows, d) on the CPU.
 *
 * Statistics are accumulated in double so that the reference stays accurate
 * for wide rows; rows are spread over OpenMP threads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/error.h"

/* Below this many elements the OpenMP fork costs more than it saves. */
#define LN_PAR_MIN 16384L

int axi_cpu_layernorm_fwd(ax_backend *be, int rows, int d, const float *x,
                          const float *gamma, const float *beta, float eps,
                          float *y, float *mean, float *rstd) {
  (void)be;
  if (rows < 0 || d <= 0)
    return ax_seterr(AX_EINVAL, "layernorm_fwd: bad shape (%d, %d)", rows, d);
  long work = (long)rows * d;
#pragma omp parallel for num_threads(ax_cpu_threads())                         \
    schedule(static) if (work > LN_PAR_MIN)
  for (int r = 0; r < rows; r++) {
    const float *xr = x + (size_t)r * d;
    float *yr = y + (size_t)r * d;
    double s = 0.0;
    for (int j = 0; j < d; j++)
      s += xr[j];
    double mu = s / d;
    double v = 0.0;
    for (int j = 0; j < d; j++) {
      double c = xr[j] - mu;
      v += c * c;
    }
    /* Biased variance, as BERT and PyTorch's LayerNorm use. */
    float rs = (float)(1.0 / sqrt(v / d + (double)eps));
    float m = (float)mu;
    for (int j = 0; j < d; j++)
      yr[j] = (xr[j] - m) * rs * gamma[j] + beta[j];
    if (mean)
      mean[r] = m;
    if (rstd)
      rstd[r] = rs;
  }
  return AX_OK;
}

/* With xhat = (x - mean) * rstd and g = dy * gamma:
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
 *   dgamma += sum over rows of dy * xhat, dbeta += sum over rows of dy.
 * dx may be NULL when only parameter gradients are wanted. */
int axi_cpu_layernorm_bwd(ax_backend *be, int rows, int d, const float *x,
                          const float *dy, const float *gamma,
                          const float *mean, const float *rstd, float *dx,
                          float *dgamma, float *dbeta) {
  (void)be;
  if (rows < 0 || d <= 0)
    return ax_seterr(AX_EINVAL, "layernorm_bwd: bad shape (%d, %d)", rows, d);
  long work = (long)rows * d;
  int failed = 0;
#pragma omp parallel num_threads(ax_cpu_threads()) if (work > LN_PAR_MIN)
  {
    /* Each thread sums its rows' parameter gradients privately and adds
     * them to the shared outputs once, so no atomics are needed. */
    double *pg = calloc((size_t)d * 2, sizeof(double));
    double *pb = pg ? pg + d : NULL;
    if (!pg) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(static)
    for (int r = 0; r < rows; r++) {
      const float *xr = x + (size_t)r * d, *gr = dy + (size_t)r * d;
      float m = mean[r], rs = rstd[r];
      double sg = 0.0, sgx = 0.0;
      for (int j = 0; j < d; j++) {
        float xh = (xr[j] - m) * rs;
        float g = gr[j] * gamma[j];
        sg += g;
        sgx += (double)g * xh;
        if (pg) {
          pg[j] += (double)gr[j] * xh;
          pb[j] += gr[j];
        }
      }
      if (dx) {
        float mg = (float)(sg / d), mgx = (float)(sgx / d);
        float *dr = dx + (size_t)r * d;
        for (int j = 0; j < d; j++) {
          float xh = (xr[j] - m) * rs;
          dr[j] = rs * (gr[j] * gamma[j] - mg - xh * mgx);
        }
      }
    }
    if (pg) {
#pragma omp critical(ax_layernorm_bwd)
      for (int j = 0; j < d; j++) {
        if (dgamma)
          dgamma[j] += (float)pg[j];
        if (dbeta)
          dbeta[j] += (float)pb[j];
      }
      free(pg);
    }
  }
  if (failed)
    return ax_seterr(AX_ENOMEM, "layernorm_bwd: no memory for %d partial sums",
                     d);
  return AX_OK;
}
