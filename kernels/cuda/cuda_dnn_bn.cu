/* CUDA backend, dnn family: batch normalisation over (N, C, HW) through
 * cuDNN (CUDNN_BATCHNORM_SPATIAL), matching the contract in
 * kernels/backend-impl.h and the CPU reference (kernels/cpu/cpu_norm.c):
 *  - x is described as (N, C, HW, 1), the parameters as (1, C, 1, 1);
 *  - cuDNN's exponentialAverageFactor is our momentum
 *    (run = (1 - f) * run + f * batch_stat), and cuDNN updates the running
 *    variance with the unbiased batch variance, as the CPU does;
 *  - cuDNN's resultSaveInvVariance is 1 / sqrt(biased var + eps), our
 *    save_invstd; the backward passes save_mean / save_invstd back, so
 *    cuDNN does not recompute them (its epsilon argument is then unused;
 *    our bn_bwd has no eps, a nominal one is passed);
 *  - run_mean / run_var NULL: no update (cuDNN accepts both NULL);
 *  - dgamma / dbeta ACCUMULATE (betaParamDiff = 1); dx is overwritten, and
 *    may be NULL (cuDNN then writes into the workspace);
 *  - fewer than two values per channel in training is AX_ESHAPE.
 * The fused bn_relu kernels are cuDNN plus one small kernel of our own: a
 * ReLU in place on y after the forward, and dy * (y > 0) into the workspace
 * before the backward. */
#include "axon/kernels/cuda/cuda_dnn.cuh"

__global__ static void relu_inplace_kernel(float *y, size_t n) {
  AXI_GRID_STRIDE(i, n) {
    float v = y[i];
    y[i] = v > 0.0f ? v : 0.0f;
  }
}

/* g = y > 0 ? dy : 0, as the CPU's relu_bwd. */
__global__ static void relu_mask_kernel(const float *y, const float *dy,
                                        float *g, size_t n) {
  AXI_GRID_STRIDE(i, n) {
    float v = dy[i];
    g[i] = y[i] > 0.0f ? v : 0.0f;
  }
}

static int bn_check(const char *what, int n, int c, int hw, int training) {
  if (n <= 0 || c <= 0 || hw <= 0)
    return ax_seterr(AX_EINVAL, "%s: bad shape n=%d c=%d hw=%d", what, n, c,
                     hw);
  if (training && (double)n * hw < 2)
    return ax_seterr(AX_ESHAPE,
                     "%s: training needs more than one value per channel, "
                     "got n=%d hw=%d",
                     what, n, hw);
  return AX_OK;
}

/* Sets the state's two batch-norm descriptors for (n, c, hw). Lock held. */
static int bn_desc(axi_dnn_state *s, int n, int c, int hw) {
  AX_CUDNN_TRY(cudnnSetTensor4dDescriptor(s->bn_x, CUDNN_TENSOR_NCHW,
                                          CUDNN_DATA_FLOAT, n, c, hw, 1));
  AX_CUDNN_TRY(
      cudnnDeriveBNTensorDescriptor(s->bn_p, s->bn_x, CUDNN_BATCHNORM_SPATIAL));
  return AX_OK;
}

static int bn_train_locked(ax_backend *be, axi_dnn_state *s, int n, int c,
                           int hw, const float *x, const float *gamma,
                           const float *beta, int relu, float *y,
                           float *save_mean, float *save_invstd,
                           float *run_mean, float *run_var, float momentum,
                           float eps) {
  AX_TRY(bn_desc(s, n, c, hw));
  const int upd = run_mean && run_var;
  const float one = 1.0f, zero = 0.0f;
  AX_CUDNN_TRY(cudnnBatchNormalizationForwardTraining(
      s->handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, s->bn_x, x, s->bn_x, y,
      s->bn_p, gamma, beta, upd ? (double)momentum : 0.0, upd ? run_mean : NULL,
      upd ? run_var : NULL, (double)eps, save_mean, save_invstd));
  if (relu) {
    size_t nx = (size_t)n * c * hw;
    relu_inplace_kernel<<<axi_cuda_grid(nx), AXI_CUDA_THREADS, 0,
                          axi_cuda_stream(be)>>>(y, nx);
    AX_CUDA_TRY(cudaGetLastError());
  }
  return AX_OK;
}

static int bn_train(ax_backend *be, const char *what, int n, int c, int hw,
                    const float *x, const float *gamma, const float *beta,
                    int relu, float *y, float *save_mean, float *save_invstd,
                    float *run_mean, float *run_var, float momentum,
                    float eps) {
  AX_TRY(bn_check(what, n, c, hw, 1));
  if (!(eps >= CUDNN_BN_MIN_EPSILON))
    return ax_seterr(AX_EINVAL, "%s: eps %g below cuDNN's minimum %g", what,
                     (double)eps, (double)CUDNN_BN_MIN_EPSILON);
  axi_dnn_state *s;
  AX_TRY(axi_dnn_lock(be, &s));
  int rc = bn_train_locked(be, s, n, c, hw, x, gamma, beta, relu, y, save_mean,
                           save_invstd, run_mean, run_var, momentum, eps);
  axi_dnn_unlock(s);
  return rc;
}

static int cuda_bn_fwd_train(ax_backend *be, int n, int c, int hw,
                             const float *x, const float *gamma,
                             const float *beta, float *y, float *save_mean,
                             float *save_invstd, float *run_mean,
                             float *run_var, float momentum, float eps) {
  return bn_train(be, "bn_fwd_train", n, c, hw, x, gamma, beta, 0, y, save_mean,
                  save_invstd, run_mean, run_var, momentum, eps);
}

