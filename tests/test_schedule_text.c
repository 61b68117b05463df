/* Schedules as data (runtime/pipeline/schedule/sched_text.h):
 *  - every flushed mode of the table prints a text that parses back to the
 *    same text and to the plan ax_pipe_plan_new makes; an asynchronous
 *    mode prints for viewing and its text is refused;
 *  - each refusal of the parser, at its line and column;
 *  - hostile inputs (empty, huge numbers, binary, a 1 MB line, every
 *    truncation of a valid text, a directory, /dev/zero) end in a clean
 *    error, never a crash; a byte-order mark and CRLF are read;
 *  - runs: every flushed mode's printed schedule trains through the
 *    single-process emulator (emulate.h) to the bits of the mode itself,
 *    and a hand-written order (1F1B with another warm-up) to 1f1b's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/rng.h"
#include "axon/runtime/pipeline/schedule/emulate.h"
#include "axon/runtime/pipeline/schedule/sched_text.h"
#include "tests/pipe_testutil.h"

/* The ranks, chunks and micro-batches a mode is printed with (chunked
 * modes need the units a multiple of the ranks). */
static void shape_of(int m, int i, int *K, int *v, int *M) {
  static const int ks[3] = {2, 3, 4}, ms[3] = {4, 6, 8};
  *K = ks[i];
  *M = ms[i];
  *v = 2;
  if (ax_pipe_mode_get(m)->chunked && *M % *K)
    *M = 2 * *K;
}

static char *text_of(const ax_pipe_sched *s) {
  char *t = NULL;
  AX_ASSERT_OK(ax_pipe_sched_text(s, &t));
  return t;
}

/* Every flushed mode: print -> parse -> print is the same text, and the
 * parsed schedule's plan equals the mode's own, action for action. */
static void test_round_trip(void **state) {
  for (int m = 0; m < AX_MODE_COUNT; m++)
    for (int i = 0; i < 3; i++) {
      int K, v, M;
      shape_of(m, i, &K, &v, &M);
      ax_pipe_sched *a = NULL, *b = NULL;
      if (!ax_pipe_flushes(m)) {
        assert_int_equal(ax_pipe_sched_from_mode(m, K, v, M, &a),
                         AX_EUNSUPPORTED);
        ax_pipe_plan *p = NULL;
        char *t = NULL;
        AX_ASSERT_OK(ax_pipe_plan_new(m, K, v, M, K + 1, &p));
        AX_ASSERT_OK(ax_pipe_plan_text(p, &t));
        assert_non_null(strstr(t, "update async"));
        assert_int_equal(ax_pipe_sched_parse(t, strlen(t), "async", &b),
                         AX_EINVAL);
        assert_non_null(strstr(ax_errmsg(), "does not flush"));
        assert_null(b);
        free(t);
        ax_pipe_plan_free(p);
        continue;
      }
      AX_ASSERT_OK(ax_pipe_sched_from_mode(m, K, v, M, &a));
      char *t1 = text_of(a), *t3 = NULL;
      AX_ASSERT_OK(ax_pipe_sched_parse(t1, strlen(t1), "round", &b));
      char *t2 = text_of(b);
      if (strcmp(t1, t2))
        fail_msg("%s K=%d M=%d: the text changed:\n%s\n---\n%s",
                 ax_pipe_mode_name(m), K, M, t1, t2);
      ax_pipe_plan *want = NULL, *got = NULL;
      AX_ASSERT_OK(ax_pipe_plan_new(m, K, v, M, 3, &want));
      AX_ASSERT_OK(ax_pipe_plan_text(want, &t3));
      assert_string_equal(t3, t1);
      AX_ASSERT_OK(ax_pipe_sched_plan(b, 3, &got));
      assert_int_equal(ax_pipe_plan_mode(got), m);
      assert_int_equal(ax_pipe_plan_units(got), ax_pipe_plan_units(want));
      assert_int_equal(ax_pipe_plan_stages(got), ax_pipe_plan_stages(want));
      for (int s = 0; s < ax_pipe_plan_stages(want); s++)
        assert_int_equal(ax_pipe_plan_stage_rank(got, s),
                         ax_pipe_plan_stage_rank(want, s));
      for (int r = 0; r < K; r++) {
        long nw = 0, ng = 0;
        const ax_pipe_op *w = ax_pipe_plan_actions(want, r, &nw),
                         *g = ax_pipe_plan_actions(got, r, &ng);
        assert_int_equal(ng, nw);
        assert_memory_equal(g, w, sizeof *w * (size_t)nw);
      }
      free(t1), free(t2), free(t3);
      ax_pipe_plan_free(want);
      ax_pipe_plan_free(got);
      ax_pipe_sched_free(a);
      ax_pipe_sched_free(b);
    }
}

