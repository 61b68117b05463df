/* CPU BLAS-like, activation, loss and optimizer kernels against naive
 * references. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "harness.h"

static float *randv(uint64_t seed, size_t n) {
  ax_rng r;
  ax_rng_seed(&r, seed);
  float *v = malloc(n * sizeof *v);
  for (size_t i = 0; i < n; i++)
    v[i] = (float)ax_rng_normal(&r);
  return v;
}

/* Batched row-major GEMM in every transpose combination. */
static void gemm_vs_naive(void **state) {
  ax_backend *be = ax_backend_of(AX_CPU);
  const int m = 5, n = 7, k = 3, batch = 2;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      float *a = randv(1, (size_t)batch * m * k),
            *b = randv(2, (size_t)batch * k * n);
      float *c = randv(3, (size_t)batch * m * n),
            *ref = malloc(sizeof(float) * batch * m * n);
      memcpy(ref, c, sizeof(float) * batch * m * n);
      int lda = ta ? m : k, ldb = tb ? k : n;
      for (int z = 0; z < batch; z++)
        for (int i = 0; i < m; i++)
          for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
              float av =
                  ta ? a[z * m * k + p * lda + i] : a[z * m * k + i * lda + p];
              float bv =
                  tb ? b[z * k * n + j * ldb + p] : b[z * k * n + p * ldb + j];
              s += (double)av * bv;
            }
            ref[z * m * n + i * n + j] =
                (float)(2.0 * s + 0.5 * ref[z * m * n + i * n + j]);
          }
      AX_ASSERT_OK(AX_K(be, gemm, ta, tb, m, n, k, 2.0f, a, lda, (long)m * k, b,
                        ldb, (long)k * n, 0.5f, c, n, (long)m * n, batch));
      assert_true(ax_test_close_ratio(c, ref, (size_t)batch * m * n, 1e-5,
                                      1e-5) <= 1.0);
      free(a);
      free(b);
      free(c);
      free(ref);
    }
}

static void elementwise_and_bias(void **state) {
  ax_backend *be = ax_backend_of(AX_CPU);
  float *x = randv(4, 24), y[24], dy[24], dx[24];
  AX_ASSERT_OK(AX_K(be, relu_fwd, 24, x, y));
  for (int i = 0; i < 24; i++) {
    assert_true(y[i] == (x[i] > 0 ? x[i] : 0));
    dy[i] = 1.0f;
  }
  AX_ASSERT_OK(AX_K(be, relu_bwd, 24, y, dy, dx));
  for (int i = 0; i < 24; i++)
    assert_true(dx[i] == (x[i] > 0 ? 1.0f : 0.0f));
  AX_ASSERT_OK(AX_K(be, tanh_fwd, 24, x, y));
  AX_ASSERT_CLOSE(y[3], tanh(x[3]), 1e-6, 0);
  AX_ASSERT_OK(AX_K(be, gelu_fwd, 24, x, y));
  AX_ASSERT_CLOSE(y[5], 0.5 * x[5] * (1 + erf(x[5] / sqrt(2.0))), 1e-6, 1e-6);
  /* bias over (outer=2, c=3, inner=4) */
  float bias[3] = {1, 2, 3}, db[3] = {10, 10, 10};
  memcpy(y, x, sizeof y);
  AX_ASSERT_OK(AX_K(be, bias_add, y, bias, 2, 3, 4));
  AX_ASSERT_CLOSE(y[4 + 1], x[5] + 2, 1e-6, 0);
  AX_ASSERT_CLOSE(y[12 + 8], x[20] + 3, 1e-6, 0);
  AX_ASSERT_OK(AX_K(be, bias_grad, x, db, 2, 3, 4));
  double s1 = 10;
  for (int o = 0; o < 2; o++)
    for (int i = 0; i < 4; i++)
      s1 += x[o * 12 + 4 + i];
  AX_ASSERT_CLOSE(db[1], s1, 1e-5, 1e-6);
  AX_ASSERT_OK(AX_K(be, axpby, 24, 2.0f, x, 0.5f, y));
  double sum;
  AX_ASSERT_OK(AX_K(be, sum, 3, bias, &sum));
  AX_ASSERT_CLOSE(sum, 6.0, 0, 0);
  free(x);
}

