/* The timing model on any plan and its timeline
 * (runtime/pipeline/schedule/formula.h: ax_formula_time_plan,
 * ax_formula_timeline), a run's modelled time from its schedule
 * (emulate.h: ax_pipe_costs_model) and the pictures of a timeline
 * (schedule/timeline.h: the text grid, gnuplot's input, a trace read as a
 * timeline). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/pipeline/schedule/emulate.h"
#include "axon/runtime/pipeline/schedule/formula.h"
#include "axon/runtime/pipeline/schedule/timeline.h"
#include "harness.h"

/* A run's modelled time comes from the lists it walks: every flushed
 * mode's printed schedule, run as a schedule, models to the mode's own
 * seconds with the same measured costs; another order to its own. */
static void costs_model_schedule(void **state) {
  (void)state;
  for (int m = 0; m < AX_MODE_COUNT; m++) {
    if (!ax_pipe_flushes(m))
      continue;
    int K = 3, M = 6;
    ax_pipe_sched *s = NULL;
    AX_ASSERT_OK(ax_pipe_sched_from_mode(m, K, 2, M, &s));
    ax_pipe_opts o = {.mode = m, .K = K, .M = M, .chunks = 2};
    ax_pipe_costs own, file;
    ax_pipe_costs_init(&own, &o);
    o.schedule = s;
    ax_pipe_costs_init(&file, &o);
    assert_int_equal(file.S, own.S);
    for (int i = 0; i < own.S; i++) {
      own.f[i] = file.f[i] = 1 + 0.1 * i;
      own.b[i] = file.b[i] = 1.5 - 0.05 * i;
      own.w[i] = file.w[i] = 0.7;
    }
    double want = -1, got = -2;
    AX_ASSERT_OK(ax_pipe_costs_model(&own, &want));
    AX_ASSERT_OK(ax_pipe_costs_model(&file, &got));
    if (got != want)
      fail_msg("%s: schedule %.9g, mode %.9g", ax_pipe_mode_name(m), got, want);
    ax_pipe_sched_free(s);
  }
  /* 1F1B with a warm-up of two on rank 0 (one more unit live, no faster):
   * the time of 1f1b with equal stages. */
  const char *warm = "ranks 2\nmicro 4\n"
                     "rank 0: 0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3 STEP0\n"
                     "rank 1: 1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3 STEP1\n";
  ax_pipe_sched *s = NULL;
  AX_ASSERT_OK(ax_pipe_sched_parse(warm, strlen(warm), "warm", &s));
  ax_pipe_opts o = {.mode = AX_MODE_1F1B, .K = 2, .M = 4, .schedule = s};
  ax_pipe_costs c;
  ax_pipe_costs_init(&c, &o);
  for (int i = 0; i < 2; i++)
    c.f[i] = 1, c.b[i] = 2;
  double got = -1;
  AX_ASSERT_OK(ax_pipe_costs_model(&c, &got));
  assert_true(got == ax_formula_uniform("1f1b", 2, 4, 1, 2, 0));
  ax_pipe_sched_free(s);
}

/* gpipe, K = 2, M = 2, F = 1, B = 2 (backwards in reverse order): every
 * action's place, and the grid. */
