/* CPU convolution, batch-norm and pooling kernels against naive direct-loop
 * references, called through the backend vtable. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "harness.h"

static ax_backend *cpu(void) { return ax_backend_of(AX_CPU); }

/* n N(0, 1) floats from seed (caller frees). */
static float *randv(uint64_t seed, size_t n) {
  float *v = malloc(n * sizeof(float) + 1);
  ax_rng r;
  ax_rng_seed(&r, seed);
  for (size_t i = 0; i < n; i++)
    v[i] = (float)ax_rng_normal(&r);
  return v;
}

static void assert_close(const float *a, const float *b, size_t n, double atol,
                         double rtol, const char *what) {
  double r = ax_test_close_ratio(a, b, n, atol, rtol);
  if (!(r <= 1.0))
    fail_msg("%s differs from the reference (worst ratio %g)", what, r);
}

/* ---- convolution ---- */

#define X_AT(D, A, N_, C_, I_, J_)                                             \
  (A)[(((size_t)(N_) * (D)->c + (C_)) * (D)->h + (I_)) * (D)->w + (J_)]
#define W_AT(D, A, K_, C_, R_, S_)                                             \
  (A)[(((size_t)(K_) * (D)->c + (C_)) * (D)->r + (R_)) * (D)->s + (S_)]
#define Y_AT(D, A, N_, K_, I_, J_)                                             \
  (A)[(((size_t)(N_) * (D)->k + (K_)) * (D)->oh + (I_)) * (D)->ow + (J_)]

/* Runs body with n, k, oh, ow, c, r, s, ih, iw set for every tap of the
 * convolution that reads inside the input. */
#define FOR_TAPS(d, ...)                                                       \
  for (int n = 0; n < (d)->n; n++)                                             \
    for (int k = 0; k < (d)->k; k++)                                           \
      for (int oh = 0; oh < (d)->oh; oh++)                                     \
        for (int ow = 0; ow < (d)->ow; ow++)                                   \
          for (int c = 0; c < (d)->c; c++)                                     \
            for (int r = 0; r < (d)->r; r++)                                   \
              for (int s = 0; s < (d)->s; s++) {                               \
                int ih = oh * (d)->stride - (d)->pad + r;                      \
                int iw = ow * (d)->stride - (d)->pad + s;                      \
                if (ih < 0 || ih >= (d)->h || iw < 0 || iw >= (d)->w)          \
                  continue;                                                    \
                __VA_ARGS__;                                                   \
              }

static void conv_case(int n, int c, int h, int w, int k, int r, int s,
                      int stride, int pad) {
  ax_conv_desc d = {n, c, h, w, k, r, s, stride, pad, 0, 0};
  AX_ASSERT_OK(ax_conv_desc_init(&d));
  size_t nx = (size_t)n * c * h * w, nw = (size_t)k * c * r * s,
         ny = (size_t)n * k * d.oh * d.ow;
  float *x = randv(1, nx), *wt = randv(2, nw), *dy = randv(3, ny);
  float *dw0 = randv(4, nw); /* dw starts non-zero: the kernel accumulates */
  float *y = malloc(ny * 4), *dx = malloc(nx * 4), *dw = malloc(nw * 4);
  double *ry = calloc(ny, 8), *rdx = calloc(nx, 8), *rdw = calloc(nw, 8);
  memcpy(dw, dw0, nw * 4);
  AX_ASSERT_OK(AX_K(cpu(), conv2d_fwd, &d, x, wt, y));
  AX_ASSERT_OK(AX_K(cpu(), conv2d_bwd_data, &d, dy, wt, dx));
  AX_ASSERT_OK(AX_K(cpu(), conv2d_bwd_filter, &d, x, dy, dw));
  FOR_TAPS(&d, {
    double xv = X_AT(&d, x, n, c, ih, iw), wv = W_AT(&d, wt, k, c, r, s),
           gv = Y_AT(&d, dy, n, k, oh, ow);
    Y_AT(&d, ry, n, k, oh, ow) += xv * wv;
    X_AT(&d, rdx, n, c, ih, iw) += gv * wv;
    W_AT(&d, rdw, k, c, r, s) += gv * xv;
  });
  float *fy = malloc(ny * 4), *fdx = malloc(nx * 4), *fdw = malloc(nw * 4);
  for (size_t i = 0; i < ny; i++)
    fy[i] = (float)ry[i];
  for (size_t i = 0; i < nx; i++)
    fdx[i] = (float)rdx[i];
  for (size_t i = 0; i < nw; i++)
    fdw[i] = (float)(rdw[i] + dw0[i]);
  assert_close(y, fy, ny, 1e-3, 1e-3, "conv2d_fwd");
  assert_close(dx, fdx, nx, 1e-3, 1e-3, "conv2d_bwd_data");
  assert_close(dw, fdw, nw, 1e-3, 1e-3, "conv2d_bwd_filter");
  free(x), free(wt), free(dy), free(dw0), free(y), free(dx), free(dw);
  free(ry), free(rdx), free(rdw), free(fy), free(fdx), free(fdw);
}

