/* The schedule verifier (runtime/pipeline/schedule/verify.h): every
 * built-in mode verifies clean and counts what the mode table bounds;
 * plans that hang in each way we can build are refused with their cycle
 * and a grid; a missing action is a completeness error; a stage over a
 * memory cap is named with its bytes. Prints the time of the large plans
 * (a benchmark line, not a timed test). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "axon/kernels/error.h"
#include "axon/runtime/pipeline/schedule/verify.h"
#include "harness.h"

#define F_(s, u)                                                               \
  { AX_OP_FWD, s, 0, u }
#define B_(s, u)                                                               \
  { AX_OP_BWD, s, 0, u }
#define FB_(s, u)                                                              \
  { AX_OP_FWD, s, 0, u, 1 }
#define ST_(s)                                                                 \
  { AX_OP_STEP, s, 0, 0 }

/* Whether the verifier's count of live units may be below the table's
 * bound for `mode` with K stages and M micro-batches (the reasons below);
 * elsewhere the two are equal. */
static int below_ok(int mode, int M, int K) {
  const ax_pipe_mode_def *d = ax_pipe_mode_get(mode);
  /* Chunked modes bound every stage by the whole mini-batch (live_units);
   * their orders keep fewer on most stages. Modes that do not flush bound
   * the steady state: the first mini-batches (and a last stage whose
   * units end at once) keep fewer. A mini-batch of fewer units than the
   * pipeline is deep fills it less. */
  return d->chunked || !d->flush || M < K;
}

static void check_mode(int mode, int K, int M, long n) {
  ax_pipe_plan *p = NULL;
  if (ax_pipe_plan_new(mode, K, 0, M, n, &p) != AX_OK) {
    ax_clearerr(); /* a combination the mode refuses (interleaved) */
    return;
  }
  ax_pipe_verify_report r;
  int err = ax_pipe_verify(p, NULL, &r);
  if (err != AX_OK)
    fprintf(stderr, "%s K %d M %d: %s\n%s", ax_pipe_mode_name(mode), K, M,
            ax_errmsg(), r.text ? r.text : "");
  assert_int_equal(err, AX_OK);
  assert_null(r.text);
  assert_true(r.steps > 0);
  AX_ASSERT_OK(ax_pipe_verify_mode(mode, K, 0, M, 2));
  for (int s = 0; s < ax_pipe_plan_stages(p); s++) {
    int lb = ax_pipe_live_bound(mode, ax_pipe_plan_stages(p), s, M),
        vb = ax_pipe_version_bound(mode, K, s, M);
    int lc = r.peak_live[s], vc = r.peak_versions[s];
    if ((below_ok(mode, M, K) ? lc > lb : lc != lb) || vc > vb)
      fprintf(stderr,
              "%s K %d M %d stage %d: live %d (table %d), versions %d "
              "(table %d)\n",
              ax_pipe_mode_name(mode), K, M, s, lc, lb, vc, vb);
    if (below_ok(mode, M, K))
      assert_true(lc <= lb);
    else
      assert_int_equal(lc, lb);
    assert_true(vc <= vb);
    assert_true(lc >= 1);
  }
  ax_pipe_plan_free(p);
}

static void test_builtin(void **state) {
  (void)state;
  static const int Ms[] = {1, 2, 3, 4, 8, 12};
  for (int mode = 0; mode < AX_MODE_COUNT; mode++)
    for (int K = 1; K <= 8; K++)
      for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++)
        if (ax_pipe_units(mode, Ms[i]) >= ax_pipe_min_units(mode, K))
          check_mode(mode, K, Ms[i], 4);
  /* Equal to the table on every stage where the table is exact (K = 4,
   * M = 8, six mini-batches: the steady state of the modes that do not
   * flush). Chunked modes keep fewer than their bound (the whole
   * mini-batch) on all but their first stages: interleaved 8 8 7 5 4 4 3 1
   * and zbv 7 6 5 5 4 3 3 2 of 8. */
  for (int m = 0; m < AX_MODE_COUNT; m++) {
    int K = 4, M = 8;
    ax_pipe_plan *p = NULL;
    ax_pipe_verify_report r;
    AX_ASSERT_OK(ax_pipe_plan_new(m, K, 0, M, 6, &p));
    AX_ASSERT_OK(ax_pipe_verify(p, NULL, &r));
    for (int s = 0; s < ax_pipe_plan_stages(p); s++) {
      if (!ax_pipe_mode_get(m)->chunked)
        assert_int_equal(r.peak_live[s],
                         ax_pipe_live_bound(m, ax_pipe_plan_stages(p), s, M));
      assert_int_equal(r.peak_versions[s], ax_pipe_version_bound(m, K, s, M));
    }
    ax_pipe_plan_free(p);
  }
}

