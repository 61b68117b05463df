/* CPU 2-D convolution by im2col / col2im and OpenBLAS sgemm.
 *
 * Every image of the batch is one GEMM against a column matrix
 * col (C*R*S, OH*OW) built from that image. The batch is split over OpenMP
 * threads, each with its own column buffer, and OpenBLAS runs single-threaded
 * inside the parallel region: ResNet-sized GEMMs are too small for OpenBLAS
 * to thread well, and two thread pools fighting over two cores is slower
 * than either alone. With a single image the GEMM keeps OpenBLAS's threads.
 * Images are handed out dynamically, so a thread that loses its core to
 * another process does not hold the whole batch up at the closing barrier.
 * Each GEMM covers a block of output rows whose columns fit in L2. Where the
 * CPU has AVX-512 the GEMMs go to the unpacked kernels of cpu_gemm512.c,
 * which run these small shapes at about twice OpenBLAS's speed, and stride-1
 * convolutions (and the forward and filter gradient of stride-2 3x3 ones)
 * skip the column matrix altogether (cpu_conv_implicit.c).
 *
 * A 1x1 convolution with stride 1 and no padding needs no column matrix: the
 * image itself is (C, H*W). */
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <cblas.h>

#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/error.h"

/* True when the column matrix of an image is the image itself. */
static int conv_is_pointwise(const ax_conv_desc *d) {
  return d->r == 1 && d->s == 1 && d->stride == 1 && d->pad == 0;
}

/* The range [lo, hi) of output columns ow whose input column
 * ow * stride - pad + s lies inside [0, w). */
static void conv_valid_cols(const ax_conv_desc *d, int s, int *lo, int *hi) {
  int st = d->stride, a = d->pad - s, b = d->w + d->pad - s;
  int l = a > 0 ? (a + st - 1) / st : 0;
  int h = b > 0 ? (b + st - 1) / st : 0;
  if (l > d->ow)
    l = d->ow;
  if (h > d->ow)
    h = d->ow;
  if (h < l)
    h = l;
  *lo = l;
  *hi = h;
}

/* Builds the columns of output rows [oh0, oh1) of one image x (C, H, W):
 * col (C*R*S, (oh1 - oh0) * OW); padding reads 0. */
static void im2col(const ax_conv_desc *d, const float *restrict x, int oh0,
                   int oh1, float *restrict col) {
  const int h = d->h, w = d->w, ow_n = d->ow, st = d->stride;
  const size_t nb = (size_t)(oh1 - oh0) * ow_n;
  for (int c = 0; c < d->c; c++) {
    const float *plane = x + (size_t)c * h * w;
    for (int r = 0; r < d->r; r++) {
      for (int s = 0; s < d->s; s++) {
        float *dst = col + ((size_t)(c * d->r + r) * d->s + s) * nb;
        int lo, hi;
        conv_valid_cols(d, s, &lo, &hi);
        for (int oh = oh0; oh < oh1; oh++, dst += ow_n) {
          int ih = oh * st - d->pad + r;
          if (ih < 0 || ih >= h || lo == hi) {
            memset(dst, 0, sizeof(float) * (size_t)ow_n);
            continue;
          }
          const float *src = plane + (size_t)ih * w + (lo * st - d->pad + s);
          for (int ow = 0; ow < lo; ow++)
            dst[ow] = 0.0f;
          if (st == 1) {
            memcpy(dst + lo, src, sizeof(float) * (size_t)(hi - lo));
          } else {
            float *out = dst + lo;
            for (int i = 0; i < hi - lo; i++)
              out[i] = src[i * st];
          }
          for (int ow = hi; ow < ow_n; ow++)
            dst[ow] = 0.0f;
        }
      }
    }
  }
}

/* Adds the columns of output rows [oh0, oh1), col (C*R*S, (oh1 - oh0) * OW),
 * back into one image dx (C, H, W). */