/* A composite, an explicit placement and a schedule with I and W round
 * trip too; their mode defaults by what the lists hold. */
static void test_written_forms(void **state) {
  const char *t = "ranks 2   # two agents\n"
                  "micro 2\n"
                  "placement 0 1 1 0\n"
                  "rank 1: 1F0 2F0 1F1 2I0 2F1+2W0 2I1 1I0 2W1 1I1 1W0 "
                  "1W1 STEP2 STEP1\n"
                  "\n"
                  "rank 0: 0F0 0F1 3F0 3B0 3F1 0B0 3B1 0B1 STEP0 STEP3\r\n";
  ax_pipe_sched *s = NULL, *c = NULL;
  AX_ASSERT_OK(ax_pipe_sched_parse(t, strlen(t), "forms", &s));
  assert_int_equal(ax_pipe_sched_stages(s), 4);
  assert_int_equal(ax_pipe_sched_stage_rank(s, 3), 0);
  assert_int_equal(ax_pipe_sched_mode(s), AX_MODE_ZBH1);
  assert_true(ax_pipe_sched_split(s));
  long n = 0;
  const ax_pipe_op *l = ax_pipe_sched_actions(s, 1, &n);
  assert_int_equal(n, 14);
  assert_true(l[4].with_next && l[4].kind == AX_OP_FWD && l[4].stage == 2);
  assert_true(!l[5].with_next && l[5].kind == AX_OP_WEIGHT_GRAD);
  char *a = text_of(s);
  assert_non_null(strstr(a, "placement v\n")); /* what 0 1 1 0 is */
  assert_non_null(strstr(a, " 2F1+2W0 "));
  AX_ASSERT_OK(ax_pipe_sched_copy(s, &c));
  char *b = text_of(c);
  assert_string_equal(a, b);
  ax_pipe_plan *p = NULL;
  AX_ASSERT_OK(ax_pipe_sched_plan(c, 2, &p));
  assert_int_equal(ax_pipe_plan_batches(p), 2);
  ax_pipe_plan_free(p);
  free(a), free(b);
  ax_pipe_sched_free(s);
  ax_pipe_sched_free(c);
  const char *plain = "ranks 2\nmicro 1\nplacement 1 0\n"
                      "rank 0: 1F0 1B0 STEP1\nrank 1: 0F0 0B0 STEP0\n";
  AX_ASSERT_OK(ax_pipe_sched_parse(plain, strlen(plain), "plain", &s));
  assert_int_equal(ax_pipe_sched_mode(s), AX_MODE_1F1B);
  a = text_of(s);
  assert_non_null(strstr(a, "placement 1 0\n"));
  free(a);
  ax_pipe_sched_free(s);
}