static void conv_3x3_pad1(void **state) {
  conv_case(2, 3, 7, 6, 4, 3, 3, 1, 1);
  conv_case(3, 4, 9, 9, 5, 3, 3, 2, 1);
  conv_case(2, 3, 8, 8, 4, 3, 3, 2, 1);
}

static void conv_pad0_and_odd(void **state) {
  conv_case(2, 3, 5, 7, 2, 3, 3, 1, 0);
  conv_case(2, 2, 6, 7, 3, 3, 2, 1, 0);   /* non-square kernel */
  conv_case(3, 2, 11, 10, 3, 4, 4, 3, 2); /* even kernel, stride 3 */
}

static void conv_pointwise(void **state) {
  conv_case(2, 5, 8, 8, 6, 1, 1, 1, 0);
  conv_case(2, 5, 8, 8, 6, 1, 1, 2, 0);
  conv_case(2, 5, 7, 7, 6, 1, 1, 2, 0);
}

static void conv_single_image_and_large(void **state) {
  conv_case(1, 2, 6, 6, 3, 5, 5, 2, 2);    /* one image: one thread */
  conv_case(3, 16, 32, 32, 8, 3, 3, 1, 1); /* several column blocks */
}

/* Shapes of the AVX-512 paths (where the CPU has them): stride-1 and
 * stride-2 (by input phases) square convolutions without a column matrix,
 * filter gradients in the transposed
 * form (K a multiple of 32, small images), odd widths for the masked tails
 * and M tails, and 1x1 and stride-2 convolutions through the column matrix. */
static void conv_avx512_shapes(void **state) {
  conv_case(3, 8, 8, 8, 32, 3, 3, 1, 1);    /* transposed filter gradient */
  conv_case(2, 5, 6, 7, 64, 3, 3, 1, 1);    /* odd width, K = 64 */
  conv_case(2, 3, 13, 11, 9, 3, 3, 1, 0);   /* no padding, row tails */
  conv_case(2, 6, 9, 10, 7, 5, 5, 1, 2);    /* 5x5, pad 2 */
  conv_case(2, 1, 32, 32, 16, 3, 3, 1, 1);  /* the ResNet stem */
  conv_case(3, 16, 16, 16, 32, 3, 3, 2, 1); /* stride 2, transposed dw */
  conv_case(2, 4, 32, 32, 16, 3, 3, 2, 1);  /* stride 2 through phases */
  conv_case(2, 3, 6, 10, 8, 3, 3, 2, 1);    /* stride 2, H != W */
  conv_case(3, 16, 16, 16, 32, 1, 1, 2, 0); /* 1x1 stride 2 */
  conv_case(2, 32, 8, 8, 64, 1, 1, 1, 0);   /* pointwise, transposed dw */
}

static void conv_single_thread(void **state) {
  int t = ax_cpu_threads();
  ax_cpu_set_threads(1);
  conv_case(3, 4, 9, 9, 5, 3, 3, 2, 1);
  conv_case(2, 8, 8, 8, 32, 3, 3, 1, 1);
  ax_cpu_set_threads(t);
}

/* ---- batch norm ---- */

/* The fused batch norm + ReLU kernels against bn_fwd_train + relu_fwd and
 * relu_bwd + bn_bwd, and add_relu_fwd against axpby + relu_fwd. */
