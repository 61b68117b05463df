/* Gradient checks, batch-norm statistics and shape errors of the vision
 * layers (models/layers/vision.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "axon/models/layers/vision.h"
#include "harness.h"

static ax_tensor *randn4(uint64_t seed, int64_t n, int64_t c, int64_t h,
                         int64_t w) {
  int64_t shape[4] = {n, c, h, w};
  return ax_test_randn(seed, 1.0f, 4, shape);
}

static void gradcheck1(ax_module *m, ax_tensor *x, double eps, double atol,
                       double rtol) {
  assert_non_null(m);
  ax_tlist in = ax_tlist1(x);
  ax_test_gradcheck(m, &in, 1, 40, eps, atol, rtol);
  ax_tensor_release(x);
}

static void conv2d_gradcheck(void **state) {
  gradcheck1(ax_conv2d_new(3, 4, 3, 1, 1, 1), randn4(1, 2, 3, 6, 5), 1e-2, 1e-3,
             1e-2);
  gradcheck1(ax_conv2d_new(3, 4, 3, 2, 0, 0), randn4(2, 2, 3, 7, 7), 1e-2, 1e-3,
             1e-2);
  gradcheck1(ax_conv2d_new(4, 2, 1, 2, 0, 1), randn4(3, 2, 4, 5, 5), 1e-2, 1e-3,
             1e-2);
}

static void batchnorm_gradcheck(void **state) {
  gradcheck1(ax_batchnorm2d_new(3, 0.1f, 1e-5f), randn4(4, 3, 3, 3, 2), 1e-2,
             2e-3, 2e-2);
  int64_t shape[2] = {5, 4}; /* (N, C) input */
  gradcheck1(ax_batchnorm2d_new(4, 0.1f, 1e-5f),
             ax_test_randn(5, 1.0f, 2, shape), 1e-2, 2e-3, 2e-2);
  /* With the ReLU fused (its kinks are away from the probes for this seed). */
  gradcheck1(ax_batchnorm2d_relu_new(3, 0.1f, 1e-5f), randn4(4, 3, 3, 3, 2),
             1e-2, 2e-3, 2e-2);
}

/* Distinct values spaced well beyond eps, so no window's maximum changes
 * under a probe. */
static ax_tensor *spaced4(uint64_t seed, int64_t n, int64_t c, int64_t h,
                          int64_t w) {
  ax_tensor *x = randn4(seed, n, c, h, w);
  size_t cnt = ax_tensor_numel(x);
  int32_t *perm = malloc(cnt * sizeof *perm);
  for (size_t i = 0; i < cnt; i++)
    perm[i] = (int32_t)i;
  ax_rng r;
  ax_rng_seed(&r, seed);
  ax_rng_shuffle_i32(&r, perm, (int64_t)cnt);
  for (size_t i = 0; i < cnt; i++)
    ax_f32(x)[i] = 0.05f * (float)perm[i] - 1.0f;
  free(perm);
  return x;
}

static void pool_gradcheck(void **state) {
  gradcheck1(ax_maxpool2d_new(2, 2, 0), spaced4(6, 2, 3, 6, 6), 1e-3, 1e-3,
             1e-2);
  gradcheck1(ax_maxpool2d_new(3, 2, 1), spaced4(7, 2, 2, 7, 5), 1e-3, 1e-3,
             1e-2);
  gradcheck1(ax_avgpool2d_new(3, 2, 1), randn4(8, 2, 3, 7, 6), 1e-2, 1e-3,
             1e-2);
  gradcheck1(ax_global_avgpool_new(), randn4(9, 3, 4, 5, 3), 1e-2, 1e-3, 1e-2);
}

static void basic_block_gradcheck(void **state) {
  /* Identity shortcut. */
  gradcheck1(ax_basic_block_new(4, 4, 1), randn4(10, 2, 4, 6, 6), 1e-3, 5e-3,
             3e-2);
  /* Projection shortcut: 1x1 convolution with stride 2 and batch norm. */
  gradcheck1(ax_basic_block_new(3, 4, 2), randn4(11, 2, 3, 6, 6), 1e-3, 5e-3,
             3e-2);
}

static void basic_block_layout(void **state) {
  ax_module *id = ax_basic_block_new(16, 16, 1);
  ax_module *pr = ax_basic_block_new(16, 32, 2);
  assert_int_equal(id->n_children, 4);
  assert_int_equal(pr->n_children, 6);
  size_t np, nb;
  ax_module_layout(id, 0, 0, &np, &nb);
  assert_int_equal(np, 2 * 16 * 16 * 9 + 4 * 16);
  assert_int_equal(nb, 4 * 16);
  ax_module_layout(pr, 0, 0, &np, &nb);
  assert_int_equal(np, 16 * 32 * 9 + 32 * 32 * 9 + 16 * 32 + 6 * 32);
  assert_int_equal(nb, 6 * 32);
  ax_module_free(id);
  ax_module_free(pr);
}

