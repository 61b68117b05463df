/* Helpers of the CUDA parity tests; contracts in cuda_testutil.h. */
#include "cuda_testutil.h"

#include <stdlib.h>
#include <string.h>

#include "axon/kernels/rng.h"
#include "harness.h"

ax_backend *ct_cpu(void) {
  ax_backend *be = NULL;
  AX_ASSERT_OK(ax_backend_get(AX_CPU, &be));
  return be;
}

ax_backend *ct_gpu(void) {
  ax_backend *be = NULL;
  AX_ASSERT_OK(ax_backend_get((ax_device){AX_DEV_CUDA, 0}, &be));
  return be;
}

void *ct_up(const void *host, size_t bytes) {
  ax_backend *g = ct_gpu();
  void *d = g->iface.alloc(g, bytes ? bytes : 4);
  assert_non_null(d);
  if (host && bytes)
    AX_ASSERT_OK(AX_K(g, copy_from_host, d, host, bytes));
  return d;
}

void ct_down(void *host, const void *dev, size_t bytes) {
  ax_backend *g = ct_gpu();
  AX_ASSERT_OK(AX_K(g, synchronize));
  AX_ASSERT_OK(AX_K(g, copy_to_host, host, dev, bytes));
}

void ct_free(void *dev) {
  ax_backend *g = ct_gpu();
  g->iface.free(g, dev);
}

float *ct_randn(uint64_t seed, size_t n, float scale) {
  ax_rng r;
  ax_rng_seed(&r, seed);
  float *v = malloc((n + 1) * sizeof *v);
  assert_non_null(v);
  for (size_t i = 0; i < n; i++)
    v[i] = scale * (float)ax_rng_normal(&r);
  return v;
}

static void fail_unless_close(const char *what, double ratio, double atol,
                              double rtol) {
  if (!(ratio <= 1.0))
    fail_msg("%s: worst element at %.3g x the tolerance (atol %g, rtol %g)",
             what, ratio, atol, rtol);
}

void ct_expect_close(const char *what, const float *got, const float *ref,
                     size_t n, double atol, double rtol) {
  fail_unless_close(what, ax_test_close_ratio(got, ref, n, atol, rtol), atol,
                    rtol);
}

void ct_check(const char *what, const void *dev, const float *ref, size_t n,
              double atol, double rtol) {
  float *got = malloc((n + 1) * sizeof *got);
  assert_non_null(got);
  ct_down(got, dev, n * sizeof *got);
  double r = ax_test_close_ratio(got, ref, n, atol, rtol);
  free(got); /* before failing: fail_msg does not return */
  fail_unless_close(what, r, atol, rtol);
}

void ct_check_exact(const char *what, const void *dev, const void *ref,
                    size_t bytes) {
  char *got = malloc(bytes + 4);
  assert_non_null(got);
  ct_down(got, dev, bytes);
  int same = memcmp(got, ref, bytes) == 0;
  free(got);
  if (!same)
    fail_msg("%s: GPU differs from the CPU", what);
}
