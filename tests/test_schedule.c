/* Pipeline schedules (runtime/pipeline/schedule/mode.h), in process: every
 * (stage, unit, forward/backward) exactly once, backward after forward,
 * updates where the mode puts them, no deadlock when the stages run their
 * lists in order with the dependencies, the live-state bound of the table,
 * and a few orders written out by hand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/pipeline/schedule/mode.h"
#include "harness.h"

#define MAXOPS 4096

typedef struct sim {
  int K, M, U, mode;
  long n;
  ax_pipe_op ops[8][MAXOPS];
  long nops, pc[8];
  unsigned char done[8][AX_OP_KINDS][256];
} sim;

static int is_done(sim *S, const ax_pipe_op *o) {
  return S->done[o->stage][o->kind][o->batch * S->U + o->micro];
}

/* Runs the stages in lock step (unit time per op): every round each stage
 * whose next op has its dependencies met runs it. Checks the live bound
 * and returns the rounds taken (-1 on deadlock). */
static long simulate(sim *S) {
  long rounds = 0, left = S->K * S->nops;
  int live[8] = {0};
  while (left > 0) {
    ax_pipe_op run[8];
    int nrun = 0;
    for (int s = 0; s < S->K; s++) {
      if (S->pc[s] >= S->nops)
        continue;
      ax_pipe_op *o = &S->ops[s][S->pc[s]], deps[32];
      int nd = ax_pipe_deps(S->mode, S->K, S->M, o, deps), ok = 1;
      for (int i = 0; i < nd; i++)
        ok &= is_done(S, &deps[i]);
      if (o->kind == AX_OP_BWD)
        ok &= S->done[s][AX_OP_FWD][o->batch * S->U + o->micro];
      for (int m = 0; o->kind == AX_OP_STEP && m < S->U; m++)
        ok &= S->done[s][AX_OP_BWD][o->batch * S->U + m] |
              S->done[s][AX_OP_WEIGHT_GRAD][o->batch * S->U + m];
      if (ok)
        run[nrun++] = *o;
    }
    if (nrun == 0)
      return -1;
    for (int i = 0; i < nrun; i++) {
      ax_pipe_op *o = &run[i];
      S->done[o->stage][o->kind][o->batch * S->U + o->micro] = 1;
      S->pc[o->stage]++;
      /* a unit is live from its forward to its last backward action */
      live[o->stage] += o->kind == AX_OP_FWD ? 1
                        : o->kind == AX_OP_BWD || o->kind == AX_OP_WEIGHT_GRAD
                            ? -1
                            : 0;
      assert_true(live[o->stage] <=
                  ax_pipe_live_bound(S->mode, S->K, o->stage, S->M));
      left--;
    }
    rounds++;
  }
  return rounds;
}

static void check_mode(int mode, int K, int M, long n) {
  sim *S = calloc(1, sizeof *S);
  S->K = K, S->M = M, S->mode = mode, S->n = n;
  S->U = ax_pipe_units(mode, M);
  S->nops = ax_pipe_nops(mode, M, n);
  for (int s = 0; s < K; s++) {
    AX_ASSERT_OK(ax_pipe_schedule(mode, K, s, M, n, S->ops[s], MAXOPS));
    int seen[AX_OP_KINDS][256] = {{0}}, steps = 0;
    for (long i = 0; i < S->nops; i++) {
      ax_pipe_op *o = &S->ops[s][i];
      assert_int_equal(o->stage, s);
      int u = o->batch * S->U + o->micro;
      seen[o->kind][u]++;
      if (o->kind == AX_OP_BWD || o->kind == AX_OP_INPUT_GRAD)
        assert_int_equal(seen[AX_OP_FWD][u], 1); /* forward came first */
      if (o->kind == AX_OP_WEIGHT_GRAD)          /* W after its I */
        assert_int_equal(seen[AX_OP_INPUT_GRAD][u], 1);
      if (o->kind == AX_OP_STEP) {
        steps++;
        assert_int_equal(o->micro, 0);
        /* every backward it sums ran before it */
        for (int m = 0; m < S->U; m++)
          assert_int_equal(seen[AX_OP_BWD][o->batch * S->U + m] +
                               seen[AX_OP_WEIGHT_GRAD][o->batch * S->U + m],
                           1);
        if (ax_pipe_flushes(mode)) /* the step ends the mini-batch */
          for (long j = i + 1; j < S->nops; j++)
            assert_true(S->ops[s][j].batch > o->batch);
      }
    }
    int split = ax_pipe_mode_get(mode)->split;
    for (int u = 0; u < n * S->U; u++) {
      assert_int_equal(seen[AX_OP_FWD][u], 1);
      assert_int_equal(seen[AX_OP_BWD][u], !split);
      assert_int_equal(seen[AX_OP_INPUT_GRAD][u], split);
      assert_int_equal(seen[AX_OP_WEIGHT_GRAD][u], split);
    }
    assert_int_equal(steps, n); /* one STEP per mini-batch */
  }
  assert_true(simulate(S) > 0);
  free(S);
}

