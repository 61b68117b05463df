/* CUDA backend, dnn family: max and average pooling over NCHW planes, with
 * kernels of our own (cuDNN's max pooling has no argmax output).
 *
 * Same contract and arithmetic as the CPU reference (kernels/cpu/cpu_pool.c):
 *  - max pooling treats padding as -inf, keeps the FIRST maximum of a window
 *    in row-major order and lets NaN win; argmax (N, C, OH, OW) holds the
 *    input-plane offset ih * W + iw of each maximum;
 *  - average pooling divides by the full window (count_include_pad).
 * Forward passes use one thread per output. Backward passes GATHER, one
 * thread per input element, over the outputs whose window contains it, in
 * ascending output order: the same additions in the same order as the CPU's
 * scatter, so results are deterministic (no atomics) and equal to the CPU's.
 * maxpool_bwd expects argmax from maxpool_fwd (every offset inside its own
 * window, which the forward guarantees); offsets outside the plane are
 * ignored, as on the CPU. */
#include "axon/kernels/cuda/cuda_dnn.cuh"

#include <math.h>

/* The clipped window [*h0, *h1) x [*w0, *w1) of output (oh, ow). */
__device__ static void pool_window(const ax_pool_desc &d, int oh, int ow,
                                   int *h0, int *h1, int *w0, int *w1) {
  int hs = oh * d.stride - d.pad, ws = ow * d.stride - d.pad;
  int he = hs + d.kh, we = ws + d.kw;
  *h0 = hs < 0 ? 0 : hs;
  *w0 = ws < 0 ? 0 : ws;
  *h1 = he > d.h ? d.h : he;
  *w1 = we > d.w ? d.w : we;
}

/* The outputs [*lo, *hi] along one axis whose window contains input i. */
__device__ static void pool_covering(int i, int k, int stride, int pad,
                                     int n_out, int *lo, int *hi) {
  int t = i + pad - k + 1; /* smallest window start that still covers i */
  *lo = t <= 0 ? 0 : (t + stride - 1) / stride;
  int h = (i + pad) / stride;
  *hi = h < n_out - 1 ? h : n_out - 1;
}

__global__ static void maxpool_fwd_kernel(ax_pool_desc d, const float *x,
                                          float *y, int32_t *argmax,
                                          size_t total) {
  const size_t out_sz = (size_t)d.oh * d.ow, in_sz = (size_t)d.h * d.w;
  AXI_GRID_STRIDE(o, total) {
    size_t p = o / out_sz;
    int r = (int)(o - p * out_sz), oh = r / d.ow, ow = r % d.ow;
    const float *xp = x + p * in_sz;
    int h0, h1, w0, w1;
    pool_window(d, oh, ow, &h0, &h1, &w0, &w1);
    float best = -INFINITY;
    int32_t at = h0 * d.w + w0;
    for (int ih = h0; ih < h1; ih++)
      for (int iw = w0; iw < w1; iw++) {
        float v = xp[ih * d.w + iw];
        if (v > best || isnan(v)) {
          best = v;
          at = ih * d.w + iw;
        }
      }
    y[o] = best;
    argmax[o] = at;
  }
}

__global__ static void maxpool_bwd_kernel(ax_pool_desc d, const float *dy,
                                          const int32_t *argmax, float *dx,
                                          size_t total) {
  const size_t out_sz = (size_t)d.oh * d.ow, in_sz = (size_t)d.h * d.w;
  AXI_GRID_STRIDE(i, total) {
    size_t p = i / in_sz;
    int at = (int)(i - p * in_sz), ih = at / d.w, iw = at % d.w;
    const float *dyp = dy + p * out_sz;
    const int32_t *ap = argmax + p * out_sz;
    int oh0, oh1, ow0, ow1;
    pool_covering(ih, d.kh, d.stride, d.pad, d.oh, &oh0, &oh1);
    pool_covering(iw, d.kw, d.stride, d.pad, d.ow, &ow0, &ow1);
    float s = 0.0f;
    for (int oh = oh0; oh <= oh1; oh++)
      for (int ow = ow0; ow <= ow1; ow++) {
        int o = oh * d.ow + ow;
        if (ap[o] == at)
          s += dyp[o];
      }
    dx[i] = s;
  }
}

__global__ static void avgpool_fwd_kernel(ax_pool_desc d, const float *x,
                                          float *y, float inv, size_t total) {
  const size_t out_sz = (size_t)d.oh * d.ow, in_sz = (size_t)d.h * d.w;
  AXI_GRID_STRIDE(o, total) {
    size_t p = o / out_sz;
    int r = (int)(o - p * out_sz), oh = r / d.ow, ow = r % d.ow;
    const float *xp = x + p * in_sz;
    int h0, h1, w0, w1;
    pool_window(d, oh, ow, &h0, &h1, &w0, &w1);
    float s = 0.0f;
    for (int ih = h0; ih < h1; ih++)
      for (int iw = w0; iw < w1; iw++)
        s += xp[ih * d.w + iw];
    y[o] = s * inv;
  }
}

