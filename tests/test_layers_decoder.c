/* The GPT layers (models/layers/transformer.h): causal attention on the
 * fused kernel and the pre-LN decoder layer. Finite-difference checks of
 * the whole backward and of each half, the halves equal to the whole
 * backward bit for bit (split_testutil.h), causality (a token changes no
 * output before it), and configuration and shape errors. Their
 * tensor-parallel forms are checked against the whole layer in
 * test_tp_layers.c. */
#include <math.h>
#include <string.h>

#include "axon/models/layers/transformer.h"
#include "harness.h"
#include "split_testutil.h"

#define HID 8
#define HEADS 2
#define FF 16

static ax_module *mk_attn(void) {
  return ax_causal_attn_new(HID, HEADS, 0.2f, 3);
}
static ax_module *mk_decoder(void) {
  return ax_decoder_layer_new(HID, HEADS, FF, 0.1f, 4, 0.01f);
}

static ax_tensor *randn(uint64_t seed, float scale, int B, int S) {
  int64_t shape[3] = {B, S, HID};
  return ax_test_randn(seed, scale, 3, shape);
}

/* Every gradient check of one layer on x: the whole backward, each half,
 * and the halves against the whole on two units (need_dx 0 and 1). */
static void check_grads(ax_module *(*make)(void), ax_tensor *x, double eps,
                        double atol, double rtol) {
  ax_tlist in = ax_tlist1(x);
  ax_test_gradcheck(make(), &in, 1, 60, eps, atol, rtol);
  ax_test_gradcheck_split(make(), &in, 1, 60, eps, atol, rtol);
  ax_tlist u2 = ax_test_other_unit(&in, 1, -0.8f, 0.3f);
  for (int need_dx = 0; need_dx <= 1; need_dx++)
    ax_test_split_matches_fused(make(), &in, &u2, need_dx);
  ax_tlist_clear(&u2);
  ax_tensor_release(x);
}

/* The attention's inputs are scaled up so that, through BERT's 0.02
 * initialisation, its softmax is peaked rather than nearly uniform; the
 * step is then 1e-3, as a weight moved by 1e-2 moves the scores too far
 * for central differences. */
static void attention_grads(void **state) {
  check_grads(mk_attn, randn(7, 20.0f, 2, 5), 1e-3, 1e-3, 2e-2);
}

/* 70 positions: more than one of the kernel's 64-row blocks. */
static void attention_grads_two_blocks(void **state) {
  check_grads(mk_attn, randn(8, 20.0f, 1, 70), 1e-3, 1e-3, 2e-2);
}

static void decoder_grads(void **state) {
  check_grads(mk_decoder, randn(9, 1.0f, 2, 6), 1e-2, 2e-3, 3e-2);
}

/* One training forward (dropout on, seed 11) of a net; its output. */
static ax_tensor *run1(ax_net *net, ax_tensor *x) {
  ax_slot *slot = ax_slot_new();
  ax_tlist in = ax_tlist1(x), out = {0};
  AX_ASSERT_OK(ax_net_forward(net, slot, 1, 11, &in, &out));
  ax_tensor *y = ax_tensor_retain(out.t[0]);
  ax_tlist_clear(&out);
  ax_slot_free(slot);
  return y;
}

/* Changing token j of every sequence (not by a constant, which the
 * decoder's layer norm would remove) leaves the outputs at positions
 * before j as they were, bit for bit, and changes those from j on. With
 * 70 positions the kernel has two query blocks, [0, 64) and [64, 70). */
static void causality_of(ax_module *m, int j) {
  const int B = 2, S = 70;
  ax_net *net = ax_net_new(m, AX_CPU, 3);
  assert_non_null(net);
  ax_tensor *x = randn(10, 1.0f, B, S);
  ax_tensor *y0 = run1(net, x);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < HID; h++)
      ax_f32(x)[((size_t)b * S + j) * HID + h] += h % 2 ? 1.5f : -0.5f;
  ax_tensor *y1 = run1(net, x);
  for (int b = 0; b < B; b++)
    for (int s = 0; s < S; s++) {
      size_t at = ((size_t)b * S + s) * HID;
      int same = !memcmp(ax_f32(y0) + at, ax_f32(y1) + at, HID * 4);
      if (same != (s < j))
        fail_msg("%s: sequence %d position %d %s after token %d changed",
                 m->ops->kind, b, s, same ? "unchanged" : "changed", j);
    }
  ax_tensor_release(x);
  ax_tensor_release(y0);
  ax_tensor_release(y1);
  ax_net_free(net);
}

static void causality(void **state) {
  for (int j = 5; j < 70; j += 61) { /* in the first block, in the second */
    causality_of(mk_attn(), j);
    causality_of(mk_decoder(), j);
  }
}

static void errors(void **state) {
  assert_null(ax_causal_attn_new(10, 3, 0.0f, 0));
  assert_non_null(strstr(ax_errmsg(), "divide"));
  assert_null(ax_causal_attn_new(8, 2, 1.0f, 0));
  assert_null(ax_decoder_layer_new(8, 2, 16, 0.1f, 0, 0.0f)); /* proj_std */
  assert_null(ax_decoder_layer_new(8, 2, 0, 0.1f, 0, 0.02f));
  /* x must be (B, S, hidden). */
  int64_t s7[3] = {2, 4, 7};
  ax_tensor *x7 = ax_test_randn(1, 1.0f, 3, s7);
  ax_module *mods[2] = {mk_attn(), mk_decoder()};
  const char *names[2] = {"causal attention", "decoder"};
  for (int i = 0; i < 2; i++) {
    ax_net *net = ax_net_new(mods[i], AX_CPU, 1);
    ax_slot *slot = ax_slot_new();
    ax_tlist in = ax_tlist1(x7), out = {0};
    AX_ASSERT_ERR(ax_net_forward(net, slot, 1, 0, &in, &out), AX_ESHAPE);
    assert_int_equal(out.n, 0);
    assert_non_null(strstr(ax_errmsg(), names[i]));
    ax_slot_free(slot);
    ax_net_free(net);
  }
  ax_tensor_release(x7);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(attention_grads),
      cmocka_unit_test(attention_grads_two_blocks),
      cmocka_unit_test(decoder_grads),
      cmocka_unit_test(causality),
      cmocka_unit_test(errors),
  };
  return AX_TEST_MAIN(t);
}
