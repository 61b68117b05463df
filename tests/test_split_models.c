/* The split backward of the models (MLP, ResNet20 blocks, a tiny BERT and
 * its blocks, the synthetic sleep model), the sequential container's
 * grad_ready reports from its weight half, and the errors of the split
 * calls. */
#include <string.h>

#include "axon/models/layers/basic.h"
#include "axon/models/layers/transformer.h"
#include "axon/models/layers/vision.h"
#include "axon/models/model.h"
#include "harness.h"
#include "split_testutil.h"

#define TINY_BERT "layers=2,hidden=16,heads=2,ff=32,vocab=50,seq=8"

/* Blocks [first, last) of model `name` with `config`, in a sequential
 * container. */
static ax_module *blocks(const char *name, const char *config, int first,
                         int last) {
  const ax_model_def *def = ax_model_find(name);
  assert_non_null(def);
  ax_config cfg;
  AX_ASSERT_OK(ax_model_config(def, config, &cfg));
  ax_module *root = ax_sequential_new();
  assert_non_null(root);
  for (int i = first; i < last; i++) {
    ax_module *b;
    AX_ASSERT_OK(def->build_block(&cfg, i, &b));
    AX_ASSERT_OK(ax_module_add(root, b));
  }
  return root;
}

static ax_tensor *randn4(uint64_t seed, int64_t n, int64_t c, int64_t h,
                         int64_t w) {
  int64_t shape[4] = {n, c, h, w};
  return ax_test_randn(seed, 1.0f, 4, shape);
}

static void mlp(void **state) {
  ax_tensor *x = randn4(3, 3, 1, 3, 4);
  ax_tlist in = ax_tlist1(x), in2 = ax_test_other_unit(&in, 1, 0.5f, -0.2f);
  ax_test_gradcheck_split(blocks("mlp", "widths=12/8/6/3", 0, 3), &in, 1, 60,
                          1e-3, 1e-3, 1e-2);
  for (int need_dx = 0; need_dx <= 1; need_dx++)
    ax_test_split_matches_fused(blocks("mlp", "widths=12/8/6/3", 0, 3), &in,
                                &in2, need_dx);
  ax_tlist_clear(&in2);
  ax_tensor_release(x);
}

#define RESNET "in_channels=3,classes=10,image=8"

static void resnet20(void **state) {
  /* block4: the first 32-channel block, stride 2 with a projection. */
  ax_tensor *x = randn4(11, 2, 16, 8, 8);
  ax_tlist in = ax_tlist1(x);
  ax_test_gradcheck_split(blocks("resnet20", RESNET, 4, 5), &in, 1, 40, 1e-3,
                          5e-3, 3e-2);
  ax_tensor_release(x);
  /* The whole model, halves against the fused backward. */
  x = randn4(12, 2, 3, 8, 8);
  ax_tlist img = ax_tlist1(x), img2 = ax_test_other_unit(&img, 1, -1.0f, 0.1f);
  for (int need_dx = 0; need_dx <= 1; need_dx++)
    ax_test_split_matches_fused(blocks("resnet20", RESNET, 0, 11), &img, &img2,
                                need_dx);
  ax_tlist_clear(&img2);
  ax_tensor_release(x);
}

/* BERT inputs {ids, segments, mask}; sequence 1 has its last 3 positions
 * padded. */
static void bert_inputs(uint64_t seed, int B, int S, ax_tlist *in) {
  int64_t shape[2] = {B, S};
  in->n = 3;
  in->t[0] = ax_test_randint(seed, 0, 50, 2, shape);
  in->t[1] = ax_test_randint(seed + 1, 0, 2, 2, shape);
  in->t[2] = ax_tensor_new(AX_F32, 2, shape, AX_CPU);
  assert_non_null(in->t[2]);
  for (int b = 0; b < B; b++)
    for (int s = 0; s < S; s++)
      ax_f32(in->t[2])[b * S + s] = (b == 1 && s >= S - 3) ? 0.0f : 1.0f;
}

