/* The "bert" model: block structure, a whole-model gradient check, stage
 * splits that reproduce the whole model, and the parameter count of the
 * seed study's simplified BERT. */
#include <math.h>
#include <string.h>

#include "axon/models/model.h"
#include "harness.h"

#define TINY "layers=2,hidden=16,heads=2,ff=32,vocab=50,seq=8"

static const ax_model_def *bert(ax_config *cfg, const char *over) {
  const ax_model_def *def = ax_model_find("bert");
  assert_non_null(def);
  AX_ASSERT_OK(ax_model_config(def, over, cfg));
  return def;
}

/* Inputs {ids, segments, mask} of B sequences of S tokens; sequence 1 has
 * its last 3 positions padded. */
static void make_inputs(int B, int S, int vocab, ax_tlist *in) {
  int64_t shape[2] = {B, S};
  in->n = 3;
  in->t[0] = ax_test_randint(31, 0, vocab, 2, shape);
  in->t[1] = ax_test_randint(32, 0, 2, 2, shape);
  in->t[2] = ax_tensor_new(AX_F32, 2, shape, AX_CPU);
  for (int b = 0; b < B; b++)
    for (int s = 0; s < S; s++)
      ax_f32(in->t[2])[b * S + s] = (b == 1 && s >= S - 3) ? 0.0f : 1.0f;
}

static void blocks(void **state) {
  ax_config cfg;
  const ax_model_def *def = bert(&cfg, TINY);
  ax_model_info info;
  AX_ASSERT_OK(def->describe(&cfg, &info));
  assert_int_equal(info.n_blocks, 4);
  assert_string_equal(info.block_names[0], "embed");
  assert_string_equal(info.block_names[1], "layer1");
  assert_string_equal(info.block_names[2], "layer2");
  assert_string_equal(info.block_names[3], "heads");
  assert_int_equal(info.n_outputs, 2);
  assert_int_equal(info.ignore_index, -100);
  /* Defaults: the seed study's L = 3 gives 5 blocks. */
  ax_config dflt;
  bert(&dflt, "");
  AX_ASSERT_OK(def->describe(&dflt, &info));
  assert_int_equal(info.n_blocks, 5);
}

static void output_shapes(void **state) {
  ax_config cfg;
  const ax_model_def *def = bert(&cfg, TINY);
  ax_net *net;
  AX_ASSERT_OK(ax_model_stage(def, &cfg, 0, 4, AX_CPU, 3, &net));
  ax_tlist in = {0}, out = {0};
  make_inputs(3, 8, 50, &in);
  ax_slot *slot = ax_slot_new();
  AX_ASSERT_OK(ax_net_forward(net, slot, 1, 1, &in, &out));
  assert_int_equal(out.n, 2);
  assert_int_equal(out.t[0]->ndim, 2);
  assert_int_equal(out.t[0]->shape[0], 24);
  assert_int_equal(out.t[0]->shape[1], 50);
  assert_int_equal(out.t[1]->shape[0], 3);
  assert_int_equal(out.t[1]->shape[1], 2);
  ax_tlist_clear(&out);
  ax_slot_free(slot);
  ax_tlist_clear(&in);
  ax_net_free(net);
}

static void model_gradcheck(void **state) {
  ax_config cfg;
  const ax_model_def *def = bert(&cfg, TINY ",dropout=0");
  ax_model_info info;
  AX_ASSERT_OK(def->describe(&cfg, &info));
  ax_module *root = ax_sequential_new();
  for (int i = 0; i < info.n_blocks; i++) {
    ax_module *b;
    AX_ASSERT_OK(def->build_block(&cfg, i, &b));
    AX_ASSERT_OK(ax_module_add(root, b));
  }
  ax_tlist in = {0};
  make_inputs(2, 8, 50, &in);
  /* A small step: the embedding sum has a standard deviation of only about
   * 0.035 before its layer norm, so larger steps leave the linear regime. */
  ax_test_gradcheck(root, &in, 0, 80, 3e-3, 2e-3, 3e-2);
  ax_tlist_clear(&in);
}

/* Runs stages in sequence in the given mode; returns the final outputs. */
static void run_stages(ax_net **nets, int n, int training, const ax_tlist *in,
                       ax_tlist *out) {
  ax_tlist cur = {0};
  for (int i = 0; i < in->n; i++)
    cur.t[i] = ax_tensor_retain(in->t[i]);
  cur.n = in->n;
  for (int s = 0; s < n; s++) {
    ax_slot *slot = ax_slot_new();
    ax_tlist next = {0};
    AX_ASSERT_OK(ax_net_forward(nets[s], slot, training, 42, &cur, &next));
    ax_slot_free(slot);
    ax_tlist_clear(&cur);
    cur = next;
  }
  *out = cur;
}

