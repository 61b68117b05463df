/* CUDA backend against the CPU reference: activations (forward and
 * backward), dropout, add_relu, SGD and AdamW steps. Every test runs the
 * same op with the same inputs on the CPU backend and on cuda:0 and
 * compares; each comparison states its tolerance and why. Skips (exit 77)
 * without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "cuda_testutil.h"
#include "harness.h"

#define N (((size_t)1 << 20) + 3) /* > one grid of blocks, odd */

/* Runs activation op (0 relu_fwd, 1 relu_bwd, 2 tanh_fwd, 3 tanh_bwd,
 * 4 gelu_fwd, 5 gelu_bwd, 6 add_relu_fwd) on both backends and compares.
 * x is N(0, 9) (|x| up to ~15, both signs, past the saturation of tanh and
 * erf), dy is N(0, 1); atol < 0 asks for identical bits. */
static void check_act(const char *what, int op, double atol, double rtol) {
  float *x = ct_randn(11 + op, N, 3), *g = ct_randn(12 + op, N, 1);
  float *ref = malloc(N * 4), *got = malloc(N * 4);
  float *dx = ct_up(x, N * 4), *dg = ct_up(g, N * 4), *dout = ct_up(g, N * 4);
  ax_backend *c = ct_cpu(), *d = ct_gpu();
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
  ct_down(got, dout, N * 4);
  if (atol < 0)
    assert_memory_equal(got, ref, N * 4);
  else
    ct_expect_close(what, got, ref, N, atol, rtol);
  ct_free(dx);
  ct_free(dg);
  ct_free(dout);
  free(x);
  free(g);
  free(ref);
  free(got);
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
  float *x = ct_randn(21, N, 2), *g = ct_randn(22, N, 1);
  float *a = malloc(N * 4), *b = malloc(N * 4);
  float *dx = ct_up(x, N * 4), *dy = ct_up(g, N * 4), *out = ct_up(x, N * 4);
  AX_ASSERT_OK(AX_K(ct_gpu(), gelu_fwd, N, dx, out));
  AX_ASSERT_OK(AX_K(ct_gpu(), gelu_fwd, N, dx, dx));
  ct_down(a, out, N * 4);
  ct_down(b, dx, N * 4);
  assert_memory_equal(a, b, N * 4);
  AX_ASSERT_OK(AX_K(ct_gpu(), relu_bwd, N, dx, dy, out));
  AX_ASSERT_OK(AX_K(ct_gpu(), relu_bwd, N, dx, dy, dy));
  ct_down(a, out, N * 4);
  ct_down(b, dy, N * 4);
  assert_memory_equal(a, b, N * 4);
  AX_ASSERT_OK(AX_K(ct_gpu(), relu_fwd, 0, NULL, NULL)); /* n == 0 */
  ct_free(dx);
  ct_free(dy);
  ct_free(out);
  free(x);
  free(g);
  free(a);
  free(b);
}

/* The mask is ax_dropout_uniform(seed, i) >= p on both backends and the
 * scale is computed on the host: forward and backward give identical bits,
 * for several p, seeds and first counters; p outside [0, 1) is AX_EINVAL. */
