/* Gradient checks, dropout determinism, padding invariance and error cases
 * for the transformer layers (models/layers/transformer.h). */
#include <math.h>
#include <string.h>

#include "axon/models/layers/transformer.h"
#include "harness.h"

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

/* One forward of a net in the given mode; returns the first output. */
static ax_tensor *run1(ax_net *net, int training, uint64_t seed,
                       const ax_tlist *in) {
  ax_slot *slot = ax_slot_new();
  ax_tlist out = {0};
  AX_ASSERT_OK(ax_net_forward(net, slot, training, seed, in, &out));
  ax_tensor *y = ax_tensor_retain(out.t[0]);
  ax_tlist_clear(&out);
  ax_slot_free(slot);
  return y;
}

static void unary_gradcheck(ax_module *m, uint64_t seed) {
  int64_t shape[3] = {2, 3, 4};
  ax_tensor *x = ax_test_randn(seed, 1.5f, 3, shape);
  ax_tlist in = ax_tlist1(x);
  ax_test_gradcheck(m, &in, 1, 24, 1e-3, 1e-3, 1e-2);
  ax_tensor_release(x);
}

static void gelu_gradcheck(void **state) { unary_gradcheck(ax_gelu_new(), 1); }
static void tanh_gradcheck(void **state) { unary_gradcheck(ax_tanh_new(), 2); }

static void dropout_gradcheck(void **state) {
  unary_gradcheck(ax_dropout_new(0.3f, 17), 3);
}

static void dropout_mask(void **state) {
  int64_t shape[2] = {100, 100};
  ax_tensor *x = ax_test_randn(4, 1.0f, 2, shape);
  ax_tlist in = ax_tlist1(x);
  ax_net *a = ax_net_new(ax_dropout_new(0.3f, 1), AX_CPU, 1);
  ax_net *b = ax_net_new(ax_dropout_new(0.3f, 2), AX_CPU, 1);
  assert_non_null(a);
  assert_non_null(b);
  ax_tensor *y1 = run1(a, 1, 5, &in), *y2 = run1(a, 1, 5, &in);
  ax_tensor *y3 = run1(a, 1, 6, &in), *y4 = run1(b, 1, 5, &in);
  ax_tensor *ye = run1(a, 0, 5, &in);
  size_t n = ax_tensor_numel(x), kept = 0, same3 = 0, same4 = 0;
  for (size_t i = 0; i < n; i++) {
    float xv = ax_f32(x)[i], v = ax_f32(y1)[i];
    assert_true(v == ax_f32(y2)[i]);  /* same seed, same mask */
    assert_true(ax_f32(ye)[i] == xv); /* identity in evaluation */
    if (v != 0.0f) {
      kept++;
      AX_ASSERT_CLOSE(v, xv / 0.7f, 1e-6, 1e-6);
    }
    same3 += (v != 0.0f) == (ax_f32(y3)[i] != 0.0f);
    same4 += (v != 0.0f) == (ax_f32(y4)[i] != 0.0f);
  }
  AX_ASSERT_CLOSE((double)kept / n, 0.7, 0.02, 0);
  /* Another seed or another salt draws an unrelated mask (agreement near
   * 0.7^2 + 0.3^2 = 0.58, far from 1). */
  assert_true(same3 < n * 0.7);
  assert_true(same4 < n * 0.7);
  ax_tensor *t[] = {x, y1, y2, y3, y4, ye};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    ax_tensor_release(t[i]);
  ax_net_free(a);
  ax_net_free(b);
  assert_null(ax_dropout_new(1.0f, 0));
  assert_non_null(strstr(ax_errmsg(), "dropout"));
}

static void embedding_gradcheck(void **state) {
  int64_t shape[2] = {3, 5};
  ax_tensor *ids = ax_test_randint(5, 0, 6, 2, shape); /* repeated ids */
  ax_tlist in = ax_tlist1(ids);
  ax_test_gradcheck(ax_embedding_new(6, 4), &in, 0, 40, 1e-2, 1e-3, 1e-2);
  ax_tensor_release(ids);
}

static void embedding_bad_id(void **state) {
  ax_net *net = ax_net_new(ax_embedding_new(6, 4), AX_CPU, 1);
  int64_t shape[1] = {3};
  ax_tensor *ids = ax_tensor_new(AX_I32, 1, shape, AX_CPU);
  ax_i32(ids)[0] = 0, ax_i32(ids)[1] = 6, ax_i32(ids)[2] = 1;
  ax_tlist in = ax_tlist1(ids), out = {0};
  ax_slot *slot = ax_slot_new();
  AX_ASSERT_ERR(ax_net_forward(net, slot, 1, 0, &in, &out), AX_EINVAL);
  assert_int_equal(out.n, 0);
  ax_slot_free(slot);
  ax_tensor_release(ids);
  ax_net_free(net);
}

