/* CUDA backend, elementwise family: relu, tanh, exact-erf gelu (forward and
 * backward), counter-based dropout, add_relu, and the f32 <-> bf16 casts.
 *
 * Contracts (kernels/backend-impl.h): outputs may alias inputs (no
 * __restrict__ here), n == 0 launches nothing. Every kernel is a
 * grid-stride loop over size_t indices.
 *
 * Parity with the CPU reference (kernels/cpu/cpu_act.c): each formula is
 * written in the CPU's order with explicitly rounded operations (__fmul_rn,
 * __fadd_rn: no FMA contraction), so relu, add_relu, tanh_bwd and dropout
 * give the CPU's bits. tanhf, erff and expf are CUDA's (within 2 ulp), so
 * tanh_fwd and gelu differ from the CPU in the last bits. Dropout draws
 * ax_dropout_uniform(seed, i), the function the CPU uses, and its scale
 * 1 / (1 - p) is computed on the host as on the CPU: masks and values are
 * identical. The casts run kernels/bf16.h's conversions (host and device
 * functions under nvcc): the CPU's bits, NaN included. */
#include "axon/kernels/bf16.h"
#include "axon/kernels/cuda/cuda_common.cuh"

#define GRID_STRIDE(i, n)                                                      \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);      \
       i += (size_t)gridDim.x * blockDim.x)

/* Launches kernel over n elements on be's stream and checks the launch. */
#define LAUNCH(be, n, kernel, ...)                                             \
  do {                                                                         \
    if ((n) == 0)                                                              \
      return AX_OK;                                                            \
    AX_CUDA_ENTER(be);                                                         \
    kernel<<<axi_cuda_grid(n), AXI_CUDA_THREADS, 0, axi_cuda_stream(be)>>>(    \
        __VA_ARGS__);                                                          \
    AX_CUDA_TRY(cudaGetLastError());                                           \
    return AX_OK;                                                              \
  } while (0)

#define SQRT1_2 0.70710678118654752f      /* 1 / sqrt(2) */
#define INV_SQRT_2PI 0.39894228040143268f /* 1 / sqrt(2 pi) */

__global__ static void relu_fwd_kernel(size_t n, const float *x, float *y) {
  GRID_STRIDE(i, n) {
    float v = x[i];
    y[i] = v > 0.0f ? v : 0.0f;
  }
}

__global__ static void relu_bwd_kernel(size_t n, const float *y,
                                       const float *dy, float *dx) {
  GRID_STRIDE(i, n) {
    float g = dy[i];
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
}

__global__ static void add_relu_kernel(size_t n, const float *x, float *y) {
  GRID_STRIDE(i, n) {
    float v = __fadd_rn(x[i], y[i]);
    y[i] = v > 0.0f ? v : 0.0f;
  }
}

__global__ static void tanh_fwd_kernel(size_t n, const float *x, float *y) {
  GRID_STRIDE(i, n) { y[i] = tanhf(x[i]); }
}

/* dx = dy * (1 - y * y) */
__global__ static void tanh_bwd_kernel(size_t n, const float *y,
                                       const float *dy, float *dx) {
  GRID_STRIDE(i, n) {
    float v = y[i];
    dx[i] = __fmul_rn(dy[i], __fsub_rn(1.0f, __fmul_rn(v, v)));
  }
}

/* y = 0.5 x (1 + erf(x / sqrt 2)) */
__global__ static void gelu_fwd_kernel(size_t n, const float *x, float *y) {
  GRID_STRIDE(i, n) {
    float v = x[i];
    float e = erff(__fmul_rn(v, SQRT1_2));
    y[i] = __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, e));
  }
}

/* dx = dy * (Phi(x) + x phi(x)) */
__global__ static void gelu_bwd_kernel(size_t n, const float *x,
                                       const float *dy, float *dx) {
  GRID_STRIDE(i, n) {
    float v = x[i];
    float cdf = __fmul_rn(0.5f, __fadd_rn(1.0f, erff(__fmul_rn(v, SQRT1_2))));
    float pdf =
        __fmul_rn(INV_SQRT_2PI, expf(__fmul_rn(__fmul_rn(-0.5f, v), v)));
    dx[i] = __fmul_rn(dy[i], __fadd_rn(cdf, __fmul_rn(v, pdf)));
  }
}

