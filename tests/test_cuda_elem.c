/* CUDA backend against the CPU reference: activations (forward and
 * backward), dropout, add_relu, SGD and AdamW steps. Every test runs the
 * same op with the same inputs on the CPU backend and on cuda:0 and
 * compares; each comparison states its tolerance and why. Skips (exit 77)
 * without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kernels/backend-impl.h"
#include "runtime/rng.h"

#define N (((size_t)1 << 20) + 3) /* > one grid of blocks, odd */

static ax_backend *cpu(void) {
  ax_backend *be = NULL;
  AX_ASSERT_OK(ax_backend_get(AX_CPU, &be));
  return be;
}

static ax_backend *gpu(void) {
  ax_backend *be = NULL;
  AX_ASSERT_OK(ax_backend_get((ax_device){AX_DEV_CUDA, 0}, &be));
  return be;
}

static float *randv(uint64_t seed, size_t n, float scale) {
  ax_rng r;
  ax_rng_seed(&r, seed);
  float *v = malloc(n * sizeof *v);
  assert_non_null(v);
  for (size_t i = 0; i < n; i++)
    v[i] = scale * (float)ax_rng_normal(&r);
  return v;
}

static float *up(const float *h, size_t n) {
  ax_backend *g = gpu();
  float *d = g->iface.alloc(g, n * sizeof *d);
  assert_non_null(d);
  AX_ASSERT_OK(AX_K(g, copy_from_host, d, h, n * sizeof *d));
  return d;
}

static void down(float *h, const float *d, size_t n) {
  AX_ASSERT_OK(AX_K(gpu(), copy_to_host, h, d, n * sizeof *h));
}

static void dfree(void *d) { gpu()->iface.free(gpu(), d); }

static void expect_close(const char *what, const float *got, const float *ref,
                         size_t n, double atol, double rtol) {
  double r = ax_test_close_ratio(got, ref, n, atol, rtol);
  if (!(r <= 1.0))
    fail_msg("%s: worst element at %.3g x the tolerance (atol %g, rtol %g)",
             what, r, atol, rtol);
}

/* Runs activation op (0 relu_fwd, 1 relu_bwd, 2 tanh_fwd, 3 tanh_bwd,
 * 4 gelu_fwd, 5 gelu_bwd, 6 add_relu_fwd) on both backends and compares.
 * x is N(0, 9) (|x| up to ~15, both signs, past the saturation of tanh and
 * erf), dy is N(0, 1); atol < 0 asks for identical bits. */
static void check_act(const char *what, int op, double atol, double rtol) {
  float *x = randv(11 + op, N, 3), *g = randv(12 + op, N, 1);
  float *ref = malloc(N * 4), *got = malloc(N * 4);
  float *dx = up(x, N), *dg = up(g, N), *dout = up(g, N);
  ax_backend *c = cpu(), *d = gpu();
  int rc_c, rc_d;
  switch (op) {
  case 0:
    rc_c = AX_K(c, relu_fwd, N, x, ref);
    rc_d = AX_K(d, relu_fwd, N, dx, dout);
    break;
  case 1: /* y = relu(x) as the backward's input, as layers pass it */
    AX_ASSERT_OK(AX_K(c, relu_fwd, N, x, x));
    AX_ASSERT_OK(AX_K(d, relu_fwd, N, dx, dx));
    rc_c = AX_K(c, relu_bwd, N, x, g, ref);
    rc_d = AX_K(d, relu_bwd, N, dx, dg, dout);
    break;
  case 2:
    rc_c = AX_K(c, tanh_fwd, N, x, ref);
    rc_d = AX_K(d, tanh_fwd, N, dx, dout);
    break;
  case 3: /* y = tanh(x) from the CPU, uploaded, so both see the same y */
    AX_ASSERT_OK(AX_K(c, tanh_fwd, N, x, x));
    AX_ASSERT_OK(AX_K(d, copy_from_host, dx, x, N * 4));
    rc_c = AX_K(c, tanh_bwd, N, x, g, ref);
    rc_d = AX_K(d, tanh_bwd, N, dx, dg, dout);
    break;
  case 4:
    rc_c = AX_K(c, gelu_fwd, N, x, ref);
    rc_d = AX_K(d, gelu_fwd, N, dx, dout);
    break;
  case 5:
    rc_c = AX_K(c, gelu_bwd, N, x, g, ref);
    rc_d = AX_K(d, gelu_bwd, N, dx, dg, dout);
    break;
  default: /* add_relu: y = relu(x + y), y starts as g */
    memcpy(ref, g, N * 4);
    rc_c = AX_K(c, add_relu_fwd, N, x, ref);
    rc_d = AX_K(d, add_relu_fwd, N, dx, dout);
    break;
  }
  AX_ASSERT_OK(rc_c);
  AX_ASSERT_OK(rc_d);
  down(got, dout, N);
  if (atol < 0)
    assert_memory_equal(got, ref, N * 4);
  else
    expect_close(what, got, ref, N, atol, rtol);
  dfree(dx); dfree(dg); dfree(dout);
  free(x); free(g); free(ref); free(got);
}

