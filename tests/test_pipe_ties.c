/* Tied parameters across pipeline stages (models/model.h), with 4 real
 * agent processes on loopback that load the model "tied" from a plugin
 * (tests/tie_model.c: an embedding table, two hidden layers and an output
 * layer whose weight is the table). Against the single-process reference
 * (tests/pipe_testutil.h, its tied copies summed by ax_model_tie_grads),
 * bit for bit in the tree sum order, and with the two copies bit-identical
 * on every stage and replica after every run:
 *  - both copies on one stage (K = 1), on two stages (K = 2) and on the
 *    first and last of four (K = 4); with 2 replicas; with ZeRO over 2
 *    replicas (the tie on one stage, and across two);
 *  - the modes whose STEPs of the two stages share an agent's line (zbv:
 *    stages 0 and 3 on agent 0; interleaved with K = 1) and the
 *    asynchronous ones (pipedream, 2bw, ddg and fr with the copies on
 *    adjacent stages);
 *  - the optimizers on an optimizer host;
 *  - a checkpoint at K = 2 resumed at K = 4;
 *  - negative control: the reference without the ties' sums differs;
 *  - refused: ddg with the copies three stages apart (the forward lock),
 *    a frozen prefix that holds one copy only (at creation and through
 *    ax_pipe_freeze).
 * Then in a world of one (emulate.h: every stage on this process's node)
 * zbv, ZeRO over 2 replicas and 2bw, the same bits.
 * Zero live RRefs, contexts and calls on every node afterwards. */
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/autograd/plugin.h"
#include "axon/runtime/pipeline/schedule/emulate.h"
#include "axon/runtime/pipeline/state/checkpoint.h"
#include "axon/runtime/pipeline/state/freeze.h"
#include "tests/pipe_testutil.h"

#define NAGENTS 4
static const char *g_names[NAGENTS] = {"t1", "t2", "t3", "t4"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;
/* The agents of the runs: the 4 agents, or the emulator's node 16 times
 * (a world of one hosting every stage, emulate.h). */
#define EMU "tieemu"
static const char *g_emu[AX_PIPE_MAX_REPLICAS] = {EMU, EMU, EMU, EMU, EMU, EMU,
                                                  EMU, EMU, EMU, EMU, EMU, EMU,
                                                  EMU, EMU, EMU, EMU};
static const char *const *g_agents = g_names;
static int g_nagents = NAGENTS;
static char g_plugin[4200];

#define CFG "vocab=12,hidden=8,layers=2"
#define VOCAB 12
#define BATCH 8
#define SGD "opt=sgd,lr=0.2,momentum=0.9"
#define ADAMW "opt=adamw,lr=0.05"
#define SEED 5

/* Mini-batch t: BATCH token ids and their next tokens, one ignored. */
static int tie_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  (void)user;
  ax_tensor *x = ax_tensor_new_v(AX_I32, AX_CPU, 1, BATCH),
            *y = ax_tensor_new_v(AX_I32, AX_CPU, 1, BATCH);
  if (!x || !y) {
    ax_tensor_release(x);
    ax_tensor_release(y);
    return AX_ENOMEM;
  }
  for (int i = 0; i < BATCH; i++) {
    int id = (int)((t * 7 + i * 5 + i * i) % VOCAB);
    ax_i32(x)[i] = id;
    ax_i32(y)[i] = i == 3 ? -100 : (int)((id * 3 + 1 + t) % VOCAB);
  }
  *in = ax_tlist1(x);
  *lab = ax_tlist1(y);
  return AX_OK;
}

/* One run: mode, K agents (S stages: K chunks of K), R replicas of M
 * micro-batches, ZeRO, the optimizer, steps, the optimizers on the last
 * agent (an optimizer host). */
typedef struct run {
  int mode, K, chunks, R, M, zero;
  const char *optim;
  int steps, offload;
} run;

/* Zero live RRefs, contexts and calls on every node: the agents and this
 * one, or the emulator's node alone. */
static void all_zero(void) {
  if (g_agents == g_names) {
    AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
    return;
  }
  AX_ASSERT_OK(dt_wait_counts(g_drv, NULL, 0, 0, 0));
  AX_ASSERT_OK(rt_local_zero());
}

static int stages_of(const run *c) {
  return c->K * ax_pipe_chunks(c->mode, c->chunks);
}