__global__ static void avgpool_bwd_kernel(ax_pool_desc d, const float *dy,
                                          float *dx, float inv, size_t total) {
  const size_t out_sz = (size_t)d.oh * d.ow, in_sz = (size_t)d.h * d.w;
  AXI_GRID_STRIDE(i, total) {
    size_t p = i / in_sz;
    int at = (int)(i - p * in_sz), ih = at / d.w, iw = at % d.w;
    const float *dyp = dy + p * out_sz;
    int oh0, oh1, ow0, ow1;
    pool_covering(ih, d.kh, d.stride, d.pad, d.oh, &oh0, &oh1);
    pool_covering(iw, d.kw, d.stride, d.pad, d.ow, &ow0, &ow1);
    float s = 0.0f;
    for (int oh = oh0; oh <= oh1; oh++)
      for (int ow = ow0; ow <= ow1; ow++)
        s += __fmul_rn(dyp[oh * d.ow + ow], inv); /* no FMA: as the CPU */
    dx[i] = s;
  }
}

static int pool_check(ax_backend *be, const char *what, const ax_pool_desc *d) {
  if (!d || d->n <= 0 || d->c <= 0 || d->oh <= 0 || d->ow <= 0 || d->h <= 0 ||
      d->w <= 0 || d->stride <= 0 || d->kh <= 0 || d->kw <= 0)
    return ax_seterr(AX_EINVAL, "%s: descriptor not initialised", what);
  AX_CUDA_ENTER(be);
  return AX_OK;
}

static size_t pool_in(const ax_pool_desc *d) {
  return (size_t)d->n * d->c * d->h * d->w;
}

static size_t pool_out(const ax_pool_desc *d) {
  return (size_t)d->n * d->c * d->oh * d->ow;
}

static int cuda_maxpool_fwd(ax_backend *be, const ax_pool_desc *d,
                            const float *x, float *y, int32_t *argmax) {
  AX_TRY(pool_check(be, "maxpool_fwd", d));
  size_t n = pool_out(d);
  maxpool_fwd_kernel<<<axi_cuda_grid(n), AXI_CUDA_THREADS, 0,
                       axi_cuda_stream(be)>>>(*d, x, y, argmax, n);
  AX_CUDA_TRY(cudaGetLastError());
  return AX_OK;
}

static int cuda_maxpool_bwd(ax_backend *be, const ax_pool_desc *d,
                            const float *dy, const int32_t *argmax, float *dx) {
  AX_TRY(pool_check(be, "maxpool_bwd", d));
  size_t n = pool_in(d);
  maxpool_bwd_kernel<<<axi_cuda_grid(n), AXI_CUDA_THREADS, 0,
                       axi_cuda_stream(be)>>>(*d, dy, argmax, dx, n);
  AX_CUDA_TRY(cudaGetLastError());
  return AX_OK;
}

static int cuda_avgpool_fwd(ax_backend *be, const ax_pool_desc *d,
                            const float *x, float *y) {
  AX_TRY(pool_check(be, "avgpool_fwd", d));
  size_t n = pool_out(d);
  const float inv = 1.0f / (float)(d->kh * d->kw);
  avgpool_fwd_kernel<<<axi_cuda_grid(n), AXI_CUDA_THREADS, 0,
                       axi_cuda_stream(be)>>>(*d, x, y, inv, n);
  AX_CUDA_TRY(cudaGetLastError());
  return AX_OK;
}

static int cuda_avgpool_bwd(ax_backend *be, const ax_pool_desc *d,
                            const float *dy, float *dx) {
  AX_TRY(pool_check(be, "avgpool_bwd", d));
  size_t n = pool_in(d);
  const float inv = 1.0f / (float)(d->kh * d->kw);
  avgpool_bwd_kernel<<<axi_cuda_grid(n), AXI_CUDA_THREADS, 0,
                       axi_cuda_stream(be)>>>(*d, dy, dx, inv, n);
  AX_CUDA_TRY(cudaGetLastError());
  return AX_OK;
}

void axi_cuda_dnn_ops_pool(ax_backend_i *i) {
  i->maxpool_fwd = cuda_maxpool_fwd;
  i->maxpool_bwd = cuda_maxpool_bwd;
  i->avgpool_fwd = cuda_avgpool_fwd;
  i->avgpool_bwd = cuda_avgpool_bwd;
}
