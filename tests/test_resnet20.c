/* ResNet20: blocks, parameter count, a whole-model gradient check and the
 * equivalence of a two-stage split with the whole model. */
#include <math.h>
#include <string.h>

#include "axon/models/model.h"
#include "harness.h"

static const ax_model_def *resnet(ax_config *cfg, const char *overrides) {
  const ax_model_def *def = ax_model_find("resnet20");
  assert_non_null(def);
  AX_ASSERT_OK(ax_model_config(def, overrides, cfg));
  return def;
}

static void blocks_and_names(void **state) {
  ax_config cfg;
  const ax_model_def *def = resnet(&cfg, "");
  ax_model_info info;
  AX_ASSERT_OK(def->describe(&cfg, &info));
  assert_int_equal(info.n_blocks, 11);
  assert_string_equal(info.block_names[0], "stem");
  assert_string_equal(info.block_names[1], "block1");
  assert_string_equal(info.block_names[9], "block9");
  assert_string_equal(info.block_names[10], "head");
  assert_int_equal(info.n_outputs, 1);
  assert_int_equal(info.ignore_index, -100);
  assert_int_equal(ax_config_int(&cfg, "in_channels", 0, NULL), 1);
  assert_int_equal(ax_config_int(&cfg, "classes", 0, NULL), 10);
  assert_int_equal(ax_config_int(&cfg, "image", 0, NULL), 32);
  ax_module *b;
  AX_ASSERT_ERR(def->build_block(&cfg, 11, &b), AX_EINVAL);
  AX_ASSERT_OK(ax_model_config(def, "classes=0", &cfg));
  AX_ASSERT_ERR(def->describe(&cfg, &info), AX_EINVAL);
}

/* 0.27M parameters as in the paper, and a (B, 3, 32, 32) -> (B, 10) pass. */
static void parameter_count_and_shapes(void **state) {
  ax_config cfg;
  const ax_model_def *def = resnet(&cfg, "in_channels=3,classes=10");
  ax_net *net;
  AX_ASSERT_OK(ax_model_stage(def, &cfg, 0, 11, AX_CPU, 1, &net));
  assert_int_equal(net->n_params, 272474);
  /* Running mean and variance of 16 + 6*16 + 7*32 + 7*64 channels. */
  assert_int_equal(net->n_buffers, 2 * (16 + 6 * 16 + 7 * 32 + 7 * 64));
  int64_t shape[4] = {3, 3, 32, 32};
  ax_tensor *x = ax_test_randn(1, 1.0f, 4, shape);
  ax_tlist in = ax_tlist1(x), out = {0};
  ax_slot *slot = ax_slot_new();
  AX_ASSERT_OK(ax_net_forward(net, slot, 1, 0, &in, &out));
  assert_int_equal(out.n, 1);
  assert_int_equal(out.t[0]->ndim, 2);
  assert_int_equal(out.t[0]->shape[0], 3);
  assert_int_equal(out.t[0]->shape[1], 10);
  for (int i = 0; i < 30; i++)
    assert_true(isfinite(ax_f32(out.t[0])[i]));
  ax_tlist_clear(&out);
  ax_slot_free(slot);
  ax_tensor_release(x);
  ax_net_free(net);
}

static void whole_model_gradcheck(void **state) {
  ax_config cfg;
  const ax_model_def *def = resnet(&cfg, "in_channels=2,classes=5");
  ax_module *root = ax_sequential_new();
  for (int i = 0; i < 11; i++) {
    ax_module *b;
    AX_ASSERT_OK(def->build_block(&cfg, i, &b));
    AX_ASSERT_OK(ax_module_add(root, b));
  }
  /* 8x8 images keep a 2x2 plane (8 values per channel) in the last stage. */
  int64_t shape[4] = {2, 2, 8, 8};
  ax_tensor *x = ax_test_randn(3, 1.0f, 4, shape);
  ax_tlist in = ax_tlist1(x);
  ax_test_gradcheck(root, &in, 1, 60, 1e-3, 1e-2, 5e-2);
  ax_tensor_release(x);
}

