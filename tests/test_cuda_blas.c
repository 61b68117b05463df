/* CUDA backend against the CPU reference: gemm (cuBLAS, FP32 and TF32),
 * axpby, sum, bias_add, bias_grad, the caching allocator and host copies.
 * Every test runs the same op with the same inputs on the CPU backend and
 * on cuda:0 and compares; each comparison states its tolerance and why.
 * Skips (exit 77) without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "cuda_testutil.h"
#include "harness.h"

/* Internal to the CUDA backend (kernels/cuda/cuda_alloc.cu), which libaxon
 * loads on demand: found through the loader (NULL without it). */
typedef void (*alloc_stats_fn)(ax_backend *be, size_t *in_use, size_t *cached,
                               long *mallocs);
#define axi_cuda_alloc_stats                                                   \
  ((alloc_stats_fn)axi_cuda_sym("axi_cuda_alloc_stats"))

/* ---- gemm ---------------------------------------------------------------- */

typedef struct gemm_case {
  int ta, tb, m, n, k, batch, pad; /* pad: extra leading-dimension columns */
  float alpha, beta;
} gemm_case;

/* Runs the case on both backends (C starts random, padding included) and
 * compares all of C, padding included, within |d| <= atol + rtol |ref|. */
static void check_gemm(gemm_case g, uint64_t seed, double atol, double rtol) {
  int lda = (g.ta ? g.m : g.k) + g.pad, rows_a = g.ta ? g.k : g.m;
  int ldb = (g.tb ? g.k : g.n) + g.pad, rows_b = g.tb ? g.n : g.k;
  int ldc = g.n + g.pad;
  long sa = (long)rows_a * lda, sb = (long)rows_b * ldb, sc = (long)g.m * ldc;
  size_t na = (size_t)sa * g.batch, nb = (size_t)sb * g.batch,
         nc = (size_t)sc * g.batch;
  float *a = ct_randn(seed, na, 1), *b = ct_randn(seed + 1, nb, 1);
  float *c = ct_randn(seed + 2, nc, 1), *got = malloc(nc * sizeof *got);
  float *da = ct_up(a, na * 4), *db = ct_up(b, nb * 4), *dc = ct_up(c, nc * 4);
  AX_ASSERT_OK(AX_K(ct_cpu(), gemm, g.ta, g.tb, g.m, g.n, g.k, g.alpha, a, lda,
                    sa, b, ldb, sb, g.beta, c, ldc, sc, g.batch));
  AX_ASSERT_OK(AX_K(ct_gpu(), gemm, g.ta, g.tb, g.m, g.n, g.k, g.alpha, da, lda,
                    sa, db, ldb, sb, g.beta, dc, ldc, sc, g.batch));
  ct_down(got, dc, nc * 4);
  char what[128];
  snprintf(what, sizeof what, "gemm ta=%d tb=%d %dx%dx%d batch %d pad %d", g.ta,
           g.tb, g.m, g.n, g.k, g.batch, g.pad);
  ct_expect_close(what, got, c, nc, atol, rtol);
  ct_free(da);
  ct_free(db);
  ct_free(dc);
  free(a);
  free(b);
  free(c);
  free(got);
}

/* FP32 tolerance: both sides accumulate in fp32 in different orders; the
 * difference of two such sums of k products of N(0,1) values grows about
 * like k * 2^-24 (partial sums ~ sqrt(k), sqrt(k) roundings each). 2e-6 k
 * is ~30x that; rtol 1e-4 is the contract's "within 1e-4 relative". */
static double fp32_atol(int k, float alpha) {
  return 1e-5 + 2e-6 * k * fabs(alpha);
}

/* TF32 rounds the inputs to 10 mantissa bits: each product is off by
 * ~1e-3 relative, and k random-sign errors add up to ~1.2e-3 sqrt(k); the
 * tolerance 1e-2 sqrt(k) is ~8x that (k = 512: 0.23 on values ~ 22). */
static double tf32_atol(int k, float alpha) {
  return 1e-2 * sqrt((double)k) * fabs(alpha);
}

static void gemm_transposes(void **state) {
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      gemm_case small = {ta, tb, 5, 7, 3, 1, 0, 1.0f, 0.0f};
      check_gemm(small, 10, fp32_atol(3, 1.0f), 1e-4);
      /* odd sizes, padded leading dimensions, alpha and beta */
      gemm_case odd = {ta, tb, 37, 53, 19, 1, 3, 0.7f, -1.3f};
      check_gemm(odd, 20, fp32_atol(19, 0.7f) + 1e-6 * 1.3, 1e-4);
    }
}