static ax_pipe *new_pipe(const run *c) {
  ax_pipe_opts o = {"tied", CFG, c->K,     g_names, NULL,   c->mode,
                    c->M,   0,   c->optim, SEED,    AX_CPU, 30000};
  o.agents = g_agents;
  o.chunks = c->chunks;
  o.optimizer_host = c->offload ? g_agents[g_nagents - 1] : NULL;
  o.replicas = c->R;
  o.zero = c->zero;
  ax_pipe *p = NULL;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  return p;
}

static int same_bits(const float *a, const float *b, size_t n) {
  return !memcmp(a, b, n * sizeof(float));
}

/* The stages' parameters of every replica of p against the reference of
 * S stages (bounds), bit for bit, and the two tied copies equal; frees
 * the references. */
static void check(ax_pipe *p, const run *c, const int *bounds, int S,
                  ax_tensor **want, ax_tensor **wbuf) {
  const ax_model_def *def = ax_model_find("tied");
  ax_config mcfg;
  ax_model_info info;
  AX_ASSERT_OK(ax_model_config(def, CFG, &mcfg));
  AX_ASSERT_OK(ax_model_describe(def, &mcfg, &info));
  const ax_model_tie *t = &info.ties[0];
  int sa = 0, sb = S - 1; /* blocks 0 and L + 1 */
  ax_net *na, *nb;
  AX_ASSERT_OK(
      ax_model_stage(def, &mcfg, bounds[sa], bounds[sa + 1], AX_CPU, 1, &na));
  AX_ASSERT_OK(
      ax_model_stage(def, &mcfg, bounds[sb], bounds[sb + 1], AX_CPU, 1, &nb));
  size_t oa = ax_model_block_offset(na, bounds[sa], t->a) + t->off_a,
         ob = ax_model_block_offset(nb, bounds[sb], t->b) + t->off_b;
  for (int r = 0; r < (c->R > 1 ? c->R : 1); r++) {
    ax_tensor *got[AX_PIPE_MAX_STAGES];
    for (int s = 0; s < S; s++) {
      ax_tensor *gb;
      AX_ASSERT_OK(ax_pipe_stage_state(ax_pipe_replica(p, r), s, &got[s], &gb));
      ax_tensor_release(gb);
      assert_int_equal(ax_tensor_numel(got[s]), ax_tensor_numel(want[s]));
      if (!same_bits(ax_f32(got[s]), ax_f32(want[s]), ax_tensor_numel(want[s])))
        fail_msg("%s K=%d R=%d: replica %d stage %d differs from the "
                 "reference (worst relative difference %.3g)",
                 ax_pipe_mode_name(c->mode), c->K, c->R, r, s,
                 pt_worst(got[s], want[s]));
    }
    if (!same_bits(ax_f32(got[sa]) + oa, ax_f32(got[sb]) + ob, t->len))
      fail_msg("replica %d: the tied copies differ", r);
    for (int s = 0; s < S; s++)
      ax_tensor_release(got[s]);
  }
  ax_net_free(na);
  ax_net_free(nb);
  for (int s = 0; s < S; s++) {
    ax_tensor_release(want[s]);
    ax_tensor_release(wbuf[s]);
  }
}

/* The reference of c's run for `steps` mini-batches with S stages (untied:
 * the negative control without the ties' sums). */
static void reference_ex(const run *c, const int *bounds, int S, int steps,
                         int untied, ax_tensor **want, ax_tensor **wbuf) {
  const ax_model_def *def = ax_model_find("tied");
  ax_config mcfg;
  AX_ASSERT_OK(ax_model_config(def, CFG, &mcfg));
  int R = c->R > 1 ? c->R : 1, U = ax_pipe_units(c->mode, c->M);
  pt_ref_opts ro = {0};
  ro.units = R * U;
  ro.sum_order = AX_SUM_TREE;
  ro.untied = untied;
  pt_reference_ex(def, &mcfg, bounds, S, ref_kind(c->mode), steps, tie_batch,
                  NULL, c->optim, SEED, &ro, want, wbuf);
}

static void reference(const run *c, const int *bounds, int S, int steps,
                      ax_tensor **want, ax_tensor **wbuf) {
  reference_ex(c, bounds, S, steps, 0, want, wbuf);
}

