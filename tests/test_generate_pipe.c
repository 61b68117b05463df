/* Decoding through a pipeline's stages (runtime/pipeline/coord/decode.h,
 * the stage host's decoding sessions) against the same model in one net
 * (models/generate.h), in a world of one (the emulator: the stage hosts
 * are this process's, so the tensor check at the end sees their caches).
 * The model is a toy causal language model registered here, whose middle
 * block keeps a running sum over the positions as its cache, so the
 * plumbing is checked apart from any attention layer:
 *  - the pipeline's logits equal the net's, call by call, and the same
 *    seed samples the same tokens;
 *  - each session's caches live on the stages until decoder_end (or the
 *    pipeline's teardown), two sessions at once;
 *  - a decode at a position the session does not hold is refused, one
 *    past the capacity too, and position 0 starts the session anew;
 *  - zero live RRefs, contexts and calls after each case. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "axon/models/generate.h"
#include "axon/models/layers/transformer.h"
#include "axon/models/model.h"
#include "axon/runtime/pipeline/coord/decode.h"
#include "axon/runtime/pipeline/schedule/emulate.h"
#include "tests/gen_testutil.h"
#include "tests/harness.h"
#include "tests/mp_testutil.h"

enum { V = 12, D = 6, S = 16 }; /* vocab, width, capacity */

/* ---- the toy model: embedding, running mean, head ---------------------- */

/* y[b, t] = tanh(x[b, t] + mean of x[b, 0 .. t]) over (B, T, D); in
 * kv_decode the slot keeps the sums of the earlier positions (B, D) and
 * their count. */
static int mean_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                        const ax_tlist *in, ax_tlist *out) {
  const ax_tensor *x = in->t[0];
  int64_t B = x->shape[0], T = x->shape[1], pos = 0;
  ax_tensor *sum = NULL;
  if (ex->kv_decode) {
    pos = ex->kv_pos;
    if (pos + T > S)
      return ax_seterr(AX_EINVAL, "toy: the cache holds %d positions", S);
    sum = ax_slot_get(slot, 0);
    if (pos > 0 && (!sum || ax_slot_int(slot, 0) != pos))
      return ax_seterr(AX_ESTATE, "toy: no cache of %lld positions",
                       (long long)pos);
    if (pos == 0 || !sum) {
      sum = ax_tensor_zeros(AX_F32, 2, (int64_t[]){B, D}, AX_CPU);
      ax_slot_put(slot, 0, sum);
      ax_tensor_release(sum);
    }
  }
  float acc[64 * D];
  for (int64_t i = 0; i < B * D; i++)
    acc[i] = sum ? ax_f32(sum)[i] : 0;
  ax_tensor *y = ax_tensor_like(x);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      for (int d = 0; d < D; d++) {
        float v = ax_f32(x)[(b * T + t) * D + d];
        acc[b * D + d] += v;
        ax_f32(y)[(b * T + t) * D + d] =
            tanhf(v + acc[b * D + d] / (float)(pos + t + 1));
      }
  if (sum) {
    memcpy(ax_f32(sum), acc, (size_t)(B * D) * sizeof(float));
    ax_slot_set_int(slot, 0, pos + T);
  }
  *out = ax_tlist1(y);
  return AX_OK;
}

static const ax_module_ops g_mean_ops = {"toy_mean", mean_forward};

/* logits (B T, V) = x (B, T, D) W (D, V). */
static int head_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                        const ax_tlist *in, ax_tlist *out) {
  const ax_tensor *x = in->t[0];
  int64_t rows = x->shape[0] * x->shape[1];
  ax_tensor *y = ax_tensor_zeros(AX_F32, 2, (int64_t[]){rows, V}, AX_CPU);
  const float *w = ax_param(m, ex, 0);
  for (int64_t r = 0; r < rows; r++)
    for (int d = 0; d < D; d++)
      for (int v = 0; v < V; v++)
        ax_f32(y)[r * V + v] += ax_f32(x)[r * D + d] * w[d * V + v];
  *out = ax_tlist1(y);
  return AX_OK;
}

static void head_init(ax_module *m, float *params, float *buffers,
                      ax_rng *rng) {
  for (int i = 0; i < D * V; i++)
    params[i] = (float)ax_rng_normal(rng);
}

static const ax_module_ops g_head_ops = {"toy_head", head_forward, NULL,
                                         head_init};

static int toy_describe(const ax_config *cfg, ax_model_info *info) {
  memset(info, 0, sizeof *info);
  info->n_blocks = 3;
  strcpy(info->block_names[0], "embed");
  strcpy(info->block_names[1], "mean");
  strcpy(info->block_names[2], "head");
  info->n_outputs = 1;
  info->ignore_index = -100;
  return AX_OK;
}

static int toy_block(const ax_config *cfg, int index, ax_module **out) {
  if (index == 0)
    *out = ax_embedding_new(V, D);
  else if (index == 1)
    *out = ax_module_new(&g_mean_ops, 0);
  else if ((*out = ax_module_new(&g_head_ops, 0)))
    (*out)->n_params = D * V;
  return *out ? AX_OK : AX_ENOMEM;
}

static const ax_model_def g_toy = {"toylm", "", toy_describe, toy_block};

/* ---- the checks ---------------------------------------------------------- */

static ax_node *g_node;
static const char *g_agents[3];

static void make_pipe(int K, ax_pipe **p) {
  ax_pipe_opts o = {.model = "toylm",
                    .K = K,
                    .agents = g_agents,
                    .mode = AX_MODE_SEQUENTIAL,
                    .M = 1,
                    .optim_config = "opt=sgd,momentum=0",
                    .seed = 5,
                    .device = AX_CPU};
  AX_ASSERT_OK(ax_pipe_new(g_node, &o, p));
}

