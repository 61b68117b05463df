/* Linked instead of the CUDA backend when axon is built without nvcc. */
#include "kernels/backend-impl.h"
#include "kernels/error.h"

int axi_cuda_backend_init(ax_backend *be, int ordinal) {
  (void)be;
  return ax_seterr(AX_ENODEV, "cuda:%d: axon was built without CUDA", ordinal);
}

int axi_cuda_device_count(void) { return 0; }

int axi_cuda_bench_cublas(int ordinal, int n, int iters, int tf32,
                          double *seconds) {
  (void)n;
  (void)iters;
  (void)tf32;
  (void)seconds;
  return ax_seterr(AX_ENODEV, "cuda:%d: axon was built without CUDA", ordinal);
}
