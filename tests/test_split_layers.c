/* The split backward of every built-in layer: finite-difference checks of
 * each half (the input half's input gradients, the weight half's parameter
 * gradients), the halves equal to the fused backward bit for bit, and the
 * weight halves of two units run late and in reverse order. */
#include <stdlib.h>

#include "axon/models/layers/basic.h"
#include "axon/models/layers/transformer.h"
#include "axon/models/layers/vision.h"
#include "harness.h"
#include "split_testutil.h"

typedef ax_module *(*maker)(void);

/* Every split check of one layer on input list `in` (the finite-difference
 * check probes the f32 inputs whose bit is set in `mask`); the second unit
 * is `in2`, or `in` with those inputs changed when NULL. */
static void check_layer(maker make, const ax_tlist *in, const ax_tlist *in2,
                        unsigned mask, double eps, double atol, double rtol) {
  ax_test_gradcheck_split(make(), in, mask, 40, eps, atol, rtol);
  ax_tlist u2 = in2 ? (ax_tlist){0} : ax_test_other_unit(in, mask, -0.8f, 0.3f);
  for (int need_dx = 0; need_dx <= 1; need_dx++)
    ax_test_split_matches_fused(make(), in, in2 ? in2 : &u2, need_dx);
  ax_tlist_clear(&u2);
}

/* check_layer on one f32 tensor x (released here). */
static void check1(maker make, ax_tensor *x, double eps, double atol,
                   double rtol) {
  ax_tlist in = ax_tlist1(x);
  check_layer(make, &in, NULL, 1, eps, atol, rtol);
  ax_tensor_release(x);
}

static ax_tensor *randn(uint64_t seed, float scale, int ndim, int64_t a,
                        int64_t b, int64_t c, int64_t d) {
  int64_t shape[4] = {a, b, c, d};
  return ax_test_randn(seed, scale, ndim, shape);
}

/* Distinct values spaced well beyond eps, so no window's maximum changes
 * under a probe. */