/* Each refusal with its code and "NAME:LINE:COL: ...". */
static void test_refusals(void **state) {
  static const char *H = "ranks 2\nmicro 2\n",
                    *R1 = "rank 1: 1F0 1B0 1F1 1B1 STEP1\n";
  static const struct {
    const char *head, *rank0; /* NULL head: H; rank 1's line follows */
    int err;
    const char *where, *what;
  } c[] = {
      {NULL, "rank 0: 0F0 0X1 0B0 0B1 STEP0\n", AX_EFORMAT,
       "t:3:13:", "expected <stage>"},
      {"rnaks 2\nmicro 2\n", "", AX_EFORMAT, "t:1:1:", "expected ranks"},
      {"ranks two\nmicro 2\n", "", AX_EFORMAT, "t:1:7:", "expected a number"},
      {"ranks 2\nranks 2\n", "", AX_EINVAL, "t:2:1:", "twice"},
      {"ranks 2\nmicro 2\nupdate async\n", "", AX_EINVAL,
       "t:3:8:", "only 'update flushed'"},
      {"ranks 2\nmicro 2\nplacement 0 0\n", "", AX_EINVAL,
       "t:3:1:", "rank 1 holds no stage"},
      {NULL, "rank 0: 0F0 0B0 0B1 STEP0\n", AX_EINVAL,
       "t:3:26:", "rank 0: no 0F1"},
      {NULL, "rank 0: 0F0 0F1 0B0 STEP0\n", AX_EINVAL,
       "t:3:26:", "no 0B1 (nor 0I1 and 0W1)"},
      {NULL, "rank 0: 0F0 0F1 0B0 0B0 0B1 STEP0\n", AX_EINVAL,
       "t:3:21:", "0B0 twice"},
      {NULL, "rank 0: 0F0 0F1 0W0 0I0 0B1 STEP0\n", AX_EINVAL,
       "t:3:17:", "0W0 before its input half 0I0"},
      {NULL, "rank 0: 0F0 0F1 0I0 0W0 0B0 0B1 STEP0\n", AX_EINVAL,
       "t:3:25:", "0B0 mixed with 0I0"},
      {NULL, "rank 0: 0F0 0F1 0B0 0I1 0W1 0B1 STEP0\n", AX_EINVAL,
       "t:3:29:", "0B1 mixed with"},
      {NULL, "rank 0: 0F0 0F1 0I0 0B1 STEP0\n", AX_EINVAL,
       "t:3:30:", "0I0 has no 0W0"},
      {NULL, "rank 0: 1F0 0F0 0F1 0B0 0B1 STEP0\n", AX_EINVAL,
       "t:3:9:", "rank 0 does not hold stage 1"},
      {NULL, "rank 0: 0F0 0F1 0B0 0B1\n", AX_EINVAL,
       "t:3:24:", "rank 0: no STEP0"},
      {NULL, "rank 0: 0F0 0F1 0B0 0B1 STEP0 STEP0\n", AX_EINVAL,
       "t:3:31:", "STEP0 twice"},
      {NULL, "rank 0: 0B0 0F0 0F1 0B1 STEP0\n", AX_EINVAL,
       "t:3:13:", "0F0 after its backward 0B0"},
      {NULL, "rank 0: 0F0 0F1 0B0 STEP0 0B1\n", AX_EINVAL,
       "t:3:27:", "after its STEP0"},
      {NULL, "rank 0: 0F0 0F1 0F2 0B0 0B1 STEP0\n", AX_EINVAL,
       "t:3:17:", "micro-batch outside 0..1"},
      {NULL, "rank 0: 0F0 0F1+STEP0 0B0 0B1\n", AX_EINVAL,
       "t:3:13:", "neither a STEP"},
      {NULL, "rank 0: 0F0 0F1+0B0+0B1 STEP0\n", AX_EFORMAT,
       "t:3:13:", "joins two actions"},
      {NULL, "rank 2: 0F0\n", AX_EINVAL, "t:3:6:", "rank 2 of 2 ranks"},
      {NULL, "rank 1: 1F0 1B0 1F1 1B1 STEP1\n", AX_EINVAL,
       "t:4:1:", "rank 1 twice"},
      {NULL, "rank 0: 0F0 0F1 0B0 0B1 STEP0\nmicro 3\n", AX_EINVAL,
       "t:4:1:", "after the first rank line"},
      {"ranks 2\nmicro 2\nmode 1f1b\n", "rank 0: 0F0 0F1 0I0 0W0 0B1 STEP0\n",
       AX_EINVAL, "t:4:17:", "mode 1f1b (line 3) does not split"},
      {"ranks 2\nmicro 2\nmode pipedream\n", "", AX_EINVAL,
       "t:3:6:", "does not flush"},
      {"ranks 2\nmicro 2\nmode sequential\n", "rank 0: 0F0\n", AX_EINVAL,
       "t:3:1:", "mode sequential runs 1 unit(s)"},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    char t[512];
    snprintf(t, sizeof t, "%s%s%s", c[i].head ? c[i].head : H, c[i].rank0, R1);
    ax_pipe_sched *s = NULL;
    int err = ax_pipe_sched_parse(t, strlen(t), "t", &s);
    const char *msg = ax_errmsg();
    if (err != c[i].err || strncmp(msg, c[i].where, strlen(c[i].where)) ||
        !strstr(msg, c[i].what))
      fail_msg("case %zu: got %s '%s', want %s '%s ... %s'", i, ax_errname(err),
               msg, ax_errname(c[i].err), c[i].where, c[i].what);
    assert_null(s);
  }
  /* A missing rank: at the line after the last. */
  const char *t = "ranks 2\nmicro 1\nrank 0: 0F0 0B0 STEP0\n";
  ax_pipe_sched *s = NULL;
  assert_int_equal(ax_pipe_sched_parse(t, strlen(t), "t", &s), AX_EINVAL);
  assert_string_equal(ax_errmsg(), "t:4:1: no line for rank 1");
  assert_int_equal(ax_pipe_sched_load("/nonexistent/schedule", &s), AX_EIO);
}