/* Builds a plan from one-batch lists and verifies it: the error code, and
 * the report's text in *text (the caller frees it). */
static int verify_lists(int mode, int K, int S, const int *rank_of, int U,
                        long n, const ax_pipe_op *const *lists, const long *len,
                        char **text) {
  ax_pipe_plan *p = NULL;
  AX_ASSERT_OK(
      ax_pipe_plan_new_lists(mode, K, S, rank_of, U, n, lists, len, &p));
  ax_pipe_verify_report r;
  int err = ax_pipe_verify(p, &(ax_pipe_verify_opts){.grid_steps = 12}, &r);
  ax_pipe_plan_free(p);
  *text = r.text;
  if (r.text)
    printf("---- refused: %s\n%s", ax_errmsg(), r.text);
  return err;
}

static void expect_hang(char *text, const char *cycle) {
  assert_non_null(text);
  if (!strstr(text, cycle))
    fprintf(stderr, "expected \"%s\" in:\n%s", cycle, text);
  assert_non_null(strstr(text, cycle));
  assert_non_null(strstr(text, "<-- here"));
  free(text);
}

static void test_hangs(void **state) {
  (void)state;
  char *text = NULL;
  int two[2] = {0, 1}, three[6] = {0, 1, 2, 0, 1, 2}, one[2] = {0, 0};
  /* Two ranks, each waiting for the other's later action: rank 0's B of
   * unit 0 before its F of unit 1, which rank 1 needs before its B. */
  ax_pipe_op a0[] = {F_(0, 0), B_(0, 0), F_(0, 1), B_(0, 1), ST_(0)},
             a1[] = {F_(1, 0), F_(1, 1), B_(1, 0), B_(1, 1), ST_(1)};
  const ax_pipe_op *a[2] = {a0, a1};
  long alen[2] = {5, 5};
  AX_ASSERT_ERR(verify_lists(AX_MODE_1F1B, 2, 2, two, 2, 1, a, alen, &text),
                AX_EINVAL);
  expect_hang(text, "deadlock: rank 0 waits at action 1 (0B0) for 1B0 on "
                    "rank 1 (its action 2), which waits at action 1 "
                    "(1F1) for 0F1 on rank 0 (its action 2), back to rank 0");
  assert_non_null(strstr(ax_errmsg(), "back to rank 0"));
  /* A cycle through three ranks: rank 0 runs stage 3's forward before
   * stage 0's, and stage 3 needs stage 2 (rank 2), which needs stage 1
   * (rank 1), which needs stage 0. */
  ax_pipe_op c[3][8];
  const ax_pipe_op *cl[3];
  long clen[3];
  for (int r = 0; r < 3; r++) {
    ax_pipe_op l[] = {F_(r, 0), F_(r + 3, 0), B_(r + 3, 0),
                      B_(r, 0), ST_(r),       ST_(r + 3)};
    memcpy(c[r], l, sizeof l);
    cl[r] = c[r];
    clen[r] = 6;
  }
  c[0][0] = (ax_pipe_op)F_(3, 0);
  c[0][1] = (ax_pipe_op)F_(0, 0);
  AX_ASSERT_ERR(
      verify_lists(AX_MODE_INTERLEAVED, 3, 6, three, 1, 1, cl, clen, &text),
      AX_EINVAL);
  expect_hang(text, "rank 0 waits at action 0 (3F0) for 2F0 on rank 2 (its "
                    "action 0), which waits at action 0 (2F0) for 1F0 "
                    "on rank 1 (its action 0), which waits at action 0 "
                    "(1F0) for 0F0 on rank 0 (its action 1), back to rank 0");
  /* The forward lock (ddg): stage 0's F of unit 1 waits for what stage 1
   * runs before its own F of unit 1, B(1, 0), which needs unit 0's F on
   * stage 0, after unit 1's. The same lists without the lock run. */
  ax_pipe_op d0[] = {F_(0, 1), F_(0, 0), B_(0, 0), B_(0, 1), ST_(0)},
             d1[] = {F_(1, 0), B_(1, 0), F_(1, 1), B_(1, 1), ST_(1)};
  const ax_pipe_op *d[2] = {d0, d1};
  AX_ASSERT_OK(
      verify_lists(AX_MODE_PIPEDREAM, 2, 2, two, 2, 2, d, alen, &text));
  AX_ASSERT_ERR(verify_lists(AX_MODE_DDG, 2, 2, two, 2, 2, d, alen, &text),
                AX_EINVAL);
  expect_hang(text, "rank 0 waits at action 5 (0F1 of mini-batch 1) for 1B0 "
                    "of mini-batch 1 on rank 1 (its action 6), which "
                    "waits at action 5 (1F0 of mini-batch 1) for 0F0 of "
                    "mini-batch 1 on rank 0 (its action 6), back to rank 0");
  /* A composite whose second part waits for its first part's downstream:
   * F(0, 1) + B(0, 0) needs B(1, 0), which rank 1 runs after F(1, 1),
   * which needs F(0, 1). Without the composite the lists run. */
  ax_pipe_op e0[] = {F_(0, 0), FB_(0, 1), B_(0, 0), B_(0, 1), ST_(0)};
  const ax_pipe_op *e[2] = {e0, a1};
  AX_ASSERT_ERR(verify_lists(AX_MODE_1F1B, 2, 2, two, 2, 1, e, alen, &text),
                AX_EINVAL);
  expect_hang(text, "rank 0 waits at action 1 (0F1+0B0) for 1B0 on rank 1 "
                    "(its action 2), which waits at action 1 (1F1) for "
                    "0F1 on rank 0 (its action 1), back to rank 0");
  e0[1].with_next = 0;
  AX_ASSERT_OK(verify_lists(AX_MODE_1F1B, 2, 2, two, 2, 1, e, alen, &text));
  /* One rank waiting for its own later action: stage 1's F first. */
  ax_pipe_op s0[] = {F_(1, 0), F_(0, 0), B_(1, 0), B_(0, 0), ST_(0), ST_(1)};
  const ax_pipe_op *sl[1] = {s0};
  long slen[1] = {6};
  AX_ASSERT_ERR(verify_lists(AX_MODE_1F1B, 1, 2, one, 1, 1, sl, slen, &text),
                AX_EINVAL);
  expect_hang(text, "rank 0 waits at action 0 (1F0) for 0F0 on rank 0 (its "
                    "action 1), back to rank 0");
}