static void col2im(const ax_conv_desc *d, const float *restrict col, int oh0,
                   int oh1, float *restrict dx) {
  const int h = d->h, w = d->w, ow_n = d->ow, st = d->stride;
  const size_t nb = (size_t)(oh1 - oh0) * ow_n;
  for (int c = 0; c < d->c; c++) {
    float *plane = dx + (size_t)c * h * w;
    for (int r = 0; r < d->r; r++) {
      for (int s = 0; s < d->s; s++) {
        const float *src = col + ((size_t)(c * d->r + r) * d->s + s) * nb;
        int lo, hi;
        conv_valid_cols(d, s, &lo, &hi);
        for (int oh = oh0; oh < oh1; oh++, src += ow_n) {
          int ih = oh * st - d->pad + r;
          if (ih < 0 || ih >= h || lo == hi)
            continue;
          float *restrict dst = plane + (size_t)ih * w + (lo * st - d->pad + s);
          const float *restrict in = src + lo;
          const int len = hi - lo;
          if (st == 1) {
#pragma omp simd
            for (int i = 0; i < len; i++)
              dst[i] += in[i];
          } else {
            for (int i = 0; i < len; i++)
              dst[i * st] += in[i];
          }
        }
      }
    }
  }
}

/* Output rows per GEMM: enough that a block of columns stays in the L2
 * cache (about AX_CONV_BLOCK floats), at least one row. */
#define AX_CONV_BLOCK (1 << 16)
static int conv_block_rows(const ax_conv_desc *d) {
  long per_row = (long)d->c * d->r * d->s * d->ow;
  long rows = AX_CONV_BLOCK / (per_row > 0 ? per_row : 1);
  if (rows < 1)
    rows = 1;
  return rows > d->oh ? d->oh : (int)rows;
}

/* The number of threads to split n images over. */
static int conv_threads(int n) {
  int t = ax_cpu_threads();
  return t < n ? t : n;
}

/* Whether the GEMMs go to the AVX-512 kernels of cpu_gemm512.c: when the CPU
 * has them, except for a single image on several threads, which keeps
 * OpenBLAS's own threading. */
static int conv_use512(int nt) {
  return axi_gemm512_available() && (nt > 1 || ax_cpu_threads() == 1);
}

/* Whether a convolution goes to cpu_conv_implicit.c (AVX-512, no column
 * matrix; data: for the data gradient); 1x1 convolutions without padding
 * keep the plain GEMM. */
static int conv_implicit(const ax_conv_desc *d, int data) {
  return !conv_is_pointwise(d) && conv_use512(conv_threads(d->n)) &&
         axi_conv_implicit_ok(d, data);
}

/* C (m, n) = op(A) (m, k) * B (k, n) + beta * C, with op(A) = A (m, k) or,
 * when ta, the transpose of A stored as (k, m). beta is 0 or 1. */
static void gemm_nn(int f512, int ta, int m, int n, int k, const float *a,
                    int lda, const float *b, int ldb, float beta, float *c,
                    int ldc) {
  if (f512)
    axi_gemm512_nn(m, n, k, a, ta ? 1 : lda, ta ? lda : 1, b, ldb, NULL, beta,
                   c, ldc);
  else
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, CblasNoTrans, m,
                n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}

/* C (m, n) += A (m, k) * B^T, with B stored as (n, k). */
static void gemm_nt(int f512, int m, int n, int k, const float *a, int lda,
                    const float *b, int ldb, float *c, int ldc) {
  if (f512)
    axi_gemm512_nt(m, n, k, a, lda, b, ldb, NULL, c, ldc);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, lda,
                b, ldb, 1.0f, c, ldc);
}

/* Runs OpenBLAS single-threaded while an OpenMP team does the batch, and
 * restores the configured count afterwards. */
static void blas_serial_begin(int nt) {
  if (nt > 1)
    openblas_set_num_threads(1);
}

static void blas_serial_end(int nt) {
  if (nt > 1)
    openblas_set_num_threads(ax_cpu_threads());
}

static int conv_check(const char *what, const ax_conv_desc *d) {
  if (!d || d->oh <= 0 || d->ow <= 0 || d->n <= 0 || d->c <= 0 || d->k <= 0)
    return ax_seterr(AX_EINVAL, "%s: descriptor not initialised", what);
  return AX_OK;
}