static void split_matches_whole(void **state) {
  ax_config cfg;
  const ax_model_def *def = bert(&cfg, TINY ",dropout=0.1");
  ax_net *whole, *s0, *s1;
  AX_ASSERT_OK(ax_model_stage(def, &cfg, 0, 4, AX_CPU, 5, &whole));
  AX_ASSERT_OK(ax_model_stage(def, &cfg, 0, 2, AX_CPU, 5, &s0));
  AX_ASSERT_OK(ax_model_stage(def, &cfg, 2, 4, AX_CPU, 5, &s1));
  assert_int_equal(whole->n_params, s0->n_params + s1->n_params);
  ax_tlist in = {0};
  make_inputs(2, 8, 50, &in);
  /* Training mode too: dropout masks depend on the block, not the stage. */
  for (int training = 0; training <= 1; training++) {
    ax_tlist a = {0}, b = {0};
    ax_net *one[1] = {whole}, *two[2] = {s0, s1};
    run_stages(one, 1, training, &in, &a);
    run_stages(two, 2, training, &in, &b);
    assert_int_equal(a.n, 2);
    assert_int_equal(b.n, 2);
    for (int k = 0; k < 2; k++) {
      size_t n = ax_tensor_numel(a.t[k]);
      assert_int_equal(n, ax_tensor_numel(b.t[k]));
      assert_memory_equal(ax_f32(a.t[k]), ax_f32(b.t[k]), n * sizeof(float));
    }
    ax_tlist_clear(&a);
    ax_tlist_clear(&b);
  }
  ax_tlist_clear(&in);
  ax_net_free(whole);
  ax_net_free(s0);
  ax_net_free(s1);
}

/* The parameter count of L = 3, H = 768, A = 12, FF = 3072 (vocabulary
 * 8192, 128 positions, 2 segment types), by formula. The blocks are built
 * and laid out but not allocated. */
static void seed_parameter_count(void **state) {
  ax_config cfg;
  const ax_model_def *def = bert(&cfg, "");
  ax_model_info info;
  AX_ASSERT_OK(def->describe(&cfg, &info));
  size_t total = 0;
  for (int i = 0; i < info.n_blocks; i++) {
    ax_module *b;
    AX_ASSERT_OK(def->build_block(&cfg, i, &b));
    size_t np, nb;
    ax_module_layout(b, 0, 0, &np, &nb);
    assert_int_equal(nb, 0);
    total += np;
    ax_module_free(b);
  }
  const size_t L = 3, H = 768, F = 3072, V = 8192, P = 128, T = 2;
  size_t embed = (V + P + T) * H + 2 * H;
  size_t layer = (3 * H * H + 3 * H) + (H * H + H) + 2 * H + (H * F + F) +
                 (F * H + H) + 2 * H;
  size_t heads = (H * H + H) + 2 * H + (H * V + V) + (H * H + H) + (H * 2 + 2);
  assert_int_equal(total, embed + L * layer + heads);
  assert_int_equal(total, 35140354); /* about 35.1 M */
}

static void config_errors(void **state) {
  ax_config cfg;
  const ax_model_def *def = bert(&cfg, "hidden=16,heads=5");
  ax_model_info info;
  AX_ASSERT_ERR(def->describe(&cfg, &info), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "heads=5"));
  ax_module *b = NULL;
  AX_ASSERT_ERR(def->build_block(&cfg, 1, &b), AX_EINVAL);
  assert_null(b);
  bert(&cfg, TINY);
  AX_ASSERT_ERR(def->build_block(&cfg, 4, &b), AX_EINVAL);
  bert(&cfg, TINY ",dropout=1.5");
  AX_ASSERT_ERR(def->describe(&cfg, &info), AX_EINVAL);
  bert(&cfg, TINY ",layers=0");
  AX_ASSERT_ERR(def->describe(&cfg, &info), AX_EINVAL);
}

/* Sequences longer than seq= and out-of-vocabulary ids fail cleanly. */
static void input_errors(void **state) {
  ax_config cfg;
  const ax_model_def *def = bert(&cfg, TINY);
  ax_net *net;
  AX_ASSERT_OK(ax_model_stage(def, &cfg, 0, 1, AX_CPU, 3, &net));
  ax_slot *slot = ax_slot_new();
  ax_tlist in = {0}, out = {0};
  make_inputs(2, 9, 50, &in);
  AX_ASSERT_ERR(ax_net_forward(net, slot, 1, 1, &in, &out), AX_ESHAPE);
  ax_tlist_clear(&in);
  make_inputs(2, 8, 51, &in);
  ax_i32(in.t[0])[5] = 50;
  AX_ASSERT_ERR(ax_net_forward(net, slot, 1, 1, &in, &out), AX_EINVAL);
  ax_tlist_clear(&in);
  ax_slot_free(slot);
  ax_net_free(net);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(blocks),
      cmocka_unit_test(output_shapes),
      cmocka_unit_test(model_gradcheck),
      cmocka_unit_test(split_matches_whole),
      cmocka_unit_test(seed_parameter_count),
      cmocka_unit_test(config_errors),
      cmocka_unit_test(input_errors),
  };
  return AX_TEST_MAIN(t);
}