/* Hostile inputs: clean errors, no crash, no read past the length. */
static void test_hostile(void **state) {
  ax_pipe_sched *s = NULL;
  assert_int_equal(ax_pipe_sched_parse(NULL, 0, NULL, &s), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "schedule:1:1:"));
  assert_int_equal(ax_pipe_sched_parse("", 0, "e", &s), AX_EINVAL);
  const char *big[] = {"ranks 99999999999\n", "micro 1025\n",
                       "ranks 2\nmicro 2\nrank 0: 0F99999999\n",
                       "ranks 1\nmicro 1\nrank 0: 70F0\n",
                       "ranks 1\nmicro 1\nrank 0: STEP9999999\n"};
  for (int i = 0; i < 5; i++) {
    int err = ax_pipe_sched_parse(big[i], strlen(big[i]), "big", &s);
    assert_true(err == AX_EFORMAT || err == AX_EINVAL);
  }
  /* NUL and other bytes outside comments; any bytes inside one. */
  const char nul[] = "ranks 1\0\nmicro 1\n";
  assert_int_equal(ax_pipe_sched_parse(nul, sizeof nul - 1, "nul", &s),
                   AX_EFORMAT);
  assert_string_equal(ax_errmsg(), "nul:1:8: unexpected byte 0x00");
  const char ok[] = "# \xff\x01 bytes\nranks 1\nmicro 1\nrank 0: 0F0 0B0 STEP0";
  AX_ASSERT_OK(ax_pipe_sched_parse(ok, sizeof ok - 1, "ok", &s));
  ax_pipe_sched_free(s);
  assert_int_equal(
      ax_pipe_sched_parse(ok, AX_PIPE_SCHED_MAX_BYTES + 1ul, "huge", &s),
      AX_EFORMAT);
  /* What editors write: a byte-order mark, CRLF, tabs, trailing spaces;
   * line 1's columns count after the mark. Files that are not. */
  const char bom[] = "\xef\xbb\xbfranks 1\r\nmicro 1 \t\r\n"
                     "rank 0:\t0F0 0B0 STEP0\r\n";
  AX_ASSERT_OK(ax_pipe_sched_parse(bom, sizeof bom - 1, "bom", &s));
  ax_pipe_sched_free(s);
  assert_int_equal(ax_pipe_sched_parse(bom, 8, "bom", &s), AX_EFORMAT);
  assert_string_equal(ax_errmsg(), "bom:1:6: ranks needs a value");
  assert_int_equal(ax_pipe_sched_load("/", &s), AX_EIO);
  assert_non_null(strstr(ax_errmsg(), "Is a directory"));
  assert_int_equal(ax_pipe_sched_load("/dev/zero", &s), AX_EFORMAT);
  assert_non_null(strstr(ax_errmsg(), "bytes, at most"));
  /* Random bytes, and a 1 MB line (of garbage, then of one repeated
   * action) after a valid header. */
  size_t n = 1 << 20;
  char *buf = malloc(n + 64);
  assert_non_null(buf);
  ax_rng rng;
  ax_rng_seed(&rng, 5);
  for (int round = 0; round < 64; round++) {
    size_t len = ax_rng_u64(&rng) % 4096;
    for (size_t i = 0; i < len; i++)
      buf[i] = (char)(ax_rng_u64(&rng) & 0xff);
    int err = ax_pipe_sched_parse(buf, len, "rand", &s);
    assert_true(err == AX_EFORMAT || err == AX_EINVAL);
  }
  int h = snprintf(buf, 64, "ranks 1\nmicro 1\nrank 0: ");
  memset(buf + h, 'A', n - (size_t)h);
  assert_int_equal(ax_pipe_sched_parse(buf, n, "line", &s), AX_EFORMAT);
  assert_non_null(strstr(ax_errmsg(), "line:3:9:"));
  for (size_t i = (size_t)h; i + 4 <= n; i += 4)
    memcpy(buf + i, "0F0 ", 4);
  assert_int_equal(ax_pipe_sched_parse(buf, n, "line", &s), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "line:3:13: 0F0 twice"));
  free(buf);
  /* Every prefix of a valid text parses or is refused cleanly; the ones
   * that parse print back to themselves. */
  ax_pipe_sched *full = NULL;
  AX_ASSERT_OK(ax_pipe_sched_from_mode(AX_MODE_ZBV, 2, 2, 4, &full));
  char *t = text_of(full);
  for (size_t len = 0; len <= strlen(t); len++) {
    int err = ax_pipe_sched_parse(t, len, "cut", &s);
    assert_true(err == AX_OK || err == AX_EFORMAT || err == AX_EINVAL);
    if (err == AX_OK) {
      char *u = text_of(s);
      assert_string_equal(u, t);
      free(u);
      ax_pipe_sched_free(s);
    }
  }
  /* The largest sizes parse: 16 ranks of 1024 micro-batches. */
  ax_pipe_sched *wide = NULL, *back = NULL;
  AX_ASSERT_OK(ax_pipe_sched_from_mode(AX_MODE_ZBH1, 16, 1, 1024, &wide));
  char *w = text_of(wide);
  AX_ASSERT_OK(ax_pipe_sched_parse(w, strlen(w), "wide", &back));
  char *w2 = text_of(back);
  assert_string_equal(w, w2);
  free(w), free(w2), free(t);
  ax_pipe_sched_free(wide);
  ax_pipe_sched_free(back);
  ax_pipe_sched_free(full);
}

