/* CUDA backend, dnn family: the convolutions.
 *
 * Convolutions run through cuDNN's convolution API on NCHW float tensors
 * (cross-correlation, the same as the CPU backend; no dilation, no groups).
 * conv2d_fwd and conv2d_bwd_data overwrite their output (beta = 0);
 * conv2d_bwd_filter ACCUMULATES into dw (beta = 1).
 *
 * Algorithm cache: one entry per ax_conv_desc holds the tensor, filter and
 * convolution descriptors and, per direction, the algorithm chosen on the
 * first call of that direction (hash table in ctx->dnn). The choice:
 *  - by default cuDNN's heuristics (cudnnGet*Algorithm_v7), which depend
 *    only on the GPU, the library and the shape, so a run is reproducible;
 *  - with AXON_CUDNN_BENCHMARK=1, measured (cudnnFind*AlgorithmEx on the
 *    call's own buffers; bwd_filter measures into a scratch dw since dw
 *    accumulates), falling back to the heuristics if that fails.
 * From the ordered list the first DETERMINISTIC algorithm that succeeds and
 * whose workspace fits the limit is taken (AXON_CUDNN_WORKSPACE_MB, default
 * 256), else the first that fits at all.
 * Math: plain FP32 (CUDNN_FMA_MATH: cuDNN's DEFAULT_MATH would allow TF32
 * on Ampere and later) unless AXON_TF32=1 (CUDNN_DEFAULT_MATH, TF32 tensor
 * cores allowed). Both environment variables are read when a shape's
 * algorithm is chosen. */
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/cuda/cuda_dnn.cuh"

enum { DIR_FWD = 0, DIR_DATA = 1, DIR_FILTER = 2 };

struct axi_conv_entry {
  ax_conv_desc key;
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
  int chosen[3];
  int algo[3];
  cudnnMathType_t math[3];
  size_t ws[3];
  axi_conv_entry *next;
};

/* ---- the shape cache ---- */

static unsigned conv_hash(const ax_conv_desc *d) {
  const int v[11] = {d->n, d->c,      d->h,   d->w,  d->k, d->r,
                     d->s, d->stride, d->pad, d->oh, d->ow};
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < 11; i++)
    h = (h ^ (uint32_t)v[i]) * 1099511628211ull;
  return (unsigned)(h % AXI_DNN_BUCKETS);
}

static int conv_same(const ax_conv_desc *a, const ax_conv_desc *b) {
  return a->n == b->n && a->c == b->c && a->h == b->h && a->w == b->w &&
         a->k == b->k && a->r == b->r && a->s == b->s &&
         a->stride == b->stride && a->pad == b->pad && a->oh == b->oh &&
         a->ow == b->ow;
}

static void entry_free(axi_conv_entry *e) {
  if (e->x)
    cudnnDestroyTensorDescriptor(e->x);
  if (e->y)
    cudnnDestroyTensorDescriptor(e->y);
  if (e->w)
    cudnnDestroyFilterDescriptor(e->w);
  if (e->conv)
    cudnnDestroyConvolutionDescriptor(e->conv);
  free(e);
}

