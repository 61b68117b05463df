/* Mixed precision (the rules at the top of models/module.h):
 *  - a Linear layer, an encoder layer and a GPT decoder layer in bf16
 *    agree with f32 within bf16's tolerance: a relative L2 difference
 *    under 1e-2 for outputs, input gradients and every parameter gradient
 *    (bf16 keeps 8 significant bits; each GEMM operand is rounded once);
 *  - finite differences make sense in f32 only, so the bf16 backward is
 *    checked against the f32 backward of the bf16-rounded operands: a
 *    Linear layer's to the summation order (1e-5), GELU's bit for bit;
 *  - the block boundaries: a tiny BERT and a tiny GPT split into stages
 *    compute the whole model's bits in bf16 (outputs, loss, every
 *    gradient), and what crosses a boundary is AX_BF16, half the bytes of
 *    fp32; the logits stay f32; the bf16 loss is within 1e-2 of fp32's,
 *    the logits and the gradients within 2e-2 (relative L2);
 *  - the split backward equals the fused one bit for bit in bf16;
 *  - the activations a forward keeps take about half the bytes (BERT's
 *    encoder layers, GPT's decoder layers);
 *  - the precision's names. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "axon/kernels/bf16.h"
#include "axon/models/layers/basic.h"
#include "axon/models/layers/transformer.h"
#include "axon/models/loss.h"
#include "axon/models/model.h"
#include "harness.h"
#include "split_testutil.h"

#define TINY_BERT "layers=2,hidden=16,heads=2,ff=32,vocab=50,seq=8,dropout=0.1"
#define TINY_GPT "layers=2,hidden=16,heads=2,ff=32,vocab=50,seq=8,dropout=0.1"

/* A tiny model of 4 blocks and its mini-batch t of B sequences of 8
 * tokens: BERT's (with a padded mask) or GPT's (next-token labels). */
typedef struct tiny {
  const char *model, *cfg;
} tiny;
static const tiny g_bert = {"bert", TINY_BERT}, g_gpt = {"gpt", TINY_GPT};

static void tiny_batch(const tiny *m, long t, int B, ax_tlist *in,
                       ax_tlist *lab) {
  if (!strcmp(m->model, "bert"))
    AX_ASSERT_OK(ax_test_bert_batch(t, B, 8, 3, in, lab));
  else
    AX_ASSERT_OK(ax_test_lm_batch(t, B, 8, 50, in, lab));
}

/* ||a - b|| / ||b|| over n values of f32 tensors a and b. */
static double rel_l2(const ax_tensor *a, const ax_tensor *b) {
  assert_int_equal(a->dtype, AX_F32);
  assert_int_equal(b->dtype, AX_F32);
  assert_int_equal(ax_tensor_numel(a), ax_tensor_numel(b));
  double d = 0, r = 0;
  for (size_t i = 0; i < ax_tensor_numel(a); i++) {
    double x = ax_f32(a)[i], y = ax_f32(b)[i];
    d += (x - y) * (x - y);
    r += y * y;
  }
  return sqrt(d) / (sqrt(r) + 1e-30);
}

/* t rounded to bf16, kept as a new f32 tensor. */
static ax_tensor *rounded(const ax_tensor *t) {
  ax_tensor *r = ax_tensor_like(t);
  assert_non_null(r);
  for (size_t i = 0; i < ax_tensor_numel(t); i++)
    ax_f32(r)[i] = ax_bf16_round(ax_f32(t)[i]);
  return r;
}

/* One forward and the fused backward of net on in with output gradient
 * dy (dropout seed 9): the first output and input gradient, the
 * parameter gradients in net->grads. */
static void run(ax_net *net, const ax_tlist *in, ax_tensor *dy, ax_tensor **y,
                ax_tensor **dx) {
  ax_slot *slot = ax_slot_new();
  ax_tlist out = {0}, din = {0}, dout = ax_tlist1(dy);
  AX_ASSERT_OK(ax_net_zero_grad(net));
  AX_ASSERT_OK(ax_net_forward(net, slot, 1, 9, in, &out));
  AX_ASSERT_OK(ax_net_backward(net, slot, 9, 1, &dout, &din));
  *y = ax_tensor_retain(out.t[0]);
  *dx = ax_tensor_retain(din.t[0]);
  ax_tlist_clear(&out);
  ax_tlist_clear(&din);
  ax_slot_free(slot);
}

