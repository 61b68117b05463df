/* CPU max and average pooling over NCHW planes.
 *
 * Every (n, c) plane is independent, so OpenMP splits the planes over
 * threads; backward passes write only their own plane of dx, so they need no
 * atomics. Max pooling treats padding as -inf (it never wins) and, like
 * PyTorch, keeps the first maximum of a window and lets NaN win. Average
 * pooling divides by the full window size (count_include_pad). */
#include <math.h>
#include <string.h>

#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/error.h"

static int pool_check(const char *what, const ax_pool_desc *d) {
  if (!d || d->n <= 0 || d->c <= 0 || d->oh <= 0 || d->ow <= 0)
    return ax_seterr(AX_EINVAL, "%s: descriptor not initialised", what);
  return AX_OK;
}

/* The clipped window [*h0, *h1) x [*w0, *w1) of output (oh, ow). */
static void pool_window(const ax_pool_desc *d, int oh, int ow, int *h0, int *h1,
                        int *w0, int *w1) {
  int hs = oh * d->stride - d->pad, ws = ow * d->stride - d->pad;
  int he = hs + d->kh, we = ws + d->kw;
  *h0 = hs < 0 ? 0 : hs;
  *w0 = ws < 0 ? 0 : ws;
  *h1 = he > d->h ? d->h : he;
  *w1 = we > d->w ? d->w : we;
}

int axi_cpu_maxpool_fwd(ax_backend *be, const ax_pool_desc *d, const float *x,
                        float *y, int32_t *argmax) {
  (void)be;
  AX_TRY(pool_check("maxpool_fwd", d));
  const long planes = (long)d->n * d->c;
  const size_t in_sz = (size_t)d->h * d->w, out_sz = (size_t)d->oh * d->ow;
#pragma omp parallel for num_threads(ax_cpu_threads()) schedule(guided)
  for (long p = 0; p < planes; p++) {
    const float *xp = x + p * in_sz;
    float *yp = y + p * out_sz;
    int32_t *ap = argmax + p * out_sz;
    for (int oh = 0; oh < d->oh; oh++) {
      for (int ow = 0; ow < d->ow; ow++) {
        int h0, h1, w0, w1;
        pool_window(d, oh, ow, &h0, &h1, &w0, &w1);
        float best = -INFINITY;
        int32_t at = h0 * d->w + w0;
        for (int ih = h0; ih < h1; ih++) {
          for (int iw = w0; iw < w1; iw++) {
            float v = xp[ih * d->w + iw];
            if (v > best || isnan(v)) {
              best = v;
              at = ih * d->w + iw;
            }
          }
        }
        yp[oh * d->ow + ow] = best;
        ap[oh * d->ow + ow] = at;
      }
    }
  }
  return AX_OK;
}

int axi_cpu_maxpool_bwd(ax_backend *be, const ax_pool_desc *d, const float *dy,
                        const int32_t *argmax, float *dx) {
  (void)be;
  AX_TRY(pool_check("maxpool_bwd", d));
  const long planes = (long)d->n * d->c;
  const size_t in_sz = (size_t)d->h * d->w, out_sz = (size_t)d->oh * d->ow;
#pragma omp parallel for num_threads(ax_cpu_threads()) schedule(guided)
  for (long p = 0; p < planes; p++) {
    float *dxp = dx + p * in_sz;
    const float *dyp = dy + p * out_sz;
    const int32_t *ap = argmax + p * out_sz;
    memset(dxp, 0, sizeof(float) * in_sz);
    for (size_t o = 0; o < out_sz; o++) {
      int32_t i = ap[o];
      if (i >= 0 && (size_t)i < in_sz)
        dxp[i] += dyp[o];
    }
  }
  return AX_OK;
}

int axi_cpu_avgpool_fwd(ax_backend *be, const ax_pool_desc *d, const float *x,
                        float *y) {
  (void)be;
  AX_TRY(pool_check("avgpool_fwd", d));
  const long planes = (long)d->n * d->c;
  const size_t in_sz = (size_t)d->h * d->w, out_sz = (size_t)d->oh * d->ow;
  const float inv = 1.0f / (float)(d->kh * d->kw);
#pragma omp parallel for num_threads(ax_cpu_threads()) schedule(guided)
  for (long p = 0; p < planes; p++) {
    const float *xp = x + p * in_sz;
    float *yp = y + p * out_sz;
    for (int oh = 0; oh < d->oh; oh++) {
      for (int ow = 0; ow < d->ow; ow++) {
        int h0, h1, w0, w1;
        pool_window(d, oh, ow, &h0, &h1, &w0, &w1);
        float s = 0.0f;
        for (int ih = h0; ih < h1; ih++)
          for (int iw = w0; iw < w1; iw++)
            s += xp[ih * d->w + iw];
        yp[oh * d->ow + ow] = s * inv;
      }
    }
  }
  return AX_OK;
}

int axi_cpu_avgpool_bwd(ax_backend *be, const ax_pool_desc *d, const float *dy,
                        float *dx) {
  (void)be;
  AX_TRY(pool_check("avgpool_bwd", d));
  const long planes = (long)d->n * d->c;
  const size_t in_sz = (size_t)d->h * d->w, out_sz = (size_t)d->oh * d->ow;
  const float inv = 1.0f / (float)(d->kh * d->kw);
#pragma omp parallel for num_threads(ax_cpu_threads()) schedule(guided)
  for (long p = 0; p < planes; p++) {
    float *dxp = dx + p * in_sz;
    const float *dyp = dy + p * out_sz;
    memset(dxp, 0, sizeof(float) * in_sz);
    for (int oh = 0; oh < d->oh; oh++) {
      for (int ow = 0; ow < d->ow; ow++) {
        int h0, h1, w0, w1;
        pool_window(d, oh, ow, &h0, &h1, &w0, &w1);
        float g = dyp[oh * d->ow + ow] * inv;
        for (int ih = h0; ih < h1; ih++)
          for (int iw = w0; iw < w1; iw++)
            dxp[ih * d->w + iw] += g;
      }
    }
  }
  return AX_OK;
}
