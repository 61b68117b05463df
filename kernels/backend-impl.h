/* The kernel backend vtable. One per device type; the CPU backend
 * (kernels/cpu/) is the reference every other backend is tested against.
 *
 * Conventions for every kernel below:
 *  - All pointers are device pointers of this backend; tensors are dense and
 *    row-major; shapes are given as element counts.
 *  - Return AX_OK or an error code (with ax_seterr detail); a kernel never
 *    aborts the process.
 *  - Outputs named d<param> for parameter gradients are ACCUMULATED (+=);
 *    every other output is overwritten.
 *  - Kernels are ordered on the backend's stream; results written to host
 *    pointers (marked _host) are complete when the call returns. */
#ifndef AX_BACKEND_IMPL_H
#define AX_BACKEND_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "axon/kernels/device.h"
#include "axon/kernels/error.h"
#include "axon/kernels/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 2-D convolution geometry (NCHW input, KCRS filter, no dilation/groups). */
typedef struct ax_conv_desc {
  int n, c, h, w;  /* input (N, C, H, W) */
  int k, r, s;     /* filter (K, C, R, S) */
  int stride, pad; /* same in both dimensions */
  int oh, ow;      /* output (N, K, OH, OW), filled by ax_conv_desc_init */
} ax_conv_desc;

/* 2-D pooling geometry (NCHW). */
typedef struct ax_pool_desc {
  int n, c, h, w;
  int kh, kw, stride, pad;
  int oh, ow;
} ax_pool_desc;

/* Causal attention geometry (attn_causal_fwd/bwd). Head h of row s of
 * sequence b starts at x[b * x_sb + s * x_ss + h * dh] for x in q, k, v,
 * o (element strides), so a packed (B, S, 3 * heads * dh) projection is
 * read in place: q = qkv, k = qkv + heads * dh, v = qkv + 2 * heads * dh,
 * q_ss = k_ss = v_ss = 3 * heads * dh. */
typedef struct ax_attn_desc {
  int b, heads, sq, sk, dh;
  long q_sb, q_ss, k_sb, k_ss, v_sb, v_ss, o_sb, o_ss;
  float scale;     /* usually 1 / sqrt(dh) */
  float dropout;   /* probability dropout p in [0, 1); 0: none */
  uint64_t seed;   /* dropout counter seed */
  int head0;       /* first head held (tensor parallelism), else 0 */
  int heads_total; /* heads of the whole layer, else heads */
} ax_attn_desc;