static void gpipe_timeline_and_grid(void **state) {
  (void)state;
  double tf[2] = {1, 1}, tb[2] = {1, 1}, tw[2] = {1, 1};
  ax_pipe_plan *p = NULL;
  AX_ASSERT_OK(ax_pipe_plan_new(AX_MODE_GPIPE, 2, 1, 2, 1, &p));
  ax_pipe_slot *s = NULL;
  long n = 0;
  AX_ASSERT_OK(ax_formula_timeline(p, tf, tb, tw, 0, NULL, &s, &n));
  assert_int_equal(n, 10); /* F F B B STEP on each rank */
  static const double want[10][2] = {{0, 1}, {1, 2}, {5, 7}, {7, 9}, {9, 9},
                                     {1, 2}, {2, 3}, {3, 5}, {5, 7}, {7, 7}};
  for (long i = 0; i < n; i++) {
    assert_int_equal(s[i].rank, i / 5);
    assert_int_equal(s[i].next.kind, -1);
    if (s[i].start != want[i][0] || s[i].end != want[i][1])
      fail_msg("slot %ld: %g..%g, want %g..%g", i, s[i].start, s[i].end,
               want[i][0], want[i][1]);
  }
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  AX_ASSERT_OK(ax_pipe_timeline_grid(s, n, 2, 2, 0, f));
  fclose(f);
  const char *rows = "rank 0 |0F0 0F1 ............0B1     0B0     |\n"
                     "rank 1 |....1F0 1F1 1B1     1B0     ........|\n";
  if (strncmp(text, rows, strlen(rows)) != 0)
    fail_msg("grid:\n%s", text);
  free(text);
  /* A fixed width: the line has exactly that many characters. */
  f = open_memstream(&text, &len);
  AX_ASSERT_OK(ax_pipe_timeline_grid(s, n, 2, 2, 30, f));
  fclose(f);
  assert_int_equal(strchr(text, '\n') - text, 30);
  free(text);
  /* gnuplot's input: the output, a block per kind, the legend. */
  f = open_memstream(&text, &len);
  ax_pipe_plot_opts po = {.png = "x.png", .title = "gpipe"};
  AX_ASSERT_OK(ax_pipe_timeline_gnuplot(s, n, 2, 2, &po, f));
  fclose(f);
  assert_non_null(strstr(text, "set output \"x.png\""));
  assert_non_null(strstr(text, "title \"F\""));
  assert_non_null(strstr(text, "title \"B\""));
  assert_non_null(strstr(text, "title \"idle\""));
  assert_null(strstr(text, "title \"W\""));
  free(text);
  free(s);
  ax_pipe_plan_free(p);
}

/* A composite (F(1,1) with B(1,0) on rank 1) is one slot from the
 * composite's start to its second part's end. */
static void composite_is_one_slot(void **state) {
  (void)state;
  int rank_of[2] = {0, 1};
  ax_pipe_op r0[] = {{AX_OP_FWD, 0, 0, 0},
                     {AX_OP_FWD, 0, 0, 1},
                     {AX_OP_BWD, 0, 0, 0},
                     {AX_OP_BWD, 0, 0, 1},
                     {AX_OP_STEP, 0, 0, 0}};
  ax_pipe_op r1[] = {{AX_OP_FWD, 1, 0, 0},
                     {AX_OP_FWD, 1, 0, 1, 1},
                     {AX_OP_BWD, 1, 0, 0},
                     {AX_OP_BWD, 1, 0, 1},
                     {AX_OP_STEP, 1, 0, 0}};
  const ax_pipe_op *lists[2] = {r0, r1};
  long len[2] = {5, 5};
  ax_pipe_plan *p = NULL;
  AX_ASSERT_OK(ax_pipe_plan_new_lists(AX_MODE_1F1B, 2, 2, rank_of, 2, 1, lists,
                                      len, &p));
  double t1[2] = {1, 1};
  ax_pipe_slot *s = NULL;
  long n = 0;
  AX_ASSERT_OK(ax_formula_timeline(p, t1, t1, t1, 0, NULL, &s, &n));
  assert_int_equal(n, 9);
  const ax_pipe_slot *c = &s[6]; /* rank 1's second */
  assert_int_equal(c->rank, 1);
  assert_int_equal(c->op.with_next, 1);
  assert_int_equal(c->next.kind, AX_OP_BWD);
  AX_ASSERT_CLOSE(c->start, 2, 0, 0);
  AX_ASSERT_CLOSE(c->end, 5, 0, 0);
  char tok[32];
  ax_pipe_slot_token(c, 2, tok, sizeof tok);
  assert_string_equal(tok, "1F1+1B0");
  AX_ASSERT_CLOSE(s[2].start, 5, 0, 0); /* B(0,0) after B(1,0) */
  double per = 0;
  AX_ASSERT_OK(ax_formula_time_plan(p, t1, t1, t1, 0, NULL, &per));
  AX_ASSERT_CLOSE(per, 9, 0, 0);
  free(s);
  ax_pipe_plan_free(p);
}