static void bn_relu_matches_unfused(void **state) {
  const int n = 3, c = 5, hw = 37;
  size_t nx = (size_t)n * c * hw;
  float *x = randv(21, nx), *dy = randv(22, nx), *gamma = randv(23, c),
        *beta = randv(24, c);
  float *y0 = malloc(nx * 4), *y1 = malloc(nx * 4), *g = malloc(nx * 4);
  float *dx0 = malloc(nx * 4), *dx1 = malloc(nx * 4);
  float *st0 = malloc(2 * c * 4), *st1 = malloc(2 * c * 4);
  float *rm0 = calloc(c, 4), *rv0 = calloc(c, 4), *rm1 = calloc(c, 4),
        *rv1 = calloc(c, 4);
  float *dg0 = calloc(c, 4), *db0 = calloc(c, 4), *dg1 = calloc(c, 4),
        *db1 = calloc(c, 4);
  AX_ASSERT_OK(AX_K(cpu(), bn_fwd_train, n, c, hw, x, gamma, beta, y0, st0,
                    st0 + c, rm0, rv0, 0.1f, 1e-5f));
  AX_ASSERT_OK(AX_K(cpu(), relu_fwd, nx, y0, y0));
  AX_ASSERT_OK(AX_K(cpu(), bn_relu_fwd_train, n, c, hw, x, gamma, beta, y1, st1,
                    st1 + c, rm1, rv1, 0.1f, 1e-5f));
  assert_close(y1, y0, nx, 1e-6, 1e-6, "bn_relu_fwd_train y");
  assert_close(st1, st0, 2 * c, 1e-6, 1e-6, "bn_relu_fwd_train stats");
  assert_close(rm1, rm0, c, 1e-6, 1e-6, "bn_relu_fwd_train run_mean");
  assert_close(rv1, rv0, c, 1e-6, 1e-6, "bn_relu_fwd_train run_var");
  AX_ASSERT_OK(AX_K(cpu(), relu_bwd, nx, y0, dy, g));
  AX_ASSERT_OK(
      AX_K(cpu(), bn_bwd, n, c, hw, x, g, gamma, st0, st0 + c, dx0, dg0, db0));
  AX_ASSERT_OK(AX_K(cpu(), bn_relu_bwd, n, c, hw, x, y1, dy, gamma, st1,
                    st1 + c, dx1, dg1, db1));
  assert_close(dx1, dx0, nx, 1e-5, 1e-5, "bn_relu_bwd dx");
  /* add_relu_fwd against axpby + relu_fwd, on y1 += dy. */
  memcpy(g, y1, nx * 4);
  AX_ASSERT_OK(AX_K(cpu(), axpby, nx, 1.0f, dy, 1.0f, g));
  AX_ASSERT_OK(AX_K(cpu(), relu_fwd, nx, g, g));
  AX_ASSERT_OK(AX_K(cpu(), add_relu_fwd, nx, dy, y1));
  assert_close(y1, g, nx, 1e-6, 1e-6, "add_relu_fwd");
  assert_close(dg1, dg0, c, 1e-5, 1e-5, "bn_relu_bwd dgamma");
  assert_close(db1, db0, c, 1e-5, 1e-5, "bn_relu_bwd dbeta");
  free(x), free(dy), free(gamma), free(beta), free(y0), free(y1), free(g);
  free(dx0), free(dx1), free(st0), free(st1), free(rm0), free(rv0), free(rm1);
  free(rv1), free(dg0), free(db0), free(dg1), free(db1);
}

