/* CUDA backend, optimizer family: fused SGD and AdamW steps over a flat
 * buffer, one thread per element (grid-stride), PyTorch semantics as stated
 * in kernels/backend-impl.h.
 *
 * Parity: each update is the CPU reference's (kernels/cpu/cpu_optim.c)
 * expression by expression, with explicitly rounded operations (__fmul_rn,
 * __fadd_rn, __fdiv_rn, __fsqrt_rn: no FMA contraction) in the same order,
 * and the per-step scalars (1 - dampening, the bias corrections via powf,
 * 1 - lr * wd, lr / bc1) computed on the host as the CPU computes them. The
 * results therefore equal the CPU's as long as the CPU build does not
 * contract to FMA either. Argument checks are the CPU's, made before
 * anything is launched. */
#include <math.h>

#include "axon/kernels/cuda/cuda_common.cuh"

#define GRID_STRIDE(i, n)                                                      \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);      \
       i += (size_t)gridDim.x * blockDim.x)

/* d = g + wd w; with momentum: buf = first ? d : momentum buf +
 * (1 - dampening) d, d = nesterov ? d + momentum buf : buf; w -= lr d. */
__global__ static void sgd_kernel(size_t n, float *w, const float *g,
                                  float *mom, float lr, float momentum,
                                  float one_minus_damp, float wd, int use_mom,
                                  int nesterov, int first) {
  GRID_STRIDE(i, n) {
    float wi = w[i];
    float d = __fadd_rn(g[i], __fmul_rn(wd, wi));
    if (use_mom) {
      float b = first ? d
                      : __fadd_rn(__fmul_rn(momentum, mom[i]),
                                  __fmul_rn(one_minus_damp, d));
      mom[i] = b;
      d = nesterov ? __fadd_rn(d, __fmul_rn(momentum, b)) : b;
    }
    w[i] = __fsub_rn(wi, __fmul_rn(lr, d));
  }
}

static int cuda_sgd_step(ax_backend *be, size_t n, float *w, const float *g,
                         float *mom, float lr, float momentum, float dampening,
                         float wd, int nesterov, int first) {
  if (momentum != 0.0f && !mom)
    return ax_seterr(AX_EINVAL, "sgd: momentum without a buffer");
  if (n == 0)
    return AX_OK;
  AX_CUDA_ENTER(be);
  sgd_kernel<<<axi_cuda_grid(n), AXI_CUDA_THREADS, 0, axi_cuda_stream(be)>>>(
      n, w, g, mom, lr, momentum, 1.0f - dampening, wd, momentum != 0.0f,
      nesterov != 0, first != 0);
  AX_CUDA_TRY(cudaGetLastError());
  return AX_OK;
}

/* w *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g g;
 * w -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps). */
__global__ static void
adamw_kernel(size_t n, float *w, const float *g, float *m, float *v,
             float decay, float beta1, float one_minus_b1, float beta2,
             float one_minus_b2, float bc2_sqrt, float step_size, float eps) {
  GRID_STRIDE(i, n) {
    float gi = g[i];
    float wi = __fmul_rn(w[i], decay);
    float mi = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(one_minus_b1, gi));
    float vi = __fadd_rn(__fmul_rn(beta2, v[i]),
                         __fmul_rn(__fmul_rn(one_minus_b2, gi), gi));
    m[i] = mi;
    v[i] = vi;
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
    w[i] = __fsub_rn(wi, __fdiv_rn(__fmul_rn(step_size, mi), denom));
  }
}

static int cuda_adamw_step(ax_backend *be, size_t n, float *w, const float *g,
                           float *m, float *v, float lr, float beta1,
                           float beta2, float eps, float wd, int step) {
  if (step < 1)
    return ax_seterr(AX_EINVAL, "adamw: step %d < 1", step);
  if (n == 0)
    return AX_OK;
  AX_CUDA_ENTER(be);
  float bc1 = 1.0f - powf(beta1, (float)step);
  float bc2 = 1.0f - powf(beta2, (float)step);
  float bc2_sqrt = sqrtf(bc2);
  adamw_kernel<<<axi_cuda_grid(n), AXI_CUDA_THREADS, 0, axi_cuda_stream(be)>>>(
      n, w, g, m, v, 1.0f - lr * wd, beta1, 1.0f - beta1, beta2, 1.0f - beta2,
      bc2_sqrt, lr / bc1, eps);
  AX_CUDA_TRY(cudaGetLastError());
  return AX_OK;
}

void axi_cuda_ops_optim(ax_backend_i *i) {
  i->sgd_step = cuda_sgd_step;
  i->adamw_step = cuda_adamw_step;
}
