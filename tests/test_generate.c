/* Decoding with key/value caches (models/module.h, ax_exec.kv_decode):
 * the outputs of incremental decoding (a prompt, then token by token, then
 * a long chunk that outgrows the cache and spans several of the kernel's
 * blocks) equal a full forward's over the same sequence within 1e-5, for
 * the causal attention layer, a stack of decoder layers and the whole GPT
 * model (its position embeddings from kv_pos); the refusals (training, no
 * slot, a position the cache does not hold, past the model's seq); the
 * one-process decoder's greedy tokens equal those of full forwards. */
#include <string.h>

#include "axon/models/generate.h"
#include "axon/models/layers/transformer.h"
#include "axon/models/model.h"
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
  AX_ASSERT_OK(
      ax_module_add(seq, ax_decoder_layer_new(HID, HEADS, FF, 0.1f, 4, 0.01f)));
  AX_ASSERT_OK(
      ax_module_add(seq, ax_decoder_layer_new(HID, HEADS, FF, 0.1f, 5, 0.01f)));
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
  AX_ASSERT_ERR(decode(net, NULL, 0, x, &y), AX_EINVAL);  /* no slot */
  AX_ASSERT_ERR(decode(net, slot, -1, x, &y), AX_EINVAL); /* position */
  AX_ASSERT_ERR(decode(net, slot, 4, x, &y), AX_ESTATE);  /* empty cache */
  AX_ASSERT_OK(decode(net, slot, 0, x, &y));
  ax_tensor_release(y);
  AX_ASSERT_ERR(decode(net, slot, 3, x, &y), AX_ESTATE); /* holds 4 */
  ax_tensor *one = positions(x, 0, 1);                   /* B = 2 ... */
  AX_ASSERT_OK(decode(net, slot, 4, one, &y));
  ax_tensor_release(y);
  ax_tensor *b1 = ax_tensor_slice0(one, 0, 1); /* ... not 1 */
  AX_ASSERT_ERR(decode(net, slot, 5, b1, &y), AX_ESTATE);
  AX_ASSERT_OK(decode(net, slot, 0, b1, &y)); /* anew */
  ax_tensor_release(y);
  ax_tensor_release(b1);
  ax_tensor_release(one);
  ax_slot_free(slot);
  ax_tensor_release(x);
  ax_net_free(net);
}

/* ---- the whole model ---------------------------------------------------- */

#define GPT_CFG "layers=2,hidden=32,heads=4,ff=64,seq=40,vocab=50"

static ax_net *gpt_net(void) {
  const ax_model_def *def = ax_model_find("gpt");
  ax_config c;
  ax_model_info info;
  ax_net *net = NULL;
  assert_non_null(def);
  AX_ASSERT_OK(ax_model_config(def, GPT_CFG, &c));
  AX_ASSERT_OK(ax_model_describe(def, &c, &info));
  AX_ASSERT_OK(ax_model_stage(def, &c, 0, info.n_blocks, AX_CPU, 3, &net));
  return net;
}

/* ids[:, a:b] of ids (B, S) as a new tensor. */
static ax_tensor *id_positions(const ax_tensor *ids, int64_t a, int64_t b) {
  int64_t B = ids->shape[0], S = ids->shape[1];
  ax_tensor *y = ax_tensor_new_v(AX_I32, AX_CPU, 2, B, b - a);
  for (int64_t i = 0; i < B; i++)
    memcpy(ax_i32(y) + i * (b - a), ax_i32(ids) + i * S + a,
           (size_t)(b - a) * sizeof(int32_t));
  return y;
}

static void gpt_cache(void **state) {
  ax_net *net = gpt_net();
  enum { B = 2, S = 40, V = 50 };
  int64_t shape[2] = {B, S};
  ax_tensor *ids = ax_test_randint(13, 0, V, 2, shape);
  ax_tlist in = ax_tlist1(ids), full = {0};
  AX_ASSERT_OK(ax_net_forward(net, NULL, 0, 0, &in, &full)); /* (B S, V) */
  static const int cuts[] = {7, 8, 9, 10, 11, 12, 40};
  ax_slot *slot = ax_slot_new();
  int64_t at = 0;
  for (int c = 0; c < 7; at = cuts[c++]) {
    int64_t T = cuts[c] - at;
    ax_tensor *part = id_positions(ids, at, cuts[c]), *y = NULL;
    AX_ASSERT_OK(decode(net, slot, at, part, &y)); /* (B T, V) */
    assert_int_equal(y->shape[0], B * T);
    for (int64_t b = 0; b < B; b++) {
      const float *got = ax_f32(y) + b * T * V,
                  *want = ax_f32(full.t[0]) + (b * S + at) * V;
      double r = ax_test_close_ratio(got, want, (size_t)(T * V), 1e-5, 1e-5);
      if (r > 1)
        fail_msg("sequence %lld, positions %lld..%d: %.3g of the tolerance",
                 (long long)b, (long long)at, cuts[c] - 1, r);
    }
    ax_tensor_release(part);
    ax_tensor_release(y);
  }
  /* the model holds seq = 40 positions: one more is refused */
  ax_tensor *one = id_positions(ids, 0, 1), *y = NULL;
  AX_ASSERT_ERR(decode(net, slot, S, one, &y), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "seq=40"));
  ax_tensor_release(one);
  ax_slot_free(slot);
  ax_tlist_clear(&full);
  ax_tensor_release(ids);
  ax_net_free(net);
}

/* The last row's argmax of full forwards over the growing sequence. */
static int32_t full_argmax(ax_net *net, const int32_t *seq, int n) {
  ax_tensor *ids = ax_tensor_new_v(AX_I32, AX_CPU, 2, 1, n);
  memcpy(ax_i32(ids), seq, (size_t)n * sizeof *seq);
  ax_tlist in = ax_tlist1(ids), out = {0};
  AX_ASSERT_OK(ax_net_forward(net, NULL, 0, 0, &in, &out));
  int V = (int)out.t[0]->shape[1];
  const float *l = ax_f32(out.t[0]) + (size_t)(n - 1) * V;
  int32_t best = 0;
  for (int v = 1; v < V; v++)
    if (l[v] > l[best])
      best = v;
  ax_tlist_clear(&out);
  ax_tensor_release(ids);
  return best;
}

static void gpt_greedy(void **state) {
  ax_net *net = gpt_net();
  int32_t seq[40] = {5, 17, 3, 42}, out[20];
  ax_net_decoder d;
  ax_sampler s;
  AX_ASSERT_OK(ax_net_decoder_init(&d, net));
  AX_ASSERT_OK(ax_sampler_init(&s, 0, 0, 1));
  AX_ASSERT_OK(ax_generate(ax_net_decode, &d, seq, 4, 20, &s, out, NULL, NULL));
  for (int i = 0; i < 20; i++) {
    assert_int_equal(out[i], full_argmax(net, seq, 4 + i));
    seq[4 + i] = out[i];
  }
  ax_net_decoder_free(&d);
  ax_net_free(net);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(attention_cache), cmocka_unit_test(decoder_stack_cache),
      cmocka_unit_test(refusals),        cmocka_unit_test(gpt_cache),
      cmocka_unit_test(gpt_greedy),
  };
  return AX_TEST_MAIN(tests);
}
