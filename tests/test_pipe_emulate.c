/* Single-process emulation (runtime/pipeline/schedule/emulate.h) equals the
 * distributed run bit for bit on the CPU, for every mode of the table.
 *
 * Phase 1, a world of real agents on loopback: each mode trains an 8-block
 * MLP over the agents (per-step losses and final parameters kept), then
 * the same run with every stage hosted by the coordinator's own node; the
 * two must be equal to the bit. Phase 2, after the agents left: a world
 * of one (ax_pipe_emulator_new, what `axon-run train --emulate` uses) runs
 * every mode again, again equal to the bit to phase 1's distributed run.
 * The modelled time is the timing model of the measured mean costs
 * (sequential: the sum of every stage's forward and backward). The CLI
 * refuses --emulate with agents and runs it without. A node with 2
 * workers hosts 8 stages through training and evaluation. Zero live RRefs,
 * contexts and calls after every run, on every node. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/pipeline/schedule/emulate.h"
#include "tests/pipe_testutil.h"

#define NAGENTS 3
#define T 5 /* mini-batches per run */
static const char *g_names[NAGENTS] = {"e1", "e2", "e3"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv; /* phase 1: the agents' master; phase 2: emulator */

static const char *g_model_cfg = "widths=48/44/40/36/32/28/24/20/10";
static const char *g_data_cfg = "shape=48,classes=10,examples=256,seed=7";
static const char *g_optim = "opt=sgd,lr=0.05,momentum=0.9";

/* Every mode with its agents and micro-batches: K <= 3, M <= 4. Chunked
 * modes have two stages per agent. */
static const int g_cases[AX_MODE_COUNT][3] = {
    {AX_MODE_SEQUENTIAL, 3, 1}, {AX_MODE_GPIPE, 3, 4},
    {AX_MODE_1F1B, 3, 4},       {AX_MODE_DDG, 3, 1},
    {AX_MODE_FR, 3, 1},         {AX_MODE_PIPEDREAM, 3, 1},
    {AX_MODE_2BW, 3, 4},        {AX_MODE_INTERLEAVED, 2, 4},
    {AX_MODE_ZBH1, 3, 4},       {AX_MODE_ZBV, 2, 4},
    {AX_MODE_DUALPIPEV, 2, 4},  {AX_MODE_VHALF, 2, 4},
    {AX_MODE_VMIN, 2, 4},
};

typedef struct result { /* what a run leaves: plain copies */
  int S;
  long nloss;
  double loss[T];
  float *param[AX_PIPE_MAX_STAGES], *buf[AX_PIPE_MAX_STAGES];
  size_t np[AX_PIPE_MAX_STAGES], nb[AX_PIPE_MAX_STAGES];
} result;
static result g_dist[AX_MODE_COUNT];

static void result_clear(result *r) {
  for (int s = 0; s < AX_PIPE_MAX_STAGES; s++) {
    free(r->param[s]);
    free(r->buf[s]);
  }
  memset(r, 0, sizeof *r);
}

static void on_step(void *user, const ax_pipe_step_info *si) {
  result *r = user;
  if (r->nloss < T)
    r->loss[r->nloss] = si->loss;
  r->nloss++;
}

typedef struct feed {
  pt_data data;
  result *r;
} feed;
static int feed_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  return pt_batch(&((feed *)user)->data, t, in, lab);
}
static void feed_step(void *user, const ax_pipe_step_info *si) {
  on_step(((feed *)user)->r, si);
}

static float *copy_floats(const ax_tensor *t, size_t *n) {
  *n = t ? ax_tensor_numel(t) : 0;
  if (!t)
    return NULL;
  assert_int_equal(t->dtype, AX_F32);
  float *c = malloc(*n * sizeof *c + 1);
  assert_non_null(c);
  memcpy(c, t->data, *n * sizeof *c);
  return c;
}

/* Trains mode case c for T mini-batches with stage owners `agents` (K
 * names) on node n; fills *r. costs (may be NULL) receives the run's
 * measured costs. */