static void gemm_batched_alpha_beta(void **state) {
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      gemm_case g = {ta, tb, 16, 24, 8, 4, 0, 2.0f, 0.5f};
      check_gemm(g, 30, fp32_atol(8, 2.0f), 1e-4);
      gemm_case odd = {ta, tb, 37, 53, 19, 3, 2, -0.5f, 1.0f};
      check_gemm(odd, 40, fp32_atol(19, 0.5f), 1e-4);
    }
}

static void gemm_512(void **state) {
  gemm_case nn = {0, 0, 512, 512, 512, 1, 0, 1.0f, 0.0f};
  check_gemm(nn, 50, fp32_atol(512, 1.0f), 1e-4);
  gemm_case tt = {1, 1, 512, 512, 512, 2, 0, 1.0f, 1.0f};
  check_gemm(tt, 60, fp32_atol(512, 1.0f), 1e-4);
}

/* AXON_TF32=1 switches cuBLAS to TF32 tensor-op math on the next call;
 * unsetting it switches back to FP32 (checked with the FP32 tolerance). */
static void gemm_tf32(void **state) {
  setenv("AXON_TF32", "1", 1);
  gemm_case big = {0, 0, 512, 512, 512, 1, 0, 1.0f, 0.0f};
  check_gemm(big, 70, tf32_atol(512, 1.0f), 1e-2);
  gemm_case odd = {1, 0, 37, 53, 19, 2, 1, 1.0f, 0.5f};
  check_gemm(odd, 80, tf32_atol(19, 1.0f) + 1e-2 * 0.5, 1e-2);
  unsetenv("AXON_TF32");
  check_gemm(big, 70, fp32_atol(512, 1.0f), 1e-4);
}

/* Empty sizes are no-ops, negative ones AX_EINVAL; a leading dimension
 * cuBLAS rejects comes back as AX_ECUBLAS with cuBLAS's message, and the
 * backend keeps working. */
static void gemm_errors(void **state) {
  float h[12] = {0};
  float *d = ct_up(h, 12 * 4);
  AX_ASSERT_OK(AX_K(ct_gpu(), gemm, 0, 0, 0, 3, 2, 1.0f, d, 2, 0, d, 3, 0, 0.0f,
                    d, 3, 0, 1));
  AX_ASSERT_ERR(AX_K(ct_gpu(), gemm, 0, 0, -1, 3, 2, 1.0f, d, 2, 0, d, 3, 0,
                     0.0f, d, 3, 0, 1),
                AX_EINVAL);
  /* B is (2, 3) row-major: ldb = 2 < n = 3 */
  AX_ASSERT_ERR(AX_K(ct_gpu(), gemm, 0, 0, 2, 3, 2, 1.0f, d, 2, 0, d, 2, 0,
                     0.0f, d, 3, 0, 1),
                AX_ECUBLAS);
  assert_true(strlen(ax_errmsg()) > 0);
  ct_free(d);
  gemm_case g = {0, 1, 9, 11, 13, 1, 0, 1.0f, 0.0f};
  check_gemm(g, 90, fp32_atol(13, 1.0f), 1e-4);
}

/* ---- vector ops ---------------------------------------------------------- */

/* axpby is one rounded multiply/add per term in the CPU's order: expected
 * bit-identical. 1 ulp (rtol 1.2e-7) plus atol 1e-6 (half an ulp of each
 * term when a x + b y cancels) is allowed only in case the CPU build
 * contracts a x + b y into an FMA. b = 0 must not read y (y holds NaN
 * there). */
static void axpby_modes(void **state) {
  const size_t n = 100003;
  float *x = ct_randn(100, n, 1), *y0 = ct_randn(101, n, 1);
  float *got = malloc(n * 4), *ref = malloc(n * 4);
  const float ab[4][2] = {
      {1.5f, -0.25f}, {1.0f, 1.0f}, {2.0f, 0.0f}, {-1.0f, 0.5f}};
  for (int t = 0; t < 4; t++) {
    memcpy(ref, y0, n * 4);
    if (ab[t][1] == 0.0f)
      for (size_t i = 0; i < n; i += 7)
        ref[i] = NAN;
    float *dx = ct_up(x, n * 4), *dy = ct_up(ref, n * 4);
    AX_ASSERT_OK(AX_K(ct_cpu(), axpby, n, ab[t][0], x, ab[t][1], ref));
    AX_ASSERT_OK(AX_K(ct_gpu(), axpby, n, ab[t][0], dx, ab[t][1], dy));
    ct_down(got, dy, n * 4);
    ct_expect_close("axpby", got, ref, n, 1e-6, 1.2e-7);
    ct_free(dx);
    ct_free(dy);
  }
  AX_ASSERT_OK(AX_K(ct_gpu(), axpby, 0, 1.0f, NULL, 1.0f, NULL));
  free(x);
  free(y0);
  free(got);
  free(ref);
}