/* Runs net forward (training) and backward with dy; returns the output. */
static ax_tensor *run(ax_net *net, ax_slot *slot, ax_tensor *x, ax_tensor **dy,
                      ax_tensor **dx) {
  ax_tlist in = ax_tlist1(x), out = {0}, din = {0};
  AX_ASSERT_OK(ax_net_forward(net, slot, 1, 0, &in, &out));
  if (!*dy) {
    *dy = ax_tensor_like(out.t[0]);
    ax_rng r;
    ax_rng_seed(&r, 77);
    for (size_t i = 0; i < ax_tensor_numel(*dy); i++)
      ax_f32(*dy)[i] = (float)ax_rng_normal(&r);
  }
  ax_tlist dout = ax_tlist1(*dy);
  AX_ASSERT_OK(ax_net_backward(net, slot, 0, dx != NULL, &dout, &din));
  if (dx)
    *dx = din.t[0];
  else
    ax_tlist_clear(&din);
  return out.t[0];
}

/* Blocks [0, 4) + [4, 11) compute what the whole model computes: same
 * initial parameters, outputs, gradients and running statistics. */
static void split_matches_whole(void **state) {
  ax_config cfg;
  const ax_model_def *def = resnet(&cfg, "in_channels=3");
  ax_net *whole, *s0, *s1;
  AX_ASSERT_OK(ax_model_stage(def, &cfg, 0, 11, AX_CPU, 5, &whole));
  AX_ASSERT_OK(ax_model_stage(def, &cfg, 0, 4, AX_CPU, 5, &s0));
  AX_ASSERT_OK(ax_model_stage(def, &cfg, 4, 11, AX_CPU, 5, &s1));
  assert_int_equal(s0->n_params + s1->n_params, whole->n_params);
  assert_int_equal(s0->n_buffers + s1->n_buffers, whole->n_buffers);
  const float *pw = ax_f32(whole->params);
  assert_memory_equal(pw, ax_f32(s0->params), s0->n_params * 4);
  assert_memory_equal(pw + s0->n_params, ax_f32(s1->params), s1->n_params * 4);

  int64_t shape[4] = {4, 3, 32, 32};
  ax_tensor *x = ax_test_randn(9, 1.0f, 4, shape);
  ax_slot *sw = ax_slot_new(), *a = ax_slot_new(), *b = ax_slot_new();
  ax_tensor *dy = NULL, *dmid = NULL;
  ax_tensor *yw = run(whole, sw, x, &dy, NULL);
  /* Stage 0 forward, stage 1 forward + backward, stage 0 backward. */
  ax_tlist in = ax_tlist1(x), mid = {0}, din = {0};
  AX_ASSERT_OK(ax_net_forward(s0, a, 1, 0, &in, &mid));
  ax_tensor *ys = run(s1, b, mid.t[0], &dy, &dmid);
  ax_tlist dm = ax_tlist1(dmid);
  AX_ASSERT_OK(ax_net_backward(s0, a, 0, 0, &dm, &din));
  ax_tlist_clear(&din);

  size_t ny = ax_tensor_numel(yw);
  assert_true(ax_test_close_ratio(ax_f32(ys), ax_f32(yw), ny, 1e-5, 1e-5) <=
              1.0);
  const float *gw = ax_f32(whole->grads);
  assert_true(ax_test_close_ratio(ax_f32(s0->grads), gw, s0->n_params, 1e-4,
                                  1e-3) <= 1.0);
  assert_true(ax_test_close_ratio(ax_f32(s1->grads), gw + s0->n_params,
                                  s1->n_params, 1e-4, 1e-3) <= 1.0);
  const float *bw = ax_f32(whole->buffers);
  assert_true(ax_test_close_ratio(ax_f32(s0->buffers), bw, s0->n_buffers, 1e-6,
                                  1e-5) <= 1.0);
  assert_true(ax_test_close_ratio(ax_f32(s1->buffers), bw + s0->n_buffers,
                                  s1->n_buffers, 1e-6, 1e-5) <= 1.0);

  ax_tensor_release(yw);
  ax_tensor_release(ys);
  ax_tensor_release(dy);
  ax_tensor_release(dmid);
  ax_tlist_clear(&mid);
  ax_slot_free(sw);
  ax_slot_free(a);
  ax_slot_free(b);
  ax_tensor_release(x);
  ax_net_free(whole);
  ax_net_free(s0);
  ax_net_free(s1);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(blocks_and_names),
      cmocka_unit_test(parameter_count_and_shapes),
      cmocka_unit_test(whole_model_gradcheck),
      cmocka_unit_test(split_matches_whole),
  };
  return AX_TEST_MAIN(t);
}
