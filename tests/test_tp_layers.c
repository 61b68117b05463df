/* Tensor-parallel layers (models/layers/parallel.h) against the whole
 * layer: T members (threads of this process, summing through an in-process
 * all-reduce in rank order) built from the same seed as the whole layer.
 * - Linear column parts (fused Q, K, V: 3 segments) and row parts: every
 *   member's output, input gradient and parameter gradients are the whole
 *   layer's at the member's indices.
 * - Attention by heads and the encoder layer, the causal attention and
 *   the decoder layer (on the fused kernel), T = 2 and 4, dropout on:
 *   output and input gradient equal the whole layer's, with the fused
 *   backward and with the split one (input half, then weight half); one
 *   SGD step of every member's own gradients then gives the same output
 *   as the whole layer's step (so every parameter gradient is right).
 * - Bad groups are refused, and a part run without the group's sum fails.
 * Tolerance: relative 1e-5 of the largest magnitude. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/models/layers/parallel.h"
#include "axon/models/layers/transformer.h"
#include "axon/models/net.h"
#include "harness.h"
#include "tests/tp_testutil.h"

#define MAXT TPT_MAX
#define SEED 4242u

static ax_tensor *randn(int nd, const int64_t *shape, uint64_t seed) {
  ax_tensor *t = ax_tensor_new(AX_F32, nd, shape, AX_CPU);
  ax_rng r;
  ax_rng_seed(&r, seed);
  for (size_t i = 0; i < ax_tensor_numel(t); i++)
    ax_f32(t)[i] = (float)ax_rng_normal(&r);
  return t;
}

static float maxabs(const float *a, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; i++)
    m = fmaxf(m, fabsf(a[i]));
  return m;
}

static void expect_close(const char *what, const float *got, const float *want,
                         size_t n) {
  float tol = 1e-5f * fmaxf(maxabs(want, n), 1e-3f);
  for (size_t i = 0; i < n; i++)
    if (!(fabsf(got[i] - want[i]) <= tol))
      fail_msg("%s[%zu]: %g, the whole layer's %g", what, i, (double)got[i],
               (double)want[i]);
}

/* ---- one layer run on every member at once ------------------------------- */

typedef ax_module *(*make_fn)(ax_tp tp);

typedef struct run {
  tpt_member m;
  ax_net *net;
  int split, has_mask, training;
  const ax_tensor *x, *mask, *dy;
  ax_tensor *y, *dx, *y2; /* output, input gradient, output after a step */
  int err;
} run;

static int fwd(run *r, ax_exec *ex, ax_slot *slot, ax_tensor **y) {
  ax_tlist in = {r->has_mask ? 2 : 1,
                 {(ax_tensor *)r->x, (ax_tensor *)r->mask}},
           out = {0};
  AX_TRY(ax_forward(r->net->root, ex, slot, &in, &out));
  *y = out.t[0];
  out.t[0] = NULL;
  ax_tlist_clear(&out);
  return AX_OK;
}

static int run_member(run *r) {
  ax_exec ex = ax_net_exec(r->net, r->training);
  ex.seed = 77;
  if (r->m.g) {
    ex.tp_allreduce = tpt_sum;
    ex.tp_user = &r->m;
  }
  ax_slot *slot = ax_slot_new();
  ax_tlist dout = ax_tlist1((ax_tensor *)r->dy), din = {0};
  int err = fwd(r, &ex, slot, &r->y);
  if (err == AX_OK && r->split) {
    err = ax_backward_input(r->net->root, &ex, slot, &dout, &din);
    if (err == AX_OK)
      err = ax_backward_weight(r->net->root, &ex, slot);
  } else if (err == AX_OK) {
    err = ax_backward(r->net->root, &ex, slot, &dout, &din);
  }
  if (err == AX_OK) {
    r->dx = din.t[0];
    din.t[0] = NULL;
    for (size_t i = 0; i < r->net->n_params; i++) /* one SGD step */
      ax_f32(r->net->params)[i] -= 0.5f * ax_f32(r->net->grads)[i];
    ax_slot_reset(slot);
    err = fwd(r, &ex, slot, &r->y2);
  }
  ax_tlist_clear(&din);
  ax_slot_free(slot);
  return err;
}

static void *member_main(void *arg) {
  run *r = arg;
  r->err = run_member(r);
  if (r->err != AX_OK)
    fprintf(stderr, "member %d: %s\n", r->m.rank, ax_errmsg());
  return NULL;
}

static void run_free(run *r) {
  ax_tensor_release(r->y);
  ax_tensor_release(r->dx);
  ax_tensor_release(r->y2);
  ax_net_free(r->net);
}

/* Runs the whole layer and T members on (x, mask, dy); the members'
 * outputs, input gradients and outputs after a step must equal the
 * whole's. */