/* Module m (from make) in f32 and in bf16, from the same weights (its
 * initial ones times gain): every relative L2 difference under tol. */
static void bf16_close(ax_module *(*make)(void), float gain, const ax_tlist *in,
                       int64_t out_cols, double tol, const char *what) {
  ax_net *f = ax_net_new(make(), AX_CPU, 3), *b = ax_net_new(make(), AX_CPU, 3);
  assert_non_null(f);
  assert_non_null(b);
  b->precision = AX_PREC_BF16;
  for (size_t i = 0; i < f->n_params; i++) {
    ax_f32(f->params)[i] *= gain;
    ax_f32(b->params)[i] *= gain;
  }
  const ax_tensor *x = in->t[0];
  int64_t shape[AX_MAX_DIMS]; /* the output's */
  memcpy(shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = out_cols;
  ax_tensor *dy = ax_test_randn(5, 1.0f, x->ndim, shape);
  ax_tensor *yf, *dxf, *yb, *dxb;
  run(f, in, dy, &yf, &dxf);
  run(b, in, dy, &yb, &dxb);
  double e[3] = {rel_l2(yb, yf), rel_l2(dxb, dxf), rel_l2(b->grads, f->grads)};
  fprintf(stderr,
          "  %s bf16 against f32: relative L2 output %.2g, input "
          "gradient %.2g, parameter gradients %.2g\n",
          what, e[0], e[1], e[2]);
  for (int i = 0; i < 3; i++)
    assert_true(e[i] < tol);
  assert_true(e[0] > 0); /* bf16 did round */
  ax_tensor *t[] = {dy, yf, dxf, yb, dxb};
  for (size_t i = 0; i < sizeof t / sizeof *t; i++)
    ax_tensor_release(t[i]);
  ax_net_free(f);
  ax_net_free(b);
}

static ax_module *linear(void) { return ax_linear_new(24, 16, 1); }

static void linear_close(void **state) {
  int64_t shape[3] = {2, 5, 24};
  ax_tensor *x = ax_test_randn(4, 1.0f, 3, shape);
  ax_tlist in = ax_tlist1(x);
  bf16_close(linear, 1.0f, &in, 16, 1e-2, "linear(24->16)");
  ax_tensor_release(x);
}

static ax_module *encoder(void) {
  return ax_encoder_layer_new(16, 2, 32, 0.1f, 5);
}

static ax_module *decoder(void) {
  return ax_decoder_layer_new(16, 2, 32, 0.1f, 5, 0.02f);
}

static void decoder_close(void **state) {
  int64_t shape[3] = {3, 8, 16};
  ax_tensor *x = ax_test_randn(6, 1.0f, 3, shape);
  ax_tlist in = ax_tlist1(x);
  /* Weights 3 times GPT's initial ones: the branches, not the residual,
   * make the outputs. (Pre-LN compounds the gain: at 10 times the
   * attention's softmax saturates, and bf16's rounding flips which key
   * wins.) */
  bf16_close(decoder, 3.0f, &in, 16, 1e-2, "decoder(16, 2 heads, ff 32)");
  ax_tensor_release(x);
}

static void encoder_close(void **state) {
  ax_tlist in = {0}, lab = {0};
  AX_ASSERT_OK(ax_test_bert_batch(0, 3, 8, 3, &in, &lab));
  int64_t shape[3] = {3, 8, 16};
  ax_tensor *x = ax_test_randn(6, 1.0f, 3, shape);
  ax_tlist pair = {2, {x, in.t[2]}};
  /* Weights 10 times BERT's initial ones: the products, not the residual,
   * make the outputs, and the attention is peaked. */
  bf16_close(encoder, 10.0f, &pair, 16, 1e-2, "encoder(16, 2 heads, ff 32)");
  ax_tensor_release(x);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lab);
}

/* The bf16 Linear against the f32 Linear on the rounded weights, input and
 * output gradient: the same products, summed in another order. */
