/* The CUDA dnn kernels (convolution, batch norm, pooling) against the CPU
 * backend, called through both vtables on the same inputs. Skipped (exit
 * 77) without a GPU.
 *
 * Tolerances, per op (|gpu - cpu| <= atol + rtol * |cpu|):
 *  - convolutions 1e-3 / 1e-3: cuDNN and the CPU sum up to 8 * 32 * 32
 *    products of N(0, 1) values in different orders, and cuDNN may choose
 *    Winograd or FFT algorithms, whose transforms round differently; plain
 *    FP32 math (no TF32 unless AXON_TF32=1) keeps the differences near
 *    1e-5 relative, the bound leaves room without hiding a wrong index
 *    (which gives O(1) errors). With AXON_TF32=1: 5e-2 / 1e-2 (inputs
 *    rounded to 10-bit mantissas).
 *  - batch norm: statistics 1e-5 (both reduce in float/double, then one
 *    rounding to float), y and dx 1e-4 (values O(1) computed from those
 *    statistics), dgamma / dbeta 1e-3 abs + 1e-4 rel (sums of up to 8192
 *    products, different orders).
 *  - pooling: maxima and argmax exactly (a selection, same first-maximum
 *    rule); the sums of the backward passes and of average pooling 1e-6
 *    (the CUDA kernels do the CPU's additions in the CPU's order, so they
 *    are expected to be equal). */
#include <math.h>
#include <stdlib.h>

#include "axon/kernels/backend-impl.h"
#include "cuda_testutil.h"
#include "harness.h"

/* Defined by kernels/cuda/cuda_dnn.cu, inside the CUDA backend that libaxon
 * loads on demand: found through the loader (NULL without it). */
typedef int (*dnn_stats_fn)(ax_backend *be, int64_t *selects, int64_t *hits);

static float *nans(size_t n) {
  float *v = malloc(n * sizeof(float) + 4);
  for (size_t i = 0; i < n; i++)
    v[i] = NAN;
  return v;
}

/* ---- convolution ---- */

static void conv_tol(int n, int c, int h, int w, int k, int r, int s,
                     int stride, int pad, double atol, double rtol) {
  ax_conv_desc d = {n, c, h, w, k, r, s, stride, pad, 0, 0};
  AX_ASSERT_OK(ax_conv_desc_init(&d));
  size_t nx = (size_t)n * c * h * w, nw = (size_t)k * c * r * s,
         ny = (size_t)n * k * d.oh * d.ow;
  float *x = ct_randn(1, nx, 1), *wt = ct_randn(2, nw, 1),
        *dy = ct_randn(3, ny, 1);
  float *dw = ct_randn(4, nw, 1); /* non-zero: bwd_filter accumulates */
  float *y = malloc(ny * 4), *dx = malloc(nx * 4), *junk = nans(nx + ny);
  float *gx = ct_up(x, nx * 4), *gw = ct_up(wt, nw * 4),
        *gdy = ct_up(dy, ny * 4);
  float *gdw = ct_up(dw, nw * 4);
  /* Outputs start as NaN: fwd and bwd_data must overwrite (beta = 0). */
  float *gy = ct_up(junk, ny * 4), *gdx = ct_up(junk, nx * 4);
  AX_ASSERT_OK(AX_K(ct_cpu(), conv2d_fwd, &d, x, wt, y));
  AX_ASSERT_OK(AX_K(ct_cpu(), conv2d_bwd_data, &d, dy, wt, dx));
  AX_ASSERT_OK(AX_K(ct_cpu(), conv2d_bwd_filter, &d, x, dy, dw));
  AX_ASSERT_OK(AX_K(ct_gpu(), conv2d_fwd, &d, gx, gw, gy));
  AX_ASSERT_OK(AX_K(ct_gpu(), conv2d_bwd_data, &d, gdy, gw, gdx));
  AX_ASSERT_OK(AX_K(ct_gpu(), conv2d_bwd_filter, &d, gx, gdy, gdw));
  ct_check("conv2d_fwd", gy, y, ny, atol, rtol);
  ct_check("conv2d_bwd_data", gdx, dx, nx, atol, rtol);
  ct_check("conv2d_bwd_filter", gdw, dw, nw, atol, rtol);
  ct_free(gx), ct_free(gw), ct_free(gdy), ct_free(gdw), ct_free(gy);
  ct_free(gdx);
  free(x), free(wt), free(dy), free(dw), free(y), free(dx), free(junk);
}

