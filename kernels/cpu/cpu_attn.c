/* Attention and embedding kernels on the CPU: masked softmax and its
 * gradient, the (0, 2, 1, 3) permutation that moves heads next to the batch,
 * and the embedding gather / scatter-add. */
#include <math.h>
#include <string.h>

#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/error.h"

/* Below this many elements the OpenMP fork costs more than it saves. */
#define ATTN_PAR_MIN 16384L

/* A key j of batch element b is attended iff mask[b * sk + j] != 0. A row
 * whose keys are all padding gets probability 0 everywhere (not NaN), so a
 * fully padded sequence contributes nothing instead of poisoning the batch. */
int axi_cpu_softmax_mask_fwd(ax_backend *be, int b, int heads, int sq, int sk,
                             const float *scores, const float *mask,
                             float scale, float *probs) {
  (void)be;
  if (b < 0 || heads <= 0 || sq < 0 || sk <= 0)
    return ax_seterr(AX_EINVAL, "softmax_mask_fwd: bad shape (%d, %d, %d, %d)",
                     b, heads, sq, sk);
  long rows = (long)b * heads * sq;
#pragma omp parallel for num_threads(ax_cpu_threads())                         \
    schedule(static) if (rows * sk > ATTN_PAR_MIN)
  for (long r = 0; r < rows; r++) {
    const float *s = scores + (size_t)r * sk;
    float *p = probs + (size_t)r * sk;
    const float *mk =
        mask ? mask + (size_t)(r / ((long)heads * sq)) * sk : NULL;
    float mx = -INFINITY;
    for (int j = 0; j < sk; j++)
      if (!mk || mk[j] != 0.0f)
        mx = fmaxf(mx, scale * s[j]);
    if (mx == -INFINITY) { /* every key is padding */
      memset(p, 0, sizeof(float) * (size_t)sk);
      continue;
    }
    double sum = 0.0;
    for (int j = 0; j < sk; j++) {
      float e = (!mk || mk[j] != 0.0f) ? expf(scale * s[j] - mx) : 0.0f;
      p[j] = e;
      sum += e;
    }
    float inv = (float)(1.0 / sum);
    for (int j = 0; j < sk; j++)
      p[j] *= inv;
  }
  return AX_OK;
}

/* dscores may alias dprobs: each row's dot product is taken before the row
 * is written. */
int axi_cpu_softmax_bwd(ax_backend *be, int rows, int cols, const float *probs,
                        const float *dprobs, float scale, float *dscores) {
  (void)be;
  if (rows < 0 || cols <= 0)
    return ax_seterr(AX_EINVAL, "softmax_bwd: bad shape (%d, %d)", rows, cols);
#pragma omp parallel for num_threads(ax_cpu_threads())                         \
    schedule(static) if ((long)rows * cols > ATTN_PAR_MIN)
  for (int r = 0; r < rows; r++) {
    const float *p = probs + (size_t)r * cols, *dp = dprobs + (size_t)r * cols;
    float *ds = dscores + (size_t)r * cols;
    double dot = 0.0;
    for (int j = 0; j < cols; j++)
      dot += (double)dp[j] * p[j];
    float fd = (float)dot;
    for (int j = 0; j < cols; j++)
      ds[j] = scale * p[j] * (dp[j] - fd);
  }
  return AX_OK;
}

int axi_cpu_permute0213(ax_backend *be, int d0, int d1, int d2, int d3,
                        const float *x, float *y) {
  (void)be;
  if (d0 < 0 || d1 < 0 || d2 < 0 || d3 < 0)
    return ax_seterr(AX_EINVAL, "permute0213: bad shape (%d, %d, %d, %d)", d0,
                     d1, d2, d3);
  if (x == y && d1 > 1 && d2 > 1)
    return ax_seterr(AX_EINVAL, "permute0213: cannot permute in place");
  long outer = (long)d0 * d1;
  size_t row = sizeof(float) * (size_t)d3;
#pragma omp parallel for num_threads(ax_cpu_threads())                         \
    schedule(static) if (outer * d2 * d3 > ATTN_PAR_MIN)
  for (long o = 0; o < outer; o++) {
    long i0 = o / d1, i1 = o % d1;
    const float *src = x + (size_t)o * d2 * d3;
    float *dst = y + ((size_t)i0 * d2 * d1 + (size_t)i1) * d3;
    for (int i2 = 0; i2 < d2; i2++)
      memcpy(dst + (size_t)i2 * d1 * d3, src + (size_t)i2 * d3, row);
  }
  return AX_OK;
}

int axi_cpu_embedding_fwd(ax_backend *be, int n_idx, int dim, int rows,
                          const int32_t *idx, const float *table, float *y) {
  (void)be;
  if (n_idx < 0 || dim <= 0 || rows < 0)
    return ax_seterr(AX_EINVAL, "embedding_fwd: bad shape (%d ids, dim %d)",
                     n_idx, dim);
  /* Check every id before writing anything, so a bad batch fails cleanly. */
  for (int i = 0; i < n_idx; i++)
    if (idx[i] < 0 || idx[i] >= rows)
      return ax_seterr(AX_EINVAL,
                       "embedding: id %d at position %d outside [0, %d)",
                       (int)idx[i], i, rows);
  size_t row = sizeof(float) * (size_t)dim;
#pragma omp parallel for num_threads(ax_cpu_threads())                         \
    schedule(static) if ((long)n_idx * dim > ATTN_PAR_MIN)
  for (int i = 0; i < n_idx; i++)
    memcpy(y + (size_t)i * dim, table + (size_t)idx[i] * dim, row);
  return AX_OK;
}

/* Repeated ids add up, so threads split the embedding dimension instead of
 * the ids: every thread owns a band of columns of every table row. Negative
 * ids (rejected by the forward) are skipped. */
int axi_cpu_embedding_bwd(ax_backend *be, int n_idx, int dim,
                          const int32_t *idx, const float *dy, float *dtable) {
  (void)be;
  if (n_idx < 0 || dim <= 0)
    return ax_seterr(AX_EINVAL, "embedding_bwd: bad shape (%d ids, dim %d)",
                     n_idx, dim);
  const int band = 64;
  int nbands = (dim + band - 1) / band;
#pragma omp parallel for num_threads(ax_cpu_threads())                         \
    schedule(static) if ((long)n_idx * dim > ATTN_PAR_MIN)
  for (int bnd = 0; bnd < nbands; bnd++) {
    int j0 = bnd * band, j1 = j0 + band < dim ? j0 + band : dim;
    for (int i = 0; i < n_idx; i++) {
      if (idx[i] < 0)
        continue;
      float *t = dtable + (size_t)idx[i] * dim;
      const float *g = dy + (size_t)i * dim;
      for (int j = j0; j < j1; j++)
        t[j] += g[j];
    }
  }
  return AX_OK;
}