static void linear_backward_oracle(void **state) {
  ax_net *b = ax_net_new(linear(), AX_CPU, 3),
         *r = ax_net_new(linear(), AX_CPU, 3);
  assert_non_null(b);
  assert_non_null(r);
  b->precision = AX_PREC_BF16;
  size_t nw = 24 * 16; /* W rounded; the bias is added in f32 */
  for (size_t i = 0; i < nw; i++)
    ax_f32(r->params)[i] = ax_bf16_round(ax_f32(r->params)[i]);
  int64_t xs[2] = {7, 24}, ys[2] = {7, 16};
  ax_tensor *x = ax_test_randn(8, 1.0f, 2, xs),
            *dy = ax_test_randn(9, 1.0f, 2, ys);
  ax_tensor *xr = rounded(x), *dyr = rounded(dy);
  ax_tlist in = ax_tlist1(x), inr = ax_tlist1(xr);
  ax_tensor *yb, *dxb, *yr, *dxr;
  run(b, &in, dy, &yb, &dxb);
  run(r, &inr, dyr, &yr, &dxr);
  double w[3] = {
      ax_test_close_ratio(ax_f32(yb), ax_f32(yr), 7 * 16, 1e-6, 1e-5),
      ax_test_close_ratio(ax_f32(dxb), ax_f32(dxr), 7 * 24, 1e-6, 1e-5),
      ax_test_close_ratio(ax_f32(b->grads), ax_f32(r->grads), b->n_params, 1e-6,
                          1e-5)};
  for (int i = 0; i < 3; i++)
    assert_true(w[i] <= 1.0);
  ax_tensor *t[] = {x, dy, xr, dyr, yb, dxb, yr, dxr};
  for (size_t i = 0; i < sizeof t / sizeof *t; i++)
    ax_tensor_release(t[i]);
  ax_net_free(b);
  ax_net_free(r);
}

/* GELU keeps its input in bf16: its bf16 input gradient is f32 GELU's on
 * the rounded input, bit for bit (the forward itself stays f32). */
static void gelu_backward_oracle(void **state) {
  ax_net *b = ax_net_new(ax_gelu_new(), AX_CPU, 1),
         *r = ax_net_new(ax_gelu_new(), AX_CPU, 1);
  b->precision = AX_PREC_BF16;
  int64_t s[2] = {5, 9};
  ax_tensor *x = ax_test_randn(10, 2.0f, 2, s),
            *dy = ax_test_randn(11, 1.0f, 2, s);
  ax_tensor *xr = rounded(x), *yb, *dxb, *yr, *dxr, *yf, *dxf;
  ax_tlist in = ax_tlist1(x), inr = ax_tlist1(xr);
  run(b, &in, dy, &yb, &dxb);
  run(r, &inr, dy, &yr, &dxr);
  assert_memory_equal(dxb->data, dxr->data, ax_tensor_nbytes(dxr));
  run(r, &in, dy, &yf, &dxf); /* the forward is f32's */
  assert_memory_equal(yb->data, yf->data, ax_tensor_nbytes(yf));
  ax_tensor *t[] = {x, dy, xr, yb, dxb, yr, dxr, yf, dxf};
  for (size_t i = 0; i < sizeof t / sizeof *t; i++)
    ax_tensor_release(t[i]);
  ax_net_free(b);
  ax_net_free(r);
}

/* Blocks bounds[k] .. bounds[k + 1] of a tiny model in stages nets, run
 * forward, loss and backward on batch 0 as a pipeline would (each stage's
 * outputs feed the next, the input gradients go back): the final
 * outputs, the loss, the gradients of every stage and the bytes that
 * crossed each boundary (both ways). */
typedef struct staged {
  ax_tensor *logits[2];
  double loss;
  ax_tensor *grads[4];
  size_t crossed;
  ax_dtype boundary_type;
} staged;

static void run_staged(const tiny *m, int precision, const int *bounds, int K,
                       staged *r) {
  const ax_model_def *def = ax_model_find(m->model);
  ax_config cfg;
  AX_ASSERT_OK(ax_model_config(def, m->cfg, &cfg));
  ax_tlist x[5] = {{0}}, lab = {0}, dy = {0}, dx = {0};
  tiny_batch(m, 0, 3, &x[0], &lab);
  ax_net *net[4];
  ax_slot *slot[4];
  memset(r, 0, sizeof *r);
  for (int k = 0; k < K; k++) {
    AX_ASSERT_OK(ax_model_stage(def, &cfg, bounds[k], bounds[k + 1], AX_CPU, 5,
                                &net[k]));
    net[k]->precision = precision;
    slot[k] = ax_slot_new();
    AX_ASSERT_OK(ax_net_forward(net[k], slot[k], 1, 17, &x[k], &x[k + 1]));
    if (k < K - 1) {
      r->crossed += ax_tensor_nbytes(x[k + 1].t[0]);
      r->boundary_type = x[k + 1].t[0]->dtype;
    }
  }
  ax_loss_result lr;
  AX_ASSERT_OK(ax_loss_xent(&x[K], &lab, -100, NULL, 1.0f, &lr, &dy));
  r->loss = lr.loss;
  for (int i = 0; i < x[K].n; i++)
    r->logits[i] = ax_tensor_retain(x[K].t[i]);
  for (int k = K - 1; k >= 0; k--) {
    AX_ASSERT_OK(ax_net_backward(net[k], slot[k], 17, k > 0, &dy, &dx));
    if (k > 0)
      r->crossed += ax_tensor_nbytes(dx.t[0]);
    ax_tlist_clear(&dy);
    dy = dx;
    memset(&dx, 0, sizeof dx);
    r->grads[k] = ax_tensor_retain(net[k]->grads);
    ax_slot_free(slot[k]);
    ax_net_free(net[k]);
  }
  ax_tlist_clear(&dy);
  for (int k = 0; k <= K; k++)
    ax_tlist_clear(&x[k]);
  ax_tlist_clear(&lab);
}