static void conv_case(int n, int c, int h, int w, int k, int r, int s,
                      int stride, int pad) {
  conv_tol(n, c, h, w, k, r, s, stride, pad, 1e-3, 1e-3);
}

/* Every convolution of ResNet20 at batch 8. */
static void conv_resnet20_shapes(void **state) {
  conv_case(8, 3, 32, 32, 16, 3, 3, 1, 1);  /* stem */
  conv_case(8, 16, 32, 32, 16, 3, 3, 1, 1); /* stage 1 */
  conv_case(8, 16, 32, 32, 32, 3, 3, 2, 1); /* stage 2 entry */
  conv_case(8, 16, 32, 32, 32, 1, 1, 2, 0); /* its 1x1 shortcut */
  conv_case(8, 32, 16, 16, 32, 3, 3, 1, 1);
  conv_case(8, 32, 16, 16, 64, 3, 3, 2, 1); /* stage 3 entry */
  conv_case(8, 32, 16, 16, 64, 1, 1, 2, 0);
  conv_case(8, 64, 8, 8, 64, 3, 3, 1, 1);
}

static void conv_odd_shapes(void **state) {
  conv_case(3, 5, 11, 9, 7, 3, 5, 2, 2);  /* non-square filter, odd sizes */
  conv_case(2, 3, 11, 10, 4, 4, 4, 3, 2); /* even filter, stride 3 */
  conv_case(1, 1, 5, 7, 1, 1, 1, 1, 0);   /* a single channel */
  conv_case(2, 6, 9, 9, 10, 5, 5, 1, 0);  /* 5x5, no padding */
}

/* The first call of each direction on a new shape selects an algorithm;
 * later calls reuse it. */
static void conv_algo_cache(void **state) {
  dnn_stats_fn axi_cuda_dnn_stats =
      (dnn_stats_fn)axi_cuda_sym("axi_cuda_dnn_stats");
  if (!axi_cuda_dnn_stats)
    skip();
  int64_t s0, h0, s1, h1, s2, h2;
  AX_ASSERT_OK(axi_cuda_dnn_stats(ct_gpu(), &s0, &h0));
  conv_case(2, 6, 10, 12, 5, 3, 3, 1, 1); /* a shape no other test uses */
  AX_ASSERT_OK(axi_cuda_dnn_stats(ct_gpu(), &s1, &h1));
  assert_int_equal(s1, s0 + 3);
  assert_int_equal(h1, h0);
  conv_case(2, 6, 10, 12, 5, 3, 3, 1, 1);
  AX_ASSERT_OK(axi_cuda_dnn_stats(ct_gpu(), &s2, &h2));
  assert_int_equal(s2, s1);
  assert_int_equal(h2, h1 + 3);
}

/* Measured selection (cudnnFind*AlgorithmEx) on new shapes, and TF32. */
static void conv_benchmark_and_tf32(void **state) {
  setenv("AXON_CUDNN_BENCHMARK", "1", 1);
  conv_case(4, 16, 12, 12, 24, 3, 3, 1, 1);
  conv_case(4, 16, 12, 12, 24, 1, 1, 2, 0);
  unsetenv("AXON_CUDNN_BENCHMARK");
  setenv("AXON_TF32", "1", 1);
  conv_tol(4, 16, 14, 14, 24, 3, 3, 1, 1, 5e-2, 1e-2);
  unsetenv("AXON_TF32");
}

static void conv_rejects_bad_descriptor(void **state) {
  ax_conv_desc d = {2, 3, 8, 8, 4, 3, 3, 1, 1, 0, 0}; /* oh, ow not set */
  float *p = ct_up(NULL, 0);
  AX_ASSERT_ERR(AX_K(ct_gpu(), conv2d_fwd, &d, p, p, p), AX_EINVAL);
  ct_free(p);
}

/* ---- batch norm ---- */