static int entry_init(axi_conv_entry *e, const ax_conv_desc *d) {
  AX_CUDNN_TRY(cudnnCreateTensorDescriptor(&e->x));
  AX_CUDNN_TRY(cudnnCreateTensorDescriptor(&e->y));
  AX_CUDNN_TRY(cudnnCreateFilterDescriptor(&e->w));
  AX_CUDNN_TRY(cudnnCreateConvolutionDescriptor(&e->conv));
  AX_CUDNN_TRY(cudnnSetTensor4dDescriptor(
      e->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, d->n, d->c, d->h, d->w));
  AX_CUDNN_TRY(cudnnSetTensor4dDescriptor(
      e->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, d->n, d->k, d->oh, d->ow));
  AX_CUDNN_TRY(cudnnSetFilter4dDescriptor(
      e->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, d->k, d->c, d->r, d->s));
  AX_CUDNN_TRY(cudnnSetConvolution2dDescriptor(
      e->conv, d->pad, d->pad, d->stride, d->stride, 1, 1,
      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  int n, k, oh, ow;
  AX_CUDNN_TRY(cudnnGetConvolution2dForwardOutputDim(e->conv, e->x, e->w, &n,
                                                     &k, &oh, &ow));
  if (n != d->n || k != d->k || oh != d->oh || ow != d->ow)
    return ax_seterr(AX_EINTERNAL,
                     "conv: cuDNN output (%d, %d, %d, %d) differs from the "
                     "descriptor's (%d, %d, %d, %d)",
                     n, k, oh, ow, d->n, d->k, d->oh, d->ow);
  return AX_OK;
}

static int entry_get(axi_dnn_state *s, const ax_conv_desc *d,
                     axi_conv_entry **out) {
  unsigned b = conv_hash(d);
  for (axi_conv_entry *e = s->bucket[b]; e; e = e->next)
    if (conv_same(&e->key, d)) {
      *out = e;
      return AX_OK;
    }
  axi_conv_entry *e = (axi_conv_entry *)calloc(1, sizeof *e);
  if (!e)
    return AX_ENOMEM;
  e->key = *d;
  int rc = entry_init(e, d);
  if (rc != AX_OK) {
    entry_free(e);
    return rc;
  }
  e->next = s->bucket[b];
  s->bucket[b] = e;
  s->entries++;
  *out = e;
  return AX_OK;
}

/* ---- algorithm choice ---- */

static size_t env_ws_limit(void) {
  const char *v = getenv("AXON_CUDNN_WORKSPACE_MB");
  long mb = v && *v ? strtol(v, NULL, 10) : 256;
  return (size_t)(mb < 0 ? 0 : mb) << 20;
}

static int env_flag(const char *name) {
  const char *v = getenv(name);
  return v && v[0] == '1';
}

/* Takes, from a list ordered fastest first, the first DETERMINISTIC entry
 * that succeeded, fits `limit` and whose workspace query succeeds with the
 * math type it will run with; failing that, the first such entry of any
 * kind. Fills e's slot `dir`; returns 0 if nothing fits. The three perf
 * structs share this layout; wsq(algo, &bytes) queries the workspace. */
template <typename Perf, typename Wsq>
static int perf_choose(axi_conv_entry *e, int dir, const Perf *p, int n,
                       size_t limit, int tf32, Wsq wsq) {
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < n; i++) {
      if (p[i].status != CUDNN_STATUS_SUCCESS || p[i].memory > limit ||
          (pass == 0 && p[i].determinism != CUDNN_DETERMINISTIC))
        continue;
      /* Without AXON_TF32 every algorithm runs as plain FP32 FMA. */
      cudnnMathType_t mt = tf32 ? p[i].mathType : CUDNN_FMA_MATH;
      size_t need = 0;
      if (cudnnSetConvolutionMathType(e->conv, mt) != CUDNN_STATUS_SUCCESS ||
          wsq(p[i].algo, &need) != CUDNN_STATUS_SUCCESS || need > limit)
        continue;
      e->algo[dir] = (int)p[i].algo;
      e->math[dir] = mt;
      e->ws[dir] = need > p[i].memory ? need : p[i].memory;
      return 1;
    }
  return 0;
}

/* Largest workspace of a successful entry, at most limit. */
template <typename Perf>
static size_t perf_max_ws(const Perf *p, int n, size_t limit) {
  size_t m = 0;
  for (int i = 0; i < n; i++)
    if (p[i].status == CUDNN_STATUS_SUCCESS && p[i].memory <= limit &&
        p[i].memory > m)
      m = p[i].memory;
  return m;
}

/* A temporary workspace for cudnnFind*Ex: `want` bytes, halved until the
 * allocator gives it (0 bytes if it never does). */
static size_t find_ws(ax_backend *be, size_t want, void **out) {
  *out = NULL;
  while (want > 0 && !(*out = be->iface.alloc(be, want)))
    want /= 2;
  return *out ? want : 0;
}

/* After a cudnnFind*Ex: waits for its kernels, frees the workspace and
 * tells whether the measurement can be used. */
static int find_done(ax_backend *be, cudnnStatus_t st, void *tmp) {
  int ok = st == CUDNN_STATUS_SUCCESS &&
           cudaStreamSynchronize(axi_cuda_stream(be)) == cudaSuccess;
  if (tmp)
    be->iface.free(be, tmp);
  return ok;
}

#define PERF_MAX 32

/* Chooses the algorithm of direction dir for entry e. a, b and out are the
 * call's buffers (see conv_locked); a benchmark writes the output, which
 * the call overwrites anyway, except for bwd_filter, which measures into
 * scratch_dw. */
static int conv_select(ax_backend *be, axi_dnn_state *s, axi_conv_entry *e,
                       const ax_conv_desc *d, int dir, const void *a,
                       const void *b, void *out, void *scratch_dw) {
  cudnnHandle_t h = s->handle;
  const size_t limit = env_ws_limit();
  const int bench = env_flag("AXON_CUDNN_BENCHMARK");
  const int tf32 = env_flag("AXON_TF32");
  const cudnnMathType_t want = tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  int got = 0, nf = 0, ok = 0;
  void *tmp;
  size_t fws;
  AX_CUDNN_TRY(cudnnSetConvolutionMathType(e->conv, want));
  if (dir == DIR_FWD) {
    cudnnConvolutionFwdAlgoPerf_t perf[PERF_MAX], found[PERF_MAX];
    auto wsq = [&](cudnnConvolutionFwdAlgo_t al, size_t *need) {
      return cudnnGetConvolutionForwardWorkspaceSize(h, e->x, e->w, e->conv,
                                                     e->y, al, need);
    };
    AX_CUDNN_TRY(cudnnGetConvolutionForwardAlgorithm_v7(
        h, e->x, e->w, e->conv, e->y, PERF_MAX, &got, perf));
    if (bench) {
      fws = find_ws(be, perf_max_ws(perf, got, limit), &tmp);
      cudnnStatus_t st = cudnnFindConvolutionForwardAlgorithmEx(
          h, e->x, a, e->w, b, e->conv, e->y, out, PERF_MAX, &nf, found, tmp,
          fws);
      if (find_done(be, st, tmp))
        ok = perf_choose(e, dir, found, nf, fws, tf32, wsq);
      AX_CUDNN_TRY(cudnnSetConvolutionMathType(e->conv, want));
    }
    if (!ok)
      ok = perf_choose(e, dir, perf, got, limit, tf32, wsq);
  } else if (dir == DIR_DATA) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[PERF_MAX], found[PERF_MAX];
    auto wsq = [&](cudnnConvolutionBwdDataAlgo_t al, size_t *need) {
      return cudnnGetConvolutionBackwardDataWorkspaceSize(
          h, e->w, e->y, e->conv, e->x, al, need);
    };
    AX_CUDNN_TRY(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        h, e->w, e->y, e->conv, e->x, PERF_MAX, &got, perf));
    if (bench) {
      fws = find_ws(be, perf_max_ws(perf, got, limit), &tmp);
      cudnnStatus_t st = cudnnFindConvolutionBackwardDataAlgorithmEx(
          h, e->w, b, e->y, a, e->conv, e->x, out, PERF_MAX, &nf, found, tmp,
          fws);
      if (find_done(be, st, tmp))
        ok = perf_choose(e, dir, found, nf, fws, tf32, wsq);
      AX_CUDNN_TRY(cudnnSetConvolutionMathType(e->conv, want));
    }
    if (!ok)
      ok = perf_choose(e, dir, perf, got, limit, tf32, wsq);
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[PERF_MAX], found[PERF_MAX];
    auto wsq = [&](cudnnConvolutionBwdFilterAlgo_t al, size_t *need) {
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(
          h, e->x, e->y, e->conv, e->w, al, need);
    };
    AX_CUDNN_TRY(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        h, e->x, e->y, e->conv, e->w, PERF_MAX, &got, perf));
    if (bench && scratch_dw) {
      fws = find_ws(be, perf_max_ws(perf, got, limit), &tmp);
      cudnnStatus_t st = cudnnFindConvolutionBackwardFilterAlgorithmEx(
          h, e->x, a, e->y, b, e->conv, e->w, scratch_dw, PERF_MAX, &nf, found,
          tmp, fws);
      if (find_done(be, st, tmp))
        ok = perf_choose(e, dir, found, nf, fws, tf32, wsq);
      AX_CUDNN_TRY(cudnnSetConvolutionMathType(e->conv, want));
    }
    if (!ok)
      ok = perf_choose(e, dir, perf, got, limit, tf32, wsq);
  }
  if (!ok)
    return ax_seterr(AX_ECUDNN,
                     "conv (%d, %d, %d, %d) k=%d %dx%d stride %d pad %d: no "
                     "cuDNN algorithm for direction %d within %zu bytes of "
                     "workspace (AXON_CUDNN_WORKSPACE_MB)",
                     d->n, d->c, d->h, d->w, d->k, d->r, d->s, d->stride,
                     d->pad, dir, limit);
  e->chosen[dir] = 1;
  s->selects++;
  return AX_OK;
}