/* The CPU sums sequentially in double, the GPU in double in a tree: the
 * difference is a few double roundings of partial sums, far below
 * 1e-12 * sum |x|. Two GPU calls must give the same bits. */
static void sum_deterministic(void **state) {
  const size_t sizes[] = {1, 255, 256, 257, 100003, ((size_t)1 << 22) + 7};
  for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
    size_t n = sizes[t];
    float *x = ct_randn(200 + t, n, 3);
    float *dx = ct_up(x, n * 4);
    double ref, s1, s2, l1 = 0;
    for (size_t i = 0; i < n; i++)
      l1 += fabs(x[i]);
    AX_ASSERT_OK(AX_K(ct_cpu(), sum, n, x, &ref));
    AX_ASSERT_OK(AX_K(ct_gpu(), sum, n, dx, &s1));
    AX_ASSERT_OK(AX_K(ct_gpu(), sum, n, dx, &s2));
    AX_ASSERT_CLOSE(s1, ref, 1e-12 * l1, 0);
    assert_memory_equal(&s1, &s2, sizeof s1);
    ct_free(dx);
    free(x);
  }
  double z = 1;
  AX_ASSERT_OK(AX_K(ct_gpu(), sum, 0, NULL, &z));
  assert_true(z == 0.0);
}

static const int bias_shapes[][3] = {
    {3, 5, 7},       {1000, 37, 1}, {2, 64, 1024}, {4096, 768, 1},
    {128, 16, 1024}, {1, 1, 1},     {5, 3000, 1},  {7, 1, 300}};

/* bias_add is one float add per element: bit-identical. */
static void bias_add_parity(void **state) {
  for (size_t t = 0; t < sizeof bias_shapes / sizeof bias_shapes[0]; t++) {
    int o = bias_shapes[t][0], c = bias_shapes[t][1], in = bias_shapes[t][2];
    size_t n = (size_t)o * c * in;
    float *y = ct_randn(300 + t, n, 1), *b = ct_randn(400 + t, c, 1);
    float *got = malloc(n * 4), *dy = ct_up(y, n * 4), *db = ct_up(b, c * 4);
    AX_ASSERT_OK(AX_K(ct_cpu(), bias_add, y, b, o, c, in));
    AX_ASSERT_OK(AX_K(ct_gpu(), bias_add, dy, db, o, c, in));
    ct_down(got, dy, n * 4);
    assert_memory_equal(got, y, n * 4);
    ct_free(dy);
    ct_free(db);
    free(y);
    free(b);
    free(got);
  }
}

/* Both sides sum each channel in double and add (float)sum to dbias; the
 * doubles differ only in their last bits, so (float)sum agrees to 1 ulp,
 * at most 1.2e-7 |sum| with |sum| < 8 sqrt(outer * inner) for N(0,1) dy:
 * atol 1e-6 sqrt(outer * inner), plus 1 ulp of the result (rtol 2.4e-7).
 * dbias accumulates (starts random). Two GPU runs give the same bits. */
static void bias_grad_parity(void **state) {
  for (size_t t = 0; t < sizeof bias_shapes / sizeof bias_shapes[0]; t++) {
    int o = bias_shapes[t][0], c = bias_shapes[t][1], in = bias_shapes[t][2];
    size_t n = (size_t)o * c * in;
    float *dy = ct_randn(500 + t, n, 1), *b0 = ct_randn(600 + t, c, 1);
    float *ref = malloc(c * 4), *got = malloc(c * 4), *got2 = malloc(c * 4);
    memcpy(ref, b0, c * 4);
    float *ddy = ct_up(dy, n * 4), *db = ct_up(b0, c * 4),
          *db2 = ct_up(b0, c * 4);
    AX_ASSERT_OK(AX_K(ct_cpu(), bias_grad, dy, ref, o, c, in));
    AX_ASSERT_OK(AX_K(ct_gpu(), bias_grad, ddy, db, o, c, in));
    AX_ASSERT_OK(AX_K(ct_gpu(), bias_grad, ddy, db2, o, c, in));
    ct_down(got, db, c * 4);
    ct_down(got2, db2, c * 4);
    ct_expect_close("bias_grad", got, ref, c, 1e-6 * sqrt((double)o * in),
                    2.4e-7);
    assert_memory_equal(got, got2, c * 4);
    ct_free(ddy);
    ct_free(db);
    ct_free(db2);
    free(dy);
    free(b0);
    free(ref);
    free(got);
    free(got2);
  }
}

