/* Convolutions without a column matrix, on the AVX-512 GEMMs: stride 1,
 * and stride-2 3x3 ones through the phases of the input (see geom).
 *
 * Each image is copied once into a zero-padded buffer xp (C, Hp, Wp). On the
 * padded grid, output pixel q = oh * Wp + ow reads input tap (c, r, s) at
 * xp[c * Hp * Wp + r * Wp + s + q], so for every tap the taps of consecutive
 * q are consecutive in memory: the "column matrix" is xp itself, read
 * through a table of row offsets (axi_gemm512_nn's boff). The product covers
 * OH rows of Wp pixels; the Wp - OW extra pixels of each row are discarded.
 * This replaces im2col (which writes R*S copies of the input) by a single
 * copy, at the cost of Wp/OW more arithmetic (6% at 32x32, 25% at 8x8).
 *
 *  - forward: y (K, OH*Wp) = W (K, CRS) * xp-taps (CRS, OH*Wp);
 *  - data gradient: the same with dy padded by R-1-pad as input and the
 *    flipped, transposed filter W' (C, K, R, S) = W (K, C, R-1-r, S-1-s);
 *  - filter gradient: dW (K, CRS) += dyw (K, OH*Wp) * taps^T, where dyw is
 *    dy laid out on the padded grid with zeros in the extra pixels, through
 *    axi_gemm512_nt, or its transpose for small images (see image_dw).
 * Images are split over OpenMP threads as in cpu_conv.c; the filter gradient
 * sums over fixed chunks of images in a fixed order, so it is reproducible
 * bit for bit. */
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/error.h"

/* Geometry of one convolution on the padded grid. A stride-2 3x3
 * convolution with padding 1 (even H and W) runs as a stride-1 one over the
 * four phases of the input, x_ab[i][j] = x[2i + a][2j + b], each padded by
 * one zero row on top and one zero column on the left (phase = 1): output
 * (oh, ow) reads tap r from phase a = (r != 1) at padded row oh + (r != 0),
 * and the same for columns. */
typedef struct geom {
  int c, h, w, k, r, s, pad, phase;
  int hp, wp, oh, ow, crs;
  size_t xp_len; /* floats of xp, with zero slack for the last taps */
} geom;

static geom geom_make(int c, int h, int w, int k, int r, int s, int pad) {
  geom g = {c, h, w, k, r, s, pad, 0, 0, 0, 0, 0, 0, 0};
  g.hp = h + 2 * pad;
  g.wp = w + 2 * pad;
  g.oh = g.hp - r + 1;
  g.ow = g.wp - s + 1;
  g.crs = c * r * s;
  g.xp_len = (size_t)c * g.hp * g.wp + (size_t)s + 16;
  return g;
}

/* The geometry of a descriptor for the forward and filter gradient. */
static geom geom_of(const ax_conv_desc *d) {
  if (d->stride == 1)
    return geom_make(d->c, d->h, d->w, d->k, d->r, d->s, d->pad);
  geom g = {d->c, d->h, d->w, d->k, 3, 3, 1, 1, 0, 0, 0, 0, 0, 0};
  g.oh = d->h / 2;
  g.ow = d->w / 2;
  g.hp = g.oh + 1;
  g.wp = g.ow + 1;
  g.crs = d->c * 9;
  g.xp_len = (size_t)4 * d->c * g.hp * g.wp + 16;
  return g;
}

int axi_conv_implicit_ok(const ax_conv_desc *d, int data) {
  if (!axi_gemm512_available() || d->r != d->s)
    return 0;
  if (d->stride == 1)
    return d->pad < d->r;
  /* Stride 2 only for the forward and the filter gradient. */
  return !data && d->stride == 2 && d->r == 3 && d->pad == 1 && d->h % 2 == 0 &&
         d->w % 2 == 0;
}

/* Offsets of the taps (c, r, s) in xp. */
static long *tap_offsets(const geom *g) {
  long *t = malloc(sizeof(long) * (size_t)g->crs);
  if (!t)
    return NULL;
  const long plane = (long)g->hp * g->wp;
  for (int c = 0; c < g->c; c++)
    for (int r = 0; r < g->r; r++)
      for (int s = 0; s < g->s; s++) {
        long o = c * plane + (long)r * g->wp + s;
        if (g->phase) /* phase (a, b) of channel c, shifted by (dr, ds) */
          o = (((r != 1) * 2 + (s != 1)) * (long)g->c + c) * plane +
              (r != 0) * (long)g->wp + (s != 0);
        t[(c * g->r + r) * g->s + s] = o;
      }
  return t;
}