static void layernorm_gradcheck(void **state) {
  int64_t shape[3] = {2, 3, 8};
  ax_tensor *x = ax_test_randn(6, 1.0f, 3, shape);
  ax_tlist in = ax_tlist1(x);
  ax_test_gradcheck(ax_layernorm_new(8, AX_BERT_LN_EPS), &in, 1, 40, 1e-2, 2e-3,
                    2e-2);
  ax_tensor_release(x);
}

/* loss = sum of out[0] * R with R fixed, for the check below. */
static double probe(ax_net *net, const ax_tlist *in) {
  ax_tensor *y = run1(net, 1, 21, in);
  ax_rng r;
  ax_rng_seed(&r, 77);
  double l = 0;
  for (size_t i = 0; i < ax_tensor_numel(y); i++)
    l += ax_f32(y)[i] * ax_rng_normal(&r);
  ax_tensor_release(y);
  return l;
}

/* A finite-difference check of input 0 with every weight multiplied by
 * `gain`, so that attention is peaked rather than nearly uniform as with
 * BERT's 0.02 initialisation (the harness check keeps the initialisation). */
static void peaked_gradcheck(ax_module *m, const ax_tlist *in, float gain) {
  ax_net *net = ax_net_new(m, AX_CPU, 5);
  assert_non_null(net);
  for (size_t i = 0; i < net->n_params; i++)
    ax_f32(net->params)[i] *= gain;
  ax_slot *slot = ax_slot_new();
  ax_tlist out = {0}, din = {0};
  AX_ASSERT_OK(ax_net_forward(net, slot, 1, 21, in, &out));
  ax_tensor *dy = ax_tensor_like(out.t[0]);
  ax_rng r;
  ax_rng_seed(&r, 77);
  for (size_t i = 0; i < ax_tensor_numel(dy); i++)
    ax_f32(dy)[i] = (float)ax_rng_normal(&r);
  ax_tlist dout = {out.n, {dy, NULL, NULL, NULL}};
  AX_ASSERT_OK(ax_net_backward(net, slot, 21, 1, &dout, &din));
  assert_true(din.n >= 1 && din.t[0]);
  float *x = ax_f32(in->t[0]);
  const float eps = 1e-2f;
  for (size_t i = 0; i < ax_tensor_numel(in->t[0]); i += 3) {
    float keep = x[i];
    x[i] = keep + eps;
    double lp = probe(net, in);
    x[i] = keep - eps;
    double lm = probe(net, in);
    x[i] = keep;
    AX_ASSERT_CLOSE(ax_f32(din.t[0])[i], (lp - lm) / (2 * eps), 5e-3, 3e-2);
  }
  ax_tensor_release(dy);
  ax_tlist_clear(&out);
  ax_tlist_clear(&din);
  ax_slot_free(slot);
  ax_net_free(net);
}

static void attention_gradcheck(void **state) {
  int64_t shape[3] = {2, 4, 8};
  ax_tensor *x = ax_test_randn(7, 1.0f, 3, shape), *mask = pad_mask(2, 4, 2);
  ax_tlist in = {2, {x, mask}};
  ax_test_gradcheck(ax_mhsa_new(8, 2, 0.2f, 3), &in, 1, 40, 1e-2, 1e-3, 2e-2);
  peaked_gradcheck(ax_mhsa_new(8, 2, 0.2f, 3), &in, 25.0f);
  ax_tensor_release(x);
  ax_tensor_release(mask);
}

/* Changing a padded token's input leaves every other token's output as it
 * was: no query attends to a padded key. */