static void bn_case(int n, int c, int hw, float eps, int with_run, int relu) {
  size_t nx = (size_t)n * c * hw;
  const float mom = 0.1f;
  float *x = ct_randn(11, nx, 1), *dy = ct_randn(12, nx, 1),
        *gamma = ct_randn(13, c, 1), *beta = ct_randn(14, c, 1),
        *rm = ct_randn(15, c, 1), *rv = ct_randn(16, c, 1);
  for (int i = 0; i < c; i++)
    rv[i] = 0.5f + fabsf(rv[i]);
  for (size_t i = 0; i < nx; i++)
    x[i] = 3.0f + 2.0f * x[i]; /* a mean and variance far from 0 and 1 */
  float *gx = ct_up(x, nx * 4), *gdy = ct_up(dy, nx * 4),
        *gg = ct_up(gamma, c * 4), *gb = ct_up(beta, c * 4),
        *grm = ct_up(rm, c * 4), *grv = ct_up(rv, c * 4);
  float *ye = malloc(nx * 4), *gye = ct_up(NULL, nx * 4);
  /* eval with the initial running statistics */
  AX_ASSERT_OK(
      AX_K(ct_cpu(), bn_fwd_eval, n, c, hw, x, gamma, beta, rm, rv, eps, ye));
  AX_ASSERT_OK(
      AX_K(ct_gpu(), bn_fwd_eval, n, c, hw, gx, gg, gb, grm, grv, eps, gye));
  ct_check("bn_fwd_eval y", gye, ye, nx, 1e-4, 1e-4);
  float *y = malloc(nx * 4), *st = malloc(2 * c * 4), *gy = ct_up(NULL, nx * 4),
        *gst = ct_up(NULL, 2 * c * 4);
  float *crm = with_run ? rm : NULL, *crv = with_run ? rv : NULL;
  float *cgrm = with_run ? grm : NULL, *cgrv = with_run ? grv : NULL;
  if (relu) {
    AX_ASSERT_OK(AX_K(ct_cpu(), bn_relu_fwd_train, n, c, hw, x, gamma, beta, y,
                      st, st + c, crm, crv, mom, eps));
    AX_ASSERT_OK(AX_K(ct_gpu(), bn_relu_fwd_train, n, c, hw, gx, gg, gb, gy,
                      gst, gst + c, cgrm, cgrv, mom, eps));
  } else {
    AX_ASSERT_OK(AX_K(ct_cpu(), bn_fwd_train, n, c, hw, x, gamma, beta, y, st,
                      st + c, crm, crv, mom, eps));
    AX_ASSERT_OK(AX_K(ct_gpu(), bn_fwd_train, n, c, hw, gx, gg, gb, gy, gst,
                      gst + c, cgrm, cgrv, mom, eps));
  }
  ct_check("bn save_mean", gst, st, c, 1e-5, 1e-5);
  ct_check("bn save_invstd", gst + c, st + c, c, 1e-5, 1e-5);
  ct_check("bn_fwd_train y", gy, y, nx, 1e-4, 1e-4);
  /* Running statistics: updated (unbiased variance) or left alone. */
  ct_check("bn run_mean", grm, rm, c, 1e-5, 1e-5);
  ct_check("bn run_var", grv, rv, c, 1e-5, 1e-5);
  float *dx = malloc(nx * 4), *dg = malloc(c * 4), *db = malloc(c * 4);
  for (int i = 0; i < c; i++)
    dg[i] = 0.5f, db[i] = -0.25f; /* accumulated into */
  float *gdx = ct_up(NULL, nx * 4), *gdg = ct_up(dg, c * 4),
        *gdb = ct_up(db, c * 4);
  if (relu) {
    AX_ASSERT_OK(AX_K(ct_cpu(), bn_relu_bwd, n, c, hw, x, y, dy, gamma, st,
                      st + c, dx, dg, db));
    AX_ASSERT_OK(AX_K(ct_gpu(), bn_relu_bwd, n, c, hw, gx, gy, gdy, gg, gst,
                      gst + c, gdx, gdg, gdb));
  } else {
    AX_ASSERT_OK(
        AX_K(ct_cpu(), bn_bwd, n, c, hw, x, dy, gamma, st, st + c, dx, dg, db));
    AX_ASSERT_OK(AX_K(ct_gpu(), bn_bwd, n, c, hw, gx, gdy, gg, gst, gst + c,
                      gdx, gdg, gdb));
  }
  ct_check("bn_bwd dx", gdx, dx, nx, 1e-4, 1e-4);
  ct_check("bn_bwd dgamma", gdg, dg, c, 1e-3, 1e-4);
  ct_check("bn_bwd dbeta", gdb, db, c, 1e-3, 1e-4);
  ct_free(gx), ct_free(gdy), ct_free(gg), ct_free(gb), ct_free(grm);
  ct_free(grv);
  ct_free(gye), ct_free(gy), ct_free(gst), ct_free(gdx), ct_free(gdg);
  ct_free(gdb);
  free(x), free(dy), free(gamma), free(beta), free(rm), free(rv), free(ye);
  free(y), free(st), free(dx), free(dg), free(db);
}