static void bert_layer(void **state) {
  int64_t shape[3] = {2, 8, 16};
  ax_tensor *h = ax_test_randn(4, 1.0f, 3, shape);
  ax_tlist in = {0};
  bert_inputs(5, 2, 8, &in);
  ax_tlist pair = {2, {h, in.t[2]}};
  ax_tlist pair2 = ax_test_other_unit(&pair, 1, 0.7f, 0.1f);
  ax_test_gradcheck_split(blocks("bert", TINY_BERT, 1, 2), &pair, 1, 60, 1e-2,
                          2e-3, 3e-2);
  for (int need_dx = 0; need_dx <= 1; need_dx++)
    ax_test_split_matches_fused(blocks("bert", TINY_BERT, 1, 2), &pair, &pair2,
                                need_dx);
  ax_tlist_clear(&pair2);
  ax_tlist_clear(&in);
  ax_tensor_release(h);
}

/* The whole tiny BERT: its embeddings and heads blocks define their own
 * module operations. */
static void bert_model(void **state) {
  ax_tlist in = {0}, in2 = {0};
  bert_inputs(31, 2, 8, &in);
  bert_inputs(41, 2, 8, &in2);
  /* The step of test_bert's whole-model check (small embedding sums). */
  ax_test_gradcheck_split(blocks("bert", TINY_BERT ",dropout=0", 0, 4), &in, 0,
                          80, 3e-3, 2e-3, 3e-2);
  for (int need_dx = 0; need_dx <= 1; need_dx++)
    ax_test_split_matches_fused(blocks("bert", TINY_BERT, 0, 4), &in, &in2,
                                need_dx);
  ax_tlist_clear(&in);
  ax_tlist_clear(&in2);
}

/* The sleep model's halves pass the gradient through; w_ms is checked. */
static void sleep_model(void **state) {
  const char *cfg = "blocks=2,fwd_ms=0,bwd_ms=2,w_ms=1,width=6,classes=3";
  int64_t shape[2] = {4, 6};
  ax_tensor *x = ax_test_randn(6, 1.0f, 2, shape);
  ax_tlist in = ax_tlist1(x), in2 = ax_test_other_unit(&in, 1, 2.0f, 0.0f);
  for (int need_dx = 0; need_dx <= 1; need_dx++)
    ax_test_split_matches_fused(blocks("sleep", cfg, 0, 2), &in, &in2, need_dx);
  ax_tlist_clear(&in2);
  ax_tensor_release(x);
  const ax_model_def *def = ax_model_find("sleep");
  ax_config c;
  AX_ASSERT_OK(ax_model_config(def, "bwd_ms=4,w_ms=5", &c));
  ax_model_info info;
  AX_ASSERT_ERR(def->describe(&c, &info), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "w_ms"));
}

/* ---- grad_ready ---- */

typedef struct ranges {
  int n;
  size_t off[8], len[8];
} ranges;

static void record(void *user, size_t off, size_t n) {
  ranges *r = user;
  assert_true(r->n < 8);
  r->off[r->n] = off;
  r->len[r->n++] = n;
}

/* The sequential reports each child's range from its weight half, not
 * from its input half, as its fused backward does. */
