/* The synthetic "sleep" model (models/sleep.c): blocks take the
 * configured time and pass values and gradients through unchanged. */
#include <string.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/models/model.h"
#include "harness.h"

static void timing_and_pass_through(void **state) {
  (void)state;
  const ax_model_def *def = ax_model_find("sleep");
  assert_non_null(def);
  ax_config cfg;
  AX_ASSERT_OK(ax_model_config(def, "fwd_ms=20,bwd_ms=40", &cfg));
  ax_model_info info;
  AX_ASSERT_OK(def->describe(&cfg, &info));
  assert_int_equal(info.n_blocks, 4);
  ax_net *net;
  AX_ASSERT_OK(ax_model_stage(def, &cfg, 1, 2, AX_CPU, 1, &net));
  assert_int_equal(net->n_params, 0);
  int64_t shape[2] = {8, 16};
  ax_tensor *x = ax_test_randn(1, 1.0f, 2, shape);
  ax_tensor *g = ax_test_randn(2, 1.0f, 2, shape);
  ax_tlist in = ax_tlist1(x), dout = ax_tlist1(g), out = {0}, din = {0};
  ax_slot *slot = ax_slot_new();
  double t0 = ax_clock_s();
  AX_ASSERT_OK(ax_net_forward(net, slot, 1, 0, &in, &out));
  double tf = ax_clock_s() - t0;
  assert_true(ax_slot_bytes(slot) == 8 * 16 * 4);
  t0 = ax_clock_s();
  AX_ASSERT_OK(ax_net_backward(net, slot, 0, 1, &dout, &din));
  double tb = ax_clock_s() - t0;
  /* Sleeps never end early; allow generous lateness on a loaded host. */
  assert_true(tf >= 0.020 && tf < 0.020 + 0.030);
  assert_true(tb >= 0.040 && tb < 0.040 + 0.030);
  assert_int_equal(out.n, 1);
  assert_true(out.t[0] != x);
  assert_memory_equal(out.t[0]->data, x->data, 8 * 16 * 4);
  assert_int_equal(din.n, 1);
  assert_memory_equal(din.t[0]->data, g->data, 8 * 16 * 4);
  ax_tlist_clear(&out);
  ax_tlist_clear(&din);
  ax_slot_free(slot);
  ax_net_free(net);
  ax_tensor_release(x);
  ax_tensor_release(g);
}

static void head_and_loss_shapes(void **state) {
  (void)state;
  const ax_model_def *def = ax_model_find("sleep");
  ax_config cfg;
  AX_ASSERT_OK(
      ax_model_config(def, "blocks=2,fwd_ms=1,bwd_ms=1,classes=5", &cfg));
  ax_net *net;
  AX_ASSERT_OK(ax_model_stage(def, &cfg, 0, 2, AX_CPU, 1, &net));
  assert_int_equal(net->n_params, 16 * 5 + 5);
  int64_t shape[2] = {4, 16};
  ax_tensor *x = ax_test_randn(1, 1.0f, 2, shape);
  ax_tlist in = ax_tlist1(x), out = {0}, din = {0};
  ax_slot *slot = ax_slot_new();
  AX_ASSERT_OK(ax_net_forward(net, slot, 1, 0, &in, &out));
  assert_int_equal(out.t[0]->shape[1], 5);
  ax_tensor *g = ax_tensor_like(out.t[0]);
  AX_ASSERT_OK(ax_tensor_fill(g, 1.0f));
  ax_tlist dout = ax_tlist1(g);
  AX_ASSERT_OK(ax_net_backward(net, slot, 0, 1, &dout, &din));
  assert_int_equal(din.t[0]->shape[1], 16);
  /* The head's bias gradient is the batch sum of ones. */
  const float *gr = ax_f32(net->grads);
  assert_true(gr[16 * 5] == 4.0f);
  ax_tlist_clear(&out);
  ax_tlist_clear(&din);
  ax_tensor_release(g);
  ax_tensor_release(x);
  ax_slot_free(slot);
  ax_net_free(net);
  /* Bad configurations. */
  AX_ASSERT_OK(ax_model_config(def, "blocks=0", &cfg));
  AX_ASSERT_ERR(def->describe(&cfg, &(ax_model_info){0}), AX_EINVAL);
  AX_ASSERT_OK(ax_model_config(def, "fwd_ms=-1", &cfg));
  AX_ASSERT_ERR(def->describe(&cfg, &(ax_model_info){0}), AX_EINVAL);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(timing_and_pass_through),
      cmocka_unit_test(head_and_loss_shapes),
  };
  return AX_TEST_MAIN(t);
}
