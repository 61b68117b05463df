/* CPU batch normalisation over (N, C, HW) with per-channel statistics.
 *
 * Channels are independent, so OpenMP splits them over threads. Sums are
 * taken per contiguous HW run in float (vector-lane partial sums) and
 * accumulated across runs in double; the variance is a second pass around the
 * mean, which avoids the cancellation of E[x^2] - E[x]^2. */
#include <math.h>
#include <stddef.h>

#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/error.h"

/* The run reductions below are OpenMP simd reductions: the compiler keeps
 * one partial sum per vector lane and combines them in a fixed order, so the
 * result is the same from run to run. */

/* Sum of x[0..n). */
static float run_sum(const float *restrict x, int n) {
  float a = 0;
#pragma omp simd reduction(+ : a)
  for (int i = 0; i < n; i++)
    a += x[i];
  return a;
}

/* Sum of (x[i] - m)^2 over [0, n). */
static float run_sqdev(const float *restrict x, int n, float m) {
  float a = 0;
#pragma omp simd reduction(+ : a)
  for (int i = 0; i < n; i++) {
    float d = x[i] - m;
    a += d * d;
  }
  return a;
}

/* y = x * scale + shift over every run of channel ch, then max(y, 0) when
 * relu is set. */
static void channel_affine(int n, int c, int hw, int ch, const float *x,
                           float scale, float shift, int relu, float *y) {
  for (int b = 0; b < n; b++) {
    size_t o = ((size_t)b * c + ch) * hw;
    const float *restrict xs = x + o;
    float *restrict ys = y + o;
    if (relu) {
#pragma omp simd
      for (int i = 0; i < hw; i++) {
        float v = xs[i] * scale + shift;
        ys[i] = v > 0.0f ? v : 0.0f;
      }
    } else {
#pragma omp simd
      for (int i = 0; i < hw; i++)
        ys[i] = xs[i] * scale + shift;
    }
  }
}

static int bn_check(const char *what, int n, int c, int hw) {
  if (n <= 0 || c <= 0 || hw <= 0)
    return ax_seterr(AX_EINVAL, "%s: bad shape n=%d c=%d hw=%d", what, n, c,
                     hw);
  return AX_OK;
}

/* Training-mode forward, followed by a ReLU when relu is set. */
static int bn_train(int n, int c, int hw, const float *x, const float *gamma,
                    const float *beta, int relu, float *y, float *save_mean,
                    float *save_invstd, float *run_mean, float *run_var,
                    float momentum, float eps) {
  AX_TRY(bn_check("bn_fwd_train", n, c, hw));
  const double cnt = (double)n * hw;
  if (cnt < 2)
    return ax_seterr(AX_ESHAPE,
                     "bn_fwd_train: training needs more than one value per "
                     "channel, got n=%d hw=%d",
                     n, hw);
  const int nt = ax_cpu_threads();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (int ch = 0; ch < c; ch++) {
    /* Each run's mean and squared deviations are taken while the run is in
     * L1, then the runs are combined exactly (Chan et al.):
     *   M2 = sum M2_b + hw * sum (mean_b - mean)^2. */
    double sm = 0, sm2 = 0, m2 = 0, shift = 0;
    for (int b = 0; b < n; b++) {
      const float *xs = x + ((size_t)b * c + ch) * hw;
      float mb = run_sum(xs, hw) / (float)hw;
      m2 += run_sqdev(xs, hw, mb);
      if (b == 0)
        shift = mb; /* shifted sums keep the combination well conditioned */
      sm += mb - shift;
      sm2 += ((double)mb - shift) * ((double)mb - shift);
    }
    double mean_d = shift + sm / n;
    double v = m2 + (double)hw * (sm2 - sm * sm / n);
    if (v < 0)
      v = 0;
    float mean = (float)mean_d;
    double var = v / cnt;
    float invstd = (float)(1.0 / sqrt(var + eps));
    float scale = gamma[ch] * invstd;
    channel_affine(n, c, hw, ch, x, scale, beta[ch] - mean * scale, relu, y);
    save_mean[ch] = mean;
    save_invstd[ch] = invstd;
    if (run_mean && run_var) {
      run_mean[ch] = (1.0f - momentum) * run_mean[ch] + momentum * mean;
      run_var[ch] =
          (1.0f - momentum) * run_var[ch] + momentum * (float)(v / (cnt - 1.0));
    }
  }
  return AX_OK;
}

int axi_cpu_bn_fwd_train(ax_backend *be, int n, int c, int hw, const float *x,
                         const float *gamma, const float *beta, float *y,
                         float *save_mean, float *save_invstd, float *run_mean,
                         float *run_var, float momentum, float eps) {
  (void)be;
  return bn_train(n, c, hw, x, gamma, beta, 0, y, save_mean, save_invstd,
                  run_mean, run_var, momentum, eps);
}