/* ---- the convolutions ---- */

/* dir DIR_FWD: a = x, b = w, out = y; DIR_DATA: a = dy, b = w, out = dx;
 * DIR_FILTER: a = x, b = dy, out = dw (accumulated). Lock held. */
static int conv_locked(ax_backend *be, axi_dnn_state *s, const ax_conv_desc *d,
                       int dir, const float *a, const float *b, float *out) {
  axi_conv_entry *e;
  AX_TRY(entry_get(s, d, &e));
  if (!e->chosen[dir]) {
    void *scratch = NULL;
    if (dir == DIR_FILTER && env_flag("AXON_CUDNN_BENCHMARK")) {
      scratch = be->iface.alloc(be, sizeof(float) * (size_t)d->k * d->c * d->r *
                                        d->s);
      if (!scratch)
        return ax_seterr(AX_ENOMEM, "conv: scratch filter gradient");
    }
    int rc = conv_select(be, s, e, d, dir, a, b, out, scratch);
    if (scratch)
      be->iface.free(be, scratch);
    AX_TRY(rc);
  } else {
    s->hits++;
  }
  void *ws = NULL;
  AX_TRY(axi_dnn_workspace(be, s, e->ws[dir], &ws));
  AX_CUDNN_TRY(cudnnSetConvolutionMathType(e->conv, e->math[dir]));
  const float one = 1.0f, zero = 0.0f;
  cudnnHandle_t h = s->handle;
  if (dir == DIR_FWD)
    AX_CUDNN_TRY(
        cudnnConvolutionForward(h, &one, e->x, a, e->w, b, e->conv,
                                (cudnnConvolutionFwdAlgo_t)e->algo[dir], ws,
                                s->ws_bytes, &zero, e->y, out));
  else if (dir == DIR_DATA)
    AX_CUDNN_TRY(cudnnConvolutionBackwardData(
        h, &one, e->w, b, e->y, a, e->conv,
        (cudnnConvolutionBwdDataAlgo_t)e->algo[dir], ws, s->ws_bytes, &zero,
        e->x, out));
  else
    AX_CUDNN_TRY(cudnnConvolutionBackwardFilter(
        h, &one, e->x, a, e->y, b, e->conv,
        (cudnnConvolutionBwdFilterAlgo_t)e->algo[dir], ws, s->ws_bytes, &one,
        e->w, out));
  return AX_OK;
}