static void run_case(ax_node *n, const char *const *agents, int c, result *r,
                     ax_pipe_costs *costs) {
  int mode = g_cases[c][0], K = g_cases[c][1], M = g_cases[c][2];
  ax_config dcfg;
  feed f = {{NULL, 16}, r};
  memset(r, 0, sizeof *r);
  AX_ASSERT_OK(ax_config_parse(&dcfg, g_data_cfg));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &f.data.ds));
  ax_pipe_opts o = {
      "mlp",   g_model_cfg, K,      agents, NULL, mode, M, AX_RECOMPUTE_NEVER,
      g_optim, 3,           AX_CPU, 30000,  NULL, 2};
  ax_pipe *p = NULL;
  AX_ASSERT_OK(ax_pipe_new(n, &o, &p));
  r->S = ax_pipe_stages(p);
  AX_ASSERT_OK(ax_pipe_train(p, T, feed_batch, feed_step, &f));
  assert_int_equal(r->nloss, T);
  if (costs) {
    ax_pipe_costs_init(costs, &o);
    ax_pipe_costs_add(costs, p);
  }
  for (int s = 0; s < r->S; s++) {
    ax_tensor *pa = NULL, *bu = NULL;
    AX_ASSERT_OK(ax_pipe_stage_state(p, s, &pa, &bu));
    r->param[s] = copy_floats(pa, &r->np[s]);
    r->buf[s] = copy_floats(bu, &r->nb[s]);
    ax_tensor_release(pa);
    ax_tensor_release(bu);
  }
  ax_pipe_free(p);
  ax_dataset_close(f.data.ds);
}

/* Fails unless got equals want to the bit: every loss, parameter and
 * buffer. */
static void assert_same_bits(int c, const char *what, const result *got,
                             const result *want) {
  const char *mode = ax_pipe_mode_name(g_cases[c][0]);
  assert_int_equal(got->S, want->S);
  assert_int_equal(got->nloss, want->nloss);
  for (long t = 0; t < T; t++)
    if (memcmp(&got->loss[t], &want->loss[t], sizeof(double)))
      fail_msg("%s, %s: loss of step %ld %.17g != distributed %.17g", mode,
               what, t, got->loss[t], want->loss[t]);
  for (int s = 0; s < got->S; s++) {
    assert_int_equal(got->np[s], want->np[s]);
    assert_int_equal(got->nb[s], want->nb[s]);
    for (size_t i = 0; i < got->np[s]; i++)
      if (memcmp(&got->param[s][i], &want->param[s][i], sizeof(float)))
        fail_msg("%s, %s: stage %d parameter %zu %.9g != distributed %.9g",
                 mode, what, s, i, got->param[s][i], want->param[s][i]);
    if (got->nb[s] &&
        memcmp(got->buf[s], want->buf[s], got->nb[s] * sizeof(float)))
      fail_msg("%s, %s: stage %d buffers differ", mode, what, s);
  }
  fprintf(stderr,
          "  %-11s %s: %d stages, %d steps: equal to the bit "
          "(last loss %.6f)\n",
          mode, what, got->S, T, got->loss[T - 1]);
}

/* Phase 1: distributed over the agents, then hosted by this node. */
static void test_self_hosted_equals_distributed(void **state) {
  const char *self[AX_PIPE_MAX_STAGES];
  for (int s = 0; s < AX_PIPE_MAX_STAGES; s++)
    self[s] = ax_node_name(g_drv);
  for (int c = 0; c < AX_MODE_COUNT; c++) {
    run_case(g_drv, g_names, c, &g_dist[c], NULL);
    AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
    result r;
    run_case(g_drv, self, c, &r, NULL);
    assert_same_bits(c, "hosted by the coordinator", &r, &g_dist[c]);
    result_clear(&r);
    AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
  }
}