int axi_cpu_conv2d_fwd(ax_backend *be, const ax_conv_desc *d, const float *x,
                       const float *w, float *y) {
  (void)be;
  AX_TRY(conv_check("conv2d_fwd", d));
  if (conv_implicit(d, 0))
    return axi_conv_implicit_fwd(d, x, w, y);
  const int crs = d->c * d->r * d->s, ohw = d->oh * d->ow;
  const int pw = conv_is_pointwise(d), rows = conv_block_rows(d);
  const size_t xs = (size_t)d->c * d->h * d->w, ys = (size_t)d->k * ohw;
  const int nt = conv_threads(d->n), f512 = conv_use512(nt);
  int fail = 0;
  blas_serial_begin(nt);
#pragma omp parallel num_threads(nt) reduction(| : fail)
  {
    float *col = pw ? NULL : malloc(sizeof(float) * (size_t)crs * rows * d->ow);
    if (!pw && !col)
      fail = 1;
#pragma omp for schedule(dynamic, 1)
    for (int n = 0; n < d->n; n++) {
      if (fail)
        continue;
      if (pw) {
        gemm_nn(f512, 0, d->k, ohw, crs, w, crs, x + n * xs, ohw, 0.0f,
                y + n * ys, ohw);
        continue;
      }
      for (int oh0 = 0; oh0 < d->oh; oh0 += rows) {
        int oh1 = oh0 + rows < d->oh ? oh0 + rows : d->oh;
        int nb = (oh1 - oh0) * d->ow;
        im2col(d, x + n * xs, oh0, oh1, col);
        /* y_n[:, block] (K, nb) = W (K, CRS) * col (CRS, nb) */
        gemm_nn(f512, 0, d->k, nb, crs, w, crs, col, nb, 0.0f,
                y + n * ys + oh0 * d->ow, ohw);
      }
    }
    free(col);
  }
  blas_serial_end(nt);
  if (fail)
    return ax_seterr(AX_ENOMEM, "conv2d_fwd: no memory for the column buffer");
  return AX_OK;
}

int axi_cpu_conv2d_bwd_data(ax_backend *be, const ax_conv_desc *d,
                            const float *dy, const float *w, float *dx) {
  (void)be;
  AX_TRY(conv_check("conv2d_bwd_data", d));
  if (conv_implicit(d, 1))
    return axi_conv_implicit_bwd_data(d, dy, w, dx);
  const int crs = d->c * d->r * d->s, ohw = d->oh * d->ow;
  const int pw = conv_is_pointwise(d), rows = conv_block_rows(d);
  const size_t xs = (size_t)d->c * d->h * d->w, ys = (size_t)d->k * ohw;
  const int nt = conv_threads(d->n), f512 = conv_use512(nt);
  int fail = 0;
  blas_serial_begin(nt);
#pragma omp parallel num_threads(nt) reduction(| : fail)
  {
    float *col = pw ? NULL : malloc(sizeof(float) * (size_t)crs * rows * d->ow);
    if (!pw && !col)
      fail = 1;
#pragma omp for schedule(dynamic, 1)
    for (int n = 0; n < d->n; n++) {
      if (fail)
        continue;
      if (pw) {
        /* dx_n (C, HW) = W^T (C, K) * dy_n (K, HW) */
        gemm_nn(f512, 1, crs, ohw, d->k, w, crs, dy + n * ys, ohw, 0.0f,
                dx + n * xs, ohw);
        continue;
      }
      memset(dx + n * xs, 0, sizeof(float) * xs);
      for (int oh0 = 0; oh0 < d->oh; oh0 += rows) {
        int oh1 = oh0 + rows < d->oh ? oh0 + rows : d->oh;
        int nb = (oh1 - oh0) * d->ow;
        /* dcol (CRS, nb) = W^T (CRS, K) * dy_n[:, block] (K, nb) */
        gemm_nn(f512, 1, crs, nb, d->k, w, crs, dy + n * ys + oh0 * d->ow, ohw,
                0.0f, col, nb);
        col2im(d, col, oh0, oh1, dx + n * xs);
      }
    }
    free(col);
  }
  blas_serial_end(nt);
  if (fail)
    return ax_seterr(AX_ENOMEM,
                     "conv2d_bwd_data: no memory for the column buffer");
  return AX_OK;
}

/* The filter gradient sums over the batch. The images are cut into a fixed
 * number of contiguous chunks, independent of the thread count; each chunk
 * sums into its own buffer (chunks are handed out dynamically), and the
 * buffers are added to dw in chunk order. The result is the same bit for bit
 * however the chunks land on threads. */
#define AX_CONV_DW_CHUNKS 8

