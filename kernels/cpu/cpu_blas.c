/* CPU BLAS-like kernels: GEMM through OpenBLAS, simple vector loops. */
#include <cblas.h>
#include <string.h>

#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/error.h"

int axi_cpu_gemm(ax_backend *be, int ta, int tb, int m, int n, int k,
                 float alpha, const float *a, int lda, long sa, const float *b,
                 int ldb, long sb, float beta, float *c, int ldc, long sc,
                 int batch) {
  (void)be;
  if (m < 0 || n < 0 || k < 0 || batch < 0)
    return ax_seterr(AX_EINVAL, "gemm: negative size");
  if (m == 0 || n == 0)
    return AX_OK;
  for (int i = 0; i < batch; i++)
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a + i * sa, lda,
                b + i * sb, ldb, beta, c + i * sc, ldc);
  return AX_OK;
}

int axi_cpu_fill(ax_backend *be, float *x, size_t n, float v) {
  (void)be;
  if (v == 0.0f) {
    memset(x, 0, n * sizeof *x);
    return AX_OK;
  }
#pragma omp parallel for num_threads(ax_cpu_threads()) if (n > 65536)
  for (size_t i = 0; i < n; i++)
    x[i] = v;
  return AX_OK;
}

int axi_cpu_axpby(ax_backend *be, size_t n, float a, const float *x, float b,
                  float *y) {
  (void)be;
  if (b == 0.0f) {
#pragma omp parallel for simd num_threads(ax_cpu_threads()) if (n > 65536)
    for (size_t i = 0; i < n; i++)
      y[i] = a * x[i];
  } else if (a == 1.0f && b == 1.0f) {
#pragma omp parallel for simd num_threads(ax_cpu_threads()) if (n > 65536)
    for (size_t i = 0; i < n; i++)
      y[i] = x[i] + y[i];
  } else {
#pragma omp parallel for simd num_threads(ax_cpu_threads()) if (n > 65536)
    for (size_t i = 0; i < n; i++)
      y[i] = a * x[i] + b * y[i];
  }
  return AX_OK;
}

int axi_cpu_sum(ax_backend *be, size_t n, const float *x, double *out) {
  (void)be;
  double s = 0.0;
  for (size_t i = 0; i < n; i++)
    s += x[i];
  *out = s;
  return AX_OK;
}

int axi_cpu_bias_add(ax_backend *be, float *y, const float *bias, int outer,
                     int c, int inner) {
  (void)be;
#pragma omp parallel for num_threads(ax_cpu_threads())                         \
    collapse(2) if ((long)outer * c * inner > 65536)
  for (int o = 0; o < outer; o++)
    for (int j = 0; j < c; j++) {
      float *p = y + ((size_t)o * c + j) * inner;
      float bj = bias[j];
      for (int i = 0; i < inner; i++)
        p[i] += bj;
    }
  return AX_OK;
}

/* Columns per block of the row-wise bias gradient (inner == 1). */
enum { BG_COLS = 128 };

/* db[j] += the sum of dy (outer, c) down column j, for the w <= BG_COLS
 * columns from dy: one double per column, the rows read contiguously and
 * added in row order from 0.0, so the loop vectorises across columns. */
AXI_CPU_CLONES static void bias_cols(const float *dy, float *db, int outer,
                                     int c, int w) {
  double s[BG_COLS];
  for (int j = 0; j < w; j++)
    s[j] = 0.0;
  for (int o = 0; o < outer; o++) {
    const float *p = dy + (size_t)o * c;
#pragma omp simd
    for (int j = 0; j < w; j++)
      s[j] += p[j];
  }
  for (int j = 0; j < w; j++)
    db[j] += (float)s[j];
}

int axi_cpu_bias_grad(ax_backend *be, const float *dy, float *db, int outer,
                      int c, int inner) {
  (void)be;
  if (inner == 1) {
    /* dy is (outer, c) rows, as a Linear's output gradient: threads take
     * blocks of columns. Every column is still the sum of its rows in row
     * order from 0.0, as below, whatever the thread count. */
    const int nb = (c + BG_COLS - 1) / BG_COLS;
#pragma omp parallel for schedule(static)                                      \
    num_threads(ax_cpu_threads()) if ((long)outer * c > 65536)
    for (int b = 0; b < nb; b++) {
      const int j0 = b * BG_COLS;
      bias_cols(dy + j0, db + j0, outer, c,
                c - j0 < BG_COLS ? c - j0 : BG_COLS);
    }
    return AX_OK;
  }
#pragma omp parallel for num_threads(                                          \
    ax_cpu_threads()) if ((long)outer * c * inner > 65536)
  for (int j = 0; j < c; j++) {
    double s = 0.0;
    for (int o = 0; o < outer; o++) {
      const float *p = dy + ((size_t)o * c + j) * inner;
      for (int i = 0; i < inner; i++)
        s += p[i];
    }
    db[j] += (float)s;
  }
  return AX_OK;
}