/* Training forward updates the running statistics with the momentum and
 * the unbiased variance; evaluation then uses them. */
static void batchnorm_running_stats(void **state) {
  const int C = 2;
  const float mom = 0.25f, eps = 1e-5f;
  ax_net *net = ax_net_new(ax_batchnorm2d_new(C, mom, eps), AX_CPU, 1);
  assert_non_null(net);
  assert_int_equal(net->n_params, 2 * C);
  assert_int_equal(net->n_buffers, 2 * C);
  float *p = ax_f32(net->params), *buf = ax_f32(net->buffers);
  /* Initial values: gamma 1, beta 0, mean 0, var 1. */
  assert_true(p[0] == 1 && p[1] == 1 && p[2] == 0 && p[3] == 0);
  assert_true(buf[0] == 0 && buf[1] == 0 && buf[2] == 1 && buf[3] == 1);
  p[0] = 2.0f, p[1] = 0.5f, p[2] = 1.0f, p[3] = -1.0f;
  /* x (2, 2, 1, 2): channel 0 = {1, 2, 3, 6}, channel 1 = {0, 4, -4, 8}. */
  int64_t shape[4] = {2, C, 1, 2};
  ax_tensor *x = ax_tensor_new(AX_F32, 4, shape, AX_CPU);
  const float xv[8] = {1, 2, 0, 4, 3, 6, -4, 8};
  memcpy(ax_f32(x), xv, sizeof xv);
  ax_tlist in = ax_tlist1(x), out = {0};
  ax_slot *slot = ax_slot_new();
  AX_ASSERT_OK(ax_net_forward(net, slot, 1, 0, &in, &out));
  /* Channel 0: mean 3, biased var 3.5, unbiased 14/3. Channel 1: mean 2,
   * biased var 20, unbiased 80/3. */
  AX_ASSERT_CLOSE(buf[0], 0.25 * 3, 1e-6, 1e-6);
  AX_ASSERT_CLOSE(buf[1], 0.25 * 2, 1e-6, 1e-6);
  AX_ASSERT_CLOSE(buf[2], 0.75 + 0.25 * 14.0 / 3.0, 1e-6, 1e-6);
  AX_ASSERT_CLOSE(buf[3], 0.75 + 0.25 * 80.0 / 3.0, 1e-6, 1e-6);
  /* y = gamma (x - mean) / sqrt(var + eps) + beta with batch statistics. */
  const float *y = ax_f32(out.t[0]);
  AX_ASSERT_CLOSE(y[0], 2.0 * (1 - 3) / sqrt(3.5 + eps) + 1.0, 1e-5, 1e-5);
  AX_ASSERT_CLOSE(y[7], 0.5 * (8 - 2) / sqrt(20 + eps) - 1.0, 1e-5, 1e-5);
  ax_tlist_clear(&out);

  /* A recompute forward (update_stats = 0) leaves them alone. */
  float before[4];
  memcpy(before, buf, sizeof before);
  ax_exec ex = ax_net_exec(net, 1);
  ex.update_stats = 0;
  AX_ASSERT_OK(ax_forward(net->root, &ex, slot, &in, &out));
  assert_memory_equal(before, buf, sizeof before);
  ax_tlist_clear(&out);

  /* Evaluation normalises with the running statistics. */
  AX_ASSERT_OK(ax_net_forward(net, slot, 0, 0, &in, &out));
  y = ax_f32(out.t[0]);
  for (int i = 0; i < 8; i++) {
    int c = (i / 2) % C;
    double ref =
        p[c] * (xv[i] - before[c]) / sqrt(before[C + c] + eps) + p[C + c];
    AX_ASSERT_CLOSE(y[i], ref, 1e-5, 1e-5);
  }
  assert_memory_equal(before, buf, sizeof before);
  ax_tlist_clear(&out);
  /* An eval-mode forward has no backward. */
  ax_tensor *dy = ax_tensor_like(x);
  ax_tlist dout = ax_tlist1(dy), din = {0};
  AX_ASSERT_ERR(ax_net_backward(net, slot, 0, 1, &dout, &din), AX_EUNSUPPORTED);
  ax_tensor_release(dy);
  ax_slot_free(slot);
  ax_tensor_release(x);
  ax_net_free(net);
}