/* Copies image x (C, H, W) into the interior of xp, whose border and slack
 * are zero from its allocation and never written; with phases, into the
 * four phase planes. */
static void pad_in(const geom *g, const float *x, float *xp) {
  if (!g->phase) {
    for (int c = 0; c < g->c; c++)
      for (int i = 0; i < g->h; i++)
        memcpy(xp + ((size_t)c * g->hp + i + g->pad) * g->wp + g->pad,
               x + ((size_t)c * g->h + i) * g->w, sizeof(float) * (size_t)g->w);
    return;
  }
  const size_t plane = (size_t)g->hp * g->wp;
  for (int c = 0; c < g->c; c++)
    for (int ih = 0; ih < g->h; ih++) {
      const float *src = x + ((size_t)c * g->h + ih) * g->w;
      const int a = ih & 1, i = ih >> 1;
      for (int b = 0; b < 2; b++) {
        float *dst = xp + ((size_t)(a * 2 + b) * g->c + c) * plane +
                     (size_t)(i + 1) * g->wp + 1;
        for (int j = 0; j < g->ow; j++)
          dst[j] = src[2 * j + b];
      }
    }
}

/* y (K, OH, OW) = the convolution of one image, through xp and yb
 * (K, OH * Wp). */
static void image_fwd(const geom *g, const long *taps, const float *x,
                      const float *w, float *y, float *xp, float *yb) {
  const int n = g->oh * g->wp;
  pad_in(g, x, xp);
  axi_gemm512_nn(g->k, n, g->crs, w, g->crs, 1, xp, 0, taps, 0.0f, yb, n);
  for (int k = 0; k < g->k; k++)
    for (int i = 0; i < g->oh; i++)
      memcpy(y + ((size_t)k * g->oh + i) * g->ow,
             yb + (size_t)k * n + (size_t)i * g->wp,
             sizeof(float) * (size_t)g->ow);
}

/* Runs image_fwd over a batch of n images with strides xs and ys. */
static int batch_fwd(const geom *g, int nimg, const float *x, size_t xs,
                     const float *w, float *y, size_t ys) {
  long *taps = tap_offsets(g);
  if (!taps)
    return ax_seterr(AX_ENOMEM, "conv2d: no memory for the tap table");
  int t = ax_cpu_threads(), nt = t < nimg ? t : nimg, fail = 0;
#pragma omp parallel num_threads(nt) reduction(| : fail)
  {
    float *xp = calloc(g->xp_len, sizeof(float));
    float *yb = malloc(sizeof(float) * (size_t)g->k * g->oh * g->wp);
    if (!xp || !yb)
      fail = 1;
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < nimg; i++)
      if (!fail)
        image_fwd(g, taps, x + i * xs, w, y + i * ys, xp, yb);
    free(xp);
    free(yb);
  }
  free(taps);
  return fail ? ax_seterr(AX_ENOMEM, "conv2d: no scratch memory") : AX_OK;
}

int axi_conv_implicit_fwd(const ax_conv_desc *d, const float *x, const float *w,
                          float *y) {
  geom g = geom_of(d);
  return batch_fwd(&g, d->n, x, (size_t)d->c * d->h * d->w, w, y,
                   (size_t)d->k * d->oh * d->ow);
}

int axi_conv_implicit_bwd_data(const ax_conv_desc *d, const float *dy,
                               const float *w, float *dx) {
  /* The data gradient is a convolution of dy (K, OH, OW) with pad R-1-pad
   * and the filter W' (C, K, R, S), which gives back (C, H, W). */
  const int R = d->r, S = d->s;
  geom g = geom_make(d->k, d->oh, d->ow, d->c, R, S, R - 1 - d->pad);
  if (R - 1 - d->pad != S - 1 - d->pad || g.oh != d->h || g.ow != d->w)
    return ax_seterr(AX_EINTERNAL, "conv2d_bwd_data: bad implicit geometry");
  float *wf = malloc(sizeof(float) * (size_t)d->k * d->c * R * S);
  if (!wf)
    return ax_seterr(AX_ENOMEM, "conv2d_bwd_data: no scratch memory");
  for (int k = 0; k < d->k; k++)
    for (int c = 0; c < d->c; c++)
      for (int r = 0; r < R; r++)
        for (int s = 0; s < S; s++)
          wf[((size_t)(c * d->k + k) * R + r) * S + s] =
              w[((size_t)(k * d->c + c) * R + (R - 1 - r)) * S + (S - 1 - s)];
  int rc = batch_fwd(&g, d->n, dy, (size_t)d->k * d->oh * d->ow, wf, dx,
                     (size_t)d->c * d->h * d->w);
  free(wf);
  return rc;
}