static void seq_grad_ready(void **state) {
  ax_module *seq = ax_sequential_new();
  AX_ASSERT_OK(ax_module_add(seq, ax_linear_new(4, 5, 1)));
  AX_ASSERT_OK(ax_module_add(seq, ax_relu_new()));
  AX_ASSERT_OK(ax_module_add(seq, ax_linear_new(5, 3, 1)));
  ax_net *net = ax_net_new(seq, AX_CPU, 1);
  assert_non_null(net);
  int64_t shape[2] = {2, 4}, gshape[2] = {2, 3};
  ax_tensor *x = ax_test_randn(1, 1.0f, 2, shape);
  ax_tensor *g = ax_test_randn(2, 1.0f, 2, gshape);
  ax_tlist in = ax_tlist1(x), dout = ax_tlist1(g), out = {0}, din = {0};
  ranges fused = {0}, split = {0};
  ax_slot *slot = ax_slot_new();
  for (int k = 0; k < 2; k++) {
    ax_exec ex = ax_net_exec(net, 1);
    ex.need_dx = 1;
    ex.grad_ready = record;
    ex.grad_ready_user = k ? &split : &fused;
    AX_ASSERT_OK(ax_forward(net->root, &ex, slot, &in, &out));
    ax_tlist_clear(&out);
    if (k == 0) {
      AX_ASSERT_OK(ax_backward(net->root, &ex, slot, &dout, &din));
    } else {
      AX_ASSERT_OK(ax_backward_input(net->root, &ex, slot, &dout, &din));
      assert_int_equal(split.n, 0);
      AX_ASSERT_OK(ax_backward_weight(net->root, &ex, slot));
    }
    ax_tlist_clear(&din);
  }
  assert_int_equal(fused.n, 2); /* descending: the head first */
  assert_int_equal(fused.off[0], 25);
  assert_int_equal(fused.len[0], 18);
  assert_int_equal(fused.off[1], 0);
  assert_int_equal(fused.len[1], 25);
  assert_int_equal(split.n, fused.n);
  for (int i = 0; i < fused.n; i++) {
    assert_int_equal(split.off[i], fused.off[i]);
    assert_int_equal(split.len[i], fused.len[i]);
  }
  ax_slot_free(slot);
  ax_tensor_release(x);
  ax_tensor_release(g);
  ax_net_free(net);
}

/* ---- errors ---- */

/* A module with only a fused backward (the identity). */
static int id_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                      const ax_tlist *in, ax_tlist *out) {
  *out = ax_tlist1(ax_tensor_retain(in->t[0]));
  return AX_OK;
}

static int id_backward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                       const ax_tlist *dout, ax_tlist *din) {
  *din = ax_tlist1(ax_tensor_retain(dout->t[0]));
  return AX_OK;
}

static const ax_module_ops fused_only_ops = {"fused_only", id_forward,
                                             id_backward};

/* Runs a training forward of net on in into slot. */
static void fwd(ax_net *net, ax_slot *slot, const ax_tlist *in) {
  ax_tlist out = {0};
  AX_ASSERT_OK(ax_net_forward(net, slot, 1, 0, in, &out));
  ax_tlist_clear(&out);
}

static void unsupported(void **state) {
  ax_module *seq = ax_sequential_new();
  AX_ASSERT_OK(ax_module_add(seq, ax_linear_new(4, 4, 1)));
  AX_ASSERT_OK(ax_module_add(seq, ax_module_new(&fused_only_ops, 0)));
  assert_true(ax_module_can_split(seq->children[0]));
  assert_false(ax_module_can_split(seq->children[1]));
  assert_false(ax_module_can_split(seq));
  ax_net *net = ax_net_new(seq, AX_CPU, 1);
  int64_t shape[2] = {2, 4};
  ax_tensor *x = ax_test_randn(1, 1.0f, 2, shape);
  ax_tlist in = ax_tlist1(x), dout = ax_tlist1(x), din = {0};
  ax_slot *slot = ax_slot_new();
  ax_exec ex = ax_net_exec(net, 1);
  fwd(net, slot, &in);
  AX_ASSERT_ERR(ax_backward_input(net->root, &ex, slot, &dout, &din),
                AX_EUNSUPPORTED);
  assert_int_equal(din.n, 0);
  assert_non_null(strstr(ax_errmsg(), "fused_only"));
  AX_ASSERT_ERR(ax_backward_weight(seq->children[1], &ex, slot),
                AX_EUNSUPPORTED);
  /* The fused backward still works on such a tree. */
  fwd(net, slot, &in);
  AX_ASSERT_OK(ax_backward(net->root, &ex, slot, &dout, &din));
  ax_tlist_clear(&din);
  ax_slot_free(slot);
  ax_tensor_release(x);
  ax_net_free(net);
}