static void compare(const char *name, make_fn make, int T, int split,
                    int has_mask, const ax_tensor *x, const ax_tensor *mask,
                    const ax_tensor *dy) {
  run whole = {{NULL, 0}, ax_net_new(make(AX_TP_WHOLE), AX_CPU, SEED),
               split,     has_mask,
               1,         x,
               mask,      dy};
  assert_non_null(whole.net);
  AX_ASSERT_OK(run_member(&whole));
  tpt_group g = {T};
  pthread_barrier_init(&g.bar, NULL, (unsigned)T);
  run part[MAXT];
  pthread_t th[MAXT];
  for (int t = 0; t < T; t++) {
    part[t] = (run){{&g, t}, ax_net_new(make((ax_tp){T, t}), AX_CPU, SEED),
                    split,   has_mask,
                    1,       x,
                    mask,    dy};
    assert_non_null(part[t].net);
    assert_true(part[t].net->n_params < whole.net->n_params);
  }
  for (int t = 0; t < T; t++)
    pthread_create(&th[t], NULL, member_main, &part[t]);
  for (int t = 0; t < T; t++)
    pthread_join(th[t], NULL);
  size_t ny = ax_tensor_numel(whole.y), nx = ax_tensor_numel(x);
  for (int t = 0; t < T; t++) {
    AX_ASSERT_OK(part[t].err);
    expect_close("output", ax_f32(part[t].y), ax_f32(whole.y), ny);
    expect_close("input gradient", ax_f32(part[t].dx), ax_f32(whole.dx), nx);
    expect_close("output after a step", ax_f32(part[t].y2), ax_f32(whole.y2),
                 ny);
  }
  fprintf(stderr, "  %-9s T=%d %s backward: equal to the whole layer\n", name,
          T, split ? "split" : "fused");
  for (int t = 0; t < T; t++)
    run_free(&part[t]);
  run_free(&whole);
  pthread_barrier_destroy(&g.bar);
}

#define HID 16
#define HEADS 4
#define FF 32

static ax_module *make_attn(ax_tp tp) {
  return ax_mhsa_new_tp(HID, HEADS, 0.2f, 99, tp);
}
static ax_module *make_encoder(ax_tp tp) {
  return ax_encoder_layer_new_tp(HID, HEADS, FF, 0.2f, 99, tp);
}

static ax_module *make_causal(ax_tp tp) {
  return ax_causal_attn_new_tp(HID, HEADS, 0.2f, 99, tp);
}
static ax_module *make_decoder(ax_tp tp) {
  return ax_decoder_layer_new_tp(HID, HEADS, FF, 0.2f, 99, 0.01f, tp);
}

static void test_attention_and_encoder(void **state) {
  int64_t xs[3] = {2, 5, HID}, ms[2] = {2, 5};
  ax_tensor *x = randn(3, xs, 1), *dy = randn(3, xs, 2);
  ax_tensor *mask = ax_tensor_new(AX_F32, 2, ms, AX_CPU);
  for (int i = 0; i < 10; i++) /* the second sequence has 2 padded keys */
    ax_f32(mask)[i] = i < 8 ? 1.0f : 0.0f;
  for (int T = 2; T <= 4; T *= 2)
    for (int split = 0; split < 2; split++) {
      compare("attention", make_attn, T, split, 1, x, mask, dy);
      compare("encoder", make_encoder, T, split, 1, x, mask, dy);
    }
  ax_tensor_release(x);
  ax_tensor_release(dy);
  ax_tensor_release(mask);
}

/* The GPT layers take x alone; 70 positions span two of the fused
 * kernel's query blocks. */
static void test_causal_and_decoder(void **state) {
  int64_t xs[3] = {2, 70, HID};
  ax_tensor *x = randn(3, xs, 5), *dy = randn(3, xs, 6);
  for (int T = 2; T <= 4; T *= 2)
    for (int split = 0; split < 2; split++) {
      compare("causal", make_causal, T, split, 0, x, NULL, dy);
      compare("decoder", make_decoder, T, split, 0, x, NULL, dy);
    }
  ax_tensor_release(x);
  ax_tensor_release(dy);
}

/* Megatron's MLP, a column part then a row part: each on its own and as a
 * pair, whose every member ends with the whole output. */
static ax_module *make_column(ax_tp tp) {
  return ax_linear_column_new(6, 12, 1, 0.0f, 3, tp);
}
static ax_module *make_mlp(ax_tp tp) {
  ax_module *m = ax_sequential_new();
  ax_module_add(m, ax_linear_column_new(6, 8, 1, 0.0f, 1, tp));
  ax_module_add(m, ax_linear_row_new(8, 6, 1, 0.0f, tp));
  return m;
}