static void bn_matches_cpu(void **state) {
  bn_case(8, 16, 1024, 1e-5f, 1, 0); /* ResNet20 stage 1 */
  bn_case(8, 64, 64, 1e-5f, 1, 0);   /* stage 3 */
  bn_case(3, 5, 37, 1e-5f, 1, 0);    /* odd sizes */
  bn_case(4, 2, 1, 1e-5f, 1, 0);     /* (N, C) input */
  /* A large eps: the backward must use the saved statistics, not
   * recompute them with some other eps. */
  bn_case(3, 5, 37, 0.1f, 1, 0);
}

static void bn_without_running_stats(void **state) {
  bn_case(8, 16, 64, 1e-5f, 0, 0);
  bn_case(8, 16, 64, 1e-5f, 0, 1);
}

static void bn_relu_matches_cpu(void **state) {
  bn_case(8, 32, 256, 1e-5f, 1, 1);
  bn_case(3, 5, 37, 1e-3f, 1, 1);
}

/* dx may be NULL: only the parameter gradients are accumulated. */
static void bn_bwd_without_dx(void **state) {
  const int n = 4, c = 3, hw = 50;
  size_t nx = (size_t)n * c * hw;
  float *x = ct_randn(31, nx, 1), *dy = ct_randn(32, nx, 1),
        *gamma = ct_randn(33, c, 1), *beta = ct_randn(34, c, 1);
  float st[6], dg[3] = {0}, db[3] = {0}, *y = malloc(nx * 4),
               *dx = malloc(nx * 4);
  AX_ASSERT_OK(AX_K(ct_cpu(), bn_fwd_train, n, c, hw, x, gamma, beta, y, st,
                    st + c, NULL, NULL, 0.1f, 1e-5f));
  AX_ASSERT_OK(
      AX_K(ct_cpu(), bn_bwd, n, c, hw, x, dy, gamma, st, st + c, dx, dg, db));
  float zero[3] = {0};
  float *gx = ct_up(x, nx * 4), *gdy = ct_up(dy, nx * 4),
        *gg = ct_up(gamma, 12), *gst = ct_up(st, 24), *gdg = ct_up(zero, 12),
        *gdb = ct_up(zero, 12);
  AX_ASSERT_OK(AX_K(ct_gpu(), bn_bwd, n, c, hw, gx, gdy, gg, gst, gst + c, NULL,
                    gdg, gdb));
  ct_check("bn_bwd dgamma (no dx)", gdg, dg, c, 1e-4, 1e-4);
  ct_check("bn_bwd dbeta (no dx)", gdb, db, c, 1e-4, 1e-4);
  ct_free(gx), ct_free(gdy), ct_free(gg), ct_free(gst), ct_free(gdg);
  ct_free(gdb);
  free(x), free(dy), free(gamma), free(beta), free(y), free(dx);
}

static void bn_single_value_fails(void **state) {
  float h[2] = {1, 2};
  float *p = ct_up(h, 8), *q = ct_up(h, 8);
  AX_ASSERT_ERR(AX_K(ct_gpu(), bn_fwd_train, 1, 2, 1, p, p, p, q, q, q, NULL,
                     NULL, 0.1f, 1e-5f),
                AX_ESHAPE);
  ct_free(p), ct_free(q);
}

/* ---- pooling ---- */