static void test_invariants(void **state) {
  for (int mode = 0; mode < AX_MODE_COUNT; mode++)
    if (!ax_pipe_mode_get(mode)->chunked) /* test_interleaved_lists */
      for (int K = 1; K <= 6; K++)
        for (int M = 1; M <= 8; M += 3)
          for (long n = 1; n <= 7; n += 3)
            check_mode(mode, K, M, n);
}

static void expect(int mode, int K, int s, int M, long n, const char *want) {
  ax_pipe_op ops[MAXOPS];
  AX_ASSERT_OK(ax_pipe_schedule(mode, K, s, M, n, ops, MAXOPS));
  char got[1024] = "";
  size_t len = 0;
  for (long i = 0; i < ax_pipe_nops(mode, M, n); i++) {
    int u = ax_pipe_units(mode, M) > 1 && ops[i].kind != AX_OP_STEP
                ? ops[i].micro
                : ops[i].batch;
    len += (size_t)snprintf(got + len, sizeof got - len, "%s%c%d", i ? " " : "",
                            "FBIWS"[ops[i].kind], u);
  }
  assert_string_equal(got, want);
}

static void test_orders(void **state) {
  expect(AX_MODE_PIPEDREAM, 4, 0, 1, 6,
         "F0 F1 F2 F3 B0 S0 F4 B1 S1 F5 B2 S2 B3 S3 B4 S4 B5 S5");
  expect(AX_MODE_PIPEDREAM, 4, 3, 1, 3, "F0 B0 S0 F1 B1 S1 F2 B2 S2");
  expect(AX_MODE_DDG, 3, 1, 1, 3, "F0 F1 B0 S0 F2 B1 S1 B2 S2");
  expect(AX_MODE_GPIPE, 2, 0, 3, 1, "F0 F1 F2 B2 B1 B0 S0");
  expect(AX_MODE_1F1B, 4, 0, 8, 1,
         "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7 S0");
  expect(AX_MODE_1F1B, 4, 3, 4, 1, "F0 B0 F1 B1 F2 B2 F3 B3 S0");
  expect(AX_MODE_1F1B, 4, 0, 2, 1, "F0 F1 B0 B1 S0");
  expect(AX_MODE_SEQUENTIAL, 3, 2, 4, 2, "F0 B0 S0 F1 B1 S1");
  /* zb-h1: stage 0 of 3 holds W back by 0, stage 2 by 2 */
  expect(AX_MODE_ZBH1, 3, 0, 4, 1, "F0 F1 F2 I0 W0 F3 I1 W1 I2 W2 I3 W3 S0");
  expect(AX_MODE_ZBH1, 3, 2, 4, 1, "F0 I0 F1 I1 F2 I2 W0 F3 I3 W1 W2 W3 S0");
  /* 2bw: 1F1B over micro-batches, no flush, one STEP per mini-batch */
  expect(AX_MODE_2BW, 3, 0, 2, 2, "F0 F1 F0 B0 F1 B1 S0 B0 B1 S1");
}

/* Chunked modes: K ranks of v stages; every (stage, unit) forward and
 * backward exactly once, on rank stage mod K, the backward after the
 * forward, each stage's STEP once per mini-batch after all its backwards
 * and before anything of the next mini-batch on that rank. */
