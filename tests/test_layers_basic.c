/* Gradient checks and error cases for Linear, ReLU, Flatten, the MLP model
 * and the cross-entropy loss. */
#include <math.h>
#include <string.h>

#include "axon/models/layers/basic.h"
#include "axon/models/loss.h"
#include "axon/models/model.h"
#include "harness.h"

static void linear_gradcheck(void **state) {
  int64_t shape[3] = {2, 3, 5};
  ax_tensor *x = ax_test_randn(1, 1.0f, 3, shape);
  ax_tlist in = ax_tlist1(x);
  ax_test_gradcheck(ax_linear_new(5, 4, 1), &in, 1, 40, 1e-2, 1e-3, 1e-2);
  ax_tensor_release(x);
}

static void relu_flatten_gradcheck(void **state) {
  int64_t shape[4] = {2, 3, 2, 2};
  ax_tensor *x = ax_test_randn(2, 1.0f, 4, shape);
  ax_module *seq = ax_sequential_new();
  AX_ASSERT_OK(ax_module_add(seq, ax_relu_new()));
  AX_ASSERT_OK(ax_module_add(seq, ax_flatten_new()));
  AX_ASSERT_OK(ax_module_add(seq, ax_linear_new(12, 3, 1)));
  ax_tlist in = ax_tlist1(x);
  ax_test_gradcheck(seq, &in, 1, 40, 1e-3, 1e-3, 1e-2);
  ax_tensor_release(x);
}

static void linear_shape_error(void **state) {
  ax_net *net = ax_net_new(ax_linear_new(5, 4, 1), AX_CPU, 1);
  assert_non_null(net);
  int64_t shape[2] = {2, 6};
  ax_tensor *x = ax_test_randn(1, 1.0f, 2, shape);
  ax_tlist in = ax_tlist1(x), out = {0};
  ax_slot *slot = ax_slot_new();
  AX_ASSERT_ERR(ax_net_forward(net, slot, 1, 0, &in, &out), AX_ESHAPE);
  assert_int_equal(out.n, 0);
  assert_non_null(strstr(ax_errmsg(), "linear"));
  ax_slot_free(slot);
  ax_tensor_release(x);
  ax_net_free(net);
}

static void mlp_model_gradcheck(void **state) {
  const ax_model_def *def = ax_model_find("mlp");
  assert_non_null(def);
  ax_config cfg;
  AX_ASSERT_OK(ax_model_config(def, "widths=12/8/6/3", &cfg));
  ax_model_info info;
  AX_ASSERT_OK(def->describe(&cfg, &info));
  assert_int_equal(info.n_blocks, 3);
  assert_string_equal(info.block_names[2], "head");
  ax_module *root = ax_sequential_new();
  for (int i = 0; i < info.n_blocks; i++) {
    ax_module *b;
    AX_ASSERT_OK(def->build_block(&cfg, i, &b));
    AX_ASSERT_OK(ax_module_add(root, b));
  }
  int64_t shape[4] = {3, 1, 3, 4};
  ax_tensor *x = ax_test_randn(3, 1.0f, 4, shape);
  ax_tlist in = ax_tlist1(x);
  ax_test_gradcheck(root, &in, 1, 60, 1e-3, 1e-3, 1e-2);
  ax_tensor_release(x);
}

static void unknown_model(void **state) {
  assert_null(ax_model_find("resnet9000"));
  assert_non_null(strstr(ax_errmsg(), "resnet9000"));
}

/* Split [0,1)+[1,3) of the MLP equals the whole model, value for value. */
static void mlp_split_matches_whole(void **state) {
  const ax_model_def *def = ax_model_find("mlp");
  ax_config cfg;
  AX_ASSERT_OK(ax_model_config(def, "widths=12/8/6/3", &cfg));
  ax_net *whole, *s0, *s1;
  AX_ASSERT_OK(ax_model_stage(def, &cfg, 0, 3, AX_CPU, 5, &whole));
  AX_ASSERT_OK(ax_model_stage(def, &cfg, 0, 1, AX_CPU, 5, &s0));
  AX_ASSERT_OK(ax_model_stage(def, &cfg, 1, 3, AX_CPU, 5, &s1));
  assert_int_equal(whole->n_params, s0->n_params + s1->n_params);
  int64_t shape[2] = {4, 12};
  ax_tensor *x = ax_test_randn(4, 1.0f, 2, shape);
  ax_tlist in = ax_tlist1(x), a = {0}, mid = {0}, b = {0};
  AX_ASSERT_OK(ax_net_forward(whole, NULL, 0, 0, &in, &a));
  AX_ASSERT_OK(ax_net_forward(s0, NULL, 0, 0, &in, &mid));
  AX_ASSERT_OK(ax_net_forward(s1, NULL, 0, 0, &mid, &b));
  assert_memory_equal(ax_f32(a.t[0]), ax_f32(b.t[0]), 4 * 3 * sizeof(float));
  ax_tlist_clear(&a);
  ax_tlist_clear(&mid);
  ax_tlist_clear(&b);
  ax_tensor_release(x);
  ax_net_free(whole);
  ax_net_free(s0);
  ax_net_free(s1);
}

/* Loss and gradient against hand-computed values, with an ignored row. */
static void xent_values(void **state) {
  int64_t ls[2] = {3, 2};
  ax_tensor *logits = ax_tensor_new(AX_F32, 2, ls, AX_CPU);
  float z[6] = {0, 0, 1, 0, 2, -1};
  memcpy(ax_f32(logits), z, sizeof z);
  int64_t n = 3;
  ax_tensor *labels = ax_tensor_new(AX_I64, 1, &n, AX_CPU);
  int64_t l[3] = {1, -100, 0};
  memcpy(ax_i64(labels), l, sizeof l);
  ax_tlist out = ax_tlist1(logits), lab = ax_tlist1(labels), d = {0};
  ax_loss_result r;
  AX_ASSERT_OK(ax_loss_xent(&out, &lab, -100, NULL, 1.0f, &r, &d));
  double l0 = log(2.0), l2 = log(1 + exp(-3.0));
  AX_ASSERT_CLOSE(r.loss, (l0 + l2) / 2, 1e-6, 1e-6);
  assert_int_equal(r.count[0], 2);
  assert_int_equal(r.correct[0], 1); /* row 0 is a tie (argmax 0), row 2 ok */
  const float *g = ax_f32(d.t[0]);
  AX_ASSERT_CLOSE(g[0], 0.5 * 0.5, 1e-6, 0);
  AX_ASSERT_CLOSE(g[1], 0.5 * -0.5, 1e-6, 0);
  AX_ASSERT_CLOSE(g[2], 0.0, 0, 0);
  double p = 1 / (1 + exp(-3.0));
  AX_ASSERT_CLOSE(g[4], 0.5 * (p - 1), 1e-6, 0);
  ax_tlist_clear(&d);
  /* A label out of range is a clear error. */
  l[0] = 7;
  memcpy(ax_i64(labels), l, sizeof l);
  AX_ASSERT_ERR(ax_loss_xent(&out, &lab, -100, NULL, 1.0f, &r, &d), AX_EINVAL);
  ax_tensor_release(logits);
  ax_tensor_release(labels);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(linear_gradcheck),
      cmocka_unit_test(relu_flatten_gradcheck),
      cmocka_unit_test(linear_shape_error),
      cmocka_unit_test(mlp_model_gradcheck),
      cmocka_unit_test(unknown_model),
      cmocka_unit_test(mlp_split_matches_whole),
      cmocka_unit_test(xent_values),
  };
  return AX_TEST_MAIN(t);
}