static void make_net(ax_net **net) {
  ax_config c;
  AX_ASSERT_OK(ax_model_config(&g_toy, "", &c));
  AX_ASSERT_OK(ax_model_stage(&g_toy, &c, 0, 3, AX_CPU, 5, net));
}

static void zero_everywhere(void) {
  AX_ASSERT_OK(dt_all_zero(g_node, NULL, 0));
}

/* Logits of a decoder call, compared with the net decoder's. */
static void same_step(ax_pipe_decoder *d, ax_net_decoder *nd, int64_t pos,
                      const int32_t *ids, int n) {
  ax_tensor *a = NULL, *b = NULL;
  AX_ASSERT_OK(ax_pipe_decode(d, pos, ids, n, &a));
  AX_ASSERT_OK(ax_net_decode(nd, pos, ids, n, &b));
  assert_int_equal(ax_tensor_numel(a), V);
  assert_int_equal(ax_tensor_numel(b), V);
  assert_memory_equal(ax_f32(a), ax_f32(b), V * sizeof(float));
  ax_tensor_release(a);
  ax_tensor_release(b);
}

static void test_pipe_equals_net(void **state) {
  ax_pipe *p;
  ax_net *net;
  make_pipe(3, &p);
  make_net(&net);
  ax_pipe_decoder d;
  ax_net_decoder nd;
  AX_ASSERT_OK(ax_pipe_decoder_init(&d, p));
  AX_ASSERT_OK(ax_net_decoder_init(&nd, net));
  int32_t prompt[4] = {3, 1, 4, 1};
  same_step(&d, &nd, 0, prompt, 4);
  assert_int_equal(d.sessions, 3); /* one per stage */
  assert_true(d.cache_bytes > 0);
  same_step(&d, &nd, 4, &prompt[2], 2); /* two at once */
  same_step(&d, &nd, 6, &prompt[0], 1);
  /* the same seed samples the same tokens through either decoder */
  gen_same_samples(&d, &nd, prompt, 4, 8, 0, 11);
  gen_end_all(&d);
  ax_net_decoder_free(&nd);
  ax_net_free(net);
  ax_pipe_free(p);
  zero_everywhere();
}

/* Two sessions at once, positions refused, capacity, a teardown with a
 * session still open. */
static void test_sessions(void **state) {
  ax_pipe *p;
  make_pipe(2, &p);
  ax_pipe_decoder d1, d2;
  AX_ASSERT_OK(ax_pipe_decoder_init(&d1, p));
  AX_ASSERT_OK(ax_pipe_decoder_init(&d2, p));
  assert_true(d1.session != d2.session);
  int32_t ids[S + 1] = {0};
  ax_tensor *l = NULL;
  AX_ASSERT_OK(ax_pipe_decode(&d1, 0, ids, 3, &l));
  ax_tensor_release(l);
  AX_ASSERT_OK(ax_pipe_decode(&d2, 0, ids, 2, &l));
  ax_tensor_release(l);
  assert_int_equal(d2.sessions, 4); /* two per stage */
  /* d1 holds 3 positions: a decode at 2 is refused */
  AX_ASSERT_ERR(ax_pipe_decode(&d1, 2, ids, 1, &l), AX_ESTATE);
  assert_null(l);
  /* a stage that fails (an id out of the vocabulary, on stage 0) fails
   * the call at once, naming the stage: the next one, waiting for its
   * input, is not left to its deadline */
  int32_t bad = V + 3;
  int64_t t0 = ax_clock_ms();
  AX_ASSERT_ERR(ax_pipe_decode(&d1, 3, &bad, 1, &l), AX_EINVAL);
  assert_true(ax_clock_ms() - t0 < 10000);
  assert_non_null(strstr(ax_errmsg(), "stage 0"));
  assert_null(strstr(ax_errmsg(), "released")); /* stage 0's own error */
  /* ... and the session is unusable until position 0 starts it anew */
  AX_ASSERT_ERR(ax_pipe_decode(&d1, 4, ids, 1, &l), AX_ESTATE);
  AX_ASSERT_OK(ax_pipe_decode(&d1, 0, ids, S - 1, &l));
  ax_tensor_release(l);
  AX_ASSERT_OK(ax_pipe_decode(&d1, S - 1, ids, 1, &l));
  ax_tensor_release(l);
  AX_ASSERT_ERR(ax_pipe_decode(&d1, S, ids, 1, &l), AX_EINVAL); /* full */
  AX_ASSERT_OK(ax_pipe_decoder_end(&d1));
  assert_int_equal(d1.sessions, 2); /* d2's */
  /* d2 stays open: the teardown drops its caches */
  ax_pipe_free(p);
  zero_everywhere();
}

/* The world of one, started and ended as the first and last cases so
 * that the tensor check after them sees everything the stages held. */
static void start_world(void **state) {
  AX_ASSERT_OK(ax_model_register(&g_toy));
  AX_ASSERT_OK(ax_pipe_emulator_new("gen", 0, &g_node));
  for (int s = 0; s < 3; s++)
    g_agents[s] = ax_node_name(g_node);
}

static void end_world(void **state) {
  ax_pipe_emulator_free(g_node);
  g_node = NULL;
  AX_ASSERT_OK(ax_model_unregister("toylm"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(start_world),
      cmocka_unit_test(test_pipe_equals_net),
      cmocka_unit_test(test_sessions),
      cmocka_unit_test(end_world),
  };
  return AX_TEST_MAIN(tests);
}