static void dropout_bit_identical(void **state) {
  const float ps[] = {0.0f, 0.1f, 0.5f, 0.9f};
  const uint64_t seeds[] = {1, 12345, 0xdeadbeefcafef00dull};
  float *x = ct_randn(31, N, 1), *ref = malloc(N * 4), *got = malloc(N * 4);
  float *dx = ct_up(x, N * 4), *dy = ct_up(x, N * 4);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++) {
      uint64_t first = j * 1000003u; /* a part's counters (parallel.h) */
      AX_ASSERT_OK(
          AX_K(ct_cpu(), dropout_fwd, N, x, ref, ps[i], seeds[j], first));
      AX_ASSERT_OK(
          AX_K(ct_gpu(), dropout_fwd, N, dx, dy, ps[i], seeds[j], first));
      ct_down(got, dy, N * 4);
      assert_memory_equal(got, ref, N * 4);
      AX_ASSERT_OK(
          AX_K(ct_cpu(), dropout_bwd, N, x, ref, ps[i], seeds[j], first));
      AX_ASSERT_OK(
          AX_K(ct_gpu(), dropout_bwd, N, dx, dy, ps[i], seeds[j], first));
      ct_down(got, dy, N * 4);
      assert_memory_equal(got, ref, N * 4);
    }
  AX_ASSERT_ERR(AX_K(ct_gpu(), dropout_fwd, N, dx, dy, 1.0f, 1, 0), AX_EINVAL);
  AX_ASSERT_ERR(AX_K(ct_gpu(), dropout_bwd, N, dx, dy, -0.1f, 1, 0), AX_EINVAL);
  ct_free(dx);
  ct_free(dy);
  free(x);
  free(ref);
  free(got);
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
    float *w = ct_randn(40 + t, OPT_N, 1), *mom = calloc(OPT_N, 4);
    float *dw = ct_up(w, OPT_N * 4), *dm = ct_up(mom, OPT_N * 4);
    float *pm = sc.momentum != 0.0f ? mom : NULL;
    float *pdm = sc.momentum != 0.0f ? dm : NULL;
    for (int step = 0; step < 4; step++) {
      float *g = ct_randn(50 + 10 * t + step, OPT_N, 1),
            *dg = ct_up(g, OPT_N * 4);
      AX_ASSERT_OK(AX_K(ct_cpu(), sgd_step, OPT_N, w, g, pm, sc.lr, sc.momentum,
                        sc.dampening, sc.wd, sc.nesterov, step == 0));
      AX_ASSERT_OK(AX_K(ct_gpu(), sgd_step, OPT_N, dw, dg, pdm, sc.lr,
                        sc.momentum, sc.dampening, sc.wd, sc.nesterov,
                        step == 0));
      ct_down(gw, dw, OPT_N * 4);
      ct_expect_close("sgd w", gw, w, OPT_N, OPT_ATOL, OPT_RTOL);
      if (pm) {
        ct_down(gm, dm, OPT_N * 4);
        ct_expect_close("sgd momentum", gm, mom, OPT_N, OPT_ATOL, OPT_RTOL);
      }
      ct_free(dg);
      free(g);
    }
    ct_free(dw);
    ct_free(dm);
    free(w);
    free(mom);
  }
  AX_ASSERT_ERR(
      AX_K(ct_gpu(), sgd_step, 4, gw, gw, NULL, 0.1f, 0.9f, 0.0f, 0.0f, 0, 1),
      AX_EINVAL);
  free(gw);
  free(gm);
}

/* Six AdamW steps (step counts from 1), a new gradient each; w, m and v
 * compared after every step. Gradients of scale 1e-3 reach the regime
 * where eps matters in denom. */
static void adamw_steps(void **state) {
  const float gscale[] = {1.0f, 1e-3f};
  float *gw = malloc(OPT_N * 4), *gmv = malloc(OPT_N * 4);
  for (int t = 0; t < 2; t++) {
    float *w = ct_randn(60 + t, OPT_N, 1);
    float *m = calloc(OPT_N, 4), *v = calloc(OPT_N, 4);
    float *dw = ct_up(w, OPT_N * 4), *dm = ct_up(m, OPT_N * 4),
          *dv = ct_up(v, OPT_N * 4);
    for (int step = 1; step <= 6; step++) {
      float *g = ct_randn(70 + 10 * t + step, OPT_N, gscale[t]),
            *dg = ct_up(g, OPT_N * 4);
      AX_ASSERT_OK(AX_K(ct_cpu(), adamw_step, OPT_N, w, g, m, v, 1e-3f, 0.9f,
                        0.999f, 1e-8f, 1e-2f, step));
      AX_ASSERT_OK(AX_K(ct_gpu(), adamw_step, OPT_N, dw, dg, dm, dv, 1e-3f,
                        0.9f, 0.999f, 1e-8f, 1e-2f, step));
      ct_down(gw, dw, OPT_N * 4);
      ct_expect_close("adamw w", gw, w, OPT_N, OPT_ATOL, OPT_RTOL);
      ct_down(gmv, dm, OPT_N * 4);
      ct_expect_close("adamw m", gmv, m, OPT_N, OPT_ATOL * gscale[t], OPT_RTOL);
      ct_down(gmv, dv, OPT_N * 4);
      ct_expect_close("adamw v", gmv, v, OPT_N,
                      OPT_ATOL * gscale[t] * gscale[t], OPT_RTOL);
      ct_free(dg);
      free(g);
    }
    ct_free(dw);
    ct_free(dm);
    ct_free(dv);
    free(w);
    free(m);
    free(v);
  }
  AX_ASSERT_ERR(AX_K(ct_gpu(), adamw_step, 4, gw, gw, gw, gw, 1e-3f, 0.9f,
                     0.999f, 1e-8f, 0.0f, 0),
                AX_EINVAL);
  free(gw);
  free(gmv);
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