static void test_interleaved_lists(void **state) {
  for (int K = 1; K <= 4; K++)
    for (int v = 2; v <= 3; v++)
      for (int M = K; M <= 3 * K; M += K) {
        long n = 2;
        ax_pipe_plan *p;
        AX_ASSERT_OK(ax_pipe_plan_new(AX_MODE_INTERLEAVED, K, v, M, n, &p));
        int S = ax_pipe_plan_stages(p), U = M;
        assert_int_equal(S, K * v);
        static int seen[16][AX_OP_KINDS][64];
        memset(seen, 0, sizeof seen);
        for (int r = 0; r < K; r++) {
          long len;
          const ax_pipe_op *l = ax_pipe_plan_actions(p, r, &len);
          assert_int_equal(len,
                           ax_pipe_nops_chunks(AX_MODE_INTERLEAVED, v, M, n));
          for (long i = 0; i < len; i++) {
            const ax_pipe_op *o = &l[i];
            assert_int_equal(o->stage % K, r);
            int u = o->batch * U + o->micro;
            seen[o->stage][o->kind][u]++;
            if (o->kind == AX_OP_BWD)
              assert_int_equal(seen[o->stage][AX_OP_FWD][u], 1);
            if (o->kind == AX_OP_STEP) {
              for (int m = 0; m < U; m++)
                assert_int_equal(seen[o->stage][AX_OP_BWD][o->batch * U + m],
                                 1);
              for (long j = i + 1; j < len; j++)
                assert_true(l[j].batch > o->batch || l[j].kind == AX_OP_STEP);
            }
          }
        }
        for (int st = 0; st < S; st++)
          for (int u = 0; u < n * U; u++) {
            assert_int_equal(seen[st][AX_OP_FWD][u], 1);
            assert_int_equal(seen[st][AX_OP_BWD][u], 1);
          }
        ax_pipe_plan_free(p);
      }
  /* zbv: two stages per agent in a V (agent r: r and 2K-1-r), I and W */
  for (int K = 1; K <= 4; K++)
    for (int M = 1; M <= 8; M++) {
      ax_pipe_plan *p;
      AX_ASSERT_OK(ax_pipe_plan_new(AX_MODE_ZBV, K, 0, M, 2, &p));
      static int seen[16][AX_OP_KINDS][64];
      memset(seen, 0, sizeof seen);
      for (int r = 0; r < K; r++) {
        long len;
        const ax_pipe_op *l = ax_pipe_plan_actions(p, r, &len);
        for (long i = 0; i < len; i++) {
          const ax_pipe_op *o = &l[i];
          assert_true(o->stage == r || o->stage == 2 * K - 1 - r);
          assert_int_equal(ax_pipe_stage_rank(AX_MODE_ZBV, K, o->stage), r);
          int u = o->batch * M + o->micro;
          seen[o->stage][o->kind][u]++;
          if (o->kind == AX_OP_WEIGHT_GRAD)
            assert_int_equal(seen[o->stage][AX_OP_INPUT_GRAD][u], 1);
          if (o->kind == AX_OP_INPUT_GRAD)
            assert_int_equal(seen[o->stage][AX_OP_FWD][u], 1);
        }
      }
      for (int st = 0; st < 2 * K; st++)
        for (int u = 0; u < 2 * M; u++)
          assert_true(seen[st][AX_OP_FWD][u] == 1 &&
                      seen[st][AX_OP_INPUT_GRAD][u] == 1 &&
                      seen[st][AX_OP_WEIGHT_GRAD][u] == 1 &&
                      seen[st][AX_OP_BWD][u] == 0);
      ax_pipe_plan_free(p);
    }
  ax_pipe_plan *p = NULL; /* micro-batches must be a multiple of K */
  assert_int_equal(ax_pipe_plan_new(AX_MODE_INTERLEAVED, 4, 2, 6, 1, &p),
                   AX_EINVAL);
  assert_null(p);
}

/* The V modes (rank r holds stages r and 2K - 1 - r), n mini-batches:
 * each rank's list is ax_pipe_nops_rank long and holds only its stages;
 * every (stage, unit) runs F once and B, or I and later W, once (B only in
 * a mode that mixes them, dualpipev); a backward after its forward; a
 * composite joins a forward and a backward of another unit; each STEP
 * after its stage's backwards and before the next mini-batch. Run in lock
 * step with the plan's dependencies (a composite waits for both parts'),
 * they finish, and each stage's live units reach its table bound exactly
 * (zbv's bound, U, is not tight). */