/* Chunks of images for the filter gradient; see cpu_conv.c. */
#define AX_IMPLICIT_DW_CHUNKS 8

/* Whether the filter gradient takes the transposed form (below). */
static int dw_transposed(const geom *g) {
  return g->k % 32 == 0 && g->oh * g->wp <= 512;
}

/* Adds one image's filter gradient to the chunk's buffer a. Two forms:
 *  - direct: a (K, CRS) += dyw (K, P) * taps^T (P, CRS), dot products along
 *    the P = OH * Wp pixels (axi_gemm512_nt); good for long pixel runs;
 *  - transposed: a (CRS, K) += taps (CRS, P) * dyt (P, K) with dyt the
 *    transposed dy (axi_gemm512_nn_arows); no horizontal sums, so better
 *    for small images, and it needs K to fill the 32-wide tiles. */
static void image_dw(const geom *g, const long *taps, int tr, const float *x,
                     const float *dy, float *xp, float *dyw, float *a) {
  const int n = g->oh * g->wp;
  pad_in(g, x, xp);
  if (tr) {
    /* dyw is dyt (P, K); the rows of the extra pixels stay zero. */
    for (int k = 0; k < g->k; k++)
      for (int oh = 0; oh < g->oh; oh++) {
        const float *src = dy + ((size_t)k * g->oh + oh) * g->ow;
        float *dst = dyw + (size_t)oh * g->wp * g->k + k;
        for (int ow = 0; ow < g->ow; ow++)
          dst[(size_t)ow * g->k] = src[ow];
      }
    axi_gemm512_nn_arows(g->crs, g->k, n, xp, taps, dyw, g->k, 1.0f, a, g->k);
    return;
  }
  /* dyw is dy on the padded grid; the extra pixels stay zero. */
  for (int k = 0; k < g->k; k++)
    for (int oh = 0; oh < g->oh; oh++)
      memcpy(dyw + (size_t)k * n + (size_t)oh * g->wp,
             dy + ((size_t)k * g->oh + oh) * g->ow,
             sizeof(float) * (size_t)g->ow);
  axi_gemm512_nt(g->k, g->crs, n, dyw, n, xp, 0, taps, a, g->crs);
}

int axi_conv_implicit_bwd_filter(const ax_conv_desc *d, const float *x,
                                 const float *dy, float *dw) {
  geom g = geom_of(d);
  const int n = g.oh * g.wp, tr = dw_transposed(&g);
  const size_t xs = (size_t)d->c * d->h * d->w;
  const size_t ys = (size_t)d->k * d->oh * d->ow, wn = (size_t)d->k * g.crs;
  const int nch = d->n < AX_IMPLICIT_DW_CHUNKS ? d->n : AX_IMPLICIT_DW_CHUNKS;
  long *taps = tap_offsets(&g);
  float *acc = calloc((size_t)nch * wn, sizeof(float));
  if (!taps || !acc) {
    free(taps);
    free(acc);
    return ax_seterr(AX_ENOMEM, "conv2d_bwd_filter: no scratch memory");
  }
  int t = ax_cpu_threads(), nt = t < nch ? t : nch, fail = 0;
#pragma omp parallel num_threads(nt) reduction(| : fail)
  {
    float *xp = calloc(g.xp_len, sizeof(float));
    float *dyw = calloc((size_t)d->k * n, sizeof(float));
    if (!xp || !dyw)
      fail = 1;
#pragma omp for schedule(dynamic, 1)
    for (int ch = 0; ch < nch; ch++) {
      const int n0 = (int)((long)d->n * ch / nch);
      const int n1 = (int)((long)d->n * (ch + 1) / nch);
      for (int i = n0; i < n1 && !fail; i++)
        image_dw(&g, taps, tr, x + i * xs, dy + i * ys, xp, dyw,
                 acc + (size_t)ch * wn);
    }
    free(xp);
    free(dyw);
  }
  if (!fail) {
    /* dw (K, CRS) += the chunks in order; transposed chunks are (CRS, K). */
    const int K = d->k, crs = g.crs;
#pragma omp parallel for num_threads(t) schedule(static) if (wn > 4096)
    for (size_t i = 0; i < wn; i++) {
      const size_t j = tr ? (i % crs) * K + i / crs : i;
      float s = dw[i];
      for (int ch = 0; ch < nch; ch++)
        s += acc[(size_t)ch * wn + j];
      dw[i] = s;
    }
  }
  free(taps);
  free(acc);
  return fail ? ax_seterr(AX_ENOMEM, "conv2d_bwd_filter: no scratch memory")
              : AX_OK;
}
