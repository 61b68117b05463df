/* The GPT model (models/gpt.c) over 4 real agent processes on loopback,
 * on random token ids:
 *  - 1f1b with K = 2, the embedding and the head (the two copies of the
 *    tied token table) on different stages, dropout on, AdamW, 2 steps:
 *    the single-process reference's parameters (tests/pipe_testutil.h,
 *    tied gradients summed) bit for bit, the tied copies equal; the
 *    same with the backward split into halves (zb-h1) and replayed
 *    (gpipe with recompute, fr), the last stage's loss fused into the head
 *    (ax_forward_xent) and the reference's from the logits;
 *  - a vocabulary of 8192: the last stage's peak state bytes below one
 *    unit's logits (the inputs and labels alone when replayed);
 *  - gpipe with 2 tensor-parallel members per stage (K = 2, 4 agents, SGD):
 *    each member's copies equal, the members' unsplit parameters equal,
 *    the whole within 1e-5 of the reference (the members sum partial
 *    results in another order).
 * Zero live RRefs, contexts and calls on every node afterwards. */
#include <stdlib.h>
#include <string.h>

#define PT_FLOOR_RMS /* relative to the parameters' size (pt_worst) */
#include "axon/models/layers/parallel.h"
#include "tests/pipe_testutil.h"

#define NAGENTS 4
static const char *g_names[NAGENTS] = {"g1", "g2", "g3", "g4"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

#define CFG "layers=2,hidden=16,heads=2,ff=32,seq=8,vocab=32,dropout=0.1"
#define VOCAB 32
#define BATCH 4
#define SEQ 8
#define ADAMW "opt=adamw,lr=0.01"
#define SGD "opt=sgd,lr=0.1,momentum=0.9"
#define SEED 7

/* Mini-batch t: BATCH random windows of SEQ + 1 tokens. */
static int lm_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  (void)user;
  return ax_test_lm_batch(t, BATCH, SEQ, VOCAB, in, lab);
}

/* The two copies of the token table in stages 0 and K - 1 of part p. */
static void copies_equal(ax_pipe *p, const ax_config *mcfg, const int *bounds,
                         int K) {
  const ax_model_def *def = ax_model_find("gpt");
  ax_model_info info;
  AX_ASSERT_OK(ax_model_describe(def, mcfg, &info));
  const ax_model_tie *t = &info.ties[0];
  ax_net *na, *nb;
  AX_ASSERT_OK(ax_model_stage(def, mcfg, bounds[0], bounds[1], AX_CPU, 1, &na));
  AX_ASSERT_OK(
      ax_model_stage(def, mcfg, bounds[K - 1], bounds[K], AX_CPU, 1, &nb));
  size_t oa = ax_model_block_offset(na, bounds[0], t->a) + t->off_a,
         ob = ax_model_block_offset(nb, bounds[K - 1], t->b) + t->off_b;
  ax_tensor *a, *b, *ab, *bb;
  AX_ASSERT_OK(ax_pipe_stage_state(p, 0, &a, &ab));
  AX_ASSERT_OK(ax_pipe_stage_state(p, K - 1, &b, &bb));
  assert_memory_equal(ax_f32(a) + oa, ax_f32(b) + ob, t->len * sizeof(float));
  ax_tensor_release(a), ax_tensor_release(ab);
  ax_tensor_release(b), ax_tensor_release(bb);
  ax_net_free(na);
  ax_net_free(nb);
}

/* A K = 2 run of `mode` (M micro-batches, recompute) for 2 steps against
 * the single-process reference of `kind` (units units per mini-batch),
 * bit for bit, the tied copies equal. The last stage's loss is fused into
 * the head (ax_forward_xent), the reference's comes from the logits: one
 * chunk of rows, the same GEMMs, the same bits. */
static void against_reference(int mode, int M, int recompute, int kind,
                              int units) {
  const ax_model_def *def = ax_model_find("gpt");
  ax_config mcfg;
  AX_ASSERT_OK(ax_model_config(def, CFG, &mcfg));
  int bounds[3] = {0, 2, 4};
  ax_pipe_opts o = {"gpt", CFG,       2,     g_names, bounds, mode,
                    M,     recompute, ADAMW, SEED,    AX_CPU, 60000};
  ax_pipe *p;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, 2, lm_batch, NULL, NULL));
  ax_tensor *want[2], *wbuf[2];
  pt_ref_opts ro = {0};
  ro.units = units;
  pt_reference_ex(def, &mcfg, bounds, 2, kind, 2, lm_batch, NULL, ADAMW, SEED,
                  &ro, want, wbuf);
  for (int s = 0; s < 2; s++) {
    ax_tensor *got, *gb;
    AX_ASSERT_OK(ax_pipe_stage_state(p, s, &got, &gb));
    assert_int_equal(ax_tensor_numel(got), ax_tensor_numel(want[s]));
    if (memcmp(got->data, want[s]->data, ax_tensor_nbytes(got)))
      fail_msg("%s: stage %d differs from the reference (by up to %.3g)",
               ax_pipe_mode_name(mode), s, pt_worst(got, want[s]));
    ax_tensor_release(got), ax_tensor_release(gb);
    ax_tensor_release(want[s]), ax_tensor_release(wbuf[s]);
  }
  copies_equal(p, &mcfg, bounds, 2);
  fprintf(stderr,
          "  gpt %s%s K=2 M=%d, dropout 0.1: 2 steps, same bits as "
          "the reference, tied copies equal\n",
          ax_pipe_mode_name(mode), recompute ? " (recompute)" : "", M);
  ax_pipe_free(p);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_two_stages(void **state) {
  (void)state;
  against_reference(AX_MODE_1F1B, 2, AX_RECOMPUTE_NEVER, REF_SYNC, 2);
}