static ax_tensor *spaced4(uint64_t seed, int64_t n, int64_t c, int64_t h,
                          int64_t w) {
  ax_tensor *x = randn(seed, 1.0f, 4, n, c, h, w);
  size_t cnt = ax_tensor_numel(x);
  int32_t *perm = malloc(cnt * sizeof *perm);
  assert_non_null(perm);
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

/* An f32 (B, S) mask with the last `pad` positions of sequence 1 padded. */
static ax_tensor *pad_mask(int B, int S, int pad) {
  int64_t shape[2] = {B, S};
  ax_tensor *m = ax_tensor_new(AX_F32, 2, shape, AX_CPU);
  assert_non_null(m);
  for (int b = 0; b < B; b++)
    for (int s = 0; s < S; s++)
      ax_f32(m)[b * S + s] = (b == 1 && s >= S - pad) ? 0.0f : 1.0f;
  return m;
}

/* ---- basic ---- */

static ax_module *mk_linear(void) { return ax_linear_new(5, 4, 1); }
static ax_module *mk_linear_nobias(void) { return ax_linear_new(5, 3, 0); }
static ax_module *mk_relu_flatten(void) {
  ax_module *seq = ax_sequential_new();
  assert_int_equal(ax_module_add(seq, ax_relu_new()), AX_OK);
  assert_int_equal(ax_module_add(seq, ax_flatten_new()), AX_OK);
  assert_int_equal(ax_module_add(seq, ax_linear_new(12, 3, 1)), AX_OK);
  return seq;
}

static void basic_layers(void **state) {
  check1(mk_linear, randn(1, 1.0f, 3, 2, 3, 5, 0), 1e-2, 1e-3, 1e-2);
  check1(mk_linear_nobias, randn(2, 1.0f, 2, 4, 5, 0, 0), 1e-2, 1e-3, 1e-2);
  check1(mk_relu_flatten, randn(3, 1.0f, 4, 2, 3, 2, 2), 1e-3, 1e-3, 1e-2);
}

/* ---- vision ---- */

static ax_module *mk_conv(void) { return ax_conv2d_new(3, 4, 3, 1, 1, 1); }
static ax_module *mk_conv_s2(void) { return ax_conv2d_new(3, 4, 3, 2, 0, 0); }
static ax_module *mk_bn(void) { return ax_batchnorm2d_new(3, 0.1f, 1e-5f); }
static ax_module *mk_bn2d(void) { return ax_batchnorm2d_new(4, 0.1f, 1e-5f); }
static ax_module *mk_bn_relu(void) {
  return ax_batchnorm2d_relu_new(3, 0.1f, 1e-5f);
}
static ax_module *mk_maxpool(void) { return ax_maxpool2d_new(3, 2, 1); }
static ax_module *mk_avgpool(void) { return ax_avgpool2d_new(3, 2, 1); }
static ax_module *mk_gap(void) { return ax_global_avgpool_new(); }
static ax_module *mk_block(void) { return ax_basic_block_new(4, 4, 1); }
static ax_module *mk_block_proj(void) { return ax_basic_block_new(3, 4, 2); }

static void conv_layers(void **state) {
  check1(mk_conv, randn(1, 1.0f, 4, 2, 3, 6, 5), 1e-2, 1e-3, 1e-2);
  check1(mk_conv_s2, randn(2, 1.0f, 4, 2, 3, 7, 7), 1e-2, 1e-3, 1e-2);
}

static void batchnorm_layers(void **state) {
  check1(mk_bn, randn(4, 1.0f, 4, 4, 3, 3, 2), 1e-2, 2e-3, 2e-2);
  check1(mk_bn2d, randn(5, 1.0f, 2, 5, 4, 0, 0), 1e-2, 2e-3, 2e-2);
  check1(mk_bn_relu, randn(4, 1.0f, 4, 4, 3, 3, 2), 1e-2, 2e-3, 2e-2);
}

static void pool_layers(void **state) {
  check1(mk_maxpool, spaced4(7, 2, 2, 7, 5), 1e-3, 1e-3, 1e-2);
  check1(mk_avgpool, randn(8, 1.0f, 4, 2, 3, 7, 6), 1e-2, 1e-3, 1e-2);
  check1(mk_gap, randn(9, 1.0f, 4, 3, 4, 5, 3), 1e-2, 1e-3, 1e-2);
}

static void basic_blocks(void **state) {
  check1(mk_block, randn(10, 1.0f, 4, 2, 4, 6, 6), 1e-3, 5e-3, 3e-2);
  check1(mk_block_proj, randn(11, 1.0f, 4, 2, 3, 6, 6), 1e-3, 5e-3, 3e-2);
}

/* ---- transformer ---- */

static ax_module *mk_gelu(void) { return ax_gelu_new(); }
static ax_module *mk_tanh(void) { return ax_tanh_new(); }
static ax_module *mk_dropout(void) { return ax_dropout_new(0.3f, 17); }
static ax_module *mk_layernorm(void) {
  return ax_layernorm_new(8, AX_BERT_LN_EPS);
}
static ax_module *mk_embedding(void) { return ax_embedding_new(6, 4); }
static ax_module *mk_attention(void) { return ax_mhsa_new(8, 2, 0.2f, 3); }
static ax_module *mk_encoder(void) {
  return ax_encoder_layer_new(8, 2, 16, 0.1f, 4);
}

static void elementwise_layers(void **state) {
  check1(mk_gelu, randn(1, 1.5f, 3, 2, 3, 4, 0), 1e-3, 1e-3, 1e-2);
  check1(mk_tanh, randn(2, 1.5f, 3, 2, 3, 4, 0), 1e-3, 1e-3, 1e-2);
  check1(mk_dropout, randn(3, 1.5f, 3, 2, 3, 4, 0), 1e-3, 1e-3, 1e-2);
  check1(mk_layernorm, randn(6, 1.0f, 3, 2, 3, 8, 0), 1e-2, 2e-3, 2e-2);
}

static void embedding_layer(void **state) {
  int64_t shape[2] = {3, 5};
  ax_tensor *ids = ax_test_randint(5, 0, 6, 2, shape); /* repeated ids */
  ax_tensor *ids2 = ax_test_randint(6, 0, 6, 2, shape);
  ax_tlist in = ax_tlist1(ids), in2 = ax_tlist1(ids2);
  check_layer(mk_embedding, &in, &in2, 0, 1e-2, 1e-3, 1e-2);
  ax_tensor_release(ids);
  ax_tensor_release(ids2);
}

static void attention_layers(void **state) {
  ax_tensor *x = randn(7, 1.0f, 3, 2, 4, 8, 0), *mask = pad_mask(2, 4, 2);
  ax_tlist in = {2, {x, mask}};
  check_layer(mk_attention, &in, NULL, 1, 1e-2, 1e-3, 2e-2);
  ax_tensor_release(x);
  ax_tensor_release(mask);
  x = randn(9, 1.0f, 3, 2, 3, 8, 0);
  mask = pad_mask(2, 3, 1);
  ax_tlist in2 = {2, {x, mask}};
  check_layer(mk_encoder, &in2, NULL, 1, 1e-2, 2e-3, 3e-2);
  ax_tensor_release(x);
  ax_tensor_release(mask);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(basic_layers),     cmocka_unit_test(conv_layers),
      cmocka_unit_test(batchnorm_layers), cmocka_unit_test(pool_layers),
      cmocka_unit_test(basic_blocks),     cmocka_unit_test(elementwise_layers),
      cmocka_unit_test(embedding_layer),  cmocka_unit_test(attention_layers),
  };
  return AX_TEST_MAIN(tests);
}