static void check_v(int mode, int K, int M, long n) {
  ax_pipe_plan *p = NULL;
  AX_ASSERT_OK(ax_pipe_plan_new(mode, K, 0, M, n, &p));
  int S = 2 * K, mixes = ax_pipe_mode_get(mode)->weight_halves != NULL;
  static unsigned char seen[16][AX_OP_KINDS][64];
  memset(seen, 0, sizeof seen);
  const ax_pipe_op *l[8];
  long len[8], pc[8] = {0}, left = 0;
  for (int r = 0; r < K; r++) {
    l[r] = ax_pipe_plan_actions(p, r, &len[r]);
    assert_int_equal(len[r], ax_pipe_nops_rank(mode, K, 0, r, M, n));
    left += len[r];
    for (long i = 0; i < len[r]; i++) {
      const ax_pipe_op *o = &l[r][i];
      int u = o->batch * M + o->micro;
      assert_true(o->stage == r || o->stage == S - 1 - r);
      seen[o->stage][o->kind][u]++;
      if (o->kind == AX_OP_BWD || o->kind == AX_OP_INPUT_GRAD)
        assert_int_equal(seen[o->stage][AX_OP_FWD][u], 1);
      if (o->kind == AX_OP_WEIGHT_GRAD)
        assert_int_equal(seen[o->stage][AX_OP_INPUT_GRAD][u], 1);
      if (o->with_next)
        assert_true(o->kind == AX_OP_FWD &&
                    (o[1].kind == AX_OP_BWD || o[1].kind == AX_OP_INPUT_GRAD));
      if (o->kind == AX_OP_STEP) {
        for (int m = 0; m < M; m++)
          assert_int_equal(
              seen[o->stage][AX_OP_BWD][o->batch * M + m] +
                  seen[o->stage][AX_OP_WEIGHT_GRAD][o->batch * M + m],
              1);
        for (long j = i + 1; j < len[r]; j++)
          assert_true(l[r][j].batch > o->batch || l[r][j].kind == AX_OP_STEP);
      }
    }
  }
  for (int st = 0; st < S; st++)
    for (int u = 0; u < n * M; u++) {
      int b = seen[st][AX_OP_BWD][u], i = seen[st][AX_OP_INPUT_GRAD][u];
      assert_int_equal(seen[st][AX_OP_FWD][u], 1);
      assert_true(b + i == 1 && seen[st][AX_OP_WEIGHT_GRAD][u] == i);
      assert_true(mixes || b == 0);
    }
  static unsigned char done[16][AX_OP_KINDS][64];
  memset(done, 0, sizeof done);
  int live[16] = {0}, peak[16] = {0};
  while (left > 0) {
    const ax_pipe_op *run[8];
    int nrun = 0;
    for (int r = 0; r < K; r++) {
      if (pc[r] == len[r])
        continue;
      ax_pipe_op deps[AX_PIPE_PLAN_MAX_STAGES + 2];
      int nd = ax_pipe_plan_deps(p, &l[r][pc[r]], deps), ok = 1;
      for (int i = 0; i < nd; i++)
        ok &= done[deps[i].stage][deps[i].kind]
                  [deps[i].batch * M + deps[i].micro];
      if (ok)
        run[nrun++] = &l[r][pc[r]++];
    }
    assert_true(nrun > 0); /* no deadlock */
    for (int i = 0; i < nrun; i++) {
      const ax_pipe_op *o = run[i];
      done[o->stage][o->kind][o->batch * M + o->micro] = 1;
      live[o->stage] += o->kind == AX_OP_FWD ? 1
                        : o->kind == AX_OP_BWD || o->kind == AX_OP_WEIGHT_GRAD
                            ? -1
                            : 0;
      if (live[o->stage] > peak[o->stage])
        peak[o->stage] = live[o->stage];
      left--;
    }
  }
  for (int st = 0; st < S; st++) {
    int bound = ax_pipe_live_bound(mode, S, st, M);
    assert_true(peak[st] <= bound);
    if (mode != AX_MODE_ZBV)
      assert_int_equal(peak[st], bound);
    if (mode == AX_MODE_DUALPIPEV) /* DualPipeV's: S - s */
      assert_int_equal(bound, S - st);
  }
  ax_pipe_plan_free(p);
}

static void test_v_lists(void **state) {
  for (int mode = 0; mode < AX_MODE_COUNT; mode++) {
    if (ax_pipe_mode_get(mode)->placement != AX_PLACE_V)
      continue;
    for (int K = 1; K <= 5; K++)
      for (int M = 1; M <= 12; M++) {
        if (M >= ax_pipe_min_units(mode, K)) {
          check_v(mode, K, M, 2);
          continue;
        }
        ax_pipe_op ops[64];
        assert_int_equal(ax_pipe_schedule_chunks(mode, K, 2, 0, M, 1, ops, 64),
                         AX_EINVAL);
        assert_non_null(strstr(ax_errmsg(), "needs at least"));
      }
  }
  assert_int_equal(ax_pipe_min_units(AX_MODE_DUALPIPEV, 4), 8);
  assert_int_equal(ax_pipe_min_units(AX_MODE_VMIN, 4), 1);
}

