/* Finite-difference gradient checks on the GPU (cuda:0): the layers with
 * their own CUDA kernels and the three models end to end, each net, its
 * inputs and every probe on the device (ax_test_gradcheck_on). The step
 * sizes and tolerances are the CPU checks' (tests/test_layers_*.c,
 * test_resnet20.c, test_bert.c): FP32 on both, the GPU kernels' different
 * summation orders are far below the central-difference error. Exits 77
 * (skipped) without a GPU. */
#include <stdlib.h>

#include "axon/models/layers/basic.h"
#include "axon/models/layers/transformer.h"
#include "axon/models/layers/vision.h"
#include "axon/models/model.h"
#include "harness.h"

#define CUDA0 ((ax_device){AX_DEV_CUDA, 0})

static ax_tensor *randn4(uint64_t seed, int64_t n, int64_t c, int64_t h,
                         int64_t w) {
  int64_t shape[4] = {n, c, h, w};
  return ax_test_randn(seed, 1.0f, 4, shape);
}

/* Checks m on one f32 input (released). */
static void check1(ax_module *m, ax_tensor *x, double eps, double atol,
                   double rtol) {
  assert_non_null(m);
  ax_tlist in = ax_tlist1(x);
  ax_test_gradcheck_on(CUDA0, m, &in, 1, 40, eps, atol, rtol);
  ax_tensor_release(x);
}

/* Every block of model `name` with settings `over`, in one sequential. */
static ax_module *whole(const char *name, const char *over) {
  const ax_model_def *def = ax_model_find(name);
  assert_non_null(def);
  ax_config cfg;
  AX_ASSERT_OK(ax_model_config(def, over, &cfg));
  ax_model_info info;
  AX_ASSERT_OK(def->describe(&cfg, &info));
  ax_module *root = ax_sequential_new();
  for (int i = 0; i < info.n_blocks; i++) {
    ax_module *b;
    AX_ASSERT_OK(def->build_block(&cfg, i, &b));
    AX_ASSERT_OK(ax_module_add(root, b));
  }
  return root;
}

static void vision_layers(void **state) {
  check1(ax_conv2d_new(3, 4, 3, 1, 1, 1), randn4(1, 2, 3, 6, 5), 1e-2, 1e-3,
         1e-2);
  check1(ax_conv2d_new(3, 4, 3, 2, 0, 0), randn4(2, 2, 3, 7, 7), 1e-2, 1e-3,
         1e-2);
  check1(ax_batchnorm2d_new(3, 0.1f, 1e-5f), randn4(4, 3, 3, 3, 2), 1e-2, 2e-3,
         2e-2);
  check1(ax_maxpool2d_new(2, 2, 0), randn4(5, 2, 3, 4, 4), 1e-3, 1e-3, 1e-2);
  check1(ax_avgpool2d_new(3, 2, 1), randn4(6, 2, 3, 5, 5), 1e-2, 1e-3, 1e-2);
}

static void transformer_layers(void **state) {
  int64_t shape[3] = {2, 5, 8};
  check1(ax_layernorm_new(8, 1e-12f), ax_test_randn(7, 1.0f, 3, shape), 1e-2,
         2e-3, 2e-2);
  check1(ax_linear_new(8, 6, 1), ax_test_randn(8, 1.0f, 3, shape), 1e-2, 1e-3,
         1e-2);
}

static void mlp_model(void **state) {
  int64_t shape[4] = {3, 1, 3, 4};
  check1(whole("mlp", "widths=12/8/6/3"), ax_test_randn(3, 1.0f, 4, shape),
         1e-3, 1e-3, 1e-2);
}

static void resnet20_model(void **state) {
  check1(whole("resnet20", "in_channels=2,classes=5"), randn4(3, 2, 2, 8, 8),
         1e-3, 1e-2, 5e-2);
}

static void bert_model(void **state) {
  ax_module *root = whole(
      "bert", "layers=2,hidden=16,heads=2,ff=32,vocab=50,seq=8,dropout=0");
  int64_t shape[2] = {2, 8};
  ax_tlist in = {0};
  in.n = 3;
  in.t[0] = ax_test_randint(31, 0, 50, 2, shape);
  in.t[1] = ax_test_randint(32, 0, 2, 2, shape);
  in.t[2] = ax_tensor_new(AX_F32, 2, shape, AX_CPU);
  for (int i = 0; i < 16; i++) /* sequence 1 ends with 3 padded tokens */
    ax_f32(in.t[2])[i] = i >= 13 ? 0.0f : 1.0f;
  ax_test_gradcheck_on(CUDA0, root, &in, 0, 80, 3e-3, 2e-3, 3e-2);
  ax_tlist_clear(&in);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(vision_layers), cmocka_unit_test(transformer_layers),
      cmocka_unit_test(mlp_model),     cmocka_unit_test(resnet20_model),
      cmocka_unit_test(bert_model),
  };
  return AX_CUDA_TEST_MAIN(tests);
}
