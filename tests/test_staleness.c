/* The staleness corrections' math (runtime/pipeline/stage/staleness.c) on small
 * CPU vectors, against formulas written here:
 *  - predict along SGD's momentum (w - s lr v) and along AdamW's update
 *    direction (w - s lr (m^ / (sqrt(v^) + eps) + wd w_before));
 *  - a prediction is made once per mini-batch;
 *  - PipeMare's update average, its corrected backward weights with
 *    min(delay, updates) and its step sizes (1 / delay, the warm-up form);
 *  - bad settings are refused, and only the asynchronous modes take a
 *    correction. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/pipeline/schedule/mode.h"
#include "axon/runtime/pipeline/stage/staleness-impl.h"
#include "harness.h"

enum { N = 7 };

static ax_tensor *vec(const double *x) {
  ax_tensor *t = ax_tensor_new_v(AX_F32, AX_CPU, 1, (int64_t)N);
  assert_non_null(t);
  for (int i = 0; i < N; i++)
    ax_f32(t)[i] = (float)x[i];
  return t;
}

/* The gradient of step t, element i: something that changes sign. */
static double grad(int t, int i) { return sin(1.7 * i + 0.9 * t) + 0.1 * i; }

static void assert_close(const ax_tensor *got, const double *want, double tol) {
  for (int i = 0; i < N; i++) {
    double g = ax_f32(got)[i];
    if (fabs(g - want[i]) > tol * (1e-3 + fabs(want[i])))
      fail_msg("element %d: %.9g, want %.9g", i, g, want[i]);
  }
}

/* Runs `steps` updates of w with optimizer o around the correction z. */
static void run_steps(axi_stale *z, ax_optim *o, ax_tensor *w, int steps) {
  for (int t = 0; t < steps; t++) {
    double g[N];
    for (int i = 0; i < N; i++)
      g[i] = grad(t, i);
    ax_tensor *gt = vec(g);
    AX_ASSERT_OK(axi_stale_before_step(z, ax_optim_steps(o), w, -1));
    AX_ASSERT_OK(ax_optim_set_lr_scale(o, z->lr_scale));
    AX_ASSERT_OK(ax_optim_step(o, w, gt));
    AX_ASSERT_OK(axi_stale_after_step(z, w, t));
    ax_tensor_release(gt);
  }
}

static void test_predict_sgd_momentum(void **state) {
  ax_optim_cfg c = ax_optim_defaults(AX_OPT_SGD);
  c.lr = 0.1f;
  c.momentum = 0.9f;
  double w0[N], v[N] = {0}, w[N];
  for (int i = 0; i < N; i++)
    w0[i] = w[i] = 0.5 - 0.1 * i;
  ax_tensor *wt = vec(w0);
  ax_optim *o = ax_optim_new(&c, N, AX_CPU);
  axi_stale z;
  memset(&z, 0, sizeof z);
  axi_stale_clear(&z);
  AX_ASSERT_OK(axi_stale_init(&z, AX_STALE_PREDICT, 3, -1, 0));
  ax_tensor *p = NULL;
  AX_ASSERT_OK(axi_stale_forward(&z, wt, 0, &p)); /* no update yet: w */
  assert_ptr_equal(p, wt);
  ax_tensor_release(p);
  run_steps(&z, o, wt, 4);
  for (int t = 0; t < 4; t++)
    for (int i = 0; i < N; i++) {
      v[i] = t == 0 ? grad(t, i) : 0.9 * v[i] + grad(t, i);
      w[i] -= 0.1 * v[i];
    }
  double want[N];
  for (int i = 0; i < N; i++)
    want[i] = w[i] - 3 * 0.1 * v[i];
  AX_ASSERT_OK(axi_stale_forward(&z, wt, 9, &p));
  assert_close(p, want, 1e-5);
  /* once per mini-batch: a later unit of batch 9 gets the same weights */
  ax_tensor *q = NULL, *other = vec(w0);
  AX_ASSERT_OK(axi_stale_forward(&z, other, 9, &q));
  assert_ptr_equal(p, q);
  ax_tensor_release(q);
  ax_tensor_release(other);
  ax_tensor_release(p);
  axi_stale_clear(&z);
  ax_optim_free(o);
  ax_tensor_release(wt);
}

static void test_predict_adamw(void **state) {
  ax_optim_cfg c = ax_optim_defaults(AX_OPT_ADAMW);
  c.lr = 0.01f;
  c.weight_decay = 0.1f;
  double w[N], m[N] = {0}, v[N] = {0};
  for (int i = 0; i < N; i++)
    w[i] = 0.3 + 0.05 * i;
  ax_tensor *wt = vec(w);
  ax_optim *o = ax_optim_new(&c, N, AX_CPU);
  axi_stale z;
  memset(&z, 0, sizeof z);
  axi_stale_clear(&z);
  AX_ASSERT_OK(axi_stale_init(&z, AX_STALE_PREDICT, 2, -1, 0));
  int T = 3;
  run_steps(&z, o, wt, T);
  double dir[N];
  for (int t = 0; t < T; t++) {
    double b1 = 1 - pow(0.9, t + 1), b2 = 1 - pow(0.999, t + 1);
    for (int i = 0; i < N; i++) {
      double g = grad(t, i);
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      dir[i] = (m[i] / b1) / (sqrt(v[i] / b2) + 1e-8) + 0.1 * w[i];
      w[i] -= 0.01 * dir[i];
    }
  }
  double want[N];
  for (int i = 0; i < N; i++) /* two more steps along AdamW's direction */
    want[i] = w[i] - 2 * 0.01 * dir[i];
  ax_tensor *p = NULL;
  AX_ASSERT_OK(axi_stale_forward(&z, wt, 5, &p));
  assert_close(p, want, 1e-4);
  ax_tensor_release(p);
  axi_stale_clear(&z);
  ax_optim_free(o);
  ax_tensor_release(wt);
}

