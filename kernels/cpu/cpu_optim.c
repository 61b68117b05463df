/* CPU optimizer updates over a flat parameter buffer (PyTorch semantics). */
#include <math.h>

#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/error.h"

int axi_cpu_sgd_step(ax_backend *be, size_t n, float *w, const float *g,
                     float *mom, float lr, float momentum, float dampening,
                     float wd, int nesterov, int first) {
  (void)be;
  if (momentum != 0.0f && !mom)
    return ax_seterr(AX_EINVAL, "sgd: momentum without a buffer");
#pragma omp parallel for num_threads(ax_cpu_threads()) if (n > 65536)
  for (size_t i = 0; i < n; i++) {
    float d = g[i] + wd * w[i];
    if (momentum != 0.0f) {
      float b = first ? d : momentum * mom[i] + (1.0f - dampening) * d;
      mom[i] = b;
      d = nesterov ? d + momentum * b : b;
    }
    w[i] -= lr * d;
  }
  return AX_OK;
}

int axi_cpu_adamw_step(ax_backend *be, size_t n, float *w, const float *g,
                       float *m, float *v, float lr, float beta1, float beta2,
                       float eps, float wd, int step) {
  (void)be;
  if (step < 1)
    return ax_seterr(AX_EINVAL, "adamw: step %d < 1", step);
  float bc1 = 1.0f - powf(beta1, (float)step);
  float bc2 = 1.0f - powf(beta2, (float)step);
  float bc2_sqrt = sqrtf(bc2);
#pragma omp parallel for num_threads(ax_cpu_threads()) if (n > 65536)
  for (size_t i = 0; i < n; i++) {
    w[i] *= 1.0f - lr * wd;
    m[i] = beta1 * m[i] + (1.0f - beta1) * g[i];
    v[i] = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
    float denom = sqrtf(v[i]) / bc2_sqrt + eps;
    w[i] -= (lr / bc1) * m[i] / denom;
  }
  return AX_OK;
}
