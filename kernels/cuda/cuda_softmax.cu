/* CUDA backend, softmax family: softmax cross-entropy, the masked softmax of
 * attention and its gradient, and the (0, 2, 1, 3) permutation; contracts
 * in kernels/backend-impl.h, arithmetic as the CPU reference
 * (kernels/cpu/cpu_loss.c, kernels/cpu/cpu_attn.c).
 *
 * Row kernels run one block per row: the row maximum in float, the sum of
 * exponentials in double, then probabilities scaled by (float)(1 / sum).
 * xent_fwd: each row block also finds the argmax of the probabilities it
 * wrote (a block reduction of (value, index) pairs that keeps the larger
 * value and, on ties, the lower index, NaN excluded: the CPU's serial scan)
 * and flags the row when it is the label; a second one-block kernel sums the
 * kept rows' losses (double), counts them and their flags in a fixed order,
 * and finds the first row whose label is neither in [0, classes) nor
 * ignore_index; only that result is copied to the host (the call waits for
 * it), and such a label gives AX_EINVAL (probs are then written but
 * meaningless). softmax_mask_fwd: a row whose keys are all
 * padding gets probability 0 everywhere. softmax_bwd: dscores may alias
 * dprobs (each element is read and written by the same thread, and the
 * row's dot product is complete before any write). */
#include <limits.h>

#include "axon/kernels/cuda/cuda_reduce.cuh"

/* ---- cross-entropy ---- */

typedef struct xent_result {
  double loss;
  long long count;
  long long correct;
  int bad_row; /* INT_MAX when every label is valid */
  int bad_label;
} xent_result;

/* An argmax candidate: index INT_MAX stands for none. */
typedef struct xent_best {
  float v;
  int i;
} xent_best;

__device__ static inline xent_best xent_best_of(xent_best a, xent_best b) {
  if (b.i == INT_MAX)
    return a;
  if (a.i == INT_MAX || b.v > a.v || (b.v == a.v && b.i < a.i))
    return b;
  return a;
}

__device__ static inline xent_best xent_warp_best(xent_best b) {
  for (int o = 16; o > 0; o >>= 1) {
    xent_best t;
    t.v = __shfl_xor_sync(0xffffffffu, b.v, o);
    t.i = __shfl_xor_sync(0xffffffffu, b.i, o);
    b = xent_best_of(b, t);
  }
  return b;
}

/* The block's best of each thread's candidate b, returned to every thread
 * (as axi_block_sum). */
__device__ static xent_best xent_block_best(xent_best b,
                                            xent_best *sh /* [32] */) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5,
            nw = blockDim.x >> 5;
  const xent_best none = {0.0f, INT_MAX};
  b = xent_warp_best(b);
  __syncthreads();
  if (lane == 0)
    sh[wid] = b;
  __syncthreads();
  return xent_warp_best(lane < nw ? sh[lane] : none);
}

__global__ static void xent_rows_kernel(int classes, const float *logits,
                                        const int32_t *labels, int ignore_index,
                                        float *probs, double *row_loss,
                                        int *row_hit) {
  __shared__ double shd[32];
  __shared__ float shf[32];
  __shared__ xent_best shb[32];
  const size_t r = blockIdx.x;
  const float *z = logits + r * classes;
  float *p = probs + r * classes;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < classes; j += blockDim.x)
    mx = fmaxf(mx, z[j]);
  mx = axi_block_max(mx, shf);
  /* The label's logit before any thread writes p, which may be z. */
  const int lab = labels[r];
  const double zl =
      threadIdx.x == 0 && lab != ignore_index && lab >= 0 && lab < classes
          ? (double)z[lab]
          : 0.0;
  double s = 0.0;
  for (int j = threadIdx.x; j < classes; j += blockDim.x) {
    float e = expf(z[j] - mx);
    p[j] = e;
    s += e;
  }
  s = axi_block_sum(s, shd);
  const float inv = (float)(1.0 / s);
  xent_best b = {0.0f, INT_MAX};
  for (int j = threadIdx.x; j < classes; j += blockDim.x) {
    xent_best c = {__fmul_rn(p[j], inv), j};
    p[j] = c.v;
    if (!isnan(c.v))
      b = xent_best_of(b, c);
  }
  b = xent_block_best(b, shb);
  if (threadIdx.x == 0) { /* thread 0 wrote p[0] itself */
    /* The serial scan's argmax: the lowest index of the largest non-NaN
     * value, unless p[0] is NaN (nothing beats it then). */
    int best = isnan(p[0]) || b.i == INT_MAX ? 0 : b.i;
    row_loss[r] = lab != ignore_index && lab >= 0 && lab < classes
                      ? log(s) + (double)mx - zl
                      : 0.0;
    row_hit[r] = best == lab;
  }
}