static void run_case(const run *c) {
  int S = stages_of(c), bounds[AX_PIPE_MAX_STAGES + 1];
  AX_ASSERT_OK(ax_split_uniform(4, S, bounds));
  ax_pipe *p = new_pipe(c);
  AX_ASSERT_OK(ax_pipe_train(p, c->steps, tie_batch, NULL, NULL));
  ax_tensor *want[AX_PIPE_MAX_STAGES], *wbuf[AX_PIPE_MAX_STAGES];
  reference(c, bounds, S, c->steps, want, wbuf);
  check(p, c, bounds, S, want, wbuf);
  fprintf(stderr,
          "  %-11s K=%d S=%d R=%d M=%d%s%s: %d steps, same bits as "
          "the reference, tied copies equal\n",
          ax_pipe_mode_name(c->mode), c->K, S, c->R ? c->R : 1, c->M,
          c->zero ? " zero" : "", c->offload ? " optimizer host" : "",
          c->steps);
  ax_pipe_free(p);
  all_zero();
}

static void test_stages_and_replicas(void **state) {
  (void)state;
  static const run runs[] = {
      {AX_MODE_GPIPE, 1, 0, 0, 2, 0, SGD, 3},
      {AX_MODE_1F1B, 2, 0, 0, 2, 0, ADAMW, 3},
      {AX_MODE_GPIPE, 4, 0, 0, 4, 0, SGD, 3},
      {AX_MODE_1F1B, 2, 0, 2, 2, 0, ADAMW, 3},
      {AX_MODE_GPIPE, 1, 0, 2, 2, 1, ADAMW, 3},
      {AX_MODE_1F1B, 2, 0, 2, 2, 1, ADAMW, 3},
      {AX_MODE_1F1B, 2, 0, 0, 2, 0, ADAMW, 3, 1},
  };
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
    run_case(&runs[i]);
}

/* Negative control: without the ties' sums the reference's embedding
 * table (stage 0) and output layer (stage 1) differ from the pipeline's,
 * so the equalities above are the sums' doing. */
static void test_untied_differs(void **state) {
  (void)state;
  run c = {AX_MODE_1F1B, 2, 0, 0, 2, 0, SGD, 3};
  int bounds[3];
  AX_ASSERT_OK(ax_split_uniform(4, 2, bounds));
  ax_pipe *p = new_pipe(&c);
  AX_ASSERT_OK(ax_pipe_train(p, c.steps, tie_batch, NULL, NULL));
  ax_tensor *want[2], *wbuf[2];
  reference_ex(&c, bounds, 2, c.steps, 1, want, wbuf);
  for (int s = 0; s < 2; s++) {
    ax_tensor *got, *gb;
    AX_ASSERT_OK(ax_pipe_stage_state(p, s, &got, &gb));
    double off = pt_worst(got, want[s]);
    fprintf(stderr,
            "  1f1b K=2 against the untied reference: stage %d off "
            "by %.2g\n",
            s, off);
    assert_true(off > 1e-3);
    ax_tensor_release(got);
    ax_tensor_release(gb);
    ax_tensor_release(want[s]);
    ax_tensor_release(wbuf[s]);
  }
  ax_pipe_free(p);
  all_zero();
}

static void test_shared_lines(void **state) {
  (void)state;
  static const run runs[] = {
      {AX_MODE_ZBV, 2, 0, 0, 4, 0, SGD, 3},
      {AX_MODE_INTERLEAVED, 1, 4, 0, 2, 0, SGD, 3},
      {AX_MODE_INTERLEAVED, 2, 2, 0, 2, 0, ADAMW, 3},
  };
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
    run_case(&runs[i]);
}

static void test_async_modes(void **state) {
  (void)state;
  static const run runs[] = {
      {AX_MODE_PIPEDREAM, 2, 0, 0, 1, 0, SGD, 5},
      {AX_MODE_PIPEDREAM, 4, 0, 0, 1, 0, SGD, 6},
      {AX_MODE_2BW, 4, 0, 0, 4, 0, SGD, 4},
      {AX_MODE_DDG, 2, 0, 0, 1, 0, SGD, 5},
      {AX_MODE_FR, 2, 0, 0, 1, 0, SGD, 5},
  };
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
    run_case(&runs[i]);
}