/* relu, relu_bwd, add_relu: a comparison, a select and one rounded add:
 * identical bits. tanh_bwd: dy (1 - y y) with explicitly rounded operations
 * in the CPU's order: identical bits expected; 2 ulp (rtol 2.4e-7) and
 * atol 1e-7 (cancellation in 1 - y y) allowed for a CPU build that
 * contracts to FMA. */
static void relu_tanh_exact(void **state) {
  check_act("relu_fwd", 0, -1, 0);
  check_act("relu_bwd", 1, -1, 0);
  check_act("add_relu", 6, -1, 0);
  check_act("tanh_bwd", 3, 1e-7, 2.4e-7);
}

/* CUDA's tanhf, erff and expf are within 2 ulp, glibc's within 1-2:
 * tanh_fwd to 8 ulp (rtol 1e-6, atol 1e-7 near 0). gelu: the erf errors
 * (~1.8e-7 together, ulps of values near 1) are multiplied by 0.5 |x| where
 * 1 + erf cancels, which is for |x| < 5.5 (beyond, erf is -1 in float on
 * both sides): atol 1e-6; elsewhere rtol 1e-5. gelu_bwd: the same error in
 * Phi plus 2 ulp of x phi(x) (expf), times |dy| < 6: atol 2e-6,
 * rtol 1e-5. */
static void tanh_gelu_close(void **state) {
  check_act("tanh_fwd", 2, 1e-7, 1e-6);
  check_act("gelu_fwd", 4, 1e-6, 1e-5);
  check_act("gelu_bwd", 5, 2e-6, 1e-5);
}

/* In place (y aliases x, dx aliases dy) gives the out-of-place result. */
static void in_place(void **state) {
  float *x = randv(21, N, 2), *g = randv(22, N, 1);
  float *a = malloc(N * 4), *b = malloc(N * 4);
  float *dx = up(x, N), *dy = up(g, N), *out = up(x, N);
  AX_ASSERT_OK(AX_K(gpu(), gelu_fwd, N, dx, out));
  AX_ASSERT_OK(AX_K(gpu(), gelu_fwd, N, dx, dx));
  down(a, out, N);
  down(b, dx, N);
  assert_memory_equal(a, b, N * 4);
  AX_ASSERT_OK(AX_K(gpu(), relu_bwd, N, dx, dy, out));
  AX_ASSERT_OK(AX_K(gpu(), relu_bwd, N, dx, dy, dy));
  down(a, out, N);
  down(b, dy, N);
  assert_memory_equal(a, b, N * 4);
  AX_ASSERT_OK(AX_K(gpu(), relu_fwd, 0, NULL, NULL)); /* n == 0 */
  dfree(dx); dfree(dy); dfree(out);
  free(x); free(g); free(a); free(b);
}

/* The mask is ax_dropout_uniform(seed, i) >= p on both backends and the
 * scale is computed on the host: forward and backward give identical bits,
 * for several p and seeds; p outside [0, 1) is AX_EINVAL. */
static void dropout_bit_identical(void **state) {
  const float ps[] = {0.0f, 0.1f, 0.5f, 0.9f};
  const uint64_t seeds[] = {1, 12345, 0xdeadbeefcafef00dull};
  float *x = randv(31, N, 1), *ref = malloc(N * 4), *got = malloc(N * 4);
  float *dx = up(x, N), *dy = up(x, N);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++) {
      AX_ASSERT_OK(AX_K(cpu(), dropout_fwd, N, x, ref, ps[i], seeds[j]));
      AX_ASSERT_OK(AX_K(gpu(), dropout_fwd, N, dx, dy, ps[i], seeds[j]));
      down(got, dy, N);
      assert_memory_equal(got, ref, N * 4);
      AX_ASSERT_OK(AX_K(cpu(), dropout_bwd, N, x, ref, ps[i], seeds[j]));
      AX_ASSERT_OK(AX_K(gpu(), dropout_bwd, N, dx, dy, ps[i], seeds[j]));
      down(got, dy, N);
      assert_memory_equal(got, ref, N * 4);
    }
  AX_ASSERT_ERR(AX_K(gpu(), dropout_fwd, N, dx, dy, 1.0f, 1), AX_EINVAL);
  AX_ASSERT_ERR(AX_K(gpu(), dropout_bwd, N, dx, dy, -0.1f, 1), AX_EINVAL);
  dfree(dx); dfree(dy);
  free(x); free(ref); free(got);
}

/* ---- optimizers ---------------------------------------------------------- */

/* The kernels use the CPU's expressions with explicitly rounded operations
 * and host-computed scalars, so the bits should match; the tolerance
 * (rtol 1e-6 ~ 8 ulp, atol 1e-7) only allows for a CPU build contracting
 * to FMA, accumulated over the steps. */
#define OPT_N 100003
#define OPT_ATOL 1e-7
#define OPT_RTOL 1e-6