__global__ static void xent_sum_kernel(int rows, int classes,
                                       const int32_t *labels, int ignore_index,
                                       const double *row_loss,
                                       const int *row_hit, xent_result *res) {
  __shared__ double shd[32];
  __shared__ long long shl[32];
  __shared__ int shi[32];
  double loss = 0.0;
  long long count = 0, correct = 0;
  int bad = INT_MAX;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    int lab = labels[r];
    if (lab == ignore_index)
      continue;
    if (lab < 0 || lab >= classes) {
      bad = min(bad, r);
      continue;
    }
    loss += row_loss[r];
    count++;
    correct += row_hit[r];
  }
  loss = axi_block_sum(loss, shd);
  count = axi_block_sum(count, shl);
  correct = axi_block_sum(correct, shl);
  bad = axi_block_min(bad, shi);
  if (threadIdx.x == 0) {
    res->loss = loss;
    res->count = count;
    res->correct = correct;
    res->bad_row = bad;
    res->bad_label = bad != INT_MAX ? labels[bad] : 0;
  }
}

static int cuda_xent_fwd(ax_backend *be, int rows, int classes,
                         const float *logits, const int32_t *labels,
                         int ignore_index, float *probs, double *loss_sum_host,
                         int64_t *count_host, int64_t *correct_host) {
  if (rows < 0 || classes <= 0)
    return ax_seterr(AX_EINVAL, "cross-entropy: bad shape (%d, %d)", rows,
                     classes);
  if (rows == 0) {
    *loss_sum_host = 0.0;
    *count_host = 0;
    if (correct_host)
      *correct_host = 0;
    return AX_OK;
  }
  AX_CUDA_ENTER(be);
  cudaStream_t st = axi_cuda_stream(be);
  /* scratch: the result, one double per row, then one int per row */
  char *buf = (char *)be->iface.alloc(be, 256 + (sizeof(double) + 4) * rows);
  if (!buf)
    return ax_seterr(AX_ENOMEM, "cross-entropy: scratch for %d rows", rows);
  xent_result *dres = (xent_result *)buf, res;
  double *row_loss = (double *)(buf + 256);
  int *row_hit = (int *)(row_loss + rows);
  xent_rows_kernel<<<rows, axi_row_threads(classes), 0, st>>>(
      classes, logits, labels, ignore_index, probs, row_loss, row_hit);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) {
    xent_sum_kernel<<<1, 256, 0, st>>>(rows, classes, labels, ignore_index,
                                       row_loss, row_hit, dres);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(&res, dres, sizeof res, cudaMemcpyDeviceToHost, st);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(st);
  be->iface.free(be, buf);
  if (e != cudaSuccess)
    return ax_seterr(AX_ECUDA, "cross-entropy: %s", cudaGetErrorString(e));
  if (res.bad_row != INT_MAX)
    return ax_seterr(AX_EINVAL,
                     "cross-entropy: label %d of row %d outside [0, %d)",
                     res.bad_label, res.bad_row, classes);
  *loss_sum_host = res.loss;
  *count_host = (int64_t)res.count;
  if (correct_host)
    *correct_host = (int64_t)res.correct;
  return AX_OK;
}

/* dlogits = scale * (probs - onehot(label)); 0 for ignored rows. */
__global__ static void xent_bwd_kernel(int classes, const float *probs,
                                       const int32_t *labels, int ignore_index,
                                       float scale, float *dlogits,
                                       size_t total) {
  AXI_GRID_STRIDE(i, total) {
    size_t r = i / classes;
    int j = (int)(i - r * classes), lab = labels[r];
    float v = 0.0f;
    if (lab != ignore_index) {
      v = __fmul_rn(scale, probs[i]);
      if (j == lab)
        v = __fsub_rn(v, scale);
    }
    dlogits[i] = v;
  }
}

static int cuda_xent_bwd(ax_backend *be, int rows, int classes,
                         const float *probs, const int32_t *labels,
                         int ignore_index, float scale, float *dlogits) {
  if (rows < 0 || classes <= 0)
    return ax_seterr(AX_EINVAL, "cross-entropy backward: bad shape (%d, %d)",
                     rows, classes);
  size_t total = (size_t)rows * classes;
  if (total == 0)
    return AX_OK;
  AX_CUDA_ENTER(be);
  xent_bwd_kernel<<<axi_cuda_grid(total), AXI_CUDA_THREADS, 0,
                    axi_cuda_stream(be)>>>(classes, probs, labels, ignore_index,
                                           scale, dlogits, total);
  AX_CUDA_TRY(cudaGetLastError());
  return AX_OK;
}

/* ---- attention softmax ---- */

/* Row r of (b * heads * sq) rows uses mask row r / (heads * sq). */
__global__ static void softmax_mask_kernel(int hsq, int sk, const float *scores,
                                           const float *mask, float scale,
                                           float *probs) {
  __shared__ double shd[32];
  __shared__ float shf[32];
  const size_t r = blockIdx.x;
  const float *s = scores + r * sk;
  float *p = probs + r * sk;
  const float *mk = mask ? mask + (r / hsq) * sk : NULL;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < sk; j += blockDim.x)
    if (!mk || mk[j] != 0.0f)
      mx = fmaxf(mx, __fmul_rn(scale, s[j]));
  mx = axi_block_max(mx, shf);
  if (mx == -INFINITY) { /* every key is padding (uniform over the block) */
    for (int j = threadIdx.x; j < sk; j += blockDim.x)
      p[j] = 0.0f;
    return;
  }
  double sum = 0.0;
  for (int j = threadIdx.x; j < sk; j += blockDim.x) {
    float e = (!mk || mk[j] != 0.0f) ? expf(__fmul_rn(scale, s[j]) - mx) : 0.0f;
    p[j] = e;
    sum += e;
  }
  sum = axi_block_sum(sum, shd);
  const float inv = (float)(1.0 / sum);
  for (int j = threadIdx.x; j < sk; j += blockDim.x)
    p[j] = __fmul_rn(p[j], inv);
}

