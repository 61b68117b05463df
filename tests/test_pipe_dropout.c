/* Dropout replay in the pipeline, with real agent processes: a small BERT
 * with dropout 0.1 trained by
 *  - gpipe with recompute always and except-last (the backward replays
 *    the forward of a micro-batch from its kept input), and gpipe without
 *    recompute as the baseline, against the micro-batched single-process
 *    reference (every micro-batch with the coordinator's per-unit dropout
 *    seed, gradients summed, one step per mini-batch);
 *  - fr (every backward replays the stage with the latest weights) against
 *    the replay reference;
 * within the oracles' tolerance (relative 1e-5 on every parameter). The
 * masks matter: each case is also compared with a reference whose replay
 * draws other masks (seed + 1), which must be off by more than 1e-3. The
 * stages' events are checked as in every pipeline oracle, and every node
 * ends with zero live RRefs, contexts, calls and futures. */
#include <stdlib.h>
#include <string.h>

#define PT_FLOOR_RMS
#include "axon/kernels/clock.h"
#include "tests/pipe_testutil.h"

#define NAGENTS 4
static const char *g_names[NAGENTS] = {"d1", "d2", "d3", "d4"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

#define BERT_CFG "layers=2,hidden=32,heads=2,ff=64,vocab=50,seq=16,dropout=0.1"
#define BERT_B 8
#define BERT_T 16
#define OPTIM "opt=sgd,lr=0.05,momentum=0.9"
#define SEED 5

/* A deterministic BERT mini-batch t: ids, segments, mask (the last three
 * positions of odd sequences padded); MLM labels (B * T) with most
 * positions ignored; NSP labels (B). */
static int bert_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  return ax_test_bert_batch(t, BERT_B, BERT_T, 3, in, lab);
}

/* Trains `steps` mini-batches and compares with the reference of the mode
 * (micro-batched for gpipe), then with the wrong-masks reference. */
static void run_case(int mode, int K, int M, int recompute, int steps) {
  const ax_model_def *def = ax_model_find("bert");
  assert_non_null(def);
  ax_config mcfg;
  ax_model_info info;
  AX_ASSERT_OK(ax_model_config(def, BERT_CFG, &mcfg));
  AX_ASSERT_OK(def->describe(&mcfg, &info));
  int bounds[NAGENTS + 1];
  AX_ASSERT_OK(ax_split_uniform(info.n_blocks, K, bounds));
  ax_pipe_opts o = {"bert", BERT_CFG,  K,     g_names, bounds, mode,
                    M,      recompute, OPTIM, SEED,    AX_CPU, 30000};
  ax_pipe *p;
  double t0 = ax_clock_s();
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, steps, bert_batch, NULL, NULL));
  double t1 = ax_clock_s();
  pt_check_events(p, mode, K, M, recompute, steps);
  pt_ref_opts ro = {ax_pipe_units(mode, M), 0};
  int kind = ref_kind(mode);
  ax_tensor *want[NAGENTS], *wbuf[NAGENTS];
  pt_reference_ex(def, &mcfg, bounds, K, kind, steps, bert_batch, NULL, OPTIM,
                  SEED, &ro, want, wbuf);
  /* Negative control: the replay draws other masks than the forward. */
  ro.replay_seed_delta = 1;
  ax_tensor *off[NAGENTS], *obuf[NAGENTS];
  pt_reference_ex(def, &mcfg, bounds, K, kind, steps, bert_batch, NULL, OPTIM,
                  SEED, &ro, off, obuf);
  double worst_off = pt_worst_stages(p, K, off, obuf);
  double worst = pt_worst_stages(p, K, want, wbuf);
  fprintf(stderr,
          "  bert %-6s K=%d M=%d recompute=%d: %d steps in %.2f s, worst "
          "relative difference %.2g (%.2g against other masks at replay)\n",
          ax_pipe_mode_name(mode), K, M, recompute, steps, t1 - t0, worst,
          worst_off);
  if (worst > 1e-5)
    fail_msg("bert %s K=%d M=%d recompute=%d: relative difference %.3g > "
             "1e-5",
             ax_pipe_mode_name(mode), K, M, recompute, worst);
  assert_true(worst_off > 1e-3);
  ax_pipe_free(p);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_gpipe_recompute_replays_masks(void **state) {
  (void)state;
  run_case(AX_MODE_GPIPE, 3, 4, AX_RECOMPUTE_ALWAYS, 3);
  run_case(AX_MODE_GPIPE, 4, 4, AX_RECOMPUTE_EXCEPT_LAST, 3);
  run_case(AX_MODE_GPIPE, 4, 2, AX_RECOMPUTE_NEVER, 3);
}