static void add(ax_trace *tr, const char *cat, int pid, int tid, long step,
                long micro, int64_t t0, int64_t t1) {
  ax_trace_event e = ax_trace_event_make("x", cat, pid, tid, t0, t1);
  e.step = step;
  e.micro = micro;
  AX_ASSERT_OK(ax_trace_add(tr, &e));
}

/* A trace's compute events as a timeline: kinds, the replay joined to its
 * backward, the rows from the agents' names or a placement. */
static void trace_as_timeline(void **state) {
  (void)state;
  ax_trace *tr = ax_trace_new(0);
  assert_non_null(tr);
  ax_trace_name_process(tr, 0, "a");
  ax_trace_name_process(tr, 1, "b");
  ax_trace_name_process(tr, 2, "a");
  add(tr, "forward", 0, 0, 0, 0, 1000, 2000);
  add(tr, "recompute", 0, 0, 0, 0, 5000, 5500);
  add(tr, "backward", 0, 0, 0, 0, 5500, 7000);
  add(tr, "forward", 1, 0, 0, 0, 2000, 3000);
  add(tr, "backward", 1, 0, 0, 0, 3000, 4000);
  add(tr, "weight", 1, 0, 0, 0, 4000, 4500);
  add(tr, "send", 1, 2, 0, 0, 3000, 3100);
  add(tr, "forward", 2, 0, 0, 1, 3000, 3500);
  add(tr, "optim", 2, 0, 0, -1, 8000, 8100);
  add(tr, "forward", 0, 0, 1, 0, 9000, 9500); /* mini-batch 1: left out */
  ax_pipe_slot *s = NULL;
  long n = 0;
  int ranks = 0, U = 0;
  AX_ASSERT_OK(
      ax_pipe_timeline_from_trace(tr, NULL, 0, 0, 0, &s, &n, &ranks, &U));
  assert_int_equal(n, 7);
  assert_int_equal(ranks, 2); /* a: stages 0 and 2, b: stage 1 */
  assert_int_equal(U, 2);
  /* rank 0: F(0) 0..1 ms, F(2) 2..2.5, B(0) 4..6 (replay included), STEP */
  static const int kind[7] = {AX_OP_FWD,        AX_OP_FWD, AX_OP_BWD,
                              AX_OP_STEP,       AX_OP_FWD, AX_OP_INPUT_GRAD,
                              AX_OP_WEIGHT_GRAD};
  static const int rank[7] = {0, 0, 0, 0, 1, 1, 1};
  for (long i = 0; i < n; i++) {
    assert_int_equal(s[i].op.kind, kind[i]);
    assert_int_equal(s[i].rank, rank[i]);
  }
  AX_ASSERT_CLOSE(s[2].start, 0.004, 1e-12, 0);
  AX_ASSERT_CLOSE(s[2].end, 0.006, 1e-12, 0);
  assert_int_equal(s[1].op.stage, 2);
  assert_int_equal(s[1].op.micro, 1);
  free(s);
  int place[3] = {0, 0, 1};
  AX_ASSERT_OK(
      ax_pipe_timeline_from_trace(tr, place, 3, 0, -1, &s, &n, &ranks, &U));
  assert_int_equal(n, 8);
  assert_int_equal(ranks, 2);
  free(s);
  ax_trace_name_process(tr, 1, "a"); /* one name: a row per stage */
  AX_ASSERT_OK(
      ax_pipe_timeline_from_trace(tr, NULL, 0, 0, 0, &s, &n, &ranks, &U));
  assert_int_equal(ranks, 3);
  free(s);
  AX_ASSERT_ERR(
      ax_pipe_timeline_from_trace(tr, NULL, 0, 5, 6, &s, &n, &ranks, &U),
      AX_EINVAL);
  ax_trace_free(tr);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(costs_model_schedule),
      cmocka_unit_test(gpipe_timeline_and_grid),
      cmocka_unit_test(composite_is_one_slot),
      cmocka_unit_test(trace_as_timeline),
  };
  return AX_TEST_MAIN(t);
}