static void staged_free(staged *r) {
  for (int i = 0; i < 2; i++)
    ax_tensor_release(r->logits[i]);
  for (int k = 0; k < 4; k++)
    ax_tensor_release(r->grads[k]);
}

/* The largest relative L2 difference of the bf16 run s from the fp32 run
 * f over the logits and every stage's gradients. */
static double worst_rel(const staged *s, const staged *f, int K) {
  double w = 0;
  for (int i = 0; i < 2 + K; i++) {
    const ax_tensor *a = i < 2 ? s->logits[i] : s->grads[i - 2],
                    *b = i < 2 ? f->logits[i] : f->grads[i - 2];
    double e = a ? rel_l2(a, b) : 0;
    w = e > w ? e : w;
  }
  return w;
}

static void split_whole(const tiny *m) {
  static const int whole[2] = {0, 4}, three[4] = {0, 1, 3, 4};
  staged w, s, f;
  run_staged(m, AX_PREC_BF16, whole, 1, &w);
  run_staged(m, AX_PREC_BF16, three, 3, &s);
  run_staged(m, AX_PREC_FP32, three, 3, &f);
  for (int i = 0; i < 2 && w.logits[i]; i++) { /* the logits stay f32 */
    assert_int_equal(w.logits[i]->dtype, AX_F32);
    assert_memory_equal(w.logits[i]->data, s.logits[i]->data,
                        ax_tensor_nbytes(w.logits[i]));
  }
  assert_true(memcmp(&w.loss, &s.loss, sizeof w.loss) == 0);
  size_t off = 0; /* the stages' gradients are slices of the whole's */
  for (int k = 0; k < 3; k++) {
    size_t n = ax_tensor_nbytes(s.grads[k]);
    assert_memory_equal((char *)w.grads[0]->data + off, s.grads[k]->data, n);
    off += n;
  }
  assert_int_equal(off, ax_tensor_nbytes(w.grads[0]));
  assert_int_equal(s.boundary_type, AX_BF16);
  assert_int_equal(f.boundary_type, AX_F32);
  double worst = worst_rel(&s, &f, 3);
  fprintf(stderr,
          "  %s split in 3: loss %.6f bf16, %.6f fp32; logits and "
          "gradients within %.2g (relative L2); %zu bytes between stages in "
          "bf16, %zu in fp32\n",
          m->model, s.loss, f.loss, worst, s.crossed, f.crossed);
  assert_int_equal(2 * s.crossed, f.crossed);
  assert_true(fabs(s.loss - f.loss) < 1e-2 * fabs(f.loss));
  assert_true(worst < 2e-2);
  staged_free(&w);
  staged_free(&s);
  staged_free(&f);
}

static void split_computes_the_whole(void **state) {
  split_whole(&g_bert);
  split_whole(&g_gpt);
}

/* Blocks [first, last) of a tiny model in a model's sequential of blocks
 * (ends: last is the model's last block). */
static ax_module *blocks(const tiny *m, int first, int last, int ends) {
  const ax_model_def *def = ax_model_find(m->model);
  ax_config cfg;
  AX_ASSERT_OK(ax_model_config(def, m->cfg, &cfg));
  ax_module *root = ax_blocks_new(ends);
  assert_non_null(root);
  for (int i = first; i < last; i++) {
    ax_module *b;
    AX_ASSERT_OK(def->build_block(&cfg, i, &b));
    AX_ASSERT_OK(ax_module_add(root, b));
  }
  return root;
}