int axi_cpu_bn_relu_fwd_train(ax_backend *be, int n, int c, int hw,
                              const float *x, const float *gamma,
                              const float *beta, float *y, float *save_mean,
                              float *save_invstd, float *run_mean,
                              float *run_var, float momentum, float eps) {
  (void)be;
  return bn_train(n, c, hw, x, gamma, beta, 1, y, save_mean, save_invstd,
                  run_mean, run_var, momentum, eps);
}

int axi_cpu_bn_fwd_eval(ax_backend *be, int n, int c, int hw, const float *x,
                        const float *gamma, const float *beta,
                        const float *run_mean, const float *run_var, float eps,
                        float *y) {
  (void)be;
  AX_TRY(bn_check("bn_fwd_eval", n, c, hw));
  const int nt = ax_cpu_threads();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (int ch = 0; ch < c; ch++) {
    float invstd = (float)(1.0 / sqrt((double)run_var[ch] + eps));
    float scale = gamma[ch] * invstd;
    channel_affine(n, c, hw, ch, x, scale, beta[ch] - run_mean[ch] * scale, 0,
                   y);
  }
  return AX_OK;
}

/* Sums of dy and dy * (x - m) over one run, with dy masked by y > 0 when y
 * is not NULL. */
static void run_bwd_sums(const float *restrict dy, const float *restrict x,
                         const float *restrict y, int n, float m, float *sdy,
                         float *sdxc) {
  float a = 0, b = 0;
  if (y) {
#pragma omp simd reduction(+ : a, b)
    for (int i = 0; i < n; i++) {
      /* dy is loaded unconditionally, so that the select vectorises. */
      float g = dy[i];
      g = y[i] > 0.0f ? g : 0.0f;
      a += g;
      b += g * (x[i] - m);
    }
  } else {
#pragma omp simd reduction(+ : a, b)
    for (int i = 0; i < n; i++) {
      a += dy[i];
      b += dy[i] * (x[i] - m);
    }
  }
  *sdy = a;
  *sdxc = b;
}

/* With xhat = (x - mean) * invstd and per-channel sums
 *   sdy = sum dy, sdx = sum dy * xhat,
 * the gradients are dbeta = sdy, dgamma = sdx and
 *   dx = gamma * invstd / cnt * (cnt * dy - sdy - xhat * sdx).
 * With y (the fused ReLU's output), dy is first masked by y > 0. */
static int bn_backward(int n, int c, int hw, const float *x, const float *y,
                       const float *dy, const float *gamma,
                       const float *save_mean, const float *save_invstd,
                       float *dx, float *dgamma, float *dbeta) {
  AX_TRY(bn_check("bn_bwd", n, c, hw));
  const double cnt = (double)n * hw;
  const int nt = ax_cpu_threads();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (int ch = 0; ch < c; ch++) {
    const float mean = save_mean[ch], invstd = save_invstd[ch];
    double sdy = 0, sdxc = 0;
    for (int b = 0; b < n; b++) {
      size_t o = ((size_t)b * c + ch) * hw;
      float s1, s2;
      run_bwd_sums(dy + o, x + o, y ? y + o : NULL, hw, mean, &s1, &s2);
      sdy += s1;
      sdxc += s2;
    }
    double sdx = sdxc * invstd;
    dbeta[ch] += (float)sdy;
    dgamma[ch] += (float)sdx;
    if (!dx)
      continue;
    /* dx = k * dy - k * (sdy + xhat * sdx) / cnt, with k = gamma * invstd,
     * written as dx = a * dy + b * x + e. */
    const float k = gamma[ch] * invstd;
    const float a = k;
    const float bx = (float)(-k * sdx * invstd / cnt);
    const float e = (float)(-k * sdy / cnt - (double)bx * mean);
    for (int b = 0; b < n; b++) {
      size_t o = ((size_t)b * c + ch) * hw;
      const float *restrict xs = x + o, *restrict dys = dy + o;
      float *dxs = dx + o;
      if (y) {
        const float *restrict ys = y + o;
#pragma omp simd
        for (int i = 0; i < hw; i++) {
          float g = dys[i];
          g = ys[i] > 0.0f ? g : 0.0f;
          dxs[i] = a * g + bx * xs[i] + e;
        }
      } else {
#pragma omp simd
        for (int i = 0; i < hw; i++)
          dxs[i] = a * dys[i] + bx * xs[i] + e;
      }
    }
  }
  return AX_OK;
}

int axi_cpu_bn_bwd(ax_backend *be, int n, int c, int hw, const float *x,
                   const float *dy, const float *gamma, const float *save_mean,
                   const float *save_invstd, float *dx, float *dgamma,
                   float *dbeta) {
  (void)be;
  return bn_backward(n, c, hw, x, NULL, dy, gamma, save_mean, save_invstd, dx,
                     dgamma, dbeta);
}

int axi_cpu_bn_relu_bwd(ax_backend *be, int n, int c, int hw, const float *x,
                        const float *y, const float *dy, const float *gamma,
                        const float *save_mean, const float *save_invstd,
                        float *dx, float *dgamma, float *dbeta) {
  (void)be;
  return bn_backward(n, c, hw, x, y, dy, gamma, save_mean, save_invstd, dx,
                     dgamma, dbeta);
}
