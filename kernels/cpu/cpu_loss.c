/* CPU softmax cross-entropy. */
#include <math.h>
#include <stdlib.h>

#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/cpu/cpu_math-impl.h"
#include "axon/kernels/error.h"

/* Lanes of the vectorised row maxima. */
enum { XL = 16 };

/* The first of the largest values of x[0..n) (n >= 1) as the loop
 *   m = x[0]; for (j = 1; j < n; j++) m = x[j] > m ? x[j] : m;
 * finds it, NaNs after x[0] skipped and x[0] a NaN kept: XL lanes run that
 * loop each over every XL-th value, all starting from x[0], and are then
 * merged in lane order by the same rule. (Of an equal +0 and -0 a lane may
 * keep another than the serial loop would; the softmax below reads the
 * maximum only through differences and sums, where they agree.) */
AXI_CPU_CLONES static float row_max(const float *x, int n) {
  float lane[XL], m = x[0];
  for (int l = 0; l < XL; l++)
    lane[l] = m;
  int j = 1;
  for (; j + XL <= n; j += XL)
#pragma omp simd
    for (int l = 0; l < XL; l++)
      lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
  for (int l = 0; l < XL; l++)
    m = lane[l] > m ? lane[l] : m;
  for (; j < n; j++)
    m = x[j] > m ? x[j] : m;
  return m;
}

/* p[j] = exp(z[j] - mx) for j in [0, n) (p may be z), and their sum: XL
 * double lanes each add every XL-th value in order, then the lanes are
 * added in lane order, so the sum's order is fixed by n alone. */
AXI_CPU_CLONES static double exp_sum(const float *z, float *p, int n,
                                     float mx) {
  double lane[XL] = {0};
  int j = 0;
  for (; j + XL <= n; j += XL)
#pragma omp simd
    for (int l = 0; l < XL; l++) {
      const float e = axi_exp_nonpos(z[j + l] - mx);
      p[j + l] = e;
      lane[l] += e;
    }
  double s = 0.0;
  for (int l = 0; l < XL; l++)
    s += lane[l];
  for (; j < n; j++) {
    const float e = axi_exp_nonpos(z[j] - mx);
    p[j] = e;
    s += e;
  }
  return s;
}

/* p[0..n) *= inv, then the index of the first largest p (0 where p[0] is
 * a NaN), as the serial loop
 *   best = 0; for (j) { p[j] *= inv; if (p[j] > p[best]) best = j; }
 * gives. */
AXI_CPU_CLONES static int scale_argmax(float *p, int n, float inv) {
#pragma omp simd
  for (int j = 0; j < n; j++)
    p[j] *= inv;
  const float m = row_max(p, n);
  if (m != m)
    return 0;
  int best = 0;
  while (p[best] != m)
    best++;
  return best;
}

int axi_cpu_xent_fwd(ax_backend *be, int rows, int classes, const float *logits,
                     const int32_t *labels, int ignore_index, float *probs,
                     double *loss_sum, int64_t *count, int64_t *correct) {
  (void)be;
  for (int r = 0; r < rows; r++)
    if (labels[r] != ignore_index && (labels[r] < 0 || labels[r] >= classes))
      return ax_seterr(AX_EINVAL,
                       "cross-entropy: label %d of row %d outside "
                       "[0, %d)",
                       labels[r], r, classes);
  /* Per-row losses summed serially afterwards, so the total does not depend
   * on the thread count or scheduling (bit-reproducible loss curves);
   * row_hit[r] is 1 when row r's argmax is its label. */
  double *row_loss = malloc(sizeof(double) * (size_t)(rows ? rows : 1));
  char *row_hit = malloc((size_t)(rows ? rows : 1));
  if (!row_loss || !row_hit) {
    free(row_loss);
    free(row_hit);
    return AX_ENOMEM;
  }
#pragma omp parallel for num_threads(                                          \
    ax_cpu_threads()) if ((long)rows * classes > 65536)
  for (int r = 0; r < rows; r++) {
    const float *z = logits + (size_t)r * classes;
    float *p = probs + (size_t)r * classes;
    const float mx = row_max(z, classes);
    const int kept = labels[r] != ignore_index;
    const double zl = kept ? z[labels[r]] : 0.0; /* before p overwrites z */
    const double s = exp_sum(z, p, classes, mx);
    const int best = scale_argmax(p, classes, (float)(1.0 / s));
    row_loss[r] = kept ? log(s) + mx - zl : 0;
    row_hit[r] = best == labels[r];
  }
  double total = 0.0;
  int64_t kept = 0, hits = 0;
  for (int r = 0; r < rows; r++)
    if (labels[r] != ignore_index) {
      total += row_loss[r];
      kept++;
      hits += row_hit[r];
    }
  free(row_loss);
  free(row_hit);
  *loss_sum = total;
  *count = kept;
  if (correct)
    *correct = hits;
  return AX_OK;
}

int axi_cpu_xent_bwd(ax_backend *be, int rows, int classes, const float *probs,
                     const int32_t *labels, int ignore_index, float scale,
                     float *dlogits) {
  (void)be;
#pragma omp parallel for num_threads(                                          \
    ax_cpu_threads()) if ((long)rows * classes > 65536)
  for (int r = 0; r < rows; r++) {
    const float *p = probs + (size_t)r * classes;
    float *d = dlogits + (size_t)r * classes;
    if (labels[r] == ignore_index) {
      for (int j = 0; j < classes; j++)
        d[j] = 0.0f;
      continue;
    }
    for (int j = 0; j < classes; j++)
      d[j] = scale * p[j];
    d[labels[r]] -= scale;
  }
  return AX_OK;
}