/* Rank r's list (one mini-batch of M units) as "0F3 3I0 3W0 0F4+3B1 ..":
 * stage, kind and unit, a composite's parts joined by '+'. */
static void expect_v(int mode, int K, int r, int M, const char *want) {
  ax_pipe_op ops[MAXOPS];
  AX_ASSERT_OK(ax_pipe_schedule_chunks(mode, K, 2, r, M, 1, ops, MAXOPS));
  char got[1024] = "";
  size_t len = 0;
  for (long i = 0; i < ax_pipe_nops_rank(mode, K, 2, r, M, 1); i++)
    len += (size_t)snprintf(got + len, sizeof got - len, "%s%d%c%d",
                            i == 0                 ? ""
                            : ops[i - 1].with_next ? "+"
                                                   : " ",
                            ops[i].stage, "FBIWS"[ops[i].kind], ops[i].micro);
  assert_string_equal(got, want);
}

static void test_v_orders(void **state) {
  /* DualPipeV, 2 ranks, 4 units: rank 0 holds stages 0 and 3, rank 1
   * stages 1 and 2; the steady state pairs F and B in composites; rank 1
   * runs its first F0 and B1 apart. */
  expect_v(AX_MODE_DUALPIPEV, 2, 0, 4,
           "0F0 0F1 0F2 3F0 3I0 3W0 3F1 0F3+3B1 3F2+0B0 3B2 3F3+0B1 3B3 0I2 "
           "0W2 0I3 0W3 0S0 3S0");
  expect_v(AX_MODE_DUALPIPEV, 2, 1, 4,
           "1F0 2F0 1F1 2F1 1F2 2B0 2F2+1B0 1F3+2B1 2F3+1B1 2B2 1B2 2I3 1I3 "
           "2W3 1W3 1S0 2S0");
  /* V-Half and V-Min, 2 ranks, 4 units: the building blocks' slots, a W in
   * each free slot */
  expect_v(AX_MODE_VHALF, 2, 0, 4,
           "0F0 3F0 0F1 3I0 3W0 3F1 0F2 0I0 3I1 3W1 3F2 0W0 0F3 0I1 3I2 3W2 "
           "3F3 0W1 0I2 3I3 3W3 0W2 0I3 0W3 0S0 3S0");
  expect_v(AX_MODE_VMIN, 2, 1, 4,
           "1F0 2F0 2I0 1I0 1F1 2F1 2W0 1W0 2I1 1I1 1F2 2F2 2W1 1W1 2I2 1I2 "
           "1F3 2F3 2W2 1W2 2I3 1I3 2W3 1W3 1S0 2S0");
}

static void test_ddg_round(void **state) {
  /* Stage 0's forward of t waits until round t-1 is over: every stage
   * finished what its list puts right before its own F(t), here the STEPs
   * of batches 2, 3 and 4 on stages 0, 1 and 2. */
  ax_pipe_op o = {AX_OP_FWD, 0, 5, 0}, deps[16];
  int nd = ax_pipe_deps(AX_MODE_DDG, 3, 1, &o, deps);
  assert_int_equal(nd, 3);
  for (int j = 0; j < 3; j++) {
    assert_int_equal(deps[j].kind, AX_OP_STEP);
    assert_int_equal(deps[j].stage, j);
    assert_int_equal(deps[j].batch, 2 + j);
  }
  assert_int_equal(ax_pipe_deps(AX_MODE_PIPEDREAM, 3, 1, &o, deps), 0);
  assert_int_equal(ax_pipe_live_bound(AX_MODE_1F1B, 4, 0, 8), 4);
  assert_int_equal(ax_pipe_live_bound(AX_MODE_1F1B, 4, 1, 2), 2);
  assert_int_equal(ax_pipe_live_bound(AX_MODE_GPIPE, 4, 3, 8), 8);
  ax_pipe_op ops[5];
  assert_int_equal(ax_pipe_schedule(AX_MODE_GPIPE, 2, 0, 2, 1, ops, 4),
                   AX_EINVAL);
  assert_int_equal(ax_pipe_schedule(9, 2, 0, 2, 1, ops, 5), AX_EINVAL);
  assert_int_equal(ax_pipe_schedule(AX_MODE_GPIPE, 2, 2, 2, 1, ops, 5),
                   AX_EINVAL);
}