static void pool_case(int n, int c, int h, int w, int kh, int kw, int stride,
                      int pad, int ties) {
  ax_pool_desc d = {n, c, h, w, kh, kw, stride, pad, 0, 0};
  AX_ASSERT_OK(ax_pool_desc_init(&d));
  size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * d.oh * d.ow;
  float *x = ct_randn(21, nx, 1), *dy = ct_randn(22, ny, 1);
  if (ties) /* few distinct values: the first maximum must win */
    for (size_t i = 0; i < nx; i++)
      x[i] = floorf(x[i]);
  float *y = malloc(ny * 4), *ya = malloc(ny * 4), *dx = malloc(nx * 4),
        *dxa = malloc(nx * 4), *junk = nans(nx + ny);
  int32_t *am = malloc(ny * 4);
  float *gx = ct_up(x, nx * 4), *gdy = ct_up(dy, ny * 4),
        *gy = ct_up(junk, ny * 4), *gya = ct_up(junk, ny * 4),
        *gdx = ct_up(junk, nx * 4), *gdxa = ct_up(junk, nx * 4);
  int32_t *gam = ct_up(NULL, ny * 4);
  AX_ASSERT_OK(AX_K(ct_cpu(), maxpool_fwd, &d, x, y, am));
  AX_ASSERT_OK(AX_K(ct_cpu(), maxpool_bwd, &d, dy, am, dx));
  AX_ASSERT_OK(AX_K(ct_cpu(), avgpool_fwd, &d, x, ya));
  AX_ASSERT_OK(AX_K(ct_cpu(), avgpool_bwd, &d, dy, dxa));
  AX_ASSERT_OK(AX_K(ct_gpu(), maxpool_fwd, &d, gx, gy, gam));
  AX_ASSERT_OK(AX_K(ct_gpu(), maxpool_bwd, &d, gdy, gam, gdx));
  AX_ASSERT_OK(AX_K(ct_gpu(), avgpool_fwd, &d, gx, gya));
  AX_ASSERT_OK(AX_K(ct_gpu(), avgpool_bwd, &d, gdy, gdxa));
  ct_check_exact("maxpool argmax", gam, am, ny * 4);
  ct_check_exact("maxpool_fwd y", gy, y, ny * 4);
  ct_check("maxpool_bwd", gdx, dx, nx, 1e-6, 1e-6);
  ct_check("avgpool_fwd", gya, ya, ny, 1e-6, 1e-6);
  ct_check("avgpool_bwd", gdxa, dxa, nx, 1e-6, 1e-6);
  ct_free(gx), ct_free(gdy), ct_free(gy), ct_free(gya), ct_free(gdx);
  ct_free(gdxa);
  ct_free(gam);
  free(x), free(dy), free(y), free(ya), free(dx), free(dxa), free(junk);
  free(am);
}

static void pools_match_cpu(void **state) {
  pool_case(8, 16, 32, 32, 2, 2, 2, 0, 0);
  pool_case(8, 16, 32, 32, 3, 3, 2, 1, 0); /* overlapping windows */
  pool_case(2, 3, 9, 7, 3, 3, 1, 1, 0);    /* stride 1: heavy overlap */
  pool_case(8, 64, 8, 8, 8, 8, 1, 0, 0);   /* global (ResNet20's head) */
  pool_case(3, 5, 11, 9, 3, 2, 2, 1, 0);   /* non-square window */
  pool_case(2, 4, 9, 9, 3, 3, 2, 1, 1);    /* ties */
  pool_case(2, 4, 10, 10, 2, 2, 3, 0, 1);  /* stride > window: gaps */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(conv_resnet20_shapes),
      cmocka_unit_test(conv_odd_shapes),
      cmocka_unit_test(conv_algo_cache),
      cmocka_unit_test(conv_benchmark_and_tf32),
      cmocka_unit_test(conv_rejects_bad_descriptor),
      cmocka_unit_test(bn_matches_cpu),
      cmocka_unit_test(bn_without_running_stats),
      cmocka_unit_test(bn_relu_matches_cpu),
      cmocka_unit_test(bn_bwd_without_dx),
      cmocka_unit_test(bn_single_value_fails),
      cmocka_unit_test(pools_match_cpu),
  };
  return AX_CUDA_TEST_MAIN(tests);
}