/* y = u(seed, i) >= p ? x * scale : 0 */
__global__ static void dropout_kernel(size_t n, const float *x, float *y,
                                      float p, float scale, uint64_t seed,
                                      uint64_t first) {
  GRID_STRIDE(i, n) {
    y[i] = ax_dropout_uniform(seed, first + i) >= p ? __fmul_rn(x[i], scale)
                                                    : 0.0f;
  }
}

__global__ static void cast_f32_bf16_kernel(size_t n, const float *x,
                                            uint16_t *y) {
  GRID_STRIDE(i, n) { y[i] = ax_bf16_from_f32(x[i]); }
}

__global__ static void cast_bf16_f32_kernel(size_t n, const uint16_t *x,
                                            float *y) {
  GRID_STRIDE(i, n) { y[i] = ax_bf16_to_f32(x[i]); }
}

static int cuda_relu_fwd(ax_backend *be, size_t n, const float *x, float *y) {
  LAUNCH(be, n, relu_fwd_kernel, n, x, y);
}

static int cuda_relu_bwd(ax_backend *be, size_t n, const float *y,
                         const float *dy, float *dx) {
  LAUNCH(be, n, relu_bwd_kernel, n, y, dy, dx);
}

static int cuda_add_relu_fwd(ax_backend *be, size_t n, const float *x,
                             float *y) {
  LAUNCH(be, n, add_relu_kernel, n, x, y);
}

static int cuda_tanh_fwd(ax_backend *be, size_t n, const float *x, float *y) {
  LAUNCH(be, n, tanh_fwd_kernel, n, x, y);
}

static int cuda_tanh_bwd(ax_backend *be, size_t n, const float *y,
                         const float *dy, float *dx) {
  LAUNCH(be, n, tanh_bwd_kernel, n, y, dy, dx);
}

static int cuda_gelu_fwd(ax_backend *be, size_t n, const float *x, float *y) {
  LAUNCH(be, n, gelu_fwd_kernel, n, x, y);
}

static int cuda_gelu_bwd(ax_backend *be, size_t n, const float *x,
                         const float *dy, float *dx) {
  LAUNCH(be, n, gelu_bwd_kernel, n, x, dy, dx);
}

static int cuda_dropout_fwd(ax_backend *be, size_t n, const float *x, float *y,
                            float p, uint64_t seed, uint64_t first) {
  if (p < 0.0f || p >= 1.0f) /* the CPU reference's test */
    return ax_seterr(AX_EINVAL, "dropout: p = %g outside [0, 1)", p);
  float scale = 1.0f / (1.0f - p);
  LAUNCH(be, n, dropout_kernel, n, x, y, p, scale, seed, first);
}

/* The mask of the forward with the same (p, seed), applied to dy. */
static int cuda_dropout_bwd(ax_backend *be, size_t n, const float *dy,
                            float *dx, float p, uint64_t seed, uint64_t first) {
  return cuda_dropout_fwd(be, n, dy, dx, p, seed, first);
}

static int cuda_cast_f32_bf16(ax_backend *be, size_t n, const float *x,
                              uint16_t *y) {
  LAUNCH(be, n, cast_f32_bf16_kernel, n, x, y);
}

static int cuda_cast_bf16_f32(ax_backend *be, size_t n, const uint16_t *x,
                              float *y) {
  LAUNCH(be, n, cast_bf16_f32_kernel, n, x, y);
}

void axi_cuda_ops_elem(ax_backend_i *i) {
  i->relu_fwd = cuda_relu_fwd;
  i->relu_bwd = cuda_relu_bwd;
  i->tanh_fwd = cuda_tanh_fwd;
  i->tanh_bwd = cuda_tanh_bwd;
  i->gelu_fwd = cuda_gelu_fwd;
  i->gelu_bwd = cuda_gelu_bwd;
  i->dropout_fwd = cuda_dropout_fwd;
  i->dropout_bwd = cuda_dropout_bwd;
  i->add_relu_fwd = cuda_add_relu_fwd;
  i->cast_f32_bf16 = cuda_cast_f32_bf16;
  i->cast_bf16_f32 = cuda_cast_bf16_f32;
}