static void bn_case(int n, int c, int hw) {
  size_t nx = (size_t)n * c * hw;
  const float mom = 0.1f, eps = 1e-5f;
  float *x = randv(11, nx), *dy = randv(12, nx), *gamma = randv(13, c),
        *beta = randv(14, c), *rm = randv(15, c), *rv = randv(16, c);
  for (int i = 0; i < c; i++)
    rv[i] = 0.5f + fabsf(rv[i]);
  for (size_t i = 0; i < nx; i++)
    x[i] = 3.0f + 2.0f * x[i]; /* a mean and variance far from 0 and 1 */
  float *rm0 = malloc(c * 4), *rv0 = malloc(c * 4);
  memcpy(rm0, rm, c * 4);
  memcpy(rv0, rv, c * 4);
  float *y = malloc(nx * 4), *dx = malloc(nx * 4), *ye = malloc(nx * 4);
  float *mean = malloc(c * 4), *inv = malloc(c * 4);
  float *dg = calloc(c, 4), *db = calloc(c, 4);
  for (int i = 0; i < c; i++)
    dg[i] = 0.5f, db[i] = -0.25f; /* accumulated into */
  AX_ASSERT_OK(AX_K(cpu(), bn_fwd_train, n, c, hw, x, gamma, beta, y, mean, inv,
                    rm, rv, mom, eps));
  AX_ASSERT_OK(
      AX_K(cpu(), bn_bwd, n, c, hw, x, dy, gamma, mean, inv, dx, dg, db));
  AX_ASSERT_OK(
      AX_K(cpu(), bn_fwd_eval, n, c, hw, x, gamma, beta, rm0, rv0, eps, ye));
  double cnt = (double)n * hw;
  for (int ch = 0; ch < c; ch++) {
    double s = 0, v = 0, sdy = 0, sdyx = 0;
    for (int b = 0; b < n; b++)
      for (int i = 0; i < hw; i++)
        s += x[((size_t)b * c + ch) * hw + i];
    double m = s / cnt;
    for (int b = 0; b < n; b++)
      for (int i = 0; i < hw; i++) {
        double d = x[((size_t)b * c + ch) * hw + i] - m;
        v += d * d;
      }
    double is = 1.0 / sqrt(v / cnt + eps);
    AX_ASSERT_CLOSE(mean[ch], m, 1e-5, 1e-5);
    AX_ASSERT_CLOSE(inv[ch], is, 1e-5, 1e-4);
    AX_ASSERT_CLOSE(rm[ch], (1 - mom) * rm0[ch] + mom * m, 1e-5, 1e-5);
    AX_ASSERT_CLOSE(rv[ch], (1 - mom) * rv0[ch] + mom * v / (cnt - 1), 1e-5,
                    1e-4);
    double eis = 1.0 / sqrt((double)rv0[ch] + eps);
    for (int b = 0; b < n; b++)
      for (int i = 0; i < hw; i++) {
        size_t o = ((size_t)b * c + ch) * hw + i;
        double xh = (x[o] - m) * is;
        AX_ASSERT_CLOSE(y[o], gamma[ch] * xh + beta[ch], 1e-4, 1e-4);
        AX_ASSERT_CLOSE(ye[o], gamma[ch] * (x[o] - rm0[ch]) * eis + beta[ch],
                        1e-4, 1e-4);
        sdy += dy[o];
        sdyx += dy[o] * xh;
      }
    AX_ASSERT_CLOSE(db[ch], -0.25 + sdy, 1e-4, 1e-4);
    AX_ASSERT_CLOSE(dg[ch], 0.5 + sdyx, 1e-4, 1e-4);
    for (int b = 0; b < n; b++)
      for (int i = 0; i < hw; i++) {
        size_t o = ((size_t)b * c + ch) * hw + i;
        double xh = (x[o] - m) * is;
        double ref = gamma[ch] * is / cnt * (cnt * dy[o] - sdy - xh * sdyx);
        AX_ASSERT_CLOSE(dx[o], ref, 1e-4, 1e-3);
      }
  }
  free(x), free(dy), free(gamma), free(beta), free(rm), free(rv), free(rm0);
  free(rv0), free(y), free(dx), free(ye), free(mean), free(inv), free(dg);
  free(db);
}

static void bn_matches_naive(void **state) {
  bn_case(4, 3, 25);
  bn_case(2, 5, 1); /* (N, C) input */
  bn_case(3, 16, 64);
}

static void bn_single_value_fails(void **state) {
  float x[2] = {1, 2}, g[2] = {1, 1}, b[2] = {0, 0}, y[2], m[2], s[2];
  AX_ASSERT_ERR(AX_K(cpu(), bn_fwd_train, 1, 2, 1, x, g, b, y, m, s, NULL, NULL,
                     0.1f, 1e-5f),
                AX_ESHAPE);
}

/* ---- pooling ---- */