/* ---- memory ------------------------------------------------------------- */

/* A freed block is handed out again for a request of the same size class
 * without a new cudaMalloc; in_use/cached move by the class size. */
static void alloc_reuse(void **state) {
  ax_backend *g = ct_gpu();
  assert_non_null(axi_cuda_alloc_stats);
  const size_t sizes[] = {1000, (size_t)37 << 20 | 5, 0};
  const size_t classes[] = {1024, (size_t)38 << 20, 512};
  for (int t = 0; t < 3; t++) {
    size_t in0, c0, in1, c1, in2, c2;
    long m0, m1, m2;
    void *p = g->iface.alloc(g, sizes[t]);
    assert_non_null(p);
    axi_cuda_alloc_stats(g, &in0, &c0, &m0);
    g->iface.free(g, p);
    axi_cuda_alloc_stats(g, &in1, &c1, &m1);
    assert_true(in1 == in0 - classes[t] && c1 == c0 + classes[t] && m1 == m0);
    void *q = g->iface.alloc(g, sizes[t]);
    axi_cuda_alloc_stats(g, &in2, &c2, &m2);
    assert_true(q == p);
    assert_true(m2 == m0 && in2 == in0 && c2 == c0);
    g->iface.free(g, q);
  }
  g->iface.free(g, NULL);
}

/* 1 TiB cannot be had: NULL (after releasing the cache and retrying), no
 * crash, the cache is empty, and kernels and copies still work (the failed
 * cudaMalloc must not surface as a later launch's error). */
static void alloc_oom(void **state) {
  ax_backend *g = ct_gpu();
  assert_non_null(axi_cuda_alloc_stats);
  void *keep = g->iface.alloc(g, 4096);
  g->iface.free(g, keep); /* something cached */
  void *p = g->iface.alloc(g, (size_t)1 << 40);
  assert_null(p);
  size_t in_use, cached;
  long mallocs;
  axi_cuda_alloc_stats(g, &in_use, &cached, &mallocs);
  assert_true(cached == 0);
  float h[1000], back[1000];
  for (int i = 0; i < 1000; i++)
    h[i] = (float)i;
  float *d = ct_up(h, 1000 * 4);
  AX_ASSERT_OK(AX_K(g, relu_fwd, 1000, d, d));
  AX_ASSERT_OK(AX_K(g, axpby, 1000, 2.0f, d, 0.0f, d));
  ct_down(back, d, 1000 * 4);
  for (int i = 0; i < 1000; i++)
    assert_true(back[i] == 2.0f * i);
  AX_ASSERT_OK(AX_K(g, synchronize));
  ct_free(d);
  gemm_case gc = {0, 0, 8, 8, 8, 1, 0, 1.0f, 0.0f};
  check_gemm(gc, 95, fp32_atol(8, 1.0f), 1e-4);
}

/* Round trips through every copy path: small (direct), just under and at
 * the 256 KiB staging threshold, and several 4 MiB chunks with an odd tail;
 * plus a device-to-device copy. Bytes must come back unchanged. */
static void copies_roundtrip(void **state) {
  ax_backend *g = ct_gpu();
  const size_t sizes[] = {4,
                          100,
                          (256 << 10) - 4,
                          256 << 10,
                          ((size_t)9 << 20) + 12,
                          ((size_t)8 << 20)};
  for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
    size_t n = sizes[t] / 4;
    float *h = ct_randn(700 + t, n, 1), *back = malloc(n * 4);
    float *d = ct_up(h, n * 4), *d2 = g->iface.alloc(g, n * 4);
    assert_non_null(d2);
    AX_ASSERT_OK(AX_K(g, copy, d2, d, n * 4));
    memset(back, 0, n * 4);
    ct_down(back, d2, n * 4);
    assert_memory_equal(back, h, n * 4);
    memset(back, 0, n * 4);
    ct_down(back, d, n * 4);
    assert_memory_equal(back, h, n * 4);
    ct_free(d);
    ct_free(d2);
    free(h);
    free(back);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(gemm_transposes),
      cmocka_unit_test(gemm_batched_alpha_beta),
      cmocka_unit_test(gemm_512),
      cmocka_unit_test(gemm_tf32),
      cmocka_unit_test(gemm_errors),
      cmocka_unit_test(axpby_modes),
      cmocka_unit_test(sum_deterministic),
      cmocka_unit_test(bias_add_parity),
      cmocka_unit_test(bias_grad_parity),
      cmocka_unit_test(alloc_reuse),
      cmocka_unit_test(alloc_oom),
      cmocka_unit_test(copies_roundtrip),
  };
  return AX_CUDA_TEST_MAIN(tests);
}