/* W before B, B twice, B or W after W, missing arguments: clear errors. */
static void out_of_order(ax_module *m, const ax_tlist *in, const ax_tlist *g) {
  ax_net *net = ax_net_new(m, AX_CPU, 1);
  assert_non_null(net);
  ax_exec ex = ax_net_exec(net, 1);
  ex.need_dx = 1;
  ax_tlist din = {0};
  ax_slot *slot = ax_slot_new();
  const char *kind = m->ops->kind;
  AX_ASSERT_ERR(ax_backward_weight(m, &ex, slot), AX_ESTATE);
  fwd(net, slot, in);
  AX_ASSERT_ERR(ax_backward_weight(m, &ex, slot), AX_ESTATE);
  assert_non_null(strstr(ax_errmsg(), "weight half without input half"));
  AX_ASSERT_OK(ax_backward_input(m, &ex, slot, g, &din));
  ax_tlist_clear(&din);
  AX_ASSERT_ERR(ax_backward_input(m, &ex, slot, g, &din), AX_ESTATE);
  assert_int_equal(din.n, 0);
  AX_ASSERT_OK(ax_backward_weight(m, &ex, slot));
  AX_ASSERT_ERR(ax_backward_weight(m, &ex, slot), AX_ESTATE);
  AX_ASSERT_ERR(ax_backward_input(m, &ex, slot, g, &din), AX_ESTATE);
  assert_non_null(strstr(ax_errmsg(), kind));
  AX_ASSERT_ERR(ax_backward_weight(m, &ex, NULL), AX_EINVAL);
  ex.grads = NULL;
  AX_ASSERT_ERR(ax_backward_input(m, &ex, slot, g, &din), AX_EINVAL);
  ax_slot_free(slot);
  ax_net_free(net);
}

static void state_errors(void **state) {
  int64_t s2[2] = {2, 4}, s3[3] = {2, 3, 4}, s4[4] = {2, 3, 4, 4};
  int64_t se[3] = {2, 4, 4}; /* the embedding's output */
  ax_tensor *x2 = ax_test_randn(1, 1.0f, 2, s2);
  ax_tensor *ge = ax_test_randn(5, 1.0f, 3, se);
  ax_tensor *x3 = ax_test_randn(2, 1.0f, 3, s3);
  ax_tensor *x4 = ax_test_randn(3, 1.0f, 4, s4);
  ax_tensor *ids = ax_test_randint(4, 0, 5, 2, s2);
  ax_tlist l2 = ax_tlist1(x2), l3 = ax_tlist1(x3), l4 = ax_tlist1(x4),
           li = ax_tlist1(ids), le = ax_tlist1(ge);
  out_of_order(ax_linear_new(4, 4, 1), &l2, &l2);
  out_of_order(ax_conv2d_new(3, 3, 3, 1, 1, 0), &l4, &l4);
  out_of_order(ax_batchnorm2d_new(3, 0.1f, 1e-5f), &l4, &l4);
  out_of_order(ax_layernorm_new(4, 1e-5f), &l3, &l3);
  out_of_order(ax_embedding_new(5, 4), &li, &le);
  ax_tensor_release(x2);
  ax_tensor_release(x3);
  ax_tensor_release(x4);
  ax_tensor_release(ids);
  ax_tensor_release(ge);
}

/* A batch norm run in evaluation mode has no backward, split or not. */
static void eval_forward(void **state) {
  ax_net *net = ax_net_new(ax_batchnorm2d_new(3, 0.1f, 1e-5f), AX_CPU, 1);
  int64_t shape[4] = {2, 3, 2, 2};
  ax_tensor *x = ax_test_randn(1, 1.0f, 4, shape);
  ax_tlist in = ax_tlist1(x), out = {0}, din = {0};
  ax_slot *slot = ax_slot_new();
  AX_ASSERT_OK(ax_net_forward(net, slot, 0, 0, &in, &out));
  ax_tlist_clear(&out);
  ax_exec ex = ax_net_exec(net, 1);
  AX_ASSERT_ERR(ax_backward_input(net->root, &ex, slot, &in, &din),
                AX_EUNSUPPORTED);
  ax_slot_free(slot);
  ax_tensor_release(x);
  ax_net_free(net);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(mlp),          cmocka_unit_test(resnet20),
      cmocka_unit_test(bert_layer),   cmocka_unit_test(bert_model),
      cmocka_unit_test(sleep_model),  cmocka_unit_test(seq_grad_ready),
      cmocka_unit_test(unsupported),  cmocka_unit_test(state_errors),
      cmocka_unit_test(eval_forward),
  };
  return AX_TEST_MAIN(tests);
}
