/* Decoding with key/value caches (models/module.h, ax_exec.kv_decode):
 * the outputs of incremental decoding (a prompt, then token by token, then
 * a long chunk that outgrows the cache and spans several of the kernel's
 * blocks) equal a full forward's over the same sequence within 1e-5, for
 * the causal attention layer and a stack of decoder layers; the refusals
 * (training, no slot, a position the cache does not hold). */
#include <string.h>

#include "axon/models/layers/transformer.h"
#include "tests/harness.h"

#define HID 16
#define HEADS 4
#define FF 32

/* x[:, a:b, :] of x (B, S, d) as a new tensor. */
static ax_tensor *positions(const ax_tensor *x, int64_t a, int64_t b) {
  int64_t B = x->shape[0], S = x->shape[1], d = x->shape[2];
  ax_tensor *y = ax_tensor_new_v(AX_F32, AX_CPU, 3, B, b - a, d);
  for (int64_t i = 0; i < B; i++)
    memcpy(ax_f32(y) + i * (b - a) * d, ax_f32(x) + (i * S + a) * d,
           (size_t)((b - a) * d) * sizeof(float));
  return y;
}

static int decode(ax_net *net, ax_slot *slot, int64_t pos, ax_tensor *x,
                  ax_tensor **y) {
  ax_exec ex = ax_net_exec(net, 0);
  ex.kv_decode = 1;
  ex.kv_pos = pos;
  ax_tlist in = ax_tlist1(x), out = {0};
  int rc = ax_forward(net->root, &ex, slot, &in, &out);
  *y = rc == AX_OK ? out.t[0] : NULL;
  return rc;
}

/* The full forward of x, then x decoded in the chunks that end at cuts[],
 * each chunk's output against the full one's rows. */
static void check_cache(ax_module *m, int B, int S, const int *cuts,
                        int ncuts) {
  ax_net *net = ax_net_new(m, AX_CPU, 7);
  assert_non_null(net);
  int64_t shape[3] = {B, S, HID};
  ax_tensor *x = ax_test_randn(11, 3.0f, 3, shape);
  ax_tlist in = ax_tlist1(x), full = {0};
  AX_ASSERT_OK(ax_net_forward(net, NULL, 0, 0, &in, &full));
  ax_slot *slot = ax_slot_new();
  int64_t at = 0;
  for (int c = 0; c < ncuts; at = cuts[c++]) {
    ax_tensor *part = positions(x, at, cuts[c]), *y = NULL;
    AX_ASSERT_OK(decode(net, slot, at, part, &y));
    ax_tensor *want = positions(full.t[0], at, cuts[c]);
    double r = ax_test_close_ratio(ax_f32(y), ax_f32(want),
                                   ax_tensor_numel(want), 1e-5, 1e-5);
    if (r > 1)
      fail_msg("positions %lld..%d: %.3g of the tolerance", (long long)at,
               cuts[c] - 1, r);
    ax_tensor_release(part);
    ax_tensor_release(want);
    ax_tensor_release(y);
  }
  /* position 0 starts again: the same outputs as the first chunk */
  ax_tensor *part = positions(x, 0, 3), *y = NULL;
  AX_ASSERT_OK(decode(net, slot, 0, part, &y));
  ax_tensor *want = positions(full.t[0], 0, 3);
  assert_true(ax_test_close_ratio(ax_f32(y), ax_f32(want),
                                  ax_tensor_numel(want), 1e-5, 1e-5) <= 1);
  ax_tensor_release(part);
  ax_tensor_release(want);
  ax_tensor_release(y);
  ax_slot_free(slot);
  ax_tlist_clear(&full);
  ax_tensor_release(x);
  ax_net_free(net);
}

/* A prompt of 5, eleven single tokens, then 54 at once: 70 positions, the
 * cache grown past its first 16 and the last chunk over two 64-row
 * blocks of the kernel. */
static const int g_cuts[] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 70};
#define NCUTS ((int)(sizeof g_cuts / sizeof g_cuts[0]))

static void attention_cache(void **state) {
  check_cache(ax_causal_attn_new(HID, HEADS, 0.1f, 3), 2, 70, g_cuts, NCUTS);
}

static void decoder_stack_cache(void **state) {
  ax_module *seq = ax_sequential_new();
  AX_ASSERT_OK(ax_module_add(
      seq, ax_decoder_layer_new(HID, HEADS, FF, 0.1f, 4, 0.01f)));
  AX_ASSERT_OK(ax_module_add(
      seq, ax_decoder_layer_new(HID, HEADS, FF, 0.1f, 5, 0.01f)));
  check_cache(seq, 1, 70, g_cuts, NCUTS);
}

static void refusals(void **state) {
  ax_net *net = ax_net_new(ax_causal_attn_new(HID, HEADS, 0, 3), AX_CPU, 7);
  int64_t shape[3] = {2, 4, HID};
  ax_tensor *x = ax_test_randn(12, 1.0f, 3, shape), *y = NULL;
  ax_slot *slot = ax_slot_new();
  ax_exec ex = ax_net_exec(net, 1);
  ex.kv_decode = 1;
  ax_tlist in = ax_tlist1(x), out = {0};
  AX_ASSERT_ERR(ax_forward(net->root, &ex, slot, &in, &out), AX_EINVAL);
  AX_ASSERT_ERR(decode(net, NULL, 0, x, &y), AX_EINVAL);   /* no slot */
  AX_ASSERT_ERR(decode(net, slot, -1, x, &y), AX_EINVAL);  /* position */
  AX_ASSERT_ERR(decode(net, slot, 4, x, &y), AX_ESTATE);   /* empty cache */
  AX_ASSERT_OK(decode(net, slot, 0, x, &y));
  ax_tensor_release(y);
  AX_ASSERT_ERR(decode(net, slot, 3, x, &y), AX_ESTATE);   /* holds 4 */
  ax_tensor *one = positions(x, 0, 1);                     /* B = 2 ... */
  AX_ASSERT_OK(decode(net, slot, 4, one, &y));
  ax_tensor_release(y);
  ax_tensor *b1 = ax_tensor_slice0(one, 0, 1);             /* ... not 1 */
  AX_ASSERT_ERR(decode(net, slot, 5, b1, &y), AX_ESTATE);
  AX_ASSERT_OK(decode(net, slot, 0, b1, &y));              /* anew */
  ax_tensor_release(y);
  ax_tensor_release(b1);
  ax_tensor_release(one);
  ax_slot_free(slot);
  ax_tensor_release(x);
  ax_net_free(net);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(attention_cache),
      cmocka_unit_test(decoder_stack_cache),
      cmocka_unit_test(refusals),
  };
  return AX_TEST_MAIN(tests);
}