static int cuda_softmax_mask_fwd(ax_backend *be, int b, int heads, int sq,
                                 int sk, const float *scores, const float *mask,
                                 float scale, float *probs) {
  if (b < 0 || heads <= 0 || sq < 0 || sk <= 0)
    return ax_seterr(AX_EINVAL, "softmax_mask_fwd: bad shape (%d, %d, %d, %d)",
                     b, heads, sq, sk);
  long rows = (long)b * heads * sq;
  if (rows == 0)
    return AX_OK;
  if (rows > 0x7fffffffL)
    return ax_seterr(AX_EINVAL, "softmax_mask_fwd: %ld rows", rows);
  AX_CUDA_ENTER(be);
  softmax_mask_kernel<<<(unsigned)rows, axi_row_threads(sk), 0,
                        axi_cuda_stream(be)>>>(heads * sq, sk, scores, mask,
                                               scale, probs);
  AX_CUDA_TRY(cudaGetLastError());
  return AX_OK;
}

/* Not __restrict__: dscores may alias dprobs. */
__global__ static void softmax_bwd_kernel(int cols, const float *probs,
                                          const float *dprobs, float scale,
                                          float *dscores) {
  __shared__ double shd[32];
  const size_t r = blockIdx.x;
  const float *p = probs + r * cols, *dp = dprobs + r * cols;
  float *ds = dscores + r * cols;
  double dot = 0.0;
  for (int j = threadIdx.x; j < cols; j += blockDim.x)
    dot += (double)dp[j] * p[j];
  const float fd = (float)axi_block_sum(dot, shd);
  for (int j = threadIdx.x; j < cols; j += blockDim.x)
    ds[j] = __fmul_rn(__fmul_rn(scale, p[j]), __fsub_rn(dp[j], fd));
}

static int cuda_softmax_bwd(ax_backend *be, int rows, int cols,
                            const float *probs, const float *dprobs,
                            float scale, float *dscores) {
  if (rows < 0 || cols <= 0)
    return ax_seterr(AX_EINVAL, "softmax_bwd: bad shape (%d, %d)", rows, cols);
  if (rows == 0)
    return AX_OK;
  AX_CUDA_ENTER(be);
  softmax_bwd_kernel<<<rows, axi_row_threads(cols), 0, axi_cuda_stream(be)>>>(
      cols, probs, dprobs, scale, dscores);
  AX_CUDA_TRY(cudaGetLastError());
  return AX_OK;
}

/* ---- permutation ---- */

/* y (d0, d2, d1, d3) from x (d0, d1, d2, d3), one thread per element of y
 * (reads and writes both run along d3). */
__global__ static void permute0213_kernel(int d1, int d2, int d3,
                                          const float *x, float *y,
                                          size_t total) {
  AXI_GRID_STRIDE(o, total) {
    size_t t = o / d3;
    int i3 = (int)(o - t * d3);
    int i1 = (int)(t % d1);
    t /= d1;
    int i2 = (int)(t % d2);
    size_t i0 = t / d2;
    y[o] = x[((i0 * d1 + i1) * d2 + i2) * d3 + i3];
  }
}

static int cuda_permute0213(ax_backend *be, int d0, int d1, int d2, int d3,
                            const float *x, float *y) {
  if (d0 < 0 || d1 < 0 || d2 < 0 || d3 < 0)
    return ax_seterr(AX_EINVAL, "permute0213: bad shape (%d, %d, %d, %d)", d0,
                     d1, d2, d3);
  if (x == y && d1 > 1 && d2 > 1)
    return ax_seterr(AX_EINVAL, "permute0213: cannot permute in place");
  size_t total = (size_t)d0 * d1 * d2 * d3;
  if (total == 0)
    return AX_OK;
  AX_CUDA_ENTER(be);
  permute0213_kernel<<<axi_cuda_grid(total), AXI_CUDA_THREADS, 0,
                       axi_cuda_stream(be)>>>(d1, d2, d3, x, y, total);
  AX_CUDA_TRY(cudaGetLastError());
  return AX_OK;
}

void axi_cuda_ops_softmax(ax_backend_i *i) {
  i->xent_fwd = cuda_xent_fwd;
  i->xent_bwd = cuda_xent_bwd;
  i->softmax_mask_fwd = cuda_softmax_mask_fwd;
  i->softmax_bwd = cuda_softmax_bwd;
  i->permute0213 = cuda_permute0213;
}