static void test_fr_replays_masks(void **state) {
  (void)state;
  run_case(AX_MODE_FR, 3, 1, AX_RECOMPUTE_NEVER, 12);
  run_case(AX_MODE_FR, 4, 1, AX_RECOMPUTE_NEVER, 12);
}

/* Interleaved and zb-h1 (K agents, v stages each) against the
 * micro-batched reference with the coordinator's per-unit dropout seeds;
 * the whole-batch reference (other masks) must be off. */
static void run_case_v(int mode, int K, int v, int M, int steps) {
  const ax_model_def *def = ax_model_find("bert");
  ax_config mcfg;
  ax_model_info info;
  AX_ASSERT_OK(ax_model_config(def, BERT_CFG, &mcfg));
  AX_ASSERT_OK(def->describe(&mcfg, &info));
  int S = K * v, bounds[16 + 1];
  AX_ASSERT_OK(ax_split_uniform(info.n_blocks, S, bounds));
  ax_pipe_opts o = {
      "bert", BERT_CFG, K,      g_names, bounds, mode, M, AX_RECOMPUTE_NEVER,
      OPTIM,  SEED,     AX_CPU, 30000,   NULL,   v};
  ax_pipe *p;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, steps, bert_batch, NULL, NULL));
  pt_ref_opts ro = {M, 0};
  ax_tensor *want[16], *wbuf[16], *off[16], *obuf[16];
  pt_reference_ex(def, &mcfg, bounds, S, REF_SYNC, steps, bert_batch, NULL,
                  OPTIM, SEED, &ro, want, wbuf);
  ro.units = 1; /* one unit per mini-batch: other dropout masks */
  pt_reference_ex(def, &mcfg, bounds, S, REF_SYNC, steps, bert_batch, NULL,
                  OPTIM, SEED, &ro, off, obuf);
  double worst_off = pt_worst_stages(p, S, off, obuf);
  double worst = pt_worst_stages(p, S, want, wbuf);
  fprintf(stderr,
          "  bert %-11s K=%d v=%d M=%d: worst relative difference "
          "%.2g (%.2g against other masks)\n",
          ax_pipe_mode_name(mode), K, v, M, worst, worst_off);
  if (worst > 1e-5)
    fail_msg("bert %s K=%d M=%d: relative difference %.3g > 1e-5",
             ax_pipe_mode_name(mode), K, M, worst);
  assert_true(worst_off > 1e-3);
  ax_pipe_free(p);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_new_schedules_masks(void **state) {
  run_case_v(AX_MODE_INTERLEAVED, 2, 2, 4, 3);
  run_case_v(AX_MODE_ZBH1, 3, 1, 4, 3);
  run_case_v(AX_MODE_ZBH1, 4, 1, 8, 3);
  run_case_v(AX_MODE_ZBV, 2, 2, 4, 3);
}

int main(void) {
  static const char *const args[] = {"--threads", "2", NULL};
  ax_cpu_set_threads(1); /* the references: no OpenMP spinning under load */
  if (mt_start("coord", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpipe_recompute_replays_masks),
      cmocka_unit_test(test_fr_replays_masks),
      cmocka_unit_test(test_new_schedules_masks),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