static int conv_run(ax_backend *be, const char *what, const ax_conv_desc *d,
                    int dir, const float *a, const float *b, float *out) {
  if (!d)
    return ax_seterr(AX_EINVAL, "%s: no descriptor", what);
  ax_conv_desc chk = *d;
  if (ax_conv_desc_init(&chk) != AX_OK || chk.oh != d->oh || chk.ow != d->ow)
    return ax_seterr(AX_EINVAL, "%s: descriptor not initialised", what);
  axi_dnn_state *s;
  AX_TRY(axi_dnn_lock(be, &s));
  int rc = conv_locked(be, s, d, dir, a, b, out);
  axi_dnn_unlock(s);
  return rc;
}

static int cuda_conv2d_fwd(ax_backend *be, const ax_conv_desc *d,
                           const float *x, const float *w, float *y) {
  return conv_run(be, "conv2d_fwd", d, DIR_FWD, x, w, y);
}

static int cuda_conv2d_bwd_data(ax_backend *be, const ax_conv_desc *d,
                                const float *dy, const float *w, float *dx) {
  return conv_run(be, "conv2d_bwd_data", d, DIR_DATA, dy, w, dx);
}

static int cuda_conv2d_bwd_filter(ax_backend *be, const ax_conv_desc *d,
                                  const float *x, const float *dy, float *dw) {
  return conv_run(be, "conv2d_bwd_filter", d, DIR_FILTER, x, dy, dw);
}

void axi_cuda_dnn_ops_conv(ax_backend_i *i) {
  i->conv2d_fwd = cuda_conv2d_fwd;
  i->conv2d_bwd_data = cuda_conv2d_bwd_data;
  i->conv2d_bwd_filter = cuda_conv2d_bwd_filter;
}