/* A plan from given lists equals the generated one; a list mixing B and I
 * waits for whichever the next stage runs; a composite waits for both
 * parts' inputs; bad lists are refused. */
static void test_plan_lists(void **state) {
  (void)state;
  int K = 3, M = 4, m = AX_MODE_1F1B, rank_of[3] = {0, 1, 2};
  ax_pipe_plan *gen = NULL, *given = NULL;
  assert_int_equal(ax_pipe_plan_new(m, K, 1, M, 1, &gen), AX_OK);
  const ax_pipe_op *lists[3];
  long len[3];
  for (int r = 0; r < K; r++)
    lists[r] = ax_pipe_plan_actions(gen, r, &len[r]);
  assert_int_equal(
      ax_pipe_plan_new_lists(m, K, K, rank_of, M, 3, lists, len, &given),
      AX_OK);
  assert_int_equal(ax_pipe_plan_batches(given), 3);
  for (int r = 0; r < K; r++) {
    long n1, n3;
    const ax_pipe_op *a = ax_pipe_plan_actions(gen, r, &n1),
                     *b = ax_pipe_plan_actions(given, r, &n3);
    assert_int_equal(n3, 3 * n1);
    for (long i = 0; i < n3; i++) {
      assert_int_equal(b[i].kind, a[i % n1].kind);
      assert_int_equal(b[i].micro, a[i % n1].micro);
      assert_int_equal(b[i].batch, i / n1);
    }
  }
  ax_pipe_plan_free(given);
  ax_pipe_plan_free(gen);
  /* Two stages on one rank: stage 1 runs I and W, stage 0 a whole B and a
   * composite of F(1) with B(0). */
  int one_rank[2] = {0, 0};
  ax_pipe_op l0[] = {{AX_OP_FWD, 0, 0, 0},         {AX_OP_FWD, 1, 0, 0},
                     {AX_OP_INPUT_GRAD, 1, 0, 0},  {AX_OP_FWD, 0, 0, 1, 1},
                     {AX_OP_BWD, 0, 0, 0},         {AX_OP_FWD, 1, 0, 1},
                     {AX_OP_BWD, 1, 0, 1},         {AX_OP_BWD, 0, 0, 1},
                     {AX_OP_WEIGHT_GRAD, 1, 0, 0}, {AX_OP_STEP, 0, 0, 0},
                     {AX_OP_STEP, 1, 0, 0}};
  const ax_pipe_op *ll[1] = {l0};
  long ln[1] = {sizeof l0 / sizeof l0[0]};
  assert_int_equal(
      ax_pipe_plan_new_lists(m, 1, 2, one_rank, 2, 1, ll, ln, &given), AX_OK);
  ax_pipe_op deps[8];
  long n;
  const ax_pipe_op *a = ax_pipe_plan_actions(given, 0, &n);
  assert_int_equal(ax_pipe_plan_deps(given, &a[3], deps), 1); /* F(0,1) none
                                                                 + B(0,0) */
  assert_int_equal(deps[0].kind, AX_OP_INPUT_GRAD);
  assert_int_equal(deps[0].stage, 1);
  assert_int_equal(ax_pipe_plan_deps(given, &a[7], deps), 1);
  assert_int_equal(deps[0].kind, AX_OP_BWD);
  ax_pipe_plan_free(given);
  /* Refusals: a stage the rank does not hold, a unit out of range, a
   * composite that ends the list. */
  ax_pipe_op bad[][1] = {{{AX_OP_FWD, 1, 0, 0}},
                         {{AX_OP_FWD, 0, 0, 2}},
                         {{AX_OP_FWD, 0, 0, 0, 1}}};
  int two[2] = {0, 1};
  for (int i = 0; i < 3; i++) {
    const ax_pipe_op *bl[2] = {bad[i], bad[i]};
    long bn[2] = {1, 0};
    assert_int_equal(ax_pipe_plan_new_lists(m, 2, 2, two, 2, 1, bl, bn, &given),
                     AX_EINVAL);
    assert_null(given);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_invariants),
      cmocka_unit_test(test_orders),
      cmocka_unit_test(test_interleaved_lists),
      cmocka_unit_test(test_v_lists),
      cmocka_unit_test(test_v_orders),
      cmocka_unit_test(test_ddg_round),
      cmocka_unit_test(test_plan_lists),
  };
  return AX_TEST_MAIN(tests);
}