typedef struct ax_backend_i {
  const char *name;

  /* ---- memory and copies ---- */
  void *(*alloc)(ax_backend *be, size_t bytes); /* NULL on out-of-memory */
  void (*free)(ax_backend *be, void *ptr);
  int (*copy_from_host)(ax_backend *be, void *dst, const void *src,
                        size_t bytes);
  int (*copy_to_host)(ax_backend *be, void *dst, const void *src, size_t bytes);
  int (*copy)(ax_backend *be, void *dst, const void *src, size_t bytes);
  int (*synchronize)(ax_backend *be);

  /* ---- BLAS-like ---- */
  /* Strided batched row-major GEMM:
   *   C_i = alpha * op(A_i) * op(B_i) + beta * C_i,  i < batch,
   * op(A) is (m, k), op(B) is (k, n), C is (m, n); X_i = X + i * stride_x. */
  int (*gemm)(ax_backend *be, int trans_a, int trans_b, int m, int n, int k,
              float alpha, const float *a, int lda, long stride_a,
              const float *b, int ldb, long stride_b, float beta, float *c,
              int ldc, long stride_c, int batch);
  int (*fill)(ax_backend *be, float *x, size_t n, float value);
  /* y = a * x + b * y */
  int (*axpby)(ax_backend *be, size_t n, float a, const float *x, float b,
               float *y);
  /* *out_host = sum of x (accumulated in double) */
  int (*sum)(ax_backend *be, size_t n, const float *x, double *out_host);
  /* y (outer, c, inner) += bias (c) */
  int (*bias_add)(ax_backend *be, float *y, const float *bias, int outer, int c,
                  int inner);
  /* dbias (c) += sum over outer and inner of dy (outer, c, inner) */
  int (*bias_grad)(ax_backend *be, const float *dy, float *dbias, int outer,
                   int c, int inner);

  /* ---- activations ---- */
  /* y may alias x (in-place) */
  int (*relu_fwd)(ax_backend *be, size_t n, const float *x, float *y);
  /* dx = dy * (y > 0); dx may alias dy */
  int (*relu_bwd)(ax_backend *be, size_t n, const float *y, const float *dy,
                  float *dx);
  int (*tanh_fwd)(ax_backend *be, size_t n, const float *x, float *y);
  /* dx = dy * (1 - y^2); dx may alias dy */
  int (*tanh_bwd)(ax_backend *be, size_t n, const float *y, const float *dy,
                  float *dx);
  /* exact GELU: x * Phi(x) */
  int (*gelu_fwd)(ax_backend *be, size_t n, const float *x, float *y);
  int (*gelu_bwd)(ax_backend *be, size_t n, const float *x, const float *dy,
                  float *dx);
  /* Inverted dropout with a counter-based mask: element i is kept iff
   * ax_dropout_uniform(seed, first + i) >= p, and kept values are scaled
   * by 1/(1-p). The same (seed, counter) gives the same mask on every
   * backend; `first` lets a shard of a tensor (tensor parallelism) draw
   * the whole tensor's mask for its elements. */
  int (*dropout_fwd)(ax_backend *be, size_t n, const float *x, float *y,
                     float p, uint64_t seed, uint64_t first);
  int (*dropout_bwd)(ax_backend *be, size_t n, const float *dy, float *dx,
                     float p, uint64_t seed, uint64_t first);

  /* ---- convolution ---- */
  int (*conv2d_fwd)(ax_backend *be, const ax_conv_desc *d, const float *x,
                    const float *w, float *y);
  int (*conv2d_bwd_data)(ax_backend *be, const ax_conv_desc *d, const float *dy,
                         const float *w, float *dx);
  int (*conv2d_bwd_filter)(ax_backend *be, const ax_conv_desc *d,
                           const float *x, const float *dy, float *dw);

  /* ---- batch norm over (N, C, HW), statistics per channel ---- */
  /* Training mode: normalises with batch statistics, writes the batch mean
   * and 1/sqrt(var + eps) to save_mean/save_invstd (C). When run_mean and
   * run_var are not NULL they are updated with
   *   run = (1 - momentum) * run + momentum * batch_stat
   * (unbiased variance for run_var, as PyTorch does). */
  int (*bn_fwd_train)(ax_backend *be, int n, int c, int hw, const float *x,
                      const float *gamma, const float *beta, float *y,
                      float *save_mean, float *save_invstd, float *run_mean,
                      float *run_var, float momentum, float eps);
  int (*bn_fwd_eval)(ax_backend *be, int n, int c, int hw, const float *x,
                     const float *gamma, const float *beta,
                     const float *run_mean, const float *run_var, float eps,
                     float *y);
  int (*bn_bwd)(ax_backend *be, int n, int c, int hw, const float *x,
                const float *dy, const float *gamma, const float *save_mean,
                const float *save_invstd, float *dx, float *dgamma,
                float *dbeta);

  /* ---- pooling ---- */
  /* argmax (N, C, OH, OW) holds the input plane offset of each maximum */
  int (*maxpool_fwd)(ax_backend *be, const ax_pool_desc *d, const float *x,
                     float *y, int32_t *argmax);
  int (*maxpool_bwd)(ax_backend *be, const ax_pool_desc *d, const float *dy,
                     const int32_t *argmax, float *dx);
  /* average over the window including padding (count_include_pad) */
  int (*avgpool_fwd)(ax_backend *be, const ax_pool_desc *d, const float *x,
                     float *y);
  int (*avgpool_bwd)(ax_backend *be, const ax_pool_desc *d, const float *dy,
                     float *dx);

  /* ---- layer norm over the last dimension: x (rows, d) ---- */
  int (*layernorm_fwd)(ax_backend *be, int rows, int d, const float *x,
                       const float *gamma, const float *beta, float eps,
                       float *y, float *mean, float *rstd);
  int (*layernorm_bwd)(ax_backend *be, int rows, int d, const float *x,
                       const float *dy, const float *gamma, const float *mean,
                       const float *rstd, float *dx, float *dgamma,
                       float *dbeta);

  /* ---- softmax cross-entropy, logits (rows, classes) ---- */
  /* probs = softmax(logits); rows whose label equals ignore_index are
   * skipped. Writes the summed loss of the kept rows and their count to
   * host, and (when correct_host is not NULL) how many kept rows are
   * predicted right: the argmax of the row's written probs equals its
   * label, the argmax being where the scan `best = 0; for j in 1..classes-1:
   * if p[j] > p[best] then best = j` ends (ties go to the lowest index; a
   * NaN never wins, and a NaN at index 0 is never beaten). A label outside
   * [0, classes) that is not ignore_index gives AX_EINVAL. probs may be
   * logits (the softmax then replaces the logits in place). */
  int (*xent_fwd)(ax_backend *be, int rows, int classes, const float *logits,
                  const int32_t *labels, int ignore_index, float *probs,
                  double *loss_sum_host, int64_t *count_host,
                  int64_t *correct_host);
  /* dlogits = scale * (probs - onehot(label)); 0 for ignored rows;
   * dlogits may be probs */
  int (*xent_bwd)(ax_backend *be, int rows, int classes, const float *probs,
                  const int32_t *labels, int ignore_index, float scale,
                  float *dlogits);

  /* ---- attention ---- */
  /* scores (b, heads, sq, sk); mask (b, sk) with 1 = attend, 0 = padding,
   * or NULL. probs = softmax over the last dim of scale * scores, with
   * masked keys at probability 0. */
  int (*softmax_mask_fwd)(ax_backend *be, int b, int heads, int sq, int sk,
                          const float *scores, const float *mask, float scale,
                          float *probs);
  /* dscores = scale * probs * (dprobs - sum_j(dprobs * probs)) per row */
  int (*softmax_bwd)(ax_backend *be, int rows, int cols, const float *probs,
                     const float *dprobs, float scale, float *dscores);
  /* y[i0][i2][i1][i3] = x[i0][i1][i2][i3], x of shape (d0, d1, d2, d3) */
  int (*permute0213)(ax_backend *be, int d0, int d1, int d2, int d3,
                     const float *x, float *y);

  /* ---- embedding ---- */
  /* y (n_idx, dim) = table[idx]; an index outside [0, rows) is AX_EINVAL */
  int (*embedding_fwd)(ax_backend *be, int n_idx, int dim, int rows,
                       const int32_t *idx, const float *table, float *y);
  int (*embedding_bwd)(ax_backend *be, int n_idx, int dim, const int32_t *idx,
                       const float *dy, float *dtable);

  /* ---- optimizers over a flat buffer ---- */
  /* PyTorch semantics: g' = g + wd * w; buf = first ? g' : momentum * buf +
   * (1 - dampening) * g'; step = nesterov ? g' + momentum * buf : buf (or g'
   * when momentum == 0); w -= lr * step. mom may be NULL iff momentum == 0. */
  int (*sgd_step)(ax_backend *be, size_t n, float *w, const float *g,
                  float *mom, float lr, float momentum, float dampening,
                  float wd, int nesterov, int first);
  /* PyTorch AdamW; step counts from 1. */
  int (*adamw_step)(ax_backend *be, size_t n, float *w, const float *g,
                    float *m, float *v, float lr, float beta1, float beta2,
                    float eps, float wd, int step);

  /* ---- fused kernels (optional) ---- */
  /* A backend may leave these NULL; the layers then run the unfused kernels
   * named in each contract, which give the same values. */
  /* y = relu(bn_fwd_train(x)): bn_fwd_train followed by relu_fwd, with the
   * same saved statistics and running-statistics update. */
  int (*bn_relu_fwd_train)(ax_backend *be, int n, int c, int hw, const float *x,
                           const float *gamma, const float *beta, float *y,
                           float *save_mean, float *save_invstd,
                           float *run_mean, float *run_var, float momentum,
                           float eps);
  /* The backward of bn_relu_fwd_train: bn_bwd on dy * (y > 0), where y is
   * that forward's output. dx must not alias dy, x or y. */
  int (*bn_relu_bwd)(ax_backend *be, int n, int c, int hw, const float *x,
                     const float *y, const float *dy, const float *gamma,
                     const float *save_mean, const float *save_invstd,
                     float *dx, float *dgamma, float *dbeta);
  /* y = relu(x + y): axpby(1, x, 1, y) followed by relu_fwd in place. */
  int (*add_relu_fwd)(ax_backend *be, size_t n, const float *x, float *y);

  /* ---- causal attention, fused (tiled, online softmax) ---- */
  /* Every query row attends to the keys at or before its own position and
   * never materialises the (sq, sk) score matrix. Queries are the LAST sq
   * positions of sk: query i sits at position sk - sq + i (sq == sk in
   * training; sq < sk when a key/value cache holds the earlier positions).
   * Forward: o = softmax(scale * q k^T, causal) v per (b, head), with
   * dropout p on the probabilities (counter ax_dropout_uniform(seed,
   * ((b * heads_total + head0 + h) * sk + (sk - sq + i)) * sk + j), so a
   * tensor-parallel member holding heads [head0, head0 + heads) draws the
   * whole model's mask), and lse (b, heads, sq) the log-sum-exp of each
   * scaled score row (before dropout), which the backward reads. lse may
   * be NULL in inference. The backward overwrites dq, dk, dv (same
   * layouts as q, k, v; they may lie in one packed buffer) from do_ (o's
   * layout) and the forward's o and lse. */
  int (*attn_causal_fwd)(ax_backend *be, const ax_attn_desc *d, const float *q,
                         const float *k, const float *v, float *o, float *lse);
  int (*attn_causal_bwd)(ax_backend *be, const ax_attn_desc *d, const float *q,
                         const float *k, const float *v, const float *o,
                         const float *do_, const float *lse, float *dq,
                         float *dk, float *dv);

  /* ---- bf16 (uint16_t bit patterns, kernels/bf16.h) ---- */
  /* y = bf16(x), round to nearest even (NaN stays NaN). */
  int (*cast_f32_bf16)(ax_backend *be, size_t n, const float *x, uint16_t *y);
  /* y = f32(x), exact. */
  int (*cast_bf16_f32)(ax_backend *be, size_t n, const uint16_t *x, float *y);
  /* gemm with bf16 inputs and f32 products summed in f32: the same
   * contract and layouts as gemm, C f32. Each of A and B comes in its own
   * element type (a_dtype, b_dtype; leading dimensions and strides count
   * its elements): AX_BF16, used as it is, or AX_F32, rounded to bf16 as
   * cast_f32_bf16 rounds (nearest even) as the kernel reads it, so that
   * the result is bit for bit that of casting the operand first and
   * passing the copy. Any other type: AX_EDTYPE. Operands are never
   * written; where the rounding happens (while packing, into backend
   * scratch) is the backend's business. */
  int (*gemm_bf16)(ax_backend *be, int trans_a, int trans_b, int m, int n,
                   int k, float alpha, const void *a, ax_dtype a_dtype, int lda,
                   long stride_a, const void *b, ax_dtype b_dtype, int ldb,
                   long stride_b, float beta, float *c, int ldc, long stride_c,
                   int batch);
} ax_backend_i;