static void attention_ignores_padding(void **state) {
  int B = 2, S = 5, H = 8;
  int64_t shape[3] = {B, S, H};
  ax_tensor *x = ax_test_randn(8, 1.0f, 3, shape), *mask = pad_mask(B, S, 2);
  ax_net *net = ax_net_new(ax_mhsa_new(H, 4, 0.1f, 9), AX_CPU, 3);
  assert_non_null(net);
  ax_tlist in = {2, {x, mask}};
  ax_tensor *y0 = run1(net, 1, 11, &in);
  for (int h = 0; h < H; h++) /* token (1, S - 1) is padding */
    ax_f32(x)[((size_t)1 * S + S - 1) * H + h] += 3.0f;
  ax_tensor *y1 = run1(net, 1, 11, &in);
  for (int b = 0; b < B; b++)
    for (int s = 0; s < S; s++)
      for (int h = 0; h < H; h++) {
        size_t i = ((size_t)b * S + s) * H + h;
        if (b == 1 && s == S - 1)
          continue;
        AX_ASSERT_CLOSE(ax_f32(y1)[i], ax_f32(y0)[i], 1e-6, 0);
      }
  ax_tensor_release(y0);
  ax_tensor_release(y1);
  ax_tensor_release(x);
  ax_tensor_release(mask);
  ax_net_free(net);
}

static void encoder_gradcheck(void **state) {
  int64_t shape[3] = {2, 3, 8};
  ax_tensor *x = ax_test_randn(9, 1.0f, 3, shape), *mask = pad_mask(2, 3, 1);
  ax_tlist in = {2, {x, mask}};
  ax_test_gradcheck(ax_encoder_layer_new(8, 2, 16, 0.1f, 4), &in, 1, 60, 1e-2,
                    2e-3, 3e-2);
  peaked_gradcheck(ax_encoder_layer_new(8, 2, 16, 0.1f, 4), &in, 10.0f);
  ax_tensor_release(x);
  ax_tensor_release(mask);
}

/* Forward of `m` on `in` must fail with `code` and a message naming
 * `what`. */
static void expect_error(ax_module *m, ax_tlist *in, int code,
                         const char *what) {
  ax_net *net = ax_net_new(m, AX_CPU, 1);
  assert_non_null(net);
  ax_slot *slot = ax_slot_new();
  ax_tlist out = {0};
  AX_ASSERT_ERR(ax_net_forward(net, slot, 1, 0, in, &out), code);
  assert_int_equal(out.n, 0);
  if (!strstr(ax_errmsg(), what))
    fail_msg("message '%s' does not name '%s'", ax_errmsg(), what);
  ax_slot_free(slot);
  ax_net_free(net);
}

static void shape_errors(void **state) {
  int64_t s7[3] = {2, 4, 7}, s8[3] = {2, 4, 8};
  ax_tensor *x7 = ax_test_randn(1, 1.0f, 3, s7),
            *x8 = ax_test_randn(1, 1, 3, s8);
  ax_tensor *m4 = pad_mask(2, 4, 1), *m3 = pad_mask(2, 3, 1);
  ax_tlist a = {2, {x7, m4}}, b = {2, {x8, m3}}, c = ax_tlist1(x7);
  expect_error(ax_mhsa_new(8, 2, 0.0f, 0), &a, AX_ESHAPE, "attention");
  expect_error(ax_mhsa_new(8, 2, 0.0f, 0), &b, AX_ESHAPE, "mask");
  expect_error(ax_encoder_layer_new(8, 2, 16, 0.0f, 0), &a, AX_ESHAPE,
               "encoder");
  expect_error(ax_layernorm_new(8, AX_BERT_LN_EPS), &c, AX_ESHAPE, "layernorm");
  ax_tensor_release(x7);
  ax_tensor_release(x8);
  ax_tensor_release(m4);
  ax_tensor_release(m3);
}

static void config_errors(void **state) {
  assert_null(ax_mhsa_new(10, 3, 0.0f, 0));
  assert_non_null(strstr(ax_errmsg(), "divide"));
  assert_null(ax_encoder_layer_new(8, 2, 0, 0.0f, 0));
  assert_null(ax_layernorm_new(8, 0.0f));
  assert_null(ax_embedding_new(0, 4));
  assert_null(ax_mhsa_new(8, 2, -0.5f, 0));
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(gelu_gradcheck),
      cmocka_unit_test(tanh_gradcheck),
      cmocka_unit_test(dropout_gradcheck),
      cmocka_unit_test(dropout_mask),
      cmocka_unit_test(embedding_gradcheck),
      cmocka_unit_test(embedding_bad_id),
      cmocka_unit_test(layernorm_gradcheck),
      cmocka_unit_test(attention_gradcheck),
      cmocka_unit_test(attention_ignores_padding),
      cmocka_unit_test(encoder_gradcheck),
      cmocka_unit_test(shape_errors),
      cmocka_unit_test(config_errors),
  };
  return AX_TEST_MAIN(t);
}
