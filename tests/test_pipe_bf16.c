/* bf16 pipelines (ax_pipe_opts.precision; the rules in models/module.h)
 * over 4 real agent processes on loopback, a tiny BERT with dropout, a
 * tiny GPT with dropout (whose tied token table is in the first and the
 * last stage) and an MLP:
 *  - every mode against the single-process bf16 reference of its kind
 *    (tests/pipe_testutil.h, with the coordinator's per-unit dropout
 *    seeds) within the fp32 oracles' tolerance (relative 1e-5 on every
 *    parameter);
 *  - the flushed modes (gpipe with and without recomputation, 1f1b,
 *    interleaved, zb-h1, zbv) at the same micro-batches train to the same
 *    bits, whatever their split into stages, as in fp32; the GPT's (K = 2
 *    and 3) also the reference's values exactly;
 *  - bf16 trains to other weights than fp32 (it is on);
 *  - the bytes between stages (the stages' send events, trace bytes) of a
 *    bf16 run are half those of the fp32 run;
 * and every node ends with zero live RRefs, contexts, calls and futures. */
#include <stdlib.h>
#include <string.h>

#define PT_FLOOR_RMS
#include "tests/pipe_testutil.h"

#define NAGENTS 4
static const char *g_names[NAGENTS] = {"h1", "h2", "h3", "h4"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

#define BERT_CFG "layers=2,hidden=32,heads=2,ff=64,vocab=50,seq=16,dropout=0.1"
#define GPT_CFG "layers=2,hidden=32,heads=2,ff=64,vocab=50,seq=16,dropout=0.1"
#define MLP_CFG "widths=48/40/32/24/10"
#define OPTIM "opt=sgd,lr=0.05,momentum=0.9"
#define SEED 5

static int bert_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  (void)user;
  return ax_test_bert_batch(t, 8, 16, 3, in, lab);
}

static int gpt_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  (void)user;
  return ax_test_lm_batch(t, 8, 16, 50, in, lab);
}

/* What a run left: the whole model's parameters (its stages' in order),
 * the worst relative difference from the reference, the bytes its stages
 * sent to each other. */
typedef struct outcome {
  float *w;
  size_t n;
  double worst;
  int64_t sent;
} outcome;

/* The bytes of the stages' send events (activations and gradients). */
static int64_t sent_bytes(ax_pipe *p) {
  ax_trace *tr = ax_trace_new(0);
  assert_non_null(tr);
  AX_ASSERT_OK(ax_pipe_trace(p, tr));
  ax_trace_event *ev = NULL;
  size_t ne = 0;
  AX_ASSERT_OK(ax_trace_events(tr, &ev, &ne));
  int64_t b = 0;
  for (size_t i = 0; i < ne; i++)
    if (!strcmp(ev[i].cat, "send") && ev[i].bytes > 0)
      b += ev[i].bytes;
  free(ev);
  ax_trace_free(tr);
  return b;
}

/* Trains `steps` mini-batches of model (bert, gpt or mlp) in `mode` on K agents
 * of v stages each, M micro-batches, in precision prec, and compares with
 * the reference of the mode in that precision. */