/* 2 steps at K = 2, a checkpoint, 2 more at K = 4: the reference's 4. */
static void test_checkpoint_relayout(void **state) {
  (void)state;
  char root[] = "/tmp/axon_ties_XXXXXX";
  assert_non_null(mkdtemp(root));
  run two = {AX_MODE_1F1B, 2, 0, 0, 2, 0, ADAMW, 2};
  run four = {AX_MODE_1F1B, 4, 0, 0, 2, 0, ADAMW, 2};
  ax_pipe *a = new_pipe(&two);
  AX_ASSERT_OK(ax_pipe_train(a, 2, tie_batch, NULL, NULL));
  ax_ckpt_info in;
  memset(&in, 0, sizeof in);
  in.step = 2;
  in.seed = SEED;
  snprintf(in.model, sizeof in.model, "tied");
  snprintf(in.config, sizeof in.config, "ties");
  AX_ASSERT_OK(ax_pipe_checkpoint(a, root, &in, 2, 0));
  ax_pipe_free(a);
  ax_pipe *b = new_pipe(&four);
  ax_ckpt_info got;
  AX_ASSERT_OK(ax_pipe_restore(b, root, &got));
  assert_int_equal(got.step, 2);
  AX_ASSERT_OK(ax_pipe_train(b, 2, tie_batch, NULL, NULL));
  int bounds[5];
  AX_ASSERT_OK(ax_split_uniform(4, 4, bounds));
  ax_tensor *want[4], *wbuf[4];
  reference(&four, bounds, 4, 4, want, wbuf);
  check(b, &four, bounds, 4, want, wbuf);
  fprintf(stderr, "  1f1b: K=2 to step 2, checkpoint, K=4 to step 4: same "
                  "bits as the reference\n");
  ax_pipe_free(b);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  assert_int_equal(system(cmd), 0);
  all_zero();
}

static void test_refusals(void **state) {
  (void)state;
  ax_pipe_opts o = {"tied", CFG, 4,   g_names, NULL,   AX_MODE_DDG,
                    1,      0,   SGD, SEED,    AX_CPU, 30000};
  o.agents = g_agents;
  ax_pipe *p = NULL;
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EUNSUPPORTED);
  fprintf(stderr, "  ddg K=4: %s\n", ax_errmsg());
  assert_non_null(strstr(ax_errmsg(), "forward lock"));
  int frozen[4] = {1, 2, 3, 4}; /* block 0 frozen, its copy in block 3 not */
  o.mode = AX_MODE_GPIPE;
  o.K = 3;
  o.bounds = frozen;
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL);
  fprintf(stderr, "  frozen prefix [0, 1): %s\n", ax_errmsg());
  assert_non_null(strstr(ax_errmsg(), "frozen"));
  o.K = 2;
  o.bounds = NULL;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  ax_freeze_opts fo = {0};
  fo.blocks = 1;
  assert_int_equal(ax_pipe_freeze(&p, &fo), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "frozen"));
  ax_pipe_free(p);
  all_zero();
}

/* In a world of one (emulate.h): every stage on this process's node, the
 * tie's groups told apart by rank: zbv (both copies' STEPs on one line),
 * 1f1b over 2 replicas with ZeRO, 2bw over 4 stages. */
static void test_emulated(void **state) {
  (void)state;
  static const run runs[] = {
      {AX_MODE_ZBV, 2, 0, 0, 4, 0, SGD, 3},
      {AX_MODE_1F1B, 2, 0, 2, 2, 1, ADAMW, 3},
      {AX_MODE_2BW, 4, 0, 0, 4, 0, SGD, 4},
  };
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
    run_case(&runs[i]);
}

static int world_start(void **state) {
  (void)state;
  const char *args[] = {"--threads", "2", "--plugin", g_plugin, NULL};
  return mt_start("tiecoord", g_names, NAGENTS, args, g_pids, &g_drv);
}
static int world_end(void **state) {
  (void)state;
  mt_end(g_drv, g_pids, NAGENTS);
  g_drv = NULL;
  return 0;
}
static int emulator_start(void **state) {
  (void)state;
  g_agents = g_emu;
  g_nagents = 1;
  int err = ax_pipe_emulator_new(EMU, 12, &g_drv);
  if (err != AX_OK)
    fprintf(stderr, "emulator: %s\n", ax_errmsg());
  return err;
}
static int emulator_end(void **state) {
  (void)state;
  ax_pipe_emulator_free(g_drv);
  g_drv = NULL;
  return 0;
}

int main(void) {
  mt_bin_path("test_plugin_ties.so", g_plugin, sizeof g_plugin);
  if (ax_plugin_load(g_plugin) != AX_OK) { /* the reference builds it too */
    fprintf(stderr, "%s\n", ax_errmsg());
    return 1;
  }
  /* The agents' world for the first six, then a world of one. */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_stages_and_replicas, world_start),
      cmocka_unit_test(test_untied_differs),
      cmocka_unit_test(test_shared_lines),
      cmocka_unit_test(test_async_modes),
      cmocka_unit_test(test_checkpoint_relayout),
      cmocka_unit_test_teardown(test_refusals, world_end),
      cmocka_unit_test_setup_teardown(test_emulated, emulator_start,
                                      emulator_end),
  };
  return AX_TEST_MAIN(tests);
}