static int cuda_bn_relu_fwd_train(ax_backend *be, int n, int c, int hw,
                                  const float *x, const float *gamma,
                                  const float *beta, float *y, float *save_mean,
                                  float *save_invstd, float *run_mean,
                                  float *run_var, float momentum, float eps) {
  return bn_train(be, "bn_relu_fwd_train", n, c, hw, x, gamma, beta, 1, y,
                  save_mean, save_invstd, run_mean, run_var, momentum, eps);
}

static int bn_eval_locked(axi_dnn_state *s, int n, int c, int hw,
                          const float *x, const float *gamma, const float *beta,
                          const float *run_mean, const float *run_var,
                          float eps, float *y) {
  AX_TRY(bn_desc(s, n, c, hw));
  const float one = 1.0f, zero = 0.0f;
  AX_CUDNN_TRY(cudnnBatchNormalizationForwardInference(
      s->handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, s->bn_x, x, s->bn_x, y,
      s->bn_p, gamma, beta, run_mean, run_var, (double)eps));
  return AX_OK;
}

static int cuda_bn_fwd_eval(ax_backend *be, int n, int c, int hw,
                            const float *x, const float *gamma,
                            const float *beta, const float *run_mean,
                            const float *run_var, float eps, float *y) {
  AX_TRY(bn_check("bn_fwd_eval", n, c, hw, 0));
  if (!(eps >= CUDNN_BN_MIN_EPSILON))
    return ax_seterr(AX_EINVAL, "bn_fwd_eval: eps %g below cuDNN's minimum %g",
                     (double)eps, (double)CUDNN_BN_MIN_EPSILON);
  axi_dnn_state *s;
  AX_TRY(axi_dnn_lock(be, &s));
  int rc =
      bn_eval_locked(s, n, c, hw, x, gamma, beta, run_mean, run_var, eps, y);
  axi_dnn_unlock(s);
  return rc;
}

/* Bytes of one (N, C, HW) float buffer inside the workspace, rounded up so
 * that a second one starts aligned. */
static size_t bn_slab(size_t nx) {
  return (nx * sizeof(float) + 255) & ~(size_t)255;
}

/* With y (the fused ReLU's output), dy is first masked by y > 0. */
static int bn_bwd_locked(ax_backend *be, axi_dnn_state *s, int n, int c, int hw,
                         const float *x, const float *y, const float *dy,
                         const float *gamma, const float *save_mean,
                         const float *save_invstd, float *dx, float *dgamma,
                         float *dbeta) {
  const size_t nx = (size_t)n * c * hw, slab = bn_slab(nx);
  size_t need = (y ? slab : 0) + (dx ? 0 : slab);
  char *ws = NULL;
  if (need)
    AX_TRY(axi_dnn_workspace(be, s, need, (void **)&ws));
  const float *g = dy;
  if (y) {
    float *m = (float *)ws;
    relu_mask_kernel<<<axi_cuda_grid(nx), AXI_CUDA_THREADS, 0,
                       axi_cuda_stream(be)>>>(y, dy, m, nx);
    AX_CUDA_TRY(cudaGetLastError());
    g = m;
  }
  if (!dx)
    dx = (float *)(ws + (y ? slab : 0));
  AX_TRY(bn_desc(s, n, c, hw));
  const float one = 1.0f, zero = 0.0f;
  /* Used by cuDNN only when no saved statistics are given; ours always are. */
  const double nominal_eps =
      CUDNN_BN_MIN_EPSILON > 1e-5 ? CUDNN_BN_MIN_EPSILON : 1e-5;
  AX_CUDNN_TRY(cudnnBatchNormalizationBackward(
      s->handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &one, s->bn_x, x,
      s->bn_x, g, s->bn_x, dx, s->bn_p, gamma, dgamma, dbeta, nominal_eps,
      save_mean, save_invstd));
  return AX_OK;
}

static int bn_bwd(ax_backend *be, const char *what, int n, int c, int hw,
                  const float *x, const float *y, const float *dy,
                  const float *gamma, const float *save_mean,
                  const float *save_invstd, float *dx, float *dgamma,
                  float *dbeta) {
  AX_TRY(bn_check(what, n, c, hw, 0));
  axi_dnn_state *s;
  AX_TRY(axi_dnn_lock(be, &s));
  int rc = bn_bwd_locked(be, s, n, c, hw, x, y, dy, gamma, save_mean,
                         save_invstd, dx, dgamma, dbeta);
  axi_dnn_unlock(s);
  return rc;
}

static int cuda_bn_bwd(ax_backend *be, int n, int c, int hw, const float *x,
                       const float *dy, const float *gamma,
                       const float *save_mean, const float *save_invstd,
                       float *dx, float *dgamma, float *dbeta) {
  return bn_bwd(be, "bn_bwd", n, c, hw, x, NULL, dy, gamma, save_mean,
                save_invstd, dx, dgamma, dbeta);
}

static int cuda_bn_relu_bwd(ax_backend *be, int n, int c, int hw,
                            const float *x, const float *y, const float *dy,
                            const float *gamma, const float *save_mean,
                            const float *save_invstd, float *dx, float *dgamma,
                            float *dbeta) {
  return bn_bwd(be, "bn_relu_bwd", n, c, hw, x, y, dy, gamma, save_mean,
                save_invstd, dx, dgamma, dbeta);
}

void axi_cuda_dnn_ops_bn(ax_backend_i *i) {
  i->bn_fwd_train = cuda_bn_fwd_train;
  i->bn_fwd_eval = cuda_bn_fwd_eval;
  i->bn_bwd = cuda_bn_bwd;
  i->bn_relu_fwd_train = cuda_bn_relu_fwd_train;
  i->bn_relu_bwd = cuda_bn_relu_bwd;
}