/* Model m's split backward against its fused one in bf16: the whole
 * model, and its two layers fed a hidden state (their input gradient
 * bf16 out and back, need_dx 0 and 1). */
static void split_backward_of(const tiny *m) {
  ax_tlist in = {0}, lab = {0}, in2 = {0}, lab2 = {0};
  tiny_batch(m, 0, 3, &in, &lab);
  tiny_batch(m, 1, 3, &in2, &lab2);
  ax_test_split_matches_fused_prec(blocks(m, 0, 4, 1), &in, &in2, 0,
                                   AX_PREC_BF16);
  int64_t shape[3] = {3, 8, 16};
  ax_tensor *h = ax_test_randn(12, 1.0f, 3, shape);
  ax_tlist pair = {in.n > 1 ? 2 : 1, {h, in.n > 1 ? in.t[2] : NULL}};
  ax_tlist pair2 = ax_test_other_unit(&pair, 1, 0.5f, 0.1f);
  for (int need_dx = 0; need_dx <= 1; need_dx++) /* bf16 out and back */
    ax_test_split_matches_fused_prec(blocks(m, 1, 3, 0), &pair, &pair2, need_dx,
                                     AX_PREC_BF16);
  ax_tlist_clear(&pair2);
  ax_tensor_release(h);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lab);
  ax_tlist_clear(&in2);
  ax_tlist_clear(&lab2);
}

static void split_backward_bf16(void **state) {
  split_backward_of(&g_bert);
  split_backward_of(&g_gpt);
}

/* The bytes a training forward of the tiny model's two layers keeps for
 * its backward. */
static size_t kept_bytes(const tiny *m, int precision) {
  const ax_model_def *def = ax_model_find(m->model);
  ax_config cfg;
  AX_ASSERT_OK(ax_model_config(def, m->cfg, &cfg));
  ax_net *net;
  AX_ASSERT_OK(ax_model_stage(def, &cfg, 1, 3, AX_CPU, 5, &net));
  net->precision = precision;
  ax_tlist in = {0}, lab = {0}, out = {0};
  tiny_batch(m, 0, 4, &in, &lab);
  int64_t shape[3] = {4, 8, 16};
  ax_tensor *h = ax_test_randn(13, 1.0f, 3, shape);
  ax_tlist pair = {in.n > 1 ? 2 : 1, {h, in.n > 1 ? in.t[2] : NULL}};
  ax_slot *slot = ax_slot_new();
  AX_ASSERT_OK(ax_net_forward(net, slot, 1, 3, &pair, &out));
  size_t bytes = ax_slot_bytes(slot);
  ax_slot_free(slot);
  ax_tlist_clear(&out);
  ax_tensor_release(h);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lab);
  ax_net_free(net);
  return bytes;
}

static void activations_half(void **state) {
  const tiny *m[2] = {&g_bert, &g_gpt};
  for (int i = 0; i < 2; i++) {
    size_t f = kept_bytes(m[i], AX_PREC_FP32),
           b = kept_bytes(m[i], AX_PREC_BF16);
    fprintf(stderr,
            "  %s's two layers keep %zu bytes in fp32, %zu in bf16 "
            "(%.3fx)\n",
            m[i]->model, f, b, (double)b / (double)f);
    assert_true(b < f * 0.6);
  }
}

static void names(void **state) {
  int p = -1;
  AX_ASSERT_OK(ax_precision_parse("bf16", &p));
  assert_int_equal(p, AX_PREC_BF16);
  AX_ASSERT_OK(ax_precision_parse("fp32", &p));
  assert_int_equal(p, AX_PREC_FP32);
  AX_ASSERT_ERR(ax_precision_parse("fp16", &p), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "fp32 or bf16"));
  assert_string_equal(ax_precision_name(AX_PREC_BF16), "bf16");
  assert_null(ax_precision_name(AX_PREC_COUNT));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(names),
      cmocka_unit_test(linear_close),
      cmocka_unit_test(encoder_close),
      cmocka_unit_test(decoder_close),
      cmocka_unit_test(linear_backward_oracle),
      cmocka_unit_test(gelu_backward_oracle),
      cmocka_unit_test(split_computes_the_whole),
      cmocka_unit_test(split_backward_bf16),
      cmocka_unit_test(activations_half),
  };
  return AX_TEST_MAIN(tests);
}