/* Phase 2: a world of one, as axon-run --emulate. */
static void test_emulator_equals_distributed(void **state) {
  const char *self[AX_PIPE_MAX_STAGES];
  for (int s = 0; s < AX_PIPE_MAX_STAGES; s++)
    self[s] = ax_node_name(g_drv);
  assert_int_equal(ax_node_world_size(g_drv), 1);
  for (int c = 0; c < AX_MODE_COUNT; c++) {
    assert_int_equal(g_dist[c].nloss, T); /* phase 1 ran */
    result r;
    ax_pipe_costs costs;
    run_case(g_drv, self, c, &r, &costs);
    assert_same_bits(c, "emulated (world of one)", &r, &g_dist[c]);
    int S = r.S, split = ax_pipe_mode_get(g_cases[c][0])->split;
    result_clear(&r);
    double spb = 0;
    AX_ASSERT_OK(ax_pipe_costs_model(&costs, &spb));
    assert_true(spb > 0);
    double tf[AX_PIPE_MAX_STAGES], tb[AX_PIPE_MAX_STAGES],
        tw[AX_PIPE_MAX_STAGES];
    AX_ASSERT_OK(ax_pipe_costs_times(&costs, tf, tb, tw));
    for (int s = 0; s < S; s++) /* weight halves only where split */
      assert_true(tf[s] > 0 && tb[s] >= 0 && (split ? tw[s] > 0 : !tw[s]));
    if (g_cases[c][0] == AX_MODE_SEQUENTIAL) {
      /* Nothing overlaps: the sum of the stages' costs. */
      double sum = 0;
      for (int s = 0; s < g_cases[c][1]; s++)
        sum += tf[s] + tb[s];
      assert_true(fabs(spb - sum) <= 1e-9 * sum);
    }
    if (g_cases[c][0] == AX_MODE_FR) /* every backward replays */
      for (int s = 0; s < S; s++)
        assert_true(costs.b[s] < 0 && costs.br[s] > 0 &&
                    tb[s] == (costs.br[s] > tf[s] ? costs.br[s] - tf[s] : 0));
    AX_ASSERT_OK(dt_wait_counts(g_drv, NULL, 0, 0, 0));
    AX_ASSERT_OK(rt_local_zero());
  }
  ax_pipe_costs none;
  ax_pipe_opts o = {.mode = AX_MODE_PIPEDREAM, .K = 2, .M = 1};
  ax_pipe_costs_init(&none, &o);
  double spb = 0;
  assert_int_equal(ax_pipe_costs_model(&none, &spb), AX_ESTATE);
}

/* More stages than workers: 8 stages on a node with 2 handler threads.
 * Evaluation issues every stage's forward at once, so most of them wait
 * for their inputs on the workers; the pushes that deliver the inputs run
 * on the pushing thread (a local call of an inline handler), never queued
 * behind those waiting forwards. */
static void test_more_stages_than_workers(void **state) {
  static const char *wide = "widths=512/512/512/512/512/512/512/512/10";
  const char *self[8];
  for (int s = 0; s < 8; s++)
    self[s] = ax_node_name(g_drv);
  ax_config dcfg;
  pt_data data = {NULL, 128};
  AX_ASSERT_OK(ax_config_parse(&dcfg, "shape=512,classes=10,examples=512"));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
  ax_pipe_opts o = {"mlp",   wide,
                    8,       self,
                    NULL,    AX_MODE_PIPEDREAM,
                    1,       AX_RECOMPUTE_NEVER,
                    g_optim, 3,
                    AX_CPU,  20000,
                    NULL,    0};
  ax_pipe *p = NULL;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, 3, pt_batch, NULL, &data));
  double acc = -1, loss = -1;
  AX_ASSERT_OK(ax_pipe_evaluate(p, 4, pt_batch, &data, &acc, &loss));
  assert_true(acc >= 0 && acc <= 1 && loss > 0);
  ax_pipe_free(p);
  ax_dataset_close(data.ds);
  AX_ASSERT_OK(dt_wait_counts(g_drv, NULL, 0, 0, 0));
  AX_ASSERT_OK(rt_local_zero());
}