static void expect_incomplete(const ax_pipe_op *l0, long n0,
                              const ax_pipe_op *l1, long n1, int mode,
                              const char *msg) {
  int two[2] = {0, 1};
  const ax_pipe_op *l[2] = {l0, l1};
  long len[2] = {n0, n1};
  char *text = NULL;
  AX_ASSERT_ERR(verify_lists(mode, 2, 2, two, 2, 1, l, len, &text), AX_EINVAL);
  assert_non_null(text);
  if (!strstr(ax_errmsg(), msg))
    fprintf(stderr, "expected \"%s\", got \"%s\"\n", msg, ax_errmsg());
  assert_non_null(strstr(ax_errmsg(), msg));
  free(text);
}

static void test_incomplete(void **state) {
  (void)state;
  ax_pipe_op good1[] = {F_(1, 0), B_(1, 0), F_(1, 1), B_(1, 1), ST_(1)};
  /* A missing F: completeness, not a hang (the clearer of the two). */
  ax_pipe_op nof[] = {F_(0, 0), B_(0, 0), B_(0, 1), ST_(0)};
  expect_incomplete(nof, 4, good1, 5, AX_MODE_1F1B,
                    "stage 0 (rank 0): unit 1 of mini-batch 0 has no F");
  ax_pipe_op bfirst[] = {F_(0, 0), B_(0, 1), F_(0, 1), B_(0, 0), ST_(0)};
  expect_incomplete(bfirst, 5, good1, 5, AX_MODE_1F1B,
                    "rank 0 action 1 (0B1): B before its F (action 2)");
  ax_pipe_op wfirst[] = {F_(0, 0),
                         {AX_OP_WEIGHT_GRAD, 0, 0, 0},
                         {AX_OP_INPUT_GRAD, 0, 0, 0},
                         F_(0, 1),
                         B_(0, 1),
                         ST_(0)};
  expect_incomplete(wfirst, 6, good1, 5, AX_MODE_ZBH1,
                    "rank 0 action 1 (0W0): W before its I (action 2)");
  ax_pipe_op twice[] = {F_(0, 0), F_(0, 0), B_(0, 0),
                        F_(0, 1), B_(0, 1), ST_(0)};
  expect_incomplete(twice, 6, good1, 5, AX_MODE_1F1B,
                    "rank 0 action 1 (0F0): a second copy");
  ax_pipe_op early[] = {F_(0, 0), B_(0, 0), ST_(0), F_(0, 1), B_(0, 1)};
  expect_incomplete(early, 5, good1, 5, AX_MODE_1F1B,
                    "rank 0 action 2 (STEP0): STEP before 0B1 (action 4)");
  ax_pipe_op nostep[] = {F_(0, 0), B_(0, 0), F_(0, 1), B_(0, 1)};
  expect_incomplete(nostep, 4, good1, 5, AX_MODE_1F1B,
                    "stage 0 (rank 0): mini-batch 0 has no STEP");
}