static void test_pipemare(void **state) {
  ax_optim_cfg c = ax_optim_defaults(AX_OPT_SGD);
  c.lr = 0.2f;
  double w[N], D[N] = {0};
  for (int i = 0; i < N; i++)
    w[i] = 1.0 - 0.2 * i;
  ax_tensor *wt = vec(w);
  ax_optim *o = ax_optim_new(&c, N, AX_CPU);
  axi_stale z;
  memset(&z, 0, sizeof z);
  axi_stale_clear(&z);
  AX_ASSERT_OK(axi_stale_init(&z, AX_STALE_PIPEMARE, 2, 0.5, 0));
  assert_false(axi_stale_stashes(&z));
  ax_tensor *b = NULL;
  AX_ASSERT_OK(axi_stale_backward(&z, wt, 0, &b)); /* nothing to correct */
  assert_ptr_equal(b, wt);
  ax_tensor_release(b);
  int T = 3;
  run_steps(&z, o, wt, T);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < N; i++) {
      double u = -0.2 / 2 * grad(t, i); /* the step size lr / delay */
      w[i] += u;
      D[i] = 0.5 * D[i] + 0.5 * u;
    }
  assert_close(wt, w, 1e-5);
  double want[N];
  for (int steps = 1; steps <= 5; steps += 4) { /* tau = 1, then 2 */
    double tau = steps < 2 ? steps : 2;
    for (int i = 0; i < N; i++)
      want[i] = w[i] - tau * D[i];
    AX_ASSERT_OK(axi_stale_backward(&z, wt, steps, &b));
    assert_close(b, want, 1e-5);
    ax_tensor_release(b);
  }
  /* the forward is the mode's: no prediction */
  AX_ASSERT_OK(axi_stale_forward(&z, wt, 4, &b));
  assert_ptr_equal(b, wt);
  ax_tensor_release(b);
  axi_stale_clear(&z);
  ax_optim_free(o);
  ax_tensor_release(wt);
}

static void test_pipemare_step_sizes(void **state) {
  assert_float_equal(axi_stale_lr_scale(3, 0, 0), 1.0 / 3, 1e-7);
  assert_float_equal(axi_stale_lr_scale(3, 0, 1000), 1.0 / 3, 1e-7);
  assert_float_equal(axi_stale_lr_scale(4, 8, 0), 0.25, 1e-7);
  assert_float_equal(axi_stale_lr_scale(4, 8, 4), 0.5, 1e-7);
  assert_float_equal(axi_stale_lr_scale(4, 8, 8), 1.0, 1e-7);
  assert_float_equal(axi_stale_lr_scale(4, 8, 100), 1.0, 1e-7);
  assert_float_equal(axi_stale_lr_scale(1, 0, 0), 1.0, 0);
  assert_float_equal(axi_stale_lr_scale(0, 0, 0), 1.0, 0);
}

static void test_bad_settings(void **state) {
  axi_stale z;
  memset(&z, 0, sizeof z);
  axi_stale_clear(&z);
  assert_int_equal(axi_stale_init(&z, AX_STALE_COUNT, 1, -1, 0), AX_EINVAL);
  assert_int_equal(axi_stale_init(&z, AX_STALE_PREDICT, -1, -1, 0), AX_EINVAL);
  assert_int_equal(axi_stale_init(&z, AX_STALE_PIPEMARE, 1, 1.0, 0), AX_EINVAL);
  assert_int_equal(axi_stale_init(&z, AX_STALE_PIPEMARE, 1, 0.5, -2),
                   AX_EINVAL);
  assert_int_equal(z.kind, AX_STALE_NONE);
  for (int mode = 0; mode < AX_MODE_COUNT; mode++) {
    int async = mode == AX_MODE_DDG || mode == AX_MODE_FR ||
                mode == AX_MODE_PIPEDREAM || mode == AX_MODE_2BW;
    AX_ASSERT_OK(ax_staleness_check(mode, AX_STALE_NONE, 0.9, 0));
    for (int k = AX_STALE_PREDICT; k < AX_STALE_COUNT; k++)
      assert_int_equal(ax_staleness_check(mode, k, 0.9, 0),
                       async ? AX_OK : AX_EINVAL);
  }
  assert_int_equal(ax_staleness_check(AX_MODE_DDG, 3, 0.9, 0), AX_EINVAL);
  assert_int_equal(ax_staleness_check(AX_MODE_DDG, 2, -0.1, 0), AX_EINVAL);
  assert_int_equal(ax_staleness_check(AX_MODE_DDG, 2, 0.9, -1), AX_EINVAL);
  assert_string_equal(ax_staleness_name(AX_STALE_PIPEMARE), "pipemare");
  assert_string_equal(ax_staleness_name(9), "?");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_predict_sgd_momentum),
      cmocka_unit_test(test_predict_adamw),
      cmocka_unit_test(test_pipemare),
      cmocka_unit_test(test_pipemare_step_sizes),
      cmocka_unit_test(test_bad_settings),
  };
  return AX_TEST_MAIN(tests);
}