struct ax_backend {
  ax_backend_i iface;
  ax_device device;
  void *ctx; /* backend-private state (CUDA handles, streams, pools) */
};

/* Calls kernel `fn` of backend `be`: AX_K(be, relu_fwd, n, x, y). A backend
 * may leave a kernel NULL; calling it then gives AX_EUNSUPPORTED. */
#define AX_K(be, fn, ...)                                                      \
  ((be)->iface.fn ? (be)->iface.fn((be), ##__VA_ARGS__)                        \
                  : ax_seterr(AX_EUNSUPPORTED, "%s backend has no kernel %s",  \
                              (be)->iface.name, #fn))

/* Fills oh/ow from the other fields; AX_ESHAPE if the output would be empty. */
int ax_conv_desc_init(ax_conv_desc *d);
int ax_pool_desc_init(ax_pool_desc *d);
/* AX_OK when d is a geometry attn_causal_fwd/bwd take (b >= 0, heads and
 * dh > 0, 0 <= sq <= sk, sk > 0, heads [head0, head0 + heads) within
 * heads_total, dropout in [0, 1)), else AX_EINVAL naming fn. */
int ax_attn_desc_check(const ax_attn_desc *d, const char *fn);

/* Counter-based uniform in [0, 1) shared by every backend's dropout. */
static inline uint64_t ax_mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
#if defined(__CUDACC__)
__host__ __device__
#endif
    static inline float
    ax_dropout_uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed ^ (i * 0xd1b54a32d192ed03ull);
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (float)(z >> 40) * (1.0f / 16777216.0f);
}

/* Backend constructors, called by ax_backend_get. */
int axi_cpu_backend_init(ax_backend *be);
/* The CUDA backend, loaded on demand (kernels/cuda_loader.c): these
 * forward to libaxon_cuda.so's axi_cudalib_* entry points (kernels/cuda/),
 * or fail with AX_ENODEV and the loader's message (device count 0) when it
 * cannot be loaded. */
int axi_cuda_backend_init(ax_backend *be, int ordinal);
int axi_cuda_device_count(void);
/* Why the CUDA backend cannot be loaded; NULL once it is (loads it). */
const char *axi_cuda_load_error(void);
/* A symbol of the loaded CUDA backend (tests: its statistics), or NULL. */
void *axi_cuda_sym(const char *name);
/* The entry points libaxon_cuda.so exports (kernels/cuda/). */
int axi_cudalib_backend_init(ax_backend *be, int ordinal);
int axi_cudalib_device_count(void);
int axi_cudalib_bench_cublas(int ordinal, int n, int iters, int tf32,
                             double *seconds);
/* Reference timing for `axon-bench gemm` (kernels/cuda/cuda_bench.cu): on
 * device `ordinal`, fills three n x n f32 matrices with random values, runs
 * 3 untimed cublasSgemm C = A B (beta 0) on its own cuBLAS handle and
 * stream, then times `iters` more with CUDA events and writes the mean
 * seconds per product to *seconds. tf32 != 0 selects
 * CUBLAS_TF32_TENSOR_OP_MATH, else CUBLAS_DEFAULT_MATH (plain FP32). Frees
 * everything it made before returning. AX_OK; AX_EINVAL (n or iters < 1),
 * AX_ENODEV (no such device, or no CUDA backend to load), AX_ENOMEM,
 * AX_ECUDA or AX_ECUBLAS with the library's message. */
int axi_cuda_bench_cublas(int ordinal, int n, int iters, int tf32,
                          double *seconds);

#ifdef __cplusplus
}
#endif
#endif