/* ---- runs through the emulator ------------------------------------------ */
#define T 3 /* mini-batches per run */
static const char *g_model_cfg = "widths=48/44/40/36/32/28/24/20/10";
static const char *g_optim = "opt=sgd,lr=0.05,momentum=0.9";

typedef struct run_out { /* losses and every stage's parameters */
  int S;
  long nloss;
  double loss[T];
  float *param[AX_PIPE_MAX_STAGES];
  size_t np[AX_PIPE_MAX_STAGES];
} run_out;

static void on_step(void *user, const ax_pipe_step_info *si) {
  run_out *r = user;
  if (r->nloss < T)
    r->loss[r->nloss] = si->loss;
  r->nloss++;
}

typedef struct feed {
  pt_data data;
  run_out *r;
} feed;
static int feed_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  return pt_batch(&((feed *)user)->data, t, in, lab);
}
static void feed_step(void *user, const ax_pipe_step_info *si) {
  on_step(((feed *)user)->r, si);
}

/* Trains T mini-batches of mode m (K agents, M micro-batches, 2 chunks)
 * on the emulator node n, with schedule s when not NULL. */
static void run(ax_node *n, int m, int K, int M, const ax_pipe_sched *s,
                run_out *r) {
  const char *self[AX_PIPE_MAX_STAGES];
  for (int i = 0; i < AX_PIPE_MAX_STAGES; i++)
    self[i] = ax_node_name(n);
  ax_config dcfg;
  feed f = {{NULL, 16}, r};
  memset(r, 0, sizeof *r);
  AX_ASSERT_OK(ax_config_parse(&dcfg, "shape=48,classes=10,examples=256"));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &f.data.ds));
  ax_pipe_opts o = {"mlp", g_model_cfg,        K,       self, NULL,   m,
                    M,     AX_RECOMPUTE_NEVER, g_optim, 3,    AX_CPU, 30000,
                    NULL,  s ? 0 : 2};
  o.schedule = s;
  ax_pipe *p = NULL;
  AX_ASSERT_OK(ax_pipe_new(n, &o, &p));
  r->S = ax_pipe_stages(p);
  AX_ASSERT_OK(ax_pipe_train(p, T, feed_batch, feed_step, &f));
  assert_int_equal(r->nloss, T);
  for (int i = 0; i < r->S; i++) {
    ax_tensor *pa = NULL, *bu = NULL;
    AX_ASSERT_OK(ax_pipe_stage_state(p, i, &pa, &bu));
    r->np[i] = ax_tensor_numel(pa);
    r->param[i] = malloc(r->np[i] * sizeof(float));
    assert_non_null(r->param[i]);
    memcpy(r->param[i], pa->data, r->np[i] * sizeof(float));
    ax_tensor_release(pa);
    ax_tensor_release(bu);
  }
  ax_pipe_free(p);
  ax_dataset_close(f.data.ds);
  AX_ASSERT_OK(dt_wait_counts(n, NULL, 0, 0, 0));
}