/* Runs a training forward of m on x and expects `code`, with a message
 * naming `name` and, for shape errors, the offending shape. */
static void expect_forward_error(ax_module *m, ax_tensor *x, int code,
                                 const char *name, const char *shape) {
  assert_non_null(m);
  ax_net *net = ax_net_new(m, AX_CPU, 1);
  assert_non_null(net);
  ax_tlist in = ax_tlist1(x), out = {0};
  ax_slot *slot = ax_slot_new();
  AX_ASSERT_ERR(ax_net_forward(net, slot, 1, 0, &in, &out), code);
  assert_int_equal(out.n, 0);
  if (!strstr(ax_errmsg(), name) || (shape && !strstr(ax_errmsg(), shape)))
    fail_msg("message '%s' should name %s and %s", ax_errmsg(), name,
             shape ? shape : "");
  ax_slot_free(slot);
  ax_tensor_release(x);
  ax_net_free(net);
}

static void wrong_shapes(void **state) {
  expect_forward_error(ax_conv2d_new(3, 4, 3, 1, 1, 0), randn4(1, 2, 2, 5, 5),
                       AX_ESHAPE, "conv2d", "(2, 2, 5, 5)");
  expect_forward_error(ax_conv2d_new(3, 4, 5, 1, 0, 0), randn4(1, 2, 3, 4, 4),
                       AX_ESHAPE, "conv2d", "(2, 3, 4, 4)");
  expect_forward_error(ax_batchnorm2d_new(3, 0.1f, 1e-5f),
                       randn4(1, 2, 4, 2, 2), AX_ESHAPE, "batchnorm2d",
                       "(2, 4, 2, 2)");
  expect_forward_error(ax_batchnorm2d_new(3, 0.1f, 1e-5f),
                       randn4(1, 1, 3, 1, 1), AX_ESHAPE, "batchnorm2d", NULL);
  int64_t s3[3] = {2, 3, 4};
  expect_forward_error(ax_maxpool2d_new(2, 2, 0), ax_test_randn(1, 1, 3, s3),
                       AX_ESHAPE, "maxpool2d", "(2, 3, 4)");
  expect_forward_error(ax_avgpool2d_new(3, 2, 0), randn4(1, 1, 1, 2, 2),
                       AX_ESHAPE, "avgpool2d", NULL);
  expect_forward_error(ax_global_avgpool_new(), ax_test_randn(1, 1, 3, s3),
                       AX_ESHAPE, "global_avgpool", "(2, 3, 4)");
  expect_forward_error(ax_basic_block_new(4, 8, 2), randn4(1, 2, 3, 8, 8),
                       AX_ESHAPE, "basic_block", "(2, 3, 8, 8)");
}

static void bad_configs(void **state) {
  assert_null(ax_conv2d_new(0, 4, 3, 1, 1, 0));
  assert_non_null(strstr(ax_errmsg(), "conv2d"));
  assert_null(ax_conv2d_new(3, 4, 3, 0, 1, 0));
  assert_null(ax_batchnorm2d_new(0, 0.1f, 1e-5f));
  assert_null(ax_batchnorm2d_new(4, 1.5f, 1e-5f));
  assert_null(ax_maxpool2d_new(2, 2, 2));
  assert_null(ax_avgpool2d_new(0, 1, 0));
  assert_null(ax_basic_block_new(4, 0, 1));
}

/* Inference without a slot works and matches the training-free path. */
static void inference_without_slot(void **state) {
  ax_net *net = ax_net_new(ax_basic_block_new(3, 8, 2), AX_CPU, 3);
  assert_non_null(net);
  ax_tensor *x = randn4(12, 2, 3, 8, 8);
  ax_tlist in = ax_tlist1(x), out = {0};
  AX_ASSERT_OK(ax_net_forward(net, NULL, 0, 0, &in, &out));
  assert_int_equal(out.t[0]->ndim, 4);
  assert_int_equal(out.t[0]->shape[1], 8);
  assert_int_equal(out.t[0]->shape[2], 4);
  ax_tlist_clear(&out);
  ax_tensor_release(x);
  ax_net_free(net);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(conv2d_gradcheck),
      cmocka_unit_test(batchnorm_gradcheck),
      cmocka_unit_test(pool_gradcheck),
      cmocka_unit_test(basic_block_gradcheck),
      cmocka_unit_test(basic_block_layout),
      cmocka_unit_test(batchnorm_running_stats),
      cmocka_unit_test(wrong_shapes),
      cmocka_unit_test(bad_configs),
      cmocka_unit_test(inference_without_slot),
  };
  return AX_TEST_MAIN(t);
}