static void run(const char *model, int mode, int K, int v, int M, int rec,
                int steps, int prec, outcome *out) {
  const ax_model_def *def = ax_model_find(model);
  int bert = !strcmp(model, "bert"), gpt = !strcmp(model, "gpt");
  const char *cfg = bert ? BERT_CFG : gpt ? GPT_CFG : MLP_CFG;
  ax_config mcfg, dcfg;
  ax_model_info info;
  AX_ASSERT_OK(ax_model_config(def, cfg, &mcfg));
  AX_ASSERT_OK(def->describe(&mcfg, &info));
  int S = K * v, bounds[AX_PIPE_MAX_STAGES + 1];
  AX_ASSERT_OK(ax_split_uniform(info.n_blocks, S, bounds));
  pt_data data = {NULL, 16};
  if (!bert && !gpt) {
    AX_ASSERT_OK(
        ax_config_parse(&dcfg, "shape=48,classes=10,examples=256,seed=7"));
    AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
  }
  ax_pipe_batch_fn batch = bert ? bert_batch : gpt ? gpt_batch : pt_batch;
  ax_pipe_opts o = {model, cfg,   K,    g_names, bounds, mode, M,
                    rec,   OPTIM, SEED, AX_CPU,  30000,  NULL, v};
  o.precision = prec;
  ax_pipe *p;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, steps, batch, NULL, &data));
  out->sent = sent_bytes(p);
  out->n = 0;
  out->w = NULL;
  for (int s = 0; s < S; s++) {
    ax_tensor *w, *b;
    AX_ASSERT_OK(ax_pipe_stage_state(p, s, &w, &b));
    size_t n = ax_tensor_numel(w);
    out->w = realloc(out->w, (out->n + n) * sizeof(float));
    assert_non_null(out->w);
    memcpy(out->w + out->n, w->data, n * sizeof(float));
    out->n += n;
    ax_tensor_release(w);
    ax_tensor_release(b);
  }
  int kind = ref_kind(mode);
  pt_ref_opts ro = {0};
  ro.units = kind == REF_SYNC || kind == REF_2BW ? ax_pipe_units(mode, M) : 1;
  ro.precision = prec;
  ax_tensor *want[AX_PIPE_MAX_STAGES], *wbuf[AX_PIPE_MAX_STAGES];
  pt_reference_ex(def, &mcfg, bounds, S, kind, steps, batch, &data, OPTIM, SEED,
                  &ro, want, wbuf);
  out->worst = pt_worst_stages(p, S, want, wbuf);
  fprintf(stderr,
          "  %s %-11s %s K=%d v=%d M=%d recompute=%d: %d steps, worst "
          "relative difference %.2g, %lld bytes between stages\n",
          model, ax_pipe_mode_name(mode), ax_precision_name(prec), K, v, M, rec,
          steps, out->worst, (long long)out->sent);
  if (out->worst > 1e-5)
    fail_msg("%s %s %s K=%d: relative difference %.3g > 1e-5", model,
             ax_pipe_mode_name(mode), ax_precision_name(prec), K, out->worst);
  ax_pipe_free(p);
  ax_dataset_close(data.ds);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_flushed_modes_same_bits(void **state) {
  (void)state;
  static const int c[][5] = {
      /* mode, K, v, M, recompute */
      {AX_MODE_GPIPE, 4, 1, 4, AX_RECOMPUTE_NEVER},
      {AX_MODE_1F1B, 4, 1, 4, AX_RECOMPUTE_NEVER},
      {AX_MODE_GPIPE, 3, 1, 4, AX_RECOMPUTE_ALWAYS},
      {AX_MODE_INTERLEAVED, 2, 2, 4, AX_RECOMPUTE_NEVER},
      {AX_MODE_ZBH1, 4, 1, 4, AX_RECOMPUTE_NEVER},
      {AX_MODE_ZBV, 2, 2, 4, AX_RECOMPUTE_NEVER},
  };
  outcome first, o, f32;
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    run("bert", c[i][0], c[i][1], c[i][2], c[i][3], c[i][4], 3, AX_PREC_BF16,
        i ? &o : &first);
    if (!i)
      continue;
    assert_int_equal(o.n, first.n);
    if (memcmp(o.w, first.w, o.n * sizeof(float)) != 0)
      fail_msg("bf16 %s K=%d: other bits than gpipe K=4",
               ax_pipe_mode_name(c[i][0]), c[i][1]);
    free(o.w);
  }
  /* fp32 on the same run: other weights, twice the bytes between stages. */
  run("bert", AX_MODE_GPIPE, 4, 1, 4, AX_RECOMPUTE_NEVER, 3, AX_PREC_FP32,
      &f32);
  double d = 0, r = 0;
  for (size_t i = 0; i < f32.n; i++) {
    d += ((double)first.w[i] - f32.w[i]) * ((double)first.w[i] - f32.w[i]);
    r += (double)f32.w[i] * f32.w[i];
  }
  fprintf(stderr,
          "  bert bf16 against fp32: relative L2 %.2g of the weights; "
          "%lld bytes between stages in bf16, %lld in fp32\n",
          sqrt(d / r), (long long)first.sent, (long long)f32.sent);
  assert_true(sqrt(d / r) > 1e-6 && sqrt(d / r) < 1e-2);
  assert_true(first.sent > 0);
  assert_true(2 * first.sent == f32.sent);
  free(first.w);
  free(f32.w);
}