/* The CLI: --emulate with agents is refused; without, it trains and
 * reports the modelled time. */
static int run_cli(const char *args, char *out, size_t len) {
  char bin[4096], cmd[8192];
  mt_bin_path("axon-run", bin, sizeof bin);
  snprintf(cmd, sizeof cmd, "%s train %s 2>&1", bin, args);
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  size_t n = fread(out, 1, len - 1, f);
  out[n] = 0;
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli(void **state) {
  static char out[1 << 16];
  assert_int_equal(run_cli("--emulate --stages 2 --local 2", out, sizeof out),
                   2);
  assert_non_null(strstr(out, "--emulate needs --stages K"));
  assert_int_equal(
      run_cli("--emulate --model mlp --dataset synthetic", out, sizeof out), 2);
  assert_int_equal(
      run_cli("--emulate --stages 2 --mode zbv --model mlp --model-config "
              "widths=48/40/32/24/10 --dataset synthetic --data-config "
              "shape=48,classes=10,examples=256 --steps 6 --batch 16 "
              "--eval-limit 64 --quiet --eval-every-epoch",
              out, sizeof out),
      0);
  assert_non_null(strstr(out, "emulated=1"));
  assert_non_null(strstr(out, "modelled_seconds="));
  assert_non_null(strstr(out, "epoch: 1 steps=6"));
  /* --eval-every N: an evaluation every N steps and after the last. */
  assert_int_equal(
      run_cli("--emulate --stages 2 --mode pipedream --model mlp "
              "--model-config widths=48/40/32/24/10 --dataset synthetic "
              "--data-config shape=48,classes=10,examples=256 --steps 7 "
              "--batch 16 --eval-limit 64 --quiet --eval-every 3",
              out, sizeof out),
      0);
  assert_non_null(strstr(out, "epoch: 1 steps=3 "));
  assert_non_null(strstr(out, "epoch: 1 steps=6 "));
  assert_non_null(strstr(out, "epoch: 1 steps=7 "));
}

/* The worlds, as setup and teardown of their tests, so that the nodes'
 * caches (recycled gradient buffers) are gone before the leak check. */
static int world_start(void **state) {
  static const char *const args[] = {"--threads", "4", NULL};
  return mt_start("coordi", g_names, NAGENTS, args, g_pids, &g_drv);
}
static int world_end(void **state) {
  mt_end(g_drv, g_pids, NAGENTS);
  g_drv = NULL;
  return 0;
}
static int emulator_start(void **state) {
  int err = ax_pipe_emulator_new("emu", 0, &g_drv);
  if (err != AX_OK)
    fprintf(stderr, "emulator: %s\n", ax_errmsg());
  return err;
}
static int emulator2_start(void **state) {
  int err = ax_pipe_emulator_new("emu2", 2, &g_drv);
  if (err != AX_OK)
    fprintf(stderr, "emulator: %s\n", ax_errmsg());
  return err;
}
static int emulator2_end(void **state) {
  ax_pipe_emulator_free(g_drv);
  g_drv = NULL;
  return 0;
}
static int emulator_end(void **state) {
  ax_pipe_emulator_free(g_drv);
  g_drv = NULL;
  for (int c = 0; c < AX_MODE_COUNT; c++)
    result_clear(&g_dist[c]);
  return 0;
}

int main(void) {
  /* The CLI first, before this process starts gRPC; then the agents'
   * world (phase 1), then the world of one (phase 2). */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cli),
      cmocka_unit_test_setup_teardown(test_self_hosted_equals_distributed,
                                      world_start, world_end),
      cmocka_unit_test_setup_teardown(test_emulator_equals_distributed,
                                      emulator_start, emulator_end),
      cmocka_unit_test_setup_teardown(test_more_stages_than_workers,
                                      emulator2_start, emulator2_end),
  };
  return AX_TEST_MAIN(tests);
}