typedef struct sgd_case {
  float lr, momentum, dampening, wd;
  int nesterov;
} sgd_case;

/* Four steps (the first with first = 1), a new gradient each; w and the
 * momentum buffer compared after every step. */
static void sgd_variants(void **state) {
  const sgd_case cases[] = {{0.1f, 0.0f, 0.0f, 0.0f, 0},
                            {0.1f, 0.0f, 0.0f, 1e-2f, 0},
                            {0.05f, 0.9f, 0.0f, 1e-4f, 0},
                            {0.05f, 0.9f, 0.0f, 1e-4f, 1},
                            {0.01f, 0.8f, 0.1f, 5e-4f, 0}};
  float *gw = malloc(OPT_N * 4), *gm = malloc(OPT_N * 4);
  for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
    sgd_case sc = cases[t];
    float *w = randv(40 + t, OPT_N, 1), *mom = calloc(OPT_N, 4);
    float *dw = up(w, OPT_N), *dm = up(mom, OPT_N);
    float *pm = sc.momentum != 0.0f ? mom : NULL;
    float *pdm = sc.momentum != 0.0f ? dm : NULL;
    for (int step = 0; step < 4; step++) {
      float *g = randv(50 + 10 * t + step, OPT_N, 1), *dg = up(g, OPT_N);
      AX_ASSERT_OK(AX_K(cpu(), sgd_step, OPT_N, w, g, pm, sc.lr, sc.momentum,
                        sc.dampening, sc.wd, sc.nesterov, step == 0));
      AX_ASSERT_OK(AX_K(gpu(), sgd_step, OPT_N, dw, dg, pdm, sc.lr,
                        sc.momentum, sc.dampening, sc.wd, sc.nesterov,
                        step == 0));
      down(gw, dw, OPT_N);
      expect_close("sgd w", gw, w, OPT_N, OPT_ATOL, OPT_RTOL);
      if (pm) {
        down(gm, dm, OPT_N);
        expect_close("sgd momentum", gm, mom, OPT_N, OPT_ATOL, OPT_RTOL);
      }
      dfree(dg);
      free(g);
    }
    dfree(dw); dfree(dm);
    free(w); free(mom);
  }
  AX_ASSERT_ERR(AX_K(gpu(), sgd_step, 4, gw, gw, NULL, 0.1f, 0.9f, 0.0f, 0.0f,
                     0, 1), AX_EINVAL);
  free(gw); free(gm);
}

/* Six AdamW steps (step counts from 1), a new gradient each; w, m and v
 * compared after every step. Gradients of scale 1e-3 reach the regime
 * where eps matters in denom. */
static void adamw_steps(void **state) {
  const float gscale[] = {1.0f, 1e-3f};
  float *gw = malloc(OPT_N * 4), *gmv = malloc(OPT_N * 4);
  for (int t = 0; t < 2; t++) {
    float *w = randv(60 + t, OPT_N, 1);
    float *m = calloc(OPT_N, 4), *v = calloc(OPT_N, 4);
    float *dw = up(w, OPT_N), *dm = up(m, OPT_N), *dv = up(v, OPT_N);
    for (int step = 1; step <= 6; step++) {
      float *g = randv(70 + 10 * t + step, OPT_N, gscale[t]),
            *dg = up(g, OPT_N);
      AX_ASSERT_OK(AX_K(cpu(), adamw_step, OPT_N, w, g, m, v, 1e-3f, 0.9f,
                        0.999f, 1e-8f, 1e-2f, step));
      AX_ASSERT_OK(AX_K(gpu(), adamw_step, OPT_N, dw, dg, dm, dv, 1e-3f, 0.9f,
                        0.999f, 1e-8f, 1e-2f, step));
      down(gw, dw, OPT_N);
      expect_close("adamw w", gw, w, OPT_N, OPT_ATOL, OPT_RTOL);
      down(gmv, dm, OPT_N);
      expect_close("adamw m", gmv, m, OPT_N, OPT_ATOL * gscale[t], OPT_RTOL);
      down(gmv, dv, OPT_N);
      expect_close("adamw v", gmv, v, OPT_N,
                   OPT_ATOL * gscale[t] * gscale[t], OPT_RTOL);
      dfree(dg);
      free(g);
    }
    dfree(dw); dfree(dm); dfree(dv);
    free(w); free(m); free(v);
  }
  AX_ASSERT_ERR(AX_K(gpu(), adamw_step, 4, gw, gw, gw, gw, 1e-3f, 0.9f,
                     0.999f, 1e-8f, 0.0f, 0), AX_EINVAL);
  free(gw); free(gmv);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(relu_tanh_exact),
      cmocka_unit_test(tanh_gelu_close),
      cmocka_unit_test(in_place),
      cmocka_unit_test(dropout_bit_identical),
      cmocka_unit_test(sgd_variants),
      cmocka_unit_test(adamw_steps),
  };
  return AX_CUDA_TEST_MAIN(tests);
}