/* GELU and its derivative over [-20, 20] (10007 values: vector lanes,
 * blocks and a remainder) against double precision, relative to the value
 * (the forward) and to the magnitude of the two terms Phi(x) and x phi(x)
 * (the derivative, which crosses zero): within 5e-7 plus 1.5e-7 x^2 (the
 * rounding of the exp's argument -x^2 / 2 in float) in both tails, and
 * 1e-36 where the values underflow; and the dropout mask equal, value for
 * value, to ax_dropout_uniform's. */
static void gelu_and_dropout_match_reference(void **state) {
  ax_backend *be = ax_backend_of(AX_CPU);
  const size_t n = 10007;
  float *x = malloc(n * 4), *y = malloc(n * 4), *dy = malloc(n * 4),
        *dx = malloc(n * 4);
  for (size_t i = 0; i < n; i++) {
    x[i] = -20.0f + 40.0f * (float)i / (float)(n - 1);
    dy[i] = 1.0f;
  }
  AX_ASSERT_OK(AX_K(be, gelu_fwd, n, x, y));
  AX_ASSERT_OK(AX_K(be, gelu_bwd, n, x, dy, dx));
  for (size_t i = 0; i < n; i++) {
    const double v = x[i], cdf = 0.5 * erfc(-v / sqrt(2.0));
    const double pdf = exp(-0.5 * v * v) / sqrt(2.0 * M_PI);
    const double rel = 5e-7 + 1.5e-7 * v * v; /* exp's argument's rounding */
    assert_true(fabs(y[i] - v * cdf) <= rel * fabs(v * cdf) + 1e-36);
    assert_true(fabs(dx[i] - (cdf + v * pdf)) <=
                rel * (cdf + fabs(v * pdf)) + 1e-36);
  }
  const float p = 0.3f;
  AX_ASSERT_OK(AX_K(be, dropout_fwd, n, x, y, p, 99, 555));
  for (size_t i = 0; i < n; i++)
    assert_true(y[i] == (ax_dropout_uniform(99, 555 + i) >= p
                             ? x[i] * (1.0f / (1.0f - p))
                             : 0.0f));
  free(x), free(y), free(dy), free(dx);
}

static void dropout_mask_is_reproducible(void **state) {
  ax_backend *be = ax_backend_of(AX_CPU);
  const size_t n = 10000;
  float *x = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
  for (size_t i = 0; i < n; i++)
    x[i] = 1.0f;
  AX_ASSERT_OK(AX_K(be, dropout_fwd, n, x, a, 0.25f, 77, 0));
  AX_ASSERT_OK(AX_K(be, dropout_fwd, n, x, b, 0.25f, 77, 0));
  assert_memory_equal(a, b, n * 4);
  size_t kept = 0;
  for (size_t i = 0; i < n; i++) {
    assert_true(a[i] == 0.0f || fabsf(a[i] - 1.0f / 0.75f) < 1e-6f);
    kept += a[i] != 0.0f;
  }
  assert_true(kept > 7250 && kept < 7750);
  AX_ASSERT_ERR(AX_K(be, dropout_fwd, n, x, a, 1.0f, 1, 0), AX_EINVAL);
  /* A part starting at counter 1234 draws the whole mask's elements. */
  AX_ASSERT_OK(AX_K(be, dropout_fwd, n - 1234, x, b, 0.25f, 77, 1234));
  assert_memory_equal(b, a + 1234, (n - 1234) * 4);
  free(x);
  free(a);
  free(b);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(gemm_vs_naive),
      cmocka_unit_test(elementwise_and_bias),
      cmocka_unit_test(dropout_mask_is_reproducible),
      cmocka_unit_test(gelu_and_dropout_match_reference),
  };
  return AX_TEST_MAIN(t);
}