/* got equals want to the bit; both are cleared. */
static void same_bits(const char *what, run_out *got, run_out *want) {
  assert_int_equal(got->S, want->S);
  assert_int_equal(got->nloss, want->nloss);
  if (memcmp(got->loss, want->loss, sizeof got->loss))
    fail_msg("%s: losses %.17g ... differ from %.17g ...", what, got->loss[0],
             want->loss[0]);
  for (int i = 0; i < got->S; i++) {
    assert_int_equal(got->np[i], want->np[i]);
    if (memcmp(got->param[i], want->param[i], got->np[i] * sizeof(float)))
      fail_msg("%s: stage %d's parameters differ", what, i);
    free(got->param[i]);
    free(want->param[i]);
  }
  fprintf(stderr, "  %-34s equal to the bit (last loss %.6f)\n", what,
          got->loss[T - 1]);
}

static ax_pipe_sched *parsed(const char *text, const char *name) {
  ax_pipe_sched *s = NULL;
  if (ax_pipe_sched_parse(text, strlen(text), name, &s) != AX_OK)
    fail_msg("%s", ax_errmsg());
  return s;
}

/* Every flushed entry of the table: its printed schedule, parsed and run,
 * trains to the mode's own bits. New flushed modes join by themselves. */
static void test_runs_equal_modes(void **state) {
  ax_node *n = NULL;
  AX_ASSERT_OK(ax_pipe_emulator_new(NULL, 0, &n));
  for (int m = 0; m < AX_MODE_COUNT; m++) {
    if (!ax_pipe_flushes(m))
      continue;
    int K = 2, M = 4;
    ax_pipe_sched *from = NULL;
    AX_ASSERT_OK(ax_pipe_sched_from_mode(m, K, 2, M, &from));
    char *t = text_of(from), name[64];
    snprintf(name, sizeof name, "%s's schedule", ax_pipe_mode_name(m));
    ax_pipe_sched *s = parsed(t, name);
    run_out want, got;
    run(n, m, K, M, NULL, &want);
    run(n, ax_pipe_sched_mode(s), K, M, s, &got);
    same_bits(name, &got, &want);
    free(t);
    ax_pipe_sched_free(from);
    ax_pipe_sched_free(s);
  }
  /* Orders no mode has: 1F1B with a warm-up of two on rank 0, and a V
   * whose stages mix whole backwards with split ones. Flushed orders of
   * the same actions are the same math. */
  ax_pipe_sched *warm =
      parsed("ranks 2\nmicro 4\n"
             "rank 0: 0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3 STEP0\n"
             "rank 1: 1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3 STEP1\n",
             "warm-up of two");
  ax_pipe_sched *mixed = parsed(
      "ranks 2\nmicro 4\nplacement v\nmode zb-h1\n"
      "rank 0: 0F0 0F1 0F2 0F3 3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 0B0 0B1 0B2 "
      "0B3 STEP3 STEP0\n"
      "rank 1: 1F0 2F0 1F1 2F1 1F2 2F2 1F3 2F3 2I0 1I0 2I1 1I1 2W0 2I2 1I2 "
      "2I3+1W0 1I3 2W1 2W2 2W3 1W1 1W2 1W3 STEP2 STEP1\n",
      "a V mixing B and I/W");
  run_out want, got;
  run(n, AX_MODE_1F1B, 2, 4, NULL, &want);
  run(n, AX_MODE_1F1B, 2, 4, warm, &got);
  same_bits("1F1B with a warm-up of two", &got, &want);
  run(n, AX_MODE_ZBV, 2, 4, NULL, &want);
  run(n, AX_MODE_ZBH1, 2, 4, mixed, &got);
  same_bits("a V mixing B and I/W", &got, &want);
  /* A contradiction between the options and the schedule is refused. */
  const char *self[2] = {ax_node_name(n), ax_node_name(n)};
  ax_pipe_opts o = {"mlp", g_model_cfg, 2, self, NULL, AX_MODE_GPIPE, 4};
  o.optim_config = g_optim;
  o.schedule = warm;
  ax_pipe *p = NULL;
  assert_int_equal(ax_pipe_new(n, &o, &p), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "mode gpipe with a schedule"));
  o.mode = AX_MODE_1F1B;
  o.M = 2;
  assert_int_equal(ax_pipe_new(n, &o, &p), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "has 4 micro-batches"));
  ax_pipe_sched_free(warm);
  ax_pipe_sched_free(mixed);
  ax_pipe_emulator_free(n);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_written_forms),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_hostile),
      cmocka_unit_test(test_runs_equal_modes),
  };
  return AX_TEST_MAIN(tests);
}