static void test_linear_parts(void **state) {
  int64_t xs[2] = {3, 6};
  ax_tensor *x = randn(2, xs, 3), *dy = randn(2, xs, 4);
  for (int T = 2; T <= 2; T++)
    for (int split = 0; split < 2; split++)
      compare("mlp", make_mlp, T, split, 0, x, NULL, dy);
  /* A column part alone: its output is its features of the whole's. */
  ax_net *whole = ax_net_new(make_column(AX_TP_WHOLE), AX_CPU, SEED);
  for (int t = 0; t < 2; t++) {
    ax_net *part = ax_net_new(make_column((ax_tp){2, t}), AX_CPU, SEED);
    assert_int_equal(part->n_params, 3 * 2 * 6 + 3 * 2);
    for (int s = 0; s < 3; s++) /* segment s, its rows 2t, 2t + 1 */
      for (int j = 0; j < 2; j++) {
        int src = s * 4 + t * 2 + j, dst = s * 2 + j;
        assert_memory_equal(ax_f32(part->params) + dst * 6,
                            ax_f32(whole->params) + src * 6, 6 * 4);
        assert_true(ax_f32(part->params)[36 + dst] ==
                    ax_f32(whole->params)[72 + src]);
      }
    ax_net_free(part);
  }
  ax_net_free(whole);
  ax_tensor_release(x);
  ax_tensor_release(dy);
}

/* ax_tp_slice_params gives every member's initial values from the whole
 * layer's, bit for bit, and ax_tp_join_params of every member's gives the
 * whole back; trees that differ are refused. */
static void test_slice_params(void **state) {
  ax_net *whole = ax_net_new(make_encoder(AX_TP_WHOLE), AX_CPU, SEED);
  for (int T = 2; T <= 4; T *= 2) {
    float *joined = calloc(whole->n_params, sizeof *joined);
    for (int t = 0; t < T; t++) {
      ax_net *part = ax_net_new(make_encoder((ax_tp){T, t}), AX_CPU, SEED);
      float *buf = calloc(part->n_params, sizeof *buf);
      AX_ASSERT_OK(ax_tp_slice_params(part->root, whole->root,
                                      ax_f32(whole->params), buf));
      assert_memory_equal(buf, ax_f32(part->params), part->n_params * 4);
      AX_ASSERT_OK(ax_tp_join_params(part->root, whole->root,
                                     ax_f32(part->params), joined));
      free(buf);
      ax_net_free(part);
    }
    /* Every member's part joined: the whole layer, bit for bit. */
    assert_memory_equal(joined, ax_f32(whole->params), whole->n_params * 4);
    free(joined);
  }
  ax_net *other = ax_net_new(make_attn((ax_tp){2, 0}), AX_CPU, SEED);
  float *buf = calloc(other->n_params, sizeof *buf);
  AX_ASSERT_ERR(
      ax_tp_slice_params(other->root, whole->root, ax_f32(whole->params), buf),
      AX_EINVAL);
  free(buf);
  ax_net_free(other);
  ax_net_free(whole);
}

static void test_bad_groups(void **state) {
  assert_null(ax_linear_column_new(6, 12, 1, 0.0f, 3, (ax_tp){3, 0}));
  assert_null(ax_linear_row_new(7, 6, 1, 0.0f, (ax_tp){2, 0}));
  assert_null(ax_linear_row_new(8, 6, 1, 0.0f, (ax_tp){2, 2}));
  assert_null(ax_mhsa_new_tp(HID, HEADS, 0.0f, 1, (ax_tp){3, 0}));
  assert_null(ax_encoder_layer_new_tp(HID, HEADS, 30, 0.0f, 1, (ax_tp){4, 1}));
  assert_null(ax_causal_attn_new_tp(HID, HEADS, 0.0f, 1, (ax_tp){3, 0}));
  assert_null(
      ax_decoder_layer_new_tp(HID, HEADS, 30, 0.0f, 1, 0.01f, (ax_tp){4, 1}));
  assert_null(ax_dropout_new_shard(0.1f, 1, 2, 2));
  /* A part run without the group's sum: a clear error, not a wrong
   * answer. */
  ax_net *part = ax_net_new(make_mlp((ax_tp){2, 0}), AX_CPU, SEED);
  int64_t xs[2] = {3, 6};
  ax_tensor *x = randn(2, xs, 3);
  ax_tlist in = ax_tlist1(x), out = {0};
  ax_exec ex = ax_net_exec(part, 0);
  AX_ASSERT_ERR(ax_forward(part->root, &ex, NULL, &in, &out), AX_ESTATE);
  assert_non_null(strstr(ax_errmsg(), "tensor-parallel"));
  ax_tensor_release(x);
  ax_net_free(part);
}

int main(void) {
  const struct CMUnitTest t[] = {cmocka_unit_test(test_linear_parts),
                                 cmocka_unit_test(test_attention_and_encoder),
                                 cmocka_unit_test(test_causal_and_decoder),
                                 cmocka_unit_test(test_slice_params),
                                 cmocka_unit_test(test_bad_groups)};
  return AX_TEST_MAIN(t);
}