/* Adds one block of nb pixels to a chunk's buffer a: dyb (K, nb) with row
 * stride ohw against src (CRS, nb), the columns or the image itself. With tr
 * (AVX-512 and K a multiple of 32) the buffer is transposed, (CRS, K), and
 * the product runs as a (CRS, nb) * (nb, K) GEMM on the transposed block dyt,
 * which avoids the horizontal sums of the dot-product form. */
static void dw_block(int f512, int tr, const ax_conv_desc *d, int crs, int ohw,
                     const float *dyb, int nb, const float *src, float *dyt,
                     float *a) {
  if (!tr) {
    /* a (K, CRS) += dyb (K, nb) * src^T (nb, CRS) */
    gemm_nt(f512, d->k, crs, nb, dyb, ohw, src, nb, a, crs);
    return;
  }
  for (int k = 0; k < d->k; k++)
    for (int p = 0; p < nb; p++)
      dyt[(size_t)p * d->k + k] = dyb[(size_t)k * ohw + p];
  axi_gemm512_nn(crs, d->k, nb, src, nb, 1, dyt, d->k, NULL, 1.0f, a, d->k);
}

int axi_cpu_conv2d_bwd_filter(ax_backend *be, const ax_conv_desc *d,
                              const float *x, const float *dy, float *dw) {
  (void)be;
  AX_TRY(conv_check("conv2d_bwd_filter", d));
  if (conv_implicit(d, 0))
    return axi_conv_implicit_bwd_filter(d, x, dy, dw);
  const int crs = d->c * d->r * d->s, ohw = d->oh * d->ow;
  const int pw = conv_is_pointwise(d), rows = conv_block_rows(d);
  const size_t xs = (size_t)d->c * d->h * d->w, ys = (size_t)d->k * ohw;
  const size_t wn = (size_t)d->k * crs;
  const int nt = conv_threads(d->n), f512 = conv_use512(nt);
  const int tr = f512 && d->k % 32 == 0;
  const int nch = d->n < AX_CONV_DW_CHUNKS ? d->n : AX_CONV_DW_CHUNKS;
  float *acc = calloc((size_t)nch * wn, sizeof(float));
  if (!acc)
    return ax_seterr(AX_ENOMEM, "conv2d_bwd_filter: no scratch memory");
  int fail = 0;
  blas_serial_begin(nt);
#pragma omp parallel num_threads(nt) reduction(| : fail)
  {
    float *col = pw ? NULL : malloc(sizeof(float) * (size_t)crs * rows * d->ow);
    size_t nbmax = pw ? (size_t)ohw : (size_t)rows * d->ow;
    float *dyt = tr ? malloc(sizeof(float) * nbmax * d->k) : NULL;
    if ((!pw && !col) || (tr && !dyt))
      fail = 1;
#pragma omp for schedule(dynamic, 1)
    for (int ch = 0; ch < nch; ch++) {
      float *a = acc + (size_t)ch * wn;
      const int n0 = (int)((long)d->n * ch / nch);
      const int n1 = (int)((long)d->n * (ch + 1) / nch);
      for (int n = n0; n < n1 && !fail; n++) {
        if (pw) {
          dw_block(f512, tr, d, crs, ohw, dy + n * ys, ohw, x + n * xs, dyt, a);
          continue;
        }
        for (int oh0 = 0; oh0 < d->oh; oh0 += rows) {
          int oh1 = oh0 + rows < d->oh ? oh0 + rows : d->oh;
          int nb = (oh1 - oh0) * d->ow;
          im2col(d, x + n * xs, oh0, oh1, col);
          dw_block(f512, tr, d, crs, ohw, dy + n * ys + oh0 * d->ow, nb, col,
                   dyt, a);
        }
      }
    }
    free(col);
    free(dyt);
  }
  blas_serial_end(nt);
  if (!fail) {
    /* dw (K, CRS) += the chunks in order; transposed chunks are (CRS, K). */
#pragma omp parallel for num_threads(nt) schedule(static) if (wn > 4096)
    for (size_t i = 0; i < wn; i++) {
      const size_t j = tr ? (i % crs) * d->k + i / crs : i;
      float s = dw[i];
      for (int ch = 0; ch < nch; ch++)
        s += acc[(size_t)ch * wn + j];
      dw[i] = s;
    }
  }
  free(acc);
  if (fail)
    return ax_seterr(AX_ENOMEM, "conv2d_bwd_filter: no scratch memory");
  return AX_OK;
}