/* Over a cap: 1f1b keeps K - s units on stage s, so with equal stages the
 * first is the largest; one memory model with the partitioner's. The cap is
 * per rank: an interleaved rank holds two stages, their bytes summed. */
static void test_fit(void **state) {
  (void)state;
  int K = 4, M = 8;
  ax_pipe_plan *p = NULL;
  AX_ASSERT_OK(ax_pipe_plan_new(AX_MODE_1F1B, K, 1, M, 2, &p));
  ax_block_profile b[4];
  memset(b, 0, sizeof b);
  for (int s = 0; s < K; s++)
    b[s].param_bytes = 1000, b[s].saved_bytes = 100, b[s].in_bytes = 10;
  ax_pipe_verify_opts o = {.stage_bytes = b, .mem_cap = 2350};
  ax_pipe_verify_report r;
  AX_ASSERT_ERR(ax_pipe_verify(p, &o, &r), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "rank 0 (stage 0) needs 2400 bytes, over "
                                      "the cap of 2350: 4 units live"));
  printf("---- refused: %s\n", r.text);
  ax_pipe_verify_report_clear(&r);
  o.mem_cap = 2400;
  AX_ASSERT_OK(ax_pipe_verify(p, &o, &r));
  ax_partition_opts po = {.K = K, .mode = "1f1b", .M = M};
  for (int s = 0; s < K; s++) { /* the table's bounds give the same bytes */
    assert_int_equal(r.stage_mem[s], 2000 + 100 * (K - s));
    assert_int_equal(r.stage_mem[s], ax_stage_memory(b, K, s, s + 1, s, &po));
    assert_int_equal(r.rank_mem[s], r.stage_mem[s]); /* one stage each */
  }
  assert_int_equal(r.ranks, K);
  ax_pipe_plan_free(p);
  /* Interleaved, 2 ranks of 2 stages each: rank k holds k and k + 2. */
  AX_ASSERT_OK(ax_pipe_plan_new(AX_MODE_INTERLEAVED, 2, 2, M, 1, &p));
  o.mem_cap = 0;
  AX_ASSERT_OK(ax_pipe_verify(p, &o, &r));
  assert_int_equal(r.ranks, 2);
  size_t most = 0;
  for (int k = 0; k < 2; k++) {
    assert_int_equal(r.rank_mem[k], r.stage_mem[k] + r.stage_mem[k + 2]);
    most = r.rank_mem[k] > most ? r.rank_mem[k] : most;
  }
  o.mem_cap = most - 1; /* above every stage, below the larger rank */
  assert_true(r.stage_mem[0] <= o.mem_cap && r.stage_mem[2] <= o.mem_cap);
  AX_ASSERT_ERR(ax_pipe_verify(p, &o, &r), AX_EINVAL);
  char want[160];
  int k = r.rank_mem[0] == most ? 0 : 1;
  snprintf(want, sizeof want,
           "rank %d (stages %d, %d) needs %zu bytes, over the cap of %zu: "
           "stage %d %zu bytes,",
           k, k, k + 2, most, o.mem_cap, k, r.stage_mem[k]);
  assert_non_null(strstr(ax_errmsg(), want));
  printf("---- refused: %s\n", r.text);
  ax_pipe_verify_report_clear(&r);
  o.mem_cap = most;
  AX_ASSERT_OK(ax_pipe_verify(p, &o, &r));
  ax_pipe_plan_free(p);
}

/* The verifier on K = 16, M = 64 plans (two mini-batches): a benchmark
 * line (this machine: well under the 50 ms asked of it). */
static void test_speed(void **state) {
  (void)state;
  int modes[] = {AX_MODE_1F1B, AX_MODE_ZBV, AX_MODE_ZBH1, AX_MODE_INTERLEAVED};
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
    ax_pipe_plan *p = NULL;
    double t_plan = ax_clock_s();
    AX_ASSERT_OK(ax_pipe_plan_new(modes[i], 16, 2, 64, 2, &p));
    t_plan = ax_clock_s() - t_plan;
    double best = 1e9;
    for (int rep = 0; rep < 5; rep++) {
      double t0 = ax_clock_s();
      AX_ASSERT_OK(ax_pipe_verify(p, NULL, NULL));
      double t = ax_clock_s() - t0;
      best = t < best ? t : best;
    }
    printf("verify %-12s K 16 M 64, 2 mini-batches: %.2f ms (building the "
           "plan: %.2f ms)\n",
           ax_pipe_mode_name(modes[i]), best * 1e3, t_plan * 1e3);
    ax_pipe_plan_free(p);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_builtin),    cmocka_unit_test(test_hangs),
      cmocka_unit_test(test_incomplete), cmocka_unit_test(test_fit),
      cmocka_unit_test(test_speed),
  };
  return AX_TEST_MAIN(tests);
}