static void pool_case(int n, int c, int h, int w, int k, int stride, int pad) {
  ax_pool_desc d = {n, c, h, w, k, k, stride, pad, 0, 0};
  AX_ASSERT_OK(ax_pool_desc_init(&d));
  size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * d.oh * d.ow;
  float *x = randv(21, nx), *dy = randv(22, ny);
  float *y = malloc(ny * 4), *ya = malloc(ny * 4), *dx = malloc(nx * 4),
        *dxa = malloc(nx * 4);
  int32_t *am = malloc(ny * 4);
  float *rdx = calloc(nx, 4), *rdxa = calloc(nx, 4);
  memset(dx, 0x7f, nx * 4); /* the kernels must overwrite every element */
  memset(dxa, 0x7f, nx * 4);
  AX_ASSERT_OK(AX_K(cpu(), maxpool_fwd, &d, x, y, am));
  AX_ASSERT_OK(AX_K(cpu(), maxpool_bwd, &d, dy, am, dx));
  AX_ASSERT_OK(AX_K(cpu(), avgpool_fwd, &d, x, ya));
  AX_ASSERT_OK(AX_K(cpu(), avgpool_bwd, &d, dy, dxa));
  for (int p = 0; p < n * c; p++)
    for (int oh = 0; oh < d.oh; oh++)
      for (int ow = 0; ow < d.ow; ow++) {
        size_t o = (size_t)p * d.oh * d.ow + oh * d.ow + ow;
        float best = -INFINITY;
        int at = -1;
        double sum = 0;
        for (int i = 0; i < k; i++)
          for (int j = 0; j < k; j++) {
            int ih = oh * stride - pad + i, iw = ow * stride - pad + j;
            if (ih < 0 || ih >= h || iw < 0 || iw >= w)
              continue;
            float v = x[(size_t)p * h * w + ih * w + iw];
            sum += v;
            if (v > best)
              best = v, at = ih * w + iw;
          }
        assert_true(at >= 0);
        assert_true(y[o] == best);
        assert_int_equal(am[o], at);
        AX_ASSERT_CLOSE(ya[o], sum / (k * k), 1e-5, 1e-5);
        rdx[(size_t)p * h * w + at] += dy[o];
        for (int i = 0; i < k; i++)
          for (int j = 0; j < k; j++) {
            int ih = oh * stride - pad + i, iw = ow * stride - pad + j;
            if (ih >= 0 && ih < h && iw >= 0 && iw < w)
              rdxa[(size_t)p * h * w + ih * w + iw] += dy[o] / (k * k);
          }
      }
  assert_close(dx, rdx, nx, 1e-5, 1e-5, "maxpool_bwd");
  assert_close(dxa, rdxa, nx, 1e-5, 1e-5, "avgpool_bwd");
  free(x), free(dy), free(y), free(ya), free(dx), free(dxa), free(am);
  free(rdx), free(rdxa);
}

static void pools_match_naive(void **state) {
  pool_case(2, 3, 8, 8, 2, 2, 0);
  pool_case(2, 3, 9, 7, 3, 2, 1);
  pool_case(1, 2, 5, 5, 3, 1, 1); /* overlapping windows */
  pool_case(2, 4, 8, 8, 8, 1, 0); /* global */
}

static void maxpool_first_max_wins(void **state) {
  ax_pool_desc d = {1, 1, 2, 2, 2, 2, 2, 0, 0, 0};
  AX_ASSERT_OK(ax_pool_desc_init(&d));
  float x[4] = {1, 3, 3, 2}, y;
  int32_t am;
  AX_ASSERT_OK(AX_K(cpu(), maxpool_fwd, &d, x, &y, &am));
  assert_true(y == 3.0f);
  assert_int_equal(am, 1);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(conv_3x3_pad1),
      cmocka_unit_test(conv_pad0_and_odd),
      cmocka_unit_test(conv_pointwise),
      cmocka_unit_test(conv_single_image_and_large),
      cmocka_unit_test(conv_avx512_shapes),
      cmocka_unit_test(conv_single_thread),
      cmocka_unit_test(bn_matches_naive),
      cmocka_unit_test(bn_single_value_fails),
      cmocka_unit_test(bn_relu_matches_unfused),
      cmocka_unit_test(pools_match_naive),
      cmocka_unit_test(maxpool_first_max_wins),
  };
  return AX_TEST_MAIN(t);
}