/* The GPT: its flushed modes the reference's values exactly, so the same
 * bits in each; bf16 on. */
static void test_gpt(void **state) {
  (void)state;
  static const int c[][5] = {
      /* mode, K, v, M, recompute */
      {AX_MODE_GPIPE, 2, 1, 4, AX_RECOMPUTE_NEVER},
      {AX_MODE_1F1B, 3, 1, 4, AX_RECOMPUTE_NEVER},
      {AX_MODE_GPIPE, 3, 1, 4, AX_RECOMPUTE_ALWAYS},
      {AX_MODE_ZBH1, 2, 1, 4, AX_RECOMPUTE_NEVER},
      {AX_MODE_INTERLEAVED, 2, 2, 4, AX_RECOMPUTE_NEVER},
      {AX_MODE_ZBV, 2, 2, 4, AX_RECOMPUTE_NEVER},
  };
  outcome first, o, f32;
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    outcome *r = i ? &o : &first;
    run("gpt", c[i][0], c[i][1], c[i][2], c[i][3], c[i][4], 3, AX_PREC_BF16, r);
    if (r->worst != 0)
      fail_msg("gpt bf16 %s K=%d: not the reference's values",
               ax_pipe_mode_name(c[i][0]), c[i][1]);
    if (!i)
      continue;
    assert_int_equal(o.n, first.n);
    if (memcmp(o.w, first.w, o.n * sizeof(float)) != 0)
      fail_msg("gpt bf16 %s K=%d: other bits than gpipe K=2",
               ax_pipe_mode_name(c[i][0]), c[i][1]);
    free(o.w);
  }
  run("gpt", AX_MODE_GPIPE, 2, 1, 4, AX_RECOMPUTE_NEVER, 3, AX_PREC_FP32, &f32);
  assert_true(first.sent > 0 && 2 * first.sent == f32.sent);
  assert_true(memcmp(first.w, f32.w, f32.n * sizeof(float)) != 0);
  free(first.w);
  free(f32.w);
}

static void test_other_modes(void **state) {
  (void)state;
  static const int c[][4] = {
      /* mode, K, M, steps */
      {AX_MODE_SEQUENTIAL, 4, 1, 3}, {AX_MODE_DDG, 3, 1, 8},
      {AX_MODE_FR, 3, 1, 8},         {AX_MODE_PIPEDREAM, 4, 1, 8},
      {AX_MODE_2BW, 3, 2, 4},
  };
  outcome o;
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    run("bert", c[i][0], c[i][1], 1, c[i][2], AX_RECOMPUTE_NEVER, c[i][3],
        AX_PREC_BF16, &o);
    free(o.w);
  }
}

static void test_mlp(void **state) {
  (void)state;
  outcome b, f;
  run("mlp", AX_MODE_1F1B, 4, 1, 4, AX_RECOMPUTE_NEVER, 2, AX_PREC_BF16, &b);
  run("mlp", AX_MODE_1F1B, 4, 1, 4, AX_RECOMPUTE_NEVER, 2, AX_PREC_FP32, &f);
  assert_true(2 * b.sent == f.sent);
  assert_true(memcmp(b.w, f.w, b.n * sizeof(float)) != 0);
  free(b.w);
  free(f.w);
  run("mlp", AX_MODE_PIPEDREAM, 3, 1, 1, AX_RECOMPUTE_NEVER, 8, AX_PREC_BF16,
      &b);
  free(b.w);
}

int main(void) {
  static const char *const args[] = {"--threads", "2", NULL};
  if (mt_start("bf16", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mlp),
      cmocka_unit_test(test_flushed_modes_same_bits),
      cmocka_unit_test(test_other_modes),
      cmocka_unit_test(test_gpt),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