/* The fused loss's gradients kept for the backward's halves (I, then W),
 * and fused again in the replays of recompute and of fr (from the labels
 * the last stage kept). */
static void test_halves_and_replays(void **state) {
  (void)state;
  against_reference(AX_MODE_ZBH1, 2, AX_RECOMPUTE_NEVER, REF_SYNC, 2);
  against_reference(AX_MODE_GPIPE, 2, AX_RECOMPUTE_ALWAYS, REF_SYNC, 2);
  against_reference(AX_MODE_FR, 1, AX_RECOMPUTE_NEVER, REF_REPLAY, 1);
}

/* A large vocabulary: the last stage's peak state (everything its units
 * keep between forward and backward, as it reports) stays below the bytes
 * of one unit's (rows, vocab) logits, which the fused loss never keeps;
 * replayed, it keeps only the inputs and the labels. */
static void test_last_stage_keeps_no_logits(void **state) {
  (void)state;
  const char *cfg = "layers=2,hidden=16,heads=2,ff=32,seq=8,vocab=8192";
  const int64_t logits = (int64_t)BATCH * SEQ * 8192 * 4,
                inputs_labels = (int64_t)BATCH * SEQ * (16 + 1) * 4;
  int bounds[3] = {0, 2, 4};
  for (int recompute = 0; recompute < 2; recompute++) {
    ax_pipe_opts o = {"gpt", cfg, 2,   g_names, bounds, AX_MODE_GPIPE,
                      1,     0,   SGD, SEED,    AX_CPU, 60000};
    o.recompute = recompute ? AX_RECOMPUTE_ALWAYS : AX_RECOMPUTE_NEVER;
    ax_pipe *p;
    AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
    AX_ASSERT_OK(ax_pipe_train(p, 2, lm_batch, NULL, NULL));
    ax_pipe_stats st;
    ax_pipe_get_stats(p, &st);
    fprintf(stderr,
            "  gpt vocab 8192 gpipe%s: last stage's peak state %lld bytes, "
            "a unit's logits %lld\n",
            recompute ? " (recompute)" : "", (long long)st.peak_bytes[1],
            (long long)logits);
    assert_true(st.peak_bytes[1] > 0 && st.peak_bytes[1] < logits);
    if (recompute)
      assert_int_equal(st.peak_bytes[1], inputs_labels);
    ax_pipe_free(p);
    AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
  }
}

static void test_tensor_parallel(void **state) {
  (void)state;
  const ax_model_def *def = ax_model_find("gpt");
  ax_config mcfg;
  AX_ASSERT_OK(ax_model_config(def, CFG, &mcfg));
  int bounds[3] = {0, 2, 4};
  ax_pipe_opts o = {"gpt", CFG, 2,   g_names, bounds, AX_MODE_GPIPE,
                    2,     0,   SGD, SEED,    AX_CPU, 60000};
  o.tensor_parallel = 2;
  ax_pipe *p;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, 2, lm_batch, NULL, NULL));
  ax_tensor *want[2], *wbuf[2];
  pt_ref_opts ro = {0};
  ro.units = 2;
  pt_reference_ex(def, &mcfg, bounds, 2, REF_SYNC, 2, lm_batch, NULL, SGD, SEED,
                  &ro, want, wbuf);
  for (int t = 0; t < 2; t++) { /* each member's own slices */
    char over[160];
    snprintf(over, sizeof over, "%s,tp=2,tp_rank=%d", CFG, t);
    ax_config pc;
    AX_ASSERT_OK(ax_model_config(def, over, &pc));
    copies_equal(ax_pipe_replica(p, t), &pc, bounds, 2);
  }
  double worst = 0;
  for (int s = 0; s < 2; s++) {
    ax_net *whole;
    AX_ASSERT_OK(ax_model_stage(def, &mcfg, bounds[s], bounds[s + 1], AX_CPU, 1,
                                &whole));
    float *joined = calloc(whole->n_params, sizeof *joined);
    for (int t = 0; t < 2; t++) {
      char over[160];
      snprintf(over, sizeof over, "%s,tp=2,tp_rank=%d", CFG, t);
      ax_config pc;
      ax_net *part;
      AX_ASSERT_OK(ax_model_config(def, over, &pc));
      AX_ASSERT_OK(
          ax_model_stage(def, &pc, bounds[s], bounds[s + 1], AX_CPU, 1, &part));
      ax_tensor *got, *gb;
      AX_ASSERT_OK(ax_pipe_stage_state(ax_pipe_replica(p, t), s, &got, &gb));
      AX_ASSERT_OK(
          ax_tp_join_params(part->root, whole->root, ax_f32(got), joined));
      ax_tensor_release(got), ax_tensor_release(gb);
      ax_net_free(part);
    }
    ax_tensor *j = ax_tensor_new_v(AX_F32, AX_CPU, 1, (int64_t)whole->n_params);
    memcpy(ax_f32(j), joined, whole->n_params * sizeof(float));
    double w = pt_worst(j, want[s]);
    worst = w > worst ? w : worst;
    ax_tensor_release(j);
    free(joined);
    ax_net_free(whole);
    ax_tensor_release(want[s]), ax_tensor_release(wbuf[s]);
  }
  fprintf(stderr,
          "  gpt gpipe K=2 T=2: tied copies equal on each member, "
          "worst relative difference to the reference %.2g\n",
          worst);
  assert_true(worst < 1e-4);
  ax_pipe_free(p);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

int main(void) {
  static const char *const args[] = {"--threads", "2", NULL};
  if (mt_start("gptcoord", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_stages),
      cmocka_unit_test(test_halves_and_replays),
      cmocka_unit_test(test_last_stage_keeps_no_logits),
      cmocka_unit_test(test_tensor_parallel),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
