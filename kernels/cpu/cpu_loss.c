/* CPU softmax cross-entropy. */
#include <math.h>
#include <stdlib.h>

#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/error.h"

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
    float mx = z[0];
    for (int j = 1; j < classes; j++)
      mx = z[j] > mx ? z[j] : mx;
    double s = 0.0;
    for (int j = 0; j < classes; j++) {
      p[j] = expf(z[j] - mx);
      s += p[j];
    }
    float inv = (float)(1.0 / s);
    int best = 0;
    for (int j = 0; j < classes; j++) {
      p[j] *= inv;
      if (p[j] > p[best])
        best = j;
    }
    row_loss[r] = labels[r] != ignore_index ? log(s) + mx - z[labels[r]] : 0;
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
